#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh, never part of the suite: changes the rig and exits 0
# without restoring it: namespace 4 of the first NVMe slowed through the host, and that NVMe
# deleted through QEMU's monitor with its slot's power cut (as the surprise-removal tests do),
# and a loop device bound to a file. The guest's runner must report the test as a LEFTOVER,
# naming all three, and restore them.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
bdf=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || exit 1
_throttle_ns4 16777216 || exit 1
_surprise_unplug nvme0 "$(_pci_parent "$bdf")" || exit 1
dd if=/dev/zero of=/tmp/rig-left.img bs=1M count=1 status=none && loop=$(losetup -f) &&
	losetup "$loop" /tmp/rig-left.img || exit 1
exit 0
