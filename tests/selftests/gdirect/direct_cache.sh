#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The library's DirectCache, which the Python package moves CUDA memory through (a tensor's
# allocation registered once, at its first transfer, and kept for the next), on the emulated
# GPU's memory: four reads into parts of one allocation go through the module with one
# registration (the emulator counts one page table handed out, not four), every destination
# poisoned first and compared with the drive's bytes, and QEMU's trace shows every byte went
# into the BAR; a request past the allocation's registrable end is left to the compat
# engine; the allocation freed (its free callback revokes the cache's registration) and
# another made at its address gets a new registration, and the bytes land in the new pages
# (the emulator warns of any DMA into the freed ones); once the cache lets go nothing is
# pinned, by the module's, the kernel's and the emulator's accounts.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-io gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL namespace"

ktap_print_header
ktap_set_plan 7

# The tool's reference: the drive's first 13 MiB, copied before the trace's mark, so that
# QEMU's trace sees the module's reads alone.
dd if="$dev0" of=/tmp/direct-cache-ref bs=1M count=13 2>/dev/null ||
	ktap_exit_fail_msg "cannot copy the reference"
_dmesg_mark
_dma_mark || ktap_exit_fail_msg "no DMA trace"
out=$(gdirect-io direct-cache "$dev0" /tmp/direct-cache-ref)
rc=$?
rm -f /tmp/direct-cache-ref
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_dma_since || ktap_exit_fail_msg "no DMA trace"
# Two rounds of 1 MiB + 4 KiB + 3 MiB + 64 KiB.
each=$((1048576 + 4096 + 3145728 + 65536))

_test "every read exact, into poisoned memory (the tool compares each with the drive)" \
	_expect_eq "exit, failures" "0 0" "$rc $(echo "$out" | grep -c '^FAIL')"
_test "first round: 4 reads through the module, 1 registration, 1 page table (emulator)" \
	_expect_eq "first" "module=4 of 4 registrations=1 page_tables=1" \
	"$(echo "$out" | sed -n 's/^first: //p')"
_test "a request past the allocation's end: left to the compat engine, as unaligned" \
	_expect_eq past_end unaligned "$(_kv "$out" past_end)"
_test "the free revoked the registration; the next allocation has its address" \
	_expect_eq freed "callbacks=1 same_address=true" "$(echo "$out" | sed -n 's/^freed: //p')"
_test "second round: registered again, 4 reads through the module, 1 page table" \
	_expect_eq again "module=4 of 4 registrations=1 page_tables=1" \
	"$(echo "$out" | sed -n 's/^again: //p')"
_test "QEMU's trace: both rounds' bytes into the BAR, none into RAM" \
	_dma_expect bar_read=$((2 * each)) ram_read=0
cleared() {
	_expect_eq cleared "registrations=0 page_tables=0" "$(echo "$out" | sed -n 's/^cleared: //p')" &&
		_expect_unpinned &&
		! _dmesg_since_mark | grep -q "written after it was freed"
}
_test "cleared: nothing held by any account, no DMA into freed GPU pages" cleared

ktap_finished
