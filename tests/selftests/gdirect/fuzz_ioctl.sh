#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The ioctl fuzzer: GDIRECT_FUZZ_CALLS (default 200000) seeded random calls from
# 4 threads, interleaved with valid registrations, reads, batches and frees of
# registered GPU memory; then no registration or pinned byte is left, the
# module unloads, and the kernel log holds no report (scripts/vm checks the
# log of the whole run). The seed is printed: GDIRECT_FUZZ_SEED=N reproduces it.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() {
	_ns_restore
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-fuzz jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
read_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 1) || ktap_exit_fail_msg "no namespace 1"
rw_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 2) || ktap_exit_fail_msg "no namespace 2"
# The fuzzer writes the second namespace (the ext4 image of other tests): put it back after.
_ns_save "$rw_ns" || ktap_exit_fail_msg "cannot save $rw_ns"
calls=${GDIRECT_FUZZ_CALLS:-200000}
seed=${GDIRECT_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}

ktap_print_header
ktap_set_plan 4

ktap_print_msg "seed $seed ($calls calls): rerun with GDIRECT_FUZZ_SEED=$seed"
out=$(gdirect-fuzz --seed "$seed" --calls "$calls" --threads 4 --read-file "$read_ns" --rw-file "$rw_ns" 2>&1)
rc=$?
echo "$out" | sed 's/^/# /'
_test "the fuzzer ran its $calls calls and found every invariant held" _expect_eq "exit status" 0 "$rc"
_test "afterwards nothing is registered or pinned" \
	_expect_eq counters "0 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes)"
_test "GET_INFO still answers" _expect_eq abi 1 "$(gdirect info --json | jq .module.abi_version)"
unload() { rmmod gdirect && rmmod gdirect_egpu && [ ! -d /sys/module/gdirect ]; }
_test "the module unloads" unload

ktap_finished
