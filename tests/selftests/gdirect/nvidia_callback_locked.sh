#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The free callback runs under the GPU driver's lock (RM's API lock in
# nvidia.ko, which get_pages, put_pages and dma_map_pages also take) and waits
# for the uses of the pages. Queries (the first of each registration, which
# makes the peer's addresses), reads, unregisters and closes race 60 frees that
# hold that lock, half of them run by a kernel worker (the callback in a
# kworker): none may deadlock (the test's time limit), lockdep on the
# debug kernel may report no inversion (the log scan), and nothing is left.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 4

out=$(gdirect-reg callback-locked 60 "$nvme0" "$slow" 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
_test "60 frees under the driver's lock: no deadlock, every operation as allowed" \
	_expect_eq "exit status" 0 "$rc"
_test "each free ran its callback" _expect_eq callbacks 60 "$(_kv "$out" callbacks)"
_test "nothing stays registered, pinned or mapped" \
	_expect_eq counters "0 0 0" "$(_kv "$out" registrations) $(_kv "$out" pinned_bytes) $(_kv "$out" egpu_mappings)"
unload() { rmmod gdirect && rmmod gdirect_egpu; }
_test "both modules unload" unload

ktap_finished
