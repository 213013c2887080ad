#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Every limit and its errno. Loaded with max_in_flight=4, bounce_buffers=1,
# max_pinned_bytes=64M and max_registrations=8:
#  - one SUBMIT of 32 queues at most 4, and all 32 complete;
#  - 16 threads of bounced reads share one bounce buffer: they wait, never fail,
#    every byte right;
#  - host memory is charged to the caller's RLIMIT_MEMLOCK (ENOMEM past it,
#    unless it has CAP_IPC_LOCK), GPU memory is not;
#  - max_pinned_bytes over all providers (EDQUOT), max_registrations per file
#    (EMFILE).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io gdirect-reg
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
_unload_all
insmod "$GDIRECT_MODULE" max_in_flight=4 bounce_buffers=1 max_pinned_bytes=67108864 max_registrations=8 ||
	ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with small limits"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
_add_test_user
chgrp gdirect /dev/gdirect /dev/gdirect_egpu && chmod 0660 /dev/gdirect_egpu
kv() { echo "$1" | sed -nE "s/(^|.* )$2=([^ ]*).*/\2/p" | head -n 1; }

ktap_print_header
ktap_set_plan 12

out=$(gdirect-io limits "$ns" 1048576)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "max_in_flight=4: one SUBMIT of 32 queues 4" _expect_eq first_submit 4 "$(kv "$out" first_submit)"
_test "and all 32 complete" _expect_eq batch_ok 32 "$(kv "$out" batch_ok)"
_test "one bounce buffer, 16 threads: 64 bounced reads, every byte right" \
	_expect_eq "bounce ok bad" "64 0" "$(kv "$out" bounce_ok) $(kv "$out" bounce_bad)"

user=$(_as_user "ulimit -l 64; gdirect-io limits $ns 1048576" 2>&1)
ktap_print_msg "as uid 1000 with ulimit -l 64: $(echo "$user" | grep register | tr '\n' ' ')"
_test "RLIMIT_MEMLOCK 64 KiB: 1 MiB of host memory is refused (ENOMEM)" _expect_eq host ENOMEM "$(kv "$user" host_register)"
small=$(_as_user "ulimit -l 64; gdirect-io limits $ns 32768" 2>&1)
_test "32 KiB fits under it" _expect_eq host OK "$(kv "$small" host_register)"
_test "GPU memory is not charged to it" _expect_eq gpu OK "$(kv "$user" gpu_register)"
root=$(sh -c "ulimit -l 64; gdirect-io limits $ns 1048576" 2>&1)
_test "CAP_IPC_LOCK lifts it (root, same limit)" _expect_eq host OK "$(kv "$root" host_register)"
_test "nothing stays pinned after those runs" _expect_unpinned

out=$(gdirect-reg limits 2>&1)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "max_pinned_bytes=64M: a registration of exactly 64 MiB is accepted" _expect_eq at OK "$(_kv "$out" at_pin_limit)"
_test "max_pinned_bytes=64M: a registration past it gets EDQUOT" _expect_eq over EDQUOT "$(_kv "$out" over_pin_limit)"
_test "max_registrations=8: the 9th on one file gets EMFILE" \
	_expect_eq "registered, then" "8 EMFILE" "$(_kv "$out" registered) $(_kv "$out" over_registration_limit)"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
