# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect.safetensors against the safetensors package's own reader, on files that package
wrote: every dtype NumPy has, scalars, empty tensors, metadata, sharded checkpoints, lazy access;
and corrupt, truncated and hostile files refused with a clear error, never a partial result."""

import json
import struct

import numpy as np
import pytest
import safetensors.numpy as stnp

from gdirect import safetensors as gst

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8",
          "uint16", "uint32", "uint64", "bool"]


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, dt in enumerate(DTYPES):
        shape = [(3, 5, 7), (1,), (129,), (2, 1, 3)][i % 4]
        if dt == "bool":
            out[f"t_{dt}"] = rng.integers(0, 2, shape).astype(bool)
        elif dt.startswith("float"):
            out[f"t_{dt}"] = rng.standard_normal(shape).astype(dt)
        else:
            info = np.iinfo(dt)
            out[f"t_{dt}"] = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    out["scalar"] = np.array(3.5, dtype=np.float32)
    out["empty"] = np.zeros((0, 4), dtype=np.int16)
    # An odd-sized tensor first puts the next ones at offsets their dtype cannot view.
    out["aa_odd"] = np.arange(3, dtype=np.uint8)
    return out


def same(got, want):
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), k
        assert np.array_equal(g, w), k


def test_one_file_equals_safetensors_own_reader(tmp_path):
    path = tmp_path / "model.safetensors"
    stnp.save_file(tensors(), str(path), metadata={"format": "np", "note": "gdirect test"})
    got = gst.load(path, device="cpu", framework="numpy")
    same(got, stnp.load_file(str(path)))
    assert gst.metadata(path) == {"format": "np", "note": "gdirect test"}


def test_a_sharded_checkpoint_by_its_index_and_by_a_list(tmp_path):
    all_t = tensors(1)
    names = sorted(all_t)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        stnp.save_file({k: all_t[k] for k in part}, str(tmp_path / fname))
        weight_map.update({k: fname for k in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    same(gst.load(index, device="cpu", framework="numpy"), all_t)
    files = [tmp_path / f"model-{i + 1:05d}-of-00002.safetensors" for i in range(2)]
    same(gst.load(files, device="cpu", framework="numpy"), all_t)


def test_a_tensor_in_two_shards_is_an_error(tmp_path):
    stnp.save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "a.safetensors"))
    stnp.save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(gst.SafetensorsError, match="'w' is in both"):
        gst.load([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], device="cpu",
                 framework="numpy")


def test_lazy_access_reads_one_tensor_at_a_time(tmp_path):
    path = tmp_path / "lazy.safetensors"
    want = tensors(2)
    stnp.save_file(want, str(path), metadata={"k": "v"})
    with gst.open(path, device="cpu", framework="numpy") as f:
        assert sorted(f.keys()) == sorted(want)
        assert f.metadata() == {"k": "v"}
        for k in ("t_float64", "aa_odd", "empty", "scalar", "t_bool"):
            g = f.get_tensor(k)
            assert g.dtype == want[k].dtype and np.array_equal(g, want[k]), k
        with pytest.raises(KeyError):
            f.get_tensor("missing")


def test_bfloat16_without_a_numpy_type_is_a_clear_error(tmp_path):
    path = tmp_path / "bf16.safetensors"
    raw = np.arange(8, dtype=np.uint16)
    write_raw(path, {"w": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}}, raw.tobytes())
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(gst.SafetensorsError, match="numpy has no BF16"):
            gst.load(path, device="cpu", framework="numpy")
    else:
        assert gst.load(path, device="cpu", framework="numpy")["w"].view(np.uint16).tolist() == raw.tolist()


def write_raw(path, header, data, header_len=None):
    h = json.dumps(header).encode()
    n = len(h) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + h + data)


GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


@pytest.mark.parametrize(
    "header, data, header_len, words",
    [
        (GOOD, b"\0" * 15, None, "truncated: the tensors end at byte 16 of a 15-byte"),
        (GOOD, b"\0" * 16, 10**6, "truncated: a header of 1000000 bytes"),
        (GOOD, b"\0" * 16, 2**40, "a header of 1099511627776 bytes"),
        ({"w": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16, None, "unknown dtype 'F33'"),
        ({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, b"\0" * 16, None, "is 20 bytes, its offsets span 16"),
        ({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 16]}}, b"\0" * 16, None, "overflows 64 bits"),
        ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16, None, "not a list of sizes"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, b"\0" * 16, None, "are not \\[begin, end\\]"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 2**70]}}, b"\0" * 16, None, "are not \\[begin, end\\]"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16, None, "overlap"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "__metadata__": {"a": 1}}, b"\0" * 16, None, "__metadata__"),
        ({"w": [1, 2]}, b"", None, "not an object"),
    ],
)
def test_hostile_headers_are_refused_before_any_data_is_read(tmp_path, header, data, header_len, words):
    path = tmp_path / "bad.safetensors"
    write_raw(path, header, data, header_len)
    with pytest.raises(gst.SafetensorsError, match=words):
        gst.load(path, device="cpu", framework="numpy")


def safetensors_accepts(path):
    """Whether the safetensors package (the format's reference reader) opens ``path``."""
    import safetensors

    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            list(f.keys())
        return True
    except Exception:  # noqa: BLE001  (its errors are of several types)
        return False


def f32(start, end):
    return {"dtype": "F32", "shape": [(end - start) // 4], "data_offsets": [start, end]}


# Files on the edge of the format: (name, header, data). Each is judged by safetensors and by
# gdirect, which must agree.
EDGES = [
    ("contiguous", {"a": f32(0, 8), "b": f32(8, 16)}, b"\0" * 16),
    ("listed out of order", {"b": f32(8, 16), "a": f32(0, 8)}, b"\0" * 16),
    ("a gap between tensors", {"a": f32(0, 8), "b": f32(12, 20)}, b"\0" * 20),
    ("data not starting at 0", {"a": f32(4, 12)}, b"\0" * 12),
    ("bytes after the last tensor", {"a": f32(0, 8)}, b"\0" * 9),
    ("empty tensors at the ends", {"e": {"dtype": "I8", "shape": [0], "data_offsets": [0, 0]},
                                   "a": f32(0, 8),
                                   "z": {"dtype": "U8", "shape": [0, 3], "data_offsets": [8, 8]}},
     b"\0" * 8),
    ("no tensor, no data", {}, b""),
    ("no tensor, trailing data", {}, b"\0"),
    ("__metadata__ null", {"__metadata__": None, "a": f32(0, 4)}, b"\0" * 4),
    ("__metadata__ {}", {"__metadata__": {}, "a": f32(0, 4)}, b"\0" * 4),
    ("__metadata__ []", {"__metadata__": [], "a": f32(0, 4)}, b"\0" * 4),
    ("__metadata__ ''", {"__metadata__": "", "a": f32(0, 4)}, b"\0" * 4),
    ("__metadata__ 0", {"__metadata__": 0, "a": f32(0, 4)}, b"\0" * 4),
    ("__metadata__ of a number", {"__metadata__": {"k": 1}, "a": f32(0, 4)}, b"\0" * 4),
    ("dtype []", {"a": {"dtype": [], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("dtype null", {"a": {"dtype": None, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("shape of floats", {"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"\0" * 4),
    ("three offsets", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}}, b"\0" * 4),
    ("an extra field", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4),
    ("no shape", {"a": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4),
] + [
    (f"dtype {dt}", {"a": {"dtype": dt, "shape": [2, 4], "data_offsets": [0, n]}}, b"\0" * n)
    for dt, n in [("F8_E8M0", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("C64", 64),
                  ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8), ("BF16", 16), ("BOOL", 8)]
] + [
    ("F4 of an odd count (half a byte)", {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2),
    ("F6 of 4 elements (3 bytes)", {"a": {"dtype": "F6_E3M2", "shape": [4], "data_offsets": [0, 3]}}, b"\0" * 3),
    ("F6 of 3 elements (18 bits)", {"a": {"dtype": "F6_E2M3", "shape": [3], "data_offsets": [0, 3]}}, b"\0" * 3),
]


@pytest.mark.parametrize("name, header, data", EDGES, ids=[e[0] for e in EDGES])
def test_the_reader_agrees_with_safetensors_on_the_edges_of_the_format(tmp_path, name, header, data):
    path = tmp_path / "edge.safetensors"
    write_raw(path, header, data)
    want = safetensors_accepts(path)
    try:
        gst.read_header(path)
        got = True
    except gst.SafetensorsError:
        got = False
    assert got == want, f"{name}: safetensors {'accepts' if want else 'refuses'} it, gdirect does not agree"


def test_a_header_json_refuses_is_refused(tmp_path):
    path = tmp_path / "nan.safetensors"
    h = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"x": NaN}}'
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 4)
    assert not safetensors_accepts(path)
    with pytest.raises(gst.SafetensorsError, match="not JSON"):
        gst.read_header(path)


@pytest.mark.parametrize("n, ok", [(100_000_000, True), (100_000_001, False)])
def test_the_header_limit_is_the_formats_100_000_000_bytes(tmp_path, n, ok):
    """A header padded with spaces to exactly the limit is read; one byte more is refused, by
    both readers."""
    path = tmp_path / "big.safetensors"
    h = json.dumps({"a": f32(0, 4)}).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", n) + h)
        f.write(b" " * (n - len(h)))
        f.write(b"\0" * 4)
    assert safetensors_accepts(path) == ok
    if ok:
        assert [t.name for t in gst.read_header(path).tensors] == ["a"]
    else:
        with pytest.raises(gst.SafetensorsError, match="a header of 100000001 bytes"):
            gst.read_header(path)


def test_a_file_replaced_after_its_header_is_read_gives_its_own_bytes(tmp_path):
    """The lazy reader keeps the file it parsed: a saver's atomic rename of a new checkpoint
    over the path, between the header and the data, does not get the old header applied to
    the new file's bytes."""
    path = tmp_path / "model.safetensors"
    old = {"w": np.arange(4, dtype=np.float32)}
    stnp.save_file(old, str(path))
    with gst.open(path, device="cpu", framework="numpy") as f:
        new = tmp_path / "new.safetensors"
        stnp.save_file({"w": np.arange(100, 104, dtype=np.float32), "x": np.ones(9, np.int8)},
                       str(new))
        new.replace(path)
        assert f.get_tensor("w").tolist() == old["w"].tolist()


def test_a_header_that_is_not_json_or_a_file_too_short(tmp_path):
    p = tmp_path / "notjson.safetensors"
    p.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(gst.SafetensorsError, match="not JSON"):
        gst.load(p, device="cpu", framework="numpy")
    p.write_bytes(b"\x01\x02")
    with pytest.raises(gst.SafetensorsError, match="too short"):
        gst.load(p, device="cpu", framework="numpy")


def test_a_file_cut_short_by_the_safetensors_writer_is_truncated(tmp_path):
    path = tmp_path / "cut.safetensors"
    stnp.save_file(tensors(3), str(path))
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(gst.SafetensorsError, match="truncated"):
        gst.load(path, device="cpu", framework="numpy")


def test_bad_devices_and_frameworks_are_value_errors(tmp_path):
    path = tmp_path / "ok.safetensors"
    stnp.save_file({"w": np.ones(2, np.float32)}, str(path))
    with pytest.raises(ValueError, match="device 'gpu'"):
        gst.load(path, device="gpu", framework="numpy")
    with pytest.raises(ValueError, match="framework 'tf'"):
        gst.load(path, device="cpu", framework="tf")
    with pytest.raises(ValueError, match="use device='cpu'"):
        gst.load(path, device="cuda:0", framework="numpy")


def layered(tmp_path):
    """A two-shard checkpoint named like a transformer's: the layers, then the head."""
    rng = np.random.default_rng(7)
    t = {f"model.layers.{i}.w": rng.standard_normal((16, 8)).astype(np.float32) for i in range(12)}
    t["model.embed"] = rng.standard_normal((4, 8)).astype(np.float16)
    t["lm_head.weight"] = rng.standard_normal((8, 8)).astype(np.float32)
    t["lm_head.empty"] = np.zeros((0,), np.int8)
    names = sorted(t)
    files = []
    for i, part in enumerate((names[:7], names[7:])):
        p = tmp_path / f"m-{i}.safetensors"
        stnp.save_file({k: t[k] for k in part}, str(p))
        files.append(p)
    return files, t


def test_a_device_map_onto_the_cpu_equals_the_whole_load(tmp_path):
    files, want = layered(tmp_path)
    for device_map in ({"": "cpu"}, {"model": "cpu", "lm_head": "cpu"}):
        same(gst.load(files, framework="numpy", device_map=device_map), want)


def test_device_map_keys_match_whole_names_at_dots_and_the_longest_wins(tmp_path):
    files, _ = layered(tmp_path)
    headers = [gst.read_header(p) for p in files]
    place = gst._placement(headers, {"model.layers.1": "cuda:1", "model": 0, "": "cpu",
                                           "lm_head.weight": "cuda:2"})
    assert place["model.layers.1.w"] == ("cuda", 1)
    assert place["model.layers.10.w"] == ("cuda", 0)  # "model.layers.1" is not its prefix
    assert place["model.embed"] == ("cuda", 0)
    assert place["lm_head.weight"] == ("cuda", 2)
    assert place["lm_head.empty"] == ("cpu", -1)
    # Tensors next to each other on one device are read together; a change of device cuts.
    runs = gst._runs(headers, place)
    assert all(len({place[t.name] for t in r.tensors}) == 1 for r in runs)
    assert sum(len(r.tensors) for r in runs) == len(place) - 1  # the empty one is not read


def test_device_map_auto_cuts_the_checkpoint_into_runs_of_equal_bytes(tmp_path):
    files, _ = layered(tmp_path)
    headers = [gst.read_header(p) for p in files]
    place = gst._auto_split(headers, 3)
    order = [place[t.name][1] for h in headers for t in h.tensors]
    assert order == sorted(order) and set(order) == {0, 1, 2}  # contiguous runs, every GPU
    size = {t.name: t.end - t.start for h in headers for t in h.tensors}
    per_gpu = [sum(size[n] for n, d in place.items() if d[1] == g) for g in range(3)]
    assert max(per_gpu) - min(per_gpu) <= 2 * max(size.values())


def test_bad_device_maps_are_value_errors(tmp_path, monkeypatch):
    files, _ = layered(tmp_path)
    with pytest.raises(ValueError, match="'lm_head.weight' .* matches no key"):
        gst.load(files, framework="numpy", device_map={"model": "cpu"})
    with pytest.raises(ValueError, match=r"device_map\['model'\]: device 'gpu'"):
        gst.load(files, framework="numpy", device_map={"model": "gpu", "": "cpu"})
    with pytest.raises(ValueError, match="expected 'auto' or a dict"):
        gst.load(files, framework="numpy", device_map="balanced")
    monkeypatch.setattr(gst, "_gpu_count", lambda: 0)
    with pytest.raises(ValueError, match="found no GPU"):
        gst.load(files, framework="numpy", device_map="auto")


def python_header(path, monkeypatch):
    """The header as the Python parser reads it, the native one turned off."""
    with monkeypatch.context() as m:
        m.setattr(gst._native, "safetensors_header", lambda *a: None)
        return gst.read_header(path)


def native_takes(path):
    """Whether the native parser takes the file's header (else it gives way to Python's)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return gst._native.safetensors_header(raw[8:8 + n], len(raw) - 8 - n, gst.DTYPE_BITS,
                                          gst.TensorInfo) is not None


def random_header(seed, count):
    """A header of ``count`` tensors of every dtype, shuffled, with metadata."""
    rng = np.random.default_rng(seed)
    names = [f"layer.{i}.{rng.integers(1 << 30)}" for i in range(count)]
    header, at = {}, 0
    for name in names:
        dt = list(gst.DTYPE_BITS)[rng.integers(len(gst.DTYPE_BITS))]
        shape = [int(d) for d in rng.integers(0, 5, rng.integers(0, 4))]
        bits = gst.DTYPE_BITS[dt] * int(np.prod(shape, dtype=np.int64))
        if bits % 8:
            shape, bits = [8], gst.DTYPE_BITS[dt] * 8
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + bits // 8]}
        at += bits // 8
    items = list(header.items())
    rng.shuffle(items)
    return dict([("__metadata__", {"format": "pt", "b": "1", "a": "2"})] + items), at


@pytest.mark.parametrize("seed", range(4))
def test_the_native_header_parser_reads_what_the_python_one_reads(tmp_path, seed, monkeypatch):
    path = tmp_path / "many.safetensors"
    header, n = random_header(seed, 2000)
    write_raw(path, header, b"\0" * n)
    assert native_takes(path)
    fast, slow = gst.read_header(path), python_header(path, monkeypatch)
    assert fast == slow
    assert list(fast.metadata.items()) == list(slow.metadata.items())
    assert all(type(t) is gst.TensorInfo for t in fast.tensors)


@pytest.mark.parametrize("name, header, data", EDGES, ids=[e[0] for e in EDGES])
def test_on_the_edges_the_native_parser_takes_only_what_python_takes_and_reads_it_alike(
        tmp_path, name, header, data, monkeypatch):
    path = tmp_path / "edge.safetensors"
    write_raw(path, header, data)
    try:
        slow = python_header(path, monkeypatch)
    except gst.SafetensorsError:
        slow = None
    if slow is None:
        assert not native_takes(path), f"{name}: the native parser takes what Python refuses"
    else:
        assert gst.read_header(path) == slow


def test_headers_the_native_parser_gives_way_on_are_read_by_python(tmp_path, monkeypatch):
    # A repeated name (the last counts), a repeated metadata key, a header's own padding.
    cases = [
        b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, '
        b'"a": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}',
        b'{"__metadata__": {"k": "1", "k": "2"}, "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}',
    ]
    for i, h in enumerate(cases):
        path = tmp_path / f"odd{i}.safetensors"
        path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0\0")
        assert not native_takes(path), h
        assert gst.read_header(path) == python_header(path, monkeypatch)
    padded = tmp_path / "padded.safetensors"
    h = b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}' + b" " * 6
    padded.write_bytes(struct.pack("<Q", len(h)) + h + b"\0\0")
    assert native_takes(padded)
    assert gst.read_header(padded) == python_header(padded, monkeypatch)


U8x2 = '{"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}'

# Headers that only raw JSON can write (repeated keys, escapes, numbers Python's json reads its
# own way), each judged by safetensors, whose serde_json reading gdirect must match: (name,
# header, expected). Each has 2 bytes of data.
RAW_EDGES = [
    ("a field given twice", '{"a": {"dtype": "I8", "dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}', False),
    ("a field twice, the first unknown", '{"a": {"dtype": "XX", "dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}', False),
    ("shape twice", '{"a": {"dtype": "U8", "shape": [2], "shape": [2], "data_offsets": [0, 2]}}', False),
    ("__metadata__ twice", '{"__metadata__": {}, "__metadata__": {"k": "v"}, "a": %s}' % U8x2, False),
    ("__metadata__ twice, the first invalid", '{"__metadata__": 5, "__metadata__": {}, "a": %s}' % U8x2, False),
    ("a name twice, both valid (the last counts)", '{"a": %s, "a": %s}' % (U8x2, U8x2), True),
    ("a name twice, the first not an entry", '{"a": 5, "a": %s}' % U8x2, False),
    ("a name twice, the first of an unknown dtype", '{"a": {"dtype": "XX", "shape": [2], "data_offsets": [0, 2]}, "a": %s}' % U8x2, False),
    ("a metadata key twice", '{"__metadata__": {"k": "1", "k": "2"}, "a": %s}' % U8x2, True),
    ("a lone surrogate in a name", '{"\\ud800": %s}' % U8x2, False),
    ("a lone surrogate in metadata", '{"__metadata__": {"k": "\\udc00"}, "a": %s}' % U8x2, False),
    ("a surrogate pair in a name", '{"\\ud83d\\ude00": %s}' % U8x2, True),
    ("a shape of -0", '{"a": {"dtype": "U8", "shape": [-0, 2], "data_offsets": [0, 0]}, "b": %s}' % U8x2, False),
    ("offsets of -0", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [-0, 2]}}', False),
    ("a shape overflowing 64 bits before a 0", '{"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}, "b": %s}' % U8x2, False),
    ("a size of 2**64", '{"a": {"dtype": "U8", "shape": [18446744073709551616, 0], "data_offsets": [0, 0]}, "b": %s}' % U8x2, False),
    ("a size of 2**64 - 1 times 0", '{"a": {"dtype": "U8", "shape": [18446744073709551615, 0], "data_offsets": [0, 0]}, "b": %s}' % U8x2, True),
    ("an entry as an array", '{"a": ["U8", [2], [0, 2]]}', True),
    ("an entry as an array, a metadata key twice", '{"__metadata__": {"k": "1", "k": "2"}, "a": ["U8", [2], [0, 2]]}', True),
    ("an extra field nested 100 deep", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": %s}}' % ("[" * 100 + "]" * 100), True),
    ("an extra field nested 126 deep", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": %s}}' % ("[" * 126 + "]" * 126), False),
    ("an extra field of 1e400", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1e400}}', False),
    ("an extra field of 10**400", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1%s}}' % ("0" * 400), False),
    ("an extra field of 10**30", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1%s}}' % ("0" * 30), True),
    ("a name twice, the first of the wrong size (the last counts)", '{"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 2]}, "a": %s}' % U8x2, True),
    ("a name twice, the first with its offsets reversed", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [9, 4]}, "a": %s}' % U8x2, True),
    ("a name twice, the first overflowing 64 bits", '{"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}, "a": %s}' % U8x2, True),
    ("a name twice, the first of half a byte", '{"a": {"dtype": "F4", "shape": [1], "data_offsets": [0, 0]}, "a": %s}' % U8x2, True),
    ("a name twice, the last of the wrong size", '{"a": %s, "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 2]}}' % U8x2, False),
    ("a dtype as {name: null}", '{"a": {"dtype": {"U8": null}, "shape": [2], "data_offsets": [0, 2]}}', True),
    ("a dtype as {name: null} in an array entry", '{"a": [{"U8": null}, [2], [0, 2]]}', True),
    ("a dtype as {name: []}", '{"a": {"dtype": {"U8": []}, "shape": [2], "data_offsets": [0, 2]}}', False),
    ("a dtype as {unknown: null}", '{"a": {"dtype": {"XX": null}, "shape": [2], "data_offsets": [0, 2]}}', False),
    ("an extra field just under the largest float, as serde_json refuses it", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1.7976931348623158e308}}', False),
    ("an extra field of 17976931348623158e292", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 17976931348623158e292}}', False),
    ("an extra field of 1.79769313486231580e308, as serde_json takes it", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1.79769313486231580e308}}', True),
    ("an extra field with a lone surrogate", '{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": "\\ud800"}}', False),
]


@pytest.mark.parametrize("name, header, ok", RAW_EDGES, ids=[e[0] for e in RAW_EDGES])
def test_raw_headers_are_judged_as_safetensors_judges_them(tmp_path, name, header, ok, monkeypatch):
    path = tmp_path / "raw.safetensors"
    h = header.encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\1\2")
    assert safetensors_accepts(path) == ok, f"{name}: the reference's verdict is not {ok}"
    verdicts = []
    for read in (gst.read_header, lambda p: python_header(p, monkeypatch)):
        try:
            verdicts.append(read(path))
        except gst.SafetensorsError:
            verdicts.append(None)
    assert [v is not None for v in verdicts] == [ok, ok], name
    assert verdicts[0] == verdicts[1]
    if ok:
        names = [t.name for t in verdicts[0].tensors if t.end > t.start]
        with gst.open(path, framework="numpy", device="cpu") as f:
            assert [f.get_tensor(n).tobytes() for n in names] == [b"\1\2"]


def test_invalid_utf8_in_an_ignored_string_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "utf8.safetensors"
    h = b'{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": "\xff"}}'
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\1\2")
    assert not safetensors_accepts(path)
    assert not native_takes(path)
    with pytest.raises(gst.SafetensorsError, match="not JSON"):
        gst.read_header(path)


def test_nesting_past_pythons_recursion_limit_is_a_safetensors_error(tmp_path):
    path = tmp_path / "deep.safetensors"
    deep = "[" * 100_000 + "]" * 100_000
    h = ('{"__metadata__": {"k": "1", "k": "2"}, "a": {"dtype": "U8", "shape": [2], '
         '"data_offsets": [0, 2], "x": %s}}' % deep).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\1\2")
    with pytest.raises(gst.SafetensorsError, match="not JSON"):
        gst.read_header(path)


def reference_layout(tensors):
    """The layout as the Python loader computed it before the native one (its reference)."""
    segs, placed, shift, end, seg_file, seg_buf = [], [], None, 0, 0, 0
    for t in tensors:
        size = gst.DTYPE_SIZES.get(t.dtype, 1)
        if shift is None or (t.start + shift) % size:
            if shift is not None:
                segs.append((seg_file, seg_buf, end - seg_buf))
            seg_buf = -(-end // size) * size
            seg_file = t.start
            shift = seg_buf - t.start
        off = t.start + shift
        placed.append((t, off))
        end = off + t.end - t.start
    if shift is not None:
        segs.append((seg_file, seg_buf, end - seg_buf))
    return end, segs, placed


@pytest.mark.parametrize("seed", range(4))
def test_the_native_layout_is_the_python_one(tmp_path, seed):
    path = tmp_path / "many.safetensors"
    header, n = random_header(seed, 3000)
    write_raw(path, header, b"\0" * n)
    tensors = [t for t in gst.read_header(path).tensors if t.start != t.end]
    # The whole file as one run, and runs of it, as a device map would cut it.
    for lo, hi in [(0, len(tensors)), (5, 700), (701, 702), (0, 0)]:
        run = gst._Run(None, ("cpu", 0), 0, 0, tensors[lo:hi])
        size, segs, offsets = gst._layout(run)
        placed = list(zip(tensors[lo:hi], offsets))
        want = reference_layout(tensors[lo:hi])
        assert (size, segs, placed) == want
        for t, off in placed:
            assert off % gst.DTYPE_SIZES.get(t.dtype, 1) == 0


def test_a_piece_read_short_is_a_truncated_file_naming_where(tmp_path, monkeypatch):
    path = tmp_path / "t.safetensors"
    stnp.save_file(tensors(), str(path))
    real = gst._native.read_many

    def short_last(reads, cuda):
        report, each = real(reads, cuda)
        each = list(each)
        got, _eof = each[-1]
        each[-1] = (got - 1, True)
        return report, each

    monkeypatch.setattr(gst._native, "read_many", short_last)
    with pytest.raises(gst.SafetensorsError, match=r"truncated: \d+ of \d+ data bytes at \d+ could be read"):
        gst.load(path, device="cpu", framework="numpy")


class _Typed:
    """Stands in for a typed torch view of a buffer: records what ``as_strided`` is asked."""

    def __init__(self, dtype):
        self.dtype = dtype

    def as_strided(self, shape, strides, offset):
        return (self.dtype, shape, strides, offset)


def test_the_native_views_are_as_strided_with_contiguous_strides_in_elements():
    T = gst.TensorInfo
    tensors = [T("a", "F32", (2, 3, 4), 0, 96), T("b", "F16", (), 96, 98),
               T("c", "F4", (4,), 98, 100), T("d", "I64", (5, 0), 100, 100),
               T("e", "F64", (3,), 100, 124), T("f", "U8", (7,), 124, 131),
               T("g", "F32", (1,), 131, 135)]
    offsets = [0, 96, 98, 104, 104, 128, 134]  # g's 134 is not a multiple of 4: left
    typed = {d: _Typed(d) for d in ("F32", "F16", "F64", "U8")}
    out = {}
    left = gst._native.safetensors_views(tensors, offsets, typed, gst.DTYPE_SIZES, out)
    # F4 has no typed view, d is empty, g's offset does not fit its dtype: the caller's.
    assert left == [2, 3, 6]
    assert out == {
        "a": ("F32", (2, 3, 4), (12, 4, 1), 0),
        "b": ("F16", (), (), 48),
        "e": ("F64", (3,), (1,), 13),
        "f": ("U8", (7,), (1,), 128),
    }
    assert list(out) == ["a", "b", "e", "f"]
    with pytest.raises(ValueError, match="one offset for each tensor"):
        gst._native.safetensors_views(tensors, offsets[:-1], typed, gst.DTYPE_SIZES, {})


def test_small_pieces_are_gathered_in_file_order_and_the_rest_read_in_place(monkeypatch):
    monkeypatch.setattr(gst, "_GATHER_BELOW", 100)
    monkeypatch.setattr(gst, "_STAGING", 250)
    segs = [(0, 0, 10), (10, 16, 50), (60, 72, 100),   # 100: in place, ends the first group
            (160, 176, 99), (259, 280, 99), (358, 384, 99),  # 3 x 99 > 250: cut
            (457, 488, 5),                               # with the 99 before it
            (600, 640, 7),                               # not after 457+5: alone, in place
            (900, 936, 7), (907, 944, 8)]                # nor after 600+7: a group
    direct, groups = gst._gather(segs)
    assert groups == [[(0, 0, 10), (10, 16, 50)], [(160, 176, 99), (259, 280, 99)],
                      [(358, 384, 99), (457, 488, 5)], [(900, 936, 7), (907, 944, 8)]]
    assert direct == [(60, 72, 100), (600, 640, 7)]
    # Every piece once, either way.
    assert sorted(direct + [s for g in groups for s in g]) == sorted(segs)
    for g in groups:
        assert g[-1][0] + g[-1][2] - g[0][0] <= 250
        assert all(a[0] + a[2] == b[0] for a, b in zip(g, g[1:]))
    assert gst._gather([]) == ([], [])
    assert gst._gather([(0, 0, 5)]) == ([(0, 0, 5)], [])


def test_the_device_copies_refuse_without_a_gpu():
    """Where no CUDA driver is (CI), the gathered read's copy refuses host addresses with an
    error, never a panic, and says it has no batch."""
    try:
        import ctypes.util

        if ctypes.util.find_library("cuda"):
            pytest.skip("a CUDA driver is installed: tests_gpu covers it")
    except ImportError:
        pass
    buf = bytearray(64)
    addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    with pytest.raises(ValueError):
        gst._native.cuda_copy_many(addr, 32, addr + 32, 32, [(0, 0, 8)])
    assert gst._native.cuda_copy_method(0) is None
