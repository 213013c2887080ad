#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# BAR1 is finite: on a GPU without a static BAR1 as large as its memory, every nv-p2p page
# table is mapped into the BAR1 aperture, and nvidia_p2p_get_pages fails with -ENOMEM once it
# is full (NV_ERR_NO_MEMORY, nvidia_p2p_map_status). The emulated GPU, loaded with a 4 MiB
# BAR1 (bar1_mib=4), counts what its page tables map. With 4 MiB registered by a holder, a
# REGISTER of 64 KiB more is refused with ENOMEM (the uapi header's errno), the refused
# REGISTER leaves nothing pinned (the kernel's count) and no page table with the GPU (its own
# count), and once the holder is gone the aperture is free again: a registration of exactly
# 4 MiB works, two registrations of the same 4 MiB share their BAR1 mapping (as nvidia.ko
# reuses a memory's mapping extents), and a read through it lands (host-compared). BAR1 space
# comes back when the last page table covering it is put, never sooner.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

holder=
cleanup() {
	if [ -n "$holder" ]; then
		kill $(sed -n 's/^ready pid=//p' /tmp/bar1.hold) "$holder" 2>/dev/null
		wait "$holder" 2>/dev/null
	fi
	rm -f /tmp/bar1.hold
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
dev0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL namespace"
M=1048576

ktap_print_header
ktap_set_plan 11

_test "the emulated GPU loads with a 4 MiB BAR1" _egpu_insmod bar1_mib=4
_test "it reports a 4 MiB BAR1, none of it used" \
	_expect_eq "bar1_size bar1_used" "$((4 * M)) 0" "$(_kv "$(_egpu_state)" bar1_size) $(_kv "$(_egpu_state)" bar1_used)"

gdirect-reg pin egpu $((4 * M)) hold >/tmp/bar1.hold 2>&1 &
holder=$!
i=0
while ! grep -q '^ready' /tmp/bar1.hold && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
ktap_print_msg "holder: $(tr '\n' ' ' </tmp/bar1.hold)"
_test "a holder registers 4 MiB: all of BAR1 mapped" \
	_expect_eq "register bar1_used" "OK $((4 * M))" "$(_kv "$(cat /tmp/bar1.hold)" register) $(_kv "$(_egpu_state)" bar1_used)"

pins_before=$(_kernel_pins)
over=$(gdirect-reg pin egpu 65536)
ktap_print_msg "64 KiB more: $over"
_test "64 KiB more: REGISTER refused with ENOMEM; the GPU holds only the holder's page table" \
	_expect_eq "register egpu_mappings" "ENOMEM 1" "$(_kv "$over" register) $(_kv "$over" egpu_mappings)"
_test "nothing more pinned (the kernel's count), one registration left (the module's)" \
	_expect_eq "kernel pins; registrations" "$pins_before; 1" "$(_kernel_pins); $(_info .counters.registrations)"

kill $(sed -n 's/^ready pid=//p' /tmp/bar1.hold) "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
holder=
_test "the holder gone: nothing pinned, no page table held" _expect_unpinned
_test "its BAR1 space is back" _expect_eq bar1_used 0 "$(_kv "$(_egpu_state)" bar1_used)"

exact=$(gdirect-reg pin egpu $((4 * M)))
_test "a registration of exactly 4 MiB fits" _expect_eq register OK "$(_kv "$exact" register)"
# nvidia.ko maps a range into BAR1 once, shared by every page table of that memory.
share=$(gdirect-reg bar1-share $((4 * M)))
ktap_print_msg "$(echo "$share" | tr '\n' ' ')"
_test "two registrations of the same 4 MiB share its BAR1 mapping: both fit" \
	_expect_eq "first second bar1_used mappings" "OK OK $((4 * M)) 2" \
	"$(_kv "$share" first) $(_kv "$share" second) $(_kv "$share" bar1_used) $(_kv "$share" mappings)"
_test "the space stays mapped until the last of them is put" \
	_expect_eq "after one put, after both" "$((4 * M)) 0" \
	"$(echo "$share" | sed -n 's/^after_one_put bar1_used=//p') $(echo "$share" | sed -n 's/^after_both bar1_used=//p')"
read_exact() {
	_gd_read "$dev0" --mem egpu --offset $((60 * M)) --len 4M &&
		_expect_eq "bytes path" "$((4 * M)) p2p" "$(_rj .bytes) $(_rj .path)" &&
		_host_compare "gva:$(_rj .memory.address)" "nvme0:$((60 * M))" $((4 * M))
}
_test "a 4 MiB read through all of BAR1 lands (host check)" read_exact

ktap_finished
