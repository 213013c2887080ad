#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Batched writes from GPU memory: 8 writes of 1 MiB in one SUBMIT, from
# emulated GPU memory filled with a known pattern to the raw NVMe under the
# switch at 208 MiB, every fourth forced through the bounce path. Each
# completion is whole; QEMU's trace shows the NVMe read the P2P ones from the
# GPU's BAR and the bounced ones from guest RAM; the host confirms the sha256 of
# its drive image against the pattern. Then the compat engine's kept registrations of the
# device's page cache (host memory, through its mapping) are retired by a batched and by a
# synchronous write through the module: the read after each registers again and gets the
# bytes written, and the library counted the write against the device (what retires them
# where the file's times do not move).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
M=1048576
at=$((208 * M))

ktap_print_header
ktap_set_plan 8

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
# registered=A,B,C: the three reads' registered bytes: A some, B none (kept), C as many as A;
# writes_counted=X,Y: Y above X.
kept_retired() {
	out=$(gdirect-io keptwrite "$dev" "$1" "$2" $3 2>&1)
	rc=$?
	ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
	regs=$(_kv "$out" registered)
	a=${regs%%,*} c=${regs##*,} b=${regs#*,} b=${b%%,*}
	w=$(_kv "$out" writes_counted)
	[ "$rc" = 0 ] && [ "${a:-0}" -gt 0 ] && [ "$b" = 0 ] && [ "$c" = "$a" ] &&
		[ "$(_kv "$out" read_after_write_equal)" = 1 ] && [ "${w##*,}" -gt "${w%%,*}" ] 2>/dev/null
}
_test "a batched write retires the registrations kept of the device's page cache" \
	kept_retired $((at + 8 * M)) 77
_test "so does a synchronous one" \
	kept_retired $((at + 9 * M)) 78 sync
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
