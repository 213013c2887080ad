# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.File reads into host memory: every kind of destination, offsets, short reads at the
end of the file, settings, and the errors bad input gets. Every byte is compared with the file's
(the destination is poisoned first, so a byte that was not written cannot pass)."""

import array
import errno
import os

import numpy as np
import pytest

import gdirect

SIZE = 3 * 1024 * 1024 + 1234  # not a multiple of any block size
POISON = 0xA5


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("read") / "data.bin"
    data = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return str(path), data


def poisoned(n):
    return bytearray([POISON]) * n


def test_a_bytearray_gets_the_whole_file(data_file):
    path, data = data_file
    dest = poisoned(SIZE)
    r = gdirect.File(path).read(dest)
    assert (r.bytes, r.eof, r.engine, r.memory) == (SIZE, False, "compat", "host")
    # Host memory is the compat engine's (O_DIRECT into it needs no module): the reason says
    # so where a module is loaded, else why there is none.
    assert r.reason in ("host_memory", "no_module", "no_access", "no_provider"), r.reason
    assert (r.path, r.module_bytes) == ("bounce", 0)
    assert r.direct_bytes + r.buffered_bytes + r.mapped_bytes == SIZE
    assert bytes(dest) == data


@pytest.mark.parametrize("mode", ["auto", "direct", "buffered", "mapped"])
def test_every_page_cache_mode_is_exact(data_file, mode):
    path, data = data_file
    gdirect.configure(threads=3, task_size=256 * 1024, page_cache=mode)
    try:
        s = gdirect.settings()
        assert (s["threads"], s["task_size"], s["page_cache"]) == (3, 256 * 1024, mode)
        dest = poisoned(SIZE - 4096)
        r = gdirect.File(path).read(dest, file_offset=4096)
        assert r.bytes == SIZE - 4096 and bytes(dest) == data[4096:]
    finally:
        gdirect.configure()


def test_numpy_arrays_memoryviews_and_array_module_buffers(data_file):
    path, data = data_file
    f = gdirect.File(path)
    a = np.full(1000, np.nan, dtype=np.float32)
    f.read(a, file_offset=12345)
    assert a.tobytes() == data[12345 : 12345 + 4000]
    big = poisoned(8192)
    mv = memoryview(big)[100:4196]
    f.read(mv, file_offset=7)
    assert bytes(big[100:4196]) == data[7:4103]
    assert big[:100] == poisoned(100) and big[4196:] == poisoned(8192 - 4196)
    arr = array.array("i", [0x5A5A5A5A]) * 300
    f.read(arr, file_offset=99)
    assert arr.tobytes() == data[99 : 99 + 1200]


def test_dest_offset_and_size_write_only_their_range(data_file):
    path, data = data_file
    dest = poisoned(10000)
    r = gdirect.File(path).read(dest, file_offset=500, dest_offset=1000, size=3000)
    assert r.bytes == 3000
    assert bytes(dest[1000:4000]) == data[500:3500]
    assert dest[:1000] == poisoned(1000) and dest[4000:] == poisoned(6000)


def test_a_read_past_the_end_is_short_and_says_so(data_file):
    path, data = data_file
    dest = poisoned(8192)
    r = gdirect.File(path).read(dest, file_offset=SIZE - 1000)
    assert (r.bytes, r.eof) == (1000, True)
    assert bytes(dest[:1000]) == data[-1000:] and dest[1000:] == poisoned(8192 - 1000)
    r = gdirect.File(path).read(bytearray(10), file_offset=SIZE + 5)
    assert (r.bytes, r.eof) == (0, True)


def test_reads_in_flight_at_once_are_each_exact(data_file):
    path, data = data_file
    f = gdirect.File(path)
    dests = [poisoned(65536) for _ in range(16)]
    futures = [f.read_async(d, file_offset=i * 100000) for i, d in enumerate(dests)]
    for i, (fut, d) in enumerate(zip(futures, dests)):
        assert fut.result().bytes == 65536
        assert bytes(d) == data[i * 100000 : i * 100000 + 65536]


def test_read_async_looks_at_its_destination_on_the_calling_thread(data_file, monkeypatch):
    # The destination's stream (PyTorch's and CuPy's current stream is per thread) is the one
    # the calling thread sees: the destination is looked at before the worker takes the read.
    import threading

    path, data = data_file
    seen = []
    target = gdirect._target

    def spy(mem, writable):
        seen.append(threading.get_ident())
        return target(mem, writable=writable)

    monkeypatch.setattr(gdirect, "_target", spy)
    dest = poisoned(65536)
    assert gdirect.File(path).read_async(dest, file_offset=4096).result(timeout=60).bytes == 65536
    assert bytes(dest) == data[4096 : 4096 + 65536]
    assert seen == [threading.get_ident()]
    # Its errors still come from the future, as the read's own do.
    fut = gdirect.File(path).read_async(b"read-only")
    with pytest.raises(ValueError, match="read-only"):
        fut.result(timeout=60)


def test_the_file_is_kept_open_and_sees_it_grow(tmp_path):
    path = tmp_path / "grow.bin"
    path.write_bytes(b"a" * 5000)
    f = gdirect.File(path)
    with open(path, "ab") as w:
        w.write(b"b" * 3000)
    assert f.size == 8000
    dest = poisoned(8000)
    assert f.read(dest).bytes == 8000 and bytes(dest) == b"a" * 5000 + b"b" * 3000


def test_a_missing_file_is_file_not_found_with_its_errno():
    with pytest.raises(FileNotFoundError) as e:
        gdirect.File("/nonexistent/gdirect-test")
    assert e.value.errno == errno.ENOENT and "/nonexistent/gdirect-test" in str(e.value)


def test_a_directory_is_an_os_error(tmp_path):
    with pytest.raises(OSError) as e:
        gdirect.File(tmp_path).read(bytearray(10))
    assert e.value.errno == errno.EISDIR


@pytest.mark.parametrize(
    "dest, exc, words",
    [
        (b"read-only bytes", ValueError, "read-only"),
        (memoryview(bytearray(64))[::2], ValueError, "contiguous"),
        (np.zeros((8, 8), dtype=np.uint8)[:, :4], ValueError, "contiguous"),
        (12345, TypeError, "cannot read into a int"),
        ("a string", TypeError, "cannot read into a str"),
    ],
)
def test_bad_destinations_are_refused_before_any_io(data_file, dest, exc, words):
    path, _ = data_file
    with pytest.raises(exc, match=words):
        gdirect.File(path).read(dest)


def test_bad_offsets_and_sizes_are_value_and_type_errors(data_file):
    path, _ = data_file
    f = gdirect.File(path)
    with pytest.raises(ValueError, match="do not fit"):
        f.read(bytearray(100), size=101)
    with pytest.raises(ValueError, match="do not fit"):
        f.read(bytearray(100), dest_offset=50, size=51)
    with pytest.raises(ValueError, match="past the destination"):
        f.read(bytearray(100), dest_offset=101)
    with pytest.raises(ValueError, match="must not be negative"):
        f.read(bytearray(100), file_offset=-1)
    with pytest.raises(TypeError, match="must be an integer"):
        f.read(bytearray(100), file_offset=1.5)


def test_bad_settings_are_value_errors():
    with pytest.raises(ValueError, match="page_cache"):
        gdirect.configure(page_cache="sometimes")
    with pytest.raises(ValueError):
        gdirect.configure(task_size=1000)  # not a multiple of 4 KiB
    gdirect.configure()
    assert gdirect.settings()["page_cache"] in ("auto", "direct", "buffered", "mapped")


def test_an_empty_destination_reads_nothing(data_file):
    path, _ = data_file
    r = gdirect.File(path).read(bytearray())
    assert r.bytes == 0


def test_many_ranges_of_several_files_in_one_call(data_file, tmp_path):
    path, data = data_file
    other = tmp_path / "other.bin"
    other.write_bytes(bytes(range(256)) * 40)
    a, b = poisoned(5000), poisoned(20000)
    ta, tb = gdirect._target(a), gdirect._target(b)
    report, each = gdirect._native.read_many(
        [
            (gdirect.File(path)._f, ta.ptr, 5000, 777),
            (gdirect.File(other)._f, tb.ptr, 20000, 100),
        ],
        False,
    )
    assert each == [(5000, False), (10140, True)]
    assert report["bytes"] == 15140 and report["eof"]
    assert bytes(a) == data[777:5777]
    assert bytes(b[:10140]) == (bytes(range(256)) * 40)[100:] and b[10140:] == poisoned(20000 - 10140)
    with pytest.raises(ValueError, match="overlap"):
        gdirect._native.read_many(
            [(gdirect.File(path)._f, ta.ptr, 100, 0), (gdirect.File(path)._f, ta.ptr + 50, 100, 0)],
            False,
        )


class DLPackOnly:
    """What JAX and TensorFlow arrays offer: DLPack and nothing else (no buffer protocol)."""

    def __init__(self, array, device=None):
        self.array = array
        self.device = device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device or self.array.__dlpack_device__()


def test_a_dlpack_destination_of_any_dtype_and_shape(data_file):
    path, data = data_file
    f = gdirect.File(path)
    a = np.full((64, 32), -1, dtype=np.int32)
    r = f.read(DLPackOnly(a), file_offset=333)
    assert r.bytes == a.nbytes == 8192 and r.memory == "host"
    assert a.tobytes() == data[333 : 333 + 8192]
    # A view that starts inside its base: DLPack's data pointer and byte offset, both honoured.
    base = np.full(4096, POISON, dtype=np.uint8)
    f.read(DLPackOnly(base[1000:2000]), file_offset=5)
    assert base[1000:2000].tobytes() == data[5:1005]
    assert (base[:1000] == POISON).all() and (base[2000:] == POISON).all()
    # Nothing to read: an empty array.
    assert f.read(DLPackOnly(np.zeros((0, 3), np.float64))).bytes == 0


def test_dlpack_destinations_that_cannot_be_written_are_refused(data_file):
    path, _ = data_file
    f = gdirect.File(path)
    strided = np.zeros((8, 8), dtype=np.uint16)[:, :4]
    with pytest.raises(ValueError, match="contiguous"):
        f.read(DLPackOnly(strided))
    ro = np.zeros(64, dtype=np.uint8)
    ro.setflags(write=False)
    # The producer refuses to export it (DLPack itself cannot say "read-only").
    with pytest.raises(BufferError):
        f.read(DLPackOnly(ro))
    with pytest.raises(ValueError, match="device type is 4"):
        f.read(DLPackOnly(np.zeros(64, np.uint8), device=(4, 0)))


def test_a_fifo_and_a_character_device_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO"), ("/dev/null", "a character device")):
        for mode in ("r", "r+"):
            with pytest.raises(OSError) as e:
                gdirect.File(path, mode)
            assert e.value.errno == errno.ESPIPE and what in str(e.value), (path, mode)


class _TensorOn:
    """What gdirect sees of a PyTorch tensor on another kind of device (an XPU's, an HPU's)."""

    def __init__(self, device_type):
        self.device = type("device", (), {"type": device_type})()
        self.is_cuda = False

    def data_ptr(self):
        return 0x1000

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True

    def numel(self):
        return 4096


@pytest.mark.parametrize("device", ["xpu", "hpu", "mps"])
def test_a_tensor_on_another_accelerator_is_refused(data_file, device, tmp_path):
    path, _ = data_file
    with pytest.raises(TypeError, match=f"on a {device} device"):
        gdirect.File(path).read(_TensorOn(device))
    with pytest.raises(TypeError, match=f"on a {device} device"):
        gdirect.File(tmp_path / "w.bin", "w").write(_TensorOn(device))


class _EmptyCudaArray:
    __cuda_array_interface__ = {"data": (0, False), "shape": (0,), "typestr": "|u1", "version": 3}


def test_an_empty_cuda_array_reads_and_writes_nothing(data_file, tmp_path):
    path, _ = data_file
    r = gdirect.File(path).read(_EmptyCudaArray())
    assert (r.bytes, r.memory) == (0, "cuda")
    out = tmp_path / "empty.bin"
    r = gdirect.File(out, "w").write(_EmptyCudaArray())
    assert r.bytes == 0 and out.read_bytes() == b""
