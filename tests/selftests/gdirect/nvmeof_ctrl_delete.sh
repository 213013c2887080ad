#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The host deletes the fabrics controller while 64 batched GPU-targeted reads
# over RDMA are in flight: every read is accounted for - completed in full or
# failed with an errno, none short - the batch ends without a hang or an oops,
# nothing stays pinned, and the modules unload.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	_nvmeof_down
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd nvme ip rdma gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:ctrl-delete

ktap_print_header
ktap_set_plan 8

up() { _nvmeof_target_up rdma "$nqn" "$local_ns" && _nvmeof_connect rdma "$nqn" --ctrl-loss-tmo=3; }
_test "connected over RDMA" up
ctrl=$NVMEOF_CTRL

gdirect-io inflight "$NVMEOF_NS" 64 >/tmp/inflight.out 2>&1 &
pid=$!
_test "reads are in flight in the module" _wait_active_transfer
delete() { echo 1 >"/sys/class/nvme/$ctrl/delete_controller"; }
_test "the host deletes controller $ctrl" delete
deadline=$(($(date +%s) + 60))
while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
ended() { ! kill -0 "$pid" 2>/dev/null; }
_test "the batch ends (no hang)" ended
wait "$pid"
pid=
out=$(cat /tmp/inflight.out)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
line=$(echo "$out" | grep '^completed_ok=')
accounted() {
	[ $(( $(_kv "$line" completed_ok) + $(_kv "$line" failed) )) -eq 64 ] &&
		! echo "$line" | grep -q short_
}
_test "every read completed in full or failed with an errno" accounted
_test "some reads failed: the deletion hit reads in flight" sh -c "[ $(_kv "$line" failed) -gt 0 ]"
_test "nothing stays registered or pinned" \
	_expect_eq counters "0 0" "$(_kv "$out" registrations) $(_kv "$out" pinned_bytes)"
finish() { _nvmeof_down && rmmod gdirect && rmmod gdirect_egpu; }
_test "teardown leaves nothing behind, the modules unload" finish

ktap_finished
