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
# The namespace QEMU throttles to 32 MB/s: the frees always meet reads in flight.
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 7

dir=$(mktemp -d)
_frees_mark || ktap_print_msg "no mark of QEMU's trace"
for p in 1 2 3 4; do
	gdirect-io revoke "$slow" 48 >"$dir/$p" 2>&1 &
	eval "pid$p=$!"
done
fails=0
for p in 1 2 3 4; do
	if ! eval "wait \$pid$p"; then
		fails=$((fails + 1))
		sed "s/^/process $p: /" "$dir/$p" | while read -r l; do ktap_print_msg "$l"; done
	fi
done
_frees_since
ktap_print_msg "$(cat "$dir"/[1-4] | grep submitted | tr '\n' ' ')"
_test "4 processes revoking under reads in flight: each finished" _expect_eq failed 0 "$fails"
# Each process printed its tally (submitted=N ... other=N, N > 0): empty output passes nothing.
unexpected() {
	_expect_eq "processes that tallied their submissions" 4 "$(grep -l '^submitted=[1-9][0-9]* .* other=' "$dir"/[1-4] | wc -l)" &&
		! grep -q 'other=[1-9]' "$dir"/[1-4]
}
_test "every completion a full read or EKEYREVOKED" unexpected
unchanged() { [ "$(grep -c 'unchanged_after_revocation=true' "$dir"/[1-4] | awk -F: '{s += $2} END {print s}')" = 4 ]; }
_test "no byte changed after any free returned" unchanged
revoked=$(cat "$dir"/[1-4] | sed -n 's/.* revoked=\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
in_flight=$(cat "$dir"/[1-4] | sed -n 's/.*in_flight_at_free=\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
mism=$(cat "$dir"/[1-4] | sed -n 's/.*data_mismatches=\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
checked=$(cat "$dir"/[1-4] | sed -n 's/^data_checked=\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
echo "GDIRECT-FIGURE race_revoke frees=$FREES frees_during_dma_into_their_pages=$FREES_DURING_BAR_DMA transfers_in_flight_at_frees=$in_flight reads_revoked=$revoked reads_completed_checked=$checked mismatches=$mism"
# Raced, as QEMU saw it (the module's in_flight_at_free is only printed): of the 4 frees, at
# least half began while the NVMe had reads into the very pages they freed outstanding (a
# process whose reads all wait in the module's queue when it frees has none at the device; 3 or
# 4 of 4 do, as measured).
raced() {
	_expect_eq "frees traced" 4 "$FREES" &&
		sh -c "[ ${FREES_DURING_BAR_DMA:-0} -ge 2 ]"
}
_test "the frees began under DMA into their pages: at least 2 of 4 (QEMU's trace)" raced
# Each process reports its checked reads (none when every read was revoked before it ran, as
# happens): four reports, or the check has nothing to stand on.
checked_all() {
	_expect_eq "processes that reported their checked reads" 4 "$(grep -l '^data_checked=[0-9]* data_mismatches=[0-9]*' "$dir"/[1-4] | wc -l)" &&
		_expect_eq mismatches 0 "$mism"
}
_test "every read that completed holds the drive's bytes ($checked checked)" checked_all
rm -rf "$dir"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL")
out=$(gdirect-reg revoke-race 500 "$nvme0" 2>&1)
rc=$?
echo "$out" | grep -v '^rounds=\|^registrations=' | while read -r l; do ktap_print_msg "$l"; done
ktap_print_msg "$(echo "$out" | tail -n 2 | tr '\n' ' ')"
_test "500 frees racing queries and unregisters" _expect_eq "exit status" 0 "$rc"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
