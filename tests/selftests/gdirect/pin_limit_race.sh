#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# max_pinned_bytes under racing REGISTERs (loaded with 64 MiB): a holder keeps
# 32 MiB + 4 KiB registered while, for 5 s, a competitor tries to register as
# much again and two threads send REGISTERs whose length, added to the module's
# total, wraps it past 2^64 to 0. The reservation checks before it adds (a
# compare-exchange), so no total past the limit, or wrapped, is ever seen: every
# competitor try and every wrapping length gets EDQUOT. (Adding first and taking
# back on failure showed the competitor a total of 0 for an instant.) Once the
# holder lets go, the competitor's registration succeeds.
#
# A REGISTER of GPU memory waiting behind the nvidia provider's get/put lock
# (held by an UNREGISTER whose put_pages waits in a free's window: the emulated
# driver holds its lock for 1 s) holds no share of the limit meanwhile: a
# host REGISTER of 32 MiB + 64 KiB, which fits only if the waiting one holds
# nothing, is accepted while it still waits; the waiting one, asking as much,
# then gets EDQUOT. (Reserving before the wait refused the host one instead.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_unload_all
insmod "$GDIRECT_MODULE" max_pinned_bytes=67108864 ||
	ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with max_pinned_bytes=64M"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"

ktap_print_header
ktap_set_plan 8

out=$(gdirect-reg pin-race 5 2>&1)
rc=$?
ktap_print_msg "$out"
echo "GDIRECT-FIGURE pin_limit_race $(echo "$out" | tail -n 1)"
_test "the race ran: the competitor and the wrapping lengths were tried" \
	sh -c "[ $rc -eq 0 ] && [ '$(_kv "$out" competitor_tries)' -gt 0 ] && [ '$(_kv "$out" wraps)' -gt 0 ]"
_test "no competitor registration got past the limit while the holder held half of it" \
	_expect_eq "passed, other outcomes" "0 0" "$(_kv "$out" competitor_passed) $(_kv "$out" competitor_other)"
_test "every wrapping length was refused with EDQUOT" \
	_expect_eq refused "$(_kv "$out" wraps)" "$(_kv "$out" wraps_refused)"
_test "once the holder let go, the competitor's registration succeeded" \
	_expect_eq outcome OK "$(_kv "$out" competitor_after_release)"

out=$(gdirect-reg pin-wait 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "a GPU REGISTER slept (state D, the kernel's word) behind the put as the host one began" \
	_expect_eq "exit status, waiting" "0 yes" "$rc $(_kv "$out" waiting_then)"
_test "the host REGISTER of 32 MiB + 64 KiB was accepted meanwhile: the waiting one held no share" \
	_expect_eq outcome OK "$(_kv "$out" host_during_wait)"
_test "the waiting GPU REGISTER of as much then got EDQUOT" \
	_expect_eq outcome EDQUOT "$(_kv "$out" gpu_after_wait)"
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
