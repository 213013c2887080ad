# SPDX-License-Identifier: GPL-2.0 OR MIT
"""Where a warm read's time goes (issue 31, item 6): the two stages of the compat engine's
buffered read into GPU memory, measured apart and together, on a CUDA machine.

  memcpy  T threads each copy blocks of the file's bytes, held in the process's memory, into
          pinned buffers of their own (numpy, the GIL released): what the host's memory gives
          a CPU copy at T threads, without the page cache and the system call.
  copy    T threads each read blocks of the warm file (os.preadv) into pinned buffers of their
          own: the CPU's copy out of the page cache, the engine workers' half.
  dma     the same pinned buffers copied into GPU memory on T streams, T copies queued at a
          time: the GPU's host-to-device DMA alone, the other half.
  both    the two at once: copy's threads while one more thread keeps dma's copies going
          (rounds of one copy per stream, out of each thread's other pinned buffer): each
          half's rate while the other takes its share of the host's memory. The engine's
          pipeline runs both halves at once, so its rate is bound by the lower of the two.

Each run moves the whole file once (thread i takes blocks i, i + T, ...); a figure is the
median of --runs runs after one warm-up run. Every stage's bytes are verified after its time
is taken: each thread's last block (host and, for dma and both, GPU memory, poisoned before
each run) against the file's bytes at its offset.

The engine's warm rate (`gdirect bench FILE --threads T`) is bound by the lower of both's two
rates: a rate above it is out of reach of a buffered read; memcpy against copy says what the
page cache and the system call cost over the host memory's own copy rate.

Usage: python3 tests/bench/stages.py FILE [--threads "4 16 32"] [--block 2M] [--runs 3]
       [--stages memcpy,copy,dma,both] [--out results.jsonl]
Without CUDA (torch with a GPU), only memcpy and copy run, in unpinned memory.
"""
import argparse
import os
import statistics
import sys
import threading
import time

import jsonl_out


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * units[s[-1]] if s and s[-1] in units else int(s)


class Memory:
    """Pinned host buffers and GPU memory through torch, or plain host memory without it."""

    def __init__(self):
        try:
            import torch

            self.torch = torch if torch.cuda.is_available() else None
        except ImportError:
            self.torch = None
        import numpy

        self.np = numpy

    @property
    def cuda(self):
        return self.torch is not None

    def host(self, n):
        """(handle, numpy view) of n bytes of host memory: pinned where CUDA is."""
        if self.torch:
            t = self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)
            return t, t.numpy()
        a = self.np.empty(n, dtype=self.np.uint8)
        return a, a


def blocks_of(size, block, threads, i):
    return range(i * block, size - block + 1, threads * block)


def run_threads(threads, body):
    """Runs body(i) on `threads` threads started together: the seconds from start to the last
    end, and each thread's result (an exception raised in one is raised here)."""
    go = threading.Barrier(threads + 1)
    out, errors = [None] * threads, []

    def one(i):
        go.wait()
        try:
            out[i] = body(i)
        except BaseException as e:  # noqa: BLE001 -- re-raised below, in the caller
            errors.append(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return secs, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--threads", default="4 16 32")
    ap.add_argument("--block", type=size_arg, default=2 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stages", default="memcpy,copy,dma,both")
    ap.add_argument("--out")
    a = ap.parse_args()
    mem = Memory()
    stages = [s for s in a.stages.split(",") if s]
    for s in stages:
        if s not in ("memcpy", "copy", "dma", "both"):
            sys.exit(f"stages.py: unknown stage {s}")
    if not mem.cuda:
        stages = [s for s in stages if s in ("memcpy", "copy")]
    fd = os.open(a.file, os.O_RDONLY)
    size = os.fstat(fd).st_size // a.block * a.block
    if size < a.block:
        sys.exit(f"stages.py: {a.file} holds less than one block of {a.block} bytes")
    # Warm: the file's pages in the page cache before anything is timed.
    with open(a.file, "rb") as f:
        while f.read(16 << 20):
            pass
    torch = mem.torch
    # memcpy's source: the file's bytes in (unpinned) memory of the process.
    src = mem.np.fromfile(a.file, dtype=mem.np.uint8, count=size) if "memcpy" in stages else None
    gpu = torch.cuda.get_device_name(0) if torch else "none"
    emit = jsonl_out.emitter(a.out)

    emit({"meta": {"command": "tests/bench/stages.py FILE " + " ".join(sys.argv[2:]),
                   "date": jsonl_out.now(),
                   "commit": os.environ.get("GDIRECT_COMMIT", "unknown"),
                   "machine": f"{os.cpu_count()} CPUs", "gpu": gpu, "file_bytes": size,
                   "block": a.block}})
    B = a.block
    for threads in [int(t) for t in a.threads.split()]:
        # Two pinned buffers per thread (the engine's 4 MiB of staging at 2 MiB blocks).
        bufs = [[mem.host(B), mem.host(B)] for _ in range(threads)]
        if torch:
            dev = torch.empty(threads * B, dtype=torch.uint8, device="cuda:0")
            streams = [torch.cuda.Stream() for _ in range(threads)]
        for stage in stages:
            rates, dma_rates = [], []
            for run in range(a.runs + 1):
                if torch:
                    dev.fill_(0xA5)
                    torch.cuda.synchronize()
                # Each thread's last block's offset in the file (host buffer 0), and the offset
                # of the bytes its GPU slot must hold (from host buffer 1, for dma and both).
                last, slot_off = [None] * threads, [None] * threads
                if stage in ("dma", "both"):
                    # Buffer 1 of each thread holds file bytes at a known offset (outside the time).
                    for i in range(threads):
                        slot_off[i] = (i * B) % size
                        os.preadv(fd, [bufs[i][1][1]], slot_off[i])
                stop = threading.Event()
                dma = {"bytes": 0, "secs": 0.0}

                def dma_rounds(limit=None):
                    """Copies buffer 1 of every thread to its GPU slot, one copy per stream a
                    round, until `stop` (or `limit` rounds): bytes and seconds into dma."""
                    torch.cuda.synchronize()
                    t0, rounds = time.perf_counter(), 0
                    while not stop.is_set() and (limit is None or rounds < limit):
                        for i in range(threads):
                            with torch.cuda.stream(streams[i]):
                                dev[i * B:(i + 1) * B].copy_(bufs[i][1][0], non_blocking=True)
                        torch.cuda.synchronize()
                        rounds += 1
                    dma["secs"] = time.perf_counter() - t0
                    dma["bytes"] = rounds * threads * B

                def body(i):
                    (_, x), _ = bufs[i]
                    off = None
                    for off in blocks_of(size, B, threads, i):
                        if stage == "memcpy":
                            mem.np.copyto(x, src[off:off + B])
                        elif os.preadv(fd, [x], off) != B:
                            raise RuntimeError(f"short read at {off}")
                    last[i] = off

                moved = sum(len(blocks_of(size, B, threads, i)) * B for i in range(threads))
                if stage == "dma":
                    dma_rounds(limit=moved // (threads * B))
                    secs = dma["secs"]
                else:
                    mover = None
                    if stage == "both":
                        mover = threading.Thread(target=dma_rounds)
                        mover.start()
                        time.sleep(0.01)  # its first round under way
                    try:
                        secs, _ = run_threads(threads, body)
                    finally:
                        stop.set()
                        if mover:
                            mover.join()
                # Verified outside the time.
                for i in range(threads):
                    if last[i] is not None and bufs[i][0][1].tobytes() != os.pread(fd, B, last[i]):
                        sys.exit(f"stages.py: {stage} t{threads}: thread {i}'s buffer is not the file's bytes at {last[i]}")
                    if slot_off[i] is not None:
                        got = dev[i * B:(i + 1) * B].cpu().numpy().tobytes()
                        if got != os.pread(fd, B, slot_off[i]):
                            sys.exit(f"stages.py: {stage} t{threads}: GPU slot {i} is not the file's bytes at {slot_off[i]}")
                if run > 0:
                    if stage == "dma":
                        rates.append(dma["bytes"] / secs / 1e9)
                    else:
                        rates.append(moved / secs / 1e9)
                    if stage == "both":
                        dma_rates.append(dma["bytes"] / dma["secs"] / 1e9)
            rec = {"stage": stage, "threads": threads, "block": B, "pinned": mem.cuda,
                   "median_gb_per_s": round(statistics.median(rates), 2),
                   "runs_gb_per_s": [round(r, 2) for r in rates]}
            if dma_rates:
                # both: median_gb_per_s is the copy's rate while the DMA ran, this the DMA's.
                rec["dma_median_gb_per_s"] = round(statistics.median(dma_rates), 2)
                rec["dma_runs_gb_per_s"] = [round(r, 2) for r in dma_rates]
            rec["verified"] = True
            emit(rec)
        del bufs
    os.close(fd)


if __name__ == "__main__":
    main()
