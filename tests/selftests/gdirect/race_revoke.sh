#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Revocation racing I/O, close and other revocations: the GPU memory freed
# under 48 reads in flight (revoke_during_io's scenario) by 4 processes at
# once (48 MiB of the 256 MiB BAR each); every completion a full read or
# EKEYREVOKED, no byte changed after a free returned, nothing left pinned;
# then 500 frees racing queries and unregisters of the same registrations.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 5

dir=$(mktemp -d)
for p in 1 2 3 4; do
	gdirect-io revoke "$ns" 48 >"$dir/$p" 2>&1 &
	eval "pid$p=$!"
done
fails=0
for p in 1 2 3 4; do
	if ! eval "wait \$pid$p"; then
		fails=$((fails + 1))
		sed "s/^/process $p: /" "$dir/$p" | while read -r l; do ktap_print_msg "$l"; done
	fi
done
ktap_print_msg "$(cat "$dir"/[1-4] | grep submitted | tr '\n' ' ')"
_test "4 processes revoking under reads in flight: each finished" _expect_eq failed 0 "$fails"
unexpected() { ! grep -q 'other=[1-9]' "$dir"/[1-4]; }
_test "every completion a full read or EKEYREVOKED" unexpected
unchanged() { [ "$(grep -c 'unchanged_after_revocation=true' "$dir"/[1-4] | awk -F: '{s += $2} END {print s}')" = 4 ]; }
_test "no byte changed after any free returned" unchanged
rm -rf "$dir"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
out=$(gdirect-reg revoke-race 500 "$nvme0" 2>&1)
rc=$?
echo "$out" | grep -v '^rounds=\|^registrations=' | while read -r l; do ktap_print_msg "$l"; done
ktap_print_msg "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
_test "500 frees racing queries and unregisters" _expect_eq "exit status" 0 "$rc"
_test "nothing stays registered or pinned" \
	_expect_eq counters "0 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes)"

ktap_finished
