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
ktap_set_plan 5

stop=/tmp/race-unload.stop
rm -f "$stop"
runs=/tmp/race-unload.runs
: >"$runs"
workers=
for w in 1 2 3; do
	(
		i=0
		while [ ! -e "$stop" ]; do
			i=$((i + 1))
			if gdirect-io random 20 "$((w * 1000 + i))" "$ns" >/dev/null 2>&1; then
				echo ok >>"$runs"
			else
				echo refused >>"$runs"
			fi
		done
	) &
	workers="$workers $!"
done
refused=0 unloaded=0
for i in $(seq 1 300); do
	if rmmod gdirect 2>/dev/null; then
		unloaded=$((unloaded + 1))
		insmod "$GDIRECT_MODULE" || break
	else
		refused=$((refused + 1))
	fi
done
touch "$stop"
wait $workers
workers=
ktap_print_msg "rmmod: $refused refused, $unloaded succeeded between processes; runs: $(grep -c ok "$runs") ok, $(grep -c refused "$runs") without a device"
_test "rmmod was refused while the device was in use" sh -c "[ $refused -gt 0 ]"
_test "the workers ran" sh -c "[ $(grep -c ok "$runs") -gt 0 ]"
_test "the module is loaded at the end" _module_loaded
_test "nothing stays registered or pinned" \
	_expect_eq counters "0 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes)"
_test "it unloads" sh -c 'rmmod gdirect'
rm -f "$stop" "$runs"

ktap_finished
