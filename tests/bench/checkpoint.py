# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Checkpoint-load benchmark: gdirect.safetensors.load against safetensors.torch.load_file and
fastsafetensors, in fresh processes, every load verified against the others' tensors.

Usage: GDIRECT_COMMIT=<commit> python3 tests/bench/checkpoint.py [--dir DIR] [--gb 6]
       [--runs 3] [--layouts large,sharded,small] [--out results.jsonl]
       [--loaders safetensors,fastsafetensors,gdirect] [--tuned fastsafetensors:cache=1:...]

--loaders picks the loaders (a fastsafetensors:k=v:... entry is its SafeTensorsFileLoader with
those settings: cache=1 keeps the page cache, bbuf=KiB, threads=N); --tuned adds one of them,
recorded as "fastsafetensors-tuned" with its settings in the results' header.

The results go to tests/bench/results/checkpoint-h200.jsonl for scripts/benchmarks.

Makes (once) in DIR, each of about --gb GB of bf16 tensors: "large", one file of 4096 x 5120
tensors; "sharded", the same split over 4 files with a model.safetensors.index.json; "small",
one file of 128 x 1024 tensors (256 KiB each, thousands of them). Warm: the files are in the page
cache (read once first). Cold: their pages are dropped (POSIX_FADV_DONTNEED, no privilege
needed) before each load. Rates are file bytes over the load's wall time, until the tensors are
on the GPU and the device is synchronized. fastsafetensors runs without GDS (nogds=True: this
machine has none), with its default threads and buffers.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

LOADERS = ("safetensors", "fastsafetensors", "gdirect")
# fastsafetensors with the settings the sweep (--loaders fastsafetensors:...) found best on the
# H200, given with --tuned.

CHILD = r"""
import json, os, sys, time
import torch
which, files, cold = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
if cold:
    for p in files:
        fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
torch.cuda.init(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
t0 = time.perf_counter()
if which == "safetensors":
    import safetensors.torch as stt
    d = {}
    for p in files:
        d.update(stt.load_file(p, device="cuda:0"))
elif which == "fastsafetensors":
    from fastsafetensors import fastsafe_open
    with fastsafe_open(filenames=files, device="cuda:0", nogds=True) as f:
        d = {k: f.get_tensor(k) for k in f.keys()}
elif which.startswith("fastsafetensors:"):
    # Its loader with settings: cache=0|1 (disable_cache, on by default: it drops the page
    # cache), bbuf=KiB (bbuf_size_kb, default 16 MiB), threads=N (max_threads, default 16).
    from fastsafetensors import SafeTensorsFileLoader
    opt = dict(kv.split("=") for kv in which.split(":")[1:])
    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True,
                                   disable_cache=opt.get("cache", "0") == "0",
                                   bbuf_size_kb=int(opt.get("bbuf", 16 * 1024)),
                                   max_threads=int(opt.get("threads", 16)))
    loader.add_filenames({0: files})
    fb = loader.copy_files_to_device()
    d = {k: fb.get_tensor_wrapped(k).get_raw() for k in fb.key_to_rank_lidx}
else:
    from gdirect import safetensors as gst
    d = gst.load(files, device="cuda:0")
torch.cuda.synchronize()
dt = time.perf_counter() - t0
s = 0
for k in sorted(d):
    s = (s * 31 + int(d[k].view(torch.int16).to(torch.int64).sum().item())) % (1 << 61)
print(json.dumps({"seconds": dt, "checksum": s, "tensors": len(d)}))
"""


def make(layout, dir, gb):
    """The files of a layout (made once), in load order."""
    import torch
    import safetensors.torch as stt

    shape = (128, 1024) if layout == "small" else (4096, 5120)
    n = max(1, int(gb * 1e9 / (shape[0] * shape[1] * 2)))
    shards = 4 if layout == "sharded" else 1
    base = os.path.join(dir, f"gdirect-ckpt-{layout}-{gb:g}gb")
    files = [f"{base}-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    if all(os.path.exists(f) for f in files):
        return files
    g = torch.Generator().manual_seed(1)
    names = [f"layer.{i}.weight" for i in range(n)]
    per = -(-n // shards)
    weight_map = {}
    for i, f in enumerate(files):
        part = names[i * per : (i + 1) * per]
        stt.save_file({k: torch.randn(*shape, generator=g).to(torch.bfloat16) for k in part}, f)
        weight_map.update({k: os.path.basename(f) for k in part})
    if shards > 1:
        with open(f"{base}.safetensors.index.json", "w") as out:
            json.dump({"metadata": {}, "weight_map": weight_map}, out)
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--gb", type=float, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layouts", default="large,sharded,small")
    ap.add_argument("--out", default="checkpoint-results.jsonl")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--tuned", default=None)
    a = ap.parse_args()
    loaders = a.loaders.split(",") + ([a.tuned] if a.tuned else [])
    results = []
    for layout in a.layouts.split(","):
        gb = a.gb if layout != "small" else min(a.gb, 1.5)
        files = make(layout, a.dir, gb)
        size = sum(os.path.getsize(f) for f in files)
        for f in files:
            with open(f, "rb") as r:
                while r.read(1 << 26):
                    pass
        checksums = set()
        for cold in (False, True):
            for run in range(a.runs):
                for which in loaders:
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, which, json.dumps(files), "1" if cold else "0"],
                        capture_output=True, text=True)
                    if out.returncode != 0:
                        print(f"{which} on {layout} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
                        sys.exit(1)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    checksums.add(r["checksum"])
                    name = "fastsafetensors-tuned" if which == a.tuned else which
                    rec = {"layout": layout, "loader": name, "cache": "cold" if cold else "warm",
                           "run": run, "bytes": size, "files": len(files), "tensors": r["tensors"],
                           "seconds": r["seconds"], "gb_s": size / r["seconds"] / 1e9}
                    results.append(rec)
                    print(json.dumps(rec), flush=True)
        if len(checksums) != 1:
            print(f"{layout}: the loaders disagree (checksums {checksums})", file=sys.stderr)
            sys.exit(1)
        print(f"{layout}: every load gave the same tensors", flush=True)

    import safetensors
    import torch
    from importlib.metadata import version

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    meta = {
        "command": "python3 tests/bench/checkpoint.py " + " ".join(sys.argv[1:]),
        # The device copy of the tree has no .git: the caller passes the commit.
        "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu.strip().splitlines()[0] if gpu.strip() else "unknown",
        "versions": f"torch {torch.__version__}, safetensors {safetensors.__version__}, "
                    f"fastsafetensors {version('fastsafetensors')}",
    }
    if a.tuned:
        meta["tuned"] = a.tuned
    with open(a.out, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
