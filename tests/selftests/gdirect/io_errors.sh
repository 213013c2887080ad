#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Every kind of bad transfer gets its documented errno (include/uapi/linux/
# gdirect.h): a file without O_DIRECT, misaligned offsets and lengths, a buffer
# range past the registration, a closed fd, a read-only fd written to, an fd of
# the access mode 3 (ioctls only) read or written, a file
# not on a block device, an unknown handle, a revoked registration, a bad batch
# entry (refused with its index) - and nothing is logged or left pinned.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"
n0=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"

CASES="
read_ok OK
not_o_direct EBADFD
misaligned_file_offset ERANGE
misaligned_length ERANGE
misaligned_buf_offset ERANGE
buf_out_of_range EOVERFLOW
buf_overflow EOVERFLOW
zero_length EINVAL
unknown_flags EINVAL
write_on_read_only EBADF
mode3_read EBADF
mode3_write EBADF
closed_fd EBADF
not_block_backed ENOTBLK
unknown_handle ENOENT
revoked EKEYREVOKED
batch_bad_op EINVAL@1
batch_good_entry_completed 1
batch_entry_fault EFAULT@1
batch_entry_fault_completed 1
"

ktap_print_header
ktap_set_plan $(($(echo "$CASES" | grep -c .) + 2))

_dmesg_mark
out=$(gdirect-io errors "$n0")
while read -r case want; do
	[ -n "$case" ] || continue
	_test "$case -> $want" _expect_eq "$case" "$want" "$(_kv "$out" "$case")"
done <<CASES_END
$CASES
CASES_END
_test "nothing is left registered" \
	_expect_unpinned
quiet() { ! _dmesg_since_mark | grep -E 'gdirect|BUG|WARNING|Oops'; }
_test "no kernel log lines from the bad transfers" quiet

ktap_finished
