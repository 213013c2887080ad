#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The nvidia provider through the emulated GPU's nv-p2p interface: found only
# when its symbols are exported, 64 KiB pages, QUERY bus addresses equal to the
# BAR2 bus address in sysfs plus the allocation's offset for a peer under the
# same switch, "not supported" for one across the host bridge; the persistent
# interface too; and the provider disappears with the GPU driver.
#
# In the IOMMU rig (scripts/vm --iommu) both peers reach the GPU through the host bridge: the
# addresses are IOVAs, each checked against the kernel's page table of the peer's IOMMU
# domain (intel-iommu's debugfs), none left mapping the BAR after unregister.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
[ -f "$GDIRECT_EGPU_MODULE" ] || { ktap_skip_all "no emulated GPU module"; exit "$KSFT_SKIP"; }
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nvme1=$(_nvme_bdf_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
gpu=$(_gpu_bdf)

ktap_print_header
ktap_set_plan 14

_test "without a GPU driver the nvidia provider is not reported" _expect_eq nvidia false "$(_info .providers.nvidia)"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
_test "with the emulated GPU's nv-p2p symbols it is" _expect_eq nvidia true "$(_info .providers.nvidia)"

out=$(gdirect-reg egpu 1048576 "$nvme0")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "register and query 1 MiB of GPU memory" _expect_eq "exit status" 0 "$rc"
_test "the new allocation came poisoned (every byte 0xe9)" _expect_eq poisoned true "$(_kv "$out" poisoned)"
_test "page size 64 KiB, 16 pages" _expect_eq pages "65536 16" "$(_kv "$out" page_size) $(_kv "$out" page_count)"
_test "one nv-p2p page table is held while registered" _expect_eq mappings 1 "$(_kv "$out" egpu_mappings)"
if [ "${GDIRECT_IOMMU:-0}" = 1 ]; then
	_test "through the IOMMU the peer gets DMA-mapped addresses" \
		_expect_eq map_type thru_host_bridge "$(_kv "$out" map_type)"
else
	_test "the peer under the same switch gets bus addresses" _expect_eq map_type bus_addr "$(_kv "$out" map_type)"
fi
_test "the memory's owner is the GPU" _expect_eq owner "$gpu" "$(_kv "$out" owner)"
sysfs_bar=$(printf '0x%x' "$(sed -n 3p "/sys/bus/pci/devices/$gpu/resource" | cut -d' ' -f1)")
_test "the GPU's BAR2 bus address is the one in sysfs" _expect_eq bar "$sysfs_bar" "$(_kv "$out" bar_bus_addr)"
after=$(echo "$out" | sed -n 's/^after_unregister //p' | tr '\n' ' ')
if [ "${GDIRECT_IOMMU:-0}" = 1 ]; then
	_test "the IOMMU maps every address to BAR2 + its page's own offset (the kernel's page table)" \
		_expect_eq iommu_match 16/16 "$(_kv "$out" iommu_match)"
	_test "unregister puts the page table back, and no IOVA of the peer maps the BAR" \
		_expect_eq "mappings bar_pages" "0 0" "$(_kv "$after" egpu_mappings) $(_kv "$after" iommu_bar_pages)"
else
	_test "every address is BAR2 + its page's own offset (the GPU's page directory)" _expect_eq bus_match 16/16 "$(_kv "$out" bus_match)"
	_test "unregister puts the page table back" _expect_eq mappings 0 "$(_kv "$after" egpu_mappings)"
fi

far=$(gdirect-reg egpu 262144 "$nvme1")
pers=$(gdirect-reg egpu 262144 "$nvme0" persistent)
if [ "${GDIRECT_IOMMU:-0}" = 1 ]; then
	_test "the other drive is routed through the IOMMU too, every address translated" \
		_expect_eq "map_type iommu_match" "thru_host_bridge 4/4" "$(_kv "$far" map_type) $(_kv "$far" iommu_match)"
	_test "the persistent interface registers and translates too" _expect_eq iommu_match 4/4 "$(_kv "$pers" iommu_match)"
else
	_test "the peer across the host bridge cannot reach it" _expect_eq map_type not_supported "$(_kv "$far" map_type)"
	_test "the persistent interface registers and translates too" _expect_eq bus_match 4/4 "$(_kv "$pers" bus_match)"
fi

rmmod gdirect_egpu
_test "unloading the GPU driver removes the provider" _expect_eq nvidia false "$(_info .providers.nvidia)"

ktap_finished
