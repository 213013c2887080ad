#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Processes with 32 batched 1 MiB reads in flight (from the namespace QEMU
# throttles to 32 MB/s), killed with SIGKILL once the drive holds their reads
# (their files closed under the batches; the frees of their GPU memory traced
# by QEMU against the NVMe's outstanding DMA), and others closing their file
# with revocations racing: no hang, no oops, nothing left pinned, the module
# unloads.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
# The namespace QEMU throttles to 32 MB/s: a batch stays in flight long enough to be killed.
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 7

killed=0 finished=0 failed=0
_frees_mark || ktap_print_msg "no mark of QEMU's trace"
for i in $(seq 1 20); do
	gdirect-io inflight "$slow" 32 >/tmp/race-close.out 2>&1 &
	pid=$!
	# Killed only once the drive holds reads of the batch (the block layer's count), and
	# then 0 to 0.3 s later.
	if _wait_disk_busy "$slow"; then
		sleep "0.$(($(od -An -N1 -tu1 /dev/urandom) % 4))"
		kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
	fi
	wait "$pid" 2>/dev/null
	rc=$?
	# A process that was not killed must have finished its batch cleanly.
	if [ $rc -ne 137 ]; then
		if [ $rc -eq 0 ]; then
			finished=$((finished + 1))
		else
			failed=$((failed + 1))
			ktap_print_msg "round $i: exit $rc: $(tail -n 3 /tmp/race-close.out | tr '\n' ' ')"
		fi
	fi
done
rm -f /tmp/race-close.out
_frees_since
ktap_print_msg "$killed of 20 processes killed with a batch in flight, $finished finished first, $failed failed"
echo "GDIRECT-FIGURE race_close frees=$FREES frees_during_dma_into_their_pages=$FREES_DURING_BAR_DMA killed_in_flight=$killed finished_first=$finished failed=$failed"
_test "processes were killed with a batch in flight" sh -c "[ $killed -gt 0 ]"
# As QEMU saw it: each kill frees the process's GPU memory (its fds closed), and in at least
# half of the killed rounds that free began while the NVMe's reads into those very pages were
# outstanding (a round whose module fd closed first frees no registered memory: no mark).
_test "at least half the kills freed memory under DMA into it (QEMU's trace)" \
	sh -c "[ $killed -gt 0 ] && [ $((2 * ${FREES_DURING_BAR_DMA:-0})) -ge $killed ]"
_test "every process that was not killed finished its batch cleanly" _expect_eq failed 0 "$failed"
_test "nothing stays registered or pinned after the kills" \
	_expect_unpinned
out=$(gdirect-io revclose 50 "$ns" 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "50 rounds of close racing a revocation under batched reads: no hang" _expect_eq "exit status" 0 "$rc"
_test "nothing stays registered or pinned after them" \
	_expect_unpinned
_test "the module unloads" sh -c 'rmmod gdirect && rmmod gdirect_egpu'

ktap_finished
