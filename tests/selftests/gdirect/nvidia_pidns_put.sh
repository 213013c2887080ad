#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A process is known to nvidia.ko by its global tgid, and put_pages finds pages only among the
# calling process's records (RmP2PGetInfoWithoutToken): from any other process it puts nothing
# and returns 0. Here the last reference of a GPU registration goes in a stranger whose pid
# number equals the pinner's: both are pid 1, each of its own pid namespace. The pinner
# registers, passes its /dev/gdirect descriptor to the stranger (SCM_RIGHTS) and closes its
# own; the stranger closes the last. gdirect knows the pinner by its struct pid, not the number,
# so it must not call put_pages from the stranger (the emulated GPU counts such foreign puts)
# and must leave the pages orphaned with the GPU, whose free then runs the callback: the page
# table goes, nothing stays pinned, and the debug kernel's KASAN sees no use after free.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"

ktap_print_header
ktap_set_plan 6

out=$(gdirect-reg pidns-put 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "the scenario ran: pinner and stranger exited 0" _expect_eq "exit children_ok" "0 true" "$rc $(_kv "$out" children_ok)"
_test "pinner and stranger have the same pid number (1), in two pid namespaces" \
	_expect_eq "pinner stranger" "1 1" "$(_kv "$out" pinner_pid) $(_kv "$out" stranger_pid)"
_test "the stranger's close made no put_pages from the stranger (the GPU's count of foreign puts)" \
	_expect_eq puts_foreign_delta 0 "$(_kv "$out" puts_foreign_delta)"
_test "the pages stay with the GPU, orphaned: its page table still held after the close" \
	_expect_eq "mappings after the stranger's close" 1 "$(echo "$out" | sed -n 's/^after_stranger_close mappings=\([0-9]*\).*/\1/p')"
_test "the free (cudaFree) runs the orphan's callback, and the table goes" \
	_expect_eq "callbacks mappings" "1 0" "$(echo "$out" | sed -n 's/^free callbacks=\([0-9]*\) mappings_after_free=\([0-9]*\)/\1 \2/p')"
_test "nothing pinned, no registration left, no page table held" _expect_unpinned

ktap_finished
