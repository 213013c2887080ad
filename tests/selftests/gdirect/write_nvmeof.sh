#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Writes from GPU memory to a namespace over NVMe-oF, TCP, RDMA (soft-RoCE on a
# veth) and RDMA through the P2P-capable RNIC under the GPU's switch: the
# in-guest target exports the raw namespace of the switch NVMe, 4 MiB of known
# bytes (a region of the other drive) are written through the fabric - bounced
# over TCP and the veth (neither queue takes P2P pages, and the report says
# why), peer to peer through the RNIC (which reads them from the GPU's BAR, by
# its own counter) - and the host finds them in its image of the exported drive.
# QEMU's trace shows the target's NVMe read them from guest RAM (the target's
# buffers), none from the GPU's BAR.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap '_nvmeof_cleanup; rm -f /tmp/fabric-write-src' EXIT

_require_root
_require_cmd gdirect jq nvme ip rdma
_load_all || ktap_exit_fail_msg "cannot load the modules"
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
src_dev=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
MiB=1048576

ktap_print_header
ktap_set_plan 18

# Usage: fabric_write rdma|tcp|rdma-near AT SRC_AT
fabric_write() {
	port=$1 trtype=$(_nvmet_trtype "$1") at=$2 src_at=$3
	nqn=$GDIRECT_NQN_PREFIX:write-$port
	dd if="$src_dev" of=/tmp/fabric-write-src bs=1M skip=$((src_at / MiB)) count=4 iflag=direct 2>/dev/null
	up() { _nvmeof_target_up "$port" "$nqn" "$local_ns" && _nvmeof_connect "$port" "$nqn"; }
	_test "$port: target up, connected" up
	[ "$port" = rdma-near ] && rnic0=$(_rdma_counter rxe_near p2pdma_read_bytes)
	_dma_mark
	out=$(gdirect write "${NVMEOF_NS:-/dev/null}" --from /tmp/fabric-write-src --mem egpu --offset "$at" --json)
	rc=$?
	ktap_print_msg "$port: $(echo "$out" | jq -c '{bytes,path,reason,transport,bounce_bytes}' 2>/dev/null)"
	_test "$port: 4 MiB written from GPU memory" _expect_eq "exit bytes" "0 $((4 * MiB))" "$rc $(echo "$out" | jq -r .bytes)"
	if [ "$port" = rdma-near ]; then
		p2p() {
			_expect_eq "path reason transport bounce_bytes" "p2p none rdma 0" \
				"$(echo "$out" | jq -r '"\(.path) \(.reason) \(.transport) \(.bounce_bytes)"')" &&
				_expect_eq "the RNIC's p2pdma_read_bytes" $((rnic0 + 4 * MiB)) "$(_rdma_counter rxe_near p2pdma_read_bytes)"
		}
		_test "$port: peer to peer, none through host memory; the RNIC read the 4 MiB from P2PDMA pages" p2p
	else
		_test "$port: bounced, the queue takes no P2P pages, all 4 MiB through host memory" \
			_expect_eq "path reason transport bounce_bytes" "bounce queue_no_p2p $trtype $((4 * MiB))" \
			"$(echo "$out" | jq -r '"\(.path) \(.reason) \(.transport) \(.bounce_bytes)"')"
	fi
	_test "$port: QEMU saw the target's NVMe read them from guest RAM, none from the GPU's BAR" \
		_dma_expect ram_write=$((4 * MiB)) bar_write=0
	_test "$port: the exported drive holds the bytes (host check)" _host_compare "nvme0:$at" "nvme1:$src_at" $((4 * MiB))
	_test "$port: teardown leaves nothing behind" _nvmeof_down
}
fabric_write tcp $((232 * MiB)) $((32 * MiB))
fabric_write rdma $((240 * MiB)) $((36 * MiB))
fabric_write rdma-near $((248 * MiB)) $((40 * MiB))

ktap_finished
