#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# Two builds of gdirect on the small-block shape of tests/bench/blocks.sh, alternating in one
# lease, KvikIO's futures beside them: what a change to the engine's request path moves, with
# the machine's drift from minute to minute shared by both builds. Each repetition, per block
# size: KvikIO's futures, then each build's futures and batches (16 Python threads, random
# blocks of a warm 1 GiB file into slots of a CuPy buffer, every slot verified by blocks.py),
# the builds' order swapped from one repetition to the next; then one thread's 4 KiB futures
# and each CLI's `gdirect bench` (4 KiB, one job; the largest block, 16 jobs; every I/O
# verified).
#
# Usage: tests/bench/builds.sh --old DIR --new DIR [--blocks LIST] [--reps N] [--out DIR]
#   --old, --new  a build: a directory holding the package (`pip install --target DIR`), put
#                 first on PYTHONPATH, and the CLI as DIR/gdirect-cli
#   --blocks LIST block sizes (default "2M 256K")
#   --reps N      repetitions (default 2)
# Writes OUT/builds.jsonl anew: a meta line, then blocks.py's JSON (or the CLI's) of each
# measurement with "build", "rep" and "label" added; exits 1 if a measurement failed (a wrong
# slot or byte, an error), recorded as failed. Set GDIRECT_COMMIT_OLD and GDIRECT_COMMIT_NEW
# to name the builds' commits in the meta line.
#
# Needs: python3 with cupy, numpy and KvikIO importable (the builds bring gdirect).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
old="" new="" blocks="2M 256K" reps=2 out=${OUT:-$PWD/bench-out}
while [ $# -gt 0 ]; do
	case $1 in
	--old | --new | --blocks | --reps | --out)
		[ $# -ge 2 ] || { echo "builds.sh: $1 takes a value" >&2; exit 2; } ;;
	esac
	case $1 in
	--old) old=$2; shift 2 ;;
	--new) new=$2; shift 2 ;;
	--blocks) blocks=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	-h | --help) sed -n '3,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "builds.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
for d in "$old" "$new"; do
	[ -n "$d" ] && [ -f "$d/gdirect/__init__.py" ] && [ -x "$d/gdirect-cli" ] ||
		{ echo "builds.sh: --old and --new must each name a directory with the package (DIR/gdirect/) and the CLI (DIR/gdirect-cli)" >&2; exit 2; }
done
case $reps in '' | *[!0-9]* | 0) echo "builds.sh: --reps takes a number from 1" >&2; exit 2 ;; esac
for b in $blocks; do
	n=$(numfmt --from=iec "$b" 2>/dev/null) && [ "$n" -ge 4096 ] && [ $((n % 4096)) = 0 ] ||
		{ echo "builds.sh: bad block size $b (a multiple of 4K: 64K, 2M...)" >&2; exit 2; }
done
old=$(cd "$old" && pwd) new=$(cd "$new" && pwd)
mkdir -p "$out"
results=$out/builds.jsonl
: >"$results"
file=/var/tmp/gdirect-blocks-1G.bin
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)
versions=$(python3 -c 'import kvikio, kvikio.defaults, cupy; print("KvikIO", kvikio.__version__, "(gds_threshold", str(kvikio.defaults.get("gds_threshold")) + "), CuPy", cupy.__version__)') || exit 1
python3 - "$gpu" "$versions" "${GDIRECT_COMMIT_OLD:-unknown}" "${GDIRECT_COMMIT_NEW:-unknown}" \
	"tests/bench/builds.sh --blocks '$blocks' --reps $reps" >>"$results" <<-'EOF2'
	import datetime, json, sys
	gpu, versions, old, new, command = sys.argv[1:]
	print(json.dumps({"meta": {"command": command, "commit_old": old, "commit_new": new, "gpu": gpu,
	    "versions": versions, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}}))
	EOF2
[ "$(stat -c %s "$file" 2>/dev/null)" = 1073741824 ] || head -c 1G /dev/urandom >"$file"
cat "$file" >/dev/null

# One measurement: label, build (old, new or -), rep, then the command. The caller's own
# GDIRECT_* settings are left out: both builds run their defaults.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^GDIRECT_')
rc=0
one() {
	local label=$1 build=$2 rep=$3 json line dir=""
	shift 3
	case $build in old) dir=$old ;; new) dir=$new ;; esac
	if json=$(PYTHONPATH="$dir${PYTHONPATH:+${dir:+:}$PYTHONPATH}" "$@") &&
		line=$(python3 -c 'import json, sys
r = json.loads(sys.argv[4])
print(json.dumps({"label": sys.argv[1], "build": sys.argv[2], "rep": int(sys.argv[3]), **r}))' \
			"$label" "$build" "$rep" "$json"); then
		echo "$line" | tee -a "$results"
		return 0
	fi
	echo "{\"label\": \"$label\", \"build\": \"$build\", \"rep\": $rep, \"failed\": true}" | tee -a "$results"
	rc=1
	return 1
}
blocks_py() { one "$1" "$2" "$3" python3 "$root/tests/bench/blocks.py" "$file" "${@:4}"; }
largest=$(for b in $blocks; do echo "$(numfmt --from=iec "$b") $b"; done | sort -n | tail -n 1 | cut -d' ' -f2)
for rep in $(seq 1 "$reps"); do
	order="old new"
	[ $((rep % 2)) = 0 ] && order="new old"
	for b in $blocks; do
		n=$(numfmt --from=iec "$b")
		reqs=$((2147483648 / n < 2048 ? 2048 : 2147483648 / n))
		blocks_py "read $b t16" - "$rep" --method kvikio --block "$n" --threads 16 --requests "$reqs"
		for build in $order; do
			for m in gdirect-pread gdirect-batch; do
				blocks_py "read $b t16" "$build" "$rep" --method $m --block "$n" --threads 16 --requests "$reqs"
			done
		done
	done
	blocks_py "latency 4K t1" - "$rep" --method kvikio --block 4096 --threads 1 --requests 8192
	for build in $order; do
		blocks_py "latency 4K t1" "$build" "$rep" --method gdirect-pread --block 4096 --threads 1 --requests 8192
	done
	for build in $order; do
		cli=$old/gdirect-cli
		[ "$build" = new ] && cli=$new/gdirect-cli
		one "rust 4K t1" "$build" "$rep" "$cli" bench "$file" --io-size 4K --pattern rand --jobs 1 --duration 2 --json
		one "rust $largest t16" "$build" "$rep" "$cli" bench "$file" --io-size "$largest" --pattern rand --jobs 16 --duration 2 --json
	done
done
exit $rc
