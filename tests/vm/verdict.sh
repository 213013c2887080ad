# SPDX-License-Identifier: GPL-2.0
# shellcheck shell=bash
#
# The host's verdict on one run of the rig, from the guest's console log: sourced by
# scripts/vm; tests/vm/verdict_test.sh plants each failure in a log and shows it judged so.
#
# judge_console LOG NTESTS QEMU_RC TIMEOUT SKIPS_ALLOWED BAD_OUT
#   LOG            the console log, carriage returns removed
#   NTESTS         how many tests the guest was given
#   QEMU_RC        QEMU's exit status under timeout(1): 124 or 137 when killed at TIMEOUT
#   TIMEOUT        that limit, in seconds (for the message)
#   SKIPS_ALLOWED  the allow-list: NAME REASON lines
#   BAD_OUT        receives the kernel reports, one "TEST: line" each ("(boot)" before the first)
# Sets passed, failed, skipped and problems (an array of sentences); prints
# "vm: allowed skip: NAME: REASON" for each allowed skip. The run is good when problems is
# empty and failed is 0.
#
# What fails a run: a test's "not ok" line (the guest's runner writes it for a nonzero exit,
# a timeout and anything left behind); a test with no result line; a guest that did not reach
# its end marker; a kernel report (tests/vm/kernel-reports.re) in the log, which also fails
# the test it came in; a skip that the allow-list does not name.
judge_console() {
	local log=$1 ntests=$2 qemu_rc=$3 limit=$4 allowed=$5 bad_out=$6
	local reported t reason bad_re
	passed=$(grep -cE '^ok [0-9]+ selftests: ' "$log" || true)
	skipped=$(grep -cE '^ok [0-9]+ selftests: .* # SKIP' "$log" || true)
	failed=$(grep -cE '^not ok [0-9]+ selftests: ' "$log" || true)
	passed=$((passed - skipped))
	problems=()
	if ! grep -q '^GDIRECT-VM-END' "$log"; then
		if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
			problems+=("the VM did not finish within ${limit}s")
		else
			problems+=("the VM stopped before the end of the run (qemu exit $qemu_rc)")
		fi
	fi
	# Every test must have reported: a missing result is a failure.
	reported=$((passed + skipped + failed))
	if [ "$reported" -lt "$ntests" ]; then
		problems+=("$((ntests - reported)) test(s) reported no result")
		failed=$((failed + ntests - reported))
	fi
	# The guest prints its full dmesg between markers at the end; the console holds anything
	# printed after a crash. Scan both. Each test's kernel log is printed ("dmesg: ...")
	# after it: a report names the test, which fails whatever it printed.
	bad_re=$(cat "$(dirname "${BASH_SOURCE[0]}")/kernel-reports.re")
	awk -v re="$bad_re" '/^# selftests: gdirect: / { t = $4; next } /^#/ { next } $0 ~ re { print (t == "" ? "(boot)" : t) ": " $0 }' \
		"$log" >"$bad_out"
	if [ -s "$bad_out" ]; then
		problems+=("kernel reports in the guest log:"$'\n'"$(head -n 20 "$bad_out")")
		for t in $(cut -d: -f1 "$bad_out" | sort -u); do
			if grep -qE "^ok [0-9]+ selftests: gdirect: $t\$" "$log"; then
				passed=$((passed - 1))
				failed=$((failed + 1))
			fi
		done
	fi
	# A skip passes only when the allow-list names the test.
	while read -r t; do
		reason=$(sed -n "s/^$t[[:space:]]\{1,\}//p" "$allowed" 2>/dev/null)
		if [ -n "$reason" ]; then
			echo "vm: allowed skip: $t: $reason"
		else
			problems+=("$t was skipped, and skips-allowed does not list it")
			skipped=$((skipped - 1))
			failed=$((failed + 1))
		fi
	done < <(sed -nE 's/^ok [0-9]+ selftests: gdirect: ([^ ]+) # SKIP.*/\1/p' "$log")
}
