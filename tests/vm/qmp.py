#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""QEMU monitor (QMP) commands the rig's host side makes: for a test's request, and for the boot
watchdog of scripts/vm (registers, quit).

  qmp.py device-del SOCKET ID                  device_del of the device named ID
  qmp.py throttle SOCKET DRIVE BPS             the drive's I/O limit: BPS bytes a second, read
                                               and write together (block_set_io_throttle)
  qmp.py trace SOCKET EVENT on|off             a trace event switched on or off while QEMU runs
                                               (trace-event-set-state)
  qmp.py registers SOCKET                      every virtual CPU's registers (the monitor's
                                               `info registers -a`), printed as QEMU gives them
  qmp.py quit SOCKET                           QEMU told to exit (quit)

Prints OK, or FAIL with QEMU's error (registers: the registers, or FAIL).
"""
import json
import socket
import sys


def execute(path, command, arguments=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    f = s.makefile("rw")
    json.loads(f.readline())  # greeting
    reply = None
    for cmd in ({"execute": "qmp_capabilities"}, {"execute": command, "arguments": arguments or {}}):
        f.write(json.dumps(cmd) + "\n")
        f.flush()
        while True:
            reply = json.loads(f.readline())
            if "return" in reply or "error" in reply:
                break
    s.close()
    return reply


def main(argv):
    if len(argv) == 4 and argv[1] == "device-del":
        reply = execute(argv[2], "device_del", {"id": argv[3]})
    elif len(argv) == 5 and argv[1] == "throttle" and argv[4].isdigit():
        limits = {k: 0 for k in ("bps_rd", "bps_wr", "iops", "iops_rd", "iops_wr")}
        reply = execute(argv[2], "block_set_io_throttle", {"device": argv[3], "bps": int(argv[4]), **limits})
    elif len(argv) == 5 and argv[1] == "trace" and argv[4] in ("on", "off"):
        reply = execute(argv[2], "trace-event-set-state", {"name": argv[3], "enable": argv[4] == "on"})
    elif len(argv) == 3 and argv[1] == "registers":
        reply = execute(argv[2], "human-monitor-command", {"command-line": "info registers -a"})
        if "return" in reply:
            print(reply["return"], end="")
            return
    elif len(argv) == 3 and argv[1] == "quit":
        reply = execute(argv[2], "quit")
    else:
        raise SystemExit(__doc__)
    print("OK" if "return" in reply else f"FAIL {reply.get('error', {}).get('desc', reply)}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (OSError, ValueError) as e:  # no socket, no answer, or not QMP's
        print(f"FAIL {e}")
        sys.exit(1)
