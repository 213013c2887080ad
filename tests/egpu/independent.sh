#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The emulated GPU is an independent implementation of NVIDIA's nv-p2p interface: it must share
# no source file with gdirect's module, or it could only show that the module agrees with
# itself. Prints each way it shares one (a file of the module included by path, a C #include
# or an object of the module's tree in its Kbuild, a file identical to one of the module's) and
# exits 1; prints nothing and exits 0 when it shares none.
#
# Usage: tests/egpu/independent.sh [EGPU_DIR [MODULE_DIR]]   (defaults: this directory,
#        ../../kernel beside it)
# tests/egpu/Kbuild runs it, so that the emulator does not build when it shares a file.
egpu=${1:-$(dirname "$0")}
module=${2:-$egpu/../../kernel}
found=0
say() { echo "$*"; found=1; }

for f in "$egpu"/*; do
	[ -f "$f" ] || continue
	name=$(basename "$f")
	# The emulator's sources and build file (not these checks, which hold planted examples).
	case $name in *.rs | *.c | *.h | Kbuild) ;; *) continue ;; esac
	# Rust modules included by path, C includes and Kbuild objects that leave the directory.
	grep -nE '#\[path *=|^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*(\.\./|/)' "$f" |
		while IFS= read -r l; do echo "$name:$l"; done >"${TMPDIR:-/tmp}/egpu-indep.$$"
	if [ -s "${TMPDIR:-/tmp}/egpu-indep.$$" ]; then
		while IFS= read -r l; do say "includes from outside tests/egpu: $l"; done <"${TMPDIR:-/tmp}/egpu-indep.$$"
	fi
	rm -f "${TMPDIR:-/tmp}/egpu-indep.$$"
	# Objects of the build (obj-m, NAME-y, NAME-objs) from outside the directory.
	objs='^[^#]*(obj-[a-z]+|-y|-objs)[[:space:]]*[:+]?=.*(\.\./|kernel/)'
	if [ "$name" = Kbuild ] && grep -nE "$objs" "$f" >/dev/null; then
		say "Kbuild builds a file from outside tests/egpu: $(grep -nE "$objs" "$f" | head -n 1)"
	fi
	for m in "$module"/*.rs "$module"/*/*.rs "$module"/*.c "$module"/*.h; do
		[ -f "$m" ] && cmp -s "$f" "$m" && say "$name is a copy of the module's $m"
	done
done
exit $found
