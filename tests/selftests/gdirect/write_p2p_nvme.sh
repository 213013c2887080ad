#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A write from GPU memory to the NVMe under the switch goes peer to peer. The
# GPU memory is filled with bytes the host knows (a region of the other drive's
# image), written to the raw namespace at 200 MiB, and the host compares the
# drive image with its own bytes: now, and again after shutdown. QEMU's trace of
# the emulated NVMe shows it read all 4 MiB from the GPU's BAR, none from RAM.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dst=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
src=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
MiB=1048576
at=$((200 * MiB))

ktap_print_header
ktap_set_plan 7

dd if="$src" of=/tmp/write-src bs=1M count=4 iflag=direct 2>/dev/null
written_before=$(_stat p2p write bytes)
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
out=$(gdirect write "$dst" --from /tmp/write-src --mem egpu --offset 200M --json)
rc=$?
ktap_print_msg "$(echo "$out" | jq -c '{bytes,path,reason,bounce_bytes}')"
_test "4 MiB written from GPU memory to the NVMe" _expect_eq "exit bytes" "0 $((4 * MiB))" "$rc $(echo "$out" | jq .bytes)"
_test "peer to peer, nothing through host memory" \
	_expect_eq path "p2p none 0" "$(echo "$out" | jq -r '"\(.path) \(.reason) \(.bounce_bytes)"')"
_test "QEMU saw the NVMe read all 4 MiB from the GPU's BAR, none from guest RAM" \
	_dma_expect bar_write=$((4 * MiB)) ram_write=0
_test "the stats count the write on the P2P path" \
	_expect_eq "p2p write bytes" $((written_before + 4 * MiB)) "$(_stat p2p write bytes)"
_test "the drive image holds the bytes (host check)" _host_compare "nvme0:$at" nvme1:0 $((4 * MiB))
reread() { dd if="$dst" bs=1M skip=200 count=4 iflag=direct 2>/dev/null | cmp - /tmp/write-src; }
_test "a direct read in the guest agrees" reread
_host_compare_at_exit "nvme0:$at" nvme1:0 $((4 * MiB))
_test "the host checks the image again after shutdown" true

ktap_finished
