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

import asyncio
import concurrent.futures
import ctypes
import dataclasses
import os
import sys
import threading
from typing import Any, Iterable, Optional, Tuple

from . import _native

__version__ = _native.__version__
__all__ = [
    "File", "Future", "Report", "configure", "read_batch", "settings", "safetensors", "stats",
    "write_batch",
]

#: An asynchronous read or write (``File.pread``, ``File.pwrite``) or batch of them
#: (``read_batch``, ``write_batch``), started by the package's I/O threads, not a Python thread of
#: its own (a small ``pread``/``pwrite`` may have run before the call returned: see ``pread``). ``get(timeout=None)`` waits for it with the GIL released and returns the bytes moved
#: (a list, one per request, for a batch) or raises the error of the first part of it to fail
#: (a part: one request, or a batch's requests that the engine ran together);
#: ``done()`` says whether it has ended; ``add_done_callback(fn)`` calls ``fn(future)`` then;
#: ``await future`` gives what ``get()`` does without blocking the event loop. A future holds
#: its memory until its requests end: dropped before then, it waits for them. A process made by
#: ``fork()`` after the package made its threads (at its first I/O) has none of them (the
#: engine's, the I/O threads): every call there that moves data, and ``get()`` of a future
#: started before the fork and not done then (or ending in that very instant), raises
#: ``RuntimeError`` (which says so) rather
#: than wait for them (a ``concurrent.futures`` future of ``read_async`` started before the
#: fork is Python's own and is not to be used there). Start such processes with the ``spawn``
#: or ``forkserver`` method.
Future = _native.Future


def _after_fork_in_child() -> None:
    # The thread pool's threads are the parent's: read_async and write_async make a pool of this
    # process's own (whose calls then raise, as every call that moves data does in such a child:
    # the native half marks it in a handler of its own, for forks made from C too).
    File._pool = None
    File._pool_lock = threading.Lock()


async def _await_future(f: Future) -> Any:
    """``await f`` (``Future.__await__``): woken from the engine's thread that ends it."""
    if not f.done():
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(_f: Future) -> None:
            loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(None))

        f.add_done_callback(wake)
        await waiter
    return f.get()


@dataclasses.dataclass(frozen=True)
class Report:
    """What a read or a write did.

    GPU memory goes through the path the Rust library's ``GpuReader`` takes: the kernel module
    where it serves (each CUDA allocation registered once, at its first transfer, and kept
    until the driver frees it), the library's compat engine otherwise. ``engine`` is
    ``"module"`` or ``"compat"`` (through host memory). For the module, ``path`` is ``"p2p"``
    or ``"bounce"`` and ``reason`` the module's reason for a bounce (``"none"`` for p2p). For
    the compat engine, ``reason`` says why the module did not move the bytes: ``no_module``,
    ``no_access`` (``/dev/gdirect`` not openable by this process), ``incompatible`` (another
    ABI version), ``no_provider`` (no NVIDIA driver with nv-p2p), ``unavailable``,
    ``requested`` (``GDIRECT_COMPAT_MODE=on``), ``below_threshold``
    (``GDIRECT_DIRECT_THRESHOLD``), ``unaligned`` (the file has no ``O_DIRECT``, or offsets
    the drive's block size does not divide), ``refused`` (the module refused the memory),
    ``pool_memory`` (from a stream-ordered pool: ``cudaMallocAsync``), ``not_rdma_capable``
    (the CUDA driver says no peer may reach it), or for host memory ``host_memory`` (the
    compat engine reads and writes it with ``O_DIRECT`` itself), or ``empty`` for a read or write
    of 0 bytes of GPU memory (nothing moved). ``memory`` is ``"host"`` or
    ``"cuda:N"``; ``module_bytes`` the bytes the module moved.
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
    path: str = "bounce"
    module_bytes: int = 0


_new = object.__new__


def _report(fields: dict) -> Report:
    """The ``Report`` of the native call's dict, which holds every field: made without the
    frozen dataclass's ``__init__`` (a guarded ``object.__setattr__`` per field, a microsecond
    of each synchronous call), equal to ``Report(**fields)`` in every way."""
    r = _new(Report)
    r.__dict__.update(fields)
    return r


@dataclasses.dataclass
class _Target:
    kind: str  # "host" or "cuda"
    ptr: int
    nbytes: int
    keep: Any  # what keeps the memory alive (and its buffer export held) for the call
    # The stream whose queued work uses the memory, as its producer names it: a handle, 1 (the
    # legacy default stream), 2 (the per-thread one), 0 (none: nothing to wait for), or None
    # (not known: a read waits for the whole GPU's work instead).
    stream: Optional[int] = None


_torch_raw_stream: Any = None


def _torch_stream(t: Any) -> Optional[int]:
    """PyTorch's current stream on the CUDA tensor ``t``'s GPU: the stream its next operation
    on ``t`` would be queued on, so the one a read into it is ordered after."""
    global _torch_raw_stream
    try:
        if _torch_raw_stream is None:
            torch = sys.modules["torch"]
            _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda index: torch.cuda.current_stream(index).cuda_stream
            )
        # Stream 0 is the legacy default stream (PyTorch is not built for per-thread ones).
        return int(_torch_raw_stream(t.device.index)) or 1
    except Exception:  # noqa: BLE001 (an unknown stream: the whole GPU's work is waited for)
        return None


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


# Types found to be PyTorch tensors, and types found not to be (asked once per type: this runs
# once per request).
_TENSOR_TYPES: set = set()
_OTHER_TYPES: set = set()


def _target(obj: Any, writable: bool = True) -> _Target:
    """The address and size of ``obj``'s memory, checked contiguous, and writable when the call
    writes it (a read's destination; a write's source may be read-only)."""
    role = "destination" if writable else "source"
    # A PyTorch tensor, on the GPU or the CPU: its storage, by address. (Asked first: a tensor
    # that requires grad raises on __cuda_array_interface__, and a CPU one has no buffer.)
    kind = type(obj)
    if kind in _TENSOR_TYPES or kind not in _OTHER_TYPES and all(
        hasattr(obj, a) for a in ("data_ptr", "element_size", "is_contiguous", "numel", "is_cuda")
    ):
        _TENSOR_TYPES.add(kind)
        if writable and getattr(obj, "requires_grad", False):
            raise ValueError("the destination tensor requires grad: pass tensor.detach()")
        device = getattr(getattr(obj, "device", None), "type", "cuda" if obj.is_cuda else "cpu")
        if device not in ("cuda", "cpu"):
            raise TypeError(
                f"the {role} tensor is on a {device} device: gdirect moves CUDA and CPU memory"
            )
        if not obj.is_contiguous():
            raise ValueError(f"the {role} tensor is not contiguous")
        nbytes = obj.numel() * obj.element_size()
        if obj.is_cuda:
            return _Target("cuda", int(obj.data_ptr()), nbytes, obj, _torch_stream(obj))
        return _Target("host", int(obj.data_ptr()), nbytes, obj)
    _OTHER_TYPES.add(kind)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        if writable and readonly:
            raise ValueError("the destination CUDA array is read-only")
        typestr = cai["typestr"]
        nbytes = _contiguous_nbytes(cai["shape"], cai.get("strides"), int(typestr[2:]))
        # Version 3's stream: the one to order after (None: nothing to wait for).
        stream = (cai["stream"] or 0) if "stream" in cai else None
        return _Target("cuda", int(ptr), nbytes, obj, stream)
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
    # Its first byte, which holds the buffer's export as a whole array of its size would.
    first = ctypes.c_char.from_buffer(view)
    return _Target("host", ctypes.addressof(first), view.nbytes, (view, first))


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
        self._path = os.fspath(path)
        self._f: Any = _native.File(self._path, mode)

    @property
    def path(self) -> str:
        return str(self._path)

    @property
    def closed(self) -> bool:
        return isinstance(self._f, _ClosedFile)

    def close(self) -> None:
        """Closes the file: later calls raise ``ValueError``. Requests started before (futures
        not done yet) finish first: each holds the open file until it ends. Closing twice does
        nothing."""
        if not self.closed:
            self._f = _ClosedFile(self._path)

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

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

        A read into GPU memory is ordered after the work queued on ``dest``'s stream when it is
        called: PyTorch's current stream for a tensor, the stream an object's
        ``__cuda_array_interface__`` names (CuPy's current one); for memory of no known stream
        (DLPack, an interface without one), after all the work queued on that GPU. So the read
        never overwrites bytes that work queued before it still uses, as a PyTorch operation on
        that stream would not. Work on other streams is the caller's to order, as in PyTorch.
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
        return self._call_target(_target(mem, writable=read), read, file_offset, mem_offset,
                                 size)

    def _call_target(self, t: "_Target", read: bool, file_offset: int, mem_offset: int,
                     size: Optional[int]) -> Report:
        """``_call`` with the memory already looked at (``_target``)."""
        name, role = ("dest_offset", "destination") if read else ("src_offset", "source")
        file_offset = _index("file_offset", file_offset)
        mem_offset = _index(name, mem_offset)
        size = _span(t, mem_offset, size, name, role)
        f = self._f
        if read:
            if t.kind == "cuda":
                r = f.read_cuda(t.ptr + mem_offset, size, file_offset, t.stream)
            else:
                r = f.read_host(t.ptr + mem_offset, size, file_offset)
        else:
            call = f.write_cuda if t.kind == "cuda" else f.write_host
            r = call(t.ptr + mem_offset, size, file_offset)
        del t
        return _report(r)

    def pread(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        buf_offset: int = 0,
    ) -> Future:
        """Starts reading ``size`` bytes (default: to the end of ``buf``) at ``file_offset`` into
        ``buf`` at byte ``buf_offset``: a ``Future`` whose ``get()`` is the bytes read (fewer
        than ``size`` only at the end of the file). The arguments are KvikIO's
        ``CuFile.pread``'s, in its order; ``buf`` is anything ``read`` takes. A read is started
        by the package's I/O threads (no Python thread per request; a ``get()`` without a
        timeout called first runs it itself), so many can be in flight from one thread; the
        future holds ``buf`` until the read ends. But a small read (``inline_size`` bytes or
        fewer, ``configure``; default 64 KiB) is run before this returns, the GIL released, and
        its future is done, when the calling thread holds no other ``pread``/``pwrite`` future
        whose result it has not taken (``get()``) or dropped, runs no event loop, and the read
        need not first wait for the GPU's work (its memory's stream is known, or it is host
        memory). Bad arguments raise here; what the read meets, ``get()`` raises."""
        return self._start(buf, True, size, file_offset, buf_offset)

    def pwrite(
        self,
        buf: Any,
        size: Optional[int] = None,
        file_offset: int = 0,
        buf_offset: int = 0,
    ) -> Future:
        """Starts writing ``size`` bytes (default: to the end of ``buf``) of ``buf`` from byte
        ``buf_offset`` to the file at ``file_offset``, and returns a ``Future`` of the bytes
        written, as ``pread`` does (a small write out of host memory may run before this
        returns, as a small read does). A write from GPU memory is ordered after the work queued
        on that GPU when it is called, as ``write``'s is; ``buf`` must not change until the
        future is done."""
        return self._start(buf, False, size, file_offset, buf_offset)

    def _start(self, mem: Any, read: bool, size: Optional[int], file_offset: int,
               mem_offset: int) -> Future:
        t = _target(mem, writable=read)
        # (Plain ints checked inline: this runs once per request, with the GIL held.)
        if type(file_offset) is not int or file_offset < 0:
            file_offset = _index("file_offset", file_offset)
        if (type(mem_offset) is not int or type(size) is not int or mem_offset < 0 or size < 0
                or mem_offset + size > t.nbytes):
            mem_offset = _index("buf_offset", mem_offset)
            size = _span(t, mem_offset, size, "buf_offset", "destination" if read else "source")
        # A small request may run before this returns, except on a thread running an event
        # loop, which it would hold up.
        here = asyncio._get_running_loop() is None
        if read:
            return self._f.pread(t.kind == "cuda", t.ptr + mem_offset, size, file_offset, t.keep,
                                 t.stream, here)
        return self._f.pwrite(t.kind == "cuda", t.ptr + mem_offset, size, file_offset, t.keep,
                              here)

    def read_async(
        self,
        dest: Any,
        file_offset: int = 0,
        dest_offset: int = 0,
        size: Optional[int] = None,
    ) -> "concurrent.futures.Future[Report]":
        """``read`` on a worker thread (one of 4 the package keeps): a future of its report (the
        read releases the GIL). ``dest`` must stay alive and untouched until the future is
        done. For many requests at once, ``pread`` and ``read_batch`` cost less.

        The read is ordered after the work queued on ``dest``'s stream as ``read`` is, the
        stream as the calling thread sees it (PyTorch's and CuPy's current stream is the
        thread's own), not the worker's."""
        try:
            t = _target(dest, writable=True)
        except Exception as e:  # noqa: BLE001 (raised by the future, as the call's own errors)
            failed: "concurrent.futures.Future[Report]" = concurrent.futures.Future()
            failed.set_exception(e)
            return failed
        return File._submit(self._call_target, t, True, file_offset, dest_offset, size)

    @staticmethod
    def _submit(call: Any, *args: Any) -> "concurrent.futures.Future[Report]":
        with File._pool_lock:
            if File._pool is None:
                File._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="gdirect"
                )
            pool = File._pool
        return pool.submit(call, *args)

    def write_async(
        self,
        src: Any,
        file_offset: int = 0,
        src_offset: int = 0,
        size: Optional[int] = None,
    ) -> "concurrent.futures.Future[Report]":
        """``write`` on a worker thread: a future of its report, as ``read_async`` is. ``src``
        must stay alive and unchanged until the future is done."""
        return File._submit(self.write, src, file_offset, src_offset, size)

    def __repr__(self) -> str:
        return f"gdirect.File({self.path!r}{', closed' if self.closed else ''})"


class _ClosedFile:
    """What a closed ``File`` calls: every use raises ``ValueError``, as Python's files do."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name: str) -> Any:
        raise ValueError(f"I/O operation on closed file {self._path!r}")


Request = Tuple[File, int, Any, int, Optional[int]]


def _batch(requests: Iterable[Request], read: bool) -> Future:
    role = "destination" if read else "source"
    native, keep = [], []
    # Each memory object looked at once per batch (slots of one buffer are the common case);
    # holding its target keeps it alive, so its id is not reused within the call.
    seen: dict = {}
    for n, req in enumerate(requests):
        try:
            file, file_offset, mem, mem_offset, size = req
        except (TypeError, ValueError):
            raise TypeError(
                f"request {n}: expected (file, file_offset, memory, memory_offset, size)"
            ) from None
        if not isinstance(file, File):
            raise TypeError(f"request {n}: {type(file).__name__} is not a gdirect.File")
        f = file._f
        if type(f) is not _native.File:
            raise ValueError(f"request {n}: I/O operation on closed file {file.path!r}")
        t = seen.get(id(mem))
        if t is None:
            t = seen[id(mem)] = _target(mem, writable=read)
            keep.append(t.keep)
        # (Plain ints checked inline: this runs once per request, with the GIL held.)
        if type(file_offset) is not int or file_offset < 0:
            file_offset = _index("file_offset", file_offset)
        if (type(mem_offset) is not int or type(size) is not int or mem_offset < 0 or size < 0
                or mem_offset + size > t.nbytes):
            mem_offset = _index("memory_offset", mem_offset)
            size = _span(t, mem_offset, size, "memory_offset", role)
        native.append((f, file_offset, t.kind == "cuda", t.ptr + mem_offset, size, t.stream))
    return _native.submit(read, native, keep)


def read_batch(requests: Iterable[Request]) -> Future:
    """Starts many reads at once, each ``(file, file_offset, memory, memory_offset, size)``
    (``size`` ``None``: to the end of ``memory``), into host memory or any GPU's, and returns one
    ``Future``: ``get()`` is the list of each request's bytes read. The reads into one place (the
    host, or one GPU) are one job for the engine's threads, which take their pieces in turn:
    thousands of small blocks (a KV cache's) cost one call. Destinations may not overlap
    (``ValueError``)."""
    return _batch(requests, True)


def write_batch(requests: Iterable[Request]) -> Future:
    """Starts many writes at once, each ``(file, file_offset, memory, memory_offset, size)``,
    as ``read_batch`` reads: ``get()`` is each request's bytes written. Every file must be open
    for writing; writes whose file ranges overlap land in no set order."""
    return _batch(requests, False)


def configure(
    threads: Optional[int] = None,
    task_size: Optional[int] = None,
    page_cache: Optional[str] = None,
    staging_size: Optional[int] = None,
    keep_mapped: Optional[int] = None,
    max_piece: Optional[int] = None,
    inline_size: Optional[int] = None,
) -> None:
    """Sets the engine's settings for the reads and writes that follow, over the environment's
    (``GDIRECT_THREADS``, ``GDIRECT_TASK_SIZE``, ``GDIRECT_PAGE_CACHE``,
    ``GDIRECT_STAGING_SIZE``, ``GDIRECT_KEEP_MAPPED``): worker threads, bytes per I/O (a
    multiple of 4 KiB), the page-cache policy (``auto``, ``direct``, ``buffered``, ``mapped``;
    the engine's writes go ``O_DIRECT`` where aligned with the first two, through the page cache
    with the others; what the kernel module moves is direct whatever the policy; ``mapped``
    into host memory copies out of a mapping of the file, so a file another process truncates
    meanwhile raises ``SIGBUS``, as NumPy's ``memmap`` would),
    pinned staging bytes per worker (default: twice the task size given here, else the
    environment's), bytes of page-cache registrations kept between reads (``mapped``: a file's
    are retired by this process's writes to it and by a change of its size or times; for a KV
    cache read again and again, ``page_cache="mapped", keep_mapped=2 << 30``), and the
    largest piece a worker claims at once, and the largest request that ``File.pread`` and
    ``pwrite`` run in the calling thread before they return (``GDIRECT_INLINE_SIZE``, default
    64 KiB; 0: every request is handed to the package's I/O threads; see ``pread``). ``None`` keeps the environment's value or the
    default; a value that cannot be used raises ``ValueError``. Whether the kernel module is
    used is the environment's, read once per process as the Rust library reads it:
    ``GDIRECT_COMPAT_MODE`` (``auto``, ``on``: never the module, ``off``: the module or an
    error) and ``GDIRECT_DIRECT_THRESHOLD`` (smaller transfers skip the module in ``auto``).
    (The library's ``latencies`` do not apply: reports carry no per-I/O latencies.)"""
    sizes = {"threads": threads, "task_size": task_size, "staging_size": staging_size,
             "keep_mapped": keep_mapped, "max_piece": max_piece, "inline_size": inline_size}
    n = {k: None if v is None else _index(k, v) for k, v in sizes.items()}
    _native.configure(n["threads"], n["task_size"], page_cache, n["staging_size"],
                      n["keep_mapped"], n["max_piece"], n["inline_size"])


def settings() -> dict:
    """The settings the next read uses: every one ``configure`` takes."""
    return dict(_native.settings())


def stats() -> dict:
    """What this process's engines have read so far, all engines together: ``reads`` (calls),
    ``errors`` (calls that failed), ``bytes``, and of them ``direct_bytes`` (``O_DIRECT``),
    ``buffered_bytes`` (through the page cache) and ``mapped_bytes`` (copied by the GPU from the
    registered page cache); ``module_transfers`` and ``module_bytes``, what the kernel module
    moved for GPU memory; ``module``, ``"available"`` or why the module serves this process
    nothing (a ``Report`` reason: ``no_module``...)."""
    return dict(_native.stats())


os.register_at_fork(after_in_child=_after_fork_in_child)

from . import safetensors  # noqa: E402  (needs File above)
