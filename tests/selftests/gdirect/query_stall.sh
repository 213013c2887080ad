#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A QUERY whose output buffer faults slowly (a userfaultfd page that is served
# only later, as a FUSE- or userfaultfd-backed buffer of a stalled process)
# must not delay a concurrent free of the GPU memory: the free callback waits
# for the registration's uses, and the QUERY holds none while it copies out.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 3

out=$(gdirect-reg query-stall "$nvme0" 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
_test "the free finished while the QUERY's copy was stalled" \
	_expect_eq free_done_while_query_stalled true "$(_kv "$out" free_done_while_query_stalled)"
_test "every step as expected (fault, callback, QUERY ends, unregister)" _expect_eq "exit status" 0 "$rc"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
