#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Every nv-p2p generation a GPU node runs: the emulated GPU loaded as a 535-series driver
# (page table version 1.2, no flags) and as a 580-series one (2.0, with flags, as 580.65.06 to
# 595 make them), and the module registers, queries, reads peer to peer and through a bounce
# under each, checked from outside the module: QEMU's trace of the NVMe's DMA and the host's
# /dev/shm against the drive image. A 2.0 table flagged CPU-cacheable (coherent memory, not in a
# BAR) is refused with EMEDIUMTYPE; a 1.2 table has no such field to read. A table of a
# version no driver has made (3.0, and 1.1 below the oldest the module reads) is refused with
# EPROTO, the kernel log names the version, and the emulated GPU holds no page table after the
# refused REGISTER (its own count, the memory still allocated).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
[ -f "$GDIRECT_EGPU_MODULE" ] || { ktap_skip_all "no emulated GPU module"; exit "$KSFT_SKIP"; }
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
dev0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL namespace"
dev1=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL namespace"

ktap_print_header
ktap_set_plan 20

# Loads the emulated GPU with parameters $@ (after unloading it).
egpu_as() {
	[ -d /sys/module/gdirect_egpu ] && rmmod gdirect_egpu
	_dmesg_mark
	insmod "$GDIRECT_EGPU_MODULE" "$@"
}

# P2P: QEMU saw all of it go into the BAR, and the host finds the image's bytes there.
p2p_read_exact() {
	_dma_mark || return 1
	_gd_read "$dev0" --mem egpu --offset "$1" --len 4M || return 1
	_dma_since || return 1
	_expect_eq "path" "p2p none" "$(_rj .path) $(_rj .reason)" &&
		_dma_expect bar_read=4194304 ram_read=0 &&
		_host_compare "gva:$(_rj .memory.address)" "nvme0:$1" 4194304
}

# Bounce (the NVMe across the host bridge): into guest RAM, then copied; the host compares.
bounce_read_exact() {
	_gd_read "$dev1" --mem egpu --offset "$1" --len 2M &&
		_expect_eq "path" "bounce distance" "$(_rj .path) $(_rj .reason)" &&
		_host_compare "gva:$(_rj .memory.address)" "nvme1:$1" 2097152
}

for gen in "535 R535 0x00010002" "580 R580 0x00020000"; do
	set -- $gen
	series=$1 name=$2 version=$3
	loaded() { egpu_as nv_driver="$series" && _dmesg_since_mark | grep -q "page table $name, version $version"; }
	_test "$series: the emulated GPU makes nv-p2p page tables of version $version" loaded
	out=$(gdirect-reg egpu 1048576 "$nvme0")
	rc=$?
	ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
	_test "$series: REGISTER and QUERY of 1 MiB, every bus address right" \
		_expect_eq "exit bus_match" "0 16/16" "$rc $(_kv "$out" bus_match)"
	pers=$(gdirect-reg egpu 262144 "$nvme0" persistent)
	_test "$series: the persistent interface too" _expect_eq bus_match 4/4 "$(_kv "$pers" bus_match)"
	_test "$series: a P2P read lands exactly, QEMU's trace all in the BAR" p2p_read_exact $((series * 4096))
	_test "$series: a bounced read lands exactly" bounce_read_exact $((series * 8192))
done

# CPU_CACHEABLE (2.0 only): nvidia.ko sets it for coherent GPU memory, addressed outside any
# BAR: refused like memory without P2PDMA pages. A 1.2 table has no flags field: the same
# parameter changes nothing there (and on the debug kernel KASAN sees a read past the table).
_test "580, tables flagged CPU-cacheable: loaded" egpu_as nv_driver=580 cpu_cacheable=1
out=$(gdirect-reg pin egpu 1048576)
ktap_print_msg "$out"
_test "580, CPU-cacheable: REGISTER refused with EMEDIUMTYPE, no page table held" \
	_expect_eq "register mappings" "EMEDIUMTYPE 0" "$(_kv "$out" register) $(_kv "$out" egpu_mappings)"
_test "535 with the same parameter: loaded" egpu_as nv_driver=535 cpu_cacheable=1
_test "535: no flags field to read, a P2P read lands exactly" p2p_read_exact 12582912

for version in 0x00030000 0x00010001; do
	_test "a page table of version $version: loaded" egpu_as page_table_version=$((version))
	out=$(gdirect-reg pin egpu 1048576)
	ktap_print_msg "$out"
	_test "version $version: REGISTER refused with EPROTO (unknown_page_table), no page table held" \
		_expect_eq "register mappings" "EPROTO 0" "$(_kv "$out" register) $(_kv "$out" egpu_mappings)"
	named() { _dmesg_since_mark | grep -q "page table of version $version, which this gdirect does not know"; }
	_test "version $version: the kernel log names it" named
done

ktap_finished
