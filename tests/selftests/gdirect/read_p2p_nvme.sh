#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A read from the NVMe under the switch into the emulated GPU goes peer to
# peer: the path is p2p, the stats count every byte on the P2P path and none
# through host memory, and the host finds in its /dev/shm file exactly the
# bytes it wrote into the drive image before boot. Where the DMA went is QEMU's
# word, not the module's: the host's trace of the emulated NVMe shows all 16 MiB
# mapped inside the emulated GPU's BAR and none in guest RAM.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 8

p2p_before=$(_stat p2p read bytes)
bounce_before=$(( $(_stat bounce read bounce_bytes) + $(_stat p2p read bounce_bytes) ))
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
_test "16 MiB read into GPU memory" _gd_read "$dev" --mem egpu --offset 4M --len 16M
_test "QEMU saw the NVMe DMA all 16 MiB into the GPU's BAR, none into guest RAM" \
	_dma_expect bar_read=16777216 ram_read=0
_test "all 16 MiB arrived" _expect_eq bytes 16777216 "$(_rj .bytes)"
_test "the path is p2p, with no reason to bounce" _expect_eq path "p2p none" "$(_rj .path) $(_rj .reason)"
_test "no byte went through host memory" _expect_eq bounce_bytes 0 "$(_rj .bounce_bytes)"
_test "the stats count the 16 MiB on the P2P path" _expect_eq "p2p read bytes" $((p2p_before + 16777216)) "$(_stat p2p read bytes)"
_test "and nothing bounced" _expect_eq "bounced" "$bounce_before" \
	"$(( $(_stat bounce read bounce_bytes) + $(_stat p2p read bounce_bytes) ))"
_test "the host's /dev/shm holds the drive image's bytes" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:4194304 16777216

ktap_finished
