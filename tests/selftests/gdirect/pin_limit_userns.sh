#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Subordinate uids share the per-user limit of the user that maps them (loaded
# with max_pinned_bytes_per_user=32M): gduser (uid 1000) makes a user namespace
# whose uids 0-65535 root maps to 100000.. (as newuidmap maps /etc/subuid for
# a container). Its uid 0 (kernel uid 100000) registers 24 MiB of GPU memory
# and holds it; meanwhile
#  - its uid 1 (kernel uid 100001, another uid to the kernel) asks for 24 MiB
#    and gets EDQUOT: gduser, the namespace's owner, has 24 MiB charged already;
#  - gduser itself asks for 12 MiB: EDQUOT too;
#  - root, another user, registers 24 MiB;
# and once the namespace's processes are gone, gduser's 24 MiB fits. A limit
# keyed on the kernel uid alone gives each of a container's 65536 uids a limit
# of its own: then uid 1 and gduser are let through.
#
# Then the same with a namespace that root makes (as a container runtime does,
# its uids mapped to 200000..): its uids share one account, the namespace's,
# so its uid 1 is refused again; but root, who made it, is not charged for it,
# and registers 12 MiB and then 24 MiB meanwhile. Were the namespace charged to
# root, one container would hold root and every other root-made container at
# EDQUOT.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-reg
_unload_all
insmod "$GDIRECT_MODULE" max_pinned_bytes_per_user=33554432 ||
	ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with max_pinned_bytes_per_user=32M"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
_add_test_user
# The namespace's uids are neither the nodes' owner nor in their group.
chmod 0666 /dev/gdirect /dev/gdirect_egpu

M=1048576
ktap_print_header
ktap_set_plan 11

out=$(gdirect-reg userns-share 1000 100000 $((24 * M)) 2>&1)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "the namespace's uid 0 (kernel uid 100000) registers 24 MiB" _expect_eq register OK "$(_kv "$out" ns_uid0)"
_test "its uid 1 (kernel uid 100001) is refused 24 MiB more of gduser's 32 (EDQUOT)" \
	_expect_eq register EDQUOT "$(_kv "$out" ns_uid1)"
_test "gduser itself is refused 12 MiB meanwhile (EDQUOT)" _expect_eq register EDQUOT "$(_kv "$out" owner)"
_test "root, another user, registers 24 MiB meanwhile" _expect_eq register OK "$(_kv "$out" root)"
_test "the namespace gone, gduser's 24 MiB fits" _expect_eq register OK "$(_kv "$out" owner_after)"

out=$(gdirect-reg userns-share 0 200000 $((24 * M)) 2>&1)
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "root's namespace: its uid 0 (kernel uid 200000) registers 24 MiB" \
	_expect_eq register OK "$(_kv "$out" ns_uid0)"
_test "root's namespace: its uid 1 is refused 24 MiB more of the namespace's 32 (EDQUOT)" \
	_expect_eq register EDQUOT "$(_kv "$out" ns_uid1)"
_test "root, who made it, registers 12 MiB meanwhile: not charged for the namespace" \
	_expect_eq register OK "$(_kv "$out" owner)"
_test "root registers 24 MiB meanwhile" _expect_eq register OK "$(_kv "$out" root)"
_test "root's namespace gone, root's 24 MiB fits" _expect_eq register OK "$(_kv "$out" owner_after)"
_test "nothing stays registered or pinned" _expect_unpinned

ktap_finished
