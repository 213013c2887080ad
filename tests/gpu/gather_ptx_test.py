#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0 OR MIT
"""The gather kernel of `CudaBackend::copy_device_many` (GATHER_PTX in
userspace/gdirect/src/compat/cuda.rs), run without a GPU: a small interpreter of the PTX it
uses executes every thread of every block over tables of copies into poisoned memory, and each
destination must hold its source's bytes and every other byte its poison. Memory outside the
allocations, and a 16-byte access at an address 16 does not divide, fail the run, as they fault
on the GPU. Planted bugs in the PTX (a wrong stride, a wrong alignment test, a descriptor field
misread, the block stride dropped...) must each fail it. With `ptxas` on the PATH (or PTXAS=, which
must then be there: scripts/test names the one its virtual environment installs), the text is
also assembled for sm_70 and sm_90, as the driver's compiler does when it loads it.

Prints `gather_ptx: N passed, M failed`."""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "userspace/gdirect/src/compat/cuda.rs")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from tally import Tally  # noqa: E402
POISON = 0xA5


def kernel_text():
    s = open(SOURCE).read()
    start = s.index('const GATHER_PTX: &str = "\\\n') + len('const GATHER_PTX: &str = "\\\n')
    return s[start:s.index('\\0";', start)]


class Fault(Exception):
    pass


class Memory:
    """Global memory: allocations at addresses of their own; anything else faults."""

    def __init__(self):
        self.allocs = []  # (base, bytearray)
        self.next = 0x7F00_0000_0000

    def alloc(self, data):
        base = self.next
        self.allocs.append((base, bytearray(data)))
        self.next += (len(data) + 0xFFFF) // 0x10000 * 0x10000 + 0x10000
        return base

    def find(self, addr, n):
        for base, buf in self.allocs:
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base
        raise Fault(f"{n} bytes at {addr:#x}: outside every allocation")

    def load(self, addr, n):
        buf, off = self.find(addr, n)
        return int.from_bytes(buf[off:off + n], "little")

    def store(self, addr, n, value):
        buf, off = self.find(addr, n)
        buf[off:off + n] = (value & ((1 << (8 * n)) - 1)).to_bytes(n, "little")

    def bytes_at(self, base):
        return next(buf for b, buf in self.allocs if b == base)


def parse(ptx):
    """The entry's parameters, and its body as (predicate, opcode, operands) with labels'
    indices."""
    params = re.findall(r"\.param \.(u64|u32) (\w+)", ptx)
    body = ptx[ptx.index("{", ptx.index(".entry")) + 1:ptx.rindex("}")]
    code, labels = [], {}
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith(".reg"):
            continue
        if line.endswith(":"):
            labels[line[:-1]] = len(code)
            continue
        line = line.rstrip(";")
        pred = None
        if line.startswith("@"):
            pred, line = line.split(None, 1)
            pred = pred[1:]
        op, _, rest = line.partition(" ")
        ops = [o.strip() for o in re.findall(r"\s*(\{[^}]*\}|\[[^\]]*\]|[^,]+)", rest)]
        code.append((pred, op, ops))
    return [name for _, name in params], code, labels


def run(ptx, mem, args, grid, block, limit, counts=None):
    """Runs every thread of the launch (threads are independent: no shared memory, no
    barrier, disjoint destinations, so one after another is one of the GPU's orders)."""
    names, code, labels = parse(ptx)
    param = dict(zip(names, args))

    for b in range(grid):
        for t in range(block):
            special = {"%ctaid.x": b, "%nctaid.x": grid, "%tid.x": t, "%ntid.x": block}
            reg = {}

            def val(o):
                if o in special:
                    return special[o]
                if o.startswith("%"):
                    return reg[o]
                return int(o, 0)

            def addr(o):
                inner = o.strip("[]")
                m = re.fullmatch(r"(%\w+)(?:\+(\d+))?", inner)
                if m:
                    return reg[m.group(1)] + int(m.group(2) or 0)
                return inner

            pc, steps = 0, 0
            while True:
                steps += 1
                if steps > limit:
                    raise Fault(f"a thread ran {limit} instructions: it does not end")
                pred, op, o = code[pc]
                pc += 1
                if pred is not None and not reg[pred]:
                    continue
                if counts is not None:
                    counts[op] = counts.get(op, 0) + 1
                parts = op.split(".")
                width = 32 if op.endswith(("u32", "s32", "b32")) else 64
                mask = (1 << width) - 1
                if op == "ret":
                    break
                elif op == "bra":
                    pc = labels[o[0]]
                elif op.startswith("ld.param"):
                    reg[o[0]] = param[addr(o[1])]
                elif op == "cvta.to.global.u64" or op in ("mov.u32", "mov.u64"):
                    reg[o[0]] = val(o[1])
                elif op == "cvt.u64.u32":
                    reg[o[0]] = val(o[1]) & 0xFFFF_FFFF
                elif parts[0] == "setp":
                    a, c = val(o[1]), val(o[2])
                    if parts[2].startswith("s"):
                        sign = 1 << (width - 1)
                        a, c = (a ^ sign) - sign, (c ^ sign) - sign
                    reg[o[0]] = {"ge": a >= c, "gt": a > c, "le": a <= c, "lt": a < c, "ne": a != c,
                                 "eq": a == c}[parts[1]]
                elif op == "mul.wide.u32":
                    reg[o[0]] = (val(o[1]) & 0xFFFF_FFFF) * (val(o[2]) & 0xFFFF_FFFF)
                elif parts[0] in ("add", "or", "and", "shl"):
                    a, c = val(o[1]), val(o[2])
                    if parts[0] == "add":
                        r = a + c
                    elif parts[0] == "or":
                        r = a | c
                    elif parts[0] == "and":
                        r = a & c
                    else:
                        r = a << min(c, width)
                    reg[o[0]] = r & mask
                elif op == "ld.global.u64":
                    reg[o[0]] = mem.load(addr(o[1]), 8)
                elif op == "ld.global.u8":
                    reg[o[0]] = mem.load(addr(o[1]), 1)
                elif op == "st.global.u8":
                    mem.store(addr(o[0]), 1, val(o[1]))
                elif op in ("ld.global.v4.u32", "st.global.v4.u32"):
                    load = op.startswith("ld")
                    a = addr(o[1] if load else o[0])
                    if a % 16:
                        raise Fault(f"a 16-byte {'load' if load else 'store'} at {a:#x}: misaligned")
                    words = [x.strip() for x in (o[0] if load else o[1]).strip("{}").split(",")]
                    for i, w in enumerate(words):
                        if load:
                            reg[w] = mem.load(a + 4 * i, 4)
                        else:
                            mem.store(a + 4 * i, 4, reg[w])
                else:
                    raise Fault(f"an instruction this interpreter does not know: {op}")


def gather(ptx, copies, src_len, dst_len, grid, block, seed, counts=None):
    """Runs the kernel over `copies` ((dst offset, src offset, length)) between two
    allocations; returns (destination bytes, expected bytes)."""
    rng = random.Random(seed)
    mem = Memory()
    src = mem.alloc(bytes(rng.randrange(256) for _ in range(src_len)))
    dst = mem.alloc(bytes([POISON]) * dst_len)
    table = b"".join(
        (dst + d).to_bytes(8, "little") + (src + s).to_bytes(8, "little") + n.to_bytes(8, "little")
        for d, s, n in copies)
    descs = mem.alloc(table) if table else mem.alloc(b"\0" * 24)
    # A thread that copied every byte alone would run about 8 instructions a byte.
    limit = 20 * (sum(n for _, _, n in copies) + 100 * len(copies)) + 1000
    run(ptx, mem, [descs, len(copies)], grid, block, limit, counts)
    want = bytearray([POISON]) * dst_len
    source = mem.bytes_at(src)
    for d, s, n in copies:
        want[d:d + n] = source[s:s + n]
    return bytes(mem.bytes_at(dst)), bytes(want)


def random_copies(rng, dst_len, src_len, count, aligned_share):
    copies, at = [], 0
    for _ in range(count):
        n = rng.choice([0, 1, 3, 8, 15, 16, 17, 24, 31, 32, 40, 48, 100, 255, 256, 257, 700])
        if rng.random() < aligned_share:
            at = -(-at // 16) * 16
            n = n // 16 * 16
            s = rng.randrange(0, src_len - n + 1) // 16 * 16
        else:
            s = rng.randrange(0, src_len - n + 1)
        if at + n > dst_len:
            break
        copies.append((at, s, n))
        at += n + rng.randrange(0, 20)
    return copies


def main():
    tally = Tally("gather_ptx")
    expect = tally.check

    ptx = kernel_text()
    rng = random.Random(31)

    # Every copy lands, nothing else changes: few blocks (each takes many descriptors in
    # turn), as many blocks as copies, odd and full thread counts; unaligned and aligned.
    for grid, block, share in [(1, 1, 0.0), (3, 7, 0.3), (5, 32, 0.5), (64, 4, 1.0), (2, 256, 0.3)]:
        copies = random_copies(rng, 6000, 4000, 40, share)
        counts = {}
        got, want = gather(ptx, copies, 4000, 6000, min(grid, max(len(copies), 1)), block,
                           rng.randrange(1 << 30), counts)
        diff = next((i for i in range(len(want)) if got[i] != want[i]), None)
        expect(f"{len(copies)} copies, {grid} blocks of {block} threads, {share:.0%} aligned",
               diff is None, f"first wrong byte at {diff}")
        words = sum(1 for d, s, n in copies if n and (d | s | n) % 16 == 0)
        if share == 1.0:
            expect("aligned copies move 16-byte words, no single bytes",
                   counts.get("ld.global.v4.u32", 0) > 0 and counts.get("ld.global.u8", 0) == 0,
                   str(counts))
        elif words == 0:
            expect("unaligned copies move single bytes", counts.get("ld.global.v4.u32", 0) == 0)

    # The allocations' addresses themselves misaligned for words: bytes, no fault.
    got, want = gather(ptx, [(1, 3, 64), (80, 16, 32)], 200, 200, 2, 8, 5)
    expect("a copy whose addresses 16 does not divide moves bytes, no fault", got == want)
    # No copies: nothing runs past the table.
    got, want = gather(ptx, [], 64, 64, 1, 32, 6)
    expect("no copies: nothing written", got == want)

    # Planted bugs: each must be seen.
    plants = {
        "the byte loop's stride is the thread's index": ("add.s64 %rd9, %rd9, %rd3;\n\tbra $L_byte",
                                                         "add.s64 %rd9, %rd9, %rd2;\n\tbra $L_byte"),
        "words where 8 divides the addresses": ("and.b64 %rd8, %rd8, 15", "and.b64 %rd8, %rd8, 7"),
        "the length read from the source's field": ("[%rd4+16]", "[%rd4+8]"),
        "blocks take only their first descriptor": ("add.s32 %r2, %r2, %r3", "add.s32 %r2, %r1, %r3"),
        "words start at the thread's index times 8": ("shl.b64 %rd9, %rd2, 4", "shl.b64 %rd9, %rd2, 3"),
        "the words' loop runs one word past the end": (
            "setp.ge.u64 %p3, %rd9, %rd7;\n\t@%p3 bra $L_next;\n\tadd.s64 %rd11, %rd6, %rd9;\n"
            "\tadd.s64 %rd12, %rd5, %rd9;\n\tld.global.v4",
            "setp.gt.u64 %p3, %rd9, %rd7;\n\t@%p3 bra $L_next;\n\tadd.s64 %rd11, %rd6, %rd9;\n"
            "\tadd.s64 %rd12, %rd5, %rd9;\n\tld.global.v4"),
    }
    copies = random_copies(random.Random(8), 6000, 4000, 16, 0.4)
    # (and some whose addresses and length 8 divides, 16 not)
    copies.append((copies[-1][0] + copies[-1][2] + 8 + (-(copies[-1][0] + copies[-1][2])) % 16,
                   24, 40))
    for name, (old, new) in plants.items():
        assert ptx.count(old) == 1, old
        bad = ptx.replace(old, new)
        try:
            got, want = gather(bad, copies, 4000, 6000, 3, 8, 9)
            seen = got != want
        except Fault:
            seen = True
        expect(f"planted: {name}", seen)

    # The driver's compiler takes it (where ptxas is here).
    ptxas = os.environ.get("PTXAS")
    if ptxas is not None:
        # Named (scripts/test names the one its virtual environment installs): it must be there.
        expect(f"ptxas at {ptxas!r}", os.access(ptxas, os.X_OK))
    ptxas = ptxas or shutil.which("ptxas")
    if ptxas and os.access(ptxas, os.X_OK):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "gather.ptx")
            open(path, "w").write(ptx)
            for arch in ("sm_70", "sm_90"):
                r = subprocess.run([ptxas, f"-arch={arch}", path, "-o", os.path.join(d, "g.cubin")],
                                   capture_output=True, text=True)
                expect(f"ptxas assembles it for {arch}", r.returncode == 0, r.stderr[-500:])
    else:
        print("(no ptxas here: the text is assembled by the driver on the H200 run)")

    return tally.summary()


if __name__ == "__main__":
    sys.exit(main())
