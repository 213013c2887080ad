#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# rmmod while /dev/gdirect is open is refused (each open file holds a module
# reference), the open file keeps working for the process that opened it, and
# the module unloads once the last file is closed - also when the holder is
# killed. A loop of opens racing rmmod attempts ends with either outcome and
# never an oops.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

holder=
user=
cleanup() {
	[ -n "$holder" ] && kill "$holder" 2>/dev/null
	[ -n "$user" ] && kill "$user" 2>/dev/null
	exec 3<&- 2>/dev/null
	_module_loaded && rmmod gdirect
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-ioctl
_module_loaded && ktap_exit_fail_msg "gdirect is already loaded before the test"
insmod "$GDIRECT_MODULE" || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"

ktap_print_header
ktap_set_plan 9

refcnt() { cat /sys/module/gdirect/refcnt; }
_test "no reference while nothing is open" _expect_eq refcnt 0 "$(refcnt)"

# A program opens the device and waits for a line on a fifo before it sends GET_INFO on that
# file (a file serves only the process that opened it).
rm -f /tmp/uwo.go /tmp/uwo.out
mkfifo /tmp/uwo.go
gdirect-ioctl --wait get-info </tmp/uwo.go >/tmp/uwo.out 2>&1 &
user=$!
exec 3>/tmp/uwo.go
i=0
while ! grep -q '^opened' /tmp/uwo.out && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
_test "an open file holds one module reference" _expect_eq refcnt 1 "$(refcnt)"
refused() {
	out=$(rmmod gdirect 2>&1) && return 1
	ktap_print_msg "rmmod: $out"
	_module_loaded && [ -c "$GDIRECT_DEV" ]
}
_test "rmmod is refused while the file is open" refused
echo go >&3
exec 3>&-
wait "$user"
user=
_test "the open file still works after the refused rmmod" _expect_eq result OK "$(tail -n 1 /tmp/uwo.out)"
rm -f /tmp/uwo.go /tmp/uwo.out
_test "closing the file drops the reference" _expect_eq refcnt 0 "$(refcnt)"
_test "rmmod succeeds once the file is closed" rmmod gdirect

# A process killed while holding the device releases it.
insmod "$GDIRECT_MODULE" || ktap_exit_fail_msg "cannot reload $GDIRECT_MODULE"
sh -c 'exec 4<>/dev/gdirect; sleep 1000' &
holder=$!
i=0
while [ "$(refcnt)" != 1 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
killed() {
	rmmod gdirect 2>/dev/null && return 1
	kill -9 "$holder" && wait "$holder" 2>/dev/null
	holder=
	rmmod gdirect
}
_test "killing the holder lets rmmod succeed" killed

# Opens racing rmmod: every open either fails (module gone) or pins the module.
insmod "$GDIRECT_MODULE" || ktap_exit_fail_msg "cannot reload $GDIRECT_MODULE"
(
	end=$(($(date +%s) + 5))
	while [ "$(date +%s)" -lt "$end" ]; do
		gdirect-ioctl get-info >/dev/null 2>&1
	done
) &
opener=$!
unloaded=0
attempts=0
while [ $unloaded -eq 0 ] && kill -0 "$opener" 2>/dev/null; do
	rmmod gdirect 2>/dev/null && unloaded=1
	attempts=$((attempts + 1))
done
wait "$opener"
# The opener may have held the device at each attempt; once it is gone rmmod must work.
[ $unloaded -eq 0 ] && rmmod gdirect && unloaded=1 && attempts=$((attempts + 1))
ktap_print_msg "rmmod succeeded after $attempts attempt(s) while opens raced it"
_test "rmmod eventually succeeds while opens race it" _expect_eq unloaded 1 "$unloaded"
_test "opens after the unload fail cleanly" sh -c '! gdirect-ioctl get-info 2>/dev/null'

ktap_finished
