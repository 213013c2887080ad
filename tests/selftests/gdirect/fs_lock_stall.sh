#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A free of GPU memory never waits on a file system lock that another task holds. A buffered
# write to a file, whose source page faults into a userfaultfd nobody serves (as a page of a
# stalled FUSE file would), holds the file's inode lock for as long as its owner likes; a
# direct read of that file into GPU memory, or a direct write from it (extending the file, so
# its blocks must be allocated), meets the lock; then the memory is freed. The free waits for
# the transfer's use of the pages, under the GPU driver's lock that every CUDA process needs:
# the module must hold no use while the file system waits (it tries each chunk without
# waiting, and bounces or allocates with no use held). Checked on ext4 and XFS, reads and
# writes: once the transfer's thread sleeps in the kernel (uninterruptibly, in three looks
# 50 ms apart: at the lock), the free returns while the lock is still held (within 5 s; the
# emulated GPU's free, not the module, is timed), and the transfer, once the lock is let go,
# fails with EKEYREVOKED (its memory is gone) rather than moving data. On the old module the
# free waited until the fault was served (5008 ms: `free_done_while_write_stalled=false`).
#
# Nor does the bounce pool, which every user's bounced transfers share, wait on such a lock:
# with the module loaded with bounce_buffers=1, a bounced read of the file, or a bounced write
# to it, meets the lock, and meanwhile a bounced read of another file must get the pool's one
# chunk (within 5 s, every byte right: its slot poisoned first); once the lock is let go, the
# stalled transfer moves every byte right. The old module held the chunk through the wait
# (`other_done_while_stalled=false`). A listener answering every permission event at once
# counts the stalled transfer's: its range is checked once across the wait, as read(2)'s is.
#
# Nor does a direct transfer that met the lock go through host memory for it: with the memory
# kept, once the lock is let go the transfer moves every byte right, and QEMU's trace (not the
# module) has the drive move all 1 MiB to or from the GPU's BAR, a read's none into guest RAM.
# The old module sent a read's first block through the bounce pool, to wait there. (Its write
# went peer to peer too, having waited for the lock in fallocate(2) as it allocated the
# blocks: the write's check guards against a regression; the read's tells the two apart.)
# And such a wait ends at a fatal signal: a transfer at the lock, made by a child process, is
# sent SIGKILL and the child must be gone within 5 s, the lock still held (the old module's
# write waited uninterruptibly, in fallocate(2), until the lock went).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
mnt=/mnt/gdirect-lock-stall
trap '_unload_all; umount "$mnt" 2>/dev/null' EXIT
_require_root
_require_cmd mke2fs mkfs.xfs gdirect-reg
_unload_all
insmod "$GDIRECT_MODULE" bounce_buffers=1 && _egpu_insmod ||
	ktap_exit_fail_msg "cannot load the modules (bounce_buffers=1)"

# A fresh file of 4 MiB of random bytes at $mnt/f, written back.
_fresh() {
	rm -f "$mnt/f"
	dd if=/dev/urandom of="$mnt/f" bs=1M count=4 status=none && sync
}
# gdirect-reg "$2"... on it, its lines printed after "$fs $dir$1: ", its output left in $out.
_run() {
	local label=$1
	shift
	out=$(gdirect-reg "$@" 2>&1)
	echo "$out" | while read -r l; do ktap_print_msg "$fs $dir$label: $l"; done
}

ktap_print_header
ktap_set_plan 34

for fs in ext4 xfs; do
	_fs_setup "$fs"
	_test "$fs made and mounted" _fs_make "$fs" "$FS_DEV" "$mnt"
	for dir in read write; do
		_fresh
		_run "" lock-stall "$dir" "$mnt/f"
		_test "$fs $dir: the transfer was at the lock, and the free returned while it was held" \
			_expect_eq "faulted blocked early" "true true true" \
			"$(_kv "$out" write_faulted) $(_kv "$out" transfer_blocked) $(_kv "$out" free_done_while_write_stalled)"
		_test "$fs $dir: the transfer then failed, its memory gone" \
			_expect_eq io EKEYREVOKED "$(_kv "$out" io)"
		_fresh
		_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
		_run ", memory kept" lock-stall "$dir" "$mnt/f" keep
		_test "$fs $dir, memory kept: the transfer was at the lock, and once it went moved every byte right" \
			_expect_eq "faulted blocked io right" "true true 1048576 true" \
			"$(_kv "$out" write_faulted) $(_kv "$out" transfer_blocked) $(_kv "$out" io) $(_kv "$out" bytes_right)"
		if [ "$dir" = read ]; then
			_test "$fs $dir, memory kept: QEMU's trace has all 1 MiB written into the BAR, none into RAM" \
				_dma_expect bar_read=1048576 ram_read=0
		else
			_test "$fs $dir, memory kept: QEMU's trace has all 1 MiB read from the BAR" \
				_dma_expect bar_write=1048576
		fi
		_fresh
		_run ", killed" lock-kill "$dir" "$mnt/f"
		_test "$fs $dir: a transfer at the lock is killable: its process ended within 5 s of SIGKILL, the lock still held" \
			_expect_eq "faulted blocked killed" "true true true" \
			"$(_kv "$out" write_faulted) $(_kv "$out" child_blocked) $(_kv "$out" killed_while_stalled)"
		rm -f "$mnt/f"
	done
	_bounce_stall_cases "$fs" "$mnt" lock "the lock" "the lock went"
	umount "$mnt"
done
ktap_finished
