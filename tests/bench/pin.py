# SPDX-License-Identifier: GPL-2.0 OR MIT
"""What pinning the compat engine's staging costs (issue 31, item 6: a fresh process's first
read pins its staging): cudaHostRegister of N buffers of B bytes of fresh anonymous memory
(madvised huge, touched first, as the engine's are) from T threads at once, against one
registration of all N*B bytes, and one cudaHostAlloc of 64 MiB. Each variant in a fresh region;
medians of 3. Needs CuPy and a CUDA GPU.

Usage: python3 tests/bench/pin.py
"""
import ctypes
import mmap
import statistics
import threading
import time

import cupy
from cupy.cuda import runtime as rt

HUGE = 2 << 20
MADV_HUGEPAGE = 14
libc = ctypes.CDLL("libc.so.6", use_errno=True)


def region(n):
    """A fresh anonymous mapping with n bytes at a huge-page boundary, madvised huge and
    touched: (the mapping, the boundary's address)."""
    m = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    a = (addr + HUGE - 1) & ~(HUGE - 1)
    libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(n), MADV_HUGEPAGE)
    ctypes.memset(a, 0, n)
    return m, a


def run(nbuf, b, threads, whole):
    """Seconds to register nbuf buffers of b bytes from `threads` threads, or all of them in
    one call (`whole`)."""
    m, a = region(nbuf * b)
    t0 = time.perf_counter()
    if whole:
        rt.hostRegister(a, nbuf * b, 0)
    else:
        def work(i):
            for k in range(i, nbuf, threads):
                rt.hostRegister(a + k * b, b, 0)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    dt = time.perf_counter() - t0
    for k in range(1 if whole else nbuf):
        rt.hostUnregister(a + k * b)
    m.close()
    return dt


def main():
    cupy.cuda.Device(0).use()
    cupy.zeros(1)  # the context, made before the clock
    for nbuf, b, threads, whole in [(32, HUGE, 1, False), (32, HUGE, 16, False),
                                    (1, 64 << 20, 1, True), (64, HUGE, 16, False),
                                    (1, 128 << 20, 1, True), (16, 4 << 20, 16, False)]:
        r = [run(nbuf, b, threads, whole) for _ in range(3)]
        print(f"pin {nbuf} x {b >> 20} MiB from {threads} threads{' (one call)' if whole else ''}: "
              f"median {statistics.median(r) * 1e3:.2f} ms  runs {' '.join(f'{x * 1e3:.2f}' for x in r)}",
              flush=True)
    t0 = time.perf_counter()
    p = rt.hostAlloc(64 << 20, 0)
    dt = time.perf_counter() - t0
    rt.freeHost(p)
    print(f"cudaHostAlloc 64 MiB: {dt * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
