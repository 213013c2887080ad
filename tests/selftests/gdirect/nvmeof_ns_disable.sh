#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The target disables the namespace in the middle of a large GPU-targeted read
# over RDMA: the read fails with an error and no partial success, promptly,
# without a hang or an oops, and nothing stays pinned; once the namespace is
# enabled again the host sees it and a read is exact.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

_require_root
_require_cmd nvme ip rdma gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
# The target exports the throttled namespace (4: 64 MiB at 32 MB/s), so that the read is still in
# flight when the fault comes: a 128 MiB read of namespace 1 took under a second, and a read
# that ends between two looks at the drive's in-flight count is never faulted.
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:ns-disable
# The fabric port: rdma (soft-RoCE on a veth: bounced), or rdma-near for the P2P path
# through the RNIC under the GPU's switch (nvmeof_*_p2p.sh set it).
port=${GDIRECT_FABRIC_PORT:-rdma}
[ "$port" = rdma ] && p2p=0 || p2p=1
enable=$GDIRECT_NVMET/subsystems/$nqn/namespaces/1/enable

ktap_print_header
ktap_set_plan $((9 + p2p))

up() { _nvmeof_target_up "$port" "$nqn" "$local_ns" && _nvmeof_connect "$port" "$nqn" --ctrl-loss-tmo=3; }
_test "connected over RDMA ($port)" up
[ $p2p -eq 1 ] && _test "a read through $port goes peer to peer, exact (host check)" _fabric_read_p2p $((40 * 1048576)) nvme0ns4

_bg_read_start "$NVMEOF_NS" --mem egpu --len 48M --chunk 48M
_test "the 48 MiB read is in flight: the drive holds reads" _wait_disk_busy "$NVMEOF_NS"
disable() { echo 0 >"$enable"; }
_test "the target disables the namespace" disable
_bg_read_wait 60
_test "the read fails, with an error and no byte count" _bg_read_failed_cleanly
_test "promptly" sh -c "[ $BG_SECONDS -le 20 ]"
_test "nothing stays registered or pinned" \
	_expect_unpinned

reenable() {
	echo 1 >"$enable" || return 1
	ctrl=$(_nvmeof_ctrl_by_nqn "$nqn") || return 1
	# The target announces the change; ask for a rescan too, as an operator would.
	echo 1 >"/sys/class/nvme/$ctrl/rescan_controller" 2>/dev/null
	i=0
	while [ $i -lt 100 ]; do
		NVMEOF_NS=$(_nvmeof_ns_by_nqn "$nqn") && [ -b "$NVMEOF_NS" ] &&
			dd if="$NVMEOF_NS" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null && return 0
		sleep 0.2
		i=$((i + 1))
	done
	return 1
}
_test "enabled again, the host sees the namespace" reenable
again() {
	_gd_read_exact "$NVMEOF_NS" $((48 * 1048576)) 8388608 nvme0ns4 $((48 * 1048576))
}
_test "a read is exact again (host check)" again
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
