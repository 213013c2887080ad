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
# The target exports the slow namespace (4: 32 MB/s), so that the 64 MiB of reads are still
# in flight when the controller goes, on the bounce path and on the faster P2P path alike.
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:ctrl-delete
# The fabric port: rdma (soft-RoCE on a veth: bounced), or rdma-near for the P2P path
# through the RNIC under the GPU's switch (nvmeof_*_p2p.sh set it).
port=${GDIRECT_FABRIC_PORT:-rdma}
[ "$port" = rdma ] && p2p=0 || p2p=1

ktap_print_header
ktap_set_plan $((8 + p2p))

# The host stops its keep-alives when the deletion starts, and the deletion waits for the
# reads the target is still serving. With the default 5 s keep-alive timeout a slow guest (the
# debug kernel) let the target drop the controller first, and the deletion then sat out the
# I/O (30 s) and admin (60 s) timeouts: a minute and a half of every run spent waiting.
up() { _nvmeof_target_up "$port" "$nqn" "$local_ns" && _nvmeof_connect "$port" "$nqn" --ctrl-loss-tmo=3 --keep-alive-tmo=60; }
_test "connected over RDMA ($port)" up
[ $p2p -eq 1 ] && _test "a read through $port goes peer to peer, exact (host check)" _fabric_read_p2p $((40 * 1048576)) nvme0ns4
ctrl=$NVMEOF_CTRL

[ $p2p -eq 1 ] && rnic_before=$(_rdma_counter rxe_near p2pdma_write_bytes)
gdirect-io inflight "$NVMEOF_NS" 64 >/tmp/inflight.out 2>&1 &
pid=$!
_test "reads are in flight: the drive holds reads" _wait_disk_busy "$NVMEOF_NS"
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
if [ $p2p -eq 0 ]; then
	_test "some reads failed: the deletion hit reads in flight" sh -c "[ $(_kv "$line" failed) -gt 0 ]"
else
	# On the P2P path every read is in the block layer at once, and the deletion drains them
	# (del_gendisk() freezes the queue): they may all complete. What completed went through
	# the RNIC into GPU memory: its counter grew by a MiB for each, and by at most the 64 MiB.
	landed() {
		ok=$(_kv "$line" completed_ok) grew=$(($(_rdma_counter rxe_near p2pdma_write_bytes) - rnic_before))
		ktap_print_msg "completed $ok, the RNIC wrote $grew bytes into P2PDMA pages"
		[ "$ok" -gt 0 ] && [ "$grew" -ge $((ok * 1048576)) ] && [ "$grew" -le $((64 * 1048576)) ]
	}
	_test "the completed reads went through the RNIC into GPU memory (its P2PDMA counter)" landed
fi
_test "nothing stays registered or pinned" \
	_expect_eq counters "0 0" "$(_kv "$out" registrations) $(_kv "$out" pinned_bytes)"
finish() { _nvmeof_down && rmmod gdirect && rmmod gdirect_egpu; }
_test "teardown leaves nothing behind, the modules unload" finish

ktap_finished
