#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# NVMe native multipath, as distribution kernels run it: one namespace reached
# through two NVMe/TCP controllers (two target ports) is one head device. GPU
# reads through the head are exact (host check) and reported with the paths'
# transport; `gdirect check nvmeof` lists the head and its two paths. One path
# lost in the middle of a read: the NVMe core fails the I/O over to the other
# path and the read completes, exact. The last path lost in the middle of a
# read: the read fails as on any fabric fault, with an error and no byte count,
# within the controller-loss timeout, and nothing stays pinned.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

LOSS_TMO=3
MIB=1048576
_require_root
_require_cmd nvme ip gdirect jq
[ -e /sys/module/nvme_core/parameters/multipath ] || ktap_exit_fail_msg "the kernel has no NVMe native multipath (CONFIG_NVME_MULTIPATH)"
_load_all || ktap_exit_fail_msg "cannot load the modules"
# The target exports the throttled namespace (4: 64 MiB at 32 MB/s), so that each read is
# still in flight when a path goes: a 128 MiB read of namespace 1 over the one path left once
# ended between two looks at the head's in-flight count, and the last path was never lost.
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:multipath

ktap_print_header
ktap_set_plan 14

_test "native multipath is on (nvme_core.multipath=Y)" \
	_expect_eq multipath Y "$(cat /sys/module/nvme_core/parameters/multipath)"

# The controllers of the subsystem that are live.
live_ctrls() {
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] && [ "$(cat "$c/state")" = live ] && basename "$c"
	done | wc -l
}
two_paths() {
	_nvmeof_target_up tcp "$nqn" "$local_ns" && _nvmet_port_add tcp2 && _nvmet_link tcp2 "$nqn" &&
		_nvmeof_connect tcp "$nqn" --ctrl-loss-tmo=$LOSS_TMO --reconnect-delay=1 &&
		nvme connect -t tcp -n "$nqn" -a "$GDIRECT_NVMEOF_ADDR" -s "$(_nvmet_svcid tcp2)" \
			--ctrl-loss-tmo=$LOSS_TMO --reconnect-delay=1 >/dev/null || return 1
	i=0
	while [ $i -lt 100 ]; do
		[ "$(live_ctrls)" = 2 ] && [ "$(ls "/sys/block/$(basename "$NVMEOF_NS")/multipath" 2>/dev/null | wc -l)" = 2 ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
	ktap_print_msg "live controllers: $(live_ctrls), paths: $(ls "/sys/block/$(basename "$NVMEOF_NS")/multipath" 2>&1 | tr '\n' ' ')"
	return 1
}
_test "two NVMe/TCP controllers, one namespace: a head with two paths" two_paths
head=$(basename "${NVMEOF_NS:-none}")
subsys=$(basename "$(dirname "$(readlink -f "/sys/block/$head")")")
ktap_print_msg "head $head in $subsys, paths: $(ls "/sys/block/$head/multipath" 2>/dev/null | tr '\n' ' ')"
# Both paths carry I/O, so that losing either one hits I/O in flight.
_test "I/O policy round-robin" sh -c "echo round-robin >/sys/class/nvme-subsystem/$subsys/iopolicy"

listed() {
	json=$(gdirect check nvmeof --json) || return 1
	h=$(echo "$json" | jq -c --arg h "$head" '.nvmeof.multipath.heads[] | select(.name == $h)')
	ktap_print_msg "check nvmeof: $h"
	_expect_eq "native, paths, transports, policy" "true 2 tcp,tcp round-robin" \
		"$(echo "$json" | jq -r .nvmeof.multipath.native) $(echo "$h" | jq -r '.paths | length') $(echo "$h" | jq -r '[.paths[].transport] | join(",")') $(echo "$h" | jq -r .iopolicy)" &&
		gdirect check nvmeof | grep -q "^  $head  *2 path(s)"
}
_test "gdirect check nvmeof lists the head, its two TCP paths and the policy" listed

_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
_test "16 MiB through the head into GPU memory, exact (host check)" _gd_read_exact "$NVMEOF_NS" 0 $((16 * MIB)) nvme0ns4 0
_test "QEMU's trace (the host's verdict): the target's drive moved the 16 MiB into RAM, none into the BAR" \
	_dma_expect ram_read=$((16 * MIB)) bar_read=0
reported() {
	ktap_print_msg "why: $(_rj .why)"
	_expect_eq "path reason transport" "bounce queue_no_p2p tcp" "$(_rj .path) $(_rj .reason) $(_rj .transport)"
}
_test "reported as bounced over tcp: the paths' queues take no P2P pages" reported

# One path lost mid-read: the other carries the rest.
_bg_read_start "$NVMEOF_NS" --mem egpu --offset $((16 * MIB)) --len $((48 * MIB)) --chunk $((48 * MIB))
_test "a 48 MiB read is in flight: the drive holds reads" _wait_disk_busy "$NVMEOF_NS"
_test "the second port is removed: one path lost" _nvmet_unlink tcp2 "$nqn"
_bg_read_wait 60
failed_over() {
	_expect_eq "exit bytes" "0 $((48 * MIB))" "$BG_RC $(echo "$BG_JSON" | jq -r .bytes)" &&
		_expect_eq "live controllers" 1 "$(live_ctrls)" &&
		_host_compare "gva:$(echo "$BG_JSON" | jq -r .memory.address)" nvme0ns4:$((16 * MIB)) $((48 * MIB))
}
_test "the lost path is down, the read failed over to the other and completed, exact (host check)" failed_over

# The last path lost mid-read: a fabric fault.
_bg_read_start "$NVMEOF_NS" --mem egpu --offset 0 --len $((48 * MIB)) --chunk $((48 * MIB))
last_lost() {
	_wait_disk_busy "$NVMEOF_NS" && _nvmet_unlink tcp "$nqn"
}
_test "the first port is removed mid-read too: no path left" last_lost
_bg_read_wait 60
failed_in_time() {
	_bg_read_failed_cleanly && [ "$BG_SECONDS" -le $((LOSS_TMO + 15)) ]
}
_test "the read fails, with an error and no byte count, within the loss timeout" failed_in_time
_test "nothing stays registered or pinned" \
	_expect_unpinned
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
