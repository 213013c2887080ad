# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Where a many-tensor checkpoint's read spends its time: the read of its laid-out segments
(each a request to the engine) against one read of the same bytes, against the same bytes cut
into as many equal pieces, and as gdirect.safetensors.load reads them (small pieces read
together into a staging buffer on the GPU and moved into place by a batch of device copies),
warm, into one CUDA buffer, in one process (each figure the best of --runs). Then the loader's steps one by one: the header, the
layout, the read, the views.

Usage: python3 tests/bench/read_segments.py [--dir DIR] [--tensors 20000] [--mb 600]
       [--runs 5] [--out results.jsonl]

Uses the file tests/bench/many_tensors.py makes (and makes it if missing). Every figure is
wall time until the device is synchronized.
"""
import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import many_tensors  # noqa: E402


def best(fn, runs):
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out), sorted(out)[len(out) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--mb", type=int, default=600)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reads-only", action="store_true", help="skip the loader's steps")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    import gdirect
    import gdirect.safetensors as gst
    from gdirect import _native

    path = os.path.join(a.dir, f"gdirect-many-{a.tensors}-{a.mb}.safetensors")
    if not os.path.exists(path):
        many_tensors.make(path, a.tensors, a.mb * 1_000_000)
    with open(path, "rb") as f:  # warm
        while f.read(64 << 20):
            pass
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    f = gdirect.File(path)
    h = gst._parse_header(f)
    ts = [t for t in h.tensors if t.start != t.end]
    run = gst._Run(h, ("cuda", 0), ts[0].start, ts[-1].end, ts)
    size, segs, offsets = gst._layout(run)
    buf = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    ptr = buf.data_ptr()
    data = h.data_start
    total = sum(n for _, _, n in segs)
    laid = [(f._f, ptr + b, n, data + fo) for fo, b, n in segs]
    one = [(f._f, ptr, total, data)]
    k = len(segs)
    step = total // k
    equal = [(f._f, ptr + i * step, step if i < k - 1 else total - i * step, data + i * step)
             for i in range(k)]

    def rm(reads):
        def go():
            _native.read_many(reads, True)
            torch.cuda.synchronize()
        return go

    rows = []
    meta = {"command": "tests/bench/read_segments.py " + " ".join(sys.argv[1:]),
            "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith("GDIRECT_") and k != "GDIRECT_COMMIT"},
            "tensors": len(ts), "segments": k, "bytes": total}
    rows.append({"meta": meta})
    for name, reads in (("laid-out segments", laid), ("one range", one),
                        ("equal pieces", equal)):
        lo, med = best(rm(reads), a.runs)
        rows.append({"what": name, "reads": len(reads), "best_s": lo, "median_s": med,
                     "GB/s": total / lo / 1e9})
    # The loader's read of the run: small pieces gathered through a staging buffer.
    backends = {("cuda", 0): gst._Pt("cuda", 0)}

    def gathered():
        gst._read_runs(backends, [run], {h.path: f})
        torch.cuda.synchronize()

    direct, groups = gst._gather(segs)
    lo, med = best(gathered, a.runs)
    rows.append({"what": "gathered (the loader)", "reads": len(direct) + len(groups),
                 "copies": sum(map(len, groups)), "best_s": lo, "median_s": med,
                 "GB/s": total / lo / 1e9})
    # The loader, step by step.
    steps = {} if a.reads_only else {
        "header": lambda: gst._parse_header(f),
        "layout": lambda: gst._layout(run),
        "buffer": lambda: torch.empty(size, dtype=torch.uint8, device="cuda:0"),
        "views": lambda: gst._Pt("cuda", 0).views(path, buf, ts, offsets, {}),
        "load": lambda: (gst.load(path, device="cuda:0"), torch.cuda.synchronize()),
    }
    for name, fn in steps.items():
        lo, med = best(fn, a.runs)
        rows.append({"what": name, "best_s": lo, "median_s": med,
                     "us_per_tensor": lo / len(ts) * 1e6})
    for r in rows:
        print(json.dumps(r))
    if a.out:
        with open(a.out, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
