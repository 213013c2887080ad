#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Block requests failed on purpose (fail_make_request) on the NVMe namespace,
# under random GPU-targeted reads, synchronous and batched, P2P and bounced:
# at 5% some reads fail, at 100% all do (at 5% the 400 reads, mostly of one request each,
# see about 20 failures: none at all has a chance of 0.95^400, about 1e-9; at 1% it was
# 0.99^400, about 2%, and it happened); every failure is an errno to the
# caller, never a partial success, every success is byte-exact; nothing stays
# pinned; once injection stops every read succeeds again.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

fi=/sys/kernel/debug/fail_make_request
cleanup() {
	[ -n "${disk:-}" ] && echo 0 >"/sys/block/$disk/make-it-fail" 2>/dev/null
	echo 0 >"$fi/probability" 2>/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect-io gdirect jq
[ -d "$fi" ] || ktap_exit_fail_msg "no $fi: the kernel lacks CONFIG_FAIL_MAKE_REQUEST or debugfs"
_load_all || ktap_exit_fail_msg "cannot load the modules"
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
disk=$(basename "$ns")
seed=${GDIRECT_FAULT_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
kv() { echo "$1" | sed -nE "s/(^|.* )$2=([^ ]*).*/\2/p" | head -n 1; }

ktap_print_header
ktap_set_plan 9

echo 0 >"$fi/verbose"
echo 1 >"$fi/interval"
echo -1 >"$fi/times"
echo 0 >"$fi/space"
echo 1 >"/sys/block/$disk/make-it-fail"

# The tool sets up (opens, reads the reference) first; the injection starts after, and ends
# with its reads.
gate=/tmp/fault-io-gate
faults() {
	rm -f "$gate.ready" "$gate.go"
	GDIRECT_GATE=$gate gdirect-io faults "$2" "$seed" "$ns" >/tmp/fault-io.out 2>&1 &
	pid=$!
	i=0
	while [ ! -e "$gate.ready" ] && [ $i -lt 300 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	echo "$1" >"$fi/probability"
	touch "$gate.go"
	wait $pid
	rc=$?
	# Off again before the next phase's tool opens the device and reads its reference.
	echo 0 >"$fi/probability"
	out=$(cat /tmp/fault-io.out)
	rm -f "$gate.ready" "$gate.go" /tmp/fault-io.out
}
faults 5 400
ktap_print_msg "5%: $(echo "$out" | tail -n 1) (seed $seed)"
echo "GDIRECT-FIGURE fault_io at=5% seed=$seed $(echo "$out" | tail -n 1)"
_test "at 5%: no partial success, no wrong byte" _expect_eq "exit status" 0 "$rc"
some() { [ "$(kv "$out" failed)" -gt 0 ] && [ "$(kv "$out" ok)" -gt 0 ]; }
_test "at 5%: some reads failed, the others delivered" some
only_eio() { kv "$out" errnos | grep -qE '^(EIO:[0-9]+)$'; }
_test "at 5%: every failure is EIO" only_eio

faults 100 60
ktap_print_msg "100%: $(echo "$out" | tail -n 1)"
echo "GDIRECT-FIGURE fault_io at=100% $(echo "$out" | tail -n 1)"
_test "at 100%: no partial success" _expect_eq "exit status" 0 "$rc"
_test "at 100%: every read fails" _expect_eq "ok failed" "0 60" "$(kv "$out" ok) $(kv "$out" failed)"
_test "nothing stays registered or pinned" \
	_expect_unpinned

echo 0 >"$fi/probability"
echo 0 >"/sys/block/$disk/make-it-fail"
out=$(gdirect-io faults 100 "$seed" "$ns")
rc=$?
ktap_print_msg "stopped: $(echo "$out" | tail -n 1)"
echo "GDIRECT-FIGURE fault_io at=off $(echo "$out" | tail -n 1)"
_test "injection stopped: every read succeeds again" _expect_eq "ok failed" "100 0" "$(kv "$out" ok) $(kv "$out" failed)"
_test "and is byte-exact" _expect_eq "exit status" 0 "$rc"
stats_err() { [ "$(gdirect stats --json | jq '[.io[] | .errors] | add')" -gt 0 ]; }
_test "the module counted the failed transfers as errors" stats_err

ktap_finished
