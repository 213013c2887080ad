#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The guest half of scripts/demo: load gdirect and the emulated GPU, read from
# the NVMe under the GPU's PCIe switch into GPU memory (peer to peer), from the
# NVMe across the host bridge (bounced, and why), then over NVMe-oF/RDMA
# (soft-RoCE on an in-guest veth); the host checks the bytes in its /dev/shm
# file against the drive image it wrote. Lines starting "demo:" are the
# narration scripts/demo shows.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

nqn=nqn.2026-11.io.gdirect:demo
say() { echo "demo: $*"; }
fail() { say "FAILED: $*"; exit 1; }
cleanup() {
	nvme disconnect -n "$nqn" >/dev/null 2>&1
	_nvmet_unexport "$nqn" 1
	_rxe_down
	_veth_down
	_unload_all
}
trap cleanup EXIT

# A GPU-targeted read, narrated, with the host's verdict on the bytes.
# Usage: gpu_read DEVICE HOST_NAME:OFFSET LEN_MIB
gpu_read() {
	say "   $ gdirect read $1 --mem gpu --len $3M"
	out=$(gdirect read "$1" --mem gpu --len "$3M" --json) || fail "gdirect read $1"
	say "     $(echo "$out" | jq -r '"\(.bytes) bytes into GPU memory at BAR offset \(.memory.bar_offset): path \(.path), reason \(.reason), \(.bounce_bytes) bytes through host memory"')"
	if _host_compare "gpu:$(echo "$out" | jq .memory.bar_offset)" "$2" $(($3 << 20)) >/dev/null; then
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

local_ns=$near
say "3. export $local_ns as an NVMe-oF target over RDMA: soft-RoCE (rxe0) on veth gdv0, $GDIRECT_NVMEOF_ADDR:$GDIRECT_NVMEOF_PORT"
_veth_up && _rxe_up && _nvmet_export "$nqn" "$local_ns" 1 rdma || fail "target setup"
say "   $ nvme discover -t rdma -a $GDIRECT_NVMEOF_ADDR -s $GDIRECT_NVMEOF_PORT"
nvme discover -t rdma -a "$GDIRECT_NVMEOF_ADDR" -s "$GDIRECT_NVMEOF_PORT" | grep -E '^(trtype|subnqn):' | sed 's/^/demo:     /'
say "   $ nvme connect -t rdma -n $nqn -a $GDIRECT_NVMEOF_ADDR -s $GDIRECT_NVMEOF_PORT"
nvme connect -t rdma -n "$nqn" -a "$GDIRECT_NVMEOF_ADDR" -s "$GDIRECT_NVMEOF_PORT" >/dev/null || fail "nvme connect"
i=0
until ns=$(_nvmeof_ns_by_nqn "$nqn") && [ -b "$ns" ]; do
	i=$((i + 1))
	[ $i -lt 50 ] || fail "no namespace appeared"
	sleep 0.1
done
ctrl=$(_nvmeof_ctrl_by_nqn "$nqn")
say "   controller $ctrl: transport $(cat /sys/class/nvme/$ctrl/transport), state $(cat /sys/class/nvme/$ctrl/state), namespace $ns"

say "4. a GPU-targeted read of the remote namespace (soft-RoCE cannot DMA peer to peer: it bounces, and says why)"
gpu_read "$ns" nvme0:0 16

say "5. tear down: disconnect, remove the target, the rxe link and the veth, unload"
nvme disconnect -n "$nqn" >/dev/null || fail "nvme disconnect"
_nvmet_unexport "$nqn" 1 && _rxe_down && _veth_down
_unload_all
say "   $(gdirect info 2>&1 | head -n 1)"
say "done"
