#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# runner_verdict: the host's verdict on a run of the rig (tests/vm/verdict.sh, as scripts/vm
# uses it) fails each run that must fail. Console logs are planted with: a WARNING, a BUG
# before the first test, a KASAN report in a test that printed ok, a skip the allow-list does
# not name, a test with no result line, a guest that never reached its end (killed at the
# limit, or stopped), and the guest runner's own failures (a leftover, a timeout, an exit
# status); a clean log and an allowed skip pass. On the host, in a second.
# Prints "ok"/"not ok" per check, then "runner_verdict: N passed, N failed".
set -uo pipefail
. "$(dirname "$0")/../../scripts/common.sh"
. "$GDIRECT_ROOT/tests/vm/verdict.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/gdirect-verdict.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
printf 'b.sh the rig lacks what b needs\n' >"$work/allowed"

# A console log of tests a.sh and b.sh: each line of $1 and $2 is the test's own output or
# result ("ok 1 selftests: gdirect: a.sh"), $3 is printed after the runs (before the end).
console() {
	{
		echo "dmesg: [    0.000000] Linux version 7.2"
		echo "${4:-}"
		echo "GDIRECT-VM-BEGIN"
		echo "TAP version 13"
		echo "1..2"
		echo "# selftests: gdirect: a.sh"
		printf '%s\n' "$1"
		echo "# a.sh took 1s"
		echo "# selftests: gdirect: b.sh"
		printf '%s\n' "$2"
		echo "# b.sh took 1s"
		echo "${3:-}"
		echo "GDIRECT-DMESG-BEGIN"
		echo "GDIRECT-DMESG-END"
		echo "GDIRECT-VM-END"
	} | grep -v '^$' >"$work/log"
}
# judge NTESTS QEMU_RC: the verdict on $work/log as "passed failed skipped problems".
judge() {
	judge_console "$work/log" "$1" "$2" 600 "$work/allowed" "$work/bad" >"$work/out"
	verdict="$passed $failed $skipped ${#problems[@]}"
	printf '%s\n' "${problems[@]}" >"$work/problems"
}
# expect NAME "PASSED FAILED SKIPPED PROBLEMS" [TEXT]: the verdict, and TEXT among the problems.
expect() {
	local ok=1
	[ "$verdict" = "$2" ] || ok=0
	[ -z "${3:-}" ] || grep -qF "$3" "$work/problems" || ok=0
	if [ $ok -eq 1 ]; then
		echo "ok - $1"
		pass=$((pass + 1))
	else
		echo "not ok - $1: verdict '$verdict', expected '$2'; problems: $(tr '\n' ' ' <"$work/problems")"
		fail=$((fail + 1))
	fi
}
A_OK="ok 1 selftests: gdirect: a.sh"
B_OK="ok 2 selftests: gdirect: b.sh"

console "$A_OK" "$B_OK"
judge 2 0
expect "a clean log passes" "2 0 0 0"

console "$A_OK"$'\n'"dmesg: [   12.000000] WARNING: CPU: 1 PID: 7 at kernel/x.c:1 f+0x1/0x2" "$B_OK"
judge 2 0
expect "a WARNING in a test's kernel log fails the run and that test" "1 1 0 1" "a.sh: dmesg: [   12.000000] WARNING"

console "$A_OK" "$B_OK" "" "dmesg: [    1.000000] BUG: unable to handle page fault"
judge 2 0
expect "a BUG during boot fails the run, named (boot)" "2 0 0 1" "(boot): dmesg: [    1.000000] BUG"

console "$A_OK" "dmesg: [   13.000000] BUG: KASAN: slab-use-after-free in f+0x1/0x2"$'\n'"$B_OK"
judge 2 0
expect "a KASAN report before the test's ok line fails it" "1 1 0 1" "b.sh: dmesg"

console "$A_OK" "" "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)"
judge 2 0
expect "kmemleak's end-of-run scan fails the run, and a test with no result line fails" "1 1 0 2" "1 test(s) reported no result"

console "$A_OK" "ok 2 selftests: gdirect: b.sh # SKIP"
judge 2 0
expect "a skip the allow-list names passes, with its reason" "1 0 1 0"
grep -qxF "vm: allowed skip: b.sh: the rig lacks what b needs" "$work/out" &&
	{ echo "ok - the allowed skip is printed with its reason"; pass=$((pass + 1)); } ||
	{ echo "not ok - the allowed skip is printed with its reason: $(cat "$work/out")"; fail=$((fail + 1)); }

console "ok 1 selftests: gdirect: a.sh # SKIP" "$B_OK"
judge 2 0
expect "a skip the allow-list does not name fails" "1 1 0 1" "a.sh was skipped, and skips-allowed does not list it"

console "not ok 1 selftests: gdirect: a.sh # LEFTOVER (exit=0)" "$B_OK"
judge 2 0
expect "the guest runner's leftover verdict fails the test" "1 1 0 0"

console "not ok 1 selftests: gdirect: a.sh # TIMEOUT 60 seconds" "$B_OK"
judge 2 0
expect "the guest runner's timeout verdict fails the test" "1 1 0 0"

console "not ok 1 selftests: gdirect: a.sh # exit=1" "$B_OK"
judge 2 0
expect "a test's nonzero exit fails it" "1 1 0 0"

console "$A_OK" "$B_OK"
sed -i '/^GDIRECT-VM-END/d' "$work/log"
judge 2 124
expect "a guest killed at the limit fails the run" "2 0 0 1" "the VM did not finish within 600s"
judge 2 1
expect "a guest that stopped before its end fails the run" "2 0 0 1" "the VM stopped before the end of the run (qemu exit 1)"

console "$A_OK" "$B_OK"
judge 3 0
expect "a test given to the guest with no result at all fails" "2 1 0 1" "1 test(s) reported no result"

echo "runner_verdict: $pass passed, $fail failed"
[ $fail -eq 0 ]
