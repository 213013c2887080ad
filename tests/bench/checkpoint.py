# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Checkpoint-load benchmark: safetensors.torch.load_file against gdirect.safetensors.load, in
fresh processes, each load verified against a checksum of the file's tensors.

Usage: GDIRECT_COMMIT=<commit> python3 tests/bench/checkpoint.py [--dir DIR] [--gb 6] [--runs 3]
       [--out results.jsonl]

The results go to tests/bench/results/checkpoint-h200.jsonl for scripts/benchmarks.

Makes (once) a checkpoint of bf16 tensors of about --gb GB in DIR. Warm: the file is in the page
cache (read once first). Cold: its pages are dropped (POSIX_FADV_DONTNEED, no privilege needed)
before each load. Rates are file bytes over the load's wall time, until the tensors are on the
GPU and the device is synchronized.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
import torch
which, path, cold = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if cold:
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
torch.cuda.init(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
t0 = time.perf_counter()
if which == "safetensors":
    import safetensors.torch as stt
    d = stt.load_file(path, device="cuda:0")
else:
    from gdirect import safetensors as gst
    d = gst.load(path, device="cuda:0")
torch.cuda.synchronize()
dt = time.perf_counter() - t0
s = 0
for k in sorted(d):
    s = (s * 31 + int(d[k].view(torch.int16).to(torch.int64).sum().item())) % (1 << 61)
print(json.dumps({"seconds": dt, "checksum": s, "tensors": len(d)}))
"""


def make(path, gb):
    import torch
    import safetensors.torch as stt

    n = max(1, int(gb * 1e9 / (4096 * 5120 * 2)))
    g = torch.Generator().manual_seed(1)
    t = {f"layer.{i}.weight": torch.randn(4096, 5120, generator=g).to(torch.bfloat16) for i in range(n)}
    stt.save_file(t, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--gb", type=float, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="checkpoint-results.jsonl")
    a = ap.parse_args()
    path = os.path.join(a.dir, f"gdirect-ckpt-{a.gb:g}gb.safetensors")
    if not os.path.exists(path):
        make(path, a.gb)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass
    results = []
    checksums = set()
    for cold in (False, True):
        for run in range(a.runs):
            for which in ("safetensors", "gdirect"):
                out = subprocess.run([sys.executable, "-c", CHILD, which, path, "1" if cold else "0"],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    sys.exit(1)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                checksums.add(r["checksum"])
                rec = {"loader": which, "cache": "cold" if cold else "warm", "run": run,
                       "bytes": size, "seconds": r["seconds"], "gb_s": size / r["seconds"] / 1e9,
                       "tensors": r["tensors"]}
                results.append(rec)
                print(json.dumps(rec), flush=True)
    if len(checksums) != 1:
        print(f"loaders disagree: checksums {checksums}", file=sys.stderr)
        sys.exit(1)
    import datetime

    import safetensors
    import torch

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    meta = {
        "command": "python3 tests/bench/checkpoint.py " + " ".join(sys.argv[1:]),
        # The device copy of the tree has no .git: the caller passes the commit.
        "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu.strip().splitlines()[0] if gpu.strip() else "unknown",
        "versions": f"torch {torch.__version__}, safetensors {safetensors.__version__}",
        "file": f"{size} bytes, {results[0]['tensors']} bf16 tensors",
    }
    with open(a.out, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("every load gave the same tensors (checksum", checksums.pop(), ")")


if __name__ == "__main__":
    main()
