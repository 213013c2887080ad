# SPDX-License-Identifier: GPL-2.0 OR MIT
"""The cost of one small request from Python: one thread, warm file, random offsets, into
slots of a GPU buffer (torch), submit to completion, every read checked against the file.

Usage: python3 tests/bench/request_cost.py [--file PATH] [--count 3000] [--label NAME]
       [--kvikio]

Prints one JSON line per (size, call): p50 and p99 in µs over --count requests after 200 of
warm-up. Run it with two builds of the package in one lease (alternating, PYTHONPATH picks the
build) to measure what a change to the per-request path saves (issue 31, item 2), and with
--kvikio (KvikIO's `CuFile.pread(...).get()`, compat mode, call "kvikio-pread") alternating
with gdirect's to compare the two under the same conditions. BENCHMARKS.md renders every
line, grouped by label, size and call.
"""
import argparse
import json
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/gdirect-request-cost.bin")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--label", default="")
    ap.add_argument("--kvikio", action="store_true", help="KvikIO's CuFile.pread, not gdirect")
    a = ap.parse_args()
    import torch

    size_file = 256 << 20
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size_file:
        with open(a.file, "wb") as f:
            f.write(os.urandom(size_file))
    with open(a.file, "rb") as f:
        data = f.read()
    buf = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda:0")
    if a.kvikio:
        import kvikio
        import kvikio.defaults

        kvikio.defaults.set({"num_threads": 1, "compat_mode": kvikio.CompatMode.ON})
        f = kvikio.CuFile(a.file, "r")
        calls = ("kvikio-pread",)
    else:
        import gdirect

        f = gdirect.File(a.file)
        calls = ("pread", "read")
    rng = random.Random(5)
    for io in (4096, 65536):
        slots = [buf[i * io:(i + 1) * io] for i in range(256)]
        for call in calls:
            buf.fill_(0xA5)  # poisoned
            lat, last = [], {}
            for k in range(a.count + 200):
                off = rng.randrange(size_file // io) * io
                slot = k % 256
                t0 = time.perf_counter_ns()
                if call in ("pread", "kvikio-pread"):
                    n = f.pread(slots[slot], io, off).get()
                else:
                    n = f.read(slots[slot], file_offset=off).bytes
                t = time.perf_counter_ns() - t0
                if n != io:
                    sys.exit(f"{call} of {io} at {off}: {n} bytes")
                last[slot] = off
                if k >= 200:
                    lat.append(t / 1000)
            # Each slot holds the bytes of the last read into it.
            got = buf[: 256 * io].cpu().numpy().tobytes()
            for slot, off in last.items():
                if got[slot * io:(slot + 1) * io] != data[off:off + io]:
                    sys.exit(f"{call} of {io}: slot {slot} does not hold the bytes at {off}")
            lat.sort()
            print(json.dumps({"label": a.label, "io": io, "call": call,
                              "p50_us": round(lat[len(lat) // 2], 2),
                              "p99_us": round(lat[len(lat) * 99 // 100], 2),
                              "count": len(lat), "verified_slots": len(last)}), flush=True)

if __name__ == "__main__":
    main()
