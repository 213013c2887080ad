#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR MIT
"""How fast one new file's page cache can be filled from host memory, by each way a saver could
write it: one write() (what `raw` is in save.py); pwrite() from T threads at their own offsets
(ext4, XFS and btrfs take the inode's lock for each buffered write: in turn); and a shared
mapping of the file written from T threads, each its own range (page faults take no inode
lock), the file's blocks allocated first (posix_fallocate: a fault then never needs a block, so
a full disk is ENOSPC there, not a SIGBUS), in 2 MiB ranges each either faulted in with
MADV_POPULATE_WRITE (whose failures come back as an errno) then copied into (`mmap`), or
copied into with its faults taken one by one (`mmap-nopopulate`); or the file only made long
(ftruncate, no block allocated ahead) and copied into by the kernel, process_vm_writev into
this process's own mapping (`mmap-vmwritev`: the kernel takes the faults and returns EFAULT
where one fails, never SIGBUS). Two more tell which of the two costs there: the file made long
and copied into by the CPU (`mmap-ftruncate`), and its blocks allocated first, then copied into
by the kernel (`mmap-vmwritev-falloc`); and the CPU's copy into blocks allocated first with
the threads taking 16 MiB pieces in turn, as the engine's workers take a write's
(`mmap-turns`). Each time includes opening,
allocating, mapping and unmapping. Every file is read back and compared; nothing is synced.

Usage: fill.py [--gb G] [--threads LIST] [--rounds N] [--dir DIR] [--ways LIST] [--out FILE]
Prints one JSON object per measurement (and appends it to --out).
"""
import argparse
import ctypes
import datetime
import itertools
import json
import mmap
import os
import statistics
import sys
import threading
import time

import numpy as np

MADV_POPULATE_WRITE = 23
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong,
                                   ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.c_ulong]
libc.process_vm_writev.restype = ctypes.c_ssize_t


def chunks(n, parts, align=2 << 20):
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(o, min(step, n - o)) for o in range(0, n, step)]


def run_threads(work, ranges):
    errs = []

    def one(r):
        try:
            work(*r)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=one, args=(r,)) for r in ranges]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]


def fill_write(path, src, threads):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(src)
        done = 0
        while done < len(src):
            done += os.write(fd, mv[done:])
    finally:
        os.close(fd)


def fill_pwrite(path, src, threads):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    mv = memoryview(src)
    try:
        def work(off, n):
            done = 0
            while done < n:
                done += os.pwrite(fd, mv[off + done:off + n], off + done)
        run_threads(work, chunks(len(src), threads))
    finally:
        os.close(fd)


def fill_mmap(path, src, threads, copy="populate", alloc="fallocate", piece=2 << 20,
              turns=False):
    """copy: "populate" (MADV_POPULATE_WRITE, then a CPU copy), "fault" (a CPU copy, its faults
    taken one by one) or "kernel" (process_vm_writev); alloc: "fallocate" (blocks allocated
    ahead) or "ftruncate" (the file only made long: each fault allocates, delayed); turns: the
    threads take 16 MiB pieces in turn from a shared counter, each copied at once, as the
    engine's workers take a write's pieces (else each thread fills one range, 2 MiB at a
    time)."""
    vm = copy == "kernel"
    populate = copy == "populate"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if alloc == "ftruncate":
            # No block allocated ahead (unwritten extents would defeat ext4's write-out of a
            # replaced file at its rename); a fault that cannot get a block is the kernel
            # copy's EFAULT, but a CPU copy's SIGBUS.
            os.ftruncate(fd, len(src))
        else:
            os.posix_fallocate(fd, 0, len(src))
        m = mmap.mmap(fd, len(src), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    dst = np.frombuffer(m, dtype=np.uint8)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))

    src_base = src.ctypes.data
    pid = os.getpid()

    def work(off, n):
        for o in range(off, off + n, piece):
            k = min(piece, off + n - o)
            if vm:
                # The kernel's copy into the mapping (its faults taken as GUP's: an error is
                # an errno, never SIGBUS).
                local, remote = IoVec(src_base + o, k), IoVec(base + o, k)
                if libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1,
                                          0) != k:
                    e = ctypes.get_errno()
                    raise OSError(e, os.strerror(e))
                continue
            if populate and libc.madvise(base + o, k, MADV_POPULATE_WRITE) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
            np.copyto(dst[o:o + k], src[o:o + k])

    if turns:
        step = 16 << 20
        counter = itertools.count()
        pieces = -(-len(src) // step)

        def turn(_):
            while (i := next(counter)) < pieces:  # next() on a count is atomic under the GIL
                o = i * step
                np.copyto(dst[o:o + step], src[o:o + step])

    try:
        if turns:
            run_threads(turn, [(t,) for t in range(threads)])
        else:
            run_threads(work, chunks(len(src), threads))
    finally:
        del dst
        m.close()


def check(path, src):
    got = np.fromfile(path, dtype=np.uint8)
    return got.size == src.size and bool(np.array_equal(got, src))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=2)
    p.add_argument("--threads", default="1 4 8 16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--ways", help="the ways to measure besides one write(), which every row is "
                                  "against and is always measured, space-separated (default: all)")
    p.add_argument("--out")
    a = p.parse_args()
    n = int(a.gb * (1 << 30)) // (2 << 20) * (2 << 20)
    src = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    path = os.path.join(a.dir, f"gdirect-fill-{os.getpid()}.bin")
    ways = [("write", fill_write, [1])]
    ts = [int(t) for t in a.threads.split()]
    ways += [("pwrite", fill_pwrite, ts), ("mmap", fill_mmap, ts),
             ("mmap-nopopulate", lambda p_, s, t: fill_mmap(p_, s, t, copy="fault"), ts),
             ("mmap-vmwritev", lambda p_, s, t: fill_mmap(p_, s, t, "kernel", "ftruncate"), ts),
             ("mmap-ftruncate", lambda p_, s, t: fill_mmap(p_, s, t, "fault", "ftruncate"), ts),
             ("mmap-vmwritev-falloc", lambda p_, s, t: fill_mmap(p_, s, t, "kernel"), ts),
             ("mmap-turns", lambda p_, s, t: fill_mmap(p_, s, t, "fault", turns=True), ts)]
    if a.ways:
        pick = a.ways.split()
        unknown = set(pick) - {w[0] for w in ways}
        if unknown:
            p.error(f"--ways: unknown {' '.join(sorted(unknown))}")
        ways = [w for w in ways if w[0] in pick or w[0] == "write"]
    out = open(a.out, "a", buffering=1) if a.out else None
    fs = os.popen(f"findmnt -n -o FSTYPE --target {a.dir}").read().strip() or "unknown"
    meta = {"meta": {
        "command": "tests/bench/fill.py " + " ".join(sys.argv[1:]).replace(a.out or "\0", "OUT"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs, kernel {os.uname().release}", "fs": fs,
        "bytes": n}}
    print(json.dumps(meta), flush=True)
    if out:
        out.write(json.dumps(meta) + "\n")
    for name, fn, tlist in ways:
        for t in tlist:
            secs, ok = [], True
            for _ in range(a.rounds + 1):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                t0 = time.perf_counter()
                fn(path, src, t)
                secs.append(time.perf_counter() - t0)
                ok = ok and check(path, src)
            os.unlink(path)
            timed = secs[1:]
            r = {"way": name, "threads": t, "verified": ok,
                 "s_median": statistics.median(timed), "s_each": timed,
                 "gb_per_s": n / statistics.median(timed) / 1e9}
            print(json.dumps(r), flush=True)
            if out:
                out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
