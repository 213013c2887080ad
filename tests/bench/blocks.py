#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Small random blocks between a file and slots of a GPU buffer, from Python threads: the
shape of KV-cache offload (tests/bench/blocks.sh runs the sweep; BENCHMARKS.md shows it).

Each of --threads Python threads moves its share of --requests blocks of --block bytes, one
request in flight per thread (submit, then wait), between random file offsets (multiples of
4 KiB) and its own slots of one CuPy buffer on GPU 0. Methods:

  gdirect-pread   gdirect.File.pread(...).get()  (futures, served by the engine's threads)
  gdirect-batch   gdirect.read_batch / write_batch of --batch requests (the buffer and each
                  slot's offset), then get()
  gdirect-read    gdirect.File.read / write      (the synchronous call)
  kvikio          kvikio.CuFile.pread(...).get() / pwrite (its futures)

Every block is verified after each round, outside its time: reads against the file's bytes
(the buffer poisoned before every round), writes by reading the file back (each round writes
new random bytes). Prints one JSON object: GB/s per round, per-request latency p50/p99 (submit
to the end of get), and the median round.

Usage: blocks.py FILE --method M [--op read|write] [--block BYTES] [--threads N]
                 [--requests N] [--rounds N] [--batch N]
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

POISON = 0xE9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--method", required=True,
                   choices=["gdirect-pread", "gdirect-batch", "gdirect-read", "kvikio"])
    p.add_argument("--op", default="read", choices=["read", "write"])
    p.add_argument("--block", type=int, default=65536)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--requests", type=int, default=4096, help="per round, all threads")
    p.add_argument("--rounds", type=int, default=4, help="the first is a warm-up")
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()

    import cupy as cp
    import numpy as np

    block, threads = a.block, a.threads
    n = a.requests - a.requests % threads
    if a.op == "read":
        size = os.path.getsize(a.file)
        data = np.fromfile(a.file, dtype=np.uint8)
    else:
        size = max(n * block, 1 << 30)
        with open(a.file, "wb") as f:
            f.truncate(size)
    buf = cp.empty(n * block, dtype=cp.uint8)
    rng = np.random.default_rng(1)

    if a.method == "kvikio":
        import kvikio
        import kvikio.defaults
        kvikio.defaults.set({"num_threads": max(threads, 1), "compat_mode": kvikio.CompatMode.ON})
        handle = kvikio.CuFile(a.file, "r" if a.op == "read" else "r+")
        version = "kvikio " + kvikio.__version__
    else:
        import gdirect
        handle = gdirect.File(a.file, "r" if a.op == "read" else "r+")
        version = "gdirect " + gdirect.__version__

    # Each slot a view of the buffer, made before the clock starts (KvikIO's pread takes no
    # memory offset; a KV cache keeps its blocks as such views).
    views = [buf[s * block:(s + 1) * block] for s in range(n)]

    def one_by_one(reqs, lat):
        h = handle
        t = time.perf_counter
        if a.method == "kvikio" or a.method == "gdirect-pread":
            call = h.pread if a.op == "read" else h.pwrite
            for slot, off in reqs:
                t0 = t()
                got = call(views[slot], block, off).get()
                lat.append(t() - t0)
                if got != block:
                    raise SystemExit(f"request at {off}: {got} bytes of {block}")
        elif a.method == "gdirect-read":
            call = h.read if a.op == "read" else h.write
            for slot, off in reqs:
                t0 = t()
                got = call(views[slot], off).bytes
                lat.append(t() - t0)
                if got != block:
                    raise SystemExit(f"request at {off}: {got} bytes of {block}")
        else:
            batch = gdirect.read_batch if a.op == "read" else gdirect.write_batch
            for i in range(0, len(reqs), a.batch):
                part = reqs[i:i + a.batch]
                t0 = t()
                # The buffer and each slot's offset in it, as a batch is meant to be called.
                got = batch([(h, off, buf, slot * block, block) for slot, off in part]).get()
                lat.append((t() - t0) / len(part))
                if got != [block] * len(part):
                    raise SystemExit(f"a batch moved {got}")

    rounds = []
    for r in range(a.rounds):
        blocks = size // block if a.op == "read" else n
        if a.op == "read":
            offsets = rng.integers(0, (size - block) // 4096, n) * 4096
            buf.fill(POISON)
        else:
            # Distinct places in the file, so every written block can be checked.
            offsets = rng.permutation(blocks)[:n] * block
            buf[:] = cp.random.default_rng(100 + r).integers(0, 256, n * block, dtype=cp.uint8)
        cp.cuda.runtime.deviceSynchronize()
        slots = np.arange(n)
        shares = [[(int(s), int(o)) for s, o in zip(slots[k::threads], offsets[k::threads])]
                  for k in range(threads)]
        lats = [[] for _ in range(threads)]
        errors = []

        def run(k):
            try:
                one_by_one(shares[k], lats[k])
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        seconds = time.perf_counter() - t0
        if errors:
            print(f"round {r}: {errors[0]}", file=sys.stderr)
            return 1
        # Verified outside the time.
        host = cp.asnumpy(buf)
        if a.op == "read":
            for s, o in zip(slots, offsets):
                if not np.array_equal(host[s * block:(s + 1) * block], data[o:o + block]):
                    print(f"round {r}: slot {s} (file offset {o}) is wrong", file=sys.stderr)
                    return 3
        else:
            back = np.fromfile(a.file, dtype=np.uint8)
            for s, o in zip(slots, offsets):
                if not np.array_equal(host[s * block:(s + 1) * block], back[o:o + block]):
                    print(f"round {r}: file offset {o} (slot {s}) is wrong", file=sys.stderr)
                    return 3
        lat = sorted(x for l in lats for x in l)
        rounds.append({
            "seconds": seconds,
            "gb_per_s": n * block / seconds / 1e9,
            "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e6,
            "verified": True,
        })
    timed = rounds[1:] or rounds
    best = sorted(timed, key=lambda x: x["gb_per_s"])[len(timed) // 2]
    print(json.dumps({
        "method": a.method, "op": a.op, "block": block, "threads": threads,
        "requests": n, "batch": a.batch if a.method == "gdirect-batch" else None,
        "version": version, "rounds": rounds,
        "median_gb_per_s": best["gb_per_s"], "p50_us": best["p50_us"], "p99_us": best["p99_us"],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
