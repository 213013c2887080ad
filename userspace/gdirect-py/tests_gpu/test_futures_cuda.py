# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Futures and batches into and out of CUDA memory (File.pread/pwrite, read_batch/write_batch),
compared byte for byte with the file; and reads ordered after the work queued on their
destination's stream: a copy of the destination queued behind a spinning kernel must see the
bytes from before the read (poison), never the file's."""

import threading

import numpy as np
import pytest
import torch

import gdirect

SIZE = 32 * 1024 * 1024 + 4567
BLOCK = 65536
POISON = 0xA5
SPIN = 400_000_000  # GPU clock cycles: a fifth of a second or more on an H200


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-futures") / "data.bin"
    data = np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return str(path), torch.from_numpy(data)


def test_preads_into_slots_of_a_tensor(data_file):
    path, data = data_file
    f = gdirect.File(path)
    n = 256
    buf = torch.full((n, BLOCK), POISON, dtype=torch.uint8, device="cuda:0")
    offsets = np.random.default_rng(1).integers(0, (SIZE - BLOCK) // 4096, n) * 4096
    futs = [f.pread(buf[i], BLOCK, int(o)) for i, o in enumerate(offsets)]
    assert [x.get() for x in futs] == [BLOCK] * n
    host = buf.cpu()
    for i, o in enumerate(offsets):
        assert torch.equal(host[i], data[o : o + BLOCK]), i


def test_preads_from_16_threads_into_one_cupy_buffer(data_file):
    cupy = pytest.importorskip("cupy")
    path, data = data_file
    f = gdirect.File(path)
    threads, per = 16, 64
    buf = cupy.full(threads * per * BLOCK, POISON, dtype=cupy.uint8)
    offsets = np.random.default_rng(2).integers(0, (SIZE - BLOCK) // 4096, threads * per) * 4096
    errors = []

    def run(k):
        try:
            for j in range(per):
                s = k * per + j
                assert f.pread(buf[s * BLOCK : (s + 1) * BLOCK], BLOCK, int(offsets[s])).get() == BLOCK
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    host = cupy.asnumpy(buf)
    for s, o in enumerate(offsets):
        assert np.array_equal(host[s * BLOCK : (s + 1) * BLOCK], data[o : o + BLOCK].numpy()), s


def test_a_batch_of_reads_mixes_gpu_and_host_memory(data_file):
    path, data = data_file
    f = gdirect.File(path)
    gpu = torch.full((3, BLOCK), POISON, dtype=torch.uint8, device="cuda:0")
    host = bytearray([POISON]) * BLOCK
    got = gdirect.read_batch([
        (f, 0, gpu[0], 0, None),
        (f, 4096, host, 0, None),
        (f, SIZE - 100, gpu[1], 0, None),  # short: 100 bytes
        (f, 8192, gpu[2], 10, 1000),
    ]).get()
    assert got == [BLOCK, BLOCK, 100, 1000]
    g = gpu.cpu()
    assert torch.equal(g[0], data[:BLOCK])
    assert bytes(host) == bytes(data[4096 : 4096 + BLOCK].numpy())
    assert torch.equal(g[1, :100], data[-100:]) and (g[1, 100:] == POISON).all()
    assert torch.equal(g[2, 10:1010], data[8192:9192])
    assert (g[2, :10] == POISON).all() and (g[2, 1010:] == POISON).all()


def test_pwrite_and_write_batch_from_gpu_memory(tmp_path, data_file):
    _, data = data_file
    path = tmp_path / "out.bin"
    f = gdirect.File(path, "w")
    src = data[: 64 * BLOCK].to("cuda:0").view(64, BLOCK)
    order = np.random.default_rng(3).permutation(64)
    futs = [f.pwrite(src[i], BLOCK, int(order[i]) * BLOCK) for i in range(32)]
    batch = gdirect.write_batch((f, int(order[i]) * BLOCK, src[i], 0, None) for i in range(32, 64))
    assert [x.get() for x in futs] == [BLOCK] * 32 and batch.get() == [BLOCK] * 32
    got = np.frombuffer(path.read_bytes(), dtype=np.uint8).reshape(64, BLOCK)
    want = src.cpu().numpy()
    for i in range(64):
        assert np.array_equal(got[order[i]], want[i]), i


def test_a_pwrite_waits_for_a_side_stream(tmp_path, data_file):
    _, data = data_file
    want = data[: 16 << 20]
    src = want.to("cuda:0")
    t = torch.full((16 << 20,), POISON, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN)
        t.copy_(src)
    path = tmp_path / "side.bin"
    assert gdirect.File(path, "w").pwrite(t).get() == 16 << 20
    assert np.array_equal(np.frombuffer(path.read_bytes(), dtype=np.uint8), want.numpy())


def _read_after_queued_use(read, dest):
    """Queues, on the current stream, a kernel that spins and then a copy of ``dest`` (poison),
    then reads into ``dest`` with ``read``: the copy must hold poison, ``dest`` the file."""
    snapshot = torch.empty_like(dest)
    torch.cuda._sleep(SPIN)
    snapshot.copy_(dest)
    read(dest)
    torch.cuda.synchronize()
    return snapshot


@pytest.mark.parametrize("how", ["read", "pread", "read_batch", "read_async"])
@pytest.mark.parametrize("where", ["default", "side"])
def test_a_read_waits_for_the_work_queued_on_its_stream(data_file, how, where):
    path, data = data_file
    f = gdirect.File(path)
    n = 8 << 20
    dest = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    read = {
        "read": lambda d: f.read(d),
        "pread": lambda d: f.pread(d).get(),
        "read_batch": lambda d: gdirect.read_batch([(f, 0, d, 0, None)]).get(),
        # Run by a worker thread, whose current stream is not the caller's.
        "read_async": lambda d: f.read_async(d).result(),
    }[how]
    if where == "side":
        with torch.cuda.stream(torch.cuda.Stream()):
            snapshot = _read_after_queued_use(read, dest)
    else:
        snapshot = _read_after_queued_use(read, dest)
    assert (snapshot == POISON).all(), "the read landed before the work queued on its stream"
    assert torch.equal(dest.cpu(), data[:n])


def test_a_read_into_cupy_waits_for_cupys_current_stream(data_file):
    cupy = pytest.importorskip("cupy")
    path, data = data_file
    n = 8 << 20
    dest = cupy.full(n, POISON, dtype=cupy.uint8)
    snapshot = cupy.empty_like(dest)
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
            torch.cuda._sleep(SPIN)
        snapshot[:] = dest  # queued on s, behind the spin
        gdirect.File(path).read(dest)
    s.synchronize()
    assert int((snapshot == POISON).sum()) == n
    assert np.array_equal(cupy.asnumpy(dest), data[:n].numpy())


def test_the_check_sees_a_read_that_does_not_wait(data_file, monkeypatch):
    """The check above fails on a read that does not wait: with the stream's wait planted away
    (PyTorch's stream reported as "nothing to wait for"), the queued copy sees the file's
    bytes."""
    path, data = data_file
    monkeypatch.setattr(gdirect, "_torch_stream", lambda t: 0)
    n = 8 << 20
    dest = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    snapshot = _read_after_queued_use(lambda d: gdirect.File(path).read(d), dest)
    assert not (snapshot == POISON).all(), "the planted bug went unseen"
    assert torch.equal(dest.cpu(), data[:n])


@pytest.mark.parametrize("where", ["default", "side"])
def test_a_small_read_run_before_pread_returns_waits_for_its_stream(data_file, where):
    # A 64 KiB pread into memory of a known stream is run before pread returns (its future is
    # done), and still after the work queued on that stream (the copy behind the spin sees
    # poison).
    path, data = data_file
    f = gdirect.File(path)
    gdirect.configure(inline_size=64 << 10)
    n = 64 << 10
    dest = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    futs, at_once = [], []

    def read(d):
        futs.append(f.pread(d, n, 4096))
        at_once.append(futs[-1].done())

    try:
        if where == "side":
            with torch.cuda.stream(torch.cuda.Stream()):
                snapshot = _read_after_queued_use(read, dest)
        else:
            snapshot = _read_after_queued_use(read, dest)
    finally:
        gdirect.configure()
    assert at_once == [True] and futs[0].get() == n
    assert (snapshot == POISON).all(), "the read landed before the work queued on its stream"
    assert torch.equal(dest.cpu(), data[4096 : 4096 + n])


def test_a_child_forked_after_gpu_io_gets_an_error(data_file):
    # After reads into GPU memory, a forked child's calls raise RuntimeError at once (host
    # memory here: the child must not touch CUDA), never wait for the parent's threads.
    import os
    import time

    path, data = data_file
    f = gdirect.File(path)
    dest = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
    assert f.pread(dest, 1 << 20, 0).get() == 1 << 20
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            f.pread(bytearray(4096), 4096, 0).get()
            code = 2
        except RuntimeError as e:
            code = 0 if "fork" in str(e) else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    assert torch.equal(dest.cpu(), data[: 1 << 20])
