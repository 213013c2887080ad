#!/bin/bash
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# The command line tool on a CUDA machine (no kernel module needed): a read with no memory
# named goes into CUDA device 0; a read through a window smaller than the file takes it piece
# by piece, every piece verified; a byte that differs from the reference exits 3; flags of the
# other kind of memory are command line errors (2); --json works on every command; bench
# measures reads and writes (a written file is checked against the pattern here too);
# --device is the node read and bench ask.
#
# Usage: tests/gpu/cli.sh [GDIRECT]   (default: target/release/gdirect)
# Prints one "ok"/"not ok" line per check, then "N passed, N failed"; exits 1 on a failure.
set -u

gd=${1:-target/release/gdirect}
dir=$(mktemp -d /var/tmp/gdirect-cli.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
MIB=1048576

check() {
	local name=$1
	shift
	if "$@"; then
		echo "ok - $name"
		pass=$((pass + 1))
	else
		echo "not ok - $name"
		fail=$((fail + 1))
	fi
}

# Fields of a JSON object on stdin, space separated.
fields() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(*[d.get(k) for k in sys.argv[1:]])' "$@"; }

# eq WHAT WANT GOT
eq() {
	[ "$2" = "$3" ] && return 0
	echo "# $1: want '$2', got '$3'"
	return 1
}

# 96 MiB and 12 KiB of random bytes (not a multiple of the windows below), and a copy with
# one byte changed at 70 MiB + 5.
size=$((96 * MIB + 12288))
head -c "$size" /dev/urandom >"$dir/a.bin"
cp "$dir/a.bin" "$dir/b.bin"
printf '\125' | dd of="$dir/b.bin" bs=1 seek=$((70 * MIB + 5)) conv=notrunc status=none
cmp -s "$dir/a.bin" "$dir/b.bin" && { echo "# the copy did not change"; exit 1; }

out=$("$gd" read "$dir/a.bin" --verify --json)
check "no memory named: CUDA device 0, every byte, verified, one piece" \
	eq "exit gpu bytes verified pieces" "0 0 $size True 1" "$? $(fields gpu bytes verified pieces <<<"$out")"

out=$("$gd" read "$dir/a.bin" --window 16M --verify --json)
check "a 16 MiB window: 7 pieces, every byte, each piece verified" \
	eq "exit bytes verified pieces window" "0 $size True 7 $((16 * MIB))" \
	"$? $(fields bytes verified pieces window <<<"$out")"

out=$("$gd" --json read "$dir/a.bin" --offset 32M --len 40M --window 8M --verify)
check "--json before the command; an offset and length through an 8 MiB window" \
	eq "exit bytes verified pieces" "0 $((40 * MIB)) True 5" "$? $(fields bytes verified pieces <<<"$out")"

out=$("$gd" read "$dir/a.bin" --window 16M --verify "$dir/b.bin" --json 2>"$dir/err")
rc=$?
check "a byte that differs from the reference: exit 3, the report says so" \
	eq "exit verified" "3 False" "$rc $(fields verified <<<"$out")"
check "the mismatch names the piece's offset" grep -q "bytes at offset $((64 * MIB)) differ" "$dir/err"

"$gd" read "$dir/a.bin" --window 16M >"$dir/text"
check "the text report shows the window" grep -q "^window .* 7 pieces" "$dir/text"

for flags in "--chunk 1M" "--force-bounce" "--poison 7" "--gpu 0 --mem host" "--mem host --threads 4"; do
	# shellcheck disable=SC2086
	"$gd" read "$dir/a.bin" $flags >/dev/null 2>&1
	check "read $flags: a command line error" eq exit 2 $?
done

out=$("$gd" read "$dir/a.bin" --gpu 4096 --json 2>/dev/null)
rc=$?
check "a GPU that does not exist: exit 1, a cuda error" eq "exit kind" "1 cuda" \
	"$rc $(python3 -c 'import json, sys; print(json.load(sys.stdin)["error"]["kind"])' <<<"$out")"

out=$("$gd" bench "$dir/a.bin" --repeat 1 --json)
check "bench with the global --json: verified" eq "exit runs" "0 1" \
	"$? $(python3 -c 'import json, sys; d = json.load(sys.stdin); print(sum(r["verified"] for r in d["runs"]))' <<<"$out")"

"$gd" bench "$dir/a.bin" --repeat 1 --reference 0123456789abcdef >/dev/null 2>&1
check "bench against a wrong checksum: exit 3" eq exit 3 $?

out=$("$gd" bench "$dir/a.bin" --io-size 1M --pattern rand --jobs 4 --repeat 1 --json)
check "bench: random 1 MiB I/Os from 4 jobs, one pass (96 I/Os), every one verified" \
	eq "exit ios bytes verified pattern" "0 96 $((96 * MIB)) True rand" \
	"$? $(fields ios bytes verified pattern <<<"$out")"
# No module on this machine: the reader says the compat engine read, and why.
check "bench: the engine that read, and why (no module here)" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d["engine"] == "compat" and "not loaded" in d["why"] else 1)' "$out"
# --device names the node read and bench ask: /dev/null is no gdirect device (a module of
# another ABI, as the reader tells it), where the default /dev/gdirect is missing here.
for cmd in "read $dir/a.bin --len 1M" "bench $dir/a.bin --io-size 1M --len 4M --repeat 1"; do
	out=$("$gd" --device /dev/null $cmd --json)
	check "${cmd%% *} --device /dev/null: the compat engine, because that node is not gdirect's" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print("# why: " + d["why"])
sys.exit(0 if d["engine"] == "compat" and "ABI" in d["why"] and "not loaded" not in d["why"] else 1)' "$out"
done
out=$(GDIRECT_COMPAT_MODE=off "$gd" bench "$dir/a.bin" --io-size 1M --repeat 1 --json 2>/dev/null)
check "bench with GDIRECT_COMPAT_MODE=off and no module: an error that says so" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d["error"]["kind"] == "compat_mode_off" else 1)' "$out"

out=$("$gd" bench "$dir/a.bin" --io-size 4K --duration 1 --json)
check "bench: 4 KiB I/Os for a second, timed and counted" python3 -c '
import json, sys
d = json.loads(sys.argv[1])
ok = d["ios"] > 100 and d["bytes"] == 4096 * d["ios"] and 0 < d["seconds"] <= 1.5 and d["p99_us"] >= d["p50_us"] > 0
print("# %d I/Os, %.0f IOPS, p50 %.0f us, p99 %.0f us" % (d["ios"], d["iops"], d["p50_us"], d["p99_us"]))
sys.exit(0 if ok else 1)' "$out"

# Writes: 4 jobs write a new file in 1 MiB I/Os from GPU memory; the tool compares each I/O's
# bytes, and this script recomputes the pattern of two of them from the file itself.
out=$("$gd" bench "$dir/w.bin" --io-size 1M --write --len 24M --jobs 4 --repeat 1 --json)
check "bench --write: a new 24 MiB file in 1 MiB writes from 4 jobs, every one verified" \
	eq "exit op ios bytes verified" "0 write 24 $((24 * MIB)) True" \
	"$? $(fields op ios bytes verified <<<"$out")"
check "bench --write: the file holds each I/O's offset pattern" python3 -c '
import sys
data = open(sys.argv[1], "rb").read()
def pattern(off, n):
    s, out, m = off ^ 0x2545F4914F6CDD1D, bytearray(), (1 << 64) - 1
    while len(out) < n:
        s ^= (s << 13) & m; s ^= s >> 7; s ^= (s << 17) & m
        out += s.to_bytes(8, "little")
    return bytes(out[:n])
M = 1 << 20
ok = len(data) == 24 * M and all(data[o:o + M] == pattern(o, M) for o in (0, 17 * M))
sys.exit(0 if ok else 1)' "$dir/w.bin"
cp "$dir/w.bin" "$dir/w.orig"
"$gd" bench "$dir/w.bin" --io-size 1M --write --repeat 1 >/dev/null 2>&1
check "bench --write over an existing file without --overwrite: exit 2, the file untouched" \
	eq "exit same" "2 0" "$? $(cmp -s "$dir/w.bin" "$dir/w.orig"; echo $?)"
"$gd" bench "$dir/new.bin" --io-size 1M --write >/dev/null 2>&1
check "bench --write to a new file without --len: exit 2" eq exit 2 $?
out=$("$gd" bench "$dir/w.bin" --io-size 64K --write --overwrite --pattern rand --duration 1 --json)
check "bench --write --overwrite: random 64 KiB writes for a second, verified" \
	eq "exit op verified" "0 write True" "$? $(fields op verified <<<"$out")"

"$gd" bench "$dir/a.bin" --io-size 4K --first >/dev/null 2>&1
check "bench --io-size with --first: a command line error" eq exit 2 $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
