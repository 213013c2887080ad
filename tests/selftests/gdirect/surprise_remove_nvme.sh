#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Surprise removal of the NVMe under the switch during I/O: a 48 MiB read into
# GPU memory (from the namespace QEMU throttles to 32 MB/s, so it stays in
# flight) is running when the controller is removed from the PCI bus
# (sysfs remove, as a hot-unplug does). The read ends - with every byte it
# claims, or with ENODEV or EIO - without hanging; nothing stays registered,
# pinned or in flight; after a rescan the controller returns and reads from it
# are exact again (host check).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

cleanup() {
	[ -n "${_BG_PID:-}" ] && kill -9 "$_BG_PID" 2>/dev/null
	[ -e "/sys/bus/pci/devices/$bdf" ] || echo 1 >/sys/bus/pci/rescan
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
bdf=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
M=1048576

ktap_print_header
ktap_set_plan 7

_bg_read_start "$slow" --mem egpu --offset 8M --len 48M --chunk 48M
_test "a read into GPU memory is in flight" _wait_active_transfer
_test "the controller is removed from the bus" sh -c "echo 1 >/sys/bus/pci/devices/$bdf/remove && [ ! -e /sys/bus/pci/devices/$bdf ]"
_bg_read_wait 120
ended() {
	if [ "$BG_RC" -eq 0 ]; then
		# It finished first: then every byte it claims is right.
		_expect_eq bytes $((48 * M)) "$(echo "$BG_JSON" | jq -r .bytes)" &&
			_host_compare "gva:$(echo "$BG_JSON" | jq -r .memory.address)" nvme0ns4:$((8 * M)) $((48 * M))
	else
		_bg_read_failed_cleanly &&
			case "$(echo "$BG_JSON" | jq -r .error.errno)" in ENODEV | EIO) true ;; *) false ;; esac
	fi
}
_test "the read ended in full, or failed with ENODEV or EIO (no partial claim)" ended
_test "within 120 s" sh -c "[ $BG_SECONDS -lt 120 ]"
echo "GDIRECT-FIGURE surprise_remove_nvme read_exit=$BG_RC seconds=$BG_SECONDS errno=$(echo "$BG_JSON" | jq -r .error.errno 2>/dev/null)"
_test "nothing stays registered, pinned or in flight" \
	_expect_eq "registrations pinned active" "0 0 0" \
	"$(_info .counters.registrations) $(_info .counters.pinned_bytes) $(sed -n 's/^active_transfers //p' /sys/kernel/debug/gdirect/counters)"
rescanned() {
	echo 1 >/sys/bus/pci/rescan
	i=0
	while [ $i -lt 100 ]; do
		ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") && [ -b "$ns" ] &&
			slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) && [ -b "$slow" ] && return 0
		sleep 0.2
		i=$((i + 1))
	done
	return 1
}
_test "after a rescan the controller and its namespace are back" rescanned
again() {
	_gd_read "$ns" --mem egpu --offset 72M --len 8M &&
		_expect_eq "bytes path" "$((8 * M)) p2p" "$(_rj .bytes) $(_rj .path)" &&
		_host_compare "gva:$(_rj .memory.address)" nvme0:$((72 * M)) $((8 * M))
}
_test "a read from it into GPU memory is peer to peer and exact again" again

ktap_finished
