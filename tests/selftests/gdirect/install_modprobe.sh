#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# gdirect installed as an administrator installs a driver (`make install`, which runs
# scripts/install-module), in the guest's own module tree, with udev running:
#  - the group `gdirect` is created, the module lands in /lib/modules/R/extra and in
#    depmod's index, and the modprobe options file documents every parameter the module has;
#  - `modprobe gdirect` loads it (signed: the kernel enforces signatures) with the options
#    of that file, and udev gives /dev/gdirect the group gdirect and mode 0660;
#  - a member of the group reads a file into registered memory without root, exact to the
#    byte; a user outside the group is refused;
#  - the uninstall removes exactly what the install added: the tree, /etc and the group
#    are as before.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

release=$(uname -r)
work=/tmp/install_modprobe.$$
udevd_pid=
cleanup() {
	_module_loaded && rmmod gdirect
	[ -f /var/lib/gdirect/installed ] && install-module uninstall >/dev/null 2>&1
	# (only DKMS's directory: updates/ also holds the rig's soft-RoCE, tests/rxe)
	rm -rf "/lib/modules/$release/updates/dkms" /etc/modprobe.d/gdirect.conf
	[ -n "$udevd_pid" ] && kill "$udevd_pid" 2>/dev/null && wait "$udevd_pid" 2>/dev/null
	[ -n "${ns_mode:-}" ] && chmod "$ns_mode" "$ns"
	[ -f "$work/group" ] && cp "$work/group" /etc/group
	[ -f "$work/passwd" ] && cp "$work/passwd" /etc/passwd
	rm -rf "$work" /run/udev
}
trap cleanup EXIT

_require_root
_module_loaded && ktap_exit_fail_msg "gdirect is already loaded before the test"
for c in modprobe depmod modinfo udevadm install-module /usr/lib/systemd/systemd-udevd; do
	command -v "$c" >/dev/null 2>&1 || ktap_exit_fail_msg "the rig lacks $c"
done
mkdir -p "$work"
touch /etc/group /etc/passwd
# The test user, outside the group gdirect (which other tests may have made: removed, so
# that the install creates it).
_add_test_user
sed -i '/^gdirect:/d' /etc/group
grep -qs '^gdother:' /etc/passwd || echo 'gdother:x:1001:1001:gdother:/:/bin/sh' >>/etc/passwd
grep -qs '^gdother:' /etc/group || echo 'gdother:x:1001:' >>/etc/group
cp /etc/group "$work/group"
cp /etc/passwd "$work/passwd"
# What the install may touch, as it was.
# (/etc/group is compared by content; groupadd leaves a backup, /etc/group-, and its lock
# file, /etc/.pwd.lock, as it does on any system.)
snapshot() {
	find /lib/modules /etc /var -xdev 2>/dev/null |
		grep -v -e '^/etc/\(group\|passwd\|gshadow\)-\{0,1\}$' -e '^/etc/\.pwd\.lock$' | sort
}
snapshot >"$work/before"

ktap_print_header
ktap_set_plan 20

# udevd, as a distribution starts it (initramfs-tools: --daemon; here in the foreground of
# a background job, so that the test can stop it).
/usr/lib/systemd/systemd-udevd --resolve-names=late >"$work/udevd.log" 2>&1 &
udevd_pid=$!
i=0
while [ ! -S /run/udev/control ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
_test "udevd runs" test -S /run/udev/control

out=$(install-module install --module "$GDIRECT_MODULE" 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "install succeeds" test $rc -eq 0
_test "the group gdirect is created" grep -q '^gdirect:' /etc/group
_test "the module is in /lib/modules/$release/extra" cmp -s "$GDIRECT_MODULE" "/lib/modules/$release/extra/gdirect.ko"
_test "depmod indexed it (modules.dep)" grep -q '^extra/gdirect.ko:' "/lib/modules/$release/modules.dep"
documented() {
	n=0
	for p in $(modinfo -F parm "$GDIRECT_MODULE" | cut -d: -f1); do
		grep -q "^#options gdirect $p=[0-9]" /etc/modprobe.d/gdirect.conf || { ktap_print_msg "undocumented: $p"; return 1; }
		n=$((n + 1))
	done
	ktap_print_msg "$n parameters documented"
	[ $n -ge 5 ]
}
_test "the options file documents every module parameter" documented

# An administrator's setting, as the file says to make one.
sed -i 's/^#options gdirect max_registrations=.*/options gdirect max_registrations=4242/' /etc/modprobe.d/gdirect.conf
_test "modprobe gdirect loads it" modprobe gdirect
udevadm settle -t 30
limit=$(gdirect info --json 2>/dev/null | jq -r .limits.max_registrations)
_test "with the option of /etc/modprobe.d/gdirect.conf (max_registrations=$limit)" _expect_eq max_registrations 4242 "$limit"
owner=$(stat -c '%G %a' /dev/gdirect)
# systemd-udevd (v252) drops a control message whose credentials it cannot read ("Invalid
# sender uid 65534, ignoring message": seen once in many runs on the TCG rig), and then the
# install's reload of the rules never happened. That is udevd's loss, not the install's: the
# reload is asked again, once, and said; the node must then be right.
if [ "$owner" != "gdirect 660" ] && grep -q 'ignoring message' "$work/udevd.log"; then
	ktap_print_msg "udevd dropped a control message ($(grep 'ignoring message' "$work/udevd.log" | head -1)): reload asked again"
	udevadm control --reload-rules && udevadm trigger --action=add /sys/class/misc/gdirect && udevadm settle -t 30
	owner=$(stat -c '%G %a' /dev/gdirect)
fi
_test "udev gave /dev/gdirect group gdirect, mode 660 ($owner)" _expect_eq node "gdirect 660" "$owner"
if [ "$owner" != "gdirect 660" ]; then
	ktap_print_msg "node gid $(stat -c %g /dev/gdirect); /etc/group has: $(grep '^gdirect:' /etc/group)"
	sed 's/^/# udevd: /' "$work/udevd.log"
fi

# The data namespace, readable by the test user for this check only (as permissions.sh does).
ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
ns_mode=$(stat -c %a "$ns")
chmod o+r "$ns"
sed -i 's/^\(gdirect:x:[0-9]*:\)$/\1gduser/' /etc/group
reads() {
	_as_user gdirect read "$ns" --mem host --offset 100M --len 1M --poison 7 --verify --json >"$work/read.json" 2>&1
}
_test "a member of the group reads, exact (gdirect read --verify)" reads
ktap_print_msg "$(head -c 300 "$work/read.json")"
outsider() {
	out=$(su gdother -s /bin/sh -c "gdirect info --json" 2>/dev/null)
	[ "$(echo "$out" | jq -r .error.kind)" = permission_denied ]
}
_test "a user outside the group is refused (permission_denied)" outsider
chmod "$ns_mode" "$ns"
ns_mode=

_test "modprobe -r gdirect unloads it" modprobe -r gdirect
out=$(install-module uninstall 2>&1)
rc=$?
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
_test "uninstall succeeds" test $rc -eq 0
_test "the group is removed" sh -c '! grep -q "^gdirect:" /etc/group'
unindexed() { [ -f "/lib/modules/$release/modules.dep" ] && ! grep -q gdirect "/lib/modules/$release/modules.dep"; }
_test "depmod's index is rebuilt without gdirect" unindexed
kept() { grep -qx 'options gdirect max_registrations=4242' /etc/modprobe.d/gdirect.conf && echo "$out" | grep -q 'keeping /etc/modprobe.d/gdirect.conf: edited'; }
_test "the edited options file is kept, and uninstall says so" kept
rm -f /etc/modprobe.d/gdirect.conf
rmdir /etc/modprobe.d 2>/dev/null
snapshot >"$work/after"
same() {
	d=$(diff "$work/before" "$work/after") && return 0
	echo "$d" | sed 's/^/# /'
	return 1
}
_test "the module tree, /etc and /var are as before the install" same
cp "$work/group" "$work/group.want"
sed -i '/^gdirect:/d' "$work/group.want"
_test "/etc/group is as before" cmp -s /etc/group "$work/group.want"

# A module DKMS installed (updates/dkms): --no-module adds the rule, the options file (from
# that module's parameters) and the group, and its uninstall leaves DKMS's module alone.
mkdir -p "/lib/modules/$release/updates/dkms"
cp "$GDIRECT_MODULE" "/lib/modules/$release/updates/dkms/gdirect.ko"
depmod "$release"
install-module install --no-module >/dev/null 2>&1
nomod() {
	[ -f /etc/udev/rules.d/70-gdirect.rules ] && grep -q '^#options gdirect max_in_flight=128$' /etc/modprobe.d/gdirect.conf &&
		grep -q '^gdirect:' /etc/group && [ ! -e "/lib/modules/$release/extra/gdirect.ko" ]
}
_test "--no-module (DKMS's module): rule, options file and group, no second module" nomod
install-module uninstall >/dev/null 2>&1
dkms_kept() {
	[ -f "/lib/modules/$release/updates/dkms/gdirect.ko" ] && [ ! -e /etc/udev/rules.d/70-gdirect.rules ] &&
		[ ! -e /etc/modprobe.d/gdirect.conf ] && ! grep -q '^gdirect:' /etc/group
}
_test "  its uninstall takes them back and leaves DKMS's module" dkms_kept
rm -rf "/lib/modules/$release/updates/dkms"
depmod "$release"

ktap_finished
