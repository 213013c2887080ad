#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# GPU memory without struct pages: the emulated GPU loaded in its nopages mode
# (BAR2 plain memory, as NVIDIA's BAR1 outside its P2PDMA mode). The module
# refuses to register it with EMEDIUMTYPE (the header's meaning: no storage
# DMA can reach it through the block layer), plain and persistent, puts the
# pages back at once, and a read never reaches it; then the default mode
# works again.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg gdirect jq
_dmesg_mark
_load_module || ktap_exit_fail_msg "cannot load gdirect"
_egpu_insmod nopages=1 || ktap_exit_fail_msg "cannot load gdirect_egpu nopages=1"

ktap_print_header
ktap_set_plan 8

nopages_mode() { _dmesg_since_mark | grep -q 'without struct pages (nopages)'; }
_test "the emulated GPU runs in nopages mode" nopages_mode
bdf=$(basename "$(readlink -f /sys/bus/pci/drivers/gdirect_egpu/0*)")
no_p2pmem() { [ ! -e "/sys/bus/pci/devices/$bdf/p2pmem" ]; }
_test "its BAR publishes no P2P memory" no_p2pmem
gpu_pages() { gdirect check --json | jq -r --arg n "$bdf" '.checks[] | select(.name == "gpu_pages" and (.evidence | startswith($n))) | .verdict'; }
_test "gdirect check says it has no struct pages (warning, with the fix)" _expect_eq gpu_pages warning "$(gpu_pages)"
out=$(gdirect-reg nopages 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
_test "REGISTER refuses it with EMEDIUMTYPE, plain and persistent" \
	_expect_eq "refusals" "EMEDIUMTYPE EMEDIUMTYPE" \
	"$(_kv "$out" register_persistent_false) $(_kv "$out" register_persistent_true)"
_test "the pages are put back at once, nothing stays registered" _expect_eq "exit status" 0 "$rc"
reload() { rmmod gdirect_egpu && _egpu_insmod; }
_test "the emulated GPU reloads in its default (p2pdma) mode" reload
default_ok() { gdirect-reg egpu 1048576 "$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")" >/dev/null; }
_test "and its memory registers again" default_ok
_test "gdirect check now says its BAR has P2PDMA pages" _expect_eq gpu_pages ok "$(gpu_pages)"

ktap_finished
