#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A page table's address used again: nvidia.ko's put_pages finds the table to
# put by its address among the calling process's records, and a slab hands the
# struct freed last to the next allocation. The emulated GPU is loaded with
# reuse_tables=1, so that the next get_pages always gets the freed table's
# struct. In each of 5 rounds a free holds the driver's lock (400 ms) over a
# registration's memory; meanwhile the same process sends a REGISTER of other
# memory (it waits for the lock), then ends the first registration. Had the
# end's put_pages waited for the lock too, it would run after the new
# get_pages and put the new table, which is at the freed one's address. The
# module serializes get_pages and put_pages: the end waits for the REGISTER,
# then finds the free's callback run and puts nothing. Checked from the
# emulated GPU's records: the new table was the freed one's struct, the GPU
# still holds it after the old registration's end, and the new registration's
# own end puts it, found linked.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_unload_all
_load_module || ktap_exit_fail_msg "cannot load gdirect"
_egpu_insmod reuse_tables=1 || ktap_exit_fail_msg "cannot load gdirect_egpu reuse_tables=1"

ktap_print_header
ktap_set_plan 4

out=$(gdirect-reg put-reuse 5 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
_test "5 rounds: each new table was the freed one's struct (tables_reused=5)" \
	_expect_eq tables_reused 5 "$(_kv "$out" tables_reused)"
_test "the new registration's table outlived the old one's end, which put nothing" \
	_expect_eq "exit status, unlinked puts, callbacks" "0 0 5" \
	"$rc $(_kv "$out" puts_unlinked) $(_kv "$out" callbacks)"
_test "nothing stays registered, pinned or held by the GPU driver" \
	_expect_eq "registrations pinned_bytes egpu_mappings" "0 0 0" \
	"$(_kv "$out" registrations) $(_kv "$out" pinned_bytes) $(_kv "$out" egpu_mappings)"
unload() { rmmod gdirect && rmmod gdirect_egpu; }
_test "both modules unload" unload

ktap_finished
