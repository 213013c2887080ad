#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# max_in_flight_per_user (loaded with 8): the batched transfers of one user,
# over all its files, are capped so that no user takes every kernel worker.
# uid 1000 queues 16 reads of 4 MiB from the namespace QEMU throttles to
# 32 MB/s on one device file: 8 are queued (the file's own limit is 128); a
# second file of the same user queues into what completes until the user's 8
# are in flight again, and is refused then (EDQUOT, the library's
# user_transfer_limit). Root, another user, queues 8 meanwhile. Once uid 1000
# has reaped its reads, its second file queues again.
#
# max_bounce_per_user (loaded with 1, and bounce_buffers=4): 4 threads of
# forced-bounce reads from the throttled namespace, their states sampled for
# 3 s: never more than one waiting for its bio at once (the one whose chunk
# is being read; the others wait for the user's chunk, interruptibly), every
# byte right. With the per-user cap off, the same sampling sees two or more.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_unload_all
insmod "$GDIRECT_MODULE" max_in_flight_per_user=8 ||
	ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with max_in_flight_per_user=8"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
_add_test_user
chgrp gdirect /dev/gdirect /dev/gdirect_egpu && chmod 0660 /dev/gdirect_egpu
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 9

out=$(gdirect-io user-cap "$slow" 8 2>&1)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
# A first read may be over before SUBMIT has looked at the last entries (the throttle lets a
# first request through at once): then 8 plus those done are queued.
first=$(_kv "$out" user_first) done=$(_kv "$out" user_first_done)
_test "uid 1000 queues 16 reads on one file: 8, and one more for each that was done meanwhile" \
	sh -c "[ '$first' -ge 8 ] && [ '$first' -lt 16 ] && [ \$(( $first - ${done:-0} )) -le 8 ]"
_test "its second file is refused once the user's 8 are in flight (EDQUOT: user_transfer_limit)" \
	_expect_eq outcome user_transfer_limit "$(_kv "$out" user_second_file)"
_test "root queues 8 meanwhile" _expect_eq queued 8 "$(_kv "$out" root)"
_test "its reads reaped, uid 1000's second file queues one" _expect_eq queued 1 "$(_kv "$out" user_after)"
_test "nothing stays registered or pinned" _expect_unpinned

# The bounce pool: one chunk per user at a time, then no per-user cap.
# bounce_run CAP: 4 threads of forced-bounce reads with max_bounce_per_user=CAP.
bounce_run() {
	_unload_all
	insmod "$GDIRECT_MODULE" bounce_buffers=4 max_bounce_per_user="$1" ||
		ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with max_bounce_per_user=$1"
	_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
	gdirect-io bounce-cap "$slow" 4 2>&1
}
capped=$(bounce_run 1)
ktap_print_msg "max_bounce_per_user=1: $(echo "$capped" | tr '\n' ' ')"
open=$(bounce_run 0)
ktap_print_msg "max_bounce_per_user=0: $(echo "$open" | tr '\n' ' ')"
_test "4 threads of one user's bounced reads: never more than one reading at once" \
	_expect_eq "most in I/O" 1 "$(_kv "$capped" max_in_io)"
_test "and every byte of each read right" \
	sh -c "[ '$(_kv "$capped" reads)' -gt 0 ] && [ '$(_kv "$capped" bad)' = 0 ]"
_test "the per-user cap off, the sampling sees two or more reading at once" \
	sh -c "[ '$(_kv "$open" max_in_io)' -ge 2 ]"
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
