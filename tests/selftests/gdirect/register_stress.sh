#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# 4 processes x 2 threads, 10,000 register/query/unregister cycles in all on
# host and emulated GPU memory: every cycle succeeds, every counter returns to
# zero, and kmemleak finds nothing new.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

PROCS=4
THREADS=2
CYCLES=1250 # per thread: 4 * 2 * 1250 = 10,000

_require_root
_require_cmd gdirect gdirect-reg jq
[ -w /sys/kernel/debug/kmemleak ] || { ktap_skip_all "needs CONFIG_DEBUG_KMEMLEAK"; exit "$KSFT_SKIP"; }
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 5

echo clear >/sys/kernel/debug/kmemleak
pids=
for p in $(seq $PROCS); do
	gdirect-reg stress $THREADS $CYCLES "$nvme0" >/tmp/stress.$p 2>&1 &
	pids="$pids $!"
done
failed=0
for pid in $pids; do wait "$pid" || failed=$((failed + 1)); done
total=0
for p in $(seq $PROCS); do
	total=$((total + $(_kv "$(cat /tmp/stress.$p)" cycles)))
	grep FAIL /tmp/stress.$p | head -n 3 | while read -r l; do ktap_print_msg "$l"; done
done
ktap_print_msg "$total cycles by $PROCS processes x $THREADS threads"
_test "every process succeeded" _expect_eq "failed processes" 0 "$failed"
_test "10,000 cycles completed" _expect_eq cycles $((PROCS * THREADS * CYCLES)) "$total"
_test "no registration or pinned byte is left" \
	_expect_unpinned
_test "the GPU holds no page table and no allocation" _expect_eq "mappings allocations" "0 0" \
	"$(_kv "$(_egpu_state)" mappings) $(_kv "$(_egpu_state)" allocations)"
leaks() {
	echo scan >/sys/kernel/debug/kmemleak
	echo scan >/sys/kernel/debug/kmemleak
	report=$(cat /sys/kernel/debug/kmemleak)
	[ -z "$report" ] && return 0
	echo "$report" | head -n 20 | while read -r l; do ktap_print_msg "$l"; done
	return 1
}
_test "kmemleak reports nothing" leaks

ktap_finished
