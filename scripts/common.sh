# SPDX-License-Identifier: GPL-2.0
# Shared settings and helpers for the scripts in this folder. Sourced, not run.
#
# Every path that lives outside the repository is derived here, once, so that
# setup, the kernel build, the module build and the VM runner agree on them.

GDIRECT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Downloads, kernel sources and kernel builds; survives `git clean`.
GDIRECT_CACHE=${GDIRECT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gdirect}
# The kernel series the module targets. Debian ships one source package per series.
GDIRECT_KERNEL_SERIES=${GDIRECT_KERNEL_SERIES:-7.2}
# The rustc that builds the kernel and the module (it must be the same one, with library source).
GDIRECT_KRUSTC=${GDIRECT_KRUSTC:-/usr/bin/rustc}
GDIRECT_BINDGEN=${GDIRECT_BINDGEN:-$HOME/.cargo/bin/bindgen}
GDIRECT_LLVM=${GDIRECT_LLVM:--19}
# The shared fallback copy of the kernel source package (present in CI, maybe not elsewhere).
GDIRECT_SHARED_CACHE=${GDIRECT_SHARED_CACHE:-$GDIRECT_ROOT/../shared/cache}

export PATH="$HOME/.cargo/bin:$PATH"

die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}

note() {
	printf '==> %s\n' "$*" >&2
}

# Seconds since the epoch, for "took N s" lines.
now() { date +%s; }

# The kernel make arguments every build uses.
kmake_args() {
	printf '%s\n' "LLVM=$GDIRECT_LLVM" "RUSTC=$GDIRECT_KRUSTC" "BINDGEN=$GDIRECT_BINDGEN"
}

# Directory of the unpacked kernel source for the series (set by scripts/setup).
kernel_src_dir() {
	local link="$GDIRECT_CACHE/src/linux-$GDIRECT_KERNEL_SERIES"
	[ -f "$link/Makefile" ] || die "kernel source for $GDIRECT_KERNEL_SERIES is not unpacked in $link: run scripts/setup"
	readlink -f "$link"
}

# The cache key of a kernel build: config fragments, source version, rustc version.
# $@: fragment files, in merge order.
kernel_build_key() {
	local src
	src=$(kernel_src_dir)
	{
		cat "$@"
		cat "$src/.gdirect-source-version" 2>/dev/null || basename "$src"
		"$GDIRECT_KRUSTC" --version --verbose
		"$GDIRECT_BINDGEN" --version
		"clang$GDIRECT_LLVM" --version | head -n 1
	} | sha256sum | cut -c1-16
}

# The build directory of the kernel variant $1 ("test" or "debug").
kernel_build_dir() {
	local variant=$1
	local frags=("$GDIRECT_ROOT/kernel/config/gdirect.config")
	[ "$variant" = debug ] && frags+=("$GDIRECT_ROOT/kernel/config/debug.config")
	[ "$variant" = iommu ] && frags+=("$GDIRECT_ROOT/kernel/config/iommu.config")
	# The signing key's request is part of the build (scripts/kernel), not a fragment.
	echo "$GDIRECT_CACHE/build/$variant-$(kernel_build_key "${frags[@]}" "$GDIRECT_ROOT/kernel/config/x509.genkey")"
}
