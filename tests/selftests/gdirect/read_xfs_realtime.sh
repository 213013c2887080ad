#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# An XFS realtime file keeps its data on the file system's realtime device, not
# on the device the super block names (here the data device is a namespace of
# the switch NVMe, which reaches the GPU peer to peer; the realtime device is a
# loop device in guest RAM, whose queue takes no P2P pages). GPU reads of it
# must not go peer to peer on the data device's word: they bounce, reported
# with the reason data_device, and the bytes are exact (host check). QEMU's
# trace shows that the NVMe DMAed none of the file's bytes: they came from the
# realtime device.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

mnt=/mnt/gdirect-xfs-rt
img=/tmp/gdirect-xfs-rt.img
rtdev=
cleanup() {
	umount "$mnt" 2>/dev/null
	[ -n "$rtdev" ] && losetup -d "$rtdev"
	rm -f "$img"
	_unload_all
}
trap cleanup EXIT

_require_root
_fs_setup xfs gdirect jq losetup
fsdev=$FS_DEV
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
MiB=1048576

ktap_print_header
ktap_set_plan 8

make_rt() {
	dd if=/dev/zero of="$img" bs=1M count=48 status=none && rtdev=$(losetup -f) && losetup "$rtdev" "$img" &&
		mkfs.xfs -q -f -d rtinherit=1 -r rtdev="$rtdev" "$fsdev" &&
		mkdir -p "$mnt" && mount -t xfs -o rtdev="$rtdev" "$fsdev" "$mnt"
}
_test "xfs on $fsdev with a realtime device (a loop device), every new file realtime" make_rt

# rt: raw bytes [20 MiB, 28 MiB) of the switch NVMe.
fill() {
	dd if="$raw" of="$mnt/rt" bs=1M skip=20 count=8 2>/dev/null && sync && echo 3 >/proc/sys/vm/drop_caches
}
_test "a realtime file written from the raw namespace" fill
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
_test "8 MiB of the realtime file read into GPU memory" _gd_read "$mnt/rt" --mem egpu
ktap_print_msg "why: $(_rj .why)"
_test "bounced, with the reason data_device (not P2P on the data device's word)" \
	_expect_eq "path reason bounce_bytes" "bounce data_device $((8 * MiB))" "$(_rj .path) $(_rj .reason) $(_rj .bounce_bytes)"
_test "the host finds the raw bytes in GPU memory" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((20 * MiB)) $((8 * MiB))
_test "QEMU saw the NVMe DMA none of the file's bytes (they came from the realtime device; the host's verdict)" \
	_dma_expect bar_read=0 "ram_read<$MiB"
_test "a read at an offset is exact too" _gd_read "$mnt/rt" --mem egpu --offset $((3 * MiB)) --len $((2 * MiB))
at_ok() {
	_expect_eq "bytes reason" "$((2 * MiB)) data_device" "$(_rj .bytes) $(_rj .reason)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((23 * MiB)) $((2 * MiB))
}
_test "... and its bytes are the file's (host check)" at_ok

ktap_finished
