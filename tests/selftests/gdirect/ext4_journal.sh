#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Files ext4 does no direct I/O for: mounted with data=journal, or a file with the journal-data
# attribute (chattr +j) on an ordered mount. ext4 reads and writes them through the page cache
# (ext4_dio_read_iter's and ext4_dio_write_iter's buffered fallbacks): peer to peer, the CPU
# would copy between the page cache and the GPU's BAR, unreported. The module asks the file
# system (STATX_DIOALIGN, alignment 0) as each transfer starts, and bounces such a file with the
# reason no_direct_io; every other file stays peer to peer.
# - A read of a half-cached file on the data=journal mount: all 4 MiB (not the cached half
#   called the end of the file), bounced with the reason, bytes checked by the host.
# - A write from GPU memory there: bounced with the reason, read back.
# - On an ordered mount (nodelalloc): a chattr +j file bounces, its sibling goes peer to peer, and after
#   chattr -j the same file goes peer to peer (asked per transfer, not remembered).
# - The module's GET_STATS counts the reason.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
mnt=/mnt/gdirect-journal
ra=""
cleanup() {
	_gd_free_kept
	_unload_all
	umount "$mnt" 2>/dev/null
	[ -n "$ra" ] && echo "$ra" >"$ra_file"
	rm -f /tmp/journal-src
}
trap cleanup EXIT
_require_root
_fs_setup ext4 gdirect jq chattr gdirect-ioctl
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
MiB=1048576

ktap_print_header
ktap_set_plan 17

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
reasons() { gdirect stats --json | jq -r .reasons.no_direct_io; }
counted=$(reasons)
_test "a 4 MiB read of it into GPU memory" _gd_read "$mnt/f" --mem egpu
_test "all 4 MiB, not the end of the file" \
	_expect_eq "bytes eof" "$((4 * MiB)) false" "$(_rj .bytes) $(_rj .eof)"
_test "bounced, with the reason no_direct_io, all through host memory" \
	_expect_eq "path reason bounce_bytes" "bounce no_direct_io $((4 * MiB))" \
	"$(_rj .path) $(_rj .reason) $(_rj .bounce_bytes)"
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
_test "bounced, with the reason no_direct_io, all through host memory" \
	_expect_eq "path reason bounce_bytes" "bounce no_direct_io $((4 * MiB))" \
	"$(echo "$out" | jq -r '"\(.path) \(.reason) \(.bounce_bytes)"')"
readback() { cmp "$mnt/w" /tmp/journal-src; }
_test "the file holds the bytes written" readback
_test "GET_STATS counted both transfers under no_direct_io" \
	_expect_eq "no_direct_io transfers" $((counted + 2)) "$(reasons)"

# An ordered mount: the journal-data attribute of one file (which ext4 honours only without
# delayed allocation, ext4_inode_journal_mode(): nodelalloc). The first MiB of each file read
# (enough for the path; the debug kernel's bounce copies are slow). judge NAME WANT GOT: the
# report's fields, then the file's bytes in GPU memory (host check).
judge() { _expect_eq "$1" "$2" "$3" && _host_compare "gva:$(_rj .memory.address)" nvme0:$((20 * MiB)) "$MiB"; }
ordered() { umount "$mnt" && mount -t ext4 -o nodelalloc "$FS_DEV" "$mnt" && cp "$mnt/f" "$mnt/j" && cp "$mnt/f" "$mnt/o" && sync; }
_test "remounted ordered (nodelalloc), two copies of the file" ordered
_test "chattr +j on one of them" chattr +j "$mnt/j"
_gd_read "$mnt/j" --mem egpu --len 1M
_test "the chattr +j file: bounced with the reason no_direct_io, exact" \
	judge "bytes path reason" "$MiB bounce no_direct_io" "$(_rj .bytes) $(_rj .path) $(_rj .reason)"
_gd_read "$mnt/o" --mem egpu --len 1M
_test "its sibling without the attribute: peer to peer, nothing bounced, exact" \
	judge "bytes path bounce_bytes" "$MiB p2p 0" "$(_rj .bytes) $(_rj .path) $(_rj .bounce_bytes)"
_test "chattr -j on the first" chattr -j "$mnt/j"
_gd_read "$mnt/j" --mem egpu --len 1M
_test "the same file now: peer to peer, exact (asked per transfer)" \
	judge "bytes path bounce_bytes" "$MiB p2p 0" "$(_rj .bytes) $(_rj .path) $(_rj .bounce_bytes)"
# The first struct (GET_STATS_V1, for programs built before no_direct_io), asked last, when the
# P2P reads above are counted under the reason none (ioctl_errors asks it of a module that has
# moved nothing): the same counts of every path, and of the reasons it has room for.
v1() {
	out=$(gdirect-ioctl stats)
	ktap_print_msg "$(echo "$out" | head -n 1)"
	[ "$(echo "$out" | tail -n 1)" = OK ] && ! echo "$out" | grep -q 'reasons_v1=\[0, 0, 0, 0, 0, 0, 0\]'
}
_test "GET_STATS_V1 answers the same counts, not all zero" v1
ktap_finished
