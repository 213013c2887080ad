#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Processes with 128 batched 1 MiB reads in flight, killed with SIGKILL at
# random moments (their files closed under the batches), and others closing
# their file with revocations racing: no hang, no oops, nothing left pinned,
# the module unloads.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 5

killed=0
for i in $(seq 1 20); do
	gdirect-io inflight "$ns" 128 >/dev/null 2>&1 &
	pid=$!
	# 0 to 0.3 s into the batch.
	sleep "0.$(($(od -An -N1 -tu1 /dev/urandom) % 4))"
	kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
	wait "$pid" 2>/dev/null
done
ktap_print_msg "$killed of 20 processes killed with reads in flight"
_test "processes were killed with reads in flight" sh -c "[ $killed -gt 0 ]"
_test "nothing stays registered or pinned after the kills" \
	_expect_eq counters "0 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes)"
out=$(gdirect-io revclose 50 "$ns")
_test "50 rounds of close racing a revocation under batched reads: no hang" _expect_eq "exit status" 0 "$?"
ktap_print_msg "$out"
_test "nothing stays registered or pinned after them" \
	_expect_eq counters "0 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes)"
_test "the module unloads" sh -c 'rmmod gdirect && rmmod gdirect_egpu'

ktap_finished
