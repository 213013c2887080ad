# SPDX-License-Identifier: GPL-2.0 OR MIT
"""One 4 KiB request at a time, gdirect's `File.pread(...).get()` against KvikIO's
`CuFile.pread(...).get()`, into slots of CuPy and of PyTorch GPU memory, issued from the main
thread and from a second Python thread, over a 256 MiB and a 1 GiB span of a warm file: what of
tests/bench/blocks.py's harness (CuPy views, a second thread, a 1 GiB file) moves a request's
cost, which request_cost.py (torch, the main thread, 256 MiB) does not see.

Usage: python3 tests/bench/one_request.py [--file PATH] [--count 3000] [--rounds 3]
       [--out results.jsonl]

Prints one JSON line per (round, library, memory, thread, span): the p50 and p99 in µs over
--count requests after 200 of warm-up, the combinations alternating within each round. After
each, every slot written is compared with the file's bytes at the offset last read into it
(the buffer poisoned first).
"""
import argparse
import os
import random
import sys
import threading
import time

import jsonl_out

IO = 4096
SLOTS = 4096


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/var/tmp/gdirect-one-request.bin")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    import cupy as cp
    import kvikio
    import kvikio.defaults
    import torch

    import gdirect

    size = 1 << 30
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        with open(a.file, "wb") as f:
            for _ in range(size >> 24):
                f.write(os.urandom(1 << 24))
    with open(a.file, "rb") as f:
        data = f.read()
    kvikio.defaults.set({"num_threads": 1, "compat_mode": kvikio.CompatMode.ON})
    files = {"gdirect": gdirect.File(a.file), "kvikio": kvikio.CuFile(a.file, "r")}
    bufs = {"cupy": cp.empty(SLOTS * IO, dtype=cp.uint8),
            "torch": torch.empty(SLOTS * IO, dtype=torch.uint8, device="cuda:0")}
    views = {m: [b[i * IO:(i + 1) * IO] for i in range(SLOTS)] for m, b in bufs.items()}
    emit = jsonl_out.emitter(a.out)

    emit({"meta": {"command": "tests/bench/one_request.py " + " ".join(sys.argv[1:]),
                   "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
                   "date": jsonl_out.now(),
                   "gpu": torch.cuda.get_device_name(0),
                   "versions": f"gdirect {gdirect.__version__}, KvikIO {kvikio.__version__}, "
                               f"CuPy {cp.__version__}, torch {torch.__version__}"}})
    rng = random.Random(7)

    def measure(lib, mem, span):
        f, vs = files[lib], views[mem]
        lat, last = [], {}
        for k in range(a.count + 200):
            off = rng.randrange(span // IO) * IO
            slot = k % SLOTS
            t0 = time.perf_counter_ns()
            n = f.pread(vs[slot], IO, off).get()
            t = time.perf_counter_ns() - t0
            if n != IO:
                raise RuntimeError(f"{lib} pread of {IO} at {off}: {n} bytes")
            last[slot] = off
            if k >= 200:
                lat.append(t / 1000)
        return lat, last

    for rnd in range(a.rounds):
        for span in (256 << 20, 1 << 30):
            for mem in ("cupy", "torch"):
                for thread in ("main", "second"):
                    for lib in ("gdirect", "kvikio"):
                        b = bufs[mem]
                        if mem == "torch":
                            b.fill_(0xA5)
                        else:
                            b.fill(0xA5)
                        torch.cuda.synchronize()
                        cp.cuda.runtime.deviceSynchronize()
                        if thread == "main":
                            lat, last = measure(lib, mem, span)
                        else:
                            got = []
                            t = threading.Thread(target=lambda: got.append(measure(lib, mem, span)))
                            t.start()
                            t.join()
                            if not got:
                                sys.exit(f"{lib} {mem}: the second thread's requests failed")
                            lat, last = got[0]
                        host = (b.cpu().numpy() if mem == "torch" else cp.asnumpy(b)).tobytes()
                        for slot, off in last.items():
                            if host[slot * IO:(slot + 1) * IO] != data[off:off + IO]:
                                sys.exit(f"{lib} {mem} {thread}: slot {slot} does not hold the "
                                         f"file's bytes at {off}")
                        lat.sort()
                        emit({"round": rnd, "library": lib, "memory": mem, "thread": thread,
                              "span_mib": span >> 20,
                              "p50_us": round(lat[len(lat) // 2], 2),
                              "p99_us": round(lat[len(lat) * 99 // 100], 2),
                              "count": len(lat), "verified_slots": len(last)})


if __name__ == "__main__":
    main()
