#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# An NVMe that falls off the bus during reads: the host asks QEMU's monitor to delete the
# controller under the switch (device_del) and its slot's power is cut while a 48 MiB P2P read
# into GPU memory and an 8 MiB read forced through the bounce buffers, from the namespace QEMU
# throttles (slowed to 8 MB/s for the test, so that both stay in flight however long each
# command takes to start), are outstanding: the kernel, not the module, shows both processes
# inside their GDIRECT_IOC_READ, and the block layer's in-flight count the drive holding reads
# when the slot goes dark. (QEMU 7.2 completes a device_del only through the guest's hot-plug
# driver, which the rig's kernel does not have; with its slot unpowered the controller answers
# nothing: its registers read all ones, and its DMA and interrupts go nowhere.) No driver is
# told: the kernel sees a device go dark, not an orderly remove. The drive's commands time out
# (the namespace's timeout set to 3 s), the NVMe driver finds the controller reading all ones
# and takes it down, and each read fails with EIO or ENODEV without hanging, claiming no byte.
# Nothing stays registered, pinned by the kernel's count or held by the GPU. The device's
# removal from the kernel (what a hot-plug driver does next) runs without a report; powered
# again and rescanned, the controller returns with its namespaces, and a P2P read from it into
# GPU memory is exact (host check).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

bdf= port=
_nvme_answers() { [ "$(od -An -tx2 -N2 "/sys/bus/pci/devices/$bdf/config" 2>/dev/null | tr -d ' ')" = 1b36 ]; }
cleanup() {
	_throttle_ns4 "$GDIRECT_NVME0_NS4_BPS"
	[ -n "${_BG_PID:-}" ] && kill -9 "$_BG_PID" 2>/dev/null
	[ -n "${bounced:-}" ] && kill -9 "$bounced" 2>/dev/null
	wait 2>/dev/null
	# The rig's NVMe back for the tests after this one.
	[ -n "$port" ] && [ -e "$_GDIRECT_SLOT_OFF.$port" ] && _slot_back "$port" >/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-io jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
bdf=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
port=$(_pci_parent "$bdf")
_nvme_answers || ktap_exit_fail_msg "$bdf is not the rig's NVMe"
queue=/sys/block/$(basename "$slow")
M=1048576

ktap_print_header
ktap_set_plan 11

# The block layer's count of the namespace's reads that the drive holds (issued, not ended).
_drive_reads() { read -r r _ <"$queue/inflight" && echo "$r"; }
# Whether process $1 is inside GDIRECT_IOC_READ, as the kernel shows its system call
# (ioctl, 16 on x86-64, and the command's type and number, 0xD6 and 0x04).
_in_read_ioctl() {
	read -r nr _ cmd _ <"/proc/$1/syscall" 2>/dev/null && [ "$nr" = 16 ] &&
		[ $((cmd & 0xffff)) -eq $((0xd604)) ]
}
_test "the throttled namespace slowed to 8 MB/s (QEMU's monitor)" _throttle_ns4 8388608
echo 3000 >"$queue/queue/io_timeout"
# Process $1 seen inside its GDIRECT_IOC_READ within $2 seconds (at an instant when it is on a
# CPU, its system call reads "running": it is looked at again). One ioctl reads all its bytes,
# so a process seen in it after it was first seen there is still in the same read.
_wait_in_read() {
	deadline=$(($(date +%s) + $2))
	until _in_read_ioctl "$1"; do
		[ "$(date +%s)" -ge "$deadline" ] && return 1
		sleep 0.02
	done
}
_bg_read_start "$slow" --mem egpu --offset 8M --len 48M --chunk 48M
_wait_in_read "$_BG_PID" 30
env -u GDIRECT_EGPU_KEEP gdirect read "$slow" --mem egpu --offset 56M --len 8M --chunk 8M \
	--force-bounce --json >/tmp/bounced.json 2>/tmp/bounced.err &
bounced=$!
_wait_in_read "$bounced" 30
both_in() { _wait_in_read "$_BG_PID" 3 && _wait_in_read "$bounced" 3; }
_test "both reads are in their GDIRECT_IOC_READ (the kernel's view of their system calls)" both_in
_test "device_del through QEMU's monitor, and the controller's slot powered off" _surprise_unplug nvme0 "$port"
dark() {
	n=$(_drive_reads)
	ktap_print_msg "reads the drive holds as its slot goes dark: $n"
	[ "$n" -gt 0 ] && _wait_in_read "$bounced" 3 &&
		_expect_eq "vendor id" ffff "$(od -An -tx2 -N2 "/sys/bus/pci/devices/$bdf/config" | tr -d ' ')"
}
_test "the drive went dark holding reads (the block layer's count) in both reads' ioctls, its config space reading all ones" dark

_bg_read_wait 60
failed() {
	_bg_read_failed_cleanly &&
		case "$(echo "$BG_JSON" | jq -r .error.errno)" in ENODEV | EIO) true ;; *) false ;; esac
}
_test "the in-flight P2P read failed with EIO or ENODEV, claiming no byte" failed
wait "$bounced"
brc=$?
bounced=
bjson=$(cat /tmp/bounced.json)
ktap_print_msg "the bounced read: exit $brc: $(echo "$bjson" | jq -c '{bytes,path,error:.error.errno}' 2>/dev/null) $(head -c 200 /tmp/bounced.err)"
bounce_failed() {
	[ "$brc" -ne 0 ] && [ "$(echo "$bjson" | jq -r .bytes)" = null ] &&
		case "$(echo "$bjson" | jq -r .error.errno)" in ENODEV | EIO) true ;; *) false ;; esac
}
_test "the in-flight bounced read failed with EIO or ENODEV, claiming no byte" bounce_failed
_test "within 60 s" sh -c "[ $BG_SECONDS -lt 60 ]"
echo "GDIRECT-FIGURE surprise_remove_nvme read_exit=$BG_RC seconds=$BG_SECONDS errno=$(echo "$BG_JSON" | jq -r .error.errno 2>/dev/null)"
# The kernel's count, while the disk is there (deleted, its queue was drained).
no_reads() {
	if [ -e "$queue/inflight" ]; then
		_expect_eq "reads in flight" 0 "$(_drive_reads)"
	else
		ktap_print_msg "the disk is deleted: its queue was drained"
	fi
}
_test "the block layer holds no read of the namespace" no_reads
_test "nothing stays registered, pinned by the kernel's count or held by the GPU" _expect_unpinned

# What a hot-plug driver does next: the device removed from the kernel (the run fails on any
# report of the NVMe driver's teardown of a dead controller).
_test "the device removed from the kernel" _pci_remove "$bdf"

back() {
	_slot_back "$port"
	i=0
	while [ $i -lt 100 ]; do
		ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") && [ -b "$ns" ] &&
			slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) && [ -b "$slow" ] && break
		sleep 0.2
		i=$((i + 1))
	done
	[ -b "${ns:-}" ] || return 1
	_gd_read "$ns" --mem egpu --offset 72M --len 8M &&
		_expect_eq "bytes path" "$((8 * M)) p2p" "$(_rj .bytes) $(_rj .path)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((72 * M)) $((8 * M))
}
_test "powered and rescanned: the controller and its namespaces are back, a P2P read from it exact (host check)" back

ktap_finished
