# SPDX-License-Identifier: GPL-2.0
#
# The body of read_ext4.sh and read_xfs.sh: sourced after gdirect_common.sh
# with FS set to ext4 or xfs. Formats a namespace of the switch NVMe, fills
# files from regions of the raw namespace (bytes the host knows), and reads
# them into GPU memory: a plain file, a sparse one (holes read as zeros), one
# that ends within a block (a short read at EOF, reported), one whose pages are
# dirty and one of many extents none of which is in memory. The host compares
# its /dev/shm file with its drive image and with zeros, and QEMU's trace of the
# drive's DMA shows the data went into the GPU's BAR.

mnt=/mnt/gdirect-$FS
cleanup() {
	umount "$mnt" 2>/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_fs_setup "$FS" gdirect jq
fsdev=$FS_DEV
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
MiB=1048576

ktap_print_header
ktap_set_plan 23

_test "$FS made on $fsdev (a namespace of the switch NVMe) and mounted" _fs_make "$FS" "$fsdev" "$mnt"

# plain: raw bytes [2 MiB, 6 MiB); sparse: 1 MiB from 8 MiB, a 2 MiB hole, 1 MiB
# from 9 MiB; short: 1 MiB + 1000 bytes from 12 MiB.
fill() {
	dd if="$raw" of="$mnt/plain" bs=1M skip=2 count=4 2>/dev/null &&
		dd if="$raw" of="$mnt/sparse" bs=1M skip=8 count=1 2>/dev/null &&
		dd if="$raw" of="$mnt/sparse" bs=1M skip=9 seek=3 count=1 conv=notrunc 2>/dev/null &&
		dd if="$raw" bs=1M skip=12 count=2 2>/dev/null | head -c $((MiB + 1000)) >"$mnt/short" &&
		sync && echo 3 >/proc/sys/vm/drop_caches
}
_test "files written from the raw namespace" fill
holes() { [ "$(stat -c %b "$mnt/sparse")" -lt $((4 * MiB / 512)) ]; }
_test "the sparse file has holes ($(stat -c %b "$mnt/sparse") blocks of 512 for 4 MiB)" holes

# Each read between two marks of QEMU's trace of the drives' DMA (the host's account).
traced_read() { _dma_mark && _gd_read "$@" && _dma_since; }
_test "plain: 4 MiB read into GPU memory" traced_read "$mnt/plain" --mem egpu
_test "plain: peer to peer from the switch NVMe" _expect_eq path "p2p none" "$(_rj .path) $(_rj .reason)"
_test "plain: QEMU's trace: the 4 MiB went into the GPU's BAR" _dma_expect bar_read=$((4 * MiB))
_test "plain: the host finds the raw bytes in GPU memory" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((2 * MiB)) $((4 * MiB))

_test "sparse: 4 MiB read" traced_read "$mnt/sparse" --mem egpu
_test "sparse: all 4 MiB, no EOF" _expect_eq "bytes eof" "$((4 * MiB)) false" "$(_rj .bytes) $(_rj .eof)"
_test "sparse: QEMU's trace: its 2 MiB of data went into the BAR, the hole read no drive" \
	_dma_expect bar_read=$((2 * MiB))
va=$(_rj .memory.address)
sparse_ok() {
	_host_compare "gva:$va" nvme0:$((8 * MiB)) $MiB &&
		_host_compare "gva:$((va + MiB))" zero:0 $((2 * MiB)) &&
		_host_compare "gva:$((va + 3 * MiB))" nvme0:$((9 * MiB)) $MiB
}
_test "sparse: data where written, zeros in the hole (host check)" sparse_ok

_test "short: a 2 MiB read of a 1 MiB + 1000 byte file succeeds" _gd_read "$mnt/short" --mem egpu --len 2M
_test "short: it stops at the end of the file and says so" \
	_expect_eq "bytes eof" "$((MiB + 1000)) true" "$(_rj .bytes) $(_rj .eof)"
va=$(_rj .memory.address)
short_ok() {
	_host_compare "gva:$va" nvme0:$((12 * MiB)) $MiB &&
		_host_compare "gva:$((va + MiB))" nvme0:$((13 * MiB)) 1000
}
_test "short: the bytes up to the end are the file's (host check)" short_ok
# dirty: raw bytes [16 MiB, 20 MiB) written through the page cache and not synced. A direct
# read waits for their writeback; the module has it done with the GPU memory not held (a chunk
# tried without waiting is refused while its range is dirty), then reads peer to peer.
dd if="$raw" of="$mnt/dirty" bs=1M skip=16 count=4 2>/dev/null
_test "dirty: 4 MiB read of a file whose pages are dirty" _gd_read "$mnt/dirty" --mem egpu
_test "dirty: peer to peer, none of it through host memory" \
	_expect_eq "bytes path bounce_bytes" "$((4 * MiB)) p2p 0" "$(_rj .bytes) $(_rj .path) $(_rj .bounce_bytes)"
_test "dirty: the host finds the file's bytes in GPU memory" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((16 * MiB)) $((4 * MiB))
# cold: raw bytes [24 MiB, 28 MiB) written 64 KiB at a time, each piece followed by one of
# another file's, so the file has more extents than its inode holds (XFS: 64, in a btree; ext4,
# which merges some: more than 4, in a tree block), then the file system mounted again, so none
# of its extents is in memory. XFS refuses a read
# without waiting until they are read in (xfs_ilock_for_iomap()); the module has one block go
# through host memory, whose read waits for that with the GPU memory not held, and reads the
# rest peer to peer.
cold() {
	i=0
	while [ $i -lt 64 ]; do
		dd if="$raw" of="$mnt/cold" bs=64K skip=$((384 + i)) seek=$i count=1 conv=notrunc \
			oflag=direct 2>/dev/null &&
			dd if=/dev/zero of="$mnt/between" bs=64K seek=$i count=1 conv=notrunc \
				oflag=direct 2>/dev/null || return 1
		i=$((i + 1))
	done
	n=$(gdirect-io fiemap "$mnt/cold" | wc -l)
	ktap_print_msg "cold: $n extents"
	least=5
	[ "$FS" = xfs ] && least=32
	umount "$mnt" && mount -t "$FS" "$fsdev" "$mnt" && [ "$n" -ge $least ]
}
_test "cold: 4 MiB in more extents than the inode holds, the file system mounted again" cold
_test "cold: 4 MiB read into GPU memory" traced_read "$mnt/cold" --mem egpu
block=$(stat -f -c %S "$mnt")
cold_bounce() {
	_expect_eq "bytes path" "$((4 * MiB)) p2p" "$(_rj .bytes) $(_rj .path)" &&
		[ "$(_rj .bounce_bytes)" -le "$block" ] ||
		{ ktap_print_msg "bounce_bytes $(_rj .bounce_bytes), more than a block ($block)"; return 1; }
}
_test "cold: peer to peer, at most a block ($block bytes) through host memory" cold_bounce
_test "cold: QEMU's trace: the rest went into the GPU's BAR" \
	_dma_expect bar_read=$((4 * MiB - $(_rj .bounce_bytes)))
_test "cold: the host finds the raw bytes in GPU memory" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((24 * MiB)) $((4 * MiB))
_test "the file system unmounts cleanly" umount "$mnt"
