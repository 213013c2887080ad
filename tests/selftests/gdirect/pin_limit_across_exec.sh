#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Pinned host memory counts against the user that opened the device file (the
# user's locked_vm, as io_uring charges its buffers), for as long as it stays
# pinned, not for the life of the process that pinned it. As uid 1000 with
# RLIMIT_MEMLOCK 1 MiB:
#  - a registration of 1 MiB of host memory is accepted, and shows in the
#    process's VmPin (the kernel's own count of its address space's pins);
#  - the process then execs `sleep` with the device file open, or exits and
#    leaves the file to a forked child: the pins live on in that file, and a new
#    process of the user, with a fresh 1 MiB limit of its own, is refused 1 MiB
#    (ENOMEM) while they do; root (CAP_IPC_LOCK) is not limited meanwhile;
#  - once the holder is killed (the file closed), the user's 1 MiB is accepted.
# A module that charged the pinning process's mm alone (RDMA's pinned_vm) would
# accept every new process's MiB, so each ENOMEM fails then.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap '_stop_holder; _unload_all' EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
_add_test_user
chgrp gdirect /dev/gdirect && chmod 0660 /dev/gdirect

MIB=1048576
pin_as_user() { _as_user "ulimit -l 1024; gdirect-reg pin host $MIB $*" 2>&1; }

holder=
_stop_holder() {
	[ -n "$holder" ] || return 0
	kill "$holder" 2>/dev/null
	i=0
	while kill -0 "$holder" 2>/dev/null && [ $i -lt 100 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	holder=
}

ktap_print_header
ktap_set_plan 11

out=$(pin_as_user)
ktap_print_msg "a new process: $(echo "$out" | tr '\n' ' ')"
_test "RLIMIT_MEMLOCK 1 MiB: 1 MiB of host memory is accepted" _expect_eq register OK "$(_kv "$out" register)"
_test "and counted in the process's VmPin (kB)" _expect_eq VmPin 1024 "$(_kv "$out" vmpin_kb)"

for how in exec exit; do
	log=/tmp/pin_limit_across_$how.log
	pin_as_user "hold-$how" >"$log" &
	i=0
	while ! grep -q '^ready pid=' "$log" && [ $i -lt 200 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	holder=$(sed -n 's/^ready pid=//p' "$log")
	ktap_print_msg "the holder after $how: $(tr '\n' ' ' <"$log")"
	[ -n "$holder" ] && kill -0 "$holder" 2>/dev/null || ktap_exit_fail_msg "no holder after $how"
	# The registering process is gone (exit) or is `sleep` now (exec).
	comm=$(cat "/proc/$holder/comm")
	held=$(pin_as_user)
	root=$(sh -c "ulimit -l 1024; gdirect-reg pin host $MIB" 2>&1)
	_stop_holder
	after=$(pin_as_user)
	ktap_print_msg "held by $comm: user $(_kv "$held" register), root $(_kv "$root" register); killed: user $(_kv "$after" register)"
	_test "after $how, the pins held in the file: a new process of the user gets ENOMEM for 1 MiB" \
		_expect_eq register ENOMEM "$(_kv "$held" register)"
	_test "root (CAP_IPC_LOCK), same RLIMIT_MEMLOCK, is not limited meanwhile" \
		_expect_eq register OK "$(_kv "$root" register)"
	_test "the holder killed, the user's 1 MiB is accepted again" \
		_expect_eq register OK "$(_kv "$after" register)"
	case $how in
	exec) _test "the holder was the registering process after exec" _expect_eq comm sleep "$comm" ;;
	exit) _test "the holder was the forked child" _expect_eq comm gdirect-reg "$comm" ;;
	esac
done
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
