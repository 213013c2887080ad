# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.safetensors with PyTorch, on the dtypes safetensors added in 0.6 to 0.8, against the
safetensors package's own torch reader (0.8.0, shipped with the GPU pack): run where torch is,
with `python -m pytest userspace/gdirect-py/tests_gpu`."""

import json
import struct

import numpy as np
import pytest
import torch

from gdirect import safetensors as gst


def test_the_new_dtypes_load_as_torch_loads_them(tmp_path):
    """F8_E8M0, F4 (two a byte, the last dimension halved), C64 and the FNUZ types come back
    as the safetensors package's torch reader gives them; the F6 types have no torch dtype
    there or here."""
    import safetensors

    rng = np.random.default_rng(5)
    data = b""
    header = {}
    for dt, shape in [("F8_E8M0", [3, 4]), ("F4", [2, 6]), ("C64", [5]), ("F8_E4M3FNUZ", [7]),
                      ("F8_E5M2FNUZ", [2, 2]), ("F6_E2M3", [4])]:
        n = int(np.prod(shape)) * {"F4": 4, "F6_E2M3": 6, "C64": 64}.get(dt, 8) // 8
        header[f"t_{dt}"] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    path = tmp_path / "new.safetensors"
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)

    compared = 0
    with safetensors.safe_open(str(path), framework="pt") as ref, \
            gst.open(path, device="cpu", framework="pt") as ours:
        for name in header:
            try:
                want = ref.get_tensor(name)
            except Exception:  # noqa: BLE001
                want = None
            if want is None:
                with pytest.raises(gst.SafetensorsError):
                    ours.get_tensor(name)
                continue
            got = ours.get_tensor(name)
            assert (got.dtype, got.shape) == (want.dtype, want.shape), name
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
            compared += 1
    # E8M0, C64 and the FNUZ types are in every torch since 2.7: the test compared tensors.
    assert compared >= 4, f"safetensors {safetensors.__version__} read only {compared} of them"
