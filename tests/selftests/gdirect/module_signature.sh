#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The rig's kernel enforces module signatures (module.sig_enforce=1, as distribution kernels
# with Secure Boot do), and gdirect.ko is signed with the key its build trusts (`make` with
# SIGN_KEY; scripts/vm). The kernel refuses, with EKEYREJECTED ("Key was rejected by service")
# and its own log line (kernel/module/signing.c):
#  - the module without its signature ("Loading of unsigned module is rejected"): stripped
#    here by scripts/sign-module --strip, and checked byte for byte against the module as
#    built, before signing;
#  - the module signed by a key the kernel does not trust ("... module with unavailable key
#    is rejected");
#  - the signed module with one byte changed (the signature no longer matches).
# The signed module loads, and names its signer (the test key's name in x509.genkey).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

work=/tmp/module_signature.$$
cleanup() {
	_module_loaded && rmmod gdirect
	rm -rf "$work"
}
trap cleanup EXIT

_require_root
_module_loaded && ktap_exit_fail_msg "gdirect is already loaded before the test"
for v in GDIRECT_MODULE_UNSIGNED_SHA256 GDIRECT_MODULE_SIGNER GDIRECT_MODULE_UNTRUSTED; do
	eval "[ -n \"\${$v:-}\" ]" || ktap_exit_fail_msg "the rig sets no $v"
done
mkdir -p "$work"

ktap_print_header
ktap_set_plan 13

enforced=$(cat /sys/module/module/parameters/sig_enforce 2>/dev/null)
_test "signatures are enforced (sig_enforce=$enforced)" _expect_eq sig_enforce Y "$enforced"

# insmod's error and the kernel's log line for module $1; the module must stay unloaded.
refused() {
	_dmesg_mark
	err=$(insmod "$1" 2>&1) && { rmmod gdirect; return 1; }
	ktap_print_msg "insmod: $err"
	! _module_loaded
}
logged() { _dmesg_since_mark | grep -q "$1"; }
rejected_errno() { echo "$err" | grep -q 'Key was rejected by service'; }

cp "$GDIRECT_MODULE" "$work/unsigned.ko"
sign-module --strip "$work/unsigned.ko"
unsigned_sha=$(sha256sum "$work/unsigned.ko" | cut -d' ' -f1)
_test "the stripped module is the module as built, before signing" \
	_expect_eq sha256 "$GDIRECT_MODULE_UNSIGNED_SHA256" "$unsigned_sha"
_test "unsigned: refused" refused "$work/unsigned.ko"
_test "unsigned: EKEYREJECTED" rejected_errno
_test "unsigned: the kernel logs 'Loading of unsigned module is rejected'" \
	logged 'Loading of unsigned module is rejected'

_test "signed by an untrusted key: refused" refused "$GDIRECT_MODULE_UNTRUSTED"
_test "untrusted key: EKEYREJECTED" rejected_errno
_test "untrusted key: the kernel logs 'Loading of module with unavailable key is rejected'" \
	logged 'Loading of module with unavailable key is rejected'

# One byte of the module's code changed, far from the signature at its end.
cp "$GDIRECT_MODULE" "$work/tampered.ko"
byte=$(dd if="$work/tampered.ko" bs=1 skip=4096 count=1 status=none | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$work/tampered.ko" bs=1 seek=4096 conv=notrunc status=none
differs() { ! cmp -s "$GDIRECT_MODULE" "$work/tampered.ko" && [ "$(wc -c <"$GDIRECT_MODULE")" -eq "$(wc -c <"$work/tampered.ko")" ]; }
_test "tampered: the copy differs from the signed module" differs
_test "tampered: refused" refused "$work/tampered.ko"
_test "tampered: EKEYREJECTED" rejected_errno

_test "signed: loads" insmod "$GDIRECT_MODULE"
signer=$(modinfo -F signer "$GDIRECT_MODULE")
_test "signed: by '$signer'" _expect_eq signer "$GDIRECT_MODULE_SIGNER" "$signer"

ktap_finished
