# SPDX-License-Identifier: GPL-2.0 OR MIT
"""gdirect on a CUDA GPU, with PyTorch and CuPy: reads into device memory compared byte for byte
with the file, device addresses checked against the driver's allocations, and the safetensors
loader against safetensors.torch.load_file. Needs a GPU: run on one with
`python -m pytest userspace/gdirect-py/tests_gpu` (scripts/test runs the host-only tests)."""

import numpy as np
import pytest
import torch

import gdirect
from gdirect import safetensors as gst

SIZE = 64 * 1024 * 1024 + 4567


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "data.bin"
    data = np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return str(path), torch.from_numpy(data)


def test_a_torch_cuda_tensor_gets_the_file(data_file):
    path, data = data_file
    dest = torch.full((SIZE,), 0xA5, dtype=torch.uint8, device="cuda:0")
    r = gdirect.File(path).read(dest)
    assert (r.bytes, r.eof, r.memory) == (SIZE, False, "cuda:0")
    assert torch.equal(dest.cpu(), data)


@pytest.mark.parametrize("mode", ["direct", "buffered", "mapped"])
def test_offsets_and_every_page_cache_mode(data_file, mode):
    path, data = data_file
    gdirect.configure(page_cache=mode)
    try:
        dest = torch.full((1 << 20,), 0xA5, dtype=torch.uint8, device="cuda:0")
        r = gdirect.File(path).read(dest, file_offset=12345, dest_offset=100, size=500000)
        assert r.bytes == 500000
        host = dest.cpu()
        assert torch.equal(host[100:500100], data[12345:512345])
        assert (host[:100] == 0xA5).all() and (host[500100:] == 0xA5).all()
    finally:
        gdirect.configure()


def test_a_float_tensor_and_a_short_read_at_the_end(data_file):
    path, data = data_file
    dest = torch.zeros(1024, dtype=torch.float32, device="cuda:0")
    r = gdirect.File(path).read(dest, file_offset=SIZE - 1000)
    assert (r.bytes, r.eof) == (1000, True)
    assert torch.equal(dest.cpu().view(torch.uint8)[:1000], data[-1000:])


def test_a_cupy_array(data_file):
    cupy = pytest.importorskip("cupy")
    path, data = data_file
    dest = cupy.zeros(4096, dtype=cupy.int32)
    gdirect.File(path).read(dest, file_offset=8)
    assert torch.equal(torch.from_numpy(cupy.asnumpy(dest).view(np.uint8)), data[8 : 8 + 16384])


class Fake:
    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "strides": None, "version": 3,
        }


def test_an_array_that_claims_more_than_its_allocation_is_refused(data_file):
    path, _ = data_file
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
    # PyTorch's caching allocator may have rounded the allocation up: claim far more.
    with pytest.raises(ValueError, match="past the end of their CUDA allocation"):
        gdirect.File(path).read(Fake(t.data_ptr(), 1 << 34))


def test_host_memory_posing_as_device_memory_is_refused(data_file):
    path, _ = data_file
    host = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(ValueError):
        gdirect.File(path).read(Fake(host.ctypes.data, 4096))


def test_a_tensor_that_requires_grad_is_refused(data_file):
    # A regular file: a character device (/dev/null) is refused at open, before the tensor.
    t = torch.zeros(16, device="cuda:0", requires_grad=True)
    with pytest.raises(ValueError, match="detach"):
        gdirect.File(data_file[0]).read(t)


def checkpoint(path):
    import safetensors.torch as stt

    g = torch.Generator().manual_seed(3)
    t = {
        "a_odd": torch.arange(3, dtype=torch.uint8),
        "bf16": torch.randn(257, 33, generator=g).to(torch.bfloat16),
        "f16": torch.randn(64, generator=g).to(torch.float16),
        "f32": torch.randn(3, 5, 7, generator=g),
        "f64": torch.randn(9, generator=g, dtype=torch.float64),
        "i64": torch.randint(-(2**62), 2**62, (11,), generator=g),
        "i32": torch.randint(-(2**31), 2**31 - 1, (13,), generator=g, dtype=torch.int32),
        "i8": torch.randint(-128, 127, (17,), generator=g, dtype=torch.int8),
        "bool": torch.randint(0, 2, (19,), generator=g).bool(),
        "f8": torch.randn(23, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    stt.save_file(t, str(path), metadata={"m": "1"})
    return t


def test_safetensors_load_equals_load_file(tmp_path):
    import safetensors.torch as stt

    path = tmp_path / "ckpt.safetensors"
    checkpoint(path)
    want = stt.load_file(str(path), device="cuda:0")
    got = gst.load(path, device="cuda:0")
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape, g.device) == (w.dtype, w.shape, w.device), k
        assert torch.equal(g.view(torch.uint8) if g.dtype == torch.float8_e4m3fn else g,
                           w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w), k
    with gst.open(path, device="cuda:0") as f:
        assert torch.equal(f.get_tensor("bf16"), want["bf16"])
    cpu = gst.load(path, device="cpu")
    assert torch.equal(cpu["bf16"], want["bf16"].cpu())


def test_a_sharded_load_in_one_call_equals_load_file(tmp_path):
    import safetensors.torch as stt

    g = torch.Generator().manual_seed(9)
    want = {}
    files = []
    for i in range(3):
        part = {f"s{i}.w{j}": torch.randn(100 + j, 7, generator=g).to(torch.bfloat16) for j in range(5)}
        part[f"s{i}.odd"] = torch.arange(5 + i, dtype=torch.uint8)
        f = tmp_path / f"shard-{i}.safetensors"
        stt.save_file(part, str(f))
        files.append(f)
        want.update(stt.load_file(str(f), device="cuda:0"))
    got = gst.load(files, device="cuda:0")
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


class DLPackOnly:
    """What JAX offers: DLPack and nothing else."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_destinations_on_the_gpu(data_file):
    path, data = data_file
    dest = torch.full((70000,), -1, dtype=torch.int16, device="cuda:0")
    r = gdirect.File(path).read(DLPackOnly(dest), file_offset=77)
    assert (r.bytes, r.memory) == (140000, "cuda:0")
    assert torch.equal(dest.cpu().view(torch.uint8), data[77 : 77 + 140000])
    cupy = pytest.importorskip("cupy")
    arr = cupy.zeros((100, 10), dtype=cupy.float32)
    gdirect.File(path).read(DLPackOnly(arr[50:]), file_offset=5)
    host = cupy.asnumpy(arr).view(np.uint8).reshape(-1)
    assert (host[:2000] == 0).all() and host[2000:].tobytes() == data[5 : 5 + 2000].numpy().tobytes()


def test_a_device_map_over_the_gpu_and_the_cpu(tmp_path):
    import safetensors.torch as stt

    g = torch.Generator().manual_seed(11)
    want = {f"model.layers.{i}.w": torch.randn(300, 17, generator=g).to(torch.bfloat16)
            for i in range(12)}
    want["model.norm"] = torch.randn(17, generator=g)
    want["lm_head.weight"] = torch.randn(40, 17, generator=g).to(torch.float16)
    names = sorted(want)
    files = []
    for i, part in enumerate((names[:6], names[6:])):
        f = tmp_path / f"m-{i}.safetensors"
        stt.save_file({k: want[k] for k in part}, str(f))
        files.append(f)
    got = gst.load(files, device_map={"model.layers": "cuda:0", "lm_head": 0, "": "cpu"})
    assert set(got) == set(want)
    for k, w in want.items():
        on_gpu = k.startswith("model.layers.") or k.startswith("lm_head")
        assert got[k].device == torch.device("cuda:0" if on_gpu else "cpu"), k
        assert torch.equal(got[k].cpu(), w), k
    auto = gst.load(files, device_map="auto")
    assert {str(t.device) for t in auto.values()} == {f"cuda:{i}" for i in range(torch.cuda.device_count())}
    for k, w in want.items():
        assert torch.equal(auto[k].cpu(), w), k


def test_writes_from_device_memory_land_exactly(tmp_path, data_file):
    _, data = data_file
    src = data.to("cuda:0")  # 64 MiB + 4567: many pieces, every thread
    path = tmp_path / "from-gpu.bin"
    f = gdirect.File(path, "w")
    r = f.write(src)
    assert (r.bytes, r.memory) == (SIZE, "cuda:0")
    assert r.direct_bytes + r.buffered_bytes == SIZE
    assert path.read_bytes() == data.numpy().tobytes()
    # In place, at odd offsets, from a slice of a float tensor: only that range changes.
    floats = torch.randn(300000, device="cuda:0")
    f.write(floats, file_offset=12345, src_offset=8, size=800000)
    want = bytearray(data.numpy().tobytes())
    want[12345 : 12345 + 800000] = floats.cpu().numpy().tobytes()[8 : 8 + 800000]
    assert path.read_bytes() == bytes(want)
    # Read back through gdirect into the GPU: the same bytes.
    back = torch.zeros(SIZE, dtype=torch.uint8, device="cuda:0")
    f.read(back)
    assert torch.equal(back.cpu(), torch.frombuffer(want, dtype=torch.uint8))


def test_a_dlpack_device_source_and_a_read_only_file(tmp_path):
    cupy = pytest.importorskip("cupy")
    arr = cupy.arange(100000, dtype=cupy.int64)
    path = tmp_path / "dl.bin"
    gdirect.File(path, "w").write(DLPackOnly(arr))
    assert path.read_bytes() == cupy.asnumpy(arr).tobytes()
    with pytest.raises(OSError, match="not open for writing"):
        gdirect.File(path).write(arr)


# Writes are ordered after the work queued on their source: the file gets the bytes that work
# leaves, on whatever stream it runs. Each source starts as poison (0xA5) and is filled by a copy
# queued behind a kernel that spins for a while, so a write that did not wait would copy poison.
WRITE = 16 * 1024 * 1024
SPIN = 400_000_000  # GPU clock cycles: a fifth of a second or more on an H200


def _queued_fill(dest, src):
    """On the current stream: a kernel that spins, then the copy of ``src`` into ``dest``."""
    torch.cuda._sleep(SPIN)
    dest.copy_(src)


def _poisoned():
    t = torch.full((WRITE,), 0xA5, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    return t


def _assert_file_holds(path, want):
    got = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    want = want.numpy()
    assert got.size == want.size
    right = int((got == want).sum())
    assert right == want.size, f"{right} of {want.size} bytes written right"


@pytest.mark.parametrize("inside", [False, True], ids=["after-the-block", "inside-the-block"])
def test_a_write_waits_for_a_side_stream(tmp_path, data_file, inside):
    _, data = data_file
    want = data[:WRITE]
    src = want.to("cuda:0")
    t = _poisoned()
    side = torch.cuda.Stream()
    path = tmp_path / "side.bin"
    with torch.cuda.stream(side):
        _queued_fill(t, src)
        if inside:  # the side stream is PyTorch's current stream here
            gdirect.File(path, "w").write(t)
    if not inside:  # the default stream is current again; the fill may still be queued
        gdirect.File(path, "w").write(t)
    _assert_file_holds(path, want)


def test_a_write_waits_for_the_default_stream(tmp_path, data_file):
    _, data = data_file
    want = data[WRITE : 2 * WRITE]
    src = want.to("cuda:0")
    t = _poisoned()
    _queued_fill(t, src)
    path = tmp_path / "default.bin"
    gdirect.File(path, "w").write(t, size=WRITE)
    _assert_file_holds(path, want)


def test_a_write_waits_for_another_librarys_stream(tmp_path, data_file):
    """A stream CuPy made (non-blocking), on which the fill is queued: not PyTorch's."""
    cupy = pytest.importorskip("cupy")
    _, data = data_file
    want = data[:WRITE]
    src = want.to("cuda:0")
    t = _poisoned()
    theirs = cupy.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(torch.cuda.ExternalStream(theirs.ptr)):
        _queued_fill(t, src)
    path = tmp_path / "cupy-stream.bin"
    gdirect.File(path, "w").write(t)
    _assert_file_holds(path, want)


def test_a_write_waits_for_a_cuda_graph(tmp_path, data_file):
    _, data = data_file
    want = data[2 * WRITE : 3 * WRITE]
    src = want.to("cuda:0")
    t = _poisoned()
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    with torch.cuda.stream(capture), torch.cuda.graph(graph, stream=capture):
        _queued_fill(t, src)
    torch.cuda.synchronize()
    t.fill_(0xA5)
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.replay()
    path = tmp_path / "graph.bin"
    gdirect.File(path, "w").write(t)
    _assert_file_holds(path, want)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA GPU")
def test_a_write_waits_for_a_stream_of_the_sources_gpu_not_the_current_one(tmp_path, data_file):
    _, data = data_file
    want = data[:WRITE]
    src = want.to("cuda:1")
    t = torch.full((WRITE,), 0xA5, dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize("cuda:1")
    with torch.cuda.device(1), torch.cuda.stream(torch.cuda.Stream("cuda:1")):
        _queued_fill(t, src)
    path = tmp_path / "gpu1.bin"
    with torch.cuda.device(0):
        gdirect.File(path, "w").write(t)
    _assert_file_holds(path, want)
