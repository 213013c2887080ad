#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# `gdirect check nvmeof` lists each fabrics controller with its transport,
# address, queue count and queue size, and warns when the queue size is outside
# 128-256: connected with -Q 32 it warns, with -Q 128 it does not.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_down EXIT

_require_root
_require_cmd nvme ip rdma gdirect jq
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:queue-size

ktap_print_header
ktap_set_plan 9

_test "nothing connected: no controller listed" _expect_eq controllers 0 "$(gdirect check nvmeof --json | jq '.nvmeof.controllers | length')"
q32() { _nvmeof_target_up rdma "$nqn" "$local_ns" && _nvmeof_connect rdma "$nqn" -Q 32; }
_test "connected over RDMA with -Q 32" q32
json=$(gdirect check nvmeof --json)
ktap_print_msg "$(echo "$json" | jq -c .)"
first=".nvmeof.controllers[0]"
_test "the controller is listed with transport, address and queues" _expect_eq "controller" \
	"$NVMEOF_CTRL rdma traddr=$GDIRECT_NVMEOF_ADDR,trsvcid=$GDIRECT_NVMEOF_PORT 1" \
	"$(echo "$json" | jq -r "$first | \"\(.name) \(.transport) \(.address) \(.io_queues)\"")"
_test "queue size 32, and a warning" _expect_eq "size verdict" "32 warning" "$(echo "$json" | jq -r "$first | \"\(.queue_size) \(.verdict)\"")"
text=$(gdirect check nvmeof)
ktap_print_msg "$(echo "$text" | tr '\n' '|')"
_test "the text report warns and says how to fix it" sh -c "echo '$text' | grep -q 'warning: queue size 32 is outside 128-256.*-Q 128'"

q128() { _nvmeof_disconnect "$nqn" && _nvmeof_connect rdma "$nqn" -Q 128; }
_test "reconnected with -Q 128" q128
json=$(gdirect check nvmeof --json)
_test "queue size 128, no warning" _expect_eq "size verdict" "128 ok" "$(echo "$json" | jq -r "$first | \"\(.queue_size) \(.verdict)\"")"
_test "the text report has no warning" sh -c "! gdirect check nvmeof | grep -q warning"
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
