# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Load safetensors checkpoints straight into GPU memory.

>>> from gdirect import safetensors
>>> weights = safetensors.load("model.safetensors", device="cuda:0")   # doctest: +SKIP
>>> weights = safetensors.load("model.safetensors.index.json")          # doctest: +SKIP

Each file's data section is read in one call of the engine (many threads, large I/Os, direct
I/O for what is not cached) into one device buffer; the tensors are views of it (a tensor whose
offset its dtype cannot view is copied out, on the device). The header is parsed and checked
here before any byte of data is read: an unknown dtype, a shape that does not match its bytes,
overlapping tensors or a truncated file raise ``SafetensorsError`` (a ``ValueError``), never a
partial result.

Tensors come back as PyTorch tensors when torch is installed (``framework="pt"``), otherwise as
CuPy arrays on a GPU or NumPy arrays on the CPU (``framework="cupy"`` / ``"numpy"``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from . import File, _native, _target

__all__ = ["SafetensorsError", "TensorInfo", "load", "open", "read_header", "metadata"]

# dtype: bytes per element.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

# The format's own limit on the header (safetensors refuses larger ones).
MAX_HEADER = 100 * 1024 * 1024

_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
    "U64": "uint64", "F64": "float64",
}
_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
    "U64": "uint64", "F64": "float64",
}
# Types NumPy lacks, from ml_dtypes when it is installed.
_ML_DTYPES = {"BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, or a checkpoint that does not hold
    together (with the file and what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file: its dtype, shape, and bytes ``[start, end)`` of the data section."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Header:
    """A parsed, checked header: the tensors in file order, the metadata, and where the data
    section starts in the file."""

    path: str
    tensors: List[TensorInfo]
    metadata: Dict[str, str]
    data_start: int
    data_len: int


def _open(path: str):
    """The builtin ``open`` (this module's ``open`` is the lazy reader)."""
    import builtins

    return builtins.open(path, "rb")


def _bad(path: str, what: str) -> SafetensorsError:
    return SafetensorsError(f"{path}: {what}")


def read_header(path: "os.PathLike[str] | str") -> Header:
    """Parses and checks the header of ``path``."""
    path = os.fspath(path)
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise _bad(path, f"{size} bytes: too short for a safetensors header")
        n = int.from_bytes(f.read(8), "little")
        if n > MAX_HEADER:
            raise _bad(path, f"a header of {n} bytes (the format allows {MAX_HEADER})")
        if 8 + n > size:
            raise _bad(path, f"truncated: a header of {n} bytes in a file of {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise _bad(path, "__metadata__ is not a map of strings to strings")
    data_len = size - 8 - n
    tensors = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _bad(path, f"tensor {name!r}: not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise _bad(path, f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            type(d) is int and d >= 0 for d in shape
        ):
            raise _bad(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(path, f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
        numel = 1
        for d in shape:
            numel *= d
        start, end = offsets
        if end - start != numel * DTYPE_SIZES[dtype]:
            raise _bad(
                path,
                f"tensor {name!r}: {dtype}{shape} is {numel * DTYPE_SIZES[dtype]} bytes, "
                f"its offsets span {end - start}",
            )
        if end > data_len:
            raise _bad(
                path,
                f"truncated: tensor {name!r} ends at byte {end} of a {data_len}-byte data section",
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), start, end))
    tensors.sort(key=lambda t: (t.start, t.end))
    prev: Optional[TensorInfo] = None
    for t in tensors:
        if t.start == t.end:
            continue
        if prev is not None and t.start < prev.end:
            raise _bad(path, f"tensors {prev.name!r} and {t.name!r} overlap")
        prev = t
    return Header(path, tensors, meta, 8 + n, data_len)


def metadata(path: "os.PathLike[str] | str") -> Dict[str, str]:
    """The file's ``__metadata__``."""
    return dict(read_header(path).metadata)


def _files(paths: Union[str, "os.PathLike[str]", Iterable[Any]]) -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        p = os.fspath(paths)
        if p.endswith(".json"):
            with _open(p) as f:
                try:
                    index = json.load(f)
                except ValueError as e:
                    raise SafetensorsError(f"{p}: not a JSON index ({e})") from None
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise SafetensorsError(f"{p}: no weight_map")
            base = os.path.dirname(p)
            files = []
            for shard in weight_map.values():
                full = os.path.join(base, shard)
                if full not in files:
                    files.append(full)
            return files
        return [p]
    return [os.fspath(p) for p in paths]


def _device(device: Any) -> Tuple[str, int]:
    """``("cpu", -1)`` or ``("cuda", N)``."""
    if isinstance(device, int):
        return "cuda", device
    s = str(device)
    if s == "cpu":
        return "cpu", -1
    if s == "cuda":
        return "cuda", 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return "cuda", int(s[5:])
    raise ValueError(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or an ordinal")


def _framework(framework: Optional[str], kind: str) -> str:
    if framework is None:
        try:
            import torch  # noqa: F401

            return "pt"
        except ImportError:
            return "cupy" if kind == "cuda" else "numpy"
    if framework not in ("pt", "numpy", "cupy"):
        raise ValueError(f"framework {framework!r}: expected 'pt', 'numpy' or 'cupy'")
    if framework == "numpy" and kind != "cpu":
        raise ValueError("framework 'numpy' holds CPU arrays: use device='cpu'")
    if framework == "cupy" and kind != "cuda":
        raise ValueError("framework 'cupy' holds GPU arrays: use a CUDA device")
    return framework


class _Pt:
    def __init__(self, kind: str, ordinal: int):
        import torch

        self.torch = torch
        self.device = torch.device("cpu") if kind == "cpu" else torch.device("cuda", ordinal)

    def buffer(self, n: int):
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.device)

    def dtype(self, path: str, t: TensorInfo):
        dt = getattr(self.torch, _TORCH[t.dtype], None)
        if dt is None:
            raise _bad(path, f"tensor {t.name!r}: this torch has no {_TORCH[t.dtype]}")
        return dt

    def view(self, path: str, blob, t: TensorInfo):
        dt = self.dtype(path, t)
        size = DTYPE_SIZES[t.dtype]
        if t.start == t.end:
            return self.torch.empty(t.shape, dtype=dt, device=self.device)
        raw = blob[t.start : t.end]
        if t.start % size == 0:
            return raw.view(dt).view(t.shape)
        # An offset the dtype cannot view at: a copy of its own, on the device.
        out = self.torch.empty(t.shape, dtype=dt, device=self.device)
        out.view(-1).view(self.torch.uint8).copy_(raw)
        return out


class _Np:
    def __init__(self, kind: str, ordinal: int, cupy: bool):
        if cupy:
            import cupy as xp

            self.ctx = xp.cuda.Device(ordinal)
        else:
            import numpy as xp

            self.ctx = None
        self.xp = xp

    def buffer(self, n: int):
        if self.ctx is not None:
            with self.ctx:
                return self.xp.empty(n, dtype=self.xp.uint8)
        return self.xp.empty(n, dtype=self.xp.uint8)

    def dtype(self, path: str, t: TensorInfo):
        name = _NUMPY.get(t.dtype)
        if name is not None:
            return self.xp.dtype(name)
        try:
            import ml_dtypes

            return self.xp.dtype(getattr(ml_dtypes, _ML_DTYPES[t.dtype]))
        except (ImportError, AttributeError, KeyError, TypeError):
            raise _bad(
                path,
                f"tensor {t.name!r}: {self.xp.__name__} has no {t.dtype} (install torch, or "
                "ml_dtypes for NumPy)",
            ) from None

    def view(self, path: str, blob, t: TensorInfo):
        dt = self.dtype(path, t)
        if t.start == t.end:
            return self.xp.empty(t.shape, dtype=dt)
        raw = blob[t.start : t.end]
        if t.start % dt.itemsize != 0:
            raw = raw.copy()
        return raw.view(dt).reshape(t.shape)


def _backend(framework: Optional[str], device: Any):
    kind, ordinal = _device(device)
    fw = _framework(framework, kind)
    if fw == "pt":
        return _Pt(kind, ordinal)
    return _Np(kind, ordinal, cupy=fw == "cupy")


def _read_files(backend, headers: List[Header]) -> Dict[str, Any]:
    """Reads every file's data section into a buffer of its own, all in one call of the engine,
    whose workers take the files' pieces in turn (one set of threads for the whole
    checkpoint), then makes the tensors."""
    spans = [max((t.end for t in h.tensors), default=0) for h in headers]
    blobs = [backend.buffer(span) for span in spans]
    reads, targets, which = [], [], []
    for h, span, blob in zip(headers, spans, blobs):
        if span:
            t = _target(blob)
            targets.append(t)
            reads.append((File(h.path)._f, t.ptr, span, h.data_start))
            which.append((h, span))
    if reads:
        _, each = _native.read_many(reads, targets[0].kind == "cuda")
        for (h, span), (got, _eof) in zip(which, each):
            if got != span:
                raise _bad(h.path, f"truncated: {got} of {span} data bytes could be read")
    del targets
    out: Dict[str, Any] = {}
    for h, blob in zip(headers, blobs):
        out.update({t.name: backend.view(h.path, blob, t) for t in h.tensors})
    return out


def load(
    paths: Union[str, "os.PathLike[str]", Iterable[Any]],
    device: Any = "cuda:0",
    framework: Optional[str] = None,
) -> Dict[str, Any]:
    """Loads every tensor of one safetensors file, of a sharded checkpoint (its
    ``*.safetensors.index.json``), or of a list of files, onto ``device`` (``"cpu"``,
    ``"cuda:N"``). Every header is checked before any data is read; a tensor name found in
    two files is an error."""
    files = _files(paths)
    headers = [read_header(p) for p in files]
    seen: Dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise SafetensorsError(f"tensor {t.name!r} is in both {seen[t.name]} and {h.path}")
            seen[t.name] = h.path
    return _read_files(_backend(framework, device), headers)


class open:  # noqa: N801  (named like safetensors.safe_open's role)
    """Lazy access to one file's tensors, each read on demand::

        with gdirect.safetensors.open("model.safetensors", device="cuda:0") as f:
            w = f.get_tensor("lm_head.weight")
    """

    def __init__(self, path: "os.PathLike[str] | str", device: Any = "cuda:0", framework: Optional[str] = None):
        self._header = read_header(path)
        self._by_name = {t.name: t for t in self._header.tensors}
        self._backend = _backend(framework, device)
        self._file = File(self._header.path)

    def __enter__(self) -> "open":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def keys(self) -> List[str]:
        return [t.name for t in self._header.tensors]

    def metadata(self) -> Dict[str, str]:
        return dict(self._header.metadata)

    def get_tensor(self, name: str):
        t = self._by_name.get(name)
        if t is None:
            raise KeyError(name)
        n = t.end - t.start
        blob = self._backend.buffer(n)
        if n:
            r = self._file.read(blob, file_offset=self._header.data_start + t.start, size=n)
            if r.bytes != n:
                raise _bad(self._header.path, f"truncated: {r.bytes} of {n} bytes of {name!r}")
        return self._backend.view(self._header.path, blob, TensorInfo(t.name, t.dtype, t.shape, 0, n))
