#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# /dev/gdirect is a misc character device with mode 0660 owned by root, and a
# user outside its group cannot open it.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() { _unload_module_if_ours; }
trap cleanup EXIT

_require_root
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"

ktap_print_header
ktap_set_plan 5

_test "/dev/gdirect is a character device" test -c "$GDIRECT_DEV"
_test "mode is 0660" _expect_eq mode 660 "$(stat -c %a "$GDIRECT_DEV")"
_test "owner is root:root" _expect_eq owner 0:0 "$(stat -c %u:%g "$GDIRECT_DEV")"
# A misc device: major 10, and the node's numbers are the ones the class registered.
node_numbers() { printf '%d:%d' 0x"$(stat -c %t "$GDIRECT_DEV")" 0x"$(stat -c %T "$GDIRECT_DEV")"; }
misc_numbers() {
	_expect_eq "major" 10 "$(cut -d: -f1 /sys/class/misc/gdirect/dev)" &&
		_expect_eq "major:minor" "$(cat /sys/class/misc/gdirect/dev)" "$(node_numbers)"
}
_test "misc major 10 with the class's minor" misc_numbers
# The mode is enforced: an unprivileged user is refused before the module sees the open.
grep -q '^nobody:' /etc/passwd 2>/dev/null || echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >>/etc/passwd
denied() {
	out=$(su nobody -s /bin/sh -c "gdirect info --json" 2>/dev/null)
	rc=$?
	[ $rc -ne 0 ] && _expect_eq "error kind" permission_denied "$(echo "$out" | jq -r .error.kind)"
}
_test "an unprivileged user gets permission_denied" denied

ktap_finished
