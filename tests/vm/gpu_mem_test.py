#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The host's reader of emulated GPU memory (gpu_mem.py), on a made-up BAR: it follows the page
directory to scattered pages, and reports FAIL for a flipped byte, a wrong order of pages, an
unmapped page, a range past the virtual space and a BAR without a directory.
Prints "ok - ..." / "not ok - ..." lines and "gpu_mem: N passed, N failed"."""

import hashlib
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "gpu_mem.py")
PAGE = 0x10000
VA_BASE = 0x7E0000000000
PAGES = 16  # a 1 MiB BAR: 15 usable pages and the directory
sys.path.insert(0, os.path.dirname(HERE))
from tally import Tally  # noqa: E402

tally = Tally("gpu_mem")


def run(*args):
    out = subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True, text=True)
    return out.stdout.strip()


def expect(what, got, want_ok):
    tally.check(what, got.startswith("OK") if want_ok else got.startswith("FAIL"), repr(got))


def bar(entries, magic=0x3152494455504745):
    """A BAR whose page p holds bytes (p * 7 + i) & 0xff, with a directory of `entries`."""
    data = bytearray()
    for p in range(PAGES - 1):
        data += bytes(((p * 7 + i) & 0xFF) for i in range(PAGE))
    directory = bytearray(PAGE)
    struct.pack_into("<QII", directory, 0, magic, PAGES - 1, 0)
    for v, page in enumerate(entries):
        struct.pack_into("<I", directory, 16 + 4 * v, 0 if page is None else page + 1)
    return bytes(data + directory)


with tempfile.TemporaryDirectory() as tmp:
    shm, ref = os.path.join(tmp, "shm"), os.path.join(tmp, "ref")
    # GPU virtual pages 0, 1, 2 backed by BAR pages 9, 2, 5.
    image = bar([9, 2, 5])
    with open(shm, "wb") as f:
        f.write(image)
    want = image[9 * PAGE : 10 * PAGE] + image[2 * PAGE : 3 * PAGE] + image[5 * PAGE : 6 * PAGE]
    with open(ref, "wb") as f:
        f.write(b"\0" * 100 + want)
    expect("three scattered pages equal the reference", run("compare", shm, 3 * PAGE, f"gva:{VA_BASE}", f"{ref}:100"), True)
    expect("across a page boundary, from the middle of a page",
           run("compare", shm, PAGE, f"gva:{VA_BASE + PAGE // 2}", f"{ref}:{100 + PAGE // 2}"), True)
    expect("either side may be the GPU", run("compare", shm, 3 * PAGE, f"{ref}:100", f"gva:{VA_BASE}"), True)
    expect("the reference one byte off: FAIL", run("compare", shm, 3 * PAGE, f"gva:{VA_BASE}", f"{ref}:101"), False)
    # The bytes as one run from the first page's place: what a reader that ignored the
    # directory would compare.
    expect("the pages read as one run of the BAR: FAIL", run("compare", shm, 3 * PAGE, f"{shm}:{9 * PAGE}", f"{ref}:100"), False)
    with open(os.path.join(tmp, "flip"), "wb") as f:
        flipped = bytearray(want)
        flipped[PAGE + 1234] ^= 1
        f.write(flipped)
    got = run("compare", shm, 3 * PAGE, f"gva:{VA_BASE}", f"{tmp}/flip:0")
    expect("one flipped byte in the second page: FAIL", got, False)
    expect("... naming the byte that differs", "OK" if f"byte {PAGE + 1234} " in got else got, True)
    expect("a page not mapped (freed): FAIL", run("compare", shm, 4 * PAGE, f"gva:{VA_BASE}", f"{ref}:100"), False)
    expect("past the virtual space: FAIL", run("compare", shm, PAGE, f"gva:{VA_BASE + 15 * PAGE}", f"{ref}:0"), False)
    expect("below it: FAIL", run("compare", shm, PAGE, f"gva:{VA_BASE - PAGE}", f"{ref}:0"), False)
    expect("sha256 of scattered pages", run("sha256", shm, 3 * PAGE, f"gva:{VA_BASE}", hashlib.sha256(want).hexdigest()), True)
    expect("a wrong sha256: FAIL", run("sha256", shm, 3 * PAGE, f"gva:{VA_BASE}", "0" * 64), False)
    with open(shm, "wb") as f:
        f.write(bar([9, 2, 15]))
    expect("a directory entry past the BAR's end: FAIL", run("compare", shm, PAGE, f"gva:{VA_BASE}", f"{ref}:100"), False)
    with open(shm, "wb") as f:
        f.write(bar([9, 2, 5], magic=0))
    expect("no page directory (GPU not loaded): FAIL", run("compare", shm, PAGE, f"gva:{VA_BASE}", f"{ref}:100"), False)

sys.exit(tally.summary())
