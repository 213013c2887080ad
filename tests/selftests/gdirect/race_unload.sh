#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# rmmod attempted in a loop while processes register memory and read into it:
# refused while any file of the device is open, safe when it succeeds between
# processes (a process that starts then cannot open the device, and says so);
# never an oops (scripts/vm checks the log). Afterwards nothing is pinned and
# the module unloads.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap 'kill $workers 2>/dev/null; wait 2>/dev/null; _unload_all' EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 7

stop=/tmp/race-unload.stop
rm -f "$stop"
runs=/tmp/race-unload.runs
: >"$runs"
workers=
# Two workers, each pausing 0.2 s between its runs, so that the device is
# sometimes closed by both while rmmod keeps trying: on the debug kernel three
# workers without pauses kept it open for all 300 attempts (the test then
# proved nothing about an unload under the workers, and failed).
for w in 1 2; do
	(
		i=0
		while [ ! -e "$stop" ]; do
			i=$((i + 1))
			# Each run: ok, refused (the device was gone: the module was unloaded), or
			# anything else - a failed data check among them - which fails the test.
			out=$(gdirect-io random 20 "$((w * 1000 + i))" "$ns" 2>&1)
			if [ $? -eq 0 ]; then
				echo ok
			elif echo "$out" | grep -q 'module is not loaded'; then
				echo refused
			else
				echo "other: $(echo "$out" | grep -m1 -E 'FAIL|rror' | head -c 200)"
			fi >>"$runs"
			sleep 0.2
		done
	) &
	workers="$workers $!"
done
refused=0 unloaded=0
: >/tmp/race-unload.rmmod
# At least 300 attempts; past them, go on until one unload succeeded, for at
# most 60 s in all.
deadline=$(($(date +%s) + 60))
i=0
while [ $i -lt 300 ] || { [ $unloaded -eq 0 ] && [ "$(date +%s)" -lt "$deadline" ]; }; do
	i=$((i + 1))
	if rmmod gdirect 2>>/tmp/race-unload.rmmod; then
		unloaded=$((unloaded + 1))
		insmod "$GDIRECT_MODULE" || break
	else
		refused=$((refused + 1))
	fi
done
touch "$stop"
wait $workers
workers=
# Why rmmod was refused: the errno's text, counted.
why=$(sed -n 's/.*: //p' /tmp/race-unload.rmmod | sort | uniq -c | tr -s ' ' | tr '\n' ';')
ktap_print_msg "rmmod: $refused refused ($why), $unloaded succeeded between processes; runs: $(grep -c '^ok' "$runs") ok, $(grep -c '^refused' "$runs") without a device, $(grep -c '^other' "$runs") other"
grep '^other' "$runs" | head -n 5 | while read -r l; do ktap_print_msg "$l"; done
echo "GDIRECT-FIGURE race_unload rmmod_refused=$refused rmmod_ok=$unloaded runs_ok=$(grep -c '^ok' "$runs") runs_without_device=$(grep -c '^refused' "$runs") runs_other=$(grep -c '^other' "$runs")"
_test "rmmod was refused while the device was in use, busy" \
	sh -c "[ $refused -gt 0 ] && ! grep -qv 'busy\|temporarily unavailable' /tmp/race-unload.rmmod"
_test "the module was unloaded between processes, under the workers" sh -c "[ $unloaded -gt 0 ]"
_test "the workers ran, every byte of every read exact" sh -c "[ $(grep -c '^ok' "$runs") -gt 0 ]"
_test "every failed run failed because the device was gone, none for another reason" \
	_expect_eq "other outcomes" 0 "$(grep -c '^other' "$runs")"
_test "the module is loaded at the end" _module_loaded
_test "nothing stays registered or pinned" \
	_expect_unpinned
_test "it unloads" sh -c 'rmmod gdirect'
rm -f "$stop" "$runs" /tmp/race-unload.rmmod

ktap_finished
