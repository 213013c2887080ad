# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Load safetensors checkpoints straight into GPU memory.

>>> from gdirect import safetensors
>>> weights = safetensors.load("model.safetensors", device="cuda:0")   # doctest: +SKIP
>>> weights = safetensors.load("model.safetensors.index.json")          # doctest: +SKIP

Each file's data section is read in one call of the engine (many threads, large I/Os, direct
I/O for what is not cached) into one device buffer, laid out so that every tensor starts where its dtype can view it; the
tensors are views of it, none copied. The header is parsed and checked
here before any byte of data is read, by the format's own rules (those of the safetensors
package, 0.8): an unknown dtype, a shape that does not match its bytes, tensors that overlap or
leave a gap, data that does not start at the section's first byte or bytes after the last
tensor, a header over 100,000,000 bytes, ``__metadata__`` that is not a map of strings (or
given twice), a field of an entry given twice, JSON that safetensors' parser refuses (a lone
surrogate escape, a number out of range, nesting past 128 levels, in ignored fields too), or a
truncated file raise ``SafetensorsError`` (a ``ValueError``), never a partial result. The
header and the data come through one open file, so a file replaced in between is not mixed.
Every dtype of safetensors 0.8 is read (F4 as torch's ``float4_e2m1fn_x2``, two a byte).

Tensors come back as PyTorch tensors when torch is installed (``framework="pt"``), otherwise as
CuPy arrays on a GPU or NumPy arrays on the CPU (``framework="cupy"`` / ``"numpy"``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Tuple, Union

from . import File, _native, _target, write_batch

__all__ = [
    "SafetensorsError", "SaveReport", "TensorInfo", "load", "metadata", "open", "read_header",
    "save",
]

# dtype: bits per element, every dtype safetensors (0.8) accepts. F4 and F6 pack elements
# below a byte; a tensor's bits must fill whole bytes.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}
# dtype: bytes per element, for the dtypes of whole bytes.
DTYPE_SIZES = {k: v // 8 for k, v in DTYPE_BITS.items() if v % 8 == 0}

# The format's own limit on the header (safetensors refuses larger ones).
MAX_HEADER = 100_000_000

# torch's name of each dtype; F4 is torch's float4_e2m1fn_x2, two elements a byte (the last
# dimension halved, as safetensors does). The F6 types have none: safetensors refuses them
# for torch too.
_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2", "I16": "int16",
    "U16": "uint16", "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32",
    "F32": "float32", "C64": "complex64", "I64": "int64", "U64": "uint64", "F64": "float64",
}
_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
    "U64": "uint64", "F64": "float64", "C64": "complex64",
}
# Types NumPy lacks, from ml_dtypes when it is installed (F4 and F6 have no packed form there).
_ML_DTYPES = {
    "BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, or a checkpoint that does not hold
    together (with the file and what is wrong)."""


class TensorInfo(NamedTuple):
    """One tensor of a file: its dtype, shape, and bytes ``[start, end)`` of the data section.
    (A named tuple: a checkpoint has tens of thousands of them, made while it loads.)"""

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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_U64 = 1 << 64
_FIELDS = ("dtype", "shape", "data_offsets")


class _Object(list):
    """A JSON object as its (key, value) pairs in order, repeated keys kept."""


def _int(text: str) -> Any:
    """A JSON integer as serde_json reads it: beyond 64 bits, or ``-0``, a float."""
    v = int(text)
    if (v == 0 and text.startswith("-")) or not -(1 << 63) <= v < _U64:
        return _float(text)
    return v


def _float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text[:20]}")
    return v


def _json(text: str) -> Any:
    """The header's JSON, which serde_json has already taken (``safetensors_json_error``: its
    numbers, escapes and nesting), as safetensors' serde_json reads its values: objects as
    ``_Object`` pairs (a repeated key is for the caller to judge), integers past 64 bits and
    ``-0`` as floats."""
    return json.loads(text, object_pairs_hook=_Object, parse_int=_int, parse_float=_float,
                      parse_constant=_no_constant)


def _read(f: File, n: int, offset: int) -> bytes:
    buf = bytearray(n)
    if n and f.read(buf, file_offset=offset).bytes != n:
        raise OSError(f"{f.path}: short read of {n} bytes at {offset}")
    return bytes(buf)


def _parse_header(f: File) -> Header:
    """Parses and checks the header of the open file ``f``, as safetensors does: whatever it
    refuses is refused here, whatever it reads is read."""
    path = f.path
    size = f.size
    if size < 8:
        raise _bad(path, f"{size} bytes: too short for a safetensors header")
    n = int.from_bytes(_read(f, 8, 0), "little")
    if n > MAX_HEADER:
        raise _bad(path, f"a header of {n} bytes (the format allows {MAX_HEADER})")
    if 8 + n > size:
        raise _bad(path, f"truncated: a header of {n} bytes in a file of {size}")
    raw = _read(f, n, 8)
    data_len = size - 8 - n
    # The native parser takes a plainly valid header (the same checks, in Rust): tens of
    # thousands of tensors in milliseconds. Anything else is read below, which names the fault.
    fast = _native.safetensors_header(raw, data_len, DTYPE_BITS, TensorInfo)
    if fast is not None:
        return Header(path, fast[0], fast[1], 8 + n, data_len)
    # What serde_json refuses in any JSON value (numbers it finds out of range, which Python's
    # exact reading of them may take; lone surrogate escapes; nesting past 128 levels), from
    # serde_json itself, anywhere, ignored fields too.
    refused = _native.safetensors_json_error(raw)
    if refused is not None:
        raise _bad(path, f"the header is not JSON ({refused})")
    try:
        header = _json(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(path, f"the header is not JSON ({e})") from None
    if type(header) is not _Object:
        raise _bad(path, "the header is not a JSON object")
    meta: Any = None
    had_meta = False
    entries: Dict[str, Any] = {}
    # Every entry's types are checked, a repeated name's too; the last one counts (serde's
    # map), and only it is checked against its sizes (safetensors' Metadata::validate).
    for name, info in header:
        if name == "__metadata__":
            # A struct's field in safetensors' header type: given once, null or strings.
            if had_meta:
                raise _bad(path, "__metadata__ given twice")
            had_meta = True
            if info is not None and (type(info) is not _Object or not all(
                    type(v) is str for _, v in info)):
                raise _bad(path, f"__metadata__ {info!r:.60} is not a map of strings to strings")
            meta = info
            continue
        if type(info) is _Object:
            fields: Dict[str, Any] = {}
            for k, v in info:
                if k in _FIELDS:
                    if k in fields:
                        raise _bad(path, f"tensor {name!r}: {k} given twice")
                    fields[k] = v
            dtype, shape, offsets = (fields.get(k) for k in _FIELDS)
        elif type(info) is list and len(info) == 3:
            # serde reads a struct from an array of its fields in order too.
            dtype, shape, offsets = info
        else:
            raise _bad(path, f"tensor {name!r}: not an object")
        if type(dtype) is _Object and len(dtype) == 1 and dtype[0][1] is None:
            # serde reads an enum's variant from {"NAME": null} too.
            dtype = dtype[0][0]
        if type(dtype) is not str or dtype not in DTYPE_BITS:
            raise _bad(path, f"tensor {name!r}: unknown dtype {dtype!r}")
        if type(shape) is not list or not all(type(d) is int and 0 <= d < _U64 for d in shape):
            raise _bad(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if (type(offsets) is not list or len(offsets) != 2
                or not all(type(o) is int and 0 <= o < _U64 for o in offsets)):
            raise _bad(path, f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
        entries[name] = (dtype, shape, offsets)
    by_name: Dict[str, TensorInfo] = {}
    for name, (dtype, shape, (start, end)) in entries.items():
        if start > end:
            raise _bad(path, f"tensor {name!r}: data_offsets {[start, end]!r} are not [begin, end]")
        numel = 1
        for d in shape:
            # Checked as safetensors multiplies (in 64 bits, in order): an overflow is an
            # error even where a later size is 0.
            numel *= d
            if numel >= _U64:
                raise _bad(path, f"tensor {name!r}: shape {shape!r} overflows 64 bits")
        bits = DTYPE_BITS[dtype] * numel
        if bits >= _U64:
            raise _bad(path, f"tensor {name!r}: {dtype}{shape} overflows 64 bits")
        if bits % 8:
            raise _bad(
                path,
                f"tensor {name!r}: {dtype}{shape} is {bits} bits, not a whole number of bytes",
            )
        if end - start != bits // 8:
            raise _bad(
                path,
                f"tensor {name!r}: {dtype}{shape} is {bits // 8} bytes, "
                f"its offsets span {end - start}",
            )
        by_name[name] = TensorInfo(name, dtype, tuple(shape), start, end)
    meta = {} if meta is None else dict(meta)
    tensors = list(by_name.values())
    # The data section is the tensors end to end from its first byte, in offset order: no
    # gap, no overlap, nothing after the last (safetensors' Metadata::validate and its check
    # that the buffer is fully covered).
    tensors.sort(key=lambda t: (t.start, t.end))
    at, prev = 0, None
    for t in tensors:
        if t.start != at:
            where = f"after {prev.name!r}, which ends at {at}" if prev else "at the data section's start"
            what = "overlaps" if t.start < at else f"leaves a gap of {t.start - at} bytes"
            raise _bad(path, f"tensor {t.name!r} at byte {t.start} {what} {where}")
        at, prev = t.end, t
    if at > data_len:
        raise _bad(path, f"truncated: the tensors end at byte {at} of a {data_len}-byte data section")
    if at < data_len:
        raise _bad(path, f"{data_len - at} bytes after the last tensor, which ends at byte {at}")
    return Header(path, tensors, meta, 8 + n, data_len)


def read_header(path: "os.PathLike[str] | str") -> Header:
    """Parses and checks the header of ``path``."""
    return _parse_header(File(path))


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


Device = Tuple[str, int]


def _device(device: Any) -> Device:
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
        name = _TORCH.get(t.dtype)
        if name is None:
            raise _bad(path, f"tensor {t.name!r}: torch has no dtype for {t.dtype}")
        dt = getattr(self.torch, name, None)
        if dt is None:
            raise _bad(path, f"tensor {t.name!r}: this torch has no {name}")
        return dt

    def shape(self, path: str, t: TensorInfo) -> Tuple[int, ...]:
        """The tensor's torch shape: F4's last dimension halved (two elements a byte)."""
        if t.dtype != "F4":
            return t.shape
        if not t.shape or t.shape[-1] % 2:
            raise _bad(
                path,
                f"tensor {t.name!r}: F4{list(t.shape)} as torch's float4_e2m1fn_x2 needs an even "
                "last dimension",
            )
        return t.shape[:-1] + (t.shape[-1] // 2,)

    def view(self, path: str, blob, t: TensorInfo):
        dt = self.dtype(path, t)
        shape = self.shape(path, t)
        size = max(1, DTYPE_BITS[t.dtype] // 8)
        if t.start == t.end:
            return self.torch.empty(shape, dtype=dt, device=self.device)
        raw = blob[t.start : t.end]
        if t.start % size == 0:
            return raw.view(dt).view(shape)
        # An offset the dtype cannot view at: a copy of its own, on the device.
        out = self.torch.empty(shape, dtype=dt, device=self.device)
        out.view(-1).view(self.torch.uint8).copy_(raw)
        return out

    def views(self, path: str, blob, tensors: List[TensorInfo], offsets: List[int],
              out: Dict[str, Any]):
        """Every tensor of ``tensors`` (each at its byte offset in ``blob``, which its dtype's
        size divides: ``_layout``) as a view of ``blob``, into ``out``: one ``as_strided`` of
        a typed view of the whole buffer each (made once per dtype), made in native code
        (``_native.safetensors_views``); what that leaves (F4, a dtype of no fixed size) made
        here."""
        n = blob.numel()
        typed: Dict[str, Any] = {}
        # The first tensor of each dtype (the one an error names).
        for dt, t in {t.dtype: t for t in reversed(tensors)}.items():
            size = DTYPE_SIZES.get(dt)
            if size is not None and dt != "F4":
                typed[dt] = blob[: n - n % size].view(self.dtype(path, t))
        for i in _native.safetensors_views(tensors, offsets, typed, DTYPE_SIZES, out):
            t, off = tensors[i], offsets[i]
            out[t.name] = self.view(path, blob, TensorInfo(t.name, t.dtype, t.shape, off,
                                                           off + t.end - t.start))


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
        if t.dtype not in _ML_DTYPES:
            raise _bad(
                path,
                f"tensor {t.name!r}: {self.xp.__name__} has no {t.dtype} (elements below a "
                "byte: use framework='pt')",
            )
        try:
            import ml_dtypes

            return self.xp.dtype(getattr(ml_dtypes, _ML_DTYPES[t.dtype]))
        except (ImportError, AttributeError, TypeError):
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

    def views(self, path: str, blob, tensors: List[TensorInfo], offsets: List[int],
              out: Dict[str, Any]):
        """Every tensor of ``tensors`` as a view of ``blob`` (see ``_Pt.views``)."""
        for t, off in zip(tensors, offsets):
            out[t.name] = self.view(path, blob, TensorInfo(t.name, t.dtype, t.shape, off,
                                                           off + t.end - t.start))


def _backend(framework: Optional[str], device: Any):
    return _backend_for(framework, _device(device))


def _backend_for(framework: Optional[str], device: Device):
    kind, ordinal = device
    fw = _framework(framework, kind)
    if fw == "pt":
        return _Pt(kind, ordinal)
    return _Np(kind, ordinal, cupy=fw == "cupy")


def _gpu_count() -> int:
    """The GPUs this process sees (through torch or CuPy; 0 without either)."""
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        pass
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except (ImportError, RuntimeError):
        return 0


def _auto_split(headers: List[Header], gpus: int) -> Dict[str, Device]:
    """``device_map="auto"``: the tensors in checkpoint order (file by file, each in its data
    order) cut into ``gpus`` runs of about equal bytes, run ``i`` on GPU ``i``."""
    total = sum(t.end - t.start for h in headers for t in h.tensors)
    out: Dict[str, Device] = {}
    done = 0
    for h in headers:
        for t in h.tensors:
            n = t.end - t.start
            # The GPU whose share holds the tensor's middle byte.
            i = min(gpus - 1, (2 * done + n) * gpus // (2 * total)) if total else 0
            out[t.name] = ("cuda", i)
            done += n
    return out


def _by_prefix(headers: List[Header], device_map: Dict[str, Any]) -> Dict[str, Device]:
    """A dict ``device_map``: each tensor on the device of the longest key that is its name, a
    prefix of it ending at a dot, or ``""`` (every tensor)."""
    devices = {}
    for key, dev in device_map.items():
        if not isinstance(key, str):
            raise ValueError(f"device_map key {key!r}: expected a tensor name or prefix")
        try:
            devices[key] = _device(dev)
        except ValueError as e:
            raise ValueError(f"device_map[{key!r}]: {e}") from None
    out: Dict[str, Device] = {}
    for h in headers:
        for t in h.tensors:
            best = None
            parts = t.name.split(".")
            for i in range(len(parts), -1, -1):
                key = ".".join(parts[:i])
                if key in devices:
                    best = key
                    break
            if best is None:
                raise ValueError(
                    f"tensor {t.name!r} ({h.path}) matches no key of device_map "
                    "(a key \"\" places every other tensor)"
                )
            out[t.name] = devices[best]
    return out


def _placement(headers: List[Header], device_map: Any) -> Dict[str, Device]:
    """Each tensor's device under a ``device_map`` (``load`` places them all on one device
    itself when there is none)."""
    if isinstance(device_map, str):
        if device_map != "auto":
            raise ValueError(f"device_map {device_map!r}: expected 'auto' or a dict")
        gpus = _gpu_count()
        if gpus == 0:
            raise ValueError("device_map='auto' found no GPU (through torch or CuPy)")
        return _auto_split(headers, gpus)
    if isinstance(device_map, dict):
        return _by_prefix(headers, device_map)
    raise ValueError(f"device_map {device_map!r}: expected 'auto' or a dict")


@dataclass
class _Run:
    """Tensors of one file, next to each other in its data section, bound for one device: read
    together into one buffer, of which they are views."""

    header: Header
    device: Device
    start: int
    end: int
    tensors: List[TensorInfo]


def _runs(headers: List[Header], place: Dict[str, Device]) -> List[_Run]:
    runs: List[_Run] = []
    for h in headers:
        last: Optional[_Run] = None
        for t in h.tensors:
            if t.start == t.end:
                continue
            d = place[t.name]
            if last is not None and last.device == d:
                last.end = t.end
                last.tensors.append(t)
            else:
                last = _Run(h, d, t.start, t.end, [t])
                runs.append(last)
    return runs


def _layout(run: _Run) -> Tuple[int, List[Tuple[int, int, int]], List[int]]:
    """Where the run's tensors go in its buffer: each at an offset its dtype's size divides, so
    that every one is a view of the buffer, never a copy (safetensors' own writer keeps that
    alignment in the file, other writers do not), and the file's bytes kept in one piece as
    long as their alignment allows. Returns the buffer's size, the reads that fill it
    (file offset in the data section, buffer offset, length) and each tensor's buffer offset."""
    return _native.safetensors_layout(run.tensors, DTYPE_SIZES)


# A laid-out run's pieces (``_layout``) smaller than this, next to each other in the file, are
# read together into a staging buffer on the GPU, at most ``_STAGING`` bytes at a time, and
# moved into place there (``_read_runs``).
_GATHER_BELOW = 1 << 20
_STAGING = 128 << 20


def _gather(segs: List[Tuple[int, int, int]]
            ) -> Tuple[List[Tuple[int, int, int]], List[List[Tuple[int, int, int]]]]:
    """Splits a run's reads ``(file offset, buffer offset, length)`` into those read in place
    and groups of small ones read together: each group at least two pieces, each one's file
    range following the last's, ``_STAGING`` bytes at most."""
    direct: List[Tuple[int, int, int]] = []
    groups: List[List[Tuple[int, int, int]]] = []
    cur: List[Tuple[int, int, int]] = []

    def flush() -> None:
        if len(cur) > 1:
            groups.append(list(cur))
        else:
            direct.extend(cur)
        cur.clear()

    for seg in segs:
        file_off, _, n = seg
        if n >= _GATHER_BELOW:
            flush()
            direct.append(seg)
            continue
        if cur and (cur[-1][0] + cur[-1][2] != file_off
                    or file_off + n - cur[0][0] > _STAGING):
            flush()
        cur.append(seg)
    flush()
    return direct, groups


def _read_runs(backends: Dict[Device, Any], runs: List[_Run], files: Dict[str, File]
               ) -> List[Tuple[Any, List[int]]]:
    """Reads every run into a buffer of its own on its device (laid out by ``_layout``), from
    ``files`` (the open files whose headers were parsed): one call of the engine per device
    (whose workers take the runs' pieces in turn), the devices at once, each on a thread of
    its own (the engine releases the GIL). Returns each run's buffer and its tensors' offsets
    in it, in the order of ``runs``."""
    layouts = [_layout(r) for r in runs]
    blobs = [backends[r.device].buffer(size) for r, (size, _, _) in zip(runs, layouts)]
    groups: Dict[Device, List[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(r.device, []).append(i)

    def check(i: int, file_off: int, want: int, got: int) -> None:
        if got != want:
            raise _bad(
                runs[i].header.path,
                f"truncated: {got} of {want} data bytes at {file_off} could be read",
            )

    def read(device: Device, idx: List[int]) -> None:
        cuda = device[0] == "cuda"
        reads, whose, gathers = [], [], []
        for i in idx:
            ptr = _target(blobs[i]).ptr
            f = files[runs[i].header.path]._f
            data = runs[i].header.data_start
            direct, small = _gather(layouts[i][1]) if cuda else (layouts[i][1], [])
            for file_off, buf_off, n in direct:
                reads.append((f, ptr + buf_off, n, data + file_off))
                whose.append((i, file_off, n))
            gathers += [(i, f, ptr, data, g) for g in small]
        _, each = _native.read_many(reads, cuda)
        for (i, file_off, want), (got, _eof) in zip(whose, each):
            check(i, file_off, want, got)
        if not gathers:
            return
        # Small pieces, each a request of its own to the engine, cost more than their bytes:
        # each group of them is read as one range into a staging buffer on the GPU, and moved
        # into place there by one call of ``cuda_copy_many`` (a batch of device copies, or the
        # gather kernel).
        cap = max(g[-1][0] + g[-1][2] - g[0][0] for _, _, _, _, g in gathers)
        stage = backends[device].buffer(cap)
        sptr = _target(stage).ptr
        for i, f, ptr, data, g in gathers:
            start = g[0][0]
            n = g[-1][0] + g[-1][2] - start
            _, ((got, _eof),) = _native.read_many([(f, sptr, n, data + start)], True)
            check(i, start, n, got)
            _native.cuda_copy_many(ptr, layouts[i][0], sptr, cap,
                                   [(buf_off, file_off - start, m) for file_off, buf_off, m in g])
        del stage

    if len(groups) <= 1:
        for device, idx in groups.items():
            read(device, idx)
    else:
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=len(groups), thread_name_prefix="gdirect-load"
        ) as pool:
            futures = [pool.submit(read, d, idx) for d, idx in groups.items()]
        for f in futures:
            f.result()
    return [(blob, offsets) for blob, (_, _, offsets) in zip(blobs, layouts)]


def load(
    paths: Union[str, "os.PathLike[str]", Iterable[Any]],
    device: Any = "cuda:0",
    framework: Optional[str] = None,
    device_map: Union[None, str, Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Loads every tensor of one safetensors file, of a sharded checkpoint (its
    ``*.safetensors.index.json``), or of a list of files, onto ``device`` (``"cpu"``,
    ``"cuda:N"``). Every header is checked before any data is read; a tensor name found in
    two files is an error.

    ``device_map`` places the tensors on several devices instead, as accelerate's does: a dict
    from a tensor name or a prefix of names ending at a dot (``"model.layers.0"``) to a device,
    the longest matching key winning and ``""`` matching every tensor; or ``"auto"``, the
    tensors in checkpoint order cut into runs of about equal bytes, one per visible GPU. Each
    device's tensors are read by that device's own engine, every device at once."""
    # Each file is opened once: its header and its data come through the same open file, so
    # that a file replaced in between (a saver's atomic rename, a hub cache update) cannot get
    # one file's header applied to another's bytes.
    opened: Dict[str, File] = {}
    for p in _files(paths):
        if p not in opened:
            opened[p] = File(p)
    headers = [_parse_header(f) for f in opened.values()]
    if len(headers) > 1:
        # (A file's own names are distinct: its parser checks.)
        seen: Dict[str, str] = {}
        for h in headers:
            for t in h.tensors:
                if t.name in seen:
                    raise SafetensorsError(
                        f"tensor {t.name!r} is in both {seen[t.name]} and {h.path}"
                    )
                seen[t.name] = h.path
    place: Optional[Dict[str, Device]] = None
    if device_map is None:
        # Every tensor on one device: one run per file (its tensors are in data order, end to
        # end), and no map of names to build.
        one = _device(device)
        runs = []
        for h in headers:
            ts = [t for t in h.tensors if t.start != t.end]
            if ts:
                runs.append(_Run(h, one, ts[0].start, ts[-1].end, ts))
        devices = {one} if any(h.tensors for h in headers) else set()
    else:
        place = _placement(headers, device_map)
        runs = _runs(headers, place)
        devices = set(place.values())
    backends = {d: _backend_for(framework, d) for d in devices}
    blobs = _read_runs(backends, runs, {h.path: f for h, f in zip(headers, opened.values())})
    views: Dict[str, Any] = {}
    for r, (blob, offsets) in zip(runs, blobs):
        backends[r.device].views(r.header.path, blob, r.tensors, offsets, views)
    del blobs
    names = [t.name for h in headers for t in h.tensors]
    if len(views) == len(names) and list(views) == names:
        # Every tensor a view, made in the checkpoint's order.
        return views
    out: Dict[str, Any] = {}
    for h in headers:
        for t in h.tensors:
            v = views.get(t.name)
            if v is None:
                v = backends[one if place is None else place[t.name]].view(h.path, None, t)
            out[t.name] = v
    return out


class open:  # noqa: N801  (named like safetensors.safe_open's role)
    """Lazy access to one file's tensors, each read on demand::

        with gdirect.safetensors.open("model.safetensors", device="cuda:0") as f:
            w = f.get_tensor("lm_head.weight")
    """

    def __init__(self, path: "os.PathLike[str] | str", device: Any = "cuda:0", framework: Optional[str] = None):
        # One open file for the header and every tensor's bytes (see ``load``).
        self._file = File(path)
        self._header = _parse_header(self._file)
        self._by_name = {t.name: t for t in self._header.tensors}
        self._backend = _backend(framework, device)

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


# --- saving ----------------------------------------------------------------------------------

# Each dtype's rank in safetensors' own order of dtypes (its `Dtype` enum, the order of
# DTYPE_BITS above): a file's tensors are laid out by that rank, highest first, then by name,
# as safetensors lays them out, so that every tensor starts aligned to its element size and the
# file is the one safetensors would write.
_RANK = {d: i for i, d in enumerate(DTYPE_BITS)}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
_FROM_NUMPY = {**{v: k for k, v in _NUMPY.items()}, **{v: k for k, v in _ML_DTYPES.items()}}


@dataclass(frozen=True)
class SaveReport:
    """What ``save`` wrote: the files (each shard, then the index, if any), the tensors and
    their bytes, the seconds it took, and whether the files were synced to the device
    (``fsync``)."""

    files: List[str]
    tensors: int
    bytes: int
    seconds: float
    fsync: bool


@dataclass
class _Out:
    """One tensor to write: its header entry and the memory its bytes are in (contiguous)."""

    name: str
    dtype: str
    shape: List[int]
    memory: Any
    nbytes: int


def _is_torch(t: Any) -> bool:
    return all(hasattr(t, a) for a in ("data_ptr", "element_size", "untyped_storage", "is_contiguous"))


def _extent(ptr: int, shape: Any, strides_bytes: Any, itemsize: int, nbytes: int) -> Tuple[int, int]:
    """The bytes ``[lo, hi)`` a strided array's elements span."""
    if nbytes == 0:
        return ptr, ptr
    lo = hi = ptr
    for dim, st in zip(shape, strides_bytes):
        if dim > 1:
            if st < 0:
                lo += (dim - 1) * st
            else:
                hi += (dim - 1) * st
    return lo, hi + itemsize


def _prepare(name: Any, t: Any) -> Tuple[_Out, Tuple[str, int, int]]:
    """The tensor ``t`` as written (its contiguous values), and the bytes its memory spans now
    (device, from, to), for the shared-memory check."""
    if not isinstance(name, str):
        raise ValueError(f"tensor name {name!r} is not a str")
    if name == "__metadata__":
        raise ValueError("'__metadata__' is the header's metadata key, not a tensor name")
    if _is_torch(t):
        if getattr(t, "layout", None) is not None and str(t.layout) != "torch.strided":
            raise ValueError(f"tensor {name!r} is {t.layout}: only strided (dense) tensors can be saved")
        tname = str(t.dtype).replace("torch.", "")
        dtype = _FROM_TORCH.get(tname)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: safetensors has no dtype for torch.{tname}")
        shape = list(t.shape)
        if dtype == "F4":  # two elements a byte: the file counts elements
            shape[-1] *= 2
        item = t.element_size()
        span = _extent(t.data_ptr(), t.shape, [s * item for s in t.stride()], item,
                       t.numel() * item)
        device = str(t.device)
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return _Out(name, dtype, shape, t, t.numel() * item), (device, *span)
    dt = getattr(t, "dtype", None)
    if dt is None or not hasattr(t, "shape") or not hasattr(t, "strides"):
        raise TypeError(f"tensor {name!r}: a {type(t).__name__}, not a torch, NumPy or CuPy array")
    dtype = _FROM_NUMPY.get(getattr(dt, "name", str(dt)))
    if dtype is None:
        raise ValueError(f"tensor {name!r}: safetensors has no dtype for {dt}")
    gpu = hasattr(t, "__cuda_array_interface__")
    ptr = t.__cuda_array_interface__["data"][0] if gpu else t.__array_interface__["data"][0]
    span = _extent(ptr, t.shape, t.strides, t.itemsize, t.nbytes)
    device = f"cuda:{t.device.id}" if gpu else "cpu"
    if not gpu and (dt.byteorder == ">" or (dt.byteorder == "=" and sys.byteorder == "big")):
        # The format is little-endian: the values are written, not the bytes (as
        # safetensors.numpy swaps them too), in a C-ordered copy of the same shape.
        t = t.astype(dt.newbyteorder("<"), order="C")
    if not t.flags.c_contiguous:
        if gpu:
            import cupy

            t = cupy.ascontiguousarray(t)
        else:
            import numpy

            t = numpy.ascontiguousarray(t)
    return _Out(name, dtype, list(t.shape), t, int(t.nbytes)), (device, *span)


def _shared(spans: Dict[str, Tuple[str, int, int]]) -> List[List[str]]:
    """Groups of tensors whose memory overlaps (safetensors.torch refuses to save them)."""
    groups: List[List[str]] = []
    by = sorted((s for s in spans.items() if s[1][1] < s[1][2]), key=lambda s: (s[1][0], s[1][1]))
    end, dev = -1, None
    for name, (d, lo, hi) in by:
        if d == dev and lo < end:
            groups[-1].append(name)
        else:
            groups.append([name])
        end = max(end, hi) if d == dev else hi
        dev = d
    return [g for g in groups if len(g) > 1]


def _header(outs: List[_Out], metadata: Optional[Dict[str, str]]) -> Tuple[bytes, List[int]]:
    """The header's bytes (with its length first, padded with spaces to 8 bytes) and each
    tensor's offset in the data section, the tensors in safetensors' order."""
    head: Dict[str, Any] = {}
    if metadata is not None:
        head["__metadata__"] = metadata
    offsets, at = [], 0
    for o in outs:
        head[o.name] = {"dtype": o.dtype, "shape": o.shape, "data_offsets": [at, at + o.nbytes]}
        offsets.append(at)
        at += o.nbytes
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER:
        raise ValueError(
            f"the header would be {len(text)} bytes: safetensors reads at most {MAX_HEADER}"
        )
    return len(text).to_bytes(8, "little") + text, offsets


def _write_file(path: str, outs: List[_Out], metadata: Optional[Dict[str, str]], fsync: bool) -> int:
    """Writes one file under a temporary name beside ``path`` and renames it: a crash or an
    error leaves the old file (or none), never a half one. Returns the bytes of data."""
    head, offsets = _header(outs, metadata)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with File(tmp, "w") as f:
            f.write(head)
            requests = [(f, len(head) + off, o.memory, 0, o.nbytes)
                        for o, off in zip(outs, offsets) if o.nbytes]
            if fsync:
                _write_streamed(f, tmp, requests)
            else:
                _written(tmp, requests, write_batch(requests).get())
        if fsync:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync(d)  # the rename
    return sum(o.nbytes for o in outs)


# With fsync, the data goes out in groups cut at multiples of this many bytes of the file (so
# aligned pieces stay aligned), two groups in flight,
# and each group's pages are handed to the device as soon as they are written (writeback
# started, not waited for): the fsync after the last group waits for the tail, not the whole
# file. (Without it nothing is written back before the fsync while the dirty pages fit under the
# kernel's background threshold, a tenth of memory: the file is written, then flushed. On
# overlayfs the hint reaches no page, and the fsync flushes the whole file.)
_WRITEBACK_GROUP = 64 << 20


def _groups(requests: list, size: int) -> Iterator[list]:
    """The write requests (in file order) cut into groups at the file offsets that are
    multiples of ``size``, a request that crosses one split there."""
    group: list = []
    for f, off, mem, moff, n in requests:
        while n:
            end = (off // size + 1) * size
            take = min(n, end - off)
            group.append((f, off, mem, moff, take))
            off, moff, n = off + take, moff + take, n - take
            if off == end:
                yield group
                group = []
    if group:
        yield group


def _written(tmp: str, requests: list, got: list) -> None:
    if got != [r[4] for r in requests]:
        raise OSError(f"{tmp}: short writes {got}")


def _write_streamed(f: File, tmp: str, requests: list) -> None:
    """Writes ``requests`` group by group (``_groups``), the next group started before the last
    one is waited for, and starts each finished group's writeback. After an error, the group
    still in flight is waited for before the error goes on (its bytes are in no file then)."""
    def finish(fut: Any, group: list) -> None:
        _written(tmp, group, fut.get())
        start, end = group[0][1], group[-1][1] + group[-1][4]
        try:
            f._f.start_writeback(start, end - start)
        except OSError:
            pass  # a hint to the kernel; the fsync that follows is what syncs, and reports
    pending: list = []
    try:
        for group in _groups(requests, _WRITEBACK_GROUP):
            pending.append((write_batch(group), group))
            if len(pending) == 2:
                finish(*pending.pop(0))
        while pending:
            finish(*pending.pop(0))
    finally:
        for fut, _ in pending:
            try:
                fut.get()
            except Exception:  # noqa: BLE001 (the first error is the one raised)
                pass


def _fsync(path: str) -> None:
    """Syncs the file or directory ``path`` to its device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(s: Union[int, str]) -> int:
    """A shard size: bytes, or a string as Hugging Face takes it (``"5GB"``: 5 * 10**9,
    ``"5GiB"``: 5 * 2**30, ``"500MB"``, ``"100KB"``)."""
    if isinstance(s, int) and not isinstance(s, bool):
        if s <= 0:
            raise ValueError(f"max_shard_size {s}: must be positive")
        return s
    if isinstance(s, str):
        u = s.strip().upper()
        for suffix, mult in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9),
                             ("MB", 10**6), ("KB", 10**3), ("B", 1)):
            if u.endswith(suffix):
                try:
                    n = float(u[: -len(suffix)])
                except ValueError:
                    break
                if n > 0:
                    return int(n * mult)
                break
    raise ValueError(f"max_shard_size {s!r}: expected bytes or a size such as '5GB' or '500MiB'")


def save(
    tensors: Dict[str, Any],
    path: "os.PathLike[str] | str",
    metadata: Optional[Dict[str, str]] = None,
    *,
    max_shard_size: Union[None, int, str] = None,
    fsync: bool = False,
) -> SaveReport:
    """Writes ``tensors`` (a dict of names to PyTorch tensors, on any GPU or the CPU, or NumPy
    or CuPy arrays) to the safetensors file ``path``, each tensor's bytes written straight from
    its memory by the engine (never through a Python ``bytes``), all of them in one batch
    (with ``fsync``, a batch per 64 MiB).

    The file is the one ``safetensors.torch.save_file`` (or ``safetensors.numpy.save_file``)
    writes: the same header (tensors ordered by dtype, then name; ``metadata``, a dict of
    strings, as ``__metadata__``) and data. A non-contiguous tensor is written as its
    contiguous values (``save_file`` refuses it), a big-endian NumPy array as its values in
    the format's little-endian order; tensors whose memory overlaps are refused
    with ``RuntimeError``, as ``save_file`` refuses them (save one and slice it at load), and
    a header the format's readers would refuse (over 100,000,000 bytes) with ``ValueError``,
    before anything is written. GPU tensors are written after all the work queued on their GPU
    when ``save`` is called.

    The file is written under a temporary name beside ``path`` and renamed over it at the end:
    an error or a crash leaves the old file, or none, never half of one. ``fsync=True`` syncs
    each file (and its directory) to the device before returning; its data is then written in
    64 MiB groups, each group's writeback started as soon as it is written, so that the device
    writes while the rest is written and the ``fsync`` waits only for the tail (not on
    overlayfs, whose files pass no such hint down: there the ``fsync`` flushes it all).

    ``max_shard_size`` (bytes, or ``"5GB"``, ``"500MiB"``) cuts the tensors, in the dict's
    order, into shards of at most that many bytes of data (a larger tensor gets a shard of its
    own), as Hugging Face does: ``path`` is then a directory (made if needed) or the index's
    path (``.../model.safetensors.index.json``); the shards are
    ``model-00001-of-0000N.safetensors`` beside the index, which maps each tensor to its shard
    (``weight_map``) and gives ``metadata.total_size``. A checkpoint that fits in one shard is
    written as ``model.safetensors`` alone, with no index, as Hugging Face writes it.
    ``load`` reads either form."""
    import time

    t0 = time.perf_counter()
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors: a dict of names to tensors, not a {type(tensors).__name__}")
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ValueError("metadata: a dict of str to str (safetensors stores nothing else)")
    outs, spans = [], {}
    for name, t in tensors.items():
        o, span = _prepare(name, t)
        outs.append(o)
        spans[name] = span
    shared = _shared(spans)
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, which would be written twice and could load as "
            f"different tensors: {shared}. Save one of each group (and slice it at load time), "
            f"or .clone() the others."
        )
    path = os.fspath(path)
    if max_shard_size is None:
        outs.sort(key=lambda o: (-_RANK[o.dtype], o.name))
        n = _write_file(path, outs, metadata, fsync)
        return SaveReport([path], len(outs), n, time.perf_counter() - t0, fsync)
    limit = _size(max_shard_size)
    if path.endswith(".json"):
        index_path = path
        base = os.path.basename(path)
        stem = base[: -len(".safetensors.index.json")] if base.endswith(".safetensors.index.json") \
            else base[: -len(".json")]
    else:
        os.makedirs(path, exist_ok=True)
        index_path = os.path.join(path, "model.safetensors.index.json")
        stem = "model"
    d = os.path.dirname(os.path.abspath(index_path))
    shards: List[List[_Out]] = []
    room = 0
    for o in outs:  # the dict's order, as Hugging Face cuts a state dict
        if not shards or (o.nbytes > room and shards[-1]):
            shards.append([])
            room = limit
        shards[-1].append(o)
        room -= o.nbytes
    if len(shards) == 1:
        single = os.path.join(d, f"{stem}.safetensors")
        outs.sort(key=lambda o: (-_RANK[o.dtype], o.name))
        n = _write_file(single, outs, metadata, fsync)
        return SaveReport([single], len(outs), n, time.perf_counter() - t0, fsync)
    files, weight_map, total = [], {}, 0
    for i, shard in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        shard.sort(key=lambda o: (-_RANK[o.dtype], o.name))
        total += _write_file(os.path.join(d, name), shard, metadata, fsync)
        files.append(os.path.join(d, name))
        for o in shard:
            weight_map[o.name] = name
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    tmp = f"{index_path}.{os.getpid()}.tmp"
    with _open_w(tmp) as f:
        f.write(json.dumps(index, indent=2) + "\n")
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, index_path)
    files.append(index_path)
    return SaveReport(files, len(outs), total, time.perf_counter() - t0, fsync)


def _open_w(path: str):
    import builtins

    return builtins.open(path, "w", encoding="utf-8")
