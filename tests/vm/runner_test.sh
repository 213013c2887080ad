#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# runner_in_guest: the guest's own runner (tests/vm/init, with leftovers.sh) fails what it
# must, in a real boot of the rig: planted tests (tests/vm/planted/, never in the suite) that
# leave a process holding a registration (LEFTOVER, the process named) and that run past
# their limit (TIMEOUT, the process group killed); a test run after both finds the rig clean;
# the run fails. The host's side of the verdict has its own test (verdict_test.sh).
# Prints "ok"/"not ok" per check, then "runner_in_guest: N passed, N failed".
set -uo pipefail
. "$(dirname "$0")/../../scripts/common.sh"
out=$(mktemp "${TMPDIR:-/tmp}/gdirect-runner.XXXXXX")
trap 'rm -f "$out"' EXIT
pass=0 fail=0
planted=$GDIRECT_ROOT/tests/vm/planted
GDIRECT_TEST_TIMEOUT=10 "$GDIRECT_ROOT/scripts/vm" \
	--run "$planted/leftover.sh" "$planted/overrun.sh" "$planted/after.sh" >"$out" 2>&1
rc=$?
# The console's lines end in CR.
has() { tr -d '\r' <"$out" | grep -qE "$1"; }
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
check "the run fails, and says so" \
	eval '[ $rc -ne 0 ] && has "^vm: 1 passed, 2 failed, 0 skipped$"'
[ $fail -eq 0 ] || sed 's/^/# /' "$out" | tail -n 60
echo "runner_in_guest: $pass passed, $fail failed"
[ $fail -eq 0 ]
