#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The ioctl fuzzer, in two modes. Checked: GDIRECT_FUZZ_CHECKED_CALLS (default
# 10000) calls from one thread, each with the result the header documents for
# its argument classes (any success of a malformed call fails), every byte of
# every well-formed transfer between host memory and the files compared, then
# munmap, MADV_DONTNEED and fork of registered memory with reads in flight and
# VmPin back to its start; run twice with one seed, the two runs must make the
# same calls with the same outcomes (equal digests). Chaos: GDIRECT_FUZZ_CALLS
# (default 200000) seeded random calls from 4 threads, interleaved with valid
# registrations, reads, batches and frees of registered GPU memory, where only
# breaches count. Then no registration or pinned byte is left, the module
# unloads, and the kernel log holds no report (scripts/vm checks it). The seed
# is printed: GDIRECT_FUZZ_SEED=N reproduces it.

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

checked_calls=${GDIRECT_FUZZ_CHECKED_CALLS:-10000}

ktap_print_header
ktap_set_plan 7

ktap_print_msg "checked mode, seed $seed ($checked_calls calls), twice"
first=$(gdirect-fuzz --checked --seed "$seed" --calls "$checked_calls" --read-file "$read_ns" --rw-file "$rw_ns" 2>&1)
rc1=$?
echo "$first" | sed 's/^/# /'
second=$(gdirect-fuzz --checked --seed "$seed" --calls "$checked_calls" --read-file "$read_ns" --rw-file "$rw_ns" 2>&1)
rc2=$?
echo "$second" | grep -E 'MISMATCH|checked seed' | sed 's/^/# /'
summary=$(echo "$first" | grep -m1 'checked seed=')
echo "GDIRECT-FIGURE fuzz_checked $(echo "$summary" | sed 's/^gdirect-fuzz: checked //')"
_test "checked: every call got the documented result, every byte checked equal, VmPin back" \
	_expect_eq "exit status" 0 "$rc1"
digest() { echo "$1" | sed -n 's/.* digest=\([0-9a-f]*\).*/\1/p'; }
_test "checked: the same seed replays the same calls and outcomes (digest)" \
	sh -c "[ -n '$(digest "$first")' ] && [ '$(digest "$first")' = '$(digest "$second")' ] && [ $rc2 -eq 0 ]"
_test "checked: nothing stays registered or pinned" \
	_expect_unpinned

ktap_print_msg "seed $seed ($calls calls): rerun with GDIRECT_FUZZ_SEED=$seed"
out=$(gdirect-fuzz --seed "$seed" --calls "$calls" --threads 4 --read-file "$read_ns" --rw-file "$rw_ns" 2>&1)
rc=$?
echo "$out" | sed 's/^/# /'
echo "GDIRECT-FIGURE fuzz_chaos seed=$seed threads=4 $(echo "$out" | sed -n 's/^gdirect-fuzz: \([0-9]*\) calls in \([0-9.]*\) s (\([0-9]*\)\/s)/calls=\1 seconds=\2 rate=\3/p') successes=$(echo "$out" | awk '$2 == "OK" {s += $3} END {print s + 0}') breaches=$(echo "$out" | grep -c BREACH)"
_test "the fuzzer ran its $calls calls and found every invariant held" _expect_eq "exit status" 0 "$rc"
_test "afterwards nothing is registered or pinned" \
	_expect_unpinned
_test "GET_INFO still answers" _expect_eq abi 1 "$(gdirect info --json | jq .module.abi_version)"
unload() { rmmod gdirect && rmmod gdirect_egpu && [ ! -d /sys/module/gdirect ]; }
_test "the module unloads" unload

ktap_finished
