#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# runner_in_guest: the guest's own runner (tests/vm/init, with leftovers.sh) fails what it
# must, in a real boot of the rig: planted tests (tests/vm/planted/, never in the suite) that
# leave a process holding a registration (LEFTOVER, the process named) and that run past
# their limit (TIMEOUT, the process group killed); a test run after both finds the rig clean;
# and two that pass in the guest while the host's judge of QEMU's DMA trace fails the run: one
# that ignores a FAIL the host answered, one that makes fewer host-judged checks than it
# declares (planted/dma-expects); one that leaves the rig changed (the throttled namespace
# slowed, the first NVMe's slot powered off, a loop device bound: LEFTOVER, all named) and one
# after it that finds the rig restored; the run fails. Then the host's boot watchdog: a boot
# held past its limit is recorded and booted once more (the run passes), and a second one fails
# the run. The host's side of the verdict has its own test (verdict_test.sh).
# Prints "ok"/"not ok" per check, then "runner_in_guest: N passed, N failed".
set -uo pipefail
. "$(dirname "$0")/../../scripts/common.sh"
out=$(mktemp "${TMPDIR:-/tmp}/gdirect-runner.XXXXXX")
trap 'rm -f "$out"' EXIT
pass=0 fail=0
planted=$GDIRECT_ROOT/tests/vm/planted
GDIRECT_TEST_TIMEOUT=10 "$GDIRECT_ROOT/scripts/vm" \
	--run "$planted/leftover.sh" "$planted/overrun.sh" "$planted/after.sh" \
	"$planted/dma_lie.sh" "$planted/dma_short.sh" "$planted/rig_left.sh" "$planted/after_rig.sh" >"$out" 2>&1
rc=$?
# The console's lines end in CR. grep reads to the end (no -q): under pipefail, tr killed by
# SIGPIPE after an early match would make a found line count as missing (it did, once).
has() { tr -d '\r' <"$out" | grep -E "$1" >/dev/null; }
check() {
	local name=$1
	shift
	if "$@"; then
		echo "ok - $name"
		pass=$((pass + 1))
	else
		echo "not ok - $name"
		fail=$((fail + 1))
	fi
}
check "a test that exits 0 leaving a process with a registration: not ok, LEFTOVER" \
	has '^not ok 1 selftests: gdirect: leftover.sh # LEFTOVER \(exit=0\)$'
check "the leftover named: the process still running" \
	has '^# leftover.sh: leftover: processes still running: .*gdirect-reg pin host'
check "a test past its limit: not ok, TIMEOUT at the run's 10 s" \
	has '^not ok 2 selftests: gdirect: overrun.sh # TIMEOUT 10 seconds$'
check "the test after them finds the rig clean (no planted process, module unloaded, no pin)" \
	has '^ok 3 selftests: gdirect: after.sh$'
check "a false P2P proof the test ignores: ok in the guest, the host's FAIL fails the run" \
	eval 'has "^ok 4 selftests: gdirect: dma_lie.sh$" &&
		has "^vm: FAIL: host-judged DMA check failed: DMA-EXPECT [0-9]+ dma_lie.sh bar_read=1048576 ram_read=0 -> FAIL bar_read: expected 1048576, got 0; ram_read: expected 0, got 1048576;" &&
		has "^vm: FAIL: host-judged DMA check failed: DMA-EXPECT [0-9]+ dma_lie.sh ram_read<4096 -> FAIL ram_read: expected fewer than 4096, got 1048576;"'
check "fewer host-judged checks than declared: ok in the guest, the run fails" \
	eval 'has "^ok 5 selftests: gdirect: dma_short.sh$" &&
		has "^vm: FAIL: dma_short.sh made 1 host-judged DMA check\(s\), dma-expects declares 2$"'
check "a test that leaves a slot powered off, a namespace slowed and a loop device: not ok, LEFTOVER, all named" \
	eval 'has "^not ok 6 selftests: gdirect: rig_left.sh # LEFTOVER \(exit=0\)$" &&
		has "^# rig_left.sh: leftover: the slot of [0-9a-f:.]+ left powered off$" &&
		has "^# rig_left.sh: leftover: namespace 4 of gdirect-nvme0 left at 16777216 bytes/s$" &&
		has "^# rig_left.sh: leftover: loop devices: /dev/loop[0-9]+: /tmp/rig-left.img;$"'
check "the test after it finds the rig restored: the NVMe and its namespaces back, reads exact, no loop device" \
	has '^ok 7 selftests: gdirect: after_rig.sh$'
check "the run fails, and says so" \
	eval '[ $rc -ne 0 ] && has "^vm: 4 passed, 3 failed, 0 skipped$"'
[ $fail -eq 0 ] || sed 's/^/# /' "$out" | tail -n 60

# The host's boot watchdog (scripts/vm): a boot that has not begun the tests by its limit is a
# hang, recorded (each virtual CPU's RIP named from System.map) and booted once more. Planted
# with a first limit of 1 s, which no boot meets: the second boot (300 s) runs the test.
before=$fail
boot=$(mktemp "${TMPDIR:-/tmp}/gdirect-runner.XXXXXX")
trap 'rm -f "$out" "$boot"' EXIT
GDIRECT_BOOT_LIMIT=1,300 "$GDIRECT_ROOT/scripts/vm" --run "$planted/after.sh" >"$boot" 2>&1
rc=$?
bhas() { tr -d '\r' <"$boot" | grep -E "$1" >/dev/null; }
check "a boot past its limit: recorded as a hang, each CPU's instruction pointer placed" \
	eval 'bhas "^vm: the guest hung at boot \(boot 1\): no GDIRECT-VM-BEGIN on the console after 1s" &&
		bhas "^vm: the guest hung at boot \(boot 1\): sample [123]: CPU#0 [RE]IP [0-9a-f]+ CPL=[0-3] HLT=[01] [^ ]" &&
		bhas "^vm: the guest hung at boot \(boot 1\): sample 3: CPU#1 [RE]IP [0-9a-f]+ CPL=[0-3] HLT=[01] [^ ]"'
check "then booted once more, whose test runs and passes: the run passes" \
	eval '[ $rc -eq 0 ] && bhas "no test ran: booting the rig once more" &&
		! bhas "hung at boot \(boot 2\)" && bhas "^ok 1 selftests: gdirect: after.sh$" &&
		bhas "^vm: 1 passed, 0 failed, 0 skipped$"'
kept=$(sed -n 's/.*the full console log is kept: //p' "$boot" | tail -n 1)
check "the hang and that boot's console kept in the run's console log" \
	eval 'grep -qE "^# gdirect-vm-boot-hang boot 1: sample [123]: CPU#0 [RE]IP " "${kept:-/nonexistent}" &&
		grep -qE "^# gdirect-vm-hung-boot-1: " "${kept:-/nonexistent}"'
GDIRECT_BOOT_LIMIT=1 "$GDIRECT_ROOT/scripts/vm" --run "$planted/after.sh" >"$boot" 2>&1
rc=$?
check "two hangs: no test ran, the run fails, and says why" \
	eval '[ $rc -ne 0 ] && bhas "hung at boot \(boot 2\): sample [123]: CPU#0 [RE]IP " &&
		bhas "^vm: FAIL: the guest hung at boot twice, before any test ran" &&
		! bhas "^ok 1 selftests"'
[ $fail -eq "$before" ] || sed 's/^/# boot: /' "$boot" | tail -n 40
echo "runner_in_guest: $pass passed, $fail failed"
[ $fail -eq 0 ]
