#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The permission model, rule by rule, as an unprivileged user (uid 1000):
#  - /dev/gdirect is 0660: a user outside its group is refused; the admin
#    gives access by group (here `gdirect`, gid 990).
#  - Data is reached only through files the caller opened itself: a user who
#    may use /dev/gdirect still cannot read a block device it may not open.
#  - A read-only file can be read through, never written through (EBADF).
#  - Handles belong to one open file (EPERM elsewhere); GPU and host memory
#    are found in the caller's own address space only.
#  - An open device file is bound to the address space that opened it: one
#    passed over a Unix socket is refused to its receiver (EXDEV), whose own
#    open file does not know the sender's handles either (EPERM).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() {
	[ -n "${ns_mode:-}" ] && chmod "$ns_mode" "$ns"
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-perm jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
_add_test_user
kv() { echo "$1" | sed -n "s/^$2=\([^ ]*\).*/\1/p" | head -n 1; }

ktap_print_header
ktap_set_plan 14

refused() { [ "$(_as_user gdirect info --json 2>/dev/null | jq -r .error.kind)" = permission_denied ]; }
_test "outside the device's group: refused (mode $(stat -c %a /dev/gdirect))" refused
chgrp gdirect /dev/gdirect /dev/gdirect_egpu && chmod 0660 /dev/gdirect_egpu
_test "in the group: gdirect info works" _as_user gdirect info
no_path() {
	out=$(_as_user gdirect read "$ns" --mem host --len 4K --json 2>/dev/null)
	[ "$(echo "$out" | jq -r .error.kind)" = open_file ] && [ "$(echo "$out" | jq -r .error.errno)" = EACCES ]
}
_test "no access of its own: a device the user may not open stays unread (EACCES)" no_path

ns_mode=$(stat -c %a "$ns")
chmod o+r "$ns"
out=$(_as_user gdirect-perm write-ro "$ns")
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "a read-only file reads into registered memory" _expect_eq read_readonly OK "$(kv "$out" read_readonly)"
_test "a read-only file is never written through (EBADF)" _expect_eq write_readonly EBADF "$(kv "$out" write_readonly)"
chmod "$ns_mode" "$ns"
ns_mode=

out=$(_as_user gdirect-perm foreign-handle)
_test "a handle used on another open file: EPERM" _expect_eq foreign_handle EPERM "$(kv "$out" foreign_handle)"
out=$(_as_user gdirect-perm cross-gpu)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "another process's GPU address is not memory here (ENXIO)" _expect_eq foreign_gpu_va ENXIO "$(kv "$out" foreign_gpu_va)"
_test "while its owner registers it" _expect_eq owner_gpu_va OK "$(kv "$out" owner_gpu_va)"
out=$(_as_user gdirect-perm cross-host)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
not_theirs() {
	r=$(kv "$out" foreign_host_addr)
	[ "$r" = ENXIO ] || { [ "$r" = OK_OWN_MEMORY ] && [ "$(kv "$out" byte)" != "Some(90)" ]; }
}
_test "another process's host address pins nothing of theirs" not_theirs

out=$(gdirect-perm pass-fd "$ns" 1000 990)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "the receiver runs as uid 1000" _expect_eq uid 1000 "$(kv "$out" receiver_uid)"
_test "it cannot open the device itself (EACCES)" _expect_eq open EACCES "$(kv "$out" receiver_open_dev)"
_test "the passed device file refuses it a READ into the sender's registration (EXDEV)" _expect_eq read EXDEV "$(kv "$out" receiver_read_passed)"
_test "and a WRITE, before any check of the passed read-only file (EXDEV)" _expect_eq write EXDEV "$(kv "$out" receiver_write_passed_ro)"
_test "the handle means nothing on its own open file (EPERM)" _expect_eq own EPERM "$(kv "$out" receiver_handle_on_own_open)"

ktap_finished
