#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The order of a free, as nvidia.ko runs it (nv_p2p_mem_info_free_callback): the client's free
# callback first, its page table still linked, then the unlink. The module's callback hands
# its table back the one way nv-p2p allows there, nvidia_p2p_free_page_table (never
# put_pages), and does so while the table is still linked: the emulated GPU counts each
# free_page_table call by who made it (the callback of that very table, the table linked, or
# anyone else), so the evidence is the emulator's, not the module's. Frees of single
# registrations, a persistent registration (no callback, no free of its table), frees racing
# the registrations' own ends (the delay knob of nvidia_put_race) and frees run by a kernel
# worker under the driver's lock (nvidia_callback_locked's) each give one callback free per
# callback and no other; then nothing is held. (nvidia_p2p_dma_unmap_pages from a callback,
# which nv-p2p allows and the emulator serves, has no counterpart in the module: it maps
# peers itself, never with nvidia_p2p_dma_map_pages.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 5

# "callbacks callback_frees stray_frees" of the emulated GPU now.
counts() {
	s=$(_egpu_state) || return 1
	echo "$(_kv "$s" callbacks) $(_kv "$s" callback_frees) $(_kv "$s" stray_frees)"
}
# The change of those three since $1 ("callbacks callback_frees stray_frees").
since() {
	set -- $1 $(counts)
	echo "$(($4 - $1)) $(($5 - $2)) $(($6 - $3))"
}

base=$(counts) || ktap_exit_fail_msg "the emulated GPU does not answer"
out=$(gdirect-reg revoke "$nvme0")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "a free: one callback, which freed its own table while it was still linked" \
	_expect_eq "exit, the tool's callbacks; callbacks callback_frees stray_frees" "0 1; 1 1 0" \
	"$rc $(_kv "$out" free_callbacks); $(since "$base")"

base=$(counts)
out=$(gdirect-reg revoke "$nvme0" persistent)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "a persistent registration's free: no callback, no table freed" \
	_expect_eq "exit, the tool's deferred frees; callbacks callback_frees stray_frees" "0 1; 0 0 0" \
	"$rc $(_kv "$out" free_deferred); $(since "$base")"

# The tool's outcome (no failure but, for put-race, its own checks of how often its rounds
# met the windows it aims at, which need nvidia_put_race's 300 rounds), and since $base: at
# least $1 callbacks (exactly $1 when $2 is "exact"), each with its callback free, and no
# other free.
freed_by_callbacks() {
	fails=$(echo "$out" | grep '^FAIL' |
		grep -vE 'were left to the driver|met an unlinked table in the window')
	set -- "$1" "$2" $(since "$base")
	_expect_eq "the tool's failures" "" "$fails" && [ "$rc" -le 1 ] &&
		_expect_ge callbacks "$1" "$3" &&
		{ [ "$2" != exact ] || _expect_eq callbacks "$1" "$3"; } &&
		_expect_eq "callback_frees stray_frees" "$3 0" "$4 $5"
}

base=$(counts)
out=$(gdirect-reg put-race 40 "$nvme0" "$slow" 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
_test "frees racing the registrations' ends: one callback free per callback, none other" \
	freed_by_callbacks 1 some

base=$(counts)
out=$(gdirect-reg callback-locked 10 "$nvme0" "$slow" 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
_test "frees under the driver's lock, half from a kernel worker: the same" \
	freed_by_callbacks 10 exact
_test "nothing is left" _expect_unpinned

ktap_finished
