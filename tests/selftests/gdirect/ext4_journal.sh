#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Files on ext4 mounted with data=journal, where ext4 does no direct I/O: it reads and writes
# them through the page cache (ext4_dio_read_iter's and ext4_dio_write_iter's buffered
# fallbacks). The module tries each chunk without waiting (IOCB_NOWAIT).
# - A read: a page cache read that would wait for a page not yet cached stops there with what
#   it copied, a short count that is not the end of the file. With the first half of the file
#   cached, the read must still move all 4 MiB (the rest through the bounce pool, which waits),
#   not stop at the half and call it the end of the file. The bytes are checked by the host.
# - A write from GPU memory: ext4 refuses a buffered write tried without waiting
#   (EOPNOTSUPP); the chunk must go through the bounce pool, not fail. Read back.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
mnt=/mnt/gdirect-journal
ra=""
cleanup() {
	_gd_free_kept
	_unload_all
	umount "$mnt" 2>/dev/null
	[ -n "$ra" ] && echo "$ra" >"$ra_file"
}
trap cleanup EXIT
_require_root
_fs_setup ext4 gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
MiB=1048576

ktap_print_header
ktap_set_plan 8

journal() { /usr/sbin/mke2fs -q -F -t ext4 "$FS_DEV" && mkdir -p "$mnt" && mount -t ext4 -o data=journal "$FS_DEV" "$mnt"; }
_test "ext4 made on $FS_DEV and mounted with data=journal" journal
# The file: raw bytes [20 MiB, 24 MiB); on disk, then only its first 2 MiB in the page cache
# (no readahead: the device's read_ahead_kb 0 while it is read).
ra_file=/sys/block/$(basename "$FS_DEV")/queue/read_ahead_kb
fill() {
	dd if="$raw" of="$mnt/f" bs=1M skip=20 count=4 2>/dev/null && sync &&
		echo 3 >/proc/sys/vm/drop_caches &&
		ra=$(cat "$ra_file") && echo 0 >"$ra_file" &&
		dd if="$mnt/f" of=/dev/null bs=1M count=2 2>/dev/null
}
_test "a 4 MiB file, its first 2 MiB cached" fill
_test "a 4 MiB read of it into GPU memory" _gd_read "$mnt/f" --mem egpu
_test "all 4 MiB, not the end of the file" \
	_expect_eq "bytes eof" "$((4 * MiB)) false" "$(_rj .bytes) $(_rj .eof)"
_test "the host finds the file's bytes in GPU memory" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((20 * MiB)) $((4 * MiB))

# The write: raw bytes [24 MiB, 28 MiB) into a new file.
dd if="$raw" of=/tmp/journal-src bs=1M skip=24 count=4 2>/dev/null
touch "$mnt/w"
out=$(gdirect write "$mnt/w" --from /tmp/journal-src --mem egpu --json)
rc=$?
ktap_print_msg "write: $(echo "$out" | jq -c '{bytes,path,reason,bounce_bytes}' 2>/dev/null)"
_test "a 4 MiB write from GPU memory into a new file succeeds" \
	_expect_eq "exit bytes" "0 $((4 * MiB))" "$rc $(echo "$out" | jq -r .bytes)"
_test "through host memory, reported (ext4 writes the file through the page cache)" \
	_expect_eq bounce_bytes $((4 * MiB)) "$(echo "$out" | jq -r .bounce_bytes)"
readback() { cmp "$mnt/w" /tmp/journal-src; }
_test "the file holds the bytes written" readback
rm -f /tmp/journal-src
ktap_finished
