# SPDX-License-Identifier: GPL-2.0 OR MIT
"""A checkpoint of many small tensors into GPU memory: gdirect.safetensors.load against
safetensors.torch.load_file, in fresh processes, warm, every tensor compared.

Usage: python3 tests/bench/many_tensors.py [--dir DIR] [--tensors 20000] [--mb 600] [--runs 5]
       [--profile] [--nogather] [--kernel] [--batchcopy] [--out results.jsonl]

Makes (once) in DIR one safetensors file of --tensors tensors of mixed dtypes (F64, F32, F16,
BF16, I64, I32, I16, I8, U8, BOOL) and shapes, about --mb MB in all, written in a shuffled
order so that most data offsets are not multiples of their dtype's size (safetensors'
own writer sorts by alignment; the format does not require it, and other writers do not).
Each load runs in a fresh Python process, torch imported and its CUDA context made before the
clock starts, until every tensor is on cuda:0 and the device synchronized; the loaders
alternate. Every gdirect load is compared, tensor by tensor, with safetensors' (same names,
dtypes, shapes, bytes). The figure of issue 31 is the time per tensor beyond the bytes: the
load's time less the bytes at the large-file rate (BENCHMARKS.md), over the tensor count.
--profile runs one more gdirect load under cProfile and prints where its time goes.
--nogather also loads with every laid-out piece a request of its own; --kernel and
--batchcopy also load with the gathered pieces moved by the gather kernel
(GDIRECT_GATHER_KERNEL=1), and by the driver's copies (=0). Each gdirect row names how its
pieces were moved ("copies").
"""
import argparse
import datetime
import json
import os
import random
import struct
import subprocess
import sys

DTYPES = [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4),
          ("I16", 2), ("I8", 1), ("U8", 1), ("BOOL", 1)]


def make(path, count, total, seed=31):
    rng = random.Random(seed)
    mean = total / count
    tensors = []
    for i in range(count):
        dt, size = rng.choice(DTYPES)
        elems = max(1, int(rng.expovariate(1.0 / mean) / size))
        # Two dimensions where the count allows, else one.
        a = rng.choice([d for d in (1, 2, 3, 4, 8, 16) if elems % d == 0])
        shape = [a, elems // a] if a > 1 else [elems]
        tensors.append((f"layer.{i // 10}.t{i % 10}", dt, size, shape, elems * size))
    rng.shuffle(tensors)
    header, off = {}, 0
    for name, dt, _size, shape, n in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    bits = bytes(b & 1 for b in range(256))
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _name, dt, _size, _shape, n in tensors:
            data = os.urandom(n)
            # BOOL bytes are 0 or 1 (readers may check); the rest random, NaNs included.
            f.write(data.translate(bits) if dt == "BOOL" else data)
    os.replace(tmp, path)
    unaligned = sum(1 for t in header.values() if t["data_offsets"][0] % dict(DTYPES)[t["dtype"]])
    return off, unaligned


CHILD = r"""
import json, sys, time
import torch
which, path, compare = sys.argv[1], sys.argv[2], sys.argv[3]
torch.cuda.init(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
if which.startswith("gdirect"):
    import gdirect.safetensors as gst
    gst.load  # imported before the clock, as torch is
    if which == "gdirect-nogather":
        gst._GATHER_BELOW = 0  # every laid-out piece its own request to the engine
t0 = time.perf_counter()
if which == "safetensors":
    import safetensors.torch as stt
    d = stt.load_file(path, device="cuda:0")
elif which == "profile":
    import cProfile, pstats, gdirect.safetensors as gst
    pr = cProfile.Profile(); pr.enable()
    d = gst.load(path, device="cuda:0")
    torch.cuda.synchronize(); pr.disable()
    pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(25)
else:
    d = gst.load(path, device="cuda:0")
torch.cuda.synchronize()
t = time.perf_counter() - t0
ok = None
if compare == "1":
    import safetensors.torch as stt
    ref = stt.load_file(path, device="cuda:0")
    raw = lambda t: t.reshape(-1).view(torch.uint8)  # bytes: NaNs compare as bytes
    ok = sorted(ref) == sorted(d) and all(
        ref[k].dtype == d[k].dtype and ref[k].shape == d[k].shape
        and torch.equal(raw(ref[k]), raw(d[k]))
        for k in ref)
copies = gst._native.cuda_copy_method(0) if which.startswith("gdirect") else None
print(json.dumps({"loader": which, "seconds": t, "tensors": len(d), "same": ok, "copies": copies}))
"""


def child(which, path, compare=False):
    env = dict(os.environ)
    if which in ("gdirect-kernel", "gdirect-batchcopy"):
        env["GDIRECT_GATHER_KERNEL"] = "1" if which == "gdirect-kernel" else "0"
    r = subprocess.run([sys.executable, "-c", CHILD, which, path, "1" if compare else "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{which}: {r.stderr[-3000:]}")
    if which == "profile":
        print(r.stderr, file=sys.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--mb", type=int, default=600)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--nogather", action="store_true",
                    help="also load with every laid-out piece a request of its own (gdirect-nogather)")
    ap.add_argument("--kernel", action="store_true",
                    help="also load with the gather kernel (gdirect-kernel)")
    ap.add_argument("--batchcopy", action="store_true",
                    help="also load with the driver's copies, not the gather kernel (gdirect-batchcopy)")
    ap.add_argument("--out")
    a = ap.parse_args()
    path = os.path.join(a.dir, f"gdirect-many-{a.tensors}-{a.mb}.safetensors")
    nbytes, unaligned = make(path, a.tensors, a.mb * 1_000_000)
    with open(path, "rb") as f:  # warm
        while f.read(64 << 20):
            pass
    meta = {"command": "tests/bench/many_tensors.py " + " ".join(sys.argv[1:]),
            "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "tensors": a.tensors, "bytes": nbytes, "unaligned": unaligned}
    rows = [{"meta": meta}]
    print(json.dumps(meta))
    loaders = (("safetensors", "gdirect") + (("gdirect-nogather",) if a.nogather else ())
               + (("gdirect-kernel",) if a.kernel else ())
               + (("gdirect-batchcopy",) if a.batchcopy else ()))
    for i in range(a.runs):
        for which in loaders:
            r = child(which, path, compare=(which.startswith("gdirect") and i == 0))
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.profile:
        child("profile", path)
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    for which in loaders:
        s = sorted(r["seconds"] for r in rows[1:] if r.get("loader") == which)
        print(f"{which}: median {s[len(s) // 2]:.3f} s of {len(s)} runs")


if __name__ == "__main__":
    main()
