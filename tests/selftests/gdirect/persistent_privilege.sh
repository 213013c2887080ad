#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A persistent registration is never revoked: it keeps GPU memory past cudaFree and past the
# process that made it. On a shared node only an administrator may make one: a member of the
# gdirect group gets EACCES (the library's persistent_needs_admin) and nothing is pinned (the
# emulated GPU's own count of page tables, its memory still allocated), while the same user's
# plain registration works, and root's persistent one works.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg su
_load_all || ktap_exit_fail_msg "cannot load the modules"
_add_test_user
chgrp gdirect /dev/gdirect /dev/gdirect_egpu && chmod 0660 /dev/gdirect /dev/gdirect_egpu

ktap_print_header
ktap_set_plan 4

out=$(_as_user gdirect-reg pin egpu 1048576 persistent)
ktap_print_msg "user, persistent: $out"
_test "a group member's persistent REGISTER: EACCES (persistent_needs_admin), no page table held" \
	_expect_eq "register mappings kind" "EACCES 0 PersistentNeedsAdmin" \
	"$(_kv "$out" register) $(_kv "$out" egpu_mappings) $(_kv "$out" kind)"
out=$(_as_user gdirect-reg pin egpu 1048576)
_test "the same user's plain REGISTER works" _expect_eq register OK "$(_kv "$out" register)"
out=$(gdirect-reg pin egpu 1048576 persistent)
_test "root's persistent REGISTER works" _expect_eq register OK "$(_kv "$out" register)"
_test "nothing stays registered in the emulated GPU" _expect_eq mappings 0 "$(_kv "$(_egpu_state)" mappings)"

ktap_finished
