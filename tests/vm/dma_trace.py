#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Where the emulated NVMe controllers' DMA went, from QEMU's own trace (host side of the rig).

scripts/vm starts QEMU with the trace events pci_nvme_admin_cmd, pci_nvme_io_cmd,
pci_nvme_map_addr and pci_nvme_map_addr_cmb written to a file (Debian's QEMU has the `log`
trace backend). Every data address an emulated NVMe controller maps for a command is one
pci_nvme_map_addr line, logged right after the command's pci_nvme_io_cmd line (the device
model runs under QEMU's big lock, so the lines of one command are not interleaved with
another's). The emulated GPU's BAR2 is found with QMP `query-pci`, not from the guest.

  dma_trace.py bar QMP_SOCKET              print "START SIZE" of the emulated GPU's BAR2
  dma_trace.py lines TRACE                 print the trace's line count (a mark)
  dma_trace.py since TRACE MARK START SIZE print the bytes mapped since line MARK, per
                                           direction (read: device to memory) and target:
                                           bar_read ram_read cmb_read bar_write ram_write
                                           cmb_write other (admin commands, not data)
"""
import json
import socket
import sys


def qmp(path, command):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    f = s.makefile("rw")
    json.loads(f.readline())  # greeting
    for cmd in ({"execute": "qmp_capabilities"}, {"execute": command}):
        f.write(json.dumps(cmd) + "\n")
        f.flush()
        while True:
            reply = json.loads(f.readline())
            if "return" in reply or "error" in reply:
                break
    return reply["return"]


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


def since(trace, mark, start, size):
    t = dict.fromkeys(["bar_read", "ram_read", "cmb_read", "bar_write", "ram_write", "cmb_write", "other"], 0)
    direction = None
    pending = None  # the last map_addr: (key, len), reclassified by a map_addr_cmb after it
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
                if direction is None:
                    key = "other"
                elif start <= addr < start + size:
                    key = "bar_" + direction
                else:
                    key = "ram_" + direction
                t[key] += length
                pending = (key, length)
            elif w[0] == "pci_nvme_map_addr_cmb" and pending and direction:
                t[pending[0]] -= pending[1]
                t["cmb_" + direction] += pending[1]
                pending = None
    return " ".join(f"{k}={v}" for k, v in t.items())


def main(argv):
    if len(argv) == 3 and argv[1] == "bar":
        print(*gpu_bar(argv[2]))
    elif len(argv) == 3 and argv[1] == "lines":
        with open(argv[2], "rb") as f:
            print(sum(1 for _ in f))
    elif len(argv) == 6 and argv[1] == "since":
        print(since(argv[2], int(argv[3]), int(argv[4]), int(argv[5])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
