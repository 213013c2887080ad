#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The host provider: a buffer of the calling process is pinned in 4 KiB pages,
# counted per file and module-wide, and QUERY gives, for a peer device, the DMA
# address of every page - equal, where the test first finds no IOMMU, to the page's
# physical address that /proc/self/pagemap reports; in the IOMMU rig (scripts/vm --iommu),
# an IOVA that the kernel's page table of the peer's domain translates to it.
# Unregistering returns every counter to zero.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 8

_test "the host provider is reported available" _expect_eq host true "$(_info .providers.host)"
out=$(gdirect-reg host 1048576 "$nvme0")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "registration and query succeed" _expect_eq "exit status" 0 "$rc"
_test "page size 4096, 256 pages for 1 MiB" _expect_eq pages "4096 256" "$(_kv "$out" page_size) $(_kv "$out" page_count)"
_test "the file counts one registration of 1 MiB" \
	_expect_eq "file counters" "1 1048576" "$(_kv "$out" file_registrations) $(_kv "$out" file_pinned_bytes)"
_test "the peer reaches it as host memory" _expect_eq map_type host_memory "$(_kv "$out" map_type)"
if [ "${GDIRECT_IOMMU:-0}" = 1 ]; then
	_test "every page's DMA address is an IOVA the IOMMU translates to its physical address (pagemap)" \
		_expect_eq "pagemap translated" "256/256 true" "$(_kv "$out" pagemap_match) $(_kv "$out" translated_by_iommu)"
else
	# Physical addresses only where no IOMMU translates: the kernel registers none.
	_test "no IOMMU, and every page's DMA address is its physical address (pagemap)" \
		_expect_eq "iommus pagemap translated" "0 256/256 false" \
		"$(ls /sys/class/iommu | wc -l) $(_kv "$out" pagemap_match) $(_kv "$out" translated_by_iommu)"
fi
after=$(echo "$out" | sed -n 's/^after_unregister //p')
_test "unregister returns the file's counters to zero" \
	_expect_eq "after" "0 0" "$(_kv "$after" file_registrations) $(_kv "$after" file_pinned_bytes)"
_test "nothing stays registered or pinned (module, kernel, GPU)" _expect_unpinned

ktap_finished
