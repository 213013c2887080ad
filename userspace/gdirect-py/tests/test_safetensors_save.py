# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.safetensors.save against the safetensors package (0.8): the same bytes as
safetensors.numpy.save_file for every dtype NumPy has, read back identically by
safetensors.safe_open and by gdirect's own loader; non-contiguous arrays written as their
values; overlapping arrays and bad names or metadata refused; a failed save leaving neither a
half file nor its temporary; shards and their index as Hugging Face writes them."""

import json
import os
import resource
import signal

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from gdirect import safetensors as gst

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32",
                "float32", "int64", "uint64", "float64", "complex64"]


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, dt in enumerate(NUMPY_DTYPES):
        shape = (3, 5 + i) if i % 3 else (7 + i,)
        raw = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(dt).itemsize, dtype=np.uint8)
        a = raw.view(dt).reshape(shape)
        if dt == "bool":
            a = raw.astype(bool).reshape(shape)
        out[f"t.{dt}"] = a
    out["empty"] = np.zeros((0, 4), dtype=np.float32)
    out["scalar"] = np.array(3.5, dtype=np.float64)
    return out


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("meta", [None, {"format": "np"}])
def test_the_file_is_the_one_safetensors_writes(tmp_path, meta):
    t = arrays(1)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    r = gst.save(t, ours, metadata=meta)
    safetensors.numpy.save_file(t, str(theirs), metadata=meta)
    assert ours.read_bytes() == theirs.read_bytes()
    assert r.files == [str(ours)] and r.tensors == len(t) and not r.fsync
    assert r.bytes == sum(a.nbytes for a in t.values())
    with safetensors.safe_open(str(ours), framework="np") as f:
        assert set(f.keys()) == set(t) and f.metadata() == meta
        for k in t:
            assert same(f.get_tensor(k), t[k]), k
    back = gst.load(str(ours), device="cpu", framework="numpy")
    for k in t:
        assert same(back[k], t[k]), k


def test_non_contiguous_arrays_are_written_as_their_values(tmp_path):
    base = np.arange(4 * 6, dtype=np.int32).reshape(4, 6)
    t = {"transposed": base.T, "strided": np.arange(100, dtype=np.float64)[::3],
         "reversed": np.arange(10, dtype=np.int16)[::-1]}
    p = tmp_path / "nc.safetensors"
    gst.save(t, p)
    got = safetensors.numpy.load_file(str(p))
    for k, v in t.items():
        assert same(got[k], np.ascontiguousarray(v)), k


def test_big_endian_arrays_are_written_as_their_values(tmp_path):
    # The format is little-endian: a big-endian array's values are written, swapped, as
    # safetensors.numpy writes them; its bytes as they are would read back as other numbers.
    t = {"f4": np.arange(6, dtype=">f4"), "i8": np.arange(6, dtype=">i8") - 3,
         "u2": np.arange(6, dtype=">u2"), "c8": np.arange(6, dtype=">c8") * 1j,
         "scalar": np.array(1.5, dtype=">f8"), "strided": np.arange(24, dtype=">i4").reshape(4, 6).T,
         "little": np.arange(6, dtype="<f4")}
    p, ref = tmp_path / "be.safetensors", tmp_path / "be-ref.safetensors"
    gst.save(t, p)
    # (safetensors.numpy itself writes a strided big-endian array's bytes in the wrong order:
    # its reference file is made from C-ordered copies.)
    safetensors.numpy.save_file({k: v.copy(order="C") for k, v in t.items()}, str(ref))
    assert p.read_bytes() == ref.read_bytes()
    got = safetensors.numpy.load_file(str(p))
    for k, v in t.items():
        assert got[k].shape == v.shape and np.array_equal(got[k], v), k
        assert got[k].dtype == v.dtype.newbyteorder("<"), k


def test_a_header_past_the_formats_limit_is_not_written(tmp_path):
    p = tmp_path / "big.safetensors"
    with pytest.raises(ValueError, match="safetensors reads at most 100000000"):
        gst.save({"a": np.zeros(2, dtype=np.uint8)}, p, metadata={"k": "x" * 100_000_000})
    assert os.listdir(tmp_path) == []


def test_overlapping_arrays_are_refused(tmp_path):
    base = np.arange(100, dtype=np.float32)
    p = tmp_path / "shared.safetensors"
    with pytest.raises(RuntimeError, match="share memory"):
        gst.save({"a": base[:60], "b": base[50:]}, p)
    assert not p.exists()
    # Views of one buffer that do not overlap are separate tensors.
    gst.save({"a": base[:50], "b": base[50:]}, p)
    got = safetensors.numpy.load_file(str(p))
    assert same(got["a"], base[:50]) and same(got["b"], base[50:])


def test_bad_names_metadata_and_objects_are_refused(tmp_path):
    p = tmp_path / "bad.safetensors"
    a = np.zeros(4, dtype=np.float32)
    for tensors, meta, err in (
        ({1: a}, None, ValueError),
        ({"__metadata__": a}, None, ValueError),
        ({"a": a}, {"k": 1}, ValueError),
        ({"a": a}, ["k"], ValueError),
        ({"a": [1, 2]}, None, TypeError),
        ({"a": np.zeros(2, dtype=object)}, None, ValueError),
        ([("a", a)], None, TypeError),
    ):
        with pytest.raises(err):
            gst.save(tensors, p, metadata=meta)
    assert os.listdir(tmp_path) == []


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "keep.safetensors"
    old = {"old": np.arange(10, dtype=np.int64)}
    gst.save(old, p)
    before = p.read_bytes()
    big = {"big": np.zeros(1 << 20, dtype=np.uint8)}
    # The file size limit stops the data's write half way (EFBIG; SIGXFSZ ignored).
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError):
            gst.save(big, p)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, sig)
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["keep.safetensors"]


def test_fsync_is_done_and_reported(tmp_path):
    p = tmp_path / "synced.safetensors"
    r = gst.save({"a": np.ones(1000, dtype=np.float32)}, p, fsync=True)
    assert r.fsync and safetensors.numpy.load_file(str(p))["a"].sum() == 1000


def test_fsync_streams_groups_and_starts_their_writeback(tmp_path, monkeypatch):
    """With fsync the data goes out in groups cut at the file offsets that are multiples of
    _WRITEBACK_GROUP, tensors split there, the groups back to back; the file is still
    safetensors' own."""
    t = arrays(4)
    t["big"] = np.random.default_rng(5).integers(0, 256, 20000, dtype=np.uint8)
    groups = []
    real = gst.write_batch

    def recording(requests):
        groups.append([(r[1], r[4]) for r in requests])
        return real(requests)

    monkeypatch.setattr(gst, "write_batch", recording)
    monkeypatch.setattr(gst, "_WRITEBACK_GROUP", 4099)  # odd: every cut inside some tensor
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    r = gst.save(t, ours, fsync=True)
    safetensors.numpy.save_file(t, str(theirs))
    assert r.fsync and ours.read_bytes() == theirs.read_bytes()
    data = sum(a.nbytes for a in t.values())
    head = ours.stat().st_size - data
    spans = [(g[0][0], g[-1][0] + g[-1][1]) for g in groups]
    assert spans[0][0] == head and spans[-1][1] == head + data
    assert all(b % 4099 == 0 for _, b in spans[:-1]), spans
    assert all(0 < b - a <= 4099 for a, b in spans)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert len(groups) == (head + data - 1) // 4099 - head // 4099 + 1
    # Inside each group, the requests are back to back too.
    for g in groups:
        assert all(g[i][0] + g[i][1] == g[i + 1][0] for i in range(len(g) - 1))
    # Without fsync: one batch of every tensor.
    groups.clear()
    gst.save(t, tmp_path / "plain.safetensors")
    assert len(groups) == 1 and len(groups[0]) == sum(1 for a in t.values() if a.nbytes)


def test_a_failed_group_waits_for_the_one_in_flight_and_leaves_no_file(tmp_path, monkeypatch):
    """A group that fails: the error is raised after the next group (already started) has
    ended, and the save leaves neither the file nor its temporary."""
    t = {"a": np.arange(30000, dtype=np.uint8), "b": np.arange(30000, dtype=np.int32)}
    started, waited = [], []
    real = gst.write_batch

    class Failing:
        def __init__(self, fut, n):
            self.fut, self.n = fut, n

        def get(self):
            got = self.fut.get()
            waited.append(self.n)
            if self.n == 1:
                raise OSError(5, "planted")
            return got

    def batch(requests):
        started.append(len(started))
        return Failing(real(requests), started[-1])

    monkeypatch.setattr(gst, "write_batch", batch)
    monkeypatch.setattr(gst, "_WRITEBACK_GROUP", 8192)
    with pytest.raises(OSError, match="planted"):
        gst.save(t, tmp_path / "x.safetensors", fsync=True)
    assert started == [0, 1, 2] and waited == [0, 1, 2]
    assert os.listdir(tmp_path) == []


def _cachestat_raw(path):
    import ctypes

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in
                    ("cache", "dirty", "writeback", "evicted", "recently_evicted")]

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = Stat()
        if libc.syscall(451, fd, ctypes.byref(Range(0, 0)), ctypes.byref(st), 0) != 0:
            return None
        return {"cache": st.cache, "dirty": st.dirty, "writeback": st.writeback}
    finally:
        os.close(fd)


def _cachestat(path):
    """The kernel's count of ``path``'s pages in the page cache, dirty and under writeback
    (cachestat(2), Linux 6.5), or None where it cannot be seen: no cachestat, or a file system
    whose files show no dirty pages of their own (tmpfs, ramfs; overlayfs, whose pages are the
    file's underneath). A probe beside ``path`` tells: one page written must show one dirty."""
    probe = os.path.join(os.path.dirname(os.path.abspath(path)), ".cachestat-probe")
    with open(probe, "wb") as f:
        f.write(b"p" * 4096)
    try:
        seen = _cachestat_raw(probe)
    finally:
        os.unlink(probe)
    if seen is None or seen["dirty"] != 1:
        return None
    return _cachestat_raw(path)


def test_streamed_save_leaves_only_the_last_group_dirty_for_its_fsync(tmp_path, monkeypatch):
    """Evidence from the kernel (cachestat), not from gdirect: when save(fsync=True) comes to
    its fsync, every group but the last has been handed to the device (dirty no more), where a
    save that wrote everything first would find the whole file dirty."""
    group = 1 << 20
    monkeypatch.setattr(gst, "_WRITEBACK_GROUP", group)
    seen = []
    real = gst._fsync

    def recording(path):
        if os.path.isfile(path):
            seen.append(_cachestat(path))
        real(path)

    monkeypatch.setattr(gst, "_fsync", recording)
    # Host memory at an address no direct write takes: every byte through the page cache.
    raw = np.random.default_rng(7).integers(0, 256, (12 << 20) + 1, dtype=np.uint8)
    t = {"w": raw[1:]}
    p = tmp_path / "streamed.safetensors"
    gst.save(t, p, fsync=True)
    assert safetensors.numpy.load_file(str(p))["w"].tobytes() == raw[1:].tobytes()
    if seen[0] is None:
        pytest.skip("no cachestat(2) (Linux 6.5), or a file system whose files show no dirty "
                    "pages of their own (tmpfs, overlayfs): no page states to look at")
    pages = os.stat(p).st_size // 4096
    # At most the last group and the header's page are left dirty (12 groups written).
    assert seen[0]["dirty"] <= group // 4096 + 2, (seen[0], pages)
    assert seen[0]["cache"] >= pages // 2, seen[0]


def test_start_writeback_needs_a_file_open_for_writing(tmp_path):
    import errno

    from gdirect import File

    p = tmp_path / "f"
    with File(p, "w") as f:
        f.write(b"x" * 10000)
        before = _cachestat(p)  # (its probe is another file: these pages stay dirty)
        assert f._f.start_writeback(0, 10000) is None
        after = _cachestat(p)
        assert f._f.start_writeback(0, 0) is None  # to the end of the file, as sync_file_range
    if before is not None:  # the kernel's own count: dirty pages handed to the device
        assert before["dirty"] == 3 and after["dirty"] == 0, (before, after)
    with File(p) as f:
        with pytest.raises(OSError) as e:
            f._f.start_writeback(0, 10000)
        assert e.value.errno == errno.EBADF


def test_shards_and_their_index_as_hugging_face_writes_them(tmp_path):
    rng = np.random.default_rng(3)
    t = {f"layer.{i}.w": rng.standard_normal(1000 + 100 * i).astype(np.float32) for i in range(8)}
    t["big"] = rng.standard_normal(5000).astype(np.float64)  # 40000 bytes: a shard of its own
    d = tmp_path / "ckpt"
    r = gst.save(t, d, metadata={"format": "np"}, max_shard_size="10KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in t.values()) == r.bytes
    shards = sorted(set(index["weight_map"].values()))
    n = len(shards)
    assert n > 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(index["weight_map"]) == set(t)
    assert r.files == [str(d / s) for s in shards] + [str(d / "model.safetensors.index.json")]
    for s in shards:
        with safetensors.safe_open(str(d / s), framework="np") as f:
            data = sum(f.get_tensor(k).nbytes for k in f.keys())
            assert data <= 10_000 or len(list(f.keys())) == 1
            assert f.metadata() == {"format": "np"}
            for k in f.keys():
                assert index["weight_map"][k] == s and same(f.get_tensor(k), t[k])
    back = gst.load(str(d / "model.safetensors.index.json"), device="cpu", framework="numpy")
    assert set(back) == set(t) and all(same(back[k], t[k]) for k in t)
    # One shard's worth: a single model.safetensors, no index.
    one = tmp_path / "one"
    r = gst.save({"a": t["layer.0.w"]}, one, max_shard_size="5GB")
    assert r.files == [str(one / "model.safetensors")] and os.listdir(one) == ["model.safetensors"]
    with pytest.raises(ValueError, match="max_shard_size"):
        gst.save(t, tmp_path / "x", max_shard_size="lots")
