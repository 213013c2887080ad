#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Every kind of malformed ioctl gets its documented errno (ENOTTY, EINVAL,
# EFAULT), a good one still works afterwards, and the kernel log stays quiet.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() { _unload_module_if_ours; }
trap cleanup EXIT

_require_root
_require_cmd gdirect-ioctl
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"

CASES="
get-info OK
bad-type ENOTTY
bad-nr ENOTTY
bad-size EINVAL
big-size EINVAL
bad-dir EINVAL
null-ptr EFAULT
unmapped-ptr EFAULT
straddle-ptr EFAULT
readonly-ptr EFAULT
kernel-ptr EFAULT
flags EINVAL
flags-high EINVAL
pad EINVAL
reserved-0 EINVAL
reserved-1 EINVAL
peer-self OK
peer-flags EINVAL
peer-reserved EINVAL
peer-nodev ENODEV
peer-bdf-range ENODEV
stats OK
stats-v1-flags EINVAL
stats-mid-size EINVAL
"

ktap_print_header
ktap_set_plan $(($(echo "$CASES" | grep -c .) + 3))

_dmesg_mark
while read -r case want; do
	[ -n "$case" ] || continue
	got=$(gdirect-ioctl "$case" | tail -n 1)
	if [ "$got" = "$want" ]; then
		ktap_test_pass "$case -> $want"
	else
		ktap_test_fail "$case -> $want (got $got)"
	fi
done <<CASES_END
$CASES
CASES_END

info=$(gdirect-ioctl get-info | sed -n 1p)
ktap_print_msg "$info"
_test "GET_INFO still answers ABI version 1 after the bad calls" _expect_eq abi "abi_version=1" "$(echo "$info" | cut -d' ' -f1)"
# host and p2pdma; not nvidia, whose driver (nvidia.ko or the emulated GPU) is not loaded.
_test "the module reports exactly the providers it has" _expect_eq providers "providers=0x5" "$(echo "$info" | cut -d' ' -f2)"
quiet() { ! _dmesg_since_mark | grep -iE 'gdirect|BUG|WARNING|Oops'; }
_test "no kernel log lines from the bad calls" quiet

ktap_finished
