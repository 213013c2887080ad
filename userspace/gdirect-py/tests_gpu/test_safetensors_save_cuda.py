# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.safetensors.save of PyTorch tensors on the GPU and the CPU, against
safetensors.torch: every dtype both know, bytes compared (NaNs included); the same file as
save_file writes; non-contiguous tensors; shared ones refused; a tensor filled on a side stream
saved with the bytes the fill left."""

import numpy as np
import pytest
import safetensors.torch
import torch

from gdirect import safetensors as gst

NAMES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
         "float16", "bfloat16", "float32", "float64", "complex64", "float8_e5m2",
         "float8_e4m3fn", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz",
         "float4_e2m1fn_x2"]


def tensors(device):
    g = torch.Generator().manual_seed(2)
    out = {}
    for i, name in enumerate(NAMES):
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        size = torch.empty((), dtype=dt).element_size()
        shape = (3, 4 + 2 * i)
        raw = torch.randint(0, 256, (shape[0] * shape[1] * size,), dtype=torch.uint8, generator=g)
        if name == "bool":
            t = (raw % 2).bool().view(shape)
        else:
            t = raw.view(dt).view(shape)
        out[f"w.{name}"] = t.to(device)
    return out


def bits(t):
    t = t.contiguous().cpu()
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_every_dtype_reads_back_bit_for_bit(tmp_path, device):
    t = tensors(device)
    p = tmp_path / "all.safetensors"
    r = gst.save(t, p, metadata={"format": "pt"})
    assert r.tensors == len(t)
    back = safetensors.torch.load_file(str(p))
    assert set(back) == set(t)
    for k, v in t.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(bits(back[k]), bits(v)), k
    theirs = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file({k: v.cpu() for k, v in t.items()}, str(theirs),
                                metadata={"format": "pt"})
    assert p.read_bytes() == theirs.read_bytes()
    mine = gst.load(str(p), device=device)
    for k, v in t.items():
        assert torch.equal(bits(mine[k]), bits(v)), k


def test_non_contiguous_and_shared_tensors(tmp_path):
    base = torch.arange(64 * 32, dtype=torch.float32, device="cuda:0").view(64, 32)
    other = base.clone() * 3
    p = tmp_path / "nc.safetensors"
    gst.save({"t": base.t(), "every_other": other[::2, 1::2]}, p)
    back = safetensors.torch.load_file(str(p))
    assert torch.equal(back["t"], base.t().contiguous().cpu())
    assert torch.equal(back["every_other"], other[::2, 1::2].contiguous().cpu())
    with pytest.raises(RuntimeError, match="share memory"):
        gst.save({"a": base, "b": base[3]}, tmp_path / "shared.safetensors")
    assert not (tmp_path / "shared.safetensors").exists()


def test_a_tensor_filled_on_a_side_stream_is_saved_with_its_bytes(tmp_path):
    want = torch.from_numpy(np.random.default_rng(9).integers(0, 256, 16 << 20, dtype=np.uint8))
    src = want.to("cuda:0")
    t = torch.full((16 << 20,), 0xA5, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(400_000_000)
        t.copy_(src)
    p = tmp_path / "side.safetensors"
    gst.save({"t": t}, p)
    assert torch.equal(safetensors.torch.load_file(str(p))["t"], want)
