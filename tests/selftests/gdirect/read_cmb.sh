#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The NVMe's controller memory buffer as a read destination (the p2pdma
# provider): 4 MiB of the NVMe under the switch read into its own CMB, poisoned
# first. The path is p2p, QEMU's trace shows the NVMe DMA all 4 MiB into its CMB
# and none into guest RAM, and the host confirms the sha256 of the CMB's bytes
# against its own drive image. From the NVMe on the other root port the same
# read bounces (distance) and is exact too.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
far=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
bdf=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
M=1048576
at=$((120 * M + 12 * 4096))

ktap_print_header
ktap_set_plan 6

_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
out=$(gdirect-io readmem "p2pmem:$bdf" "$dev" "$at" $((4 * M)) 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "4 MiB read into the CMB of $bdf" _expect_eq "exit bytes" "0 $((4 * M))" "$rc $(_kv "$out" bytes)"
_test "peer to peer, nothing through host memory" \
	_expect_eq "path reason bounce_bytes" "p2p none 0" "$(_kv "$out" path) $(_kv "$out" reason) $(_kv "$out" bounce_bytes)"
_test "QEMU saw the NVMe DMA all 4 MiB into its CMB, none into guest RAM" \
	_dma_expect cmb_read=$((4 * M)) ram_read=0
_test "the CMB holds the drive image's bytes (sha256 checked by the host)" \
	_host_sha256 "nvme0:$at" $((4 * M)) "$(_kv "$out" sha256)"
far_at=$((40 * M + 3 * 4096))
out=$(gdirect-io readmem "p2pmem:$bdf" "$far" "$far_at" $((2 * M)) 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
far_read() {
	_expect_eq "exit bytes path reason" "0 $((2 * M)) bounce distance" \
		"$rc $(_kv "$out" bytes) $(_kv "$out" path) $(_kv "$out" reason)" &&
		_host_sha256 "nvme1:$far_at" $((2 * M)) "$(_kv "$out" sha256)"
}
_test "from the NVMe across the host bridge: bounced for distance, exact" far_read
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
