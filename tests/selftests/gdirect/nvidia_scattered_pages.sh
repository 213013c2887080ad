#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# GPU memory is not one run of the BAR: the emulated GPU places each 64 KiB page of an
# allocation at a random place (never next to its neighbour where the free space allows), as
# a GPU's memory manager does, and says where in its page directory (BAR2's last page). The
# module must address every page by its own page-table entry: QUERY's bus addresses are
# checked page by page against the directory, and reads and writes spanning 128 scattered
# pages are compared byte for byte by the host, which follows the directory in the GPU's
# backing file itself (tests/vm/gpu_mem.py). QEMU's trace shows the P2P bytes went into the
# BAR. A module that computed a page's address from its neighbour's (mutation 03) lands bytes
# in other allocations' pages and fails every check here.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
dev0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL namespace"
dev1=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL namespace"
M=1048576

ktap_print_header
ktap_set_plan 9

out=$(gdirect-reg egpu $((8 * M)) "$nvme0")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "8 MiB of GPU memory: 128 pages, no two neighbours adjacent in the BAR, poisoned" \
	_expect_eq "exit pages adjacent poisoned" "0 128 0 true" \
	"$rc $(_kv "$out" pages) $(_kv "$out" adjacent_pages) $(_kv "$out" poisoned)"
_test "QUERY: every page's bus address is its own BAR page's (from the GPU's page directory)" \
	_expect_eq bus_match 128/128 "$(_kv "$out" bus_match)"

# A P2P read of 8 MiB: 128 pages, each its own run of the BAR.
p2p_read() {
	_dma_mark &&
		_gd_read "$dev0" --mem egpu --offset $((40 * M)) --len 8M &&
		_dma_since &&
		_expect_eq "path" "p2p none" "$(_rj .path) $(_rj .reason)" &&
		_expect_eq "runs of adjacent BAR pages" 128 "$(_rj '.memory.bar_runs | length')" &&
		_dma_expect bar_read=$((8 * M)) ram_read=0
}
_test "a P2P read spanning 128 scattered pages: all into the BAR (QEMU's trace)" p2p_read
_test "the host finds the drive's bytes at each page's place" \
	_host_compare "gva:$(_rj .memory.address)" "nvme0:$((40 * M))" $((8 * M))
# Succeeds when the bytes are NOT at the first page's offset plus the distance: the 8 MiB
# from the first page on, as one run, differs from the drive's bytes.
not_one_run() {
	first=$(($(_rj '.memory.bar_runs[0]' | cut -d+ -f1)))
	! _host_compare "gpu:$first" "nvme0:$((40 * M))" $((8 * M)) 2>/dev/null
}
_test "and not where the pages would be if the allocation were one run" not_one_run

# Read at an offset that is not a multiple of the page size, into memory, 3 MiB + 4 KiB.
bounce_read() {
	_gd_read "$dev1" --mem egpu --offset $((6 * M + 4096)) --len $((3 * M + 4096)) &&
		_expect_eq "path" "bounce distance" "$(_rj .path) $(_rj .reason)"
}
_test "a bounced read (the NVMe across the host bridge) into scattered pages" bounce_read
_test "the host finds its bytes at each page's place" \
	_host_compare "gva:$(_rj .memory.address)" "nvme1:$((6 * M + 4096))" $((3 * M + 4096))

# A P2P write from 128 scattered pages (filled through the page directory with the first
# 8 MiB of the other drive) to the NVMe at 200 MiB; the drive then holds those bytes.
dd if="$dev1" of=/tmp/scatter-src bs=1M count=8 iflag=direct 2>/dev/null
p2p_write() {
	_dma_mark &&
		w=$(gdirect write "$dev0" --from /tmp/scatter-src --mem egpu --offset 200M --json) &&
		_dma_since &&
		ktap_print_msg "$(echo "$w" | jq -c '{bytes,path,reason,runs: (.memory.bar_runs | length)}')" &&
		_expect_eq "bytes path" "$((8 * M)) p2p" "$(echo "$w" | jq -r '"\(.bytes) \(.path)"')" &&
		_dma_expect bar_write=$((8 * M)) ram_write=0
}
_test "a P2P write from 128 scattered pages: all from the BAR (QEMU's trace)" p2p_write
_test "the drive image holds the source's bytes (host check)" _host_compare "nvme0:$((200 * M))" nvme1:0 $((8 * M))

ktap_finished
