#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The p2pdma provider: an mmap of the NVMe CMB's p2pmem/allocate is pinned in
# 4 KiB pages owned by the NVMe function; a peer under the same switch (the
# emulated GPU) gets contiguous bus addresses inside the CMB's BAR, the NVMe on
# the other root port gets "not supported", and the CMB's pool is whole again
# once the registration and the mapping are gone.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
# The GPU is the peer here, and a peer must be driven by a driver of the kernel (QUERY refuses
# one with no driver, EUNATCH): its driver is loaded too.
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nvme1=$(_nvme_bdf_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
gpu=$(_gpu_bdf)
cmb=/sys/bus/pci/devices/$nvme0/p2pmem
[ -e "$cmb/allocate" ] || ktap_exit_fail_msg "the CMB of $nvme0 is not published"

ktap_print_header
ktap_set_plan 9

_test "the p2pdma provider is reported available" _expect_eq p2pdma true "$(_info .providers.p2pdma)"
available=$(cat "$cmb/available")
out=$(gdirect-reg p2pmem "$nvme0" 262144 "$gpu")
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "register and query 256 KiB of the CMB" _expect_eq "exit status" 0 "$rc"
_test "page size 4 KiB, 64 pages" _expect_eq pages "4096 64" "$(_kv "$out" page_size) $(_kv "$out" page_count)"
_test "the memory's owner is the NVMe" _expect_eq owner "$nvme0" "$(_kv "$out" owner)"
_test "the GPU under the same switch gets bus addresses" _expect_eq map_type bus_addr "$(_kv "$out" map_type)"
_test "the addresses lie in the CMB's BAR" _expect_eq in_bar true "$(_kv "$out" in_bar)"
_test "and are contiguous, as the allocation is" _expect_eq contiguous true "$(_kv "$out" contiguous)"
far=$(gdirect-reg p2pmem "$nvme0" 65536 "$nvme1")
_test "the NVMe across the host bridge cannot reach it" _expect_eq map_type not_supported "$(_kv "$far" map_type)"
_test "the CMB pool is whole again afterwards" _expect_eq available "$available" "$(cat "$cmb/available")"

ktap_finished
