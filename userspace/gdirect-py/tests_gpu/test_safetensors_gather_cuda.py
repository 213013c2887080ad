# SPDX-License-Identifier: GPL-2.0 OR MIT
"""The loader's gathered reads on a GPU: small pieces of a checkpoint read as one range into a
staging buffer and moved into place by the gather kernel or a batch of device copies
(`_native.cuda_copy_many`),
against the safetensors package's reader and a host reference. Run where torch and a GPU are,
with `python -m pytest userspace/gdirect-py/tests_gpu`."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from gdirect import _native
from gdirect import safetensors as gst

DTYPES = [("F64", 8, torch.float64), ("F32", 4, torch.float32), ("F16", 2, torch.float16),
          ("BF16", 2, torch.bfloat16), ("I64", 8, torch.int64), ("I16", 2, torch.int16),
          ("U8", 1, torch.uint8), ("BOOL", 1, torch.bool)]

COPY_CHECK = r"""
import sys, torch
from gdirect import _native
g = torch.Generator().manual_seed(int(sys.argv[1]))
size = 16 << 20
src = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
dst = torch.full((size,), 0xA5, dtype=torch.uint8)
copies, at = [], 0
while at < size - (600 << 10):
    # Mostly small copies at any offset; some of 16-byte multiples at 16-byte offsets (the
    # kernel's word path), some longer than one of its descriptors (64 KiB).
    kind = int(torch.randint(0, 8, (1,), generator=g))
    n = int(torch.randint(0, 300 << 10 if kind == 0 else 4096, (1,), generator=g))
    s = int(torch.randint(0, size - n, (1,), generator=g))
    if kind == 1:
        at, s, n = -(-at // 16) * 16, s // 16 * 16, n // 16 * 16
    copies.append((at, s, n))
    at += n + int(torch.randint(0, 64, (1,), generator=g))
want = dst.clone()
for d, s, n in copies:
    want[d:d + n] = src[s:s + n]
gs, gd = src.cuda(), dst.cuda()
_native.cuda_copy_many(gd.data_ptr(), gd.numel(), gs.data_ptr(), gs.numel(), copies)
assert torch.equal(gd.cpu(), want), "copies differ"
words = sum(1 for d, s, n in copies if n and (d | s | n) % 16 == 0)
print(_native.cuda_copy_method(0), len(copies), words)
"""


@pytest.mark.parametrize("method", ["kernel", "batch", "each"])
def test_copy_many_moves_each_range_and_nothing_else(method):
    """Hundreds of copies of random lengths (some empty, some aligned for 16-byte words, some
    longer than the kernel's 64 KiB pieces) to poisoned memory: each destination holds its
    source's bytes, every byte between them is still poison. By the gather kernel
    (`GDIRECT_GATHER_KERNEL=1`), by the driver's batch call (`=0`) and one call each (and
    `GDIRECT_NO_BATCH_COPY`), each in a fresh process: the choice is made once."""
    env = dict(os.environ)
    env.pop("GDIRECT_NO_BATCH_COPY", None)
    env["GDIRECT_GATHER_KERNEL"] = "1" if method == "kernel" else "0"
    if method == "each":
        env["GDIRECT_NO_BATCH_COPY"] = "1"
    r = subprocess.run([sys.executable, "-c", COPY_CHECK, "7"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    used, n, words = r.stdout.split()[-3:]
    assert int(n) > 400 and int(words) > 20
    # The H200's driver (CUDA 13) compiles the kernel and has cuMemcpyBatchAsync: each method
    # asked for ran, and was not refused.
    assert used == method


def test_copy_many_refuses_what_it_cannot_do():
    a = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    b = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    pa, pb = a.data_ptr(), b.data_ptr()
    with pytest.raises(ValueError, match="runs past its buffer"):
        _native.cuda_copy_many(pa, 4096, pb, 4096, [(4000, 0, 100)])
    with pytest.raises(ValueError, match="runs past its buffer"):
        _native.cuda_copy_many(pa, 4096, pb, 4096, [(0, 4090, 7)])
    with pytest.raises(ValueError, match="two destinations of cuda_copy_many overlap"):
        _native.cuda_copy_many(pa, 4096, pb, 4096, [(0, 0, 10), (9, 100, 10)])
    with pytest.raises(ValueError, match="source and destination overlap"):
        _native.cuda_copy_many(pa, 2048, pa + 1024, 2048, [(0, 0, 10)])
    with pytest.raises(ValueError, match="run past the end of their CUDA allocation"):
        _native.cuda_copy_many(pa, 1 << 40, pb, 4096, [(0, 0, 10)])
    host = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(ValueError):
        _native.cuda_copy_many(host.ctypes.data, 4096, pb, 4096, [(0, 0, 10)])
    # Nothing was written by the refused calls.
    assert int(a.sum()) == 0 and int(b.sum()) == 0


def many_unaligned(path, count, seed):
    """A file of ``count`` small tensors of mixed dtypes, shuffled so that most start at an
    offset their dtype's size does not divide."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(count):
        dt, size, _ = DTYPES[rng.integers(len(DTYPES))]
        elems = int(rng.integers(1, 3000))
        items.append((f"t{i}", dt, [elems], elems * size))
    header, data, at = {}, bytearray(), 0
    for name, dt, shape, n in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + n]}
        b = rng.integers(0, 256, n, dtype=np.uint8)
        data += (b & 1 if dt == "BOOL" else b).tobytes()
        at += n
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))
    return header


@pytest.mark.parametrize("staging", [None, 64 << 10], ids=["default", "64KiB-staging"])
def test_a_checkpoint_of_small_unaligned_tensors_loads_exactly(tmp_path, monkeypatch, staging):
    """Every tensor as the safetensors package reads it, byte for byte, with the pieces
    gathered (in one staging buffer, or in many rounds through a small one)."""
    import safetensors.torch as stt

    if staging is not None:
        monkeypatch.setattr(gst, "_STAGING", staging)
    path = tmp_path / "many.safetensors"
    header = many_unaligned(path, 3000, seed=3)
    unaligned = sum(1 for t in header.values()
                    if t["data_offsets"][0] % dict((d, s) for d, s, _ in DTYPES)[t["dtype"]])
    assert unaligned > 1000
    run = gst._Run(None, ("cuda", 0), 0, 0, gst.read_header(path).tensors)
    _, segs, _ = gst._layout(run)
    _, groups = gst._gather(segs)
    assert len(groups) >= (10 if staging else 1) and sum(map(len, groups)) > 500
    calls = []
    real = _native.cuda_copy_many
    monkeypatch.setattr(_native, "cuda_copy_many", lambda *a: (calls.append(a), real(*a)))
    ours = gst.load(path, device="cuda:0")
    torch.cuda.synchronize()
    assert len(calls) == len(groups)
    ref = stt.load_file(str(path), device="cpu")
    assert list(ours) == list(ref) == list(header)
    for k, want in ref.items():
        got = ours[k]
        assert got.device == torch.device("cuda", 0) and got.dtype == want.dtype
        assert got.shape == want.shape
        assert torch.equal(got.cpu().reshape(-1).view(torch.uint8),
                           want.reshape(-1).view(torch.uint8)), k
