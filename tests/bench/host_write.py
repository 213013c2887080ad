# SPDX-License-Identifier: GPL-2.0 OR MIT
"""One large write from host memory into the page cache (no GPU): gdirect's `File.write` (the
engine's threads writing its pieces) against one `os.write` of the same bytes, alternating
within each round; every file read back and compared with the source. What the engine's
threads cost or gain where they all write into one file's page cache.

Usage: python3 tests/bench/host_write.py [--dir /var/tmp] [--mib 1024] [--rounds 6]
       [--label NAME] [--out results.jsonl]

Run it once per build (PYTHONPATH picks the build, --label names it), alternating the builds,
with GDIRECT_THREADS set as the run is meant to measure (recorded in the meta line). Prints (and
appends to --out) a meta line, then one JSON line per (round, writer): seconds and GB/s. One
unmeasured write of each writer comes first (a process's first write into the page cache pays
for pages the kernel is still giving back from an earlier run).
"""
import argparse
import os
import sys
import time

import numpy as np

import gdirect
import jsonl_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--label", default="")
    ap.add_argument("--out")
    a = ap.parse_args()
    n = a.mib << 20
    src = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    path = os.path.join(a.dir, f"gdirect-host-write-{os.getpid()}.bin")

    def with_gdirect():
        f = gdirect.File(path, "w")
        try:
            if f.write(src, 0).bytes != n:
                raise SystemExit("gdirect wrote fewer bytes than asked")
        finally:
            f.close()

    def with_write():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(src)
            while mv:
                mv = mv[os.write(fd, mv):]
        finally:
            os.close(fd)

    writers = [("gdirect", with_gdirect), ("write", with_write)]
    meta = {"command": "tests/bench/host_write.py " + " ".join(sys.argv[1:]), "label": a.label,
            "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
            "date": jsonl_out.now(),
            "threads": gdirect.settings()["threads"], "cpus": os.cpu_count(), "bytes": n,
            "env": {k: v for k, v in os.environ.items() if k.startswith("GDIRECT_") and k != "GDIRECT_COMMIT"}}
    emit = jsonl_out.emitter(a.out)
    emit({"meta": meta})
    try:
        for _, fn in writers:
            fn()
            os.unlink(path)
        for r in range(a.rounds):
            for name, fn in writers:
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
                back = np.fromfile(path, dtype=np.uint8)
                if back.size != n or not np.array_equal(back, src):
                    raise SystemExit(f"round {r}: {name}'s file differs from the source")
                os.unlink(path)
                emit({"round": r, "writer": name, "seconds": t, "gb_per_s": n / t / 1e9, "verified": True})
    finally:
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
