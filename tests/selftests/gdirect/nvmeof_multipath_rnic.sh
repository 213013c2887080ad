#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# NVMe native multipath with a P2P-capable RNIC among the paths: one namespace
# reached through the RNIC under the GPU's switch and through a second path.
#
# - beside an NVMe/TCP path: the head's queue takes no P2P pages (the NVMe core
#   stacks the paths' limits), although the RNIC path would: the read bounces
#   with the reason `multipath`, exact;
# - beside the RNIC across the host bridge: both paths take P2P pages, so the
#   head does too, but the far RNIC cannot reach the GPU memory and the core may
#   send any I/O down either path: the read bounces with the reason `distance`
#   (the module checks every path's RNIC), exact, and no byte went through
#   either RNIC into P2PDMA pages.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

MiB=1048576
_require_root
_require_cmd nvme ip rdma gdirect jq awk
[ -e /sys/module/nvme_core/parameters/multipath ] || ktap_exit_fail_msg "the kernel has no NVMe native multipath (CONFIG_NVME_MULTIPATH)"
_load_all || ktap_exit_fail_msg "cannot load the modules"
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:multipath-rnic

ktap_print_header
ktap_set_plan 7

# The paths of the head $NVMEOF_NS, as the head's multipath links list them.
paths() { ls "/sys/block/$(basename "$NVMEOF_NS")/multipath" 2>/dev/null | wc -l; }

# A second path to the subsystem through port $1 (tcp or rdma-far), until the head has two.
second_path() {
	case $1 in
	rdma-far) _rnic_up far || return 1 ;;
	tcp) _veth_up || return 1 ;;
	esac
	_nvmet_port_add "$1" && _nvmet_link "$1" "$nqn" &&
		nvme connect -t "$(_nvmet_trtype "$1")" -n "$nqn" -a "$(_nvmet_addr "$1")" -s "$(_nvmet_svcid "$1")" >/dev/null || return 1
	i=0
	while [ $i -lt 100 ]; do
		[ "$(paths)" = 2 ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
	ktap_print_msg "the head $NVMEOF_NS has $(paths) path(s)"
	return 1
}

up() { _nvmeof_target_up rdma-near "$nqn" "$local_ns" && _nvmeof_connect rdma-near "$nqn" && second_path tcp; }
_test "one namespace through the RNIC under the switch and through NVMe/TCP: a head with two paths" up
beside_tcp() {
	_dma_mark || return 1
	_gd_read_exact "$NVMEOF_NS" $((232 * MiB)) $((3 * MiB)) nvme0 $((232 * MiB)) || return 1
	# QEMU's trace, the host's verdict: the target's drive DMA'd the bytes into RAM.
	_dma_expect ram_read=$((3 * MiB)) bar_read=0 || return 1
	ktap_print_msg "why: $(_rj .why)"
	_expect_eq "path reason" "bounce multipath" "$(_rj .path) $(_rj .reason)"
}
_test "a read through the head bounces for the reason multipath, exact (host check)" beside_tcp
_test "the paths down" _nvmeof_down

up_far() { _nvmeof_target_up rdma-near "$nqn" "$local_ns" && _nvmeof_connect rdma-near "$nqn" && second_path rdma-far; }
_test "the same through the RNIC under the switch and the one across the host bridge" up_far
near0=$(_rdma_counter rxe_near p2pdma_write_bytes) far0=$(_rdma_counter rxe_far p2pdma_write_bytes)
beside_far() {
	_dma_mark || return 1
	_gd_read_exact "$NVMEOF_NS" $((236 * MiB)) $((3 * MiB)) nvme0 $((236 * MiB)) || return 1
	_dma_expect ram_read=$((3 * MiB)) bar_read=0 || return 1
	ktap_print_msg "why: $(_rj .why)"
	_expect_eq "path reason transport" "bounce distance rdma" "$(_rj .path) $(_rj .reason) $(_rj .transport)"
}
_test "a read through the head bounces for the reason distance, exact (host check)" beside_far
none_p2p() {
	_expect_eq "P2PDMA bytes written by rxe_near and rxe_far" "$near0 $far0" \
		"$(_rdma_counter rxe_near p2pdma_write_bytes) $(_rdma_counter rxe_far p2pdma_write_bytes)"
}
_test "neither RNIC wrote a byte into P2PDMA pages" none_p2p
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
