#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Every kind of bad REGISTER, UNREGISTER and QUERY gets its own documented errno
# (include/uapi/linux/gdirect.h), the limits (module parameters) are enforced
# and reported, and nothing stays pinned or logged afterwards.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

CASES="
zero_length EINVAL
unaligned_address ERANGE
unaligned_length ERANGE
nvidia_unaligned_address ERANGE
overflow EOVERFLOW
unknown_provider EPROTONOSUPPORT
unknown_flags EINVAL
persistent_not_nvidia EINVAL
reserved EINVAL
host_unmapped ENXIO
host_on_p2pmem ENXIO
p2pdma_on_host ENXIO
nvidia_unallocated ENXIO
register_ok OK
other_file_handle EPERM
never_made_handle ENOENT
unregister_ok OK
double_unregister ESTALE
query_ok OK
query_no_such_peer ENODEV
query_flags EINVAL
query_bad_pointer EFAULT
unregister_ok2 OK
"
ncases=$(echo "$CASES" | grep -c .)

ktap_print_header
ktap_set_plan $((ncases + 7))

_dmesg_mark
out=$(gdirect-reg errors "$nvme0" "$nvme0")
while read -r case want; do
	[ -n "$case" ] || continue
	_test "$case -> $want" _expect_eq "$case" "$want" "$(_kv "$out" "$case")"
done <<CASES_END
$CASES
CASES_END
_test "nothing is left registered" \
	_expect_unpinned
quiet() { ! _dmesg_since_mark | grep -E 'gdirect|BUG|WARNING|Oops'; }
_test "no kernel log lines from the bad calls" quiet

# The limits, with small values set at load.
rmmod gdirect && insmod "$GDIRECT_MODULE" max_pinned_bytes=1048576 max_registrations=4
_test "GET_INFO reports the limits set at load" \
	_expect_eq limits "1048576 4" "$(_info .limits.max_pinned_bytes) $(_info .limits.max_registrations)"
lim=$(gdirect-reg limits)
ktap_print_msg "$(echo "$lim" | tr '\n' ' ')"
_test "a length of exactly max_pinned_bytes is accepted" _expect_eq at_pin_limit OK "$(_kv "$lim" at_pin_limit)"
_test "a length past max_pinned_bytes -> EDQUOT" _expect_eq over_pin_limit EDQUOT "$(_kv "$lim" over_pin_limit)"
_test "a registration past max_registrations -> EMFILE" \
	_expect_eq "registered, then" "4 EMFILE" "$(_kv "$lim" registered) $(_kv "$lim" over_registration_limit)"
_test "and nothing stays pinned" _expect_unpinned

ktap_finished
