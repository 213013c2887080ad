#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The host's view of the emulated GPU's memory: bytes at a GPU virtual address.

The emulated GPU (tests/egpu) scatters an allocation's 64 KiB pages over its BAR2 and keeps,
in BAR2's last page, the page directory that says where each GPU virtual page is
(tests/egpu/gdirect_egpu.h, EGPU_PAGEDIR_*). BAR2 is the host's /dev/shm backing file, so the
host follows the directory itself, without asking the guest where the bytes are.

Usage (scripts/vm's host-check channel):
  gpu_mem.py compare SHM LEN A B    A, B: gva:VA (a GPU virtual address) or FILE:OFFSET
  gpu_mem.py sha256 SHM LEN A HEX
Prints "OK", or "FAIL <why>" (the first differing byte).
"""

import hashlib
import struct
import sys

PAGE = 0x10000  # EGPU_PAGE_SIZE
VA_BASE = 0x7E0000000000  # EGPU_VA_BASE
MAGIC = 0x3152494455504745  # EGPU_PAGEDIR_MAGIC ("EGPUDIR1")
HEADER = 16  # EGPU_PAGEDIR_HEADER


class Fail(Exception):
    pass


def directory(shm):
    """The BAR page offset of each GPU virtual page (None where unmapped)."""
    with open(shm, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(size - PAGE)
        page = f.read(PAGE)
    if len(page) != PAGE:
        raise Fail(f"the GPU's backing file is too small ({size} bytes)")
    magic, entries = struct.unpack_from("<QI", page, 0)
    if magic != MAGIC:
        raise Fail(f"no page directory in the GPU's BAR (magic {magic:#x}): emulated GPU not loaded?")
    if entries > (PAGE - HEADER) // 4:
        raise Fail(f"page directory of {entries} entries: corrupt")
    table = struct.unpack_from(f"<{entries}I", page, HEADER)
    last = size // PAGE - 1  # the directory's own page
    if any(e > last for e in table):
        raise Fail("page directory names a page past the BAR's end: corrupt")
    return [(e - 1) * PAGE if e else None for e in table]


def reader(spec, shm, length):
    """A function returning the LEN bytes of SPEC, in pieces."""
    name, _, at = spec.rpartition(":")
    try:
        offset = int(at, 0)
    except ValueError:
        raise Fail(f"bad address {spec!r}")
    if name == "gva":
        pages = directory(shm)
        first = offset - VA_BASE
        if first < 0 or first + length > len(pages) * PAGE:
            raise Fail(f"{spec}: outside the GPU's virtual space")
        out = bytearray()
        with open(shm, "rb") as f:
            at = first
            while at < first + length:
                page = pages[at // PAGE]
                if page is None:
                    raise Fail(f"GPU virtual page {VA_BASE + at - at % PAGE:#x} is not mapped (freed?)")
                n = min(PAGE - at % PAGE, first + length - at)
                f.seek(page + at % PAGE)
                piece = f.read(n)
                if len(piece) != n:
                    raise Fail(f"the GPU's backing file ends inside page {page:#x}")
                out += piece
                at += n
        return bytes(out)
    with open(name, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise Fail(f"{spec}: only {len(data)} of {length} bytes")
    return data


def main(argv):
    try:
        if len(argv) == 6 and argv[1] == "compare":
            shm, length = argv[2], int(argv[3])
            a, b = reader(argv[4], shm, length), reader(argv[5], shm, length)
            if a != b:
                at = next(i for i in range(length) if a[i] != b[i])
                raise Fail(f"differ: byte {at} ({a[at]:#04x} vs {b[at]:#04x})")
        elif len(argv) == 6 and argv[1] == "sha256":
            shm, length = argv[2], int(argv[3])
            got = hashlib.sha256(reader(argv[4], shm, length)).hexdigest()
            if got != argv[5]:
                raise Fail(f"sha256 {got}")
        else:
            print("FAIL usage: gpu_mem.py compare SHM LEN A B | sha256 SHM LEN A HEX")
            return 2
    except (Fail, OSError, ValueError, struct.error) as e:
        print(f"FAIL {e}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
