#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The bound on a free's wait (README, "A free's wait"): a free of GPU memory
# (cudaFree) runs the module's callback under the GPU driver's lock, and the
# callback waits for the storage I/O running on the memory. That I/O is capped:
# max_in_flight_bytes per registration (default 64 MiB) and
# max_in_flight_bytes_per_user (default 256 MiB) for all of a user's transfers,
# its share of a drive's queue. So the wait is at most
#   (the capped bytes ahead of it on the drive) / (the drive's rate)
# plus the drive's own timeout when it stalls. On the namespace QEMU throttles
# to 32 MB/s, 64 MiB is 2 s.
#
# Each run: 32 threads read 4 MiB at a time (128 MiB asked for at once) into
# their parts of the memory; 0.3 s later the first registration's memory is
# freed. The wait is the emulated GPU's time for the callback (its lock held),
# measured outside the module. Every read is whole or EKEYREVOKED.
#  1. defaults, one registration: the wait is within 64 MiB / 32 MB/s;
#  2. max_in_flight_bytes doubled: the wait passes that bound (the check can
#     fail, and the cap is what holds it);
#  3. two registrations, max_in_flight_bytes_per_user=64 MiB: the free of one
#     waits behind the other's I/O on the same drive too, and the per-user cap
#     holds the sum to the same bound;
#  4. the per-user cap doubled: the bound is passed.
# The margin over the bound is MARGIN_MS: the throttle's granularity and the
# emulated machine's own time; the runs that must pass the bound pass it by
# more.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

MIB=$((1 << 20))
RATE=$((32 * MIB)) # bytes per second: the rig's throttle (scripts/vm, throttling.bps-total)
MARGIN_MS=750

ktap_print_header
ktap_set_plan 9

# run REGS PARAMS...: the module loaded with PARAMS, 32 threads of 4 MiB reads over REGS
# registrations, the first freed; prints the tool's output.
run() {
	regs=$1
	shift
	_unload_all
	insmod "$GDIRECT_MODULE" "$@" || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with $*"
	_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
	gdirect-io free-bound "$slow" 32 4 "$regs" 2>&1
	echo "exit=$?"
}

# bound_ms BYTES: how long the drive takes for BYTES.
bound_ms() {
	echo $(($1 * 1000 / RATE))
}

# within NAME OUT BOUND_MS: the run's callback took at most BOUND_MS plus the margin.
within() {
	ms=$(_kv "$2" callback_ms)
	[ -n "$ms" ] && [ "$ms" -le $(($3 + MARGIN_MS)) ] || {
		ktap_print_msg "$1: the free waited ${ms:-?} ms, bound $3 ms + $MARGIN_MS"
		return 1
	}
}

# past NAME OUT BOUND_MS: the run's callback took longer than BOUND_MS plus the margin.
past() {
	ms=$(_kv "$2" callback_ms)
	[ -n "$ms" ] && [ "$ms" -gt $(($3 + MARGIN_MS)) ] || {
		ktap_print_msg "$1: the free waited ${ms:-?} ms, not past $3 ms + $MARGIN_MS"
		return 1
	}
}

cap=$((64 * MIB))
bound=$(bound_ms $cap)

# case NAME LABEL CHECK REGS PARAM: one run with the module loaded with PARAM, its reads and
# its wait checked (CHECK: within or past the bound); sets wait_ms.
case_run() {
	out=$(run "$4" $5)
	ktap_print_msg "$2: $(echo "$out" | tr '\n' ' ')"
	_test "$2: every read whole or EKEYREVOKED" _expect_eq exit 0 "$(_kv "$out" exit)"
	case $3 in
	within) _test "$2: the free waits at most 64 MiB of I/O ($bound ms)" within "$1" "$out" "$bound" ;;
	past) _test "$2: the free waits past that bound" past "$1" "$out" "$bound" ;;
	esac
	wait_ms=$(_kv "$out" callback_ms)
}

case_run defaults "defaults" within 1 ""
default_ms=$wait_ms
case_run doubled "max_in_flight_bytes doubled" past 1 "max_in_flight_bytes=$((2 * cap))"
doubled_ms=$wait_ms
case_run per_user "two registrations, per-user cap 64 MiB" within 2 "max_in_flight_bytes_per_user=$cap"
user_ms=$wait_ms
case_run user_doubled "two registrations, per-user cap doubled" past 2 "max_in_flight_bytes_per_user=$((2 * cap))"
user_doubled_ms=$wait_ms

echo "GDIRECT-FIGURE free_latency_bound drive_mb_s=32 cap_mib=64 bound_ms=$bound margin_ms=$MARGIN_MS wait_ms=$default_ms cap_doubled_wait_ms=$doubled_ms per_user_wait_ms=$user_ms per_user_doubled_wait_ms=$user_doubled_ms"
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
