#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The same P2P-capable RNIC as nvmeof_rdma_p2p.sh, placed across the host bridge
# from the GPU memory (a virtio NIC on a root port of its own; the q35 host
# bridge is not on the kernel's P2PDMA allowlist): the namespace's queue takes
# P2PDMA pages, but this RNIC cannot reach the GPU's BAR. gdirect finds the RNIC
# behind the controller, applies the PCI distance rule to it as to a local
# drive, and bounces with the reason `distance`: exact bytes (host check),
# counted as through host memory, and the RNIC's own counters show the payload
# written into RAM, none into P2PDMA pages. Without that rule nvme-rdma's DMA
# mapping would fail the read (-EREMOTEIO) instead.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

_require_root
_require_cmd nvme ip rdma gdirect jq awk
_load_all || ktap_exit_fail_msg "cannot load the modules"
raw=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nqn=$GDIRECT_NQN_PREFIX:rnic-far
MiB=1048576

ktap_print_header
ktap_set_plan 9

_test "the RNIC across the host bridge is up: soft-RoCE rxe_far on its virtio NIC" _rnic_up far
rnic=$(_rnic_pci far)
gpu=$(_gpu_bdf)
ktap_print_msg "RNIC $rnic (below $(_pci_parent "$rnic")), GPU memory $gpu (below $(_pci_parent "$gpu"))"
apart() { [ -n "$rnic" ] && ! _pci_same_switch "$rnic" "$gpu" && dmesg | grep -q "rxe: .*: DMA through $rnic"; }
_test "it is on a root port of its own, and rxe DMA-maps through it" apart
up() { _nvmeof_target_up rdma-far "$nqn" "$raw" && _nvmeof_connect rdma-far "$nqn"; }
_test "the namespace exported and connected over RDMA through it" up

bounced=$(_stat bounce read bounce_bytes)
p2p_bytes=$(_rdma_counter rxe_far p2pdma_write_bytes)
ram_bytes=$(_rdma_counter rxe_far ram_write_bytes)
_test "6 MiB read into GPU memory" _gd_read "$NVMEOF_NS" --mem egpu --offset $((224 * MiB)) --len $((6 * MiB))
ktap_print_msg "why: $(_rj .why)"
_test "bounced for the PCI distance between the RNIC and the GPU memory, over rdma" \
	_expect_eq "bytes path reason transport bounce_bytes" "$((6 * MiB)) bounce distance rdma $((6 * MiB))" \
	"$(_rj .bytes) $(_rj .path) $(_rj .reason) $(_rj .transport) $(_rj .bounce_bytes)"
_test "the GPU memory holds the drive image's bytes (host check)" \
	_host_compare "gva:$(_rj .memory.address)" nvme0:$((224 * MiB)) $((6 * MiB))
counted() {
	_expect_eq bounced $((bounced + 6 * MiB)) "$(_stat bounce read bounce_bytes)" &&
		_expect_eq p2pdma_write_bytes "$p2p_bytes" "$(_rdma_counter rxe_far p2pdma_write_bytes)" &&
		_expect_ge ram_write_bytes $((ram_bytes + 6 * MiB)) "$(_rdma_counter rxe_far ram_write_bytes)"
}
_test "counted as bounced by gdirect; the RNIC wrote the 6 MiB into RAM, none into P2PDMA pages" counted
# The operator's view of the same: gdirect check pairs the GPU memory with each RDMA device's
# PCI function, as the module does.
checked() {
	_rnic_up near || return 1
	json=$(gdirect check --json)
	pair() { echo "$json" | jq -r --arg m "$gpu" --arg s "$1" '.pairs[] | select(.memory == $m and .storage == $s) | "\(.relation) \(.kernel) \(.possible)"'; }
	_expect_eq "GPU / rxe_near" "PIX bus_addr true" "$(pair rxe_near)" &&
		_expect_eq "GPU / rxe_far" "PHB not_supported false" "$(pair rxe_far)"
}
_test "gdirect check: the GPU memory and rxe_near PIX, possible; rxe_far PHB, refused" checked
_test "teardown leaves nothing behind" _nvmeof_down

ktap_finished
