#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The guest half of scripts/demo: load gdirect and the emulated GPU, read from
# the NVMe under the GPU's PCIe switch into GPU memory (peer to peer), from the
# NVMe across the host bridge (bounced, and why), then over NVMe-oF/RDMA:
# through soft-RoCE on an in-guest veth (bounced, and why), and through a
# P2P-capable RNIC under the GPU's switch (peer to peer: the seed's whole path);
# the host checks the bytes in its /dev/shm file against the drive image it
# wrote. Lines starting "demo:" are the narration scripts/demo shows.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

nqn=$GDIRECT_NQN_PREFIX:demo
mnt=/mnt/demo-remote
say() { echo "demo: $*"; }
fail() { say "FAILED: $*"; exit 1; }
cleanup() {
	umount "$mnt" 2>/dev/null
	_nvmeof_down
	_unload_all
}
trap cleanup EXIT

# A GPU-targeted read, narrated, with the host's verdict on the bytes.
# Usage: gpu_read FILE HOST_NAME:OFFSET LEN_MIB
gpu_read() {
	say "   $ gdirect read $1 --mem egpu --len $3M"
	out=$(gdirect read "$1" --mem egpu --len "$3M" --json) || fail "gdirect read $1"
	say "     $(echo "$out" | jq -r '"\(.bytes) bytes into GPU memory at GPU address \(.memory.address) over \(.transport): path \(.path), reason \(.reason), \(.bounce_bytes) bytes through host memory"')"
	[ "$(echo "$out" | jq -r .reason)" = none ] || say "     why: $(echo "$out" | jq -r .why)"
	if _host_compare "gva:$(echo "$out" | jq .memory.address)" "$2" $(($3 << 20)) >/dev/null; then
		say "     host check: its /dev/shm file holds exactly the bytes it wrote into the drive image"
	else
		fail "the host found other bytes in GPU memory"
	fi
}

say "1. load gdirect and the emulated GPU (a PCI device whose BAR is the host's /dev/shm file)"
insmod "$GDIRECT_MODULE" || fail "insmod $GDIRECT_MODULE"
insmod "$GDIRECT_EGPU_MODULE" || fail "insmod $GDIRECT_EGPU_MODULE"
say "   kernel log: $(dmesg | grep 'gdirect: version' | tail -n 1 | sed 's/^\[[^]]*\] //')"
say "   $ gdirect info"
gdirect info | sed 's/^/demo:     /' || fail "gdirect info"

near=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || fail "no local NVMe namespace"
far=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || fail "no second NVMe"
say "2. GPU-targeted reads: $near sits under the GPU's PCIe switch, $far on another root port"
gpu_read "$near" nvme0:0 16
gpu_read "$far" nvme1:0 8

fsdev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 2) || fail "no second namespace"
say "3. an ext4 file system on $fsdev (another namespace of the switch NVMe) with an 8 MiB file, data.bin,"
say "   copied from bytes of the drive image the host knows (offset 2 MiB)"
mkdir -p "$mnt" && /usr/sbin/mke2fs -q -F -t ext4 "$fsdev" && mount -t ext4 "$fsdev" "$mnt" &&
	dd if="$near" of="$mnt/data.bin" bs=1M skip=2 count=8 2>/dev/null && umount "$mnt" || fail "ext4 setup"

say "4. the NVMe-oF target, as an operator sets it up: $fsdev exported over RDMA (soft-RoCE rxe0 on an"
say "   in-guest veth, $GDIRECT_NVMEOF_ADDR:$GDIRECT_NVMEOF_PORT)"
_nvmeof_target_up rdma "$nqn" "$fsdev" || fail "target setup"
say "   $ nvme discover -t rdma -a $GDIRECT_NVMEOF_ADDR -s $GDIRECT_NVMEOF_PORT"
nvme discover -t rdma -a "$GDIRECT_NVMEOF_ADDR" -s "$GDIRECT_NVMEOF_PORT" | grep -E '^(trtype|subnqn):' | sed 's/^/demo:     /'
say "   $ nvme connect -t rdma -n $nqn -a $GDIRECT_NVMEOF_ADDR -s $GDIRECT_NVMEOF_PORT -Q 128"
_nvmeof_connect rdma "$nqn" -Q 128 || fail "nvme connect"
say "   controller $NVMEOF_CTRL: transport $(cat /sys/class/nvme/$NVMEOF_CTRL/transport), state $(cat /sys/class/nvme/$NVMEOF_CTRL/state), namespace $NVMEOF_NS"
say "   $ gdirect check nvmeof"
gdirect check nvmeof | sed -n '2p' | sed 's/^/demo:   /'
mount -t ext4 "$NVMEOF_NS" "$mnt" || fail "mount of the remote namespace"

say "5. a GPU-targeted read of data.bin on the remote namespace: GPU memory <- RDMA <- target <- NVMe"
say "   (soft-RoCE on a veth has no PCI function to DMA through, so the module bounces and says why)"
gpu_read "$mnt/data.bin" nvme0:$((2 << 20)) 8

say "6. the same file through a P2P-capable RNIC: soft-RoCE rxe_near on a virtio NIC under the GPU's"
say "   PCIe switch ($(_rnic_pci near)), DMA-mapping through its PCI function as a hardware RNIC does"
say "   (tests/rxe); the target exports the namespace on $GDIRECT_RNIC_NEAR_ADDR too"
umount "$mnt" && _nvmeof_disconnect "$nqn" || fail "disconnect from the veth port"
_rnic_up near && _nvmet_port_add rdma-near && _nvmet_link rdma-near "$nqn" || fail "RNIC port setup"
say "   $ nvme connect -t rdma -n $nqn -a $GDIRECT_RNIC_NEAR_ADDR -s $GDIRECT_NVMEOF_PORT -Q 128"
_nvmeof_connect rdma-near "$nqn" -Q 128 || fail "nvme connect through the RNIC"
mount -t ext4 "$NVMEOF_NS" "$mnt" || fail "mount of the remote namespace"
before=$(_rdma_counter rxe_near p2pdma_write_bytes)
say "   GPU memory <- RNIC (RDMA) <- target <- NVMe, no copy through the node's memory:"
gpu_read "$mnt/data.bin" nvme0:$((2 << 20)) 8
say "     the RNIC's own counter: $(($(_rdma_counter rxe_near p2pdma_write_bytes) - before)) bytes written into P2PDMA pages (the GPU's BAR)"

say "7. tear down: unmount, disconnect, remove the target, the rxe links, the addresses and the veth, unload"
umount "$mnt" && _nvmeof_down || fail "teardown"
_unload_all
say "   $(gdirect info 2>&1 | head -n 1)"
say "done"
