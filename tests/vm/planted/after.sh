#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh, run after leftover.sh and overrun.sh: the runner left
# the rig clean after them. No process of theirs, the module unloaded, nothing pinned by the
# kernel's count.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
rc=0
if ps -o args | grep -v grep | grep -qE 'sleep 600|gdirect-reg pin'; then
	echo "a planted process survived: $(ps -o pid,args | grep -E 'sleep 600|gdirect-reg pin' | grep -v grep | tr '\n' ';')"
	rc=1
fi
[ -d /sys/module/gdirect ] && { echo "the module is still loaded"; rc=1; }
pins=$(_kernel_pins_settled)
[ "${pins:-x}" = 0 ] || { echo "pages still pinned by the kernel's count: ${pins:-unreadable}"; rc=1; }
echo "clean=$([ $rc -eq 0 ] && echo yes || echo no)"
exit $rc
