# SPDX-License-Identifier: GPL-2.0 OR MIT
"""The rest of File's and the module's API: close() and the context manager (the descriptor
really closed, requests started before finishing), write_async, every engine setting through
configure() and settings(), and stats() counting what was read."""

import os

import numpy as np
import pytest

import gdirect


def fds_on(path):
    """How many of this process's descriptors are open on ``path``."""
    path = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            pass
    return n


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.bin"
    b = np.random.default_rng(4).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes()
    path.write_bytes(b)
    return str(path), b


def test_close_closes_the_descriptors_and_later_calls_raise(data):
    path, b = data
    assert fds_on(path) == 0
    f = gdirect.File(path, "r+")
    assert fds_on(path) >= 1 and not f.closed
    f.close()
    assert f.closed and fds_on(path) == 0
    f.close()  # twice: nothing
    for call in (lambda: f.read(bytearray(10)), lambda: f.write(b"x"),
                 lambda: f.pread(bytearray(10)), lambda: f.size,
                 lambda: gdirect.read_batch([(f, 0, bytearray(4), 0, None)])):
        with pytest.raises(ValueError, match="closed file"):
            call()
    assert f.path == path and "closed" in repr(f)


def test_a_request_started_before_close_finishes(data):
    path, b = data
    f = gdirect.File(path)
    dest = bytearray(4 << 20)
    fut = f.pread(dest)
    f.close()
    assert fut.get() == 4 << 20 and bytes(dest) == b
    del fut
    assert fds_on(path) == 0


def test_the_context_manager_closes(data):
    path, b = data
    with gdirect.File(path) as f:
        dest = bytearray(1000)
        assert f.read(dest, file_offset=5).bytes == 1000 and bytes(dest) == b[5:1005]
    assert f.closed and fds_on(path) == 0
    with pytest.raises(RuntimeError):
        with gdirect.File(path) as g:
            raise RuntimeError("inside")
    assert g.closed


def test_write_async(tmp_path):
    path = tmp_path / "w.bin"
    src = os.urandom(3 << 20)
    f = gdirect.File(path, "w")
    r = f.write_async(src, file_offset=4096).result(timeout=60)
    assert r.bytes == 3 << 20
    assert path.read_bytes() == b"\0" * 4096 + src


def test_configure_sets_every_setting_and_settings_reports_them(data):
    path, b = data
    try:
        gdirect.configure(threads=2, task_size=64 << 10, page_cache="buffered",
                          staging_size=256 << 10, keep_mapped=8 << 20, max_piece=128 << 10,
                          inline_size=8 << 10)
        assert gdirect.settings() == {
            "threads": 2, "task_size": 64 << 10, "page_cache": "buffered",
            "staging_size": 256 << 10, "keep_mapped": 8 << 20, "max_piece": 128 << 10,
            "inline_size": 8 << 10,
        }
        dest = bytearray(len(b))
        assert gdirect.File(path).read(dest).bytes == len(b) and bytes(dest) == b
        # A task size alone brings twice its staging, as before.
        gdirect.configure(task_size=128 << 10)
        assert gdirect.settings()["staging_size"] == 256 << 10
        # (A staging size below the task size means one buffer per worker: not an error.)
        for bad in ({"max_piece": 0}, {"task_size": 1000}, {"page_cache": "sometimes"},
                    {"threads": 0}, {"keep_mapped": -1}, {"inline_size": -1}):
            with pytest.raises(ValueError):
                gdirect.configure(**bad)
    finally:
        gdirect.configure()


def test_stats_count_the_reads(data):
    path, b = data
    before = gdirect.stats()
    assert set(before) == {"reads", "errors", "bytes", "direct_bytes", "buffered_bytes",
                           "mapped_bytes", "module_transfers", "module_bytes", "module"}
    # No module on the machine that runs these tests: host memory never asks it anyway.
    assert before["module"] in ("no_module", "no_access", "no_provider", "available")
    f = gdirect.File(path)
    f.read(bytearray(1 << 20))
    f.pread(bytearray(5000), file_offset=100).get()
    after = gdirect.stats()
    assert after["reads"] - before["reads"] == 2
    assert after["bytes"] - before["bytes"] == (1 << 20) + 5000
    moved = sum(after[k] - before[k] for k in ("direct_bytes", "buffered_bytes", "mapped_bytes"))
    assert moved == (1 << 20) + 5000


def test_a_report_is_the_dataclass_it_says(data):
    """read's and write's reports (made without the dataclass's __init__) are Reports in every
    way: every field set, frozen, equal to and hashed as the one the constructor makes."""
    import dataclasses

    path, b = data
    buf = bytearray(8192)
    with gdirect.File(path, "r+") as f:
        reports = [f.read(buf, 4096, size=4096), f.write(bytes(buf[:4096]), 4096)]
    assert buf[:4096] == b[4096:8192]
    for r in reports:
        assert type(r) is gdirect.Report and r.bytes == 4096 and r.memory == "host"
        fields = dataclasses.asdict(r)
        assert set(fields) == {f.name for f in dataclasses.fields(gdirect.Report)}
        made = gdirect.Report(**fields)
        assert r == made and hash(r) == hash(made) and repr(r) == repr(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.bytes = 0
