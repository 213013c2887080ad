#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# egpu_independent: the emulated GPU shares no source with gdirect's module, and the build
# check that says so can fail. On the host (scripts/test), with the test kernel's tree:
#  1. tests/egpu/independent.sh finds nothing shared in the tree as committed;
#  2. in a copy, each way of sharing is found: a module file included by path, a C #include of
#     the module's shim, a file copied from kernel/;
#  3. the emulator's own build (its Kbuild runs the check) stops on the planted include, and
#     builds from the unplanted copy.
# Prints "ok"/"not ok" per check, then "egpu_independent: N passed, N failed".
set -uo pipefail
. "$(dirname "$0")/../../scripts/common.sh"
cd "$GDIRECT_ROOT"
work=$(mktemp -d "${TMPDIR:-/tmp}/gdirect-indep.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
check() {
	local name=$1
	shift
	if "$@"; then echo "ok - $name"; pass=$((pass + 1)); else echo "not ok - $name"; fail=$((fail + 1)); fi
}
copy() {
	rm -rf "$work/tree" && mkdir -p "$work/tree/tests" &&
		cp -r kernel include Kbuild "$work/tree/" && cp -r tests/egpu "$work/tree/tests/"
}
finds() { # finds WHAT: the check exits 1 and prints WHAT
	local out
	out=$("$work/tree/tests/egpu/independent.sh" 2>&1) && return 1
	grep -qF "$1" <<<"$out" || { echo "# got: $out"; return 1; }
}

check "the committed emulator shares nothing with the module" tests/egpu/independent.sh
# The planted lines name the module's directory through $mod, so that a search of this tree for
# emulator sources that include the module's does not take them for real ones.
mod=kernel
copy
printf '#[path = "../../%s/nv_p2p.rs"]\nmod nv_p2p;\n' "$mod" >>"$work/tree/tests/egpu/egpu_main.rs"
check "a module file included by path is found" finds 'includes from outside tests/egpu: egpu_main.rs'
copy
printf '#include "../../%s/shim.c"\n' "$mod" >>"$work/tree/tests/egpu/egpu_exports.c"
check "the module's C shim included is found" finds 'includes from outside tests/egpu: egpu_exports.c'
copy
cp kernel/misc.rs "$work/tree/tests/egpu/shared.rs"
check "a file copied from the module is found" finds 'shared.rs is a copy of the module'
copy
printf 'gdirect_egpu-y += ../../%s/shim.o\n' "$mod" >>"$work/tree/tests/egpu/Kbuild"
check "an object of the module in the emulator's Kbuild is found" finds 'Kbuild builds a file from outside'

kdir=$(kernel_build_dir test)
if [ -f "$kdir/.gdirect-complete" ]; then
	mapfile -t margs < <(kmake_args)
	copy
	printf '#[path = "../../%s/nv_p2p.rs"]\nmod nv_p2p;\n' "$mod" >>"$work/tree/tests/egpu/egpu_main.rs"
	out=$(make -s -C "$kdir" M="$work/tree/tests/egpu" "${margs[@]}" modules 2>&1)
	rc=$?
	planted() { [ $rc -ne 0 ] && grep -q "the emulated GPU shares source with gdirect's module" <<<"$out"; }
	check "the emulator's build stops on a planted include" planted
	copy
	check "and builds without it" make -s -C "$kdir" M="$work/tree/tests/egpu" "${margs[@]}" modules
else
	echo "not ok - the build checks need the test kernel (scripts/kernel)"
	fail=$((fail + 1))
fi
echo "egpu_independent: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
