# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.File.write from host memory: every kind of source (read-only ones too), offsets and
sizes, files made, extended and overwritten in place, compared byte for byte with what was
written and with what was there before; and the errors a write can meet."""

import array
import errno
import os

import numpy as np
import pytest

import gdirect

from test_read import DLPackOnly

SIZE = 5 * 1024 * 1024 + 321


def random_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_a_new_file_gets_every_byte_and_reads_back(tmp_path):
    path = tmp_path / "out.bin"
    data = random_bytes(SIZE, 1)
    f = gdirect.File(path, "w")
    r = f.write(data)  # bytes: a read-only source
    assert (r.bytes, r.engine, r.memory) == (SIZE, "compat", "host")
    assert r.direct_bytes + r.buffered_bytes == SIZE
    assert path.read_bytes() == data
    back = bytearray(SIZE)
    assert f.read(back).bytes == SIZE and bytes(back) == data


def test_writes_in_place_touch_only_their_range(tmp_path):
    path = tmp_path / "in-place.bin"
    before = random_bytes(SIZE, 2)
    path.write_bytes(before)
    want = bytearray(before)
    f = gdirect.File(path, "r+")
    rng = np.random.default_rng(3)
    for src in (
        np.frombuffer(random_bytes(40000, 4), dtype=np.uint16).copy(),
        bytearray(random_bytes(4096 * 7, 5)),
        memoryview(random_bytes(100001, 6)),
        array.array("i", random_bytes(4 * 3000, 7)),
        DLPackOnly(np.frombuffer(random_bytes(1 << 20, 8), dtype=np.float32).copy()),
    ):
        raw = bytes(memoryview(src.array if isinstance(src, DLPackOnly) else src).cast("B"))
        src_offset = int(rng.integers(0, 100))
        size = len(raw) - src_offset - int(rng.integers(0, 100))
        at = int(rng.integers(0, SIZE - size))
        r = f.write(src, file_offset=at, src_offset=src_offset, size=size)
        assert r.bytes == size
        want[at : at + size] = raw[src_offset : src_offset + size]
        assert path.read_bytes() == bytes(want), type(src).__name__


def test_a_write_past_the_end_extends_the_file_with_a_hole(tmp_path):
    path = tmp_path / "extend.bin"
    path.write_bytes(b"x" * 100)
    data = random_bytes(70000, 9)
    gdirect.File(path, "r+").write(data, file_offset=1 << 20)
    got = path.read_bytes()
    assert len(got) == (1 << 20) + 70000
    assert got[:100] == b"x" * 100 and got[100 : 1 << 20] == bytes((1 << 20) - 100)
    assert got[1 << 20 :] == data


def test_mode_w_empties_an_existing_file(tmp_path):
    path = tmp_path / "trunc.bin"
    path.write_bytes(b"old" * 1000)
    gdirect.File(path, "w").write(b"new")
    assert path.read_bytes() == b"new"


def test_a_file_opened_for_reading_refuses_writes_with_ebadf(tmp_path):
    path = tmp_path / "ro.bin"
    path.write_bytes(b"keep")
    with pytest.raises(OSError) as e:
        gdirect.File(path).write(b"nope")
    assert e.value.errno == errno.EBADF and "not open for writing" in str(e.value)
    assert path.read_bytes() == b"keep"


def test_bad_modes_missing_files_and_a_full_device(tmp_path):
    with pytest.raises(ValueError, match="mode 'a'"):
        gdirect.File(tmp_path / "x", "a")
    with pytest.raises(FileNotFoundError):
        gdirect.File(tmp_path / "missing", "r+")
    assert not (tmp_path / "missing").exists()
    # A character device takes no positional writes: refused when opened.
    if os.path.exists("/dev/full"):
        with pytest.raises(OSError) as e:
            gdirect.File("/dev/full", "r+")
        assert e.value.errno == errno.ESPIPE and "a character device" in str(e.value)


def test_a_write_that_cannot_complete_says_where_it_stopped(tmp_path):
    """The file may not grow past 16 KiB (RLIMIT_FSIZE, SIGXFSZ ignored): a 64 KiB write
    fails with EFBIG, naming the file and the offset it reached."""
    import resource
    import signal

    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    path = tmp_path / "limited.bin"
    f = gdirect.File(path, "w")
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, old_limit[1]))
        with pytest.raises(OSError) as e:
            f.write(bytes(1 << 16))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert e.value.errno == errno.EFBIG and str(path) in str(e.value), e.value


@pytest.mark.parametrize(
    "src, exc, words",
    [
        (memoryview(bytearray(64))[::2], ValueError, "source buffer is not C-contiguous"),
        (12345, TypeError, "cannot write from a int"),
    ],
)
def test_bad_sources_are_refused_before_any_io(tmp_path, src, exc, words):
    path = tmp_path / "bad.bin"
    with pytest.raises(exc, match=words):
        gdirect.File(path, "w").write(src)
    assert path.read_bytes() == b""


def test_bad_offsets_and_sizes(tmp_path):
    f = gdirect.File(tmp_path / "o.bin", "w")
    with pytest.raises(ValueError, match="src_offset 11 is past the source's 10 bytes"):
        f.write(bytes(10), src_offset=11)
    with pytest.raises(ValueError, match="do not fit in the source's"):
        f.write(bytes(10), src_offset=5, size=6)
    with pytest.raises(ValueError, match="must not be negative"):
        f.write(bytes(10), file_offset=-1)
