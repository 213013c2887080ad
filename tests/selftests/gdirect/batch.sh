#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Batches: 256 reads submitted at once into GPU memory. The per-file in-flight
# limit (128) is honoured - the first SUBMIT queues 128 - the registered
# eventfd is signalled once per completion, REAP collects them, every byte
# lands in its own slot, and REAP with WAIT works without an eventfd.
# O_DIRECT cleared (fcntl F_SETFL) on a file with 16 MiB reads of the 32 MB/s
# namespace queued: the chunks that start afterwards fail with EBADFD, never a
# buffered read through the page cache into device memory.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
n0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 11

out=$(gdirect-io batch "$n0")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
line=$(echo "$out" | head -n 1)
_test "the scenario ran" _expect_eq "exit status" 0 "$rc"
_test "the first SUBMIT of 256 queued the in-flight limit, 128" _expect_eq first_submit 128 "$(_kv "$line" first_submit)"
_test "never more than 128 in flight" sh -c "[ $(_kv "$line" max_in_flight) -le 128 ]"
_test "all 256 completed" _expect_eq completed 256 "$(_kv "$line" completed)"
_test "the eventfd counted one signal per completion" _expect_eq signals 256 "$(_kv "$line" eventfd_signals)"
_test "every entry's bytes are in its slot" _expect_eq mismatched 0 "$(_kv "$out" mismatched_entries)"
_test "REAP with WAIT collected a batch without an eventfd, into poisoned slots, every byte right" \
	_expect_eq "reaped mismatched" "8 0" "$(_kv "$out" reap_wait_completed) $(_kv "$out" reap_wait_mismatched)"
_test "REAP with WAIT and nothing in flight returns at once" _expect_eq empty 0 "$(_kv "$line" reap_wait_empty)"
_test "an entry naming another file's registration is refused (EPERM), the one before it queued" \
	_expect_eq "first queued again" "1:EPERM 1 1:EPERM" \
	"$(_kv "$out" foreign_submit) $(_kv "$out" foreign_queued_before) $(_kv "$out" foreign_again)"

out=$(gdirect-io direct-cleared "$slow" 2>&1)
rc=$?
ktap_print_msg "O_DIRECT cleared: $(echo "$out" | tr '\n' ' ')"
_test "O_DIRECT cleared under queued reads: each whole or EBADFD" _expect_eq "exit status" 0 "$rc"
_test "a chunk started after the clear failed with EBADFD" sh -c "[ '$(_kv "$out" ebadfd)' -ge 1 ]"

ktap_finished
