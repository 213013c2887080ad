# SPDX-License-Identifier: GPL-2.0 OR MIT
"""File.pread / File.pwrite futures and read_batch / write_batch, on host memory: bytes compared
with the file's (destinations poisoned first), many requests in flight from one thread and from
many, awaiting, callbacks, timeouts, the memory held by the future, and the errors of bad
requests, raised at the call or by get()."""

import asyncio
import errno
import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest

import gdirect

SIZE = 8 * 1024 * 1024 + 777
POISON = 0x5A


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("futures") / "data.bin"
    data = np.random.default_rng(11).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return str(path), data


def poisoned(n):
    return bytearray([POISON]) * n


@pytest.fixture(autouse=True, params=["inline", "queued"])
def inline_mode(request):
    """Every test twice: with the default inline size (a small request whose result is taken
    at once runs before pread returns) and with none (every request handed to the I/O threads,
    the futures' other path)."""
    gdirect.configure(inline_size=0 if request.param == "queued" else None)
    yield request.param
    gdirect.configure()


def test_pread_gets_the_bytes_and_their_count(data_file):
    path, data = data_file
    f = gdirect.File(path)
    dest = poisoned(100000)
    fut = f.pread(dest, 65536, 12345, 100)
    assert isinstance(fut, gdirect.Future)
    assert fut.get() == 65536
    assert fut.done() and fut.get() == 65536  # a second get gives the same
    assert bytes(dest[100:65636]) == data[12345 : 12345 + 65536]
    assert set(dest[:100]) == {POISON} and set(dest[65636:]) == {POISON}


def test_pread_defaults_to_the_rest_of_the_buffer_and_is_short_at_the_end(data_file):
    path, data = data_file
    f = gdirect.File(path)
    dest = np.full(5000, POISON, dtype=np.uint8)
    assert f.pread(dest, file_offset=SIZE - 3000).get() == 3000
    assert dest[:3000].tobytes() == data[-3000:] and set(dest[3000:].tolist()) == {POISON}
    assert f.pread(dest, file_offset=SIZE + 10).get() == 0


def test_many_preads_in_flight_from_one_thread(data_file):
    path, data = data_file
    f = gdirect.File(path)
    block = 64 * 1024
    rng = np.random.default_rng(5)
    offsets = rng.integers(0, SIZE - block, 256)
    slots = poisoned(block * len(offsets))
    futs = [f.pread(slots, block, int(o), i * block) for i, o in enumerate(offsets)]
    assert [fut.get() for fut in futs] == [block] * len(offsets)
    for i, o in enumerate(offsets):
        assert slots[i * block : (i + 1) * block] == data[o : o + block], i


def test_preads_from_many_threads_at_once(data_file):
    path, data = data_file
    f = gdirect.File(path)
    block, per_thread, threads = 4096 * 3, 64, 16
    bad = []

    def run(seed):
        rng = np.random.default_rng(seed)
        for _ in range(per_thread):
            o = int(rng.integers(0, SIZE - block))
            dest = poisoned(block)
            if f.pread(dest, block, o).get() != block or dest != data[o : o + block]:
                bad.append((seed, o))

    ts = [threading.Thread(target=run, args=(s,)) for s in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert bad == []


def test_pwrite_writes_in_place_and_reads_back(tmp_path):
    path = tmp_path / "w.bin"
    before = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    path.write_bytes(before)
    want = bytearray(before)
    f = gdirect.File(path, "r+")
    futs = []
    srcs = []
    for i in range(32):
        src = np.random.default_rng(100 + i).integers(0, 256, 8192, dtype=np.uint8)
        at = i * 30000 + 7
        futs.append(f.pwrite(src, 8000, at, 100))
        srcs.append(src)
        want[at : at + 8000] = src[100:8100].tobytes()
    assert [fut.get() for fut in futs] == [8000] * 32
    assert path.read_bytes() == bytes(want)
    # A write past the end extends the file; bytes (read-only) are a source too.
    assert f.pwrite(b"tail", file_offset=(1 << 20) + 10).get() == 4
    assert path.read_bytes()[-14:] == b"\0" * 10 + b"tail"


def test_read_batch_mixes_files_offsets_and_sizes(data_file, tmp_path):
    path, data = data_file
    other = tmp_path / "other.bin"
    odata = os.urandom(300000)
    other.write_bytes(odata)
    f, g = gdirect.File(path), gdirect.File(other)
    dest = poisoned(1 << 20)
    arr = np.full(1000, POISON, dtype=np.uint8)
    reqs = [
        (f, 0, dest, 0, 4096),
        (g, 1234, dest, 4096, 100000),
        (f, SIZE - 10, dest, 200000, 500),  # short: 10 bytes
        (g, 0, arr, 0, None),  # the whole array
        (f, 5, dest, 300000, 0),  # empty
    ]
    fut = gdirect.read_batch(reqs)
    assert fut.get() == [4096, 100000, 10, 1000, 0]
    assert dest[:4096] == data[:4096]
    assert dest[4096:104096] == odata[1234:101234]
    assert dest[200000:200010] == data[-10:]
    assert set(dest[200010:200500]) == {POISON}
    assert arr.tobytes() == odata[:1000]


def test_a_batch_of_thousands_of_small_blocks(data_file):
    path, data = data_file
    f = gdirect.File(path)
    block, n = 4096, 2000
    rng = np.random.default_rng(9)
    offsets = [int(o) for o in rng.integers(0, SIZE - block, n)]
    slots = poisoned(block * n)
    got = gdirect.read_batch((f, o, slots, i * block, block) for i, o in enumerate(offsets)).get()
    assert got == [block] * n
    for i, o in enumerate(offsets):
        assert slots[i * block : (i + 1) * block] == data[o : o + block], i


def test_write_batch_then_read_batch_round_trip(tmp_path):
    path = tmp_path / "kv.bin"
    f = gdirect.File(path, "w")
    blocks = [np.random.default_rng(i).integers(0, 256, 65536, dtype=np.uint8) for i in range(24)]
    order = np.random.default_rng(1).permutation(24)
    w = gdirect.write_batch((f, int(slot) * 65536, b, 0, None) for slot, b in zip(order, blocks))
    assert w.get() == [65536] * 24
    back = np.full((24, 65536), POISON, dtype=np.uint8)
    r = gdirect.read_batch((f, int(slot) * 65536, back[i], 0, None) for i, slot in enumerate(order))
    assert r.get() == [65536] * 24
    for i in range(24):
        assert back[i].tobytes() == blocks[i].tobytes(), i


def test_await_and_done_callbacks(data_file):
    path, data = data_file
    f = gdirect.File(path)
    dests = [poisoned(1 << 20) for _ in range(8)]

    async def main():
        futs = [f.pread(d, file_offset=i * 4096) for i, d in enumerate(dests)]
        return await asyncio.gather(*futs)

    assert asyncio.run(main()) == [1 << 20] * 8
    for i, d in enumerate(dests):
        assert d == data[i * 4096 : i * 4096 + (1 << 20)]
    seen = []
    done = threading.Event()
    fut = f.pread(poisoned(4096))
    fut.add_done_callback(lambda x: (seen.append(x.get()), done.set()))
    assert done.wait(10) and seen == [4096]
    fut.add_done_callback(lambda x: seen.append("late"))  # already done: called at once
    assert seen == [4096, "late"]


def test_get_with_a_timeout(tmp_path):
    # A timeout of 0 on a large read asks before it can end (or after: either answer is
    # checked).
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(1 << 20) * 64)
    fut = gdirect.File(path).pread(bytearray(64 << 20))
    try:
        assert fut.get(timeout=0) == 64 << 20 and fut.done()
    except TimeoutError:
        assert "running" in repr(fut)  # still running: the timeout said so
    assert fut.get(timeout=60) == 64 << 20
    assert "done" in repr(fut)
    with pytest.raises(ValueError):
        fut.get(timeout=float("nan"))


def test_the_future_holds_its_memory(data_file):
    path, data = data_file

    class Buf(bytearray):
        pass

    dest = Buf(poisoned(4 << 20))
    ref = weakref.ref(dest)
    fut = gdirect.File(path).pread(dest)
    del dest
    gc.collect()
    assert ref() is not None  # the future keeps it while it may be written
    assert fut.get() == 4 << 20
    assert bytes(ref()) == data[: 4 << 20]
    del fut
    gc.collect()
    assert ref() is None
    # Dropped before it ends, a future waits for its read: the buffer is never written freed.
    for _ in range(20):
        gdirect.File(path).pread(bytearray(2 << 20))


def test_bad_arguments_raise_at_the_call(data_file):
    path, _ = data_file
    f = gdirect.File(path)
    with pytest.raises(ValueError, match="do not fit"):
        f.pread(bytearray(10), 11)
    with pytest.raises(ValueError, match="past the"):
        f.pread(bytearray(10), None, 0, 11)
    with pytest.raises(ValueError, match="read-only"):
        f.pread(b"read-only")
    with pytest.raises(ValueError, match="must not be negative"):
        f.pread(bytearray(10), file_offset=-1)
    with pytest.raises(OSError) as e:
        f.pwrite(b"x")
    assert e.value.errno == errno.EBADF
    d = bytearray(100)
    with pytest.raises(ValueError, match="overlap"):
        gdirect.read_batch([(f, 0, d, 0, 50), (f, 0, d, 49, 10)])
    with pytest.raises(TypeError, match="request 1"):
        gdirect.read_batch([(f, 0, d, 0, 10), (f, 0, d)])
    with pytest.raises(TypeError, match="not a gdirect.File"):
        gdirect.read_batch([(path, 0, d, 0, 10)])
    with pytest.raises(OSError) as e:
        gdirect.write_batch([(f, 0, b"abc", 0, None)])
    assert e.value.errno == errno.EBADF


def test_errors_of_the_io_are_raised_by_get(tmp_path):
    path = tmp_path / "w.bin"
    f = gdirect.File(path, "w")
    fut = f.pwrite(b"x" * 4096, file_offset=(1 << 63) - 100)
    with pytest.raises(OSError) as e:
        fut.get()
    assert e.value.errno == errno.EFBIG
    with pytest.raises(OSError):  # raised again
        fut.get()
    assert "failed" in repr(fut)
    batch = gdirect.write_batch([(f, 0, b"ok", 0, None), (f, (1 << 63) - 1, b"xx", 0, None)])
    with pytest.raises(OSError) as e:
        batch.get()
    assert e.value.errno == errno.EFBIG


def test_futures_dropped_unwaited_from_many_threads(data_file):
    """Dropped before they end, futures run or wait for their reads: from 8 threads at once,
    hundreds of them, the process goes on and the next reads are exact."""
    path, data = data_file
    f = gdirect.File(path)
    errors = []

    def run(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(200):
                f.pread(bytearray(65536), 65536, int(rng.integers(0, SIZE - 65536)))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(s,)) for s in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    dest = poisoned(4096)
    assert f.pread(dest, 4096, 777).get() == 4096 and dest == data[777:4873]


def test_a_callback_that_raises_is_reported_not_fatal(data_file, monkeypatch):
    path, data = data_file
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: seen.append(u.exc_value))

    def bad(_):
        raise RuntimeError("from a callback")

    fut = gdirect.File(path).pread(poisoned(SIZE))
    try:
        fut.add_done_callback(bad)
        late = False
    except RuntimeError:
        late = True  # the read had ended: the callback ran at once, in this thread
    assert fut.get() == SIZE
    if not late:
        # Run by the thread that ended the read: reported through sys.unraisablehook.
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) == 1 and isinstance(seen[0], RuntimeError)
    # Added after the end, it runs at once, in this thread: its exception is this call's.
    with pytest.raises(RuntimeError, match="from a callback"):
        fut.add_done_callback(bad)


def test_a_small_request_waited_for_at_once_is_done_when_pread_returns(data_file):
    # A thread that holds no future whose result it has not taken: a request of inline_size
    # bytes or fewer runs before pread returns (its future is done), however it is taken.
    path, data = data_file
    f = gdirect.File(path)
    gdirect.configure(inline_size=64 << 10)
    gc.collect()  # (an earlier test's future held by a cycle would count)
    assert gdirect._native._untaken() == 0
    for size in (1, 4096, 64 << 10):
        dest = poisoned(size)
        fut = f.pread(dest, size, 777)
        assert fut.done(), size
        assert dest == data[777 : 777 + size]  # before get(): the bytes are there already
        assert fut.get() == size
    # A result taken by get() in another thread, or a future dropped untaken, leaves this
    # thread free to run the next one at once again.
    fut = f.pread(poisoned(4096), 4096, 0)
    assert gdirect._native._untaken() == 1
    t = threading.Thread(target=fut.get)
    t.start()
    t.join()
    assert gdirect._native._untaken() == 0
    assert f.pread(poisoned(4096), 4096, 0).done()  # (dropped at once: not got)
    assert gdirect._native._untaken() == 0
    dest = poisoned(4096)
    assert f.pread(dest, 4096, 5).done() and dest == data[5:4101]
    # Writes as reads.
    g = gdirect.File(path + ".w", "w")
    fut = g.pwrite(b"x" * 5000, file_offset=3)
    assert fut.done() and fut.get() == 5000
    assert open(path + ".w", "rb").read() == b"\0" * 3 + b"x" * 5000


def test_requests_started_while_results_are_untaken_are_all_right(data_file):
    # The first of many runs at once; the rest, started while it is untaken, are the I/O
    # threads' (or get()'s): every byte right whichever ran it, with any inline size.
    path, data = data_file
    f = gdirect.File(path)
    try:
        for inline in (0, 4096, 64 << 10, 1 << 20):
            gdirect.configure(inline_size=inline)
            rng = np.random.default_rng(inline)
            sizes = rng.integers(1, 100000, 200)
            offsets = rng.integers(0, SIZE - 100000, 200)
            slots = poisoned(100000 * 200)
            futs = [f.pread(slots, int(n), int(o), i * 100000)
                    for i, (n, o) in enumerate(zip(sizes, offsets))]
            # (Done when run at once; one handed off may be done by now too.)
            assert futs[0].done() or sizes[0] > inline
            assert [fut.get() for fut in futs] == [int(n) for n in sizes]
            for i, (n, o) in enumerate(zip(sizes, offsets)):
                got = slots[i * 100000 : (i + 1) * 100000]
                assert got[:n] == data[o : o + n] and set(got[n:]) <= {POISON}, (inline, i)
    finally:
        gdirect.configure()


def test_the_count_of_untaken_futures_on_every_path(data_file, tmp_path):
    # A pread/pwrite future counts against its thread until its result is taken (get, await,
    # in any thread) or it is dropped; a timed-out get leaves it counted; a get that raises the
    # I/O's error takes it; batches and callbacks do not count.
    path, _ = data_file
    f = gdirect.File(path)
    gc.collect()  # (an earlier test's future held by a cycle, an exception's traceback)
    base = gdirect._native._untaken()

    def n():
        return gdirect._native._untaken() - base

    futs = [f.pread(poisoned(4096), 4096, i * 4096) for i in range(10)]
    assert n() == 10
    for i, fut in enumerate(futs):
        fut.get()
        fut.get()  # (a second get takes nothing more)
        assert n() == 9 - i
    big = f.pread(poisoned(4 << 20), 4 << 20, 0)
    assert n() == 1
    try:
        big.get(timeout=0)
        assert n() == 0  # (it had ended: taken)
    except TimeoutError:
        assert n() == 1  # (not taken)
        big.get()
        assert n() == 0
    calls = []
    fut = f.pread(poisoned(4096), 4096, 0)
    fut.add_done_callback(lambda done: calls.append(done.done()))
    assert n() == 1
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls == [True] and n() == 1  # (a callback takes nothing)
    del fut
    gc.collect()
    assert n() == 0
    batch = gdirect.read_batch([(f, 0, poisoned(4096), 0, 4096)])
    assert n() == 0 and batch.get() == [4096]
    # The I/O's error, raised by get(): taken.
    w = gdirect.File(tmp_path / "w.bin", "w")
    fut = w.pwrite(b"x" * 4096, file_offset=(1 << 63) - 100)
    assert n() == 1
    with pytest.raises(OSError):
        fut.get()
    assert n() == 0

    async def many():
        loop_thread = threading.get_ident()
        dests = [poisoned(4096) for _ in range(32)]
        got = await asyncio.gather(*(f.pread(d, 4096, i * 4096) for i, d in enumerate(dests)))
        assert threading.get_ident() == loop_thread
        return got, dests

    got, dests = asyncio.run(many())
    assert got == [4096] * 32 and n() == 0


@pytest.mark.parametrize("value, want", [("8K", 8192), ("0", 0), ("soon", None)])
def test_the_inline_size_from_the_environment(value, want):
    import subprocess
    import sys

    # The environment's value, a configured one over it, and configure() back to it.
    code = ("import gdirect; a = gdirect.settings()['inline_size']; gdirect.configure(inline_size=5);"
            "b = gdirect.settings()['inline_size']; gdirect.configure();"
            "print(a, b, gdirect.settings()['inline_size'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "GDIRECT_INLINE_SIZE": value})
    if want is None:
        assert r.returncode != 0, r.stdout
        assert "ValueError" in r.stderr and "GDIRECT_INLINE_SIZE" in r.stderr, r.stderr
    else:
        assert r.returncode == 0 and r.stdout.split() == [str(want), "5", str(want)], r.stderr


def _in_child(body):
    """Runs ``body()`` in a child made by fork(): its exit status (0: body returned), or 99 if
    it did not end within 60 seconds (killed: a hang)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = body()
        except BaseException:  # noqa: BLE001 (the child's traceback, for the parent's log)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return 99


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (fork with threads: on purpose)
def test_a_child_forked_after_io_gets_an_error_not_a_hang(data_file):
    # The parent has done I/O (its threads exist); a forked child has none of them: each call
    # that needs them raises RuntimeError naming fork and spawn, at once, not a wait forever.
    path, data = data_file
    f = gdirect.File(path)
    dest = poisoned(1 << 20)
    assert f.read(dest).bytes == 1 << 20 and f.pread(poisoned(4096), 4096, 0).get() == 4096

    def body():
        calls = [lambda: f.read(poisoned(4096)), lambda: f.pread(poisoned(4096), 4096, 0).get(),
                 lambda: f.pread(poisoned(1 << 20), 1 << 20, 0).get(),
                 lambda: gdirect.read_batch([(f, 0, poisoned(4096), 0, 4096)]).get(),
                 lambda: f.read_async(poisoned(4096)).result(timeout=30),
                 lambda: gdirect.File(path).read(poisoned(10))]
        for i, call in enumerate(calls):
            try:
                call()
                return 10 + i  # (no error)
            except RuntimeError as e:
                if "fork" not in str(e) or "spawn" not in str(e):
                    return 30 + i
        return 0

    assert _in_child(body) == 0
    # The parent is as it was.
    dest = poisoned(4096)
    assert f.pread(dest, 4096, 5).get() == 4096 and dest == data[5:4101]


def test_a_child_forked_before_any_io_moves_data():
    # Fork before the package made any thread: the child is a process like any other.
    import subprocess
    import sys

    code = """
import os, gdirect
path = os.environ["DATA"]
pid = os.fork()
if pid == 0:
    d = bytearray(4096)
    ok = gdirect.File(path).pread(d, 4096, 0).get() == 4096 and bytes(d) == open(path, "rb").read(4096)
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    data = os.urandom(8192)
    import tempfile
    with tempfile.NamedTemporaryFile() as t:
        t.write(data)
        t.flush()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "DATA": t.name})
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (fork with threads: on purpose)
def test_a_future_started_before_a_fork_is_not_waited_for_in_the_child(data_file):
    # Requests in flight when the process forks: in the child, get() either has their result
    # (ended before the fork) or raises RuntimeError; dropping them does not wait; never a hang
    # (the watchdog's 99). The parent's own get() has every byte.
    path, data = data_file
    f = gdirect.File(path)
    gdirect.configure(inline_size=0)
    slots = poisoned(64 << 20)
    fut = gdirect.read_batch([(f, (i * 131072) % (SIZE - (1 << 20)), slots, i << 20, 1 << 20)
                              for i in range(64)])
    one = f.pread(poisoned(1 << 20), 1 << 20, 0)

    def body():
        for future, want in ((fut, [1 << 20] * 64), (one, 1 << 20)):
            try:
                if future.get() != want:
                    return 20
            except RuntimeError as e:
                if "fork" not in str(e):
                    return 21
        return 0

    code = _in_child(body)
    assert fut.get() == [1 << 20] * 64 and one.get() == 1 << 20
    for i in range(64):
        o = (i * 131072) % (SIZE - (1 << 20))
        assert slots[i << 20 : (i + 1) << 20] == data[o : o + (1 << 20)], i
    assert code == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (fork with threads: on purpose)
def test_a_future_whose_lock_was_held_at_the_fork_raises_in_the_child(data_file):
    # The engine's thread that ends a call holds the call's lock for an instant after marking it
    # done; a fork in that instant leaves the lock held in the child for ever. Here a thread
    # holds it across the fork: the child's get() and add_done_callback() of that done future
    # raise RuntimeError at once, not a hang, and its repr() names the parent; a done future
    # whose lock was free has its result in the child; the parent's get() waits for the lock.
    path, data = data_file
    f = gdirect.File(path)
    held, free = poisoned(4096), poisoned(4096)
    a, b = f.pread(held, 4096, 0), f.pread(free, 4096, 8192)
    assert a.get() == 4096 and b.get() == 4096
    gdirect._native._hold_state(a, 2.0)

    def body():
        for i, call in enumerate((a.get, lambda: a.add_done_callback(lambda _: None))):
            try:
                call()
                return 10 + i
            except RuntimeError as e:
                if "fork" not in str(e):
                    return 20 + i
        if "parent" not in repr(a):
            return 30
        return 0 if b.get() == 4096 and "done" in repr(b) else 40

    assert _in_child(body) == 0
    assert a.get() == 4096 and held == data[:4096] and free == data[8192:12288]
