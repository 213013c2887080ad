#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The seed's whole path: a remote NVMe namespace, exported by the nvmet target
# over NVMe-oF RDMA, read by nvme-rdma through a P2P-capable RNIC straight into
# GPU memory, with no copy through host memory.
#
# The RNIC is the rig's soft-RoCE (tests/rxe: the kernel's rxe, patched to
# DMA-map through the PCI function under its netdev) on a virtio NIC under the
# emulated GPU's PCIe switch. nvme-rdma sees a PCI DMA device and lets the
# namespace's queue take P2PDMA pages; the "RNIC" writes each RDMA payload
# through the kernel mapping of the GPU's BAR, as a hardware RNIC's DMA would.
#
# Checked for a raw namespace and an ext4 file on one, at many sizes and at
# offsets no other test reads, into poisoned GPU memory:
# - the bytes, from the host (its /dev/shm file against its drive image);
# - the path (p2p, reason none, transport rdma) and gdirect's counters: no byte
#   through the bounce pool;
# - the RNIC's own account (its rdma statistic counters, kept by rxe, not by
#   gdirect): every byte written into P2PDMA pages, none of them into RAM;
# - that the check can fail: the same read forced through the bounce pool shows
#   its bytes written into RAM and none into P2PDMA pages.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

mnt=/mnt/gdirect-rnic
cleanup() {
	umount "$mnt" 2>/dev/null
	_nvmeof_down
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd nvme ip rdma gdirect jq mke2fs awk
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
fsdev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 2) || ktap_exit_fail_msg "no namespace 2"
nqn=$GDIRECT_NQN_PREFIX:rnic-p2p
fsnqn=$GDIRECT_NQN_PREFIX:rnic-p2p-ext4
MiB=1048576
# Reads of the raw namespace, OFFSET:LENGTH: one page, odd multiples of pages, a MiB, and
# more than one 16 MiB chunk (the ext4 file, the forced bounce and nvmeof_rdma_p2p_distance.sh
# read [216 MiB, 230 MiB)).
reads="$((176 * MiB)):4096 $((177 * MiB + 8192)):12288 $((178 * MiB + 61440)):69632
$((180 * MiB)):$MiB $((182 * MiB + 4096)):$((3 * MiB + 4096)) $((120 * MiB)):$((17 * MiB))"

ktap_print_header
ktap_set_plan 18

_test "the RNIC under the GPU's switch is up: soft-RoCE rxe_near on its virtio NIC" _rnic_up near
rnic=$(_rnic_pci near)
gpu=$(_gpu_bdf)
ktap_print_msg "RNIC $rnic (below $(_pci_parent "$rnic")), GPU memory $gpu (below $(_pci_parent "$gpu"))"
_test "the RNIC and the GPU memory are under one switch" _pci_same_switch "$rnic" "$gpu"
dma_through() { dmesg | grep -q "rxe: .*: DMA through $rnic"; }
_test "rxe DMA-maps through the RNIC's PCI function, not virtual DMA" dma_through

up() { _nvmeof_target_up rdma-near "$nqn" "$raw" && _nvmeof_connect rdma-near "$nqn"; }
_test "the namespace exported and connected over RDMA through the RNIC" up

p2p_bytes=$(_rdma_counter rxe_near p2pdma_write_bytes)
bounced=$(($(_stat bounce read bounce_bytes) + $(_stat p2p read bounce_bytes)))
p2p_stat=$(_stat p2p read bytes)
total=0
for r in $reads; do
	off=${r%%:*} len=${r#*:}
	read_one() {
		_gd_read_exact "$NVMEOF_NS" "$off" "$len" nvme0 "$off" &&
			_expect_eq "path reason transport bounce_bytes" "p2p none rdma 0" \
				"$(_rj .path) $(_rj .reason) $(_rj .transport) $(_rj .bounce_bytes)"
	}
	_test "$len bytes at $off: p2p over rdma, none bounced, exact in GPU memory (host check)" read_one
	total=$((total + len))
done
_test "gdirect counts all $total bytes on the P2P path" \
	_expect_eq "p2p read bytes" $((p2p_stat + total)) "$(_stat p2p read bytes)"
_test "and none through the bounce pool" \
	_expect_eq bounced "$bounced" "$(($(_stat bounce read bounce_bytes) + $(_stat p2p read bounce_bytes)))"
_test "the RNIC wrote all $total bytes into P2PDMA pages (its own counter)" \
	_expect_eq "p2pdma_write_bytes" $((p2p_bytes + total)) "$(_rdma_counter rxe_near p2pdma_write_bytes)"

# The counters can tell the paths apart: forced through the bounce pool, the payload is
# written into RAM and no byte into P2PDMA pages.
forced() {
	p2p_bytes=$(_rdma_counter rxe_near p2pdma_write_bytes)
	ram_bytes=$(_rdma_counter rxe_near ram_write_bytes)
	_gd_read "$NVMEOF_NS" --mem egpu --offset $((216 * MiB)) --len $((2 * MiB)) --force-bounce &&
		_expect_eq "path reason bounce_bytes" "bounce forced $((2 * MiB))" \
			"$(_rj .path) $(_rj .reason) $(_rj .bounce_bytes)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((216 * MiB)) $((2 * MiB)) &&
		_expect_eq "p2pdma_write_bytes" "$p2p_bytes" "$(_rdma_counter rxe_near p2pdma_write_bytes)" &&
		_expect_ge "ram_write_bytes" $((ram_bytes + 2 * MiB)) "$(_rdma_counter rxe_near ram_write_bytes)"
}
_test "forced to bounce: exact, and the RNIC wrote the 2 MiB into RAM, none into P2PDMA pages" forced

# An ext4 file on a namespace exported through the same RNIC.
prepare() {
	mkdir -p "$mnt" && /usr/sbin/mke2fs -q -F -t ext4 "$fsdev" && mount -t ext4 "$fsdev" "$mnt" &&
		dd if="$raw" of="$mnt/data" bs=1M skip=218 count=5 2>/dev/null && umount "$mnt"
}
_test "ext4 made on namespace 2 with a 5 MiB file of known bytes" prepare
remote() {
	_nvmeof_target_up rdma-near "$fsnqn" "$fsdev" && _nvmeof_connect rdma-near "$fsnqn" &&
		mount -t ext4 "$NVMEOF_NS" "$mnt"
}
_test "namespace 2 exported through the RNIC and mounted on the host side" remote
file_read() {
	p2p_bytes=$(_rdma_counter rxe_near p2pdma_write_bytes)
	_gd_read "$mnt/data" --mem egpu &&
		_expect_eq "bytes path reason transport bounce_bytes" "$((5 * MiB)) p2p none rdma 0" \
			"$(_rj .bytes) $(_rj .path) $(_rj .reason) $(_rj .transport) $(_rj .bounce_bytes)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((218 * MiB)) $((5 * MiB)) &&
		_expect_eq "p2pdma_write_bytes" $((p2p_bytes + 5 * MiB)) "$(_rdma_counter rxe_near p2pdma_write_bytes)"
}
_test "the file read p2p into GPU memory: exact (host check), written by the RNIC into P2PDMA pages" file_read
down() { umount "$mnt" && _nvmeof_down; }
_test "unmounted and torn down: no port, subsystem, rdma link or address left" down

ktap_finished
