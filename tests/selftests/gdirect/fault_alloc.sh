#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Allocation failures injected into the module (failslab and fail_page_alloc,
# confined by their stack filter to calls made from gdirect's code, the block
# layer's allocations for its I/O included), at 10%, under rounds of open,
# registration of host and GPU memory, query, read, batch and close: every
# step succeeds with every byte right or fails with an errno; nothing leaks;
# with injection off every step succeeds.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

dbg=/sys/kernel/debug
stop() {
	for f in "$dbg/failslab" "$dbg/fail_page_alloc"; do
		echo 0 >"$f/probability" 2>/dev/null
	done
}
cleanup() {
	stop
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-io
for f in failslab fail_page_alloc; do
	[ -d "$dbg/$f/require-start" ] || [ -f "$dbg/$f/require-start" ] ||
		ktap_exit_fail_msg "no $dbg/$f/require-start: the kernel lacks CONFIG_FAULT_INJECTION_STACKTRACE_FILTER"
done
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
kv() { echo "$1" | sed -nE "s/(^|.* )$2=([^ ]*).*/\2/p" | head -n 1; }
# gdirect's code: its load address and size from /proc/modules (as root), in hex: the
# shell's arithmetic is signed and kernel addresses are not.
range=$(gdirect-io module-range gdirect) || ktap_exit_fail_msg "cannot find gdirect's addresses (kptr_restrict?)"
start=${range% *} end=${range#* }

ktap_print_header
ktap_set_plan 8

# Every filter first, the probability last, and only if every setting took.
setup() {
	for f in "$dbg/failslab" "$dbg/fail_page_alloc"; do
		echo 0 >"$f/probability" && echo 0 >"$f/verbose" && echo 1 >"$f/interval" &&
			echo -1 >"$f/times" && echo N >"$f/ignore-gfp-wait" && echo N >"$f/task-filter" &&
			echo 32 >"$f/stacktrace-depth" && echo "$start" >"$f/require-start" &&
			echo "$end" >"$f/require-end" || return 1
	done
	echo N >"$dbg/fail_page_alloc/ignore-gfp-highmem" && echo 0 >"$dbg/fail_page_alloc/min-order"
}
setup || ktap_exit_fail_msg "cannot set up the fault injection filters"
ktap_print_msg "failing allocations made from $start-$end (gdirect), 10%"
for f in "$dbg/failslab" "$dbg/fail_page_alloc"; do
	echo 10 >"$f/probability"
done

out=$(gdirect-io allocfail 200 "$ns")
rc=$?
stop
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
echo "GDIRECT-FIGURE fault_alloc at=10% $(echo "$out" | grep -m1 'outcomes=')"
_test "every step succeeded or failed cleanly: no partial success, no wrong byte" _expect_eq "exit status" 0 "$rc"
# Every outcome is STEP:RESULT:COUNT, and the 200 rounds each opened the device once: a run
# that printed nothing, or less, passes none of the checks below.
opens() { kv "$1" outcomes | tr ',' '\n' | sed -n 's/^open:[A-Z]*:\([0-9]*\)$/\1/p' | awk '{s += $1} END {print s + 0}'; }
_test "200 rounds reported, each its open's outcome" _expect_eq "opens counted" 200 "$(opens "$out")"
failures() { kv "$out" outcomes | tr ',' '\n' | grep -v ':OK:' | grep -q .; }
_test "allocations did fail (the injection reached the module)" failures
only_clean() {
	kv "$out" outcomes | tr ',' '\n' | grep -q . &&
		! kv "$out" outcomes | tr ',' '\n' | grep -v ':OK:' | grep -vqE ':(ENOMEM|EIO|ENXIO|EFAULT|EAGAIN):'
}
_test "each failure an errno the caller can act on (ENOMEM, EIO, ENXIO, EFAULT, EAGAIN)" only_clean
_test "nothing stays registered or pinned" \
	_expect_unpinned

out=$(gdirect-io allocfail 20 "$ns")
rc=$?
ktap_print_msg "off: $(kv "$out" outcomes)"
echo "GDIRECT-FIGURE fault_alloc at=off outcomes=$(kv "$out" outcomes)"
# Each of the 20 rounds: open, register and unregister host memory, register GPU memory,
# query, read, submit and 4 batched reads (11 steps), all OK, and the tool exits 0.
clean() {
	[ $rc -eq 0 ] && ! kv "$out" outcomes | tr ',' '\n' | grep -v ':OK:' | grep -q . &&
		_expect_eq "steps that succeeded" 220 \
			"$(kv "$out" outcomes | tr ',' '\n' | awk -F: '{s += $3} END {print s + 0}')"
}
_test "injection off: every step of 20 rounds succeeds, exit 0" clean
_test "and the module still unloads" sh -c 'rmmod gdirect && rmmod gdirect_egpu'
_test "and loads again" _load_all

ktap_finished
