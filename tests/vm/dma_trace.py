#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Where the emulated NVMe controllers' DMA went, from QEMU's own trace (host side of the rig).

scripts/vm starts QEMU with the trace events pci_nvme_admin_cmd, pci_nvme_io_cmd,
pci_nvme_map_addr and pci_nvme_map_addr_cmb written to a file (Debian's QEMU has the `log`
trace backend). Every data address an emulated NVMe controller maps for a command is one
pci_nvme_map_addr line, logged right after the command's pci_nvme_io_cmd line (the device
model runs under QEMU's big lock, so the lines of one command are not interleaved with
another's). The emulated GPU's BAR2 is found with QMP `query-pci`, not from the guest.

In the IOMMU rig (scripts/vm --iommu) the addresses a controller maps are IOVAs: the trace also
has vtd_dmar_translate (each translation QEMU's intel-iommu makes: device, IOVA page, guest
physical page) and vtd_dmar_fault. A mapped address is then judged by where it was translated
to: the first translation of an NVMe controller (by its bus, slot and function in query-pci)
covering it, after its map_addr line. One never translated (the command failed first, or its
DMA faulted) counts as `untranslated`; `faults` counts the IOMMU's DMA faults
(vtd_dmar_fault, and vtd_fault_disabled: a fault of a context whose reports are off).

  dma_trace.py bar QMP_SOCKET              print "START SIZE" of the emulated GPU's BAR2
  dma_trace.py lines TRACE                 print the trace's line count (a mark)
  dma_trace.py since TRACE MARK START SIZE [QMP_SOCKET]
                                           print the bytes mapped since line MARK, per
                                           direction (read: device to memory) and target:
                                           bar_read ram_read cmb_read bar_write ram_write
                                           cmb_write other (admin commands, not data)
                                           untranslated faults (the IOMMU rig)
  dma_trace.py faults TRACE                print the IOMMU's DMA faults in the whole trace
  dma_trace.py frees TRACE MARK START SIZE [QMP_SOCKET]
                                           print, since line MARK: frees (the emulated GPU's
                                           marks of frees that revoked page tables),
                                           during_bar_dma (those that began while an NVMe
                                           command moving data to or from a page they free
                                           was outstanding: submitted, its completion not
                                           yet queued), during_dma (while any data command
                                           was: a bounced read's DMA goes to host memory),
                                           bar_commands (commands with data in the BAR) and
                                           ambiguous (commands left out: their cid and queue
                                           were outstanding twice at once, on two
                                           controllers)

Races: scripts/vm also traces pci_nvme_enqueue_req_completion (a command's completion, by cid
and queue), and around a race test it switches on memory_region_ops_write (every MMIO write
the device models take), in which the emulated GPU's driver (tests/egpu) leaves a mark at the
start of each free that revokes page tables: it writes FREE_MARK | n to ivshmem's IntrMask
register, then PAGE_MARK | page for each page it frees. Lines are in the order QEMU made them,
so a free's mark between a command's submission and its completion line shows the free began
while that command's DMA was outstanding.
"""
import re
import sys

from qmp import execute


def qmp(path, command):
    return execute(path, command)["return"]


def devices(buses):
    for bus in buses:
        for dev in bus.get("devices", []):
            yield dev
            bridge = dev.get("pci_bridge")
            if bridge:
                yield from devices([{"devices": bridge.get("devices", [])}])


def gpu_bar(path):
    for dev in devices(qmp(path, "query-pci")):
        if dev["id"]["vendor"] == 0x1AF4 and dev["id"]["device"] == 0x1110:
            for r in dev["regions"]:
                if r["bar"] == 2:
                    return r["address"], r["size"]
    raise SystemExit("no emulated GPU (1af4:1110) with a BAR2 in query-pci")


def nvme_functions(path):
    """(bus, slot, function) of every NVMe controller (class 0x0108), from query-pci."""
    return {
        (dev["bus"], dev["slot"], dev["function"])
        for dev in devices(qmp(path, "query-pci"))
        if dev["class_info"]["class"] == 0x0108
    }


TRANSLATE = re.compile(r"dev ([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+) iova 0x([0-9a-f]+) -> gpa 0x([0-9a-f]+) mask 0x([0-9a-f]+)")
PAGE = 4096
# A DMA the IOMMU refused: reported, or not (fault processing disabled for the context).
FAULTS = ("vtd_dmar_fault", "vtd_fault_disabled")


def translated(line, nvmes, waiting):
    """For a vtd_dmar_translate line of an NVMe controller of `nvmes`: the entries of `waiting`
    (IOVA page -> [(..., address, length)]) it translates, taken out of it, each with its guest
    physical address."""
    m = TRANSLATE.search(line)
    if not m or tuple(int(x, 16) for x in m.group(1, 2, 3)) not in nvmes:
        return
    iova, gpa, mask = (int(x, 16) for x in m.group(4, 5, 6))
    for page in range(iova // PAGE, (iova + mask) // PAGE + 1):
        for entry in waiting.pop(page, []):
            yield entry, gpa + (entry[1] - iova)


def since(trace, mark, start, size, nvmes=None):
    """Bytes mapped since line `mark`, by direction and target. With `nvmes` (the IOMMU rig),
    addresses are IOVAs, judged by their translations."""
    t = dict.fromkeys(["bar_read", "ram_read", "cmb_read", "bar_write", "ram_write", "cmb_write", "other"], 0)
    if nvmes is not None:
        t.update(untranslated=0, faults=0)
    direction = None
    pending = None  # the last map_addr: (key, len), reclassified by a map_addr_cmb after it
    # IOMMU rig: IOVA page -> [(direction or None, addr, len)] waiting for their translation.
    waiting = {}

    def judge(direction, addr, length):
        if direction is None:
            return "other"
        return ("bar_" if start <= addr < start + size else "ram_") + direction

    with open(trace, errors="replace") as f:
        for n, line in enumerate(f):
            if n < mark:
                continue
            w = line.split()
            if not w:
                continue
            if w[0] == "pci_nvme_io_cmd":
                op = line.rsplit("opname", 1)[-1]
                direction = "read" if "_READ" in op else "write" if "_WRITE" in op else None
            elif w[0] == "pci_nvme_admin_cmd":
                direction = None
            elif w[0] == "pci_nvme_map_addr" and len(w) >= 5:
                addr, length = int(w[2], 16), int(w[4])
                if nvmes is None:
                    key = judge(direction, addr, length)
                    t[key] += length
                    pending = (key, length)
                else:
                    entry = [direction, addr, length]
                    waiting.setdefault(addr // PAGE, []).append(entry)
                    pending = entry
            elif w[0] == "pci_nvme_map_addr_cmb" and pending and direction:
                if nvmes is None:
                    t[pending[0]] -= pending[1]
                    t["cmb_" + direction] += pending[1]
                else:
                    # The controller's own memory: never translated by the IOMMU.
                    waiting[pending[1] // PAGE].remove(pending)
                    t["cmb_" + direction] += pending[2]
                pending = None
            elif w[0] in FAULTS and nvmes is not None:
                t["faults"] += 1
            elif w[0] == "vtd_dmar_translate" and nvmes is not None:
                for (d, addr, length), gpa in translated(line, nvmes, waiting):
                    t[judge(d, gpa, length)] += length
    if nvmes is not None:
        t["untranslated"] = sum(e[2] for entries in waiting.values() for e in entries)
    return " ".join(f"{k}={v}" for k, v in t.items())


# The emulated GPU's marks: a free's FREE_MARK (0x4652) | n, then PAGE_MARK (0x5047) | page for
# each BAR page (64 KiB) of the allocations whose page tables it revokes, written to ivshmem's
# IntrMask (tests/egpu: REG_INTRMASK).
MARK = re.compile(r"addr 0x[0-9a-f]+ value 0x(4652|5047)([0-9a-f]{4}) size 4 name 'ivshmem-mmio'")
GPU_PAGE = 0x10000


def frees(trace, mark, start, size, nvmes=None):
    """The frees since line `mark`, how many began while a command with data to or from the
    pages they free was outstanding (submitted, its completion not yet queued), and how many
    while any data command was. With `nvmes` (the IOMMU rig), a command's addresses are IOVAs,
    judged by their translations."""
    cmds = []  # [first line, completion line or None, data?, BAR pages, ambiguous]
    open_cmds = {}  # (cid, queue) -> command
    marks = []  # [line, pages]
    current = None  # the I/O command whose map_addr lines follow
    waiting = {}  # IOMMU rig: IOVA page -> [(command, addr, len)]
    kv = re.compile(r"(\w+) (0x[0-9a-f]+|\d+)")

    def bar_pages(cmd, addr, length):
        if start <= addr < start + size:
            first = (addr - start) // GPU_PAGE
            last = (min(addr + max(length, 1), start + size) - 1 - start) // GPU_PAGE
            cmd[3].update(range(first, last + 1))

    with open(trace, errors="replace") as f:
        for n, line in enumerate(f):
            if n < mark:
                continue
            ev = line.split(" ", 1)[0]
            if ev in ("pci_nvme_io_cmd", "pci_nvme_admin_cmd"):
                fields = dict(kv.findall(line))
                io = ev == "pci_nvme_io_cmd"
                key = (fields.get("cid"), fields.get("sqid") if io else "0")
                op = line.rsplit("opname", 1)[-1]
                cmd = [n, None, io and ("_READ" in op or "_WRITE" in op), set(), False]
                if key in open_cmds:
                    open_cmds[key][4] = cmd[4] = True
                open_cmds[key] = cmd
                cmds.append(cmd)
                current = cmd if io else None
            elif ev == "pci_nvme_map_addr" and current is not None:
                m = re.search(r"addr 0x([0-9a-f]+) len (\d+)", line)
                if not m:
                    continue
                addr, length = int(m.group(1), 16), int(m.group(2))
                if nvmes is None:
                    bar_pages(current, addr, length)
                else:
                    waiting.setdefault(addr // PAGE, []).append((current, addr, length))
            elif ev == "pci_nvme_enqueue_req_completion":
                fields = dict(kv.findall(line))
                cmd = open_cmds.pop((fields.get("cid"), fields.get("cqid")), None)
                if cmd is not None:
                    cmd[1] = n
            elif ev == "vtd_dmar_translate" and nvmes is not None:
                for (cmd, _, length), gpa in translated(line, nvmes, waiting):
                    bar_pages(cmd, gpa, length)
            elif ev == "memory_region_ops_write":
                m = MARK.search(line)
                if m and m.group(1) == "4652":
                    marks.append([n, set()])
                elif m and marks:
                    marks[-1][1].add(int(m.group(2), 16))
    usable = [c for c in cmds if not c[4]]

    def outstanding(c, line):
        return c[0] < line and (c[1] is None or line < c[1])

    during_bar = sum(1 for line, pages in marks
                     if any(outstanding(c, line) and c[3] & pages for c in usable))
    during = sum(1 for line, _ in marks if any(outstanding(c, line) and c[2] for c in usable))
    bar = sum(1 for c in usable if c[3])
    return (f"frees={len(marks)} during_bar_dma={during_bar} during_dma={during} "
            f"bar_commands={bar} ambiguous={len(cmds) - len(usable)}")


def faults(trace):
    with open(trace, errors="replace") as f:
        return sum(1 for line in f if line.split(" ", 1)[0] in FAULTS)


def main(argv):
    if len(argv) == 3 and argv[1] == "bar":
        print(*gpu_bar(argv[2]))
    elif len(argv) == 3 and argv[1] == "lines":
        with open(argv[2], "rb") as f:
            print(sum(1 for _ in f))
    elif len(argv) == 6 and argv[1] == "since":
        print(since(argv[2], int(argv[3]), int(argv[4]), int(argv[5])))
    elif len(argv) == 7 and argv[1] == "since":
        # The IOMMU rig: argv[6] is the QMP socket, to find the NVMe controllers.
        print(since(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), nvme_functions(argv[6])))
    elif len(argv) in (6, 7) and argv[1] == "frees":
        nvmes = nvme_functions(argv[6]) if len(argv) == 7 else None
        print(frees(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), nvmes))
    elif len(argv) == 3 and argv[1] == "faults":
        print(faults(argv[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
