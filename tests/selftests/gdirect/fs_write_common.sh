# SPDX-License-Identifier: GPL-2.0
#
# The body of write_ext4.sh and write_xfs.sh: sourced after gdirect_common.sh
# with FS set to ext4 or xfs. Formats a namespace of the switch NVMe and writes
# 4 MiB from GPU memory (bytes the host knows: a region of the other drive) into
# five kinds of file: an empty one the write extends, a preallocated one
# (unwritten extents), a sparse one (a hole), one whose written and unwritten
# extents the write crosses, and one whose pages are in the page cache (and, on
# xfs, a reflinked one written off its allocation unit: bounced).
# Each write is checked four ways: its report (bytes, path), QEMU's trace of the
# drive's DMA judged by the host (the 4 MiB read from the GPU's BAR), the file
# read back in the guest, and the host, which finds the file's extents (FIEMAP,
# the file system's own map) in its image of the namespace and compares them
# with its image of the other drive.

mnt=/mnt/gdirect-w-$FS
cleanup() {
	umount "$mnt" 2>/dev/null
	rm -f /tmp/fs-write-src
	_unload_all
}
trap cleanup EXIT

_require_root
_fs_setup "$FS" gdirect gdirect-io jq fallocate chattr sha256sum
fsdev=$FS_DEV nsid=$_fs_nsid
_load_all || ktap_exit_fail_msg "cannot load the modules"
src_dev=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
MiB=1048576
# The source: 4 MiB of nvme1 at 24 MiB (or 28 MiB for xfs), as the host wrote them.
src_at=$((24 * MiB))
[ "$FS" = xfs ] && src_at=$((28 * MiB))

ktap_print_header
if [ "$FS" = xfs ]; then ktap_set_plan 30; else ktap_set_plan 28; fi

_test "$FS made on $fsdev and mounted" _fs_make "$FS" "$fsdev" "$mnt"
dd if="$src_dev" of=/tmp/fs-write-src bs=1M skip=$((src_at / MiB)) count=4 iflag=direct 2>/dev/null

# The host compares each extent of FILE within [OFF, OFF + 4 MiB) with the source.
# Usage: host_extents FILE OFF
host_extents() {
	ext=$(gdirect-io fiemap "$1") || return 1
	[ -n "$ext" ] || { ktap_print_msg "$1 has no extents"; return 1; }
	covered=0
	echo "$ext" | {
		while read -r logical physical length flags; do
			start=$logical end=$((logical + length))
			[ $start -lt "$2" ] && start=$2
			[ $end -gt $(($2 + 4 * MiB)) ] && end=$(($2 + 4 * MiB))
			[ $start -lt $end ] || continue
			_host_compare "nvme0ns$nsid:$((physical + start - logical))" "nvme1:$((src_at + start - $2))" $((end - start)) || exit 1
			covered=$((covered + end - start))
		done
		_expect_eq "bytes covered by extents" $((4 * MiB)) "$covered"
	}
}

# Usage: case NAME FILE OFFSET: write, then check the report, the guest's and the host's view.
write_case() {
	_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
	out=$(gdirect write "$2" --from /tmp/fs-write-src --mem egpu --offset "$3" --json)
	rc=$?
	ktap_print_msg "$1: $(echo "$out" | jq -c '{bytes,path,reason,bounce_bytes}' 2>/dev/null)"
	_test "$1: 4 MiB written from GPU memory, peer to peer" \
		_expect_eq "exit bytes path" "0 $((4 * MiB)) p2p" "$rc $(echo "$out" | jq -r '"\(.bytes) \(.path)"')"
	_test "$1: QEMU's trace (the host's verdict): the drive read the 4 MiB from the GPU's BAR" \
		_dma_expect bar_write=$((4 * MiB))
	readback() { dd if="$2" bs=1M skip=$(($3 / MiB)) count=4 iflag=direct 2>/dev/null | cmp - /tmp/fs-write-src; }
	_test "$1: the guest reads the bytes back" readback "$1" "$2" "$3"
	_test "$1: the host finds them where $FS put them (FIEMAP)" host_extents "$2" "$3"
}

touch "$mnt/extending"
write_case extending "$mnt/extending" 0
_test "extending: the file grew to 4 MiB" _expect_eq size $((4 * MiB)) "$(stat -c %s "$mnt/extending")"

_test "preallocated: 8 MiB allocated, unwritten" fallocate -l $((8 * MiB)) "$mnt/prealloc"
write_case preallocated "$mnt/prealloc" $((2 * MiB))

truncate -s $((16 * MiB)) "$mnt/sparse"
write_case sparse "$mnt/sparse" $((8 * MiB))
hole() { [ "$(stat -c %b "$mnt/sparse")" -le $((5 * MiB / 512)) ]; }
_test "sparse: only the written 4 MiB are allocated ($(stat -c %b "$mnt/sparse") blocks of 512)" hole
# mixed: 8 MiB preallocated (unwritten), its first 3 MiB then written: two extents, written and
# unwritten, which the 4 MiB written at 1 MiB cross. Tried without waiting, ext4 and XFS refuse
# a write that one extent does not hold whole (ext4_overwrite_io(), imap_spans_range()), and
# no waiting would change that: the module writes the part in each extent on its own, peer to
# peer, rather than send the whole write through host memory.
mixed() {
	f=$mnt/mixed
	fallocate -l $((8 * MiB)) "$f" &&
		dd if=/dev/zero of="$f" bs=1M count=3 conv=notrunc oflag=direct 2>/dev/null || return 1
	# The extents that overlap [1 MiB, 5 MiB): two at least.
	n=$(gdirect-io fiemap "$f" | awk -v lo=$MiB -v hi=$((5 * MiB)) '$1 < hi && $1 + $3 > lo' | wc -l)
	[ "$n" -ge 2 ] || { ktap_print_msg "$n extent(s) in [1, 5) MiB"; return 1; }
}
_test "mixed: 8 MiB preallocated, the first 3 MiB written: two extents across [1, 5) MiB" mixed
write_case mixed "$mnt/mixed" $MiB
# cached: 8 MiB whose pages are in the page cache (clean). A direct write waits for them to be
# dropped; the module has that done with the GPU memory not held, then writes peer to peer, and
# a buffered read afterwards sees the new bytes, not the dropped pages.
dd if=/dev/zero of="$mnt/cached" bs=1M count=8 2>/dev/null && sync && cat "$mnt/cached" >/dev/null
write_case cached "$mnt/cached" $((2 * MiB))
buffered() { dd if="$mnt/cached" bs=1M skip=2 count=4 2>/dev/null | cmp - /tmp/fs-write-src; }
_test "cached: a buffered read sees the written bytes" buffered
# append-only (chattr +a): every writable descriptor of it has O_APPEND, and it is written only
# at its end. The module's writes are positional, as pwritev2(RWF_NOAPPEND)'s, which the kernel
# refuses for such a file (EPERM): so must the module, and leave the file as it was.
appendonly() {
	f=$mnt/appendonly
	dd if=/dev/urandom of="$f" bs=64K count=1 2>/dev/null && sync && chattr +a "$f" || return 1
	before=$(sha256sum <"$f")
	out=$(gdirect-io credwrite batch-append "$f" 0 65536)
	after=$(sha256sum <"$f")
	chattr -a "$f"
	ktap_print_msg "append-only: $(echo $out)"
	_expect_eq "errno, file unchanged" "EPERM true" \
		"$(_kv "$out" errno) $([ "$before" = "$after" ] && echo true || echo false)"
}
_test "append-only: a write at offset 0 through its O_APPEND descriptor refused (EPERM), the file unchanged" appendonly
if [ "$FS" = xfs ]; then
	# A reflinked file (its extents shared with another): XFS writes it out of place, by
	# whole allocation units, and a write off that alignment through the page cache, which
	# statx says (dio_offset_align, xfs_report_dioalign()). 4 MiB at 512 bytes (the drive's
	# block) of such a file: bounced with the reason no_direct_io, never the CPU's copy out of
	# the GPU's BAR into the page cache; the bytes read back.
	reflinked() {
		cp "$mnt/extending" "$mnt/shared" && gdirect-io reflink "$mnt/shared" "$mnt/reflinked" && sync || return 1
		out=$(gdirect write "$mnt/reflinked" --from /tmp/fs-write-src --mem egpu --offset 512 --json)
		ktap_print_msg "reflinked at 512: $(echo "$out" | jq -c '{bytes,path,reason,bounce_bytes}' 2>/dev/null)"
		_expect_eq "bytes path reason" "$((4 * MiB)) bounce no_direct_io" \
			"$(echo "$out" | jq -r '"\(.bytes) \(.path) \(.reason)"')"
	}
	_test "reflinked: a write off its allocation unit bounced, with the reason no_direct_io" reflinked
	back512() { dd if="$mnt/reflinked" bs=512 skip=1 count=8192 iflag=direct 2>/dev/null | cmp - /tmp/fs-write-src; }
	_test "reflinked: the guest reads the bytes back" back512
fi
_test "the file system unmounts cleanly" umount "$mnt"
