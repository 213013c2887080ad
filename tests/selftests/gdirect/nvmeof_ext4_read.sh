#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# An ext4 file on a remote namespace, read into GPU memory over RDMA and over
# TCP: the file system is made on a namespace of the switch NVMe and filled with
# bytes the host knows, exported over the fabric, mounted on the host side, and
# each read is checked from the host - data and a hole.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

mnt=/mnt/gdirect-remote
cleanup() {
	umount "$mnt" 2>/dev/null
	_nvmeof_down
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd nvme ip rdma gdirect jq mke2fs
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
fsdev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 2) || ktap_exit_fail_msg "no namespace 2"
MiB=1048576

ktap_print_header
ktap_set_plan 13

# data: raw [2 MiB, 6 MiB); sparse: 1 MiB from 8 MiB, a 1 MiB hole, 1 MiB from 9 MiB.
prepare() {
	mkdir -p "$mnt" && /usr/sbin/mke2fs -q -F -t ext4 "$fsdev" && mount -t ext4 "$fsdev" "$mnt" &&
		dd if="$raw" of="$mnt/data" bs=1M skip=2 count=4 2>/dev/null &&
		dd if="$raw" of="$mnt/sparse" bs=1M skip=8 count=1 2>/dev/null &&
		dd if="$raw" of="$mnt/sparse" bs=1M skip=9 seek=2 count=1 conv=notrunc 2>/dev/null &&
		umount "$mnt"
}
_test "ext4 with known files made on $fsdev, unmounted" prepare

for trtype in rdma tcp; do
	nqn=$GDIRECT_NQN_PREFIX:ext4-$trtype
	remote() { _nvmeof_target_up "$trtype" "$nqn" "$fsdev" && _nvmeof_connect "$trtype" "$nqn" && mount -t ext4 "$NVMEOF_NS" "$mnt"; }
	_test "$trtype: the namespace exported, connected and mounted on the host side" remote
	_test "$trtype: the 4 MiB file read into GPU memory" _gd_read "$mnt/data" --mem egpu
	_test "$trtype: reported as bounced for the $trtype queue" \
		_expect_eq "path reason transport" "bounce queue_no_p2p $trtype" "$(_rj .path) $(_rj .reason) $(_rj .transport)"
	_test "$trtype: the file's bytes are in GPU memory (host check)" \
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((2 * MiB)) $((4 * MiB))
	sparse() {
		_gd_read "$mnt/sparse" --mem egpu && va=$(_rj .memory.address) &&
			_host_compare "gva:$va" nvme0:$((8 * MiB)) $MiB &&
			_host_compare "gva:$((va + MiB))" zero:0 $MiB &&
			_host_compare "gva:$((va + 2 * MiB))" nvme0:$((9 * MiB)) $MiB
	}
	_test "$trtype: the sparse file reads with zeros in its hole (host check)" sparse
	down() { umount "$mnt" && _nvmeof_down; }
	_test "$trtype: unmounted and torn down" down
done

ktap_finished
