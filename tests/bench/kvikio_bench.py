#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR MIT
"""KvikIO's side of the GPU benchmark (tests/bench/gpu.sh): reads a file into a CuPy array
with kvikio.CuFile, verifies every read against the file's checksum (the same position-keyed
sum as gdirect's `checksum` module, computed here on the GPU) and prints one JSON object in
the shape `gdirect bench --json` prints.

Usage: kvikio_bench.py FILE --reference HEX [--threads N] [--task-size BYTES] [--cold]
                       [--repeat N] [--warmup N] [--first] [--compat-mode ON|AUTO]
                       [--direct-io]
"""

import argparse
import json
import os
import statistics
import sys
import time


def checksum(cp, buf, n):
    """The position-keyed checksum of the first n bytes of the CuPy uint8 array buf."""
    words = (n + 7) // 8
    padded = cp.zeros(words * 8, dtype=cp.uint8)
    padded[:n] = buf[:n]
    w = padded.view(cp.uint64)
    i = cp.arange(words, dtype=cp.uint64)
    z = w ^ (i * cp.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> cp.uint64(30))) * cp.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> cp.uint64(27))) * cp.uint64(0x94D049BB133111EB)
    z = z ^ (z >> cp.uint64(31))
    return int(z.sum(dtype=cp.uint64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--reference", required=True, help="checksum of the file, hex")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--task-size", type=int, default=None)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--first", action="store_true")
    p.add_argument("--compat-mode", default="ON", choices=["ON", "OFF", "AUTO"])
    p.add_argument("--direct-io", action="store_true", help="KvikIO's auto_direct_io_read")
    a = p.parse_args()

    import cupy as cp
    import kvikio
    import kvikio.defaults

    config = {"compat_mode": getattr(kvikio.CompatMode, a.compat_mode)}
    if a.direct_io:
        config["auto_direct_io_read"] = True
    if a.threads:
        config["num_threads"] = a.threads
    if a.task_size:
        config["task_size"] = a.task_size
    kvikio.defaults.set(config)
    size = os.path.getsize(a.file)
    buf = cp.empty(size, dtype=cp.uint8)
    cp.cuda.runtime.deviceSynchronize()
    reference = int(a.reference, 16)
    runs_wanted = 1 if a.first else max(1, a.repeat)
    warmups = 0 if a.first else (a.warmup if a.warmup is not None else (0 if a.cold else 1))
    runs = []
    for k in range(warmups + runs_wanted):
        buf.fill(0)
        cp.cuda.runtime.deviceSynchronize()
        if a.cold:
            fd = os.open(a.file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        t0 = time.perf_counter()
        with kvikio.CuFile(a.file, "r") as f:
            n = f.read(buf)
        cp.cuda.runtime.deviceSynchronize()
        seconds = time.perf_counter() - t0
        got = checksum(cp, buf, size)
        if n != size or got != reference:
            print(f"kvikio read {k}: {n} bytes, checksum {got:016x}, file {reference:016x}: "
                  "wrong, its time does not count", file=sys.stderr)
            return 1
        if k >= warmups:
            runs.append({"seconds": seconds, "gb_per_s": size / seconds / 1e9, "verified": True})
    speeds = sorted(r["gb_per_s"] for r in runs)
    print(json.dumps({
        "file": a.file,
        "bytes": size,
        "method": "kvikio",
        "kvikio_version": kvikio.__version__,
        "compat_mode": str(kvikio.defaults.get("compat_mode")),
        "direct_io": bool(kvikio.defaults.get("auto_direct_io_read")),
        "cold": a.cold,
        "first": a.first,
        "threads": kvikio.defaults.get("num_threads"),
        "block_size": kvikio.defaults.get("task_size"),
        "runs": runs,
        "median_gb_per_s": statistics.median(speeds),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
