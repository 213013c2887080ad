#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# The install paths, on the host, against the cached test kernel's tree (scripts/kernel):
#  - scripts/build-for-running-kernel: a tree that lacks the build tree, CONFIG_RUST, the
#    Rust metadata, the kernel's exact rustc or C compiler, or has another release, is
#    refused with what is missing and how to get it (fixture trees); the real tree passes;
#  - `make install DESTDIR=` / `make uninstall`: the module, depmod's index, the udev rule and
#    the options file in place, `modprobe` (kmod, -d DESTDIR) resolves gdirect to it, an
#    administrator's own options file is kept, and uninstall leaves the tree as it was;
#  - `make SIGN_KEY=`: the module is signed with the key (modinfo names the signer); signing
#    again replaces the signature; scripts/sign-module --strip gives back the unsigned module;
#  - DKMS (`make dkms-source`, dkms add/build/install/remove in private trees): builds and
#    installs gdirect for the test kernel; against a tree without Rust metadata the build fails
#    and make.log says what is missing; a kernel without CONFIG_RUST is skipped by
#    BUILD_EXCLUSIVE_CONFIG.
# Prints "ok N ..." / "not ok N ..." per check and last "install: N passed, N failed".
set -uo pipefail
. "$(dirname "$0")/../../scripts/common.sh"
cd "$GDIRECT_ROOT"

kdir=$(kernel_build_dir test)
[ -f "$kdir/.gdirect-complete" ] || die "the test kernel is not built: run scripts/kernel"
release=$(cat "$kdir/include/config/kernel.release")
work=$(mktemp -d "${TMPDIR:-/tmp}/gdirect-install.XXXXXX")
trap 'rm -rf "$work"' EXIT

n=0 pass=0 fail=0
result() { # $1: 0 pass; $2: description
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then
		pass=$((pass + 1))
		echo "ok $n $2"
	else
		fail=$((fail + 1))
		echo "not ok $n $2"
	fi
}
# check DESCRIPTION COMMAND...: passes when the command succeeds.
check() {
	local d=$1
	shift
	"$@"
	result $? "$d"
}
# Output $1 contains every one of the fixed strings $2...
has() {
	local out=$1 s
	shift
	for s in "$@"; do
		grep -qF -- "$s" <<<"$out" || {
			echo "# missing from the output: $s"
			return 1
		}
	done
}

# 1. build-for-running-kernel against fixture trees: each is the real tree's files it
# checks, with one thing wrong.
fixture() {
	local t=$work/tree-$1
	[ -d "$t" ] && { echo "$t"; return; }
	mkdir -p "$t/include/config" "$t/rust" "$t/scripts" "$t/include/generated"
	touch "$t/Makefile" "$t/Module.symvers"
	cp "$kdir/.config" "$t/.config"
	echo "$release" >"$t/include/config/kernel.release"
	for f in rust/libcore.rmeta rust/libkernel.rmeta rust/libmacros.so scripts/target.json include/generated/rustc_cfg; do
		ln -s "$kdir/$f" "$t/$f"
	done
	echo "$t"
}
bfrk() { scripts/build-for-running-kernel "$@" 2>&1; }

out=$(bfrk --kdir "$(fixture ok)" --check)
check "build-for-running-kernel: a complete tree passes --check" has "$out" "every check passed"
out=$(bfrk --kdir "$work/none" --check)
check "no build tree: refused, names the headers package" has "$out" "no kernel build tree" "linux-headers-"
t=$(fixture norust)
sed -i 's/^CONFIG_RUST=y$/# CONFIG_RUST is not set/' "$t/.config"
out=$(bfrk --kdir "$t" --check)
check "no CONFIG_RUST: refused" has "$out" "MISSING  CONFIG_RUST" "built without Rust support"
t=$(fixture normeta)
rm "$t/rust/libkernel.rmeta" "$t/rust/libmacros.so"
out=$(bfrk --kdir "$t" --check)
check "no Rust metadata: refused, names what is missing and linux-lib-rust" \
	has "$out" "MISSING  Rust metadata" "rust/libkernel.rmeta rust/libmacros.so" "linux-lib-rust-$release"
t=$(fixture rustc)
sed -i 's/^CONFIG_RUSTC_VERSION_TEXT=.*/CONFIG_RUSTC_VERSION_TEXT="rustc 1.80.0 (051478957 2024-07-21)"/' "$t/.config"
out=$(bfrk --kdir "$t" --check)
check "another rustc: refused, names the version and how to install it" \
	has "$out" 'MISSING  rustc' '"rustc 1.80.0 (051478957 2024-07-21)"' "rustup toolchain install 1.80.0"
t=$(fixture clang)
sed -i -e 's/^CONFIG_CC_VERSION_TEXT=.*/CONFIG_CC_VERSION_TEXT="Debian clang version 99.1.0"/' \
	-e 's/^CONFIG_CLANG_VERSION=.*/CONFIG_CLANG_VERSION=990100/' "$t/.config"
out=$(bfrk --kdir "$t" --check)
check "another C compiler: refused, names the package" has "$out" "MISSING  C compiler" "clang-99"
out=$(bfrk --kdir "$(fixture ok)" --release 9.9.9 --check)
check "another release: refused" has "$out" "not 9.9.9"
out=$(bfrk --kdir "$(fixture ok)" --check CC=clang LD=ld.lld)
check "DKMS's make variables are accepted" has "$out" "every check passed"
out=$(bfrk --kdir "$kdir" --check)
check "the test kernel's tree passes --check" has "$out" "every check passed" "ok       rustc"

# NVIDIA's nv-p2p.h against what the module reads: headers written here from the facts of
# the two generations (page table 1.2 up to 575, 2.0 with flags from 580.65.06), and ones a
# driver could change. $1: directory; $2: version; $3: the table's fields; $4: get_pages's
# free-callback parameter.
nv_header() {
	mkdir -p "$work/$1/nvidia"
	cat >"$work/$1/nvidia/nv-p2p.h" <<H
#define NVIDIA_P2P_PAGE_TABLE_VERSION   $2
#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE 0x1
struct pci_dev;
enum nvidia_p2p_page_size_type { NVIDIA_P2P_PAGE_SIZE_4KB = 0, NVIDIA_P2P_PAGE_SIZE_64KB,
	NVIDIA_P2P_PAGE_SIZE_128KB, NVIDIA_P2P_PAGE_SIZE_COUNT };
typedef struct nvidia_p2p_page { uint64_t physical_address; uint32_t registers[6]; } nvidia_p2p_page_t;
typedef struct nvidia_p2p_page_table { $3 } nvidia_p2p_page_table_t;
int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space, uint64_t virtual_address, uint64_t length,
	struct nvidia_p2p_page_table **page_table, $4, void *data);
int nvidia_p2p_get_pages_persistent(uint64_t virtual_address, uint64_t length,
	struct nvidia_p2p_page_table **page_table, uint32_t flags);
int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space, uint64_t virtual_address,
	struct nvidia_p2p_page_table *page_table);
int nvidia_p2p_put_pages_persistent(uint64_t virtual_address, struct nvidia_p2p_page_table *page_table,
	uint32_t flags);
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);
H
	echo "$work/$1"
}
v1='uint32_t version; uint32_t page_size; struct nvidia_p2p_page **pages; uint32_t entries; uint8_t *gpu_uuid;'
cb='void (*free_callback)(void *data)'
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$(nv_header nv535 0x00010002 "$v1" "$cb")")
check "nv-p2p.h of a 535-series driver (page table 1.2): every fact holds" \
	has "$out" "ok       nv-p2p.h" "page table 0x00010002" "every check passed"
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$(nv_header nv580 0x00020000 "$v1 uint32_t flags;" "$cb")")
check "nv-p2p.h of a 580-series driver (2.0, flags): every fact holds" \
	has "$out" "ok       nv-p2p.h" "page table 0x00020000" "every check passed"
moved='uint32_t version; uint32_t page_size; struct nvidia_p2p_page **pages; uint64_t cookie; uint32_t entries; uint8_t *gpu_uuid;'
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$(nv_header moved 0x00010003 "$moved" "$cb")")
check "a header whose entries field moved: refused, the field named" \
	has "$out" "MISSING  nv-p2p.h" "gdirect: nvidia_p2p_page_table.entries at offset 16" "cannot build"
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$(nv_header nv3 0x00030000 "$v1 uint32_t flags;" "$cb")")
check "a page table of major version 3: refused, the version named" \
	has "$out" "MISSING  nv-p2p.h" "NVIDIA_P2P_PAGE_TABLE_VERSION is neither" "cannot build"
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$(nv_header sig 0x00020000 "$v1 uint32_t flags;" 'void (*free_callback)(void *data, int why)')")
check "a changed get_pages signature: refused, the function named" has "$out" "MISSING  nv-p2p.h" "gdirect: nvidia_p2p_get_pages has the signature" "cannot build"
out=$(bfrk --kdir "$(fixture ok)" --check --nvidia-src "$work/none")
check "--nvidia-src without nv-p2p.h: refused" has "$out" "no nv-p2p.h under $work/none"

# 2. make install / uninstall into DESTDIR: a root that holds kernel $release (its
# modules.order and modules.builtin, as an installed kernel has them).
dest=$work/dest
mkdir -p "$dest/etc/modprobe.d" "$dest/lib/modules/$release"
echo "# an administrator's own file" >"$dest/etc/modprobe.d/other.conf"
touch "$dest/lib/modules/$release/modules.order" "$dest/lib/modules/$release/modules.builtin" \
	"$dest/lib/modules/$release/modules.builtin.modinfo"
(cd "$dest" && find . | sort) >"$work/before"
out=$(make -s install DESTDIR="$dest" 2>&1)
rc=$?
echo "$out" | grep -v '^depmod: WARNING' | sed 's/^/# /'
check "make install DESTDIR succeeds" test $rc -eq 0
check "the module is in lib/modules/$release/extra" test -f "$dest/lib/modules/$release/extra/gdirect.ko"
out=$(modprobe -d "$dest" -S "$release" --show-depends gdirect 2>&1)
check "modprobe resolves gdirect to it" has "$out" "insmod $dest/lib/modules/$release/extra/gdirect.ko"
rule=$(cat "$dest/etc/udev/rules.d/70-gdirect.rules" 2>/dev/null)
check "the udev rule gives /dev/gdirect group gdirect, mode 0660" \
	has "$rule" 'KERNEL=="gdirect", SUBSYSTEM=="misc", GROUP="gdirect", MODE="0660"'
documented() {
	local p c=0
	for p in $(modinfo -F parm kernel/gdirect.ko | cut -d: -f1); do
		grep -q "^#options gdirect $p=[0-9]" "$dest/etc/modprobe.d/gdirect.conf" || return 1
		c=$((c + 1))
	done
	[ $c -ge 5 ]
}
check "the options file documents every parameter at its default" documented
# An upgrade, then uninstall: exactly what the install added goes.
make -s install DESTDIR="$dest" >/dev/null 2>&1
make -s uninstall DESTDIR="$dest" >/dev/null 2>&1
(cd "$dest" && find . | sort) >"$work/after"
check "make uninstall leaves the tree as it was (after an install and an upgrade)" \
	diff "$work/before" "$work/after"
# The options file: an administrator's edit survives a reinstall and the uninstall.
make -s install DESTDIR="$dest" >/dev/null 2>&1
sed -i 's/^#options gdirect max_registrations=.*/options gdirect max_registrations=4242/' "$dest/etc/modprobe.d/gdirect.conf"
make -s install DESTDIR="$dest" >/dev/null 2>&1
kept() { grep -qx 'options gdirect max_registrations=4242' "$dest/etc/modprobe.d/gdirect.conf"; }
check "an edited gdirect.conf is kept by a reinstall" kept
out=$(make -s uninstall DESTDIR="$dest" 2>&1)
check "and by uninstall, which says so" sh -c 'grep -qx "options gdirect max_registrations=4242" "$0" && echo "$1" | grep -q "keeping .*gdirect.conf: edited"' \
	"$dest/etc/modprobe.d/gdirect.conf" "$out"
rm "$dest/etc/modprobe.d/gdirect.conf"
# An administrator's own file, which no install wrote.
echo "# admin" >"$dest/etc/modprobe.d/gdirect.conf"
make -s install DESTDIR="$dest" >/dev/null 2>&1
make -s uninstall DESTDIR="$dest" >/dev/null 2>&1
check "an administrator's own gdirect.conf is neither replaced nor removed" \
	test "$(cat "$dest/etc/modprobe.d/gdirect.conf")" = "# admin"
rm "$dest/etc/modprobe.d/gdirect.conf"
(cd "$dest" && find . | sort) >"$work/after"
check "  and the tree is as it was" diff "$work/before" "$work/after"
# A root without an installed kernel (a package's staging tree): no index is made there.
stage=$work/stage
mkdir -p "$stage"
out=$(scripts/install-module install --root "$stage" 2>&1)
check "a staging root gets the module and no module index (depmod is left to the target)" \
	sh -c '[ -f "$0/lib/modules/$1/extra/gdirect.ko" ] && [ ! -e "$0/lib/modules/$1/modules.dep" ] && echo "$2" | grep -q "run .depmod $1. on the target"' \
	"$stage" "$release" "$out"
scripts/install-module uninstall --root "$stage" >/dev/null 2>&1
check "  and its uninstall leaves it empty" test -z "$(ls -A "$stage")"
# An install that fails midway takes back what it had added.
broken=$work/broken
mkdir -p "$broken/etc" "$broken/lib/modules/$release"
touch "$broken/etc/modprobe.d" "$broken/lib/modules/$release/modules.order"
(cd "$broken" && find . | sort) >"$work/before-broken"
out=$(scripts/install-module install --root "$broken" 2>&1)
rc=$?
(cd "$broken" && find . | sort) >"$work/after-broken"
check "a failed install (etc/modprobe.d is a file) exits 1 and leaves nothing behind" \
	sh -c '[ "$0" -eq 1 ] && cmp -s "$1" "$2" && echo "$3" | grep -q "what it had added is removed"' \
	"$rc" "$work/before-broken" "$work/after-broken" "$out"
out=$(scripts/install-module uninstall --root "$dest" 2>&1)
check "uninstall with nothing installed: a clear error" has "$out" "nothing to uninstall"

# 3. Signing.
check "make modules (an up-to-date, signed module signed again)" make -s modules
signer=$(modinfo -F signer kernel/gdirect.ko)
check "make signs the module with the test kernel's key ($signer)" \
	test "$signer" = "gdirect test kernel module signing key"
size1=$(wc -c <kernel/gdirect.ko)
sum1=$(sha256sum <kernel/gdirect.ko)
resign() {
	scripts/sign-module --kdir "$kdir" --key "$kdir/certs/signing_key.pem" --cert "$kdir/certs/signing_key.x509" kernel/gdirect.ko &&
		[ "$(wc -c <kernel/gdirect.ko)" -eq "$size1" ] && [ "$(modinfo -F signer kernel/gdirect.ko)" = "$signer" ]
}
check "signing a signed module again replaces its signature (same size, same signer)" resign
# RSA PKCS#1 v1.5 signatures are deterministic: the same bytes prove that nothing was appended.
check "  byte for byte the same module" test "$(sha256sum <kernel/gdirect.ko)" = "$sum1"
cp kernel/gdirect.ko "$work/s.ko"
scripts/sign-module --strip "$work/s.ko"
# The unsigned module ends where the ELF file ends: its section header table (the ELF
# header's e_shoff + e_shnum * e_shentsize), read independently of sign-module.
elf_end=$(python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(64)
shoff, = struct.unpack_from("<Q", b, 0x28)
shentsize, shnum = struct.unpack_from("<HH", b, 0x3a)
print(shoff + shentsize * shnum)' kernel/gdirect.ko)
check "--strip cuts exactly the signature (the ELF file ends at $elf_end)" \
	test "$(wc -c <"$work/s.ko")" -eq "$elf_end" -a "$(wc -c <kernel/gdirect.ko)" -gt "$elf_end"
check "  and the rest is the signed module's bytes" cmp -s "$work/s.ko" <(head -c "$elf_end" kernel/gdirect.ko)
out=$(scripts/sign-module --kdir "$work/none" --key /nonexistent kernel/gdirect.ko 2>&1)
check "signing without sign-file: a clear error" has "$out" "scripts/sign-file"
# A key that does not match the certificate: sign-file fails, the module stays as it was.
openssl req -new -nodes -x509 -newkey rsa:2048 -days 1 -batch -subj "/CN=other" \
	-keyout "$work/other.pem" -out "$work/other.x509" >/dev/null 2>&1
out=$(scripts/sign-module --kdir "$kdir" --key "$work/other.pem" --cert "$kdir/certs/signing_key.x509" kernel/gdirect.ko 2>&1)
rc=$?
check "a key that does not match the certificate: an error, the module unchanged" \
	sh -c '[ "$0" -ne 0 ] && [ "$(sha256sum <kernel/gdirect.ko)" = "$1" ] && [ -z "$(ls kernel/gdirect.ko.* 2>/dev/null)" ]' "$rc" "$sum1"

# make with a key of one's own (a MOK), and the emulated GPU module signed the same way.
out=$(make -s modules SIGN_KEY="$work/other.pem" SIGN_CERT="$work/other.x509" 2>&1)
echo "$out" | sed 's/^/# /'
check "make SIGN_KEY=... signs with that key" test "$(modinfo -F signer kernel/gdirect.ko)" = other
make -s modules >/dev/null 2>&1
check "  and plain make signs with the test kernel's key again" test "$(modinfo -F signer kernel/gdirect.ko)" = "$signer"
make -s egpu 2>&1 | sed 's/^/# /'
check "make egpu builds the emulated GPU module, signed with the test kernel's key" \
	test "$(modinfo -F signer tests/egpu/gdirect_egpu.ko 2>/dev/null)" = "$signer"

# 4. DKMS in private trees (not the host's /usr/src, /var/lib/dkms or /lib/modules; DKMS finds
# no sign-file under /lib/modules/$release, so it makes no MOK and signs nothing).
if ! command -v dkms >/dev/null; then
	result 1 "dkms is installed (scripts/setup installs it)"
else
	d=$work/dkms
	mkdir -p "$d/tree" "$d/lib/modules/$release"
	make -s dkms-source DESTDIR="$d" >/dev/null
	version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"$/\1/p' "$d"/usr/src/gdirect-*/dkms.conf)
	trees=(--sourcetree "$d/usr/src" --dkmstree "$d/tree" --installtree "$d/lib/modules")
	check "dkms add" dkms add -m gdirect -v "$version" "${trees[@]}"
	out=$(dkms build -m gdirect -v "$version" -k "$release" --kernelsourcedir "$kdir" "${trees[@]}" 2>&1)
	rc=$?
	echo "$out" | tail -n 5 | sed 's/^/# /'
	check "dkms build for the test kernel" test $rc -eq 0
	out=$(dkms install -m gdirect -v "$version" -k "$release" --kernelsourcedir "$kdir" --no-depmod "${trees[@]}" 2>&1)
	ko=$(find "$d/lib/modules/$release" -name 'gdirect.ko*' | head -n 1)
	check "dkms install puts gdirect.ko for $release in the module tree" \
		test -n "$ko" -a "$(modinfo -F vermagic "$ko" 2>/dev/null | cut -d' ' -f1)" = "$release"
	out=$(dkms status "${trees[@]}" 2>&1)
	check "dkms status: installed" has "$out" "gdirect/$version, $release, x86_64: installed"
	dkms remove -m gdirect -v "$version" --all "${trees[@]}" >/dev/null 2>&1
	check "dkms remove takes it out of the module tree" test -z "$(find "$d/lib/modules" -name 'gdirect.ko*')"
	# A tree with CONFIG_RUST but no Rust metadata (a distribution's headers package).
	t=$(fixture dkms-normeta)
	rm "$t/rust/libkernel.rmeta"
	dkms add -m gdirect -v "$version" "${trees[@]}" >/dev/null 2>&1
	out=$(dkms build -m gdirect -v "$version" -k "$release" --kernelsourcedir "$t" "${trees[@]}" 2>&1)
	rc=$?
	echo "$out" | tail -n 3 | sed 's/^/# /'
	log=$(cat "$d/tree/gdirect/$version/build/make.log" 2>/dev/null)
	check "without Rust metadata: dkms build fails" \
		sh -c '[ "$0" -ne 0 ]' "$rc"
	check "  its make.log names what is missing and linux-lib-rust" \
		has "$log" "MISSING  Rust metadata" "rust/libkernel.rmeta" "linux-lib-rust-$release"
	t=$(fixture dkms-norust)
	sed -i 's/^CONFIG_RUST=y$/# CONFIG_RUST is not set/' "$t/.config"
	out=$(dkms build -m gdirect -v "$version" -k "$release" --kernelsourcedir "$t" --config "$t/.config" "${trees[@]}" 2>&1)
	rc=$?
	echo "$out" | tail -n 3 | sed 's/^/# /'
	check "without CONFIG_RUST: skipped by BUILD_EXCLUSIVE_CONFIG" has "$out" "BUILD_EXCLUSIVE"
	dkms remove -m gdirect -v "$version" --all "${trees[@]}" >/dev/null 2>&1
fi

echo "install: $pass passed, $fail failed"
[ $fail -eq 0 ]
