#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Limits per user, and the memory a user's calls cost charged to that user.
# Loaded with max_pinned_bytes_per_user=32M:
#  - a user holding 24 MiB of GPU memory in one process gets EDQUOT for 16 MiB
#    more in another (the library's error names the per-user limit), and
#    8 MiB still fits; GET_INFO reports the user's pinned bytes;
#  - meanwhile another user (root) pins its own 32 MiB: one user's pins do not
#    take what others may pin;
#  - when the holder exits, the user's count is back to 0 and 32 MiB fits;
#  - the account is the opener's: a process that opened the device as root
#    and became the user since registers through that file on root's account;
#  - the kernel memory of registrations (the page arrays: 8 bytes a page) is
#    charged to the registering process's memory cgroup (GFP_KERNEL_ACCOUNT).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cg=
mounted_cg=
holder=
cleanup() {
	if [ -n "$holder" ]; then
		kill $(sed -n 's/^ready pid=//p' /tmp/lpu.hold) "$holder" 2>/dev/null
		wait "$holder" 2>/dev/null
	fi
	[ -n "$cg" ] && rmdir "$cg" 2>/dev/null
	[ -n "$mounted_cg" ] && umount "$mounted_cg" 2>/dev/null
	rm -f /tmp/lpu.hold
	_unload_all
}
trap cleanup EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
M=1048576
_unload_all
insmod "$GDIRECT_MODULE" max_pinned_bytes_per_user=$((32 * M)) ||
	ktap_exit_fail_msg "cannot load $GDIRECT_MODULE with max_pinned_bytes_per_user"
_egpu_insmod || ktap_exit_fail_msg "cannot load $GDIRECT_EGPU_MODULE"
_add_test_user
chgrp gdirect /dev/gdirect /dev/gdirect_egpu && chmod 0660 /dev/gdirect_egpu

ktap_print_header
ktap_set_plan 12

_test "GET_INFO reports the limit" _expect_eq max_pinned_bytes_per_user $((32 * M)) \
	"$(_info .limits.max_pinned_bytes_per_user)"

# The holder: the user's 24 MiB of GPU memory, kept registered until killed.
_as_user "exec gdirect-reg pin egpu $((24 * M)) hold" >/tmp/lpu.hold 2>&1 &
holder=$!
i=0
while ! grep -q '^ready' /tmp/lpu.hold && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
hold=$(cat /tmp/lpu.hold)
ktap_print_msg "holder: $(echo "$hold" | tr '\n' ' ')"
_test "the user's holder pins 24 MiB: its user has 24 MiB pinned" \
	_expect_eq "register user_pinned_bytes" "OK $((24 * M))" "$(_kv "$hold" register) $(_kv "$hold" user_pinned_bytes)"

over=$(_as_user gdirect-reg pin egpu $((16 * M)))
ktap_print_msg "16 MiB more: $over"
names_user_limit() { _kv "$over" error | grep -q '_max_pinned_bytes_per_user_limit_'; }
_test "16 MiB more by another process of the user: EDQUOT" _expect_eq register EDQUOT "$(_kv "$over" register)"
_test "the library's error names the per-user limit" names_user_limit
fits=$(_as_user gdirect-reg pin egpu $((8 * M)))
_test "8 MiB more still fits (32 MiB in all)" \
	_expect_eq "register user_pinned_bytes" "OK $((32 * M))" "$(_kv "$fits" register) $(_kv "$fits" user_pinned_bytes)"
root=$(gdirect-reg pin egpu $((32 * M)))
_test "root, another user, pins its own 32 MiB meanwhile" \
	_expect_eq "register user_pinned_bytes" "OK $((32 * M))" "$(_kv "$root" register) $(_kv "$root" user_pinned_bytes)"
_test "gdirect info as the user shows its 24 MiB" _expect_eq user_pinned_bytes $((24 * M)) \
	"$(_as_user gdirect info --json | jq -r .counters.user_pinned_bytes)"

# The holder's own pid (su may run it as a child).
kill "$(_kv "$hold" pid)"
i=0
while [ "$(_as_user gdirect info --json | jq -r .counters.user_pinned_bytes)" != 0 ] && [ $i -lt 50 ]; do
	sleep 0.1
	i=$((i + 1))
done
wait "$holder" 2>/dev/null
holder=
_test "the holder gone, the user has nothing pinned" _expect_eq user_pinned_bytes 0 \
	"$(_as_user gdirect info --json | jq -r .counters.user_pinned_bytes)"
again=$(_as_user gdirect-reg pin egpu $((32 * M)))
_test "and the whole 32 MiB fits again" _expect_eq register OK "$(_kv "$again" register)"

# The opener's account: a file opened as root, used after the process became the user.
oc=$(gdirect-reg opener-charge 1000 990 $((16 * M)) 2>&1)
ktap_print_msg "opener-charge: $oc"
_test "a registration through a file opened as root, made after the process became uid 1000, counts against root (the opener), not uid 1000" \
	_expect_eq "uid, register, opener's bytes, uid 1000's bytes" "1000 OK $((16 * M)) 0" \
	"$(_kv "$oc" uid) $(_kv "$oc" register) $(_kv "$oc" opener_file_user_pinned_bytes) $(_kv "$oc" own_file_user_pinned_bytes)"

# Memory cgroup: 8 registrations of one 256 MiB host buffer from a child cgroup
# make 4 MiB of page arrays; its `kernel` bytes must grow by them (less the up
# to 64 pages per CPU that the cgroup's counters may lag). Default limits.
_unload_all
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
if ! grep -q '^cgroup2 /sys/fs/cgroup ' /proc/mounts; then
	mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && mounted_cg=/sys/fs/cgroup
fi
echo +memory >/sys/fs/cgroup/cgroup.subtree_control
cg=/sys/fs/cgroup/gdirect-memcg
mkdir -p "$cg"
mc=$(sh -c "echo \$\$ >$cg/cgroup.procs && exec gdirect-reg memcg $((256 * M)) 8")
ktap_print_msg "memcg: $mc"
grew=$(($(_kv "$mc" kernel_after) - $(_kv "$mc" kernel_before)))
arrays=$(_kv "$mc" page_arrays)
_test "the page arrays are charged to the caller's memory cgroup" \
	sh -c "[ $grew -ge $((arrays - 512 * 1024)) ]"

_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
