#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# 1,000 reads of random offsets and lengths (512 B to 1 MiB, some past the end
# of the device) from both NVMe drives into random places of GPU memory, a
# quarter forced to bounce: every byte of every read compared with a buffered
# read of the same range (poisoned first), and the end of the device reported;
# QEMU's trace of the drives' DMA (the host's account, not the module's) shows
# exactly the P2P reads' bytes went into the GPU's BAR.
# GDIRECT_SEED=N (passed by scripts/vm) replays the offsets.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
n0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
n1=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
seed=${GDIRECT_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}

ktap_print_header
ktap_set_plan 5

_dma_mark || ktap_exit_fail_msg "no DMA trace"
out=$(gdirect-io random 1000 "$seed" "$n0" "$n1")
rc=$?
_dma_since || ktap_exit_fail_msg "no DMA trace"
echo "$out" | grep FAIL | head -n 5 | while read -r l; do ktap_print_msg "$l"; done
ktap_print_msg "$(echo "$out" | tail -n 1) (seed $seed: GDIRECT_SEED=$seed replays it)"
_test "1,000 reads, every byte equal to the reference" _expect_eq "exit status" 0 "$rc"
_test "all 1,000 were made" _expect_eq reads 1000 "$(_kv "$(echo "$out" | tail -n 1)" reads)"
both() { [ "$(_kv "$(echo "$out" | tail -n 1)" p2p)" -gt 0 ] && [ "$(_kv "$(echo "$out" | tail -n 1)" bounce)" -gt 0 ]; }
_test "both the P2P and the bounce path were taken" both
_test "reads past the end of the device were short and said so" sh -c "[ $(_kv "$(echo "$out" | tail -n 1)" eof) -gt 0 ]"
# The bounced reads and the reference reads go into RAM; only the P2P ones into the BAR.
traced() {
	p2p_bytes=$(_kv "$(echo "$out" | tail -n 1)" p2p_bytes)
	_expect_ge "P2P bytes (the tool's)" 1 "${p2p_bytes:-0}" &&
		_dma_expect bar_read="$p2p_bytes"
}
_test "QEMU's trace: the BAR got exactly the bytes of the reads the module called P2P" traced

ktap_finished
