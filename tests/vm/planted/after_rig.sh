#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh: run after rig_left.sh, finds the rig restored: the first
# NVMe back with its four namespaces, a read from its throttled one exact (host check), and no
# loop device bound.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
# The controller probes after the runner's rescan: given 5 s.
i=0
until ns4=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || [ $i -ge 25 ]; do sleep 0.2; i=$((i + 1)); done
[ -b "$ns4" ] || { echo "no namespace 4 of $GDIRECT_NVME0_SERIAL"; exit 1; }
for n in 1 2 3; do _nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" "$n" >/dev/null || exit 1; done
dd if="$ns4" of=/tmp/after-rig bs=1M count=4 2>/dev/null || exit 1
_host_sha256 nvme0ns4:0 4194304 "$(sha256sum /tmp/after-rig | cut -d' ' -f1)" || exit 1
for f in /sys/block/loop*/loop/backing_file; do
	[ -f "$f" ] && { echo "a loop device is still bound: $f"; exit 1; }
done
echo "the rig is back"
