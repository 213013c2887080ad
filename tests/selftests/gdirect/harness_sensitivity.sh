#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The harness's own checks can fail: each kind of check the selftests rely on is
# made once where it must pass (a control) and then on purpose where it must not,
# and the wrong case must be reported as a failure:
#   - a host COMPARE of GPU memory no read wrote (the BAR filled by the CPU),
#   - a 4 KiB read compared over 8 KiB (the next 4 KiB hold a known pattern),
#   - one byte flipped in the BAR after a read,
#   - a read compared with the drive at the wrong offset,
#   - a wrong sha256, and `gdirect read --verify` against the wrong drive,
#   - the DMA path proof (QEMU's trace on the host) for a read that bounced,
#   - pages pinned by another than the module (an O_DIRECT read in flight), which the
#     kernel's count that every "nothing stays pinned" check reads sees and the module's
#     counters cannot,
#   - and a KTAP script whose one check fails exits nonzero with "not ok".

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-mmap jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
other=$(_nvme_ns_by_serial "$GDIRECT_NVME1_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME1_SERIAL"
gpu=$(_gpu_bdf)
[ -n "$gpu" ] || ktap_exit_fail_msg "no emulated GPU"
bar=/sys/bus/pci/devices/$gpu/resource2
M=1048576
K=1024

# A check that must fail: succeeds when the command fails.
not() { ! "$@"; }

ktap_print_header
ktap_set_plan 17

# 1. No read: the first MiB of the BAR filled by the CPU with a pattern, compared with the drive.
_test "the CPU fills the first MiB of the BAR with a known pattern" gdirect-mmap "$bar" 0 $M fill 12345
_test "a host COMPARE of GPU memory no read wrote is reported FAIL" not _host_compare gpu:0 nvme0:0 $((64 * K))

# 2. A 4 KiB read compared over 8 KiB (both inside its first 64 KiB page, whose BAR offset the
# report gives: the emulated GPU's first run of pages).
_test "control: a 4 KiB read at 200 KiB past 97 MiB lands in GPU memory" \
	_gd_read "$dev" --mem egpu --offset $((97 * M + 200 * K)) --len 4K
at=$(($(_rj '.memory.bar_runs[0]' | cut -d+ -f1)))
_test "control: its 4 KiB compare equal on the host" _host_compare "gpu:$at" nvme0:$((97 * M + 200 * K)) 4096
_test "the same read compared over 8 KiB is reported FAIL" not _host_compare "gpu:$at" nvme0:$((97 * M + 200 * K)) 8192

# 3. One byte flipped in the BAR after the read.
_test "the CPU flips one byte of what was read" gdirect-mmap "$bar" "$at" 4096 flip 1000
_test "the compare with one flipped byte is reported FAIL" not _host_compare "gpu:$at" nvme0:$((97 * M + 200 * K)) 4096

# 4. The right bytes compared at the wrong offset of the drive.
read_98m() { _gd_read "$dev" --mem egpu --offset 98M --len 64K && _host_compare "gva:$(_rj .memory.address)" nvme0:$((98 * M)) 65536; }
_test "control: a 64 KiB read at 98 MiB compares equal" read_98m
_test "compared 4 KiB off in the drive, it is reported FAIL" \
	not _host_compare "gva:$(_rj .memory.address)" nvme0:$((98 * M + 4096)) 65536

# 5. A wrong sha256, and --verify against a reference that differs.
_test "a host SHA256 check with a wrong digest is reported FAIL" \
	not _host_sha256 "gva:$(_rj .memory.address)" 65536 "$(printf '%064d' 0)"
_test "control: gdirect read --verify against its own drive exits 0" \
	_expect_eq "exit status" 0 "$(gdirect read "$dev" --mem egpu --offset 32M --len 64K --verify >/dev/null 2>&1; echo $?)"
_test "gdirect read --verify against the other drive exits 3 (a mismatch)" \
	_expect_eq "exit status" 3 "$(gdirect read "$dev" --mem egpu --offset 32M --len 64K --verify "$other" >/dev/null 2>&1; echo $?)"
_test "--verify against a reference that ends before the bytes read exits 3 too" \
	_expect_eq "exit status" 3 "$(gdirect read "$dev" --mem egpu --offset 98M --len 64K --verify "$other" >/dev/null 2>&1; echo $?)"

# 6. The DMA path proof: a read that bounced does not pass for P2P.
_dma_mark || ktap_exit_fail_msg "no DMA trace from the host"
_gd_read "$dev" --mem egpu --offset 99M --len 1M --force-bounce >/dev/null
_dma_since || ktap_exit_fail_msg "no DMA trace from the host"
_test "a bounced read fails the P2P proof (all into the BAR, none into RAM)" \
	not _expect_eq "bar ram" "$M 0" "$DMA_BAR_READ $DMA_RAM_READ"

# 7. Pins outside the module: dd's O_DIRECT read of the namespace QEMU throttles to 32 MB/s
# (64 MiB: 2 s) pins its 16 MiB buffer while each read is in flight.
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4"
dd if="$slow" of=/dev/null bs=16M iflag=direct 2>/dev/null &
ddpid=$!
sleep 0.5
pins=$(_kernel_pins) mod="$(_info .counters.registrations) $(_info .counters.pinned_bytes)"
ktap_print_msg "while dd reads: kernel pins $pins, module registrations and pinned bytes $mod"
outside() { [ "$pins" -gt 0 ] && [ "$mod" = "0 0" ]; }
_test "an O_DIRECT read in flight: the kernel counts its pinned pages, the module's counters 0" outside
wait "$ddpid"
_test "control: once it ends nothing is pinned by any account" _expect_unpinned

# 8. KTAP plumbing: one failing check fails the script.
cat >/tmp/ktap-fails.sh <<'EOF'
. "$GDIRECT_LIB/gdirect_common.sh"
ktap_print_header
ktap_set_plan 2
_test "passes" true
_test "fails on purpose" false
ktap_finished
EOF
ktap_fails() {
	out=$(sh /tmp/ktap-fails.sh 2>&1)
	rc=$?
	echo "$out" | grep -q '^not ok 2 fails on purpose' && [ $rc -ne 0 ] && [ $rc -ne 4 ]
}
_test "a KTAP script with one failed check exits nonzero and says 'not ok'" ktap_fails
rm -f /tmp/ktap-fails.sh

ktap_finished
