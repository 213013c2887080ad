#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The P2P path, proven from outside the module: for every kind of P2P read the
# suite makes - synchronous reads of the raw namespace at several sizes and
# offsets, a 256-entry batch, a file on ext4 - QEMU's trace of the emulated
# NVMe (read on the host) shows every byte mapped inside the emulated GPU's BAR
# and none in guest RAM or a CMB, and the module's report agrees (path p2p,
# nothing bounced). A forced bounce of the same read shows the reverse.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

mnt=/mnt/gdirect-dma
cleanup() {
	umount "$mnt" 2>/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-io jq
_fs_setup ext4
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
K=1024
M=1048576

ktap_print_header
ktap_set_plan 9

_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"

# Usage: p2p_read LEN OFFSET [FILE [IMAGE IMAGE_OFFSET]]: one read, its report and its DMA.
p2p_read() {
	_dma_mark &&
		_gd_read "${3:-$dev}" --mem egpu --offset "$2" --len "$1" &&
		_dma_since &&
		_expect_eq "bytes path bounce_bytes" "$1 p2p 0" "$(_rj .bytes) $(_rj .path) $(_rj .bounce_bytes)" &&
		_dma_expect bar_read="$1" ram_read=0 cmb_read=0 &&
		_host_compare "gva:$(_rj .memory.address)" "${4:-nvme0}:${5:-$2}" "$1"
}
_test "4 KiB at 168 MiB: all in the BAR, none in RAM" p2p_read 4096 $((168 * M))
_test "64 KiB at 168 MiB + 12 KiB: all in the BAR" p2p_read $((64 * K)) $((168 * M + 12 * K))
_test "1 MiB + 4 KiB at 170 MiB: all in the BAR" p2p_read $((M + 4 * K)) $((170 * M))
_test "7 MiB at 172 MiB (split in transfers): all in the BAR" p2p_read $((7 * M)) $((172 * M))

batch() {
	_dma_mark || return 1
	out=$(gdirect-io batch "$dev" 2>&1)
	rc=$?
	_dma_since || return 1
	ktap_print_msg "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
	# 256 entries of 64 KiB, then 8 more reaped with WAIT, each byte checked by the tool
	# against buffered reads of the device (page cache, so through RAM), then the one entry
	# queued before another file's registration: every byte of the batches must be in the BAR.
	_expect_eq "exit" 0 "$rc" && _dma_expect bar_read=$((265 * 64 * K))
}
_test "batches of 256, 8 and 1 reads of 64 KiB: all 16.5625 MiB in the BAR" batch

file_read() {
	_fs_make ext4 "$FS_DEV" "$mnt" &&
		dd if="$dev" of="$mnt/data" bs=1M skip=180 count=6 2>/dev/null && sync &&
		echo 3 >/proc/sys/vm/drop_caches &&
		# The file's metadata comes in through RAM once; the data read after it must not.
		gdirect read "$mnt/data" --mem egpu --len 4K >/dev/null &&
		p2p_read $((6 * M)) 0 "$mnt/data" nvme0 $((180 * M))
}
_test "a 6 MiB file on ext4: all in the BAR, none in RAM" file_read
_test "the file system unmounts" umount "$mnt"

bounced() {
	_dma_mark &&
		_gd_read "$dev" --mem egpu --offset $((188 * M)) --len $((2 * M)) --force-bounce &&
		_dma_since &&
		_dma_expect bar_read=0 ram_read=$((2 * M))
}
_test "control: the same kind of read, forced to bounce, lands in RAM" bounced
_test "the module's stats agree: nothing bounced but the forced read" \
	_expect_eq "bounced" $((2 * M)) "$(( $(_stat bounce read bounce_bytes) + $(_stat p2p read bounce_bytes) ))"

ktap_finished
