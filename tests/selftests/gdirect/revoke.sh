#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Revocation: GPU memory freed while registered (as by cudaFree) runs the
# registration's free callback; every later use fails with EKEYREVOKED; the
# revocation is counted; the registration's share of the pin limits (the
# module's, its file's, its user's) is given back at the free, before its owner
# unregisters it, so that under max_pinned_bytes another registration fits
# meanwhile; UNREGISTER still works and every counter returns to zero. A
# persistent registration is not revoked: the free is deferred until it ends,
# its bytes still counted. Frees racing QUERY and UNREGISTER on another thread
# are safe.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 20

callbacks_before=$(_kv "$(_egpu_state)" callbacks)
out=$(gdirect-reg revoke "$nvme0")
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "the memory is reachable before the free" _expect_eq map_type bus_addr "$(_kv "$out" map_type)"
_test "freeing it runs one free callback" _expect_eq callbacks 1 "$(_kv "$out" free_callbacks)"
_test "the GPU driver counted the callback" \
	_expect_eq callbacks "$((callbacks_before + 1))" "$(_kv "$(_egpu_state)" callbacks)"
_test "a later QUERY fails with EKEYREVOKED" _expect_eq query EKEYREVOKED "$(_kv "$out" query_after_free)"
_test "the revocation is counted" _expect_eq revocations 1 "$(_kv "$out" revocations_delta)"
freed=$(echo "$out" | sed -n 's/^after_free //p')
_test "after the free, still registered, its 256 KiB given back (module, file, user)" \
	_expect_eq "registrations pinned file user" "1 0 0 0" \
	"$(_kv "$freed" registrations) $(_kv "$freed" pinned_bytes) $(_kv "$freed" file_pinned_bytes) $(_kv "$freed" user_pinned_bytes)"
after=$(echo "$out" | sed -n 's/^after_unregister //p')
_test "UNREGISTER of the revoked registration returns the counters to zero" \
	_expect_eq counters "0 0" "$(_kv "$after" registrations) $(_kv "$after" pinned_bytes)"
_test "the module reports the revocation" _expect_eq revocations 1 "$(_info .counters.revocations)"

pers=$(gdirect-reg revoke "$nvme0" persistent)
ktap_print_msg "$(echo "$pers" | tr '\n' ' ')"
_test "persistent: the free is deferred, no callback" \
	_expect_eq "callbacks deferred" "0 1" "$(_kv "$pers" free_callbacks) $(_kv "$pers" free_deferred)"
_test "persistent: the memory is still usable" _expect_eq query OK "$(_kv "$pers" query_after_free)"
pfreed=$(echo "$pers" | sed -n 's/^after_free //p')
_test "persistent: its 256 KiB still counted after the deferred free" \
	_expect_eq "pinned file user" "262144 262144 262144" \
	"$(_kv "$pfreed" pinned_bytes) $(_kv "$pfreed" file_pinned_bytes) $(_kv "$pfreed" user_pinned_bytes)"
_test "persistent: the allocation lives until the registration ends" \
	_expect_eq "allocations before, after" "1 0" "$(_kv "$pers" egpu_allocations_before_unregister) $(_kv "$pers" egpu_allocations_after_unregister)"
_test "the emulated GPU holds no page table" _expect_eq "allocations mappings" "0 0" \
	"$(_kv "$(_egpu_state)" allocations) $(_kv "$(_egpu_state)" mappings)"

race=$(gdirect-reg revoke-race 300 "$nvme0")
rc=$?
ktap_print_msg "$(echo "$race" | tr '\n' ' ')"
_test "300 frees racing query and unregister all end cleanly" _expect_eq "exit status" 0 "$rc"
both() { [ "$(_kv "$race" revoked)" -gt 0 ] && [ "$(_kv "$race" unregistered_first)" -gt 0 ]; }
_test "the race went both ways (frees before and after unregister)" both
_test "nothing is left registered after the race" \
	_expect_eq counters "0 0" "$(_kv "$race" registrations) $(_kv "$race" pinned_bytes)"
_test "nor held by the GPU" _expect_eq "allocations mappings" "0 0" \
	"$(_kv "$(_egpu_state)" allocations) $(_kv "$(_egpu_state)" mappings)"

# Under max_pinned_bytes = 1 MiB: the freed registration holds no share while its owner has
# not unregistered it yet.
rmmod gdirect && insmod "$GDIRECT_MODULE" max_pinned_bytes=1048576 || ktap_exit_fail_msg "cannot reload with max_pinned_bytes=1M"
quota=$(gdirect-reg revoke-quota 1048576)
ktap_print_msg "$(echo "$quota" | tr '\n' ' ')"
_test "max_pinned_bytes=1M: a second 1 MiB registration is refused (EDQUOT) while the first holds it" \
	_expect_eq second EDQUOT "$(_kv "$quota" second_before_free)"
qfreed=$(echo "$quota" | sed -n 's/^after_free //p')
qboth=$(echo "$quota" | sed -n 's/^both //p')
_test "its memory freed, not yet unregistered: the second fits, the two hold 1 MiB" \
	_expect_eq "after_free second both" "1 0 OK 2 1048576" \
	"$(_kv "$qfreed" registrations) $(_kv "$qfreed" pinned_bytes) $(_kv "$quota" second_after_free) $(_kv "$qboth" registrations) $(_kv "$qboth" pinned_bytes)"
qafter=$(echo "$quota" | sed -n 's/^after_unregister //p')
_test "both ended: every counter at zero" _expect_eq counters "0 0" \
	"$(_kv "$qafter" registrations) $(_kv "$qafter" pinned_bytes)"

ktap_finished
