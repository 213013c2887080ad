#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Batched writes from GPU memory: 8 writes of 1 MiB in one SUBMIT, from
# emulated GPU memory filled with a known pattern to the raw NVMe under the
# switch at 208 MiB, every fourth forced through the bounce path. Each
# completion is whole; QEMU's trace shows the NVMe read the P2P ones from the
# GPU's BAR and the bounced ones from guest RAM; the host confirms the sha256 of
# its drive image against the pattern.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
M=1048576
at=$((208 * M))

ktap_print_header
ktap_set_plan 6

_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
out=$(gdirect-io batchwrite "$dev" "$at" 8 4242 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "8 batched 1 MiB writes, each whole, read back equal" _expect_eq "exit writes" "0 8" "$rc $(_kv "$out" writes)"
_test "6 peer to peer, 2 bounced, 2 MiB through host memory" \
	_expect_eq "p2p bounce bounce_bytes" "6 2 $((2 * M))" "$(_kv "$out" p2p) $(_kv "$out" bounce) $(_kv "$out" bounce_bytes)"
_test "QEMU saw the NVMe read 6 MiB from the GPU's BAR and 2 MiB from guest RAM" \
	_dma_expect bar_write=$((6 * M)) ram_write=$((2 * M))
_test "the drive image holds the pattern (sha256 checked by the host)" \
	_host_sha256 "nvme0:$at" $((8 * M)) "$(_kv "$out" sha256_written)"
_test "the guest reads the same bytes back" \
	_expect_eq sha256 "$(_kv "$out" sha256_written)" "$(_kv "$out" sha256_read_back)"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
