#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# The GPU benchmark: gdirect's compat engine against KvikIO and a naive read-then-copy, on
# a CUDA machine (no kernel module needed). Every read is verified before its time counts.
#
# Usage: tests/bench/gpu.sh [--plan explore|full] [--size 4G] [--dir DIR] [--out DIR]
#
#   --plan full     the BENCHMARKS.md table: cold at 1, 4 and 16 threads, warm steady state
#                   and warm first read at 1, 4, 16 and 32 threads, gdirect (defaults) and
#                   KvikIO alternating, 3 of each; gdirect with kept page-cache registrations;
#                   KvikIO's settings swept for its best; naive read-then-copy (about 6
#                   minutes on the H200 machine)
#   --plan explore  one of each kind, for trying settings (GDIRECT_* variables apply)
#   --size          the test file's size (random bytes; made once, kept in --dir)
#   --dir           where the test file lives (default /var/tmp)
#   --out           where results.jsonl goes (default $OUT, or ./bench-out)
#
# Needs: target/release/gdirect (cargo build --release -p gdirect-cli), python3 with cupy,
# and KvikIO (kvikio-cu13, libkvikio-cu13, rapids-logger) importable. The tables:
# scripts/benchmarks --print-gpu OUT/results.jsonl; to publish a full run, copy its
# results.jsonl to tests/bench/results/h200.jsonl and run scripts/benchmarks.
# Run as root: cold runs also drop all caches.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
plan=explore size=4G dir=/var/tmp out=${OUT:-$PWD/bench-out}
while [ $# -gt 0 ]; do
	case $1 in
	--plan) plan=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--dir) dir=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '3,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
mkdir -p "$out"
results=$out/results.jsonl
: >"$results"

gdirect=${GDIRECT:-$root/target/release/gdirect}
kvikio="python3 $root/tests/bench/kvikio_bench.py"
file=$dir/gdirect-bench-$size.bin

say() { printf '%s  %s\n' "$(date +%T)" "$*"; }

machine="$(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), transparent huge pages $(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/enabled)"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | head -n 1)
versions=$(python3 -c 'import kvikio, cupy; print("KvikIO", kvikio.__version__ + ", CuPy", cupy.__version__)') || exit 1
say "machine: $machine"
say "GPU: $gpu"
say "$versions"
df -h "$dir" | tail -1
# The run's first line says what ran where (scripts/benchmarks puts it in BENCHMARKS.md).
# The device copy of the tree has no .git: the caller passes the commit in GDIRECT_COMMIT.
python3 - "$plan" "$size" "$machine" "$gpu" "$versions" "$(df -T "$dir" | awk 'NR == 2 {print $2}')" \
	"${GDIRECT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}" >>"$results" <<-'EOF'
	import datetime, json, sys
	plan, size, machine, gpu, versions, fs, commit = sys.argv[1:]
	print(json.dumps({"meta": {
	    "command": f"tests/bench/gpu.sh --plan {plan} --size {size}",
	    "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
	    "machine": machine, "gpu": gpu, "versions": versions, "file": f"{size} of random bytes on {fs}"}}))
	EOF

if [ ! -s "$file" ]; then
	say "making $file ($size of random bytes)"
	bytes=$(numfmt --from=iec "$size")
	parts=8 part=$((bytes / 8)) pids=()
	for i in $(seq 0 $((parts - 1))); do
		head -c "$part" /dev/urandom | dd of="$file" bs=4M seek=$((i * part)) oflag=seek_bytes conv=notrunc status=none &
		pids+=($!)
	done
	wait "${pids[@]}"
	sync
fi
ls -l "$file"

# The file's checksum, from gdirect (reads it once; later runs read it again themselves).
reference=$("$gdirect" bench "$file" --repeat 1 --warmup 0 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["reference_checksum"])')
say "reference checksum $reference"

# One measurement: label, then the command; its JSON goes to results.jsonl with the label.
run() {
	local label=$1 json
	shift
	if ! json=$("$@"); then
		say "FAILED: $label: $*"
		echo "{\"label\": \"$label\", \"failed\": true}" >>"$results"
		return 1
	fi
	python3 - "$label" "$json" "$*" >>"$results" <<-'EOF'
		import json, sys
		r = json.loads(sys.argv[2]); r["label"] = sys.argv[1]
		# The command as a reader would type it (gd and kv are this script's shorthands).
		cmd = sys.argv[3].split(" ", 1)
		tool = {"gd": "gdirect bench FILE", "kv": "kvikio_bench.py FILE"}.get(cmd[0], cmd[0])
		r["command"] = " ".join([tool] + cmd[1:])
		r.pop("runs_detail", None)
		print(json.dumps(r))
	EOF
	python3 - "$label" "$json" <<-'EOF'
		import json, sys
		r = json.loads(sys.argv[2])
		runs = " ".join(f'{x["gb_per_s"]:.2f}' for x in r["runs"])
		extra = ""
		if r.get("p50_us") is not None:
		    extra = f' iops {r["iops"]:.0f} p50 {r["p50_us"]:.0f}us p99 {r["p99_us"]:.0f}us'
		c = (r["runs"][0].get("compat") or {}) if r["runs"] else {}
		if c:
		    extra += f' direct {c["direct_bytes"]>>20}M buffered {c["buffered_bytes"]>>20}M mapped {c["mapped_bytes"]>>20}M'
		print(f'{sys.argv[1]:<44} median {r["median_gb_per_s"]:6.2f} GB/s  runs [{runs}]{extra}')
	EOF
}

gd() { "$gdirect" bench "$file" --json --reference "$reference" "$@"; }
kv() { $kvikio "$file" --reference "$reference" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
warm() { cat "$file" >/dev/null; }

case $plan in
explore)
	warm
	run "gdirect warm t16" gd --threads 16
	run "gdirect warm t16 mapped keep8G" gd --threads 16 --page-cache mapped --keep-mapped 8G
	run "kvikio warm t16" kv --threads 16
	run "gdirect first t16" gd --first --threads 16
	run "kvikio first t16" kv --first --threads 16
	drop
	run "gdirect cold t16" gd --cold --repeat 1 --threads 16
	run "kvikio cold t16" kv --cold --repeat 1 --threads 16
	;;
full)
	# Cold: gdirect and KvikIO alternating, 3 of each, at every thread count.
	for t in 1 4 16; do
		for k in 1 2 3; do
			drop
			run "cold t$t gdirect #$k" gd --cold --repeat 1 --threads "$t"
			drop
			run "cold t$t kvikio #$k" kv --cold --repeat 1 --threads "$t"
		done
	done
	warm
	# Warm steady state: median of 3 after one warm-up read, in one process.
	for t in 1 4 16 32; do
		run "warm t$t gdirect" gd --threads "$t"
		run "warm t$t kvikio" kv --threads "$t"
	done
	run "warm t16 gdirect mapped keep8G" gd --threads 16 --page-cache mapped --keep-mapped 8G
	# KvikIO's best: task size and threads swept.
	for t in 8 16 32; do
		for ts in 1048576 4194304 16777216; do
			run "warm kvikio sweep t$t task$((ts >> 20))M" kv --threads "$t" --task-size "$ts"
		done
	done
	# Warm first read of a fresh process: 3 processes of each, alternating.
	for t in 1 4 16 32; do
		for k in 1 2 3; do
			run "first t$t gdirect #$k" gd --first --threads "$t"
			run "first t$t kvikio #$k" kv --first --threads "$t"
		done
	done
	run "naive warm" gd --method naive --repeat 3
	;;
*)
	echo "gpu.sh: unknown plan $plan" >&2
	exit 2
	;;
esac
say "done: $(wc -l <"$results") results in $results"
