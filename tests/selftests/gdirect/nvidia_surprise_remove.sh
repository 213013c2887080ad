#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A GPU that falls off the bus: the host asks QEMU's monitor to delete the emulated GPU
# (device_del) and its slot's power is cut while a registration of its memory is held and a
# P2P read into its memory is in flight. (QEMU 7.2 completes a device_del only through the
# guest's hot-plug driver, which the rig's kernel does not have; with its slot unpowered the
# device answers nothing: its config space reads all ones and its BAR decodes nothing.) No
# driver is told: the kernel sees a device go dark, not an orderly remove. The in-flight read's
# DMA meets no BAR: its writes are dropped and the drive completes the command as if they
# landed (as posted writes to a removed device are on PCIe), so the module finds the GPU's
# config space reading all ones after the chunk and fails the read with ENODEV, without
# hanging, claiming no byte. The held registration stays, and the emulated GPU keeps its page
# table over the dead BAR, until the client lets go: then nothing stays registered, pinned by
# the kernel's count or held by the GPU. The device's removal from the kernel (what a hot-plug
# driver does next) unbinds the GPU driver from the dark device without a report. Powered
# again and rescanned, the GPU takes a P2P read into its memory, exact (host check).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

holder= port= gpu=
cleanup() {
	[ -n "$holder" ] && kill "$holder" 2>/dev/null
	[ -n "${_BG_PID:-}" ] && kill -9 "$_BG_PID" 2>/dev/null
	wait 2>/dev/null
	# The rig's GPU back for the tests after this one.
	[ -n "$port" ] && [ -e "$_GDIRECT_SLOT_OFF.$port" ] && _slot_back "$port" >/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-io gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
gpu=$(_gpu_bdf)
[ -n "$gpu" ] || ktap_exit_fail_msg "no emulated GPU"
port=$(_pci_parent "$gpu")
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
M=1048576

ktap_print_header
ktap_set_plan 10

gdirect-reg pin egpu $((4 * M)) hold >/tmp/surprise.hold 2>&1 &
holder=$!
i=0
while ! grep -q '^ready' /tmp/surprise.hold && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
_test "a holder registers 4 MiB of GPU memory" _expect_eq register OK "$(_kv "$(cat /tmp/surprise.hold)" register)"
# 48 MiB from the namespace QEMU throttles to 32 MB/s: about 1.5 s in flight.
_bg_read_start "$slow" --mem egpu --offset 8M --len 48M --chunk 48M
_test "a read into GPU memory is in flight: the drive holds reads" _wait_disk_busy "$slow"

_test "device_del through QEMU's monitor, and the GPU's slot powered off" _surprise_unplug gpu "$port"
gone() {
	[ -e "/sys/bus/pci/devices/$gpu/driver" ] &&
		_expect_eq "vendor id" ffff "$(od -An -tx2 -N2 "/sys/bus/pci/devices/$gpu/config" | tr -d ' ')"
}
_test "the kernel was not told: the device is still there, bound, its config space reads all ones" gone

_bg_read_wait 120
ktap_print_msg "the read: rc=$BG_RC after ${BG_SECONDS}s: $(echo "$BG_JSON" | jq -c '{bytes, error: .error.errno}' 2>/dev/null)"
failed() { _bg_read_failed_cleanly && _expect_eq errno ENODEV "$(echo "$BG_JSON" | jq -r .error.errno)"; }
_test "the in-flight read failed with ENODEV (its GPU is gone), claiming no byte" failed
_test "within 120 s" sh -c "[ $BG_SECONDS -lt 120 ]"
echo "GDIRECT-FIGURE nvidia_surprise_remove read_exit=$BG_RC seconds=$BG_SECONDS errno=$(echo "$BG_JSON" | jq -r .error.errno 2>/dev/null)"

_test "the holder's registration stays, its page table held over the dead BAR" \
	_expect_eq "registrations page_tables" "1 1" "$(_info .counters.registrations) $(_kv "$(_egpu_state)" mappings)"
kill "$(sed -n 's/^ready pid=//p' /tmp/surprise.hold)" "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
holder=
_test "the holder gone: nothing registered, pinned or held" _expect_unpinned

# What a hot-plug driver does next: the device removed from the kernel, its driver unbound
# (the run fails on any report of the GPU driver's teardown on a dead device).
_test "the device removed from the kernel, the GPU driver unbound from it" _pci_remove "$gpu"

back() {
	_slot_back "$port"
	i=0
	while [ -z "$(_gpu_bdf)" ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
	i=0
	while [ "$(_info .providers.nvidia)" != true ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
	_gd_read "$dev" --mem egpu --offset 40M --len 8M &&
		_expect_eq "bytes path" "$((8 * M)) p2p" "$(_rj .bytes) $(_rj .path)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((40 * M)) $((8 * M))
}
_test "powered and rescanned: a read into its memory is P2P and exact (host check)" back

ktap_finished
