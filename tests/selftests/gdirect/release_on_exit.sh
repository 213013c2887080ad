#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A process killed with -9 while holding host, GPU and P2P registrations leaves
# nothing behind: the kernel's count of pinned pages, the module's counters, the
# emulated GPU's page tables and allocations, and the CMB's P2P pool all return to
# their state before.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

holder=
cleanup() {
	[ -n "$holder" ] && kill -9 "$holder" 2>/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
cmb=/sys/bus/pci/devices/$nvme0/p2pmem

ktap_print_header
ktap_set_plan 7

available=$(cat "$cmb/available")
gdirect-reg hold "$nvme0" >/tmp/hold.out 2>&1 &
holder=$!
i=0
while ! grep -q '^ready' /tmp/hold.out && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
ktap_print_msg "$(cat /tmp/hold.out)"
_test "the holder registered host, GPU and P2P memory" _expect_eq registrations 3 "$(_info .counters.registrations)"
fdinfo() {
	for f in /proc/$holder/fdinfo/*; do
		grep -q '^gdirect-registrations' "$f" && sed -n 's/^gdirect-registrations:\t//p' "$f"
	done
}
_test "its open file reports them in fdinfo" _expect_eq fdinfo 3 "$(fdinfo)"
# 1 MiB of host memory and 64 KiB of the CMB are pinned through GUP (pin_user_pages_fast); the
# GPU memory through nv-p2p (the emulated driver's page table), which the kernel does not count.
_test "the kernel counts 272 pages pinned: 256 of host memory, 16 of the CMB" \
	_expect_eq "nr_foll_pin_acquired - released" 272 "$(_kernel_pins)"

kill -9 "$holder"
wait "$holder" 2>/dev/null
holder=
_test "after kill -9 nothing is registered or pinned, by the module, the kernel and the GPU" _expect_unpinned
state=$(_egpu_state)
_test "the GPU holds no page table and no allocation" \
	_expect_eq "mappings allocations" "0 0" "$(_kv "$state" mappings) $(_kv "$state" allocations)"
_test "the CMB pool is whole again" _expect_eq available "$available" "$(cat "$cmb/available")"
_test "both modules unload" sh -c 'rmmod gdirect && rmmod gdirect_egpu'

ktap_finished
