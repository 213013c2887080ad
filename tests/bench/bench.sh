#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The guest half of scripts/bench. Lines starting "bench:" are the results.
#  paths:   4 KiB random and 1 MiB sequential reads from the NVMe under the GPU's
#           switch - gdirect P2P into (emulated) GPU memory, gdirect forced
#           through the bounce pool, plain O_DIRECT pread into host memory - at
#           queue depth 1 and 32, in BENCH_ROUNDS rounds whose order of the modes
#           alternates (the emulated CPU's speed drifts during a run: a mode
#           always measured first or last would carry that drift).
#  fabrics: the same reads at queue depth 32 from the same namespace locally,
#           over NVMe-oF/RDMA (soft-RoCE on a veth), over RDMA through the
#           P2P-capable RNIC under the GPU's switch (rdma-near) and the one across
#           the host bridge (rdma-far), and over NVMe-oF/TCP, gdirect into GPU
#           memory (the path the module picks) and pread into host memory. Through
#           the RNICs, each line also gives the bytes the RNIC itself wrote into
#           P2PDMA pages and into RAM (its rdma statistic counters).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

cleanup() {
	_nvmeof_down
	_unload_all
}
trap cleanup EXIT
_load_all || { echo "cannot load the modules"; exit 1; }
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || exit 1
RAND=${BENCH_RAND_OPS:-4000}
SEQ=${BENCH_SEQ_OPS:-512}
ROUNDS=${BENCH_ROUNDS:-5}

for pattern in rand4k seq1m; do
	case $pattern in
	rand4k) ops=$RAND ;;
	seq1m) ops=$SEQ ;;
	esac
	for qd in 1 32; do
		round=1
		while [ $round -le "$ROUNDS" ]; do
			modes="p2p bounce pread"
			[ $((round % 2)) -eq 0 ] && modes="pread bounce p2p"
			for mode in $modes; do
				r=$(gdirect-iobench "$dev" $mode $pattern $ops $qd) || exit 1
				echo "bench: section=paths where=local round=$round $r"
			done
			round=$((round + 1))
		done
	done
done

for where in local rdma rdma-near rdma-far tcp; do
	target=$dev
	if [ "$where" != local ]; then
		nqn=$GDIRECT_NQN_PREFIX:bench-$where
		_nvmeof_target_up "$where" "$nqn" "$dev" && _nvmeof_connect "$where" "$nqn" -Q 128 || exit 1
		target=$NVMEOF_NS
	fi
	for pattern in rand4k seq1m; do
		case $pattern in
		rand4k) ops=$((RAND / 2)) ;;
		seq1m) ops=$((SEQ / 4)) ;;
		esac
		for mode in p2p pread; do
			case $where in
			rdma-near | rdma-far)
				link=rxe_${where#rdma-}
				p2p0=$(_rdma_counter "$link" p2pdma_write_bytes) ram0=$(_rdma_counter "$link" ram_write_bytes)
				r=$(gdirect-iobench "$target" $mode $pattern $ops 32) || exit 1
				r="$r rnic_p2p=$(($(_rdma_counter "$link" p2pdma_write_bytes) - p2p0))"
				r="$r rnic_ram=$(($(_rdma_counter "$link" ram_write_bytes) - ram0))"
				;;
			*) r=$(gdirect-iobench "$target" $mode $pattern $ops 32) || exit 1 ;;
			esac
			echo "bench: section=fabrics where=$where $r"
		done
	done
	[ "$where" != local ] && { _nvmeof_down || exit 1; }
done
