#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The guest half of scripts/demo: load gdirect, ask it what it is, then read
# from a remote NVMe namespace over NVMe-oF/RDMA (soft-RoCE on an in-guest
# veth) and check the bytes against the checksum the host computed before boot.
# Lines starting "demo:" are the narration scripts/demo shows.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

nqn=nqn.2026-11.io.gdirect:demo
say() { echo "demo: $*"; }
fail() { say "FAILED: $*"; exit 1; }
cleanup() {
	nvme disconnect -n "$nqn" >/dev/null 2>&1
	_nvmet_unexport "$nqn" 1
	_rxe_down
	_veth_down
	_module_loaded && rmmod gdirect
}
trap cleanup EXIT

say "1. load the module"
insmod "$GDIRECT_MODULE" || fail "insmod $GDIRECT_MODULE"
say "   kernel log: $(dmesg | grep 'gdirect: version' | tail -n 1 | sed 's/^\[[^]]*\] //')"
say "   $ gdirect info"
gdirect info | sed 's/^/demo:     /' || fail "gdirect info"

local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || fail "no local NVMe namespace"
say "2. export $local_ns as an NVMe-oF target over RDMA: soft-RoCE (rxe0) on veth gdv0, $GDIRECT_NVMEOF_ADDR:$GDIRECT_NVMEOF_PORT"
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

say "3. read 16 MiB of the remote namespace with O_DIRECT"
t0=$(date +%s)
sum=$(_sha256_direct "$ns" 16)
say "   sha256 $sum ($(($(date +%s) - t0)) s under TCG emulation)"
if [ "$sum" = "$GDIRECT_NVME0_SHA256_16M" ]; then
	say "   = the checksum the host computed from the drive image before boot: the bytes crossed the fabric intact"
else
	fail "checksum mismatch: the host wrote $GDIRECT_NVME0_SHA256_16M"
fi
say "   (this read lands in host memory: reads into GPU memory through gdirect come with the I/O-path work)"

say "4. tear down: disconnect, remove the target, the rxe link and the veth"
nvme disconnect -n "$nqn" >/dev/null || fail "nvme disconnect"
_nvmet_unexport "$nqn" 1 && _rxe_down && _veth_down
rmmod gdirect || fail "rmmod"
say "done"
