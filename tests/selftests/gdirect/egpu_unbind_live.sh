#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The GPU driver goes away under live registrations: the emulated GPU's PCI
# driver is unbound while a batch of 128 reads of 1 MiB into its memory is in
# flight (from the namespace QEMU throttles to 32 MB/s, so they stay in flight
# for about 4 s: 48 of them, 1.5 s, were over before a debug kernel under TCG
# had started the unbind), as
# nvidia.ko's teardown frees every allocation and calls each client's free
# callback. The unbind returns within a bound, every read ends whole or with
# EKEYREVOKED, nothing stays registered or pinned, and after binding the driver
# again a read into GPU memory is exact (host check).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

drv=/sys/bus/pci/drivers/gdirect_egpu
cleanup() {
	[ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null
	[ -n "${bdf:-}" ] && [ -d "$drv" ] && [ ! -e "$drv/$bdf" ] && echo "$bdf" >"$drv/bind" 2>/dev/null
	rm -f /tmp/unbind-live.out
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
bdf=$(_gpu_bdf)
[ -e "$drv/$bdf" ] || ktap_exit_fail_msg "the emulated GPU $bdf is not bound to gdirect_egpu"

ktap_print_header
ktap_set_plan 8

# QEMU's trace is marked before the reads start: the host judges only commands submitted after
# the mark, and the drive's queue takes the batch's commands at once, often before the block
# layer's count (what _wait_disk_busy sees) is read. (Marked after it, a run whose commands
# QEMU had taken already saw none outstanding at the free.)
_frees_mark || ktap_print_msg "no mark of QEMU's trace"
gdirect-io inflight "$slow" 128 >/tmp/unbind-live.out 2>&1 &
pid=$!
_test "a batch of reads into GPU memory is in flight: the drive holds reads" _wait_disk_busy "$slow"
# The count rises before the doorbell rings and QEMU takes the commands (its main loop, behind
# the vCPUs): 0.1 s more, well inside the 4 s the reads stay in flight.
sleep 0.1
in_flight=$(sed -n 's/^active_transfers //p' /sys/kernel/debug/gdirect/counters)
start=$(date +%s)
timeout 120 sh -c "echo $bdf >$drv/unbind"
urc=$?
_frees_since
took=$(($(date +%s) - start))
ktap_print_msg "unbind took ${took}s (exit $urc)"
_test "the GPU driver unbinds under them, within 120 s" _expect_eq "exit" 0 "$urc"
wait "$pid"
prc=$?
pid=
out=$(cat /tmp/unbind-live.out)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
line=$(echo "$out" | grep '^completed_ok=')
_test "the reader ended cleanly" _expect_eq "exit" 0 "$prc"
only_revoked() {
	errs=$(_kv "$line" errors | tr ',' '\n' | grep . | grep -v '^\(submit_\)\{0,1\}EKEYREVOKED:')
	[ -z "$errs" ] || { ktap_print_msg "other outcomes: $errs"; return 1; }
}
_test "every read ended whole or with EKEYREVOKED" only_revoked
# Transfers that had started finish before the free callback returns (the revocation waits
# for them); those not yet started are revoked.
# As QEMU saw it (the module's count, $in_flight, is only printed): the unbind's free of the
# reader's memory began while the NVMe's reads into those very pages were outstanding.
raced() { [ "${FREES:-0}" -ge 1 ] && _expect_eq "frees begun under DMA into their pages" 1 "$FREES_DURING_BAR_DMA"; }
_test "the unbind's free began under DMA into its pages (QEMU's trace)" raced
echo "GDIRECT-FIGURE egpu_unbind_live frees_during_dma_into_their_pages=$FREES_DURING_BAR_DMA transfers_in_flight_at_unbind=$in_flight unbind_seconds=$took reads_ok=$(_kv "$line" completed_ok) reads_revoked=$(_kv "$line" failed)"
_test "nothing stays registered or pinned" \
	_expect_unpinned
rebound() { echo "$bdf" >"$drv/bind" && [ -e "$drv/$bdf" ]; }
_test "the GPU driver binds again" rebound
again() {
	_gd_read "$ns" --mem egpu --offset 140M --len 4M &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((140 * 1048576)) 4194304
}
_test "a read into GPU memory after the rebind is exact (host check)" again

ktap_finished
