#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# An open /dev/gdirect is bound to the address space that opened it, as a KVM
# VM is. A process that registered host memory and read into it forks, and then
# execs a program with the device file left open: the child and the program
# send every command on the file, then a READ into the parent's registration
# and an UNREGISTER of it by its handle, and each gets EXDEV (after fork, the
# child's copies of the pinned pages are its own: a read it made would land in
# the parent's). The parent's registration reads the drive's bytes before and
# after, and stays registered. (A file passed over a Unix socket: permissions.sh.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
n0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 1) || ktap_exit_fail_msg "no namespace 1 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 7

out=$(gdirect-reg other-mm "$n0" 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "the scenario ran" _expect_eq "exit status" 0 "$rc"
_test "the opener's registration read the drive's bytes before" _expect_eq read OK "$(_kv "$out" opener_read_before)"
_test "a child after fork: every command, a READ by the parent's handle and its UNREGISTER get EXDEV" \
	_expect_eq "every answer" EXDEV "$(_kv "$out" fork_all)"
_test "a program after exec, the file still open: EXDEV for each too" \
	_expect_eq "every answer" EXDEV "$(_kv "$out" exec_all)"
_test "the opener's registration still reads the drive's bytes after" _expect_eq read OK "$(_kv "$out" opener_read_after)"
_test "and is still registered on its file" _expect_eq registrations 1 "$(_kv "$out" opener_file_registrations)"
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
