#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The host's reader of QEMU's NVMe DMA trace (dma_trace.py), on made-up traces in QEMU's own
line formats: raw addresses judged by the BAR, and in the IOMMU rig IOVAs judged by the first
translation of an NVMe controller after their map_addr line (not an earlier one of the same
IOVA, not another device's), untranslated addresses and the IOMMU's faults counted.
Prints "ok - ..." / "not ok - ..." lines and "dma_trace: N passed, N failed"."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import dma_trace  # noqa: E402
from tally import Tally  # noqa: E402

BAR, BAR_SIZE = 0xE0000000, 0x10000000
NVME = (3, 0, 0)
tally = Tally("dma_trace")


def expect(what, got, want):
    tally.check(what, got == want, f"got {got!r}, want {want!r}")


def trace(lines):
    f = tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False)
    f.write("".join(line + "\n" for line in lines))
    f.close()
    return f.name


def kv(text):
    return dict((k, int(v)) for k, v in (p.split("=") for p in text.split()))


READ = "pci_nvme_io_cmd cid 1 nsid 0x1 sqid 1 opc 0x2 opname 'NVME_NVM_CMD_READ'"
WRITE = "pci_nvme_io_cmd cid 2 nsid 0x1 sqid 1 opc 0x1 opname 'NVME_NVM_CMD_WRITE'"


def translate(dev, iova, gpa, mask=0xFFF):
    return f"vtd_dmar_translate dev {dev[0]:02x}:{dev[1]:02x}.{dev[2]:02x} iova 0x{iova:x} -> gpa 0x{gpa:x} mask 0x{mask:x}"


def main():
    # Without an IOMMU: the mapped address itself.
    t = trace([
        READ,
        f"pci_nvme_map_addr addr 0x{BAR + 0x1000:x} len 4096",
        "pci_nvme_map_addr addr 0x1000 len 8192",
        WRITE,
        f"pci_nvme_map_addr addr 0x{BAR:x} len 512",
        "pci_nvme_map_addr addr 0x2000 len 4096",
        "pci_nvme_map_addr_cmb addr 0x2000 len 4096",
    ])
    r = kv(dma_trace.since(t, 0, BAR, BAR_SIZE))
    expect("raw: a read into the BAR and one into RAM", (r["bar_read"], r["ram_read"]), (4096, 8192))
    expect("raw: a write from the BAR, one from the CMB", (r["bar_write"], r["ram_write"], r["cmb_write"]), (512, 0, 4096))
    expect("raw: no IOMMU keys", "untranslated" in r or "faults" in r, False)
    expect("raw: since a mark leaves out the lines before it",
           kv(dma_trace.since(t, 3, BAR, BAR_SIZE))["bar_read"], 0)
    os.unlink(t)

    # The IOMMU rig: IOVAs, judged by their translations.
    t = trace([
        # An earlier use of the IOVA 0xfffc0000 (into the BAR), before this command mapped it.
        translate(NVME, 0xFFFC0000, BAR + 0x50000),
        READ,
        "pci_nvme_map_addr addr 0xfffc0000 len 4096",  # now into RAM
        "pci_nvme_map_addr addr 0xfffd0800 len 2048",  # into the BAR, mid-page
        "pci_nvme_map_addr addr 0xfffe0000 len 4096",  # never translated
        "pci_nvme_map_addr addr 0xff100000 len 4096",  # inside a 2 MiB translation
        # Another device's translation of the same IOVA: not the NVMe's.
        translate((5, 0, 0), 0xFFFD0000, 0x9000),
        translate(NVME, 0xFFFC0000, 0x7000),
        translate(NVME, 0xFFFD0000, BAR + 0x20000),
        translate(NVME, 0xFF000000, BAR + 0x200000, 0x1FFFFF),
        "vtd_dmar_fault sid 0x300 fault 6 addr 0xfffe0000 write 1",
        "vtd_fault_disabled Fault processing disabled for context entry",
        WRITE,
        "pci_nvme_map_addr addr 0xfffa0000 len 4096",
        translate(NVME, 0xFFFA0000, BAR),
    ])
    r = kv(dma_trace.since(t, 0, BAR, BAR_SIZE, {NVME}))
    expect("iommu: judged by the translation after the map, not an earlier one", r["ram_read"], 4096)
    expect("iommu: a mid-page address and a 2 MiB translation into the BAR", r["bar_read"], 2048 + 4096)
    expect("iommu: another device's translation of the IOVA is not the NVMe's", r["ram_read"] + r["bar_read"], 4096 + 6144)
    expect("iommu: an address never translated", r["untranslated"], 4096)
    expect("iommu: both kinds of fault", r["faults"], 2)
    expect("iommu: a write from the BAR", (r["bar_write"], r["ram_write"]), (4096, 0))
    expect("iommu: the whole trace's faults", dma_trace.faults(t), 2)
    without = kv(dma_trace.since(t, 0, BAR, BAR_SIZE, set()))
    expect("iommu: with no NVMe known, nothing is translated", without["untranslated"], 4096 * 4 + 2048)
    # The command line as scripts/vm calls it (no QMP here: the raw form).
    out = subprocess.run([sys.executable, os.path.join(HERE, "dma_trace.py"), "faults", t],
                         capture_output=True, text=True).stdout.strip()
    expect("the faults command", out, "2")
    os.unlink(t)

    # Frees against outstanding commands: the emulated GPU's marks (a free, then its pages).
    def free(n, pages):
        return [f"memory_region_ops_write cpu 0 mr 0x55 addr 0xfe200000 value 0x4652{n:04x} size 4 name 'ivshmem-mmio'"] + [
            f"memory_region_ops_write cpu 0 mr 0x55 addr 0xfe200000 value 0x5047{p:04x} size 4 name 'ivshmem-mmio'"
            for p in pages]

    def done(cid, q=1):
        return f"pci_nvme_enqueue_req_completion cid {cid} cqid {q} dw0 0x0 dw1 0x0 status 0x0"

    page = 0x10000
    read = lambda cid, q=1: f"pci_nvme_io_cmd cid {cid} nsid 0x4 sqid {q} opc 0x2 opname 'NVME_NVM_CMD_READ'"
    t = trace(
        free(0, [3])  # before any command: raced nothing
        + [read(7), f"pci_nvme_map_addr addr 0x{BAR + 3 * page + 0x800:x} len 4096"]
        + free(1, [3, 4])  # while cid 7 reads into page 3: under DMA into its pages
        + free(2, [9])  # while cid 7 reads, but into another page: under DMA, not into its pages
        + [done(7)]
        + free(3, [3])  # after the completion: raced nothing
        + [read(8), "pci_nvme_map_addr addr 0x4000 len 4096"]  # a read into RAM (a bounce)
        + free(4, [3])  # under DMA, none into the BAR
        + [done(8),
           "memory_region_ops_write cpu 0 mr 0x55 addr 0xfe200000 value 0x4652 size 4 name 'other'",
           "memory_region_ops_write cpu 0 mr 0x55 addr 0xfe20000c value 0x46520009 size 4 name 'ivshmem-mmio-x'"]
    )
    r = kv(dma_trace.frees(t, 0, BAR, BAR_SIZE))
    expect("frees: every free mark, nothing else", r["frees"], 5)
    expect("frees: only the free of a page under outstanding DMA into it", r["during_bar_dma"], 1)
    expect("frees: under any outstanding data command", r["during_dma"], 3)
    expect("frees: commands with data in the BAR", r["bar_commands"], 1)
    expect("frees: since a mark", kv(dma_trace.frees(t, 2, BAR, BAR_SIZE))["frees"], 4)
    os.unlink(t)
    # A command never completed stays outstanding; a cid outstanding twice at once (two
    # controllers: the trace does not say which) is no evidence.
    t = trace([read(1), f"pci_nvme_map_addr addr 0x{BAR:x} len 4096"] + free(0, [0])
              + [read(2, 2), f"pci_nvme_map_addr addr 0x{BAR + page:x} len 4096",
                 read(2, 2), "pci_nvme_map_addr addr 0x8000 len 4096"] + free(1, [1]) + [done(2, 2)])
    r = kv(dma_trace.frees(t, 0, BAR, BAR_SIZE))
    expect("frees: under a command not yet completed", r["during_bar_dma"], 1)
    expect("frees: a cid outstanding twice is left out", (r["ambiguous"], r["during_dma"]), (2, 2))
    os.unlink(t)
    # The IOMMU rig: a command's pages known from its translations, after the free even.
    t = trace([read(1), "pci_nvme_map_addr addr 0xfffc0000 len 4096"] + free(0, [5])
              + [translate(NVME, 0xFFFC0000, BAR + 5 * page), done(1)])
    r = kv(dma_trace.frees(t, 0, BAR, BAR_SIZE, {NVME}))
    expect("frees, iommu: pages judged by the translation", (r["during_bar_dma"], r["bar_commands"]), (1, 1))
    os.unlink(t)

    return tally.summary()


if __name__ == "__main__":
    sys.exit(main())
