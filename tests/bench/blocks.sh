#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# The small-block benchmark (KV-cache offload's shape) on a CUDA machine: random reads and
# writes of 64 KiB, 256 KiB, 1 MiB and 2 MiB blocks between a warm file and slots of a GPU
# buffer, from 1, 4, 16 and 32 Python threads: gdirect's futures (File.pread/pwrite), its
# batches (read_batch/write_batch), its synchronous calls, KvikIO's futures, and gdirect's
# Rust engine (`gdirect bench --io-size`); and one thread's 4 KiB reads, the cost of a request.
# Every block is verified (tests/bench/blocks.py, gdirect bench). Appends one JSON object per
# measurement to OUT/blocks.jsonl.
#
# Usage: tests/bench/blocks.sh [--quick] [--blocks LIST] [--threads LIST] [--no-latency]
#                              [--round-mib M] [--dir DIR] [--out DIR]
#   --quick        16 threads and 64 KiB only, and the 4 KiB latencies (a first look)
#   --blocks LIST  block sizes (default "64K 256K 1M 2M"); --threads LIST: issuing threads
#                  (default "1 4 16 32"): to measure part of the sweep again
#   --no-latency   leave out the one-thread latencies
#   --round-mib M  the blocks a round of Python requests moves, in MiB (default 2048, at least
#                  2048 requests; 512 MiB rounds of 256 KiB batches lasted 30 ms, two batches
#                  a thread)
#
# Needs: the gdirect CLI ($GDIRECT, default target/release/gdirect), python3 with cupy, numpy,
# the gdirect package and KvikIO importable. Publish: copy OUT/blocks.jsonl to
# tests/bench/results/blocks-h200.jsonl and run scripts/benchmarks.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
quick=0 dir=/var/tmp out=${OUT:-$PWD/bench-out} latency=1 round_mib=2048
blocks="64K 256K 1M 2M" threads="1 4 16 32"
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 blocks="64K" threads="16"; shift ;;
	--blocks) blocks=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--no-latency) latency=0; shift ;;
	--round-mib) round_mib=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '3,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "blocks.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
mkdir -p "$out"
results=$out/blocks.jsonl
: >"$results"
gdirect=${GDIRECT:-$root/target/release/gdirect}
file=$dir/gdirect-blocks-1G.bin wfile=$dir/gdirect-blocks-write.bin
say() { printf '%s  %s\n' "$(date +%T)" "$*"; }

machine="$(nproc) CPUs, kernel $(uname -r)"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
versions=$(python3 -c 'import kvikio, kvikio.defaults, cupy, gdirect; print("gdirect", gdirect.__version__ + ", KvikIO", kvikio.__version__, "(gds_threshold", str(kvikio.defaults.get("gds_threshold")) + "), CuPy", cupy.__version__)') || exit 1
args="--blocks '$blocks' --threads '$threads'$([ "$latency" = 1 ] || echo ' --no-latency') --round-mib $round_mib"
python3 - "$machine" "$gpu" "$versions" "${GDIRECT_COMMIT:-unknown}" "$args" >>"$results" <<-'EOF'
	import datetime, json, sys
	machine, gpu, versions, commit, args = sys.argv[1:]
	print(json.dumps({"meta": {
	    "command": ("tests/bench/blocks.sh " + args).strip(),
	    "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
	    "machine": machine, "gpu": gpu, "versions": versions}}))
	EOF
say "$gpu; $versions"
[ -s "$file" ] || head -c 1G /dev/urandom >"$file"
cat "$file" >/dev/null

# One measurement: its label, then the command, whose JSON is appended with the label.
run() {
	local label=$1 json
	shift
	if ! json=$("$@"); then
		say "FAILED: $label"
		echo "{\"label\": \"$label\", \"failed\": true}" >>"$results"
		return 1
	fi
	python3 - "$label" "$json" >>"$results" <<-'EOF'
		import json, sys
		r = json.loads(sys.argv[2]); r["label"] = sys.argv[1]; r.pop("runs_detail", None)
		print(json.dumps(r))
		g = r.get("median_gb_per_s") or r.get("gb_per_s") or 0
		p50, p99 = (r.get(k) or 0 for k in ("p50_us", "p99_us"))
		print(f"{sys.argv[1]:<40} {g:7.2f} GB/s  p50 {p50:7.1f} us  p99 {p99:7.1f} us", file=sys.stderr)
	EOF
}
py() { python3 "$root/tests/bench/blocks.py" "$@"; }
# Requests per round: --round-mib of blocks (at least 2048 requests).
reqs() { local n=$((round_mib * 1048576 / $1)); echo $((n < 2048 ? 2048 : n)); }
bytes() { numfmt --from=iec "$1"; }

for b in $blocks; do
	n=$(bytes "$b")
	for t in $threads; do
		for m in gdirect-pread gdirect-batch kvikio; do
			run "read $b t$t $m" py "$file" --method $m --block "$n" --threads "$t" --requests "$(reqs "$n")"
		done
	done
	run "read $b t16 gdirect-read" py "$file" --method gdirect-read --block "$n" --threads 16 --requests "$(reqs "$n")"
	run "read $b t16 rust" "$gdirect" bench "$file" --io-size "$b" --pattern rand --jobs 16 --duration 2 --json
	for m in gdirect-pread gdirect-batch gdirect-read kvikio; do
		run "write $b t16 $m" py "$wfile" --op write --method $m --block "$n" --threads 16 --requests "$(reqs "$n")"
	done
	rm -f "$wfile"
	run "write $b t16 rust" "$gdirect" bench "$wfile" --write --len 1G --io-size "$b" --pattern rand --jobs 16 --duration 2 --json
	rm -f "$wfile"
done
# The cost of one request: one thread, 4 KiB, warm. They come after the writes above, whose dirty
# pages the kernel may still be writing back (the run at 67410be gave every method's request
# more time here than request_cost.py's rounds did, and gdirect's, measured first, the most): the
# file system synced first, then two passes with the methods alternating, a label's second pass
# replacing its first.
[ "$latency" = 1 ] || { say "done: $(($(wc -l <"$results") - 1)) measurements in $results"; exit 0; }
sync
cat "$file" >/dev/null
for pass in 1 2; do
	for m in gdirect-pread kvikio gdirect-read; do
		run "latency 4K t1 $m" py "$file" --method $m --block 4096 --threads 1 --requests 8192
	done
	run "latency 4K t1 rust" "$gdirect" bench "$file" --io-size 4K --pattern rand --jobs 1 --duration 2 --json
	run "latency 64K t1 gdirect-pread" py "$file" --method gdirect-pread --block 65536 --threads 1 --requests 4096
	run "latency 64K t1 kvikio" py "$file" --method kvikio --block 65536 --threads 1 --requests 4096
done
say "done: $(($(wc -l <"$results") - 1)) measurements in $results"
