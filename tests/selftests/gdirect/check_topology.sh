#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# gdirect check on the rig: the emulated GPU and the NVMe under the same switch
# are PIX and direct by the kernel's verdict, the NVMe on the other root port
# PHB and refused; the text report and the JSON say the same; without the
# module the same relations come from sysfs alone, the module check blocks (with
# build, install and modprobe as its fix), module loading is a warning (the rig's kernel
# enforces signatures, as module_signature.sh checks) and the exit status is 1.
#
# The egpu's class is RAM (ivshmem), so it is a row because its driver
# publishes its BAR as P2P memory, as a real GPU would be by its class.
#
# In the IOMMU rig (scripts/vm --iommu) the IOMMU translates DMA, the kernel sets ACS redirect
# on the root ports and the CPU is a Zen. The GPU memory is function 0 of a root port and the
# second NVMe its function 1: PIX, but the port's ACS redirect sends their P2P through the host
# bridge; the first NVMe, below the switch, is PHB. The kernel routes both through the host
# bridge (DMA-mapped), possible; the iommu and acs checks warn, naming what they found.
# With an Intel CPU there (scripts/vm --iommu --intel-cpu) the kernel lets no P2P cross the
# host bridge: both pairs are refused, the shared root port's too, and no direct path is left.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect jq
nvme0_ctrl=$(_nvme_ctrl_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
nvme1_ctrl=$(_nvme_ctrl_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
gpu=$(_gpu_bdf)
[ -n "$gpu" ] || ktap_exit_fail_msg "no emulated GPU"

if [ "${GDIRECT_IOMMU:-0}" = 1 ] && [ "${GDIRECT_HOST_BRIDGE_P2P:-0}" = 1 ]; then
	near_sysfs="PHB null" near="PHB thru_host_bridge true" far_sysfs=PIX far="PIX thru_host_bridge true"
	iommu_acs="warning warning" row_near="PHB via-root" row_far="PIX via-root"
elif [ "${GDIRECT_IOMMU:-0}" = 1 ]; then
	near_sysfs="PHB null" near="PHB not_supported false" far_sysfs=PIX far="PIX not_supported false"
	iommu_acs="warning warning" row_near="PHB refused" row_far="PIX refused"
else
	near_sysfs="PIX bus_addr" near="PIX bus_addr true" far_sysfs=PHB far="PHB not_supported false"
	iommu_acs="ok ok" row_near="PIX direct" row_far="PHB refused"
fi

ktap_print_header
ktap_set_plan 17

# The emulated GPU's driver (it publishes the BAR as P2P memory), without gdirect:
# sysfs alone.
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
json=$(gdirect check --json)
rc=$?
pair() { echo "$json" | jq -r --arg m "$1" --arg s "$2" ".pairs[] | select(.memory == \$m and .storage == \$s) | $3"; }
check() { echo "$json" | jq -r --arg n "$1" '[.checks[] | select(.name == $n) | .verdict] | first'; }
_test "without the module: exit status 1" _expect_eq "exit status" 1 "$rc"
_test "without the module: the module check blocks" _expect_eq verdict blocking "$(check module)"
fix() { echo "$json" | jq -r --arg n "$1" '[.checks[] | select(.name == $n) | .fix] | first'; }
_test "without the module: module loading warns that signatures are enforced" \
	sh -c '[ "$0" = warning ] && echo "$1" | grep -q "module.sig_enforce=1"' "$(check module_loading)" \
	"$(echo "$json" | jq -r '[.checks[] | select(.name == "module_loading") | .evidence] | first')"
_test "without the module: the kernel's Rust support is found (no /boot/config here: kallsyms)" \
	_expect_eq verdict ok "$(check rust)"
load_fix() { fix module | grep -q 'then sudo modprobe gdirect'; }
_test "without the module: the module check's fix builds, installs and loads it" load_fix
_test "sysfs alone: GPU and $nvme0_ctrl are ${near_sysfs% *}, expected ${near_sysfs#* }" \
	_expect_eq "relation expected" "$near_sysfs" "$(pair "$gpu" "$nvme0_ctrl" '"\(.relation) \(.expected)"')"
_test "sysfs alone: GPU and $nvme1_ctrl are $far_sysfs" \
	_expect_eq relation "$far_sysfs" "$(pair "$gpu" "$nvme1_ctrl" .relation)"

_load_all || ktap_exit_fail_msg "cannot load the modules"
text=$(gdirect check)
rc=$?
ktap_print_msg "$(echo "$text" | sed -n '1,4p' | tr '\n' '|')"
json=$(gdirect check --json)
if [ "$near" = "PHB not_supported false" ]; then
	possible=false want_rc=1 want_end="Direct path: not possible on this node"
else
	possible=true want_rc=0 want_end="Direct path: possible for .*$gpu <- $nvme0_ctrl"
fi
_test "with the module: exit status $want_rc, the direct path is $([ $possible = true ] || echo "not ")possible" \
	_expect_eq "exit status" "$want_rc" "$rc"
_test "JSON: direct_possible $possible, module loaded" \
	_expect_eq "possible loaded" "$possible true" "$(echo "$json" | jq -r '"\(.direct_possible) \(.module_loaded)"')"
_test "the GPU is a P2P-memory row, its BAR published" \
	_expect_eq kind p2pmem "$(echo "$json" | jq -r --arg g "$gpu" '.memories[] | select(.name == $g) | .kind')"
_test "GPU / $nvme0_ctrl: $near (relation, the kernel's route, possible)" \
	_expect_eq "relation kernel possible" "$near" "$(pair "$gpu" "$nvme0_ctrl" '"\(.relation) \(.kernel) \(.possible)"')"
_test "GPU / $nvme1_ctrl: $far (relation, the kernel's route, possible)" \
	_expect_eq "relation kernel possible" "$far" "$(pair "$gpu" "$nvme1_ctrl" '"\(.relation) \(.kernel) \(.possible)"')"
_test "sysfs and the kernel agree on every pair" \
	_expect_eq disagreements 0 "$(echo "$json" | jq '[.pairs[] | select(.disagreement != null)] | length')"
module_ok() {
	echo "$json" | jq -e '.checks[] | select(.name == "module") | select(.verdict == "ok" and (.evidence | contains("nvidia")))' >/dev/null
}
_test "the module check is ok and names the nvidia provider" module_ok
_test "the iommu and acs checks: $iommu_acs" \
	_expect_eq "iommu acs" "$iommu_acs" "$(check iommu) $(check acs)"
row() { echo "$text" | grep "^  $gpu "; }
text_row() { row | grep -q "$row_near" && row | grep -q "$row_far"; }
_test "the text matrix row says $row_near and $row_far" text_row
text_end() { echo "$text" | tail -n 1 | grep -q "^$want_end"; }
_test "the text ends with the pairs the direct path works for, or with none" text_end

ktap_finished
