#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Stress with every byte checked: 4 processes of 2 threads each do random reads
# and writes between emulated GPU memory and NVMe — two on a local namespace
# (P2P under the switch, or bounced at random), two on a namespace over NVMe-oF
# (RDMA) — with the GPU memory freed (revoked) and registered again underneath.
# Reads of a window nobody writes are compared with a snapshot, reads of a
# thread's own slice with what it wrote. The totals are printed; mismatches
# must be 0 and nothing may stay pinned. QEMU's trace of the local NVMe's DMA, judged by the
# host, holds exactly the bytes the local processes' P2P reads and writes moved in the GPU's
# BAR (a revocation comes between one thread's transfers, never under one; the fabric's
# namespace is a loop device, whose bytes no emulated NVMe moves). GDIRECT_STRESS_OPS sets the operations
# per thread (default 500, 150 on the debug kernel). The local namespace (the ext4 image of other tests)
# is saved first and restored after; the fabric's namespace is a loop device
# over a file in guest memory, so no drive image the host checks is changed.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

img=/tmp/stress-fabric.img backing=
cleanup() {
	_nvmeof_down
	[ -n "$backing" ] && losetup -d "$backing"
	_ns_restore
	rm -f "$img"
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-io nvme ip rdma jq losetup
_load_all || ktap_exit_fail_msg "cannot load the modules"
local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 2) || ktap_exit_fail_msg "no namespace 2 of $GDIRECT_NVME0_SERIAL"
_ns_save "$local_ns" || ktap_exit_fail_msg "cannot save $local_ns"
dd if=/dev/zero of="$img" bs=1M count=64 status=none && backing=$(losetup -f) && losetup "$backing" "$img" ||
	ktap_exit_fail_msg "no loop device for the fabric's namespace"
# The debug kernel (KASAN, lockdep under TCG) runs the fabric processes about 4 times
# slower: fewer operations there keep the test well inside its limit on a busy machine.
default_ops=500
[ "$GDIRECT_VARIANT" = debug ] && default_ops=150
ops=${GDIRECT_STRESS_OPS:-$default_ops}
nqn=$GDIRECT_NQN_PREFIX:stress

ktap_print_header
ktap_set_plan 9

up() { _nvmeof_target_up rdma "$nqn" "$backing" && _nvmeof_connect rdma "$nqn"; }
_test "a namespace over NVMe-oF (RDMA)" up
fill() {
	dd if=/dev/urandom of="$local_ns" bs=1M count=16 oflag=direct status=none &&
		dd if=/dev/urandom of="$NVMEOF_NS" bs=1M count=16 oflag=direct status=none
}
_test "random bytes in both read windows" fill

M=1048576
dir=$(mktemp -d)
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
i=0
for dev in "$local_ns" "$local_ns" "$NVMEOF_NS" "$NVMEOF_NS"; do
	i=$((i + 1))
	start=$((16 * M + (i % 2) * 24 * M))
	gdirect-io stress "$ops" "$((i * 7919))" 2 "$dev" 0 $((16 * M)) "$start" $((24 * M)) >"$dir/$i" 2>&1 &
	eval "pid$i=$!"
done
fails=0
for i in 1 2 3 4; do
	eval "wait \$pid$i" || fails=$((fails + 1))
	grep -v '^seed=' "$dir/$i" | sed "s/^/process $i: /" | while read -r l; do ktap_print_msg "$l"; done
done
sum() { grep -hv '^seed=' "$dir"/[1-4] | sed -nE "s/(^|.* )$1=([0-9]+).*/\2/p" | awk '{s += $1} END {print s + 0}'; }
totals="ops=$(sum ops) reads=$(sum reads) writes=$(sum writes) bytes=$(sum bytes) mismatches=$(sum mismatches) revocations=$(sum revocations) p2p=$(sum p2p) bounce=$(sum bounce)"
ktap_print_msg "totals: $totals"
echo "GDIRECT-FIGURE stress_io processes=4 threads=2 ops_per_thread=$ops $totals"
_test "every process finished cleanly" _expect_eq failed 0 "$fails"
_test "all $((4 * 2 * ops)) operations ran" _expect_eq ops $((4 * 2 * ops)) "$(sum ops)"
_test "no byte of any read differs" _expect_eq mismatches 0 "$(sum mismatches)"
both() { [ "$(sum p2p)" -gt 0 ] && [ "$(sum bounce)" -gt 0 ] && [ "$(sum revocations)" -gt 0 ] && [ "$(sum revocations)" = "$(sum revoked_errors)" ]; }
_test "P2P and bounce both used, revocations happened and each refused later I/O" both
local_sum() { sed -nE "s/(^|.* )$1=([0-9]+).*/\2/p" "$dir/1" "$dir/2" | awk '{s += $1} END {print s + 0}'; }
_test "QEMU's trace (the host's verdict): the local P2P reads' and writes' bytes, exactly, in the BAR" \
	_dma_expect bar_read="$(local_sum p2p_read_bytes)" bar_write="$(local_sum p2p_write_bytes)"
_test "nothing stays registered or pinned" \
	_expect_unpinned
rm -rf "$dir"
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
