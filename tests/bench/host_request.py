# SPDX-License-Identifier: GPL-2.0 OR MIT
"""One small request at a time from Python into host memory (no GPU): `File.pread(...).get()`
with the inline size at its default (a request of 64 KiB or less run before `pread` returns)
and at 0 (every request handed to the package's I/O threads, as before the inline size), and
the synchronous `File.read`, alternating within each round; one thread, a warm file, random
offsets, into slots of a NumPy buffer poisoned first, every slot compared with the file's
bytes after each measurement. What the inline size saves of a request's cost where the CPU
path is all there is; the GPU's figures come from tests/bench/settings.sh (variant `queued`).

Usage: python3 tests/bench/host_request.py [--file PATH] [--count 20000] [--rounds 3]
       [--sizes 4096,65536] [--out results.jsonl]

Prints (and appends to --out) a meta line, then one JSON line per (round, size, call): the p50
and p99 in µs over --count requests after 500 of warm-up.
"""
import argparse
import datetime
import json
import os
import random
import sys
import time

import numpy as np

import gdirect

POISON = 0x5A
SLOTS = 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/gdirect-host-request.bin")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="4096,65536")
    ap.add_argument("--out")
    a = ap.parse_args()
    span = 256 << 20
    if not os.path.exists(a.file) or os.path.getsize(a.file) != span:
        with open(a.file, "wb") as f:
            f.write(os.urandom(span))
    with open(a.file, "rb") as f:
        data = f.read()  # (and warm)
    out = open(a.out, "a") if a.out else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")

    commit = os.environ.get("GDIRECT_COMMIT") or os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip()
    emit({"meta": {"command": "tests/bench/host_request.py " + " ".join(sys.argv[1:]), "commit": commit or "unknown",
                   "machine": f"{os.cpu_count()} CPUs, kernel {os.uname().release}",
                   "versions": f"gdirect {gdirect.__version__}, Python {sys.version.split()[0]}",
                   "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}})
    f = gdirect.File(a.file)
    default = gdirect.settings()["inline_size"]
    rng = random.Random(7)
    calls = [("pread", default), ("pread", 0), ("read", None)]
    for rnd in range(1, a.rounds + 1):
        for size in (int(s) for s in a.sizes.split(",")):
            buf = np.full(size * SLOTS, POISON, dtype=np.uint8)
            views = [buf[i * size:(i + 1) * size] for i in range(SLOTS)]
            order = calls if rnd % 2 else calls[::-1]
            for call, inline in order:
                if inline is not None:
                    gdirect.configure(inline_size=inline)
                buf[:] = POISON
                last = {}
                times = []
                offs = [rng.randrange(0, span // size) * size for _ in range(a.count + 500)]
                for i, o in enumerate(offs):
                    slot = i % SLOTS
                    t0 = time.perf_counter_ns()
                    if call == "pread":
                        n = f.pread(views[slot], size, o).get()
                    else:
                        n = f.read(views[slot], o).bytes
                    t1 = time.perf_counter_ns()
                    if n != size:
                        sys.exit(f"{call} of {size} at {o}: {n} bytes")
                    last[slot] = o
                    if i >= 500:
                        times.append(t1 - t0)
                bad = [s for s, o in last.items() if views[s].tobytes() != data[o:o + size]]
                if bad:
                    sys.exit(f"{call} {size}: slots {bad[:5]} wrong")
                times.sort()
                emit({"round": rnd, "size": size, "call": call, "inline_size": inline,
                      "count": len(times), "p50_us": times[len(times) // 2] / 1e3,
                      "p99_us": times[len(times) * 99 // 100] / 1e3, "verified_slots": len(last)})
    gdirect.configure()


if __name__ == "__main__":
    main()
