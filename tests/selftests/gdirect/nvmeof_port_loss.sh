#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The target port goes away in the middle of a large GPU-targeted read over
# RDMA: the read fails with a clear error within the controller-loss timeout
# the test sets (3 s), reports no partial success, nothing hangs or oopses,
# nothing stays pinned; the port comes back, the host reconnects, and a read is
# exact again.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

LOSS_TMO=3
_require_root
_require_cmd nvme ip rdma gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
# The target exports the throttled namespace (4: 64 MiB at 32 MB/s), so that the read is still in
# flight when the fault comes: a 128 MiB read of namespace 1 took under a second, and a read
# that ends between two looks at the drive's in-flight count is never faulted.
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:port-loss
# The fabric port: rdma (soft-RoCE on a veth: bounced), or rdma-near for the P2P path
# through the RNIC under the GPU's switch (nvmeof_*_p2p.sh set it).
port=${GDIRECT_FABRIC_PORT:-rdma}
[ "$port" = rdma ] && p2p=0 || p2p=1

ktap_print_header
ktap_set_plan $((9 + p2p))

up() {
	_nvmeof_target_up "$port" "$nqn" "$local_ns" &&
		_nvmeof_connect "$port" "$nqn" --ctrl-loss-tmo=$LOSS_TMO --reconnect-delay=1
}
_test "connected over RDMA ($port) with ctrl-loss-tmo $LOSS_TMO s" up
[ $p2p -eq 1 ] && _test "a read through $port goes peer to peer, exact (host check)" _fabric_read_p2p $((40 * 1048576)) nvme0ns4

_bg_read_start "$NVMEOF_NS" --mem egpu --len 48M --chunk 48M
_test "the 48 MiB read is in flight: the drive holds reads" _wait_disk_busy "$NVMEOF_NS"
_test "the target port is removed" _nvmet_unlink "$port" "$nqn"
_bg_read_wait 60
_test "the read fails, with an error and no byte count" _bg_read_failed_cleanly
_test "within the controller-loss timeout (and the reconnect tries)" sh -c "[ $BG_SECONDS -le $((LOSS_TMO + 15)) ]"
_test "nothing stays registered or pinned" \
	_expect_unpinned

back() {
	_nvmeof_disconnect "$nqn"
	_nvmet_link "$port" "$nqn" && _nvmeof_connect "$port" "$nqn"
}
_test "the port comes back and the host reconnects" back
again() {
	_gd_read_exact "$NVMEOF_NS" $((48 * 1048576)) 8388608 nvme0ns4 $((48 * 1048576))
}
_test "a read over the new controller is exact (host check)" again
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
