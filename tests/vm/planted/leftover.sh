#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh, never part of the suite: exits 0 with a process of its
# own still holding a registration of host memory. The guest's runner must report the test
# as a LEFTOVER and clean up after it.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
_load_module || exit 1
gdirect-reg pin host 65536 hold >/tmp/planted-hold 2>&1 &
i=0
while ! grep -q ready /tmp/planted-hold && [ $i -lt 100 ]; do
	sleep 0.1
	i=$((i + 1))
done
grep ready /tmp/planted-hold
