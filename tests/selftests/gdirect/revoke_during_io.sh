#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# GPU memory freed (cudaFree) while 128 batched reads into it are in flight
# (from the namespace QEMU throttles to 32 MB/s, so the free always meets them):
# each read either completes in full or fails with EKEYREVOKED, the free returns
# only when no read can touch the memory any more - its bytes do not change
# after it returns - later uses fail with EKEYREVOKED, and nothing stays pinned.
# Twice: reads peer to peer, then every read forced through the bounce path, where
# the module's CPU copy into GPU memory is what the free must wait for.
# Then the copies themselves: on the unthrottled namespace a 1 MiB read takes
# about as long as its copy, so with 4 threads of forced-bounce reads a free
# often lands inside a copy; 30 rounds, and no byte of the freed (poisoned)
# memory may change after the free returned.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
n0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"
fast=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 22

# One run of the scenario: $1 names it, the rest are gdirect-io revoke's extra arguments.
scenario() {
	name=$1
	shift
	_frees_mark || ktap_print_msg "$name: no mark of QEMU's trace"
	out=$(gdirect-io revoke "$n0" 128 "$@")
	rc=$?
	_frees_since
	ktap_print_msg "$name: $(echo "$out" | tr '\n' ' ')"
	first=$(echo "$out" | head -n 1)
	echo "GDIRECT-FIGURE revoke_during_io mode=$name in_flight_at_free=$(_kv "$out" in_flight_at_free) $(echo "$first" | cut -d' ' -f1-4)"
	_test "$name: the scenario ran" _expect_eq "exit status" 0 "$rc"
	_test "$name: every read completed in full or failed with EKEYREVOKED" _expect_eq "other outcomes" 0 "$(_kv "$first" other)"
	_test "$name: all 128 were accounted for" _expect_eq total 128 "$(( $(_kv "$first" completed_ok) + $(_kv "$first" revoked) ))"
	# Raced, as QEMU saw it (the module's in_flight_at_free above is only printed): the free
	# began while the NVMe had reads outstanding - into the freed pages themselves (p2p), or
	# into host memory (bounce: no read moves data into the BAR). (The tool frees once more
	# after the race, the memory of its later use.)
	if [ "$name" = p2p ]; then
		raced() { [ "${FREES:-0}" -ge 1 ] && _expect_eq "frees begun under DMA into their pages" 1 "$FREES_DURING_BAR_DMA"; }
	else
		raced() { [ "${FREES:-0}" -ge 1 ] && _expect_eq "frees begun under DMA, NVMe commands with data in the BAR" "1 0" "$FREES_DURING_DMA $BAR_COMMANDS"; }
	fi
	_test "$name: the free began while the NVMe's reads were outstanding (QEMU's trace)" raced
	_test "$name: the reads that completed before the free (up to 8 checked) hold the drive's bytes (poisoned before)" \
		_expect_eq mismatches 0 "$(_kv "$out" data_mismatches)"
	_test "$name: the free poisoned the memory and no byte of it changed after the free returned" \
		_expect_eq unchanged true "$(_kv "$out" unchanged_after_revocation)"
	_test "$name: a later use fails with EKEYREVOKED" _expect_eq use EKEYREVOKED "$(_kv "$out" use_after)"
	_test "$name: nothing stays registered or pinned" \
		_expect_eq counters "0 0" "$(_kv "$out" registrations) $(_kv "$out" pinned_bytes)"
}
scenario p2p
_test "p2p: the completed reads went peer to peer" _expect_eq bounced 0 "$(_kv "$first" bounced)"
scenario bounce bounce
_test "bounce: every completed read was bounced" \
	_expect_eq bounced "$(_kv "$first" completed_ok)" "$(_kv "$first" bounced)"

# The copies: 30 rounds at a time, up to three times until QEMU's trace shows a free beginning
# under the NVMe's reads (the evidence that the frees race the I/O; the debug kernel's reads end
# sooner against its slower copies, and one run of 30 rounds there has shown none). Every run's
# rounds are judged: each read whole or EKEYREVOKED, no byte changed after a free returned.
runs=0 rc_all=0 dirty_all=0 frees_all=0 frees_dma=0 traced=true revoked_first=
while [ $runs -lt 3 ]; do
	runs=$((runs + 1))
	_frees_mark || ktap_print_msg "copies: no mark of QEMU's trace"
	out=$(gdirect-io revoke-copies "$fast" 4 30 2>&1)
	rc=$?
	_frees_since
	echo "GDIRECT-FIGURE revoke_during_io mode=copies frees=$FREES frees_during_dma=$FREES_DURING_DMA revoked=$(_kv "$out" revoked)"
	ktap_print_msg "copies, run $runs: $(echo "$out" | tr '\n' ' ')"
	[ $rc -eq 0 ] || rc_all=$rc
	d=$(_kv "$out" dirty_rounds)
	case $d in '' | *[!0-9]*) d=1 ;; esac # no count: judged as changed
	dirty_all=$((dirty_all + d))
	[ -n "$revoked_first" ] || revoked_first=$(_kv "$out" revoked)
	[ "${FREES:-0}" -eq 30 ] || traced=false
	frees_all=$((frees_all + ${FREES:-0}))
	frees_dma=$((frees_dma + ${FREES_DURING_DMA:-0}))
	[ $rc -eq 0 ] && [ $frees_dma -ge 1 ] && break
	[ $rc -eq 0 ] || break
done
ktap_print_msg "copies: $runs run(s) of 30 rounds, $frees_dma of $frees_all frees under the NVMe's reads"
_test "copies: every read whole or EKEYREVOKED" _expect_eq "exit status" 0 "$rc_all"
_test "copies: no byte of the freed memory changed after a free returned" \
	_expect_eq dirty_rounds 0 "$dirty_all"
_test "copies: the frees met running reads (EKEYREVOKED)" sh -c "[ '${revoked_first:-0}' -ge 15 ]"
# QEMU cannot see a CPU copy; it sees the reads before it: at least one free began while the NVMe
# had reads (into host memory) outstanding (9 of 30 measured on the test kernel; 0 to 6 of 30 on
# the debug kernel, hence up to three runs).
_test "copies: every free traced, at least one under the NVMe's reads (QEMU's trace)" \
	sh -c "$traced && [ $frees_all -eq $((runs * 30)) ] && [ $frees_dma -ge 1 ]"

ktap_finished
