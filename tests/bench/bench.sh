#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The guest half of scripts/bench: 4 KiB random and 1 MiB sequential reads from
# the NVMe under the GPU's switch - gdirect P2P into (emulated) GPU memory,
# gdirect forced through the bounce pool, and plain O_DIRECT pread into host
# memory - at queue depth 1 and 32. Lines starting "bench:" are the results.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT
_load_all || { echo "cannot load the modules"; exit 1; }
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || exit 1

for pattern in rand4k seq1m; do
	case $pattern in
	rand4k) ops=${BENCH_RAND_OPS:-4000} ;;
	seq1m) ops=${BENCH_SEQ_OPS:-512} ;;
	esac
	for qd in 1 32; do
		for mode in p2p bounce pread; do
			echo "bench: $(gdirect-iobench "$dev" $mode $pattern $ops $qd)" || exit 1
		done
	done
done
