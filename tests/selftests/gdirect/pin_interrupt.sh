#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A pin that cannot finish is ended by a fatal signal, and leaves nothing behind. The
# REGISTER of 64 MiB of host memory reaches a last page whose fault waits on a userfaultfd
# that is never served (as memory behind a stalled FUSE file or fault handler would): the
# process sleeps in the page fault, killable (GUP's fault path; the module's pin loop also
# stops between batches on a fatal signal and returns EINTR). SIGKILL must end it at once;
# then no registration and no pinned byte remain, and the device works for the next caller.
# (The EINTR itself reaches no one: the process it would return to is being killed.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

out=/tmp/pin_interrupt.$$
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	rm -f "$out"
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-reg gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"

ktap_print_header
ktap_set_plan 6

gdirect-reg pin-stall $((64 << 20)) >"$out" 2>&1 &
pid=$!
i=0
while ! grep -q '^faulted' "$out" && kill -0 "$pid" 2>/dev/null && [ $i -lt 200 ]; do
	sleep 0.1
	i=$((i + 1))
done
ktap_print_msg "$(tr '\n' ' ' <"$out")"
_test "the pin reaches the never-served page (its fault waits on the userfaultfd)" grep -q '^faulted' "$out"
sleep 1
# Where the registering thread sleeps: in the userfaultfd's fault handling.
waits() {
	for t in /proc/"$pid"/task/*; do
		grep -q userfault "$t/wchan" 2>/dev/null && return 0
	done
	cat /proc/"$pid"/task/*/wchan 2>/dev/null | tr '\0' ' ' | sed 's/^/# wchan: /'
	echo
	return 1
}
_test "a second later the REGISTER still waits, in handle_userfault" waits
regs=$(_info .counters.registrations)
_test "meanwhile nothing is registered (the registration exists only once pinned)" _expect_eq registrations 0 "$regs"

start=$(date +%s)
kill -9 "$pid"
i=0
while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
	sleep 0.1
	i=$((i + 1))
done
took=$(($(date +%s) - start))
gone() { ! kill -0 "$pid" 2>/dev/null; }
_test "SIGKILL ends the pinning process (in ${took} s)" gone
wait "$pid" 2>/dev/null
pid=
_test "no registration and no pinned byte remain" \
	_expect_unpinned
next() { gdirect-reg pin host $((1 << 20)) | grep -q '^register=OK'; }
_test "the next caller registers as before" next

ktap_finished
