#!/bin/busybox sh
# SPDX-License-Identifier: GPL-2.0
#
# Run by the VM's /init after every selftest: finds what the test left behind,
# prints one line per finding ("leftover: ..."), and restores the clean state the
# next test expects, so that one test's failure cannot fail the tests after it.
#
# Usage: leftovers.sh KEEP_PID...   (processes of the runner itself, never killed)
# Exit status: 0 when nothing was left, 1 when something was (and was cleaned up).
#
# Checked, in order: processes (other than PID 1, KEEP_PIDs and this script's own);
# gdirect registrations or pinned bytes once no process holds the device, pages pinned by the
# kernel's own count and page tables the emulated GPU handed out and were not put; fault
# injection left switched on; mounts of test devices; NVMe-oF host controllers, nvmet
# subsystems and ports, soft-RoCE links, the RNICs' addresses and the veth pair; a slot left
# powered off; namespace 4's rate left changed; loop devices; the modules (unloaded, which
# fails if anything still holds them).

GDIRECT_LIB=${GDIRECT_LIB:-/selftests/lib}
. "$GDIRECT_LIB/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

found=0
left() {
	echo "leftover: $*"
	found=1
}

self=$$
keep=" 1 $self $* "
# User processes: everything with a command line but the runner's own, listed by one `ps`
# and read with shell builtins (a fork per process costs seconds on the debug kernel), into
# $plist. Kernel threads and zombies have no command line (ps shows their name in
# brackets); the runner's subshells are forks of PID 1, with its command line; `ps` is a
# child of this script (procs runs in this shell, never in a subshell).
plist=/tmp/.leftovers-procs
procs() {
	ps -o pid,ppid,args >/tmp/.leftovers-ps 2>/dev/null
	init_cmd=
	while read -r pid ppid cmd; do
		case "$pid" in '' | *[!0-9]*) continue ;; esac
		[ "$pid" = 1 ] && init_cmd=$cmd
		case "$keep" in *" $pid "*) continue ;; esac
		[ "$ppid" = "$self" ] && continue
		case "$cmd" in '' | '['*) continue ;; esac
		[ "$cmd" = "$init_cmd" ] || echo "$pid $cmd"
	done </tmp/.leftovers-ps >"$plist"
}
procs
if [ -s "$plist" ]; then
	left "processes still running: $(head -n 5 "$plist" | tr '\n' ';')"
	for pid in $(cut -d' ' -f1 "$plist"); do kill -9 "$pid" 2>/dev/null; done
	i=0
	procs
	while [ -s "$plist" ] && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
		procs
	done
	[ -s "$plist" ] && left "processes that survive SIGKILL: $(head -n 5 "$plist" | tr '\n' ';')"
fi

# With no process left, every registration is released: any that remains was lost.
if [ -d /sys/module/gdirect ] && [ -c /dev/gdirect ]; then
	counters=$(gdirect info --json 2>/dev/null | jq -r '"\(.counters.registrations) \(.counters.pinned_bytes)"')
	[ "$counters" = "0 0" ] || left "gdirect registrations and pinned bytes with no process left: ${counters:-unreadable}"
fi
# And every page is unpinned, by the kernel's own count (mm/gup.c), whatever the module's
# counters say (given 5 s to settle). A leak cannot be undone; the baseline moves past it so
# that the next test is judged on its own.
pins=$(_kernel_pins_settled)
if [ "$pins" != 0 ]; then
	left "$pins page(s) still pinned by the kernel's count (nr_foll_pin_acquired - released) with no process left"
	read -r base <"$GDIRECT_PIN_BASELINE"
	echo $((base + pins)) >"$GDIRECT_PIN_BASELINE"
fi
# The emulated GPU's page tables: with no process, none may be held (a put that never came).
held=$(_egpu_tables_held)
[ "$held" = 0 ] || left "the emulated GPU holds ${held:-?} page table(s) neither put nor revoked with no process left"

# Fault injection the test switched on stays on for the next one: switch it off.
for f in /sys/kernel/debug/fail_make_request /sys/kernel/debug/failslab /sys/kernel/debug/fail_page_alloc; do
	[ -f "$f/probability" ] || continue
	read -r v <"$f/probability"
	[ "$v" = 0 ] || { left "fault injection on: ${f##*/}"; echo 0 >"$f/probability"; }
done
for f in /sys/block/*/make-it-fail; do
	[ -f "$f" ] || continue
	read -r v <"$f"
	[ "$v" = 0 ] || { left "make-it-fail set: $f"; echo 0 >"$f"; }
done

# Mounts of anything but the runner's own file systems.
grep -E '^/dev/(nvme|loop)' /proc/mounts | while read -r dev mnt _; do
	echo "leftover: $dev mounted on $mnt"
	umount -l "$mnt"
done | grep . && found=1

# NVMe-oF: host controllers over a fabric, the target's configfs objects, rxe, veth.
for c in /sys/class/nvme/nvme*; do
	[ -f "$c/transport" ] || continue
	read -r t <"$c/transport"
	[ "$t" = pcie ] && continue
	left "NVMe-oF controller $(basename "$c") ($t) connected to $(cat "$c/subsysnqn")"
	nvme disconnect -d "$(basename "$c")" >/dev/null 2>&1
done
rnic_addrs=$(ip -4 addr show 2>/dev/null | grep -o "inet \($GDIRECT_RNIC_NEAR_ADDR\|$GDIRECT_RNIC_FAR_ADDR\)/" | tr '\n' ' ')
if [ -n "$(ls "$GDIRECT_NVMET/ports" 2>/dev/null)$(ls "$GDIRECT_NVMET/subsystems" 2>/dev/null)$rnic_addrs" ] ||
	[ -n "$(rdma link show 2>/dev/null)" ] || ip link show gdv0 >/dev/null 2>&1; then
	left "NVMe-oF target, soft-RoCE, RNIC addresses or veth: ports '$(ls "$GDIRECT_NVMET/ports" 2>/dev/null | tr '\n' ' ')' subsystems '$(ls "$GDIRECT_NVMET/subsystems" 2>/dev/null | tr '\n' ' ')' rdma '$(rdma link show 2>/dev/null | cut -d' ' -f2 | tr '\n' ' ')' addresses '$rnic_addrs'"
	_nvmeof_down >/dev/null 2>&1 || left "the NVMe-oF teardown did not finish"
fi

# A slot a test powered off (a surprise removal) and did not power again: powered, its dead
# function removed first, and the bus rescanned (gdirect_common.sh marks it).
for f in "$_GDIRECT_SLOT_OFF".*; do
	[ -e "$f" ] || continue
	left "the slot of ${f#"$_GDIRECT_SLOT_OFF".} left powered off"
	_slot_back "${f#"$_GDIRECT_SLOT_OFF".}" >/dev/null
done
# The throttled namespace left at a test's rate: the rig's restored.
if [ -e "$_GDIRECT_THROTTLED" ]; then
	left "namespace 4 of $GDIRECT_NVME0_SERIAL left at $(cat "$_GDIRECT_THROTTLED") bytes/s"
	_throttle_ns4 "$GDIRECT_NVME0_NS4_BPS" || left "its rate could not be restored"
fi

# Loop devices over files of the test: a bound one has a backing_file in sysfs (read with
# shell builtins: `losetup -a` took 1.7 to 3.2 s on the debug kernel, measured in the guest,
# after every test).
loops=
for f in /sys/block/loop*/loop/backing_file; do
	[ -f "$f" ] || continue
	l=${f#/sys/block/}
	l=/dev/${l%%/*}
	read -r b <"$f"
	loops="$loops$l: $b;"
	losetup -d "$l"
done
[ -z "$loops" ] || left "loop devices: $loops"

# The modules: unloaded for the next test, which loads them itself. A module that
# cannot be unloaded is held by something the test left.
for m in gdirect gdirect_egpu; do
	[ -d "/sys/module/$m" ] || continue
	rmmod "$m" 2>/dev/null || left "module $m cannot be unloaded (refcount $(cat /sys/module/$m/refcnt 2>/dev/null))"
done

exit $found
