#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A read from the NVMe on the other root port cannot go peer to peer (the host
# bridge is not on the kernel's P2PDMA allowlist): it bounces, says the reason
# is the PCI distance, counts the bytes that went through host memory, and the
# bytes in GPU memory are still exactly the drive image's.
# In the IOMMU rig with an Intel CPU (scripts/vm --iommu --intel-cpu) that NVMe shares the GPU's
# root port, whose ACS redirect sends their P2P up through the host bridge, which the kernel
# does not let P2P cross: refused for distance all the same, and the DMA judged through the
# IOMMU's translations.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"

ktap_print_header
ktap_set_plan 8

bounced_before=$(_stat bounce read bounce_bytes)
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
_test "8 MiB read into GPU memory" _gd_read "$dev" --mem egpu --offset 8M --len 8M
_test "QEMU saw the NVMe DMA all 8 MiB into guest RAM, none into the GPU's BAR" \
	_dma_expect bar_read=0 ram_read=8388608
_test "the path is bounce, for distance" _expect_eq path "bounce distance" "$(_rj .path) $(_rj .reason)"
_test "all 8 MiB went through host memory" _expect_eq bounce_bytes 8388608 "$(_rj .bounce_bytes)"
_test "the stats count them as bounced" _expect_eq "bounced" $((bounced_before + 8388608)) "$(_stat bounce read bounce_bytes)"
_test "the host's /dev/shm holds the drive image's bytes" \
	_host_compare "gva:$(_rj .memory.address)" nvme1:8388608 8388608
forced() {
	_gd_read "$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL")" --mem egpu --len 4M --force-bounce &&
		_expect_eq path "bounce forced" "$(_rj .path) $(_rj .reason)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:0 4194304
}
_test "a forced bounce from the switch NVMe says so, and is exact too" forced
cmb() {
	_gd_read "$dev" --mem p2pmem --len 1M --verify "$dev" &&
		_expect_eq "memory path reason" "p2pmem distance" "$(_rj .memory.kind) $(_rj .reason)" &&
		_expect_eq verified true "$(_rj .verified)"
}
_test "into the CMB of the switch NVMe (p2pmem): bounced for distance, verified" cmb

ktap_finished
