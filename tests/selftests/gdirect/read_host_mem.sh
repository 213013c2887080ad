#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Host memory as a read destination (the host provider): 8 MiB of the NVMe
# under the switch read into a poisoned, registered host buffer. The path is
# host, nothing bounces, QEMU's trace shows the NVMe DMA all 8 MiB into guest
# RAM and none into the GPU's BAR, and the host confirms the sha256 of the
# buffer's bytes against its own drive image (it cannot see guest RAM itself).
# The kernel's page flags (/proc/kpageflags) show the pages clean before the
# registration (the CPU's writes dirty only the page tables) and every page
# dirty after it ends: the module unpinned them dirty, as pages a device wrote
# must be, or reclaim could drop a file's, shmem's or MADV_FREE'd page with the
# device's bytes.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
M=1048576
at=$((112 * M + 64 * 1024))

ktap_print_header
ktap_set_plan 6

_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
out=$(gdirect-io readmem host "$dev" "$at" $((8 * M)) 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "8 MiB read into a registered host buffer" _expect_eq "exit bytes" "0 $((8 * M))" "$rc $(_kv "$out" bytes)"
_test "the path is host, nothing through the bounce pool" \
	_expect_eq "path bounce_bytes" "host 0" "$(_kv "$out" path) $(_kv "$out" bounce_bytes)"
_test "QEMU saw the NVMe DMA all 8 MiB into guest RAM, none into the GPU's BAR" \
	_dma_expect ram_read=$((8 * M)) bar_read=0
_test "the buffer holds the drive image's bytes (sha256 checked by the host)" \
	_host_sha256 "nvme0:$at" $((8 * M)) "$(_kv "$out" sha256)"
_test "the kernel holds all $((8 * M / 4096)) pages dirty after the registration, none before (kpageflags)" \
	_expect_eq "dirty before, after" "0 $((8 * M / 4096))" "$(_kv "$out" dirty_before) $(_kv "$out" dirty_after)"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
