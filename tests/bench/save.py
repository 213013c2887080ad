# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Saving a checkpoint from GPU memory: gdirect.safetensors.save against
safetensors.torch.save_file, into the page cache and with fsync, every saved file read back and
compared.

Usage: python3 tests/bench/save.py [--dir DIR] [--gb 2] [--tensors 256] [--runs 3]
       [--out results.jsonl]

Makes --tensors tensors on cuda:0 (bf16, fp16, fp32 and int64 in turn, sizes spread around
their mean, --gb GB in all), then, --runs times, each saver in turn writes them to a file of its
own in DIR (removed first): safetensors' save_file (which copies each tensor to host memory and
writes the file), gdirect's save (the engine writes each tensor from GPU memory); each without
and with fsync (save_file's file synced after it returns, the same os.fsync gdirect's `fsync=True`
makes, both timed). "raw" is the disk's own rate for the same bytes: one host buffer written
with os.write and synced. Every file a saver wrote is read back with safetensors.safe_open
(onto the CPU) and compared, tensor by tensor, byte for byte, with a host copy of the tensors
made before the clock. Each line of --out is one save.
"""
import argparse
import datetime
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    import safetensors
    import safetensors.torch as stt
    import gdirect
    import gdirect.safetensors as gst

    g = torch.Generator(device="cuda:0").manual_seed(5)
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.int64]
    mean = a.gb * 1e9 / a.tensors
    tensors = {}
    for i in range(a.tensors):
        dt = dtypes[i % len(dtypes)]
        size = torch.tensor([], dtype=dt).element_size()
        n = max(1, int(mean * (0.5 + (i * 7919 % 1000) / 1000) / size))
        if dt.is_floating_point:
            t = torch.randn(n, generator=g, device="cuda:0", dtype=torch.float32).to(dt)
        else:
            t = torch.randint(-2**40, 2**40, (n,), generator=g, device="cuda:0", dtype=dt)
        tensors[f"model.layers.{i // 8}.w{i % 8}"] = t.reshape(-1, 4) if n % 4 == 0 else t
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    host = {k: v.cpu() for k, v in tensors.items()}
    raw = torch.empty(nbytes, dtype=torch.uint8).numpy()
    raw[:] = 7

    def same(path):
        with safetensors.safe_open(path, framework="pt", device="cpu") as f:
            if sorted(f.keys()) != sorted(host):
                return False
            for k, want in host.items():
                got = f.get_tensor(k)
                if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                        got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                    return False
        return True

    def fsync(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def save_file(path, sync):
        stt.save_file(tensors, path)
        if sync:
            fsync(path)

    def save_gdirect(path, sync):
        gst.save(tensors, path, fsync=sync)

    def save_raw(path, sync):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(raw)
            while mv:
                mv = mv[os.write(fd, mv):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    meta = {"command": "tests/bench/save.py " + " ".join(sys.argv[1:]),
            "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith("GDIRECT_") and k != "GDIRECT_COMMIT"},
            "gpu": torch.cuda.get_device_name(0), "tensors": len(tensors), "bytes": nbytes,
            "versions": f"torch {torch.__version__}, safetensors {safetensors.__version__}, "
                        f"gdirect {getattr(gdirect, '__version__', '?')}"}
    rows = [{"meta": meta}]
    print(json.dumps(meta), flush=True)
    savers = [("safetensors", save_file), ("gdirect", save_gdirect), ("raw", save_raw)]
    # One unmeasured save each first (imports, the engine's threads, the file's blocks).
    for name, fn in savers:
        p = os.path.join(a.dir, f"gdirect-save-{name}.safetensors")
        fn(p, False)
        os.unlink(p)
    for i in range(a.runs):
        for sync in (False, True):
            for name, fn in savers:
                p = os.path.join(a.dir, f"gdirect-save-{name}.safetensors")
                if os.path.exists(p):
                    os.unlink(p)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(p, sync)
                t = time.perf_counter() - t0
                r = {"saver": name, "fsync": sync, "seconds": t, "bytes": nbytes,
                     "same": None if name == "raw" else same(p)}
                rows.append(r)
                print(json.dumps(r), flush=True)
                os.unlink(p)
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
