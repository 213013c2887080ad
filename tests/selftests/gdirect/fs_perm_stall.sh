#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A free of GPU memory never waits for a fanotify listener. A direct read or write asks the
# kernel's permission checks first (rw_verify_area()), and a listener of permission events
# answers them as late as it likes: an on-access scanner checks a file before each read
# (FAN_ACCESS_PERM), a hierarchical storage manager fills a range from elsewhere before it is
# read or written (FAN_PRE_ACCESS). The free waits for the transfer's use of the pages, under
# the GPU driver's lock that every CUDA process needs: the module must make those checks before
# it takes the use. Checked on ext4 and XFS: a read with a FAN_ACCESS_PERM listener, a write with
# a FAN_PRE_ACCESS one; the listener holds the transfer's event (the transfer is then at the
# check, from this process), the memory is freed, and the free must return within 5 s while the
# event is unanswered (the emulated GPU's free is timed, not the module); once it is answered,
# the transfer fails with EKEYREVOKED (its memory is gone) rather than moving data, and nothing
# stays registered. On the module that called vfs_iocb_iter_read/_write with the use held, the
# free waited for the answer (free_done_while_unanswered=false).
#
# Nor does the bounce pool, which every user's bounced transfers share, wait for a listener:
# with the module loaded with bounce_buffers=1, a bounced read or write of the file waits for
# its unanswered event, and meanwhile a bounced read of another file must get the pool's one
# chunk (within 5 s, every byte right: its slot poisoned first); once the event is answered, the
# stalled transfer moves every byte right. The old module made a bounced chunk's checks with the
# chunk held (`other_done_while_stalled=false`).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
mnt=/mnt/gdirect-perm-stall
trap '_unload_all; umount "$mnt" 2>/dev/null' EXIT
_require_root
_require_cmd mke2fs mkfs.xfs gdirect-reg
# The rig's kernels have fanotify (kernel/config/gdirect.config), as distribution kernels do.
[ -e /proc/sys/fs/fanotify/max_user_marks ] || ktap_exit_fail_msg "no fanotify in this kernel (CONFIG_FANOTIFY)"
_unload_all
insmod "$GDIRECT_MODULE" bounce_buffers=1 && _egpu_insmod ||
	ktap_exit_fail_msg "cannot load the modules (bounce_buffers=1)"

ktap_print_header
ktap_set_plan 23

for fs in ext4 xfs; do
	_fs_setup "$fs"
	_test "$fs made and mounted" _fs_make "$fs" "$FS_DEV" "$mnt"
	for dir in read write; do
		dd if=/dev/urandom of="$mnt/f" bs=1M count=4 status=none && sync
		out=$(gdirect-reg perm-stall "$dir" "$mnt/f" 2>&1)
		echo "$out" | while read -r l; do ktap_print_msg "$fs $dir: $l"; done
		_test "$fs $dir: the listener got the transfer's permission event" \
			_expect_eq "event ours" "true true" "$(_kv "$out" event) $(_kv "$out" from_this_process)"
		_test "$fs $dir: the free returned while the event was unanswered" \
			_expect_eq early true "$(_kv "$out" free_done_while_unanswered)"
		_test "$fs $dir: the transfer then failed, its memory gone" \
			_expect_eq io EKEYREVOKED "$(_kv "$out" io)"
		rm -f "$mnt/f"
	done
	_bounce_stall_cases "$fs" "$mnt" perm "its event" "answered"
	umount "$mnt"
done
_test "nothing stays registered or pinned (module, kernel, emulated GPU)" _expect_unpinned
ktap_finished
