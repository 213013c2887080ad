# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect: read files into GPU (and host) memory at the speed of the hardware.

>>> import gdirect, torch
>>> t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
>>> gdirect.File("data.bin").read(t)          # doctest: +SKIP
Report(bytes=1048576, eof=False, engine='compat', ...)

Destinations are anything that exposes ``__cuda_array_interface__`` (PyTorch CUDA tensors, CuPy
and Numba arrays), PyTorch CPU tensors, a writable host buffer (``bytearray``, ``memoryview``,
a NumPy array: anything with the buffer protocol), or, failing those, DLPack (``__dlpack__``:
JAX and TensorFlow arrays, on a CUDA GPU or the CPU). They must be contiguous.

Nothing here imports torch, CuPy or NumPy: they are recognised by what they expose.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import os
import threading
from typing import Any, Optional

from . import _native

__version__ = _native.__version__
__all__ = ["File", "Report", "configure", "settings", "safetensors"]


@dataclasses.dataclass(frozen=True)
class Report:
    """What a read or a write did.

    ``engine`` is ``"compat"`` (the library's engine, through host memory) or ``"module"``
    (the kernel module); ``reason`` says why the module did not move the bytes: ``no_module``,
    ``no_access`` (``/dev/gdirect`` not openable by this process), ``incompatible`` (another
    ABI version), ``no_provider`` (no NVIDIA driver with nv-p2p), ``unavailable``, or
    ``module_not_used_from_python`` (this version of the package reads through the compat
    engine only). ``memory`` is ``"host"`` or ``"cuda:N"``.
    """

    bytes: int
    eof: bool
    engine: str
    reason: str
    memory: str
    direct_bytes: int
    buffered_bytes: int
    mapped_bytes: int
    threads: int
    seconds: float


@dataclasses.dataclass
class _Target:
    kind: str  # "host" or "cuda"
    ptr: int
    nbytes: int
    keep: Any  # what keeps the memory alive (and its buffer export held) for the call


def _contiguous_nbytes(shape, strides, itemsize: int) -> int:
    n = itemsize
    for s in shape:
        n *= int(s)
    if strides is not None:
        expect = itemsize
        for dim, stride in zip(reversed(shape), reversed(strides)):
            if int(dim) > 1 and int(stride) != expect:
                raise ValueError("the destination is not C-contiguous")
            expect *= int(dim)
    return n


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class _Export:
    """A buffer export held for a call (``PyObject_GetBuffer`` with ``PyBUF_SIMPLE``: contiguous,
    read-only allowed), released when dropped: how a write gets the address of ``bytes``."""

    def __init__(self, obj: Any):
        self.view = _PyBuffer()
        _get_buffer(obj, ctypes.byref(self.view), 0)
        self.held = True

    def __del__(self) -> None:
        if self.held:
            self.held = False
            _release_buffer(ctypes.byref(self.view))


def _target(obj: Any, writable: bool = True) -> _Target:
    """The address and size of ``obj``'s memory, checked contiguous, and writable when the call
    writes it (a read's destination; a write's source may be read-only)."""
    role = "destination" if writable else "source"
    # A PyTorch tensor, on the GPU or the CPU: its storage, by address. (Asked first: a tensor
    # that requires grad raises on __cuda_array_interface__, and a CPU one has no buffer.)
    if all(hasattr(obj, a) for a in ("data_ptr", "element_size", "is_contiguous", "numel", "is_cuda")):
        if writable and getattr(obj, "requires_grad", False):
            raise ValueError("the destination tensor requires grad: pass tensor.detach()")
        device = getattr(getattr(obj, "device", None), "type", "cuda" if obj.is_cuda else "cpu")
        if device not in ("cuda", "cpu"):
            raise TypeError(
                f"the {role} tensor is on a {device} device: gdirect moves CUDA and CPU memory"
            )
        if not obj.is_contiguous():
            raise ValueError(f"the {role} tensor is not contiguous")
        kind = "cuda" if obj.is_cuda else "host"
        return _Target(kind, int(obj.data_ptr()), obj.numel() * obj.element_size(), obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError("the destination CUDA array is read-only")
        typestr = cai["typestr"]
        nbytes = _contiguous_nbytes(cai["shape"], cai.get("strides"), int(typestr[2:]))
        return _Target("cuda", int(ptr), nbytes, obj)
    try:
        view = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            return _dlpack_target(obj)
        raise TypeError(
            f"cannot {'read into' if writable else 'write from'} a {type(obj).__name__}: "
            "expected an object with __cuda_array_interface__ or DLPack, a tensor, or a "
            f"{'writable ' if writable else ''}buffer"
        ) from None
    if writable and view.readonly:
        raise ValueError(f"the destination {type(obj).__name__} is read-only")
    if not view.c_contiguous:
        raise ValueError(f"the {role} buffer is not C-contiguous")
    view = view.cast("B") if view.nbytes else view
    if view.nbytes == 0:
        return _Target("host", 0, 0, view)
    if view.readonly:
        export = _Export(view)
        return _Target("host", int(export.view.buf), view.nbytes, (view, export))
    arr = (ctypes.c_char * view.nbytes).from_buffer(view)
    return _Target("host", ctypes.addressof(arr), view.nbytes, (view, arr))


# DLPack's C structures (dlpack.h, the unversioned DLManagedTensor of the "dltensor" capsule).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid.restype = ctypes.c_int
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer.restype = ctypes.c_void_p


def _dlpack_target(dest: Any) -> _Target:
    """A DLPack producer's memory (JAX, TensorFlow, anything with ``__dlpack__``). The capsule is
    kept for the call and left unconsumed: its destructor gives the tensor back to its producer.
    DLPack has no read-only flag; producers refuse to export what must not be written."""
    dev_type, _dev_id = dest.__dlpack_device__()
    if dev_type not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST):
        raise ValueError(
            f"the destination's DLPack device type is {dev_type}: expected CPU (1), CUDA (2) "
            "or CUDA host memory (3)"
        )
    capsule = dest.__dlpack__()
    if not _capsule_valid(capsule, b"dltensor"):
        raise TypeError("the destination's __dlpack__ did not return a DLPack tensor capsule")
    t = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor")).dl_tensor
    bits = t.dtype.bits * t.dtype.lanes
    if bits % 8:
        raise ValueError(f"the destination's elements are {bits} bits: not whole bytes")
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = None if not t.strides else [t.strides[i] * (bits // 8) for i in range(t.ndim)]
    nbytes = _contiguous_nbytes(shape, strides, bits // 8)
    ptr = (t.data or 0) + t.byte_offset
    if nbytes and not ptr:
        raise ValueError("the destination's DLPack tensor has no data pointer")
    kind = "cuda" if dev_type == _DL_CUDA else "host"
    return _Target(kind, ptr if nbytes else 0, nbytes, (dest, capsule))


def _index(name: str, value: Any) -> int:
    try:
        v = value.__index__()
    except AttributeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{name} must not be negative (got {v})")
    return v


def _span(t: _Target, offset: int, size: Optional[int], name: str, role: str) -> int:
    """The bytes of a call on ``t`` from byte ``offset`` (the argument ``name``): ``size``, or
    the rest of ``t``."""
    if offset > t.nbytes:
        raise ValueError(f"{name} {offset} is past the {role}'s {t.nbytes} bytes")
    size = t.nbytes - offset if size is None else _index("size", size)
    if offset + size > t.nbytes:
        raise ValueError(
            f"{size} bytes at offset {offset} do not fit in the {role}'s {t.nbytes} bytes"
        )
    return size


class File:
    """A file kept open: read from it (and write to it) many times.

    ``mode`` is ``"r"`` (reading), ``"r+"`` (reading and writing an existing file) or ``"w"``
    (reading and writing a file made empty, or new). ``File(path)`` raises
    ``FileNotFoundError``, ``PermissionError`` or another ``OSError`` with the errno when it
    cannot be opened.
    """

    _pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
    _pool_lock = threading.Lock()

    def __init__(self, path: "os.PathLike[str] | str", mode: str = "r"):
        self._f = _native.File(os.fspath(path), mode)

    @property
    def path(self) -> str:
        return str(self._f.path)

    @property
    def size(self) -> int:
        """The file's size now (a block device's capacity)."""
        return self._f.size

    def read(
        self,
        dest: Any,
        file_offset: int = 0,
        dest_offset: int = 0,
        size: Optional[int] = None,
    ) -> Report:
        """Reads ``size`` bytes (default: to the end of ``dest``) at ``file_offset`` into
        ``dest`` at byte ``dest_offset``. A read past the end of the file is short: the report's
        ``bytes`` and ``eof`` say so, and the rest of ``dest`` is left as it was.
        """
        return self._call(dest, True, file_offset, dest_offset, size)

    def write(
        self,
        src: Any,
        file_offset: int = 0,
        src_offset: int = 0,
        size: Optional[int] = None,
    ) -> Report:
        """Writes ``size`` bytes (default: to the end of ``src``) of ``src`` from byte
        ``src_offset`` to the file at ``file_offset``, extending it as needed. ``src`` is
        anything ``read`` takes, and read-only buffers (``bytes``) too. The file must be open
        with mode ``"r+"`` or ``"w"`` (else ``OSError`` EBADF). A write that cannot complete
        raises ``OSError`` with its errno (``ENOSPC``...) and the file offset it reached; nothing
        is synced (``os.fsync`` for that).

        A write from GPU memory is ordered after all the work queued on that GPU when it is
        called, on every stream (PyTorch's current and side streams, another library's, a
        replayed CUDA graph): it waits as ``torch.cuda.synchronize(device)`` does, then copies,
        so the file holds what that work left in ``src``. (cuFile leaves this to the caller.)
        Work queued after the call starts must not write ``src`` until it returns."""
        return self._call(src, False, file_offset, src_offset, size)

    def _call(self, mem: Any, read: bool, file_offset: int, mem_offset: int,
              size: Optional[int]) -> Report:
        """A read into ``mem`` or a write from it, its arguments checked first."""
        t = _target(mem, writable=read)
        name, role = ("dest_offset", "destination") if read else ("src_offset", "source")
        file_offset = _index("file_offset", file_offset)
        mem_offset = _index(name, mem_offset)
        size = _span(t, mem_offset, size, name, role)
        call = {
            (True, "cuda"): self._f.read_cuda, (True, "host"): self._f.read_host,
            (False, "cuda"): self._f.write_cuda, (False, "host"): self._f.write_host,
        }[(read, t.kind)]
        r = call(t.ptr + mem_offset, size, file_offset)
        del t
        return Report(**r)

    def read_async(
        self,
        dest: Any,
        file_offset: int = 0,
        dest_offset: int = 0,
        size: Optional[int] = None,
    ) -> "concurrent.futures.Future[Report]":
        """``read`` on a worker thread: a future of its report (the read releases the GIL).
        ``dest`` must stay alive and untouched until the future is done."""
        with File._pool_lock:
            if File._pool is None:
                File._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="gdirect"
                )
            pool = File._pool
        return pool.submit(self.read, dest, file_offset, dest_offset, size)

    def __repr__(self) -> str:
        return f"gdirect.File({self.path!r})"


def configure(
    threads: Optional[int] = None,
    task_size: Optional[int] = None,
    page_cache: Optional[str] = None,
) -> None:
    """Sets the engine's settings for the reads that follow, over the environment's
    (``GDIRECT_THREADS``, ``GDIRECT_TASK_SIZE``, ``GDIRECT_PAGE_CACHE``): worker threads, bytes
    per I/O (a multiple of 4 KiB), and the page-cache policy (``auto``, ``direct``,
    ``buffered``, ``mapped``). ``None`` keeps the environment's value or the default; a value
    that cannot be used raises ``ValueError``."""
    _native.configure(threads, task_size, page_cache)


def settings() -> dict:
    """The settings the next read uses."""
    return dict(_native.settings())


from . import safetensors  # noqa: E402  (needs File above)
