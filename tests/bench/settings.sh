#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# The small-block reads of tests/bench/blocks.sh (16 Python threads, random blocks of a warm
# 1 GiB file into slots of a CuPy buffer, every slot verified) under settings of the engine
# other than the defaults, beside KvikIO's futures: which setting serves a KV cache's shape.
# Each variant is the environment of its blocks.py processes (the package reads it as
# `gdirect.configure` would set it):
#   default   nothing set
#   task512K  GDIRECT_TASK_SIZE=512K GDIRECT_STAGING_SIZE=2M (a request copied and sent in
#             four tasks, the copy of one beside the DMA of another)
#   task1M    GDIRECT_TASK_SIZE=1M GDIRECT_STAGING_SIZE=4M
#   mapped    GDIRECT_PAGE_CACHE=mapped GDIRECT_KEEP_MAPPED=2G (the file's page cache
#             registered with the driver, kept between reads: the GPU copies from it, no CPU
#             copy; it pins up to 2 GiB of page cache while kept)
#   threads8  GDIRECT_THREADS=8 (half the engine's threads)
#   queued    GDIRECT_INLINE_SIZE=0 (every File.pread handed to the package's I/O threads, none
#             run before pread returns: the futures as they were before the inline size)
# Writes OUT/settings.jsonl anew: a meta line, then one JSON object per measurement; exits 1
# if a measurement failed (a wrong slot, an error), recorded as failed.
#
# Usage: tests/bench/settings.sh [--blocks LIST] [--variants LIST] [--latency] [--out DIR]
#   --blocks LIST    block sizes (default "2M 256K")
#   --variants LIST  default "default task512K task1M mapped threads8"
#   --latency        also one thread's 4 KiB and 64 KiB reads: gdirect's and KvikIO's futures
#                    by default, and gdirect's under each of `mapped` and `queued` among the
#                    variants
#
# Needs: python3 with cupy, numpy, the gdirect package and KvikIO importable.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
blocks="2M 256K" variants="default task512K task1M mapped threads8" latency=0 out=${OUT:-$PWD/bench-out}
while [ $# -gt 0 ]; do
	case $1 in
	--blocks) blocks=$2; shift 2 ;;
	--variants) variants=$2; shift 2 ;;
	--latency) latency=1; shift ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '3,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "settings.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
env_of() {
	case $1 in
	default) echo ;;
	task512K) echo GDIRECT_TASK_SIZE=512K GDIRECT_STAGING_SIZE=2M ;;
	task1M) echo GDIRECT_TASK_SIZE=1M GDIRECT_STAGING_SIZE=4M ;;
	mapped) echo GDIRECT_PAGE_CACHE=mapped GDIRECT_KEEP_MAPPED=2G ;;
	threads8) echo GDIRECT_THREADS=8 ;;
	queued) echo GDIRECT_INLINE_SIZE=0 ;;
	*) echo "settings.sh: unknown variant $1" >&2; exit 2 ;;
	esac
}
for v in $variants; do env_of "$v" >/dev/null || exit 2; done
for b in $blocks; do
	numfmt --from=iec "$b" >/dev/null 2>&1 || { echo "settings.sh: bad block size $b (64K, 2M...)" >&2; exit 2; }
done
mkdir -p "$out"
results=$out/settings.jsonl
: >"$results"
file=/var/tmp/gdirect-blocks-1G.bin
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
versions=$(python3 -c 'import kvikio, kvikio.defaults, cupy, gdirect; print("gdirect", gdirect.__version__ + ", KvikIO", kvikio.__version__, "(gds_threshold", str(kvikio.defaults.get("gds_threshold")) + "), CuPy", cupy.__version__)') || exit 1
python3 - "$gpu" "$versions" "${GDIRECT_COMMIT:-unknown}" "tests/bench/settings.sh --blocks '$blocks' --variants '$variants'$([ "$latency" = 0 ] || echo ' --latency')" >>"$results" <<-'EOF2'
	import datetime, json, sys
	gpu, versions, commit, command = sys.argv[1:]
	print(json.dumps({"meta": {"command": command, "commit": commit, "gpu": gpu, "versions": versions,
	    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}))
	EOF2
[ -s "$file" ] || head -c 1G /dev/urandom >"$file"
cat "$file" >/dev/null

# One measurement: label, variant, then blocks.py's arguments. The caller's own GDIRECT_*
# settings are left out: each variant is what it says.
rc=0
one() {
	local label=$1 variant=$2 json
	shift 2
	# (env_of's words are NAME=VALUE pairs, split on purpose.)
	# shellcheck disable=SC2046
	if ! json=$(env -u GDIRECT_THREADS -u GDIRECT_TASK_SIZE -u GDIRECT_STAGING_SIZE -u GDIRECT_PAGE_CACHE \
		-u GDIRECT_KEEP_MAPPED -u GDIRECT_WRITE_PIECE -u GDIRECT_DIRECT_THRESHOLD -u GDIRECT_INLINE_SIZE \
		$(env_of "$variant") python3 "$root/tests/bench/blocks.py" "$file" "$@"); then
		echo "{\"label\": \"$label\", \"variant\": \"$variant\", \"failed\": true}" | tee -a "$results"
		rc=1
		return 1
	fi
	python3 -c 'import json, sys
r = json.loads(sys.argv[3])
print(json.dumps({"label": sys.argv[1], "variant": sys.argv[2],
                  **{k: r.get(k) for k in ("method", "block", "threads", "median_gb_per_s", "p50_us", "p99_us")}}))' \
		"$label" "$variant" "$json" | tee -a "$results"
}
for b in $blocks; do
	n=$(numfmt --from=iec "$b")
	reqs=$((2147483648 / n < 2048 ? 2048 : 2147483648 / n))
	one "read $b t16 kvikio" default --method kvikio --block "$n" --threads 16 --requests "$reqs"
	for v in $variants; do
		for m in gdirect-pread gdirect-batch; do
			one "read $b t16 $m" "$v" --method $m --block "$n" --threads 16 --requests "$reqs"
		done
	done
done
if [ "$latency" = 1 ]; then
	for b in 4K 64K; do
		n=$(numfmt --from=iec "$b")
		for m in gdirect-pread kvikio; do
			one "latency $b t1 $m" default --method $m --block "$n" --threads 1 --requests 8192
		done
		for v in mapped queued; do
			case " $variants " in *" $v "*) one "latency $b t1 gdirect-pread" $v --method gdirect-pread --block "$n" --threads 1 --requests 8192 ;; esac
		done
	done
fi
exit $rc
