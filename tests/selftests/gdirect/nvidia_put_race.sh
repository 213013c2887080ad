#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The end of a registration (nvidia_p2p_put_pages) against the free callback,
# in each interleaving the real driver allows, forced with the emulated GPU's
# delay knob (a free holds the driver's lock between unlinking the page table
# and running the callback): put first; put while the free holds the lock
# (put_pages blocks, then returns 0 for a table the free unlinked: the case in
# which trusting its return value drops the callback's reference twice); put
# after the callback; the file closed in the window; a free under a read; the
# last reference dropped on a kernel worker (UNREGISTER under a batched read),
# where nvidia.ko's put_pages finds nothing (it looks by process): the pages
# are left to the driver, still charged to the limits (they stay pinned), and
# the free's callback cleans up and gives the charge back. 300 rounds, then
# nothing registered, pinned or mapped, and both modules unload.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
# The namespace QEMU throttles to 32 MB/s: a read is still running when the free comes.
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 6

out=$(gdirect-reg put-race 300 "$nvme0" "$slow" 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
_test "300 rounds: every free ran the callbacks expected, no put from the wrong process" \
	_expect_eq "exit status" 0 "$rc"
unlinked=$(_kv "$out" puts_unlinked)
echo "GDIRECT-FIGURE nvidia_put_race rounds=300 puts_unlinked=$unlinked orphaned=$(_kv "$out" orphaned) puts_foreign=$(_kv "$out" puts_foreign)"
_test "put_pages met tables a free had unlinked ($unlinked times)" sh -c "[ ${unlinked:-0} -gt 0 ]"
charged=$(_kv "$out" orphans_charged)
_test "registrations left to the driver stayed charged to max_pinned_bytes until their free ($charged rounds)" \
	sh -c "[ ${charged:-0} -gt 0 ]"
_test "nothing stays registered or pinned" \
	_expect_eq counters "0 0" "$(_kv "$out" registrations) $(_kv "$out" pinned_bytes)"
_test "the GPU driver holds no page table" _expect_eq mappings 0 "$(_kv "$out" egpu_mappings)"
unload() { rmmod gdirect && rmmod gdirect_egpu; }
_test "both modules unload" unload

ktap_finished
