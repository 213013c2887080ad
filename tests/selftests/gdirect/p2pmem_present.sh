#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The rig as the module will see it: the NVMe CMB under the switch is
# registered and published as P2P memory, the NVMe on the other root port has
# none, and the emulated GPU's 256 MiB BAR2 sits under the same switch and is
# the host's /dev/shm file - a token the host wrote is read back here, and bytes
# written here are checked by the host.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

_require_root
_require_cmd gdirect-mmap

nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
nvme1=$(_nvme_bdf_by_serial "$GDIRECT_NVME1_SERIAL")
gpu=$(_gpu_bdf)
ktap_print_msg "nvme0=$nvme0 nvme1=$nvme1 gpu=$gpu"
[ -n "$nvme0" ] && [ -n "$nvme1" ] && [ -n "$gpu" ] || ktap_exit_fail_msg "the rig's devices are missing"

ktap_print_header
ktap_set_plan 10

cmb=/sys/bus/pci/devices/$nvme0/p2pmem
_test "the CMB of $nvme0 is P2P memory of ${GDIRECT_NVME0_CMB_MB} MiB" \
	_expect_eq "p2pmem size" $((GDIRECT_NVME0_CMB_MB << 20)) "$(cat "$cmb/size" 2>/dev/null)"
_test "the CMB is published for other drivers" _expect_eq published 1 "$(cat "$cmb/published" 2>/dev/null)"
_test "the kernel logged the CMB's registration" \
	sh -c "cat '${GDIRECT_BOOT_LOG:-/dev/null}' | grep -q '$nvme0: added peer-to-peer DMA memory'"
_test "the NVMe on the other root port has no P2P memory" test ! -e "/sys/bus/pci/devices/$nvme1/p2pmem"

_test "the emulated GPU's BAR2 is ${GDIRECT_GPU_BAR_MB} MiB" \
	_expect_eq "BAR2 size" $((GDIRECT_GPU_BAR_MB << 20)) "$(_pci_bar_size "$gpu" 2)"
same_switch() {
	up=$(_pci_parent "$(_pci_parent "$nvme0")")
	_expect_eq "upstream port above the GPU" "$up" "$(_pci_parent "$(_pci_parent "$gpu")")" &&
		[ "$(_pci_parent "$nvme0")" != "$(_pci_parent "$gpu")" ]
}
_test "the GPU memory and the CMB NVMe sit under one switch" same_switch
other_port() { [ "$(_pci_parent "$nvme1")" != "$(_pci_parent "$(_pci_parent "$(_pci_parent "$gpu")")")" ]; }
_test "the second NVMe is on another root port" other_port

bar=/sys/bus/pci/devices/$gpu/resource2
_test "a token the host wrote into /dev/shm reads back through BAR2" \
	_expect_eq "token sha256" "$GDIRECT_GPU_TOKEN_SHA256" "$(gdirect-mmap "$bar" 0 4096 sha256)"
# 64 KiB at 1 MiB into the BAR; the host compares its /dev/shm file after the run.
sum=$(gdirect-mmap "$bar" 0x100000 0x10000 fill 42)
_test "bytes written through BAR2 read back" _expect_eq sha256 "$sum" "$(gdirect-mmap "$bar" 0x100000 0x10000 sha256)"
_test "and are in the host's /dev/shm file (host check)" _host_sha256 "gpu:$((1 << 20))" 65536 "$sum"

ktap_finished
