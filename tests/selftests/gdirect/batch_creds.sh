#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A batch runs on the module's kernel workers, yet under the identity of the
# task that submitted it, exactly as that task's own write would:
#  - its credentials: a user's batch write to its setuid file clears the bit,
#    as the synchronous write does; root's keeps it (CAP_FSETID), both ways,
#    which shows the check tells the two apart;
#  - its RLIMIT_FSIZE: at the limit the write fails with EFBIG and SIGXFSZ goes
#    to the submitter (once: the batch's worker sends it, not the worker's own
#    limit), across it the write is cut at the limit, for the batch as for the
#    synchronous write; but never to a program the submitter exec'd since: writes
#    held behind a slow read (a null_blk device whose requests take 2 s, and the
#    module's per-user cap on bytes in flight), no signal yet 0.3 s after their
#    submit (the limit is checked after that wait), then the task execs: they are
#    cut at the limit, and no SIGXFSZ is pending in the new program, with the
#    signal blocked from before the submit (so one sent before the exec would be);
#  - its io cgroup: the bytes of a batch write submitted from a cgroup show in
#    that cgroup's io.stat for the drive.
# Every write is read back and compared by gdirect-io.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

mnt=/mnt/gdirect-creds
cg=
mounted_cg=
nullb=/sys/kernel/config/nullb/gdslow
cleanup() {
	[ -d "$nullb" ] && { echo 0 >"$nullb/power"; rmdir "$nullb"; } 2>/dev/null
	[ -n "$cg" ] && rmdir "$cg" 2>/dev/null
	[ -n "$mounted_cg" ] && umount "$mounted_cg" 2>/dev/null
	umount "$mnt" 2>/dev/null
	_unload_all
}
trap cleanup EXIT

_require_root
_fs_setup ext4 gdirect-io gdirect jq
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
_add_test_user
chgrp gdirect /dev/gdirect && chmod 0660 /dev/gdirect
K=1024 M=1048576

ktap_print_header
ktap_set_plan 25

_test "ext4 made on $FS_DEV and mounted" _fs_make ext4 "$FS_DEV" "$mnt"
mkdir -p "$mnt/u" && chown gduser:gduser "$mnt/u"

# Usage: suid_case WHO MODE: WHO (user or root) writes 64 KiB with MODE into a
# setuid file of the user's; prints the result and whether the bit is still set.
suid_case() {
	f=$mnt/u/suid-$1-$2
	_as_user "dd if=/dev/zero of=$f bs=64k count=2 2>/dev/null" && chmod 4755 "$f"
	case $1 in
	user) out=$(_as_user gdirect-io credwrite "$2" "$f" 0 $((64 * K))) ;;
	root) out=$(gdirect-io credwrite "$2" "$f" 0 $((64 * K))) ;;
	esac
	[ -u "$f" ] && echo "$(_kv "$out" result) setuid" || echo "$(_kv "$out" result) cleared"
}
for mode in sync batch; do
	_test "user, $mode write: whole, and the setuid bit cleared" \
		_expect_eq "result bit" "$((64 * K)) cleared" "$(suid_case user $mode)"
done
for mode in sync batch; do
	_test "root, $mode write: whole, and the setuid bit kept (CAP_FSETID)" \
		_expect_eq "result bit" "$((64 * K)) setuid" "$(suid_case root $mode)"
done

# The user's file size limit: 2048 blocks, read back in bytes from the limits the
# shell that runs the writes has (SIGXFSZ ignored there, so the writes return;
# gdirect-io counts it with a handler of its own).
f=$mnt/u/fsize
_as_user ": >$f"
out=$(_as_user "ulimit -f 2048; trap '' XFSZ
	lim=\$(sed -n 's/^Max file size *\([0-9]*\) .*/\1/p' /proc/self/limits)
	echo limit=\$lim
	for mode in sync batch; do
		echo \$mode-at=\$(gdirect-io credwrite \$mode $f \$lim $((64 * K)) | tr '\n' ' ')
		echo \$mode-across=\$(gdirect-io credwrite \$mode $f \$((lim - 16 * $K)) $((64 * K)) | tr '\n' ' ')
	done
	echo all-across=\$(gdirect-io credwrite all $f \$((lim - 16 * $K)) $((64 * K)) | tr '\n' ' ')
	echo append-across=\$(gdirect-io credwrite batch-append $f \$((lim - 16 * $K)) $((64 * K)) | tr '\n' ' ')
	echo size=\$(stat -c %s $f)")
ktap_print_msg "$(echo "$out" | tr '\n' ' ')"
lim=$(_kv "$out" limit)
_test "RLIMIT_FSIZE is set for the user's writes" sh -c "[ '${lim:-0}' -gt 0 ] && [ $((${lim:-0} % (4 * K))) -eq 0 ]"
for mode in sync batch; do
	_test "$mode write at the limit: EFBIG" _expect_eq "$mode-at" "errno=EFBIG" "$(_kv "$out" "$mode-at" | sed 's/ $//')"
	_test "$mode write at the limit: SIGXFSZ to the submitter, once" \
		_expect_eq "$mode-at sigxfsz" 1 "$(echo "$out" | sed -n "s/^$mode-at=.* sigxfsz=\([0-9]*\).*/\1/p")"
	_test "$mode write across the limit: cut at it (16 KiB)" \
		_expect_eq "$mode-across" "result=$((16 * K))" "$(_kv "$out" "$mode-across" | sed 's/ $//')"
done
# The limit where one of the module's 8 MiB chunks ends (root's writes: the user's locked
# memory limit holds less than a chunk): the write is cut there, as write() is, not failed
# with its first 8 MiB in the file, and no SIGXFSZ.
g=$mnt/u/fsize-chunk
: >"$g"
cout=$(sh -c "ulimit -f 32768; trap '' XFSZ
	lim=\$(sed -n 's/^Max file size *\([0-9]*\) .*/\1/p' /proc/self/limits)
	for mode in sync batch; do
		echo \$mode-chunk=\$(gdirect-io credwrite \$mode $g \$((lim - 8 * $M)) $((8 * M + 64 * K)) | tr '\n' ' ')
	done")
ktap_print_msg "$(echo "$cout" | tr '\n' ' ')"
for mode in sync batch; do
	_test "$mode write across the limit at a chunk's end: cut at it (8 MiB), no SIGXFSZ" \
		_expect_eq "$mode-chunk" "result=$((8 * M)) sigxfsz=0" \
		"$(echo "$cout" | sed -n "s/^$mode-chunk=//p" | sed 's/ $//')"
done
rm -f "$g"
# The library's write_all_from (what GPU writes through the module use): the write after the
# cut one fails, EFBIG at the limit, so a short write is never taken for a whole one.
all=$(echo "$out" | sed -n 's/^all-across=//p')
# A file open with O_APPEND is written where the transfer says, so the limit holds: were it
# appended at the file's end (the limit, by now), the worker's own unlimited RLIMIT_FSIZE
# would let it grow past the user's.
_test "batch write across the limit to an O_APPEND file: at its offset, cut at the limit" \
	_expect_eq "append-across size" "result=$((16 * K)) $lim" \
	"$(_kv "$out" append-across | sed 's/ $//') $(_kv "$out" size)"
_test "write_all_from across the limit: EFBIG where the limit stopped it, SIGXFSZ once" \
	_expect_eq "all-across" "stopped_at=$lim errno=EFBIG sigxfsz=1" \
	"$(echo "$all" | grep -o 'stopped_at=[0-9]*\|errno=[A-Z]*\|sigxfsz=[0-9]*' | tr '\n' ' ' | sed 's/ $//')"

# The limit through an exec. gdslow: a null_blk device whose every request takes
# 2 s (a timer completes it), the module reloaded so that one user may have 1 MiB
# of storage I/O running: the 1 MiB read of gdslow holds it all, and the writes
# queued behind it reach their file size check seconds after the exec.
mkdir "$nullb" && (cd "$nullb" && echo 64 >size && echo 4096 >blocksize &&
	echo 2 >irqmode && echo 2000000000 >completion_nsec && echo 1 >power)
_test "a null_blk device of 2 s requests for the holding read" [ -b /dev/gdslow ]
chgrp gdirect /dev/gdslow && chmod 0660 /dev/gdslow
_unload_all
insmod "$GDIRECT_MODULE" max_in_flight_bytes_per_user=1048576 || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
_GDIRECT_LOADED_HERE=1
chgrp gdirect /dev/gdirect && chmod 0660 /dev/gdirect
for mode in stay exec; do
	: >"$mnt/u/xfsz-$mode" && chown gduser:gduser "$mnt/u/xfsz-$mode"
	out=$(_as_user "ulimit -f 2048; gdirect-io xfsz-exec $mode /dev/gdslow $mnt/u/xfsz-$mode $lim")
	ktap_print_msg "$mode: $(echo "$out" | tr '\n' ' ')"
	eval "xfsz_$mode=\$out"
done
_test "the writes were held: 0.3 s after their submit, no SIGXFSZ yet (both runs)" \
	_expect_eq "pending_before" "false false" \
	"$(_kv "$xfsz_stay" pending_before) $(_kv "$xfsz_exec" pending_before)"
_test "held writes, no exec: the one across the limit cut at it (16 KiB written)" \
	_expect_eq "completions size cut_written" "3 $lim true" \
	"$(_kv "$xfsz_stay" completions) $(_kv "$xfsz_stay" size) $(_kv "$xfsz_stay" cut_written)"
_test "held writes, no exec: SIGXFSZ pending for the submitter" \
	_expect_eq "sigxfsz_pending" true "$(_kv "$xfsz_stay" sigxfsz_pending)"
_test "held writes past an exec: the one across the limit cut at it (16 KiB written)" \
	_expect_eq "completions size cut_written" "3 $lim true" \
	"$(_kv "$xfsz_exec" completions) $(_kv "$xfsz_exec" size) $(_kv "$xfsz_exec" cut_written)"
_test "held writes past an exec: no SIGXFSZ for the program exec'd since" \
	_expect_eq "sigxfsz_pending" false "$(_kv "$xfsz_exec" sigxfsz_pending)"
_test "gdirect-io found nothing wrong in either run" \
	sh -c "! echo '$xfsz_stay $xfsz_exec' | grep -q FAIL"

# The io cgroup: a batch write of 4 MiB submitted from a child cgroup.
if ! grep -q '^cgroup2 /sys/fs/cgroup ' /proc/mounts; then
	mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && mounted_cg=/sys/fs/cgroup
fi
echo +io >/sys/fs/cgroup/cgroup.subtree_control
cg=/sys/fs/cgroup/gdirect-batch
mkdir -p "$cg"
majmin=$(cat "/sys/class/block/$(basename "$FS_DEV")/dev")
: >"$mnt/blkcg"
out=$(sh -c "echo \$\$ >$cg/cgroup.procs && exec gdirect-io credwrite batch $mnt/blkcg 0 $((4096 * K))")
wbytes=$(sed -n "s/^$majmin .*wbytes=\([0-9]*\).*/\1/p" "$cg/io.stat")
ktap_print_msg "batch write from $cg: $out; its io.stat for $majmin: wbytes=${wbytes:-none}"
_test "a batch write's bytes are charged to the submitter's io cgroup" \
	sh -c "[ '$(_kv "$out" result)' = $((4096 * K)) ] && [ '${wbytes:-0}' -ge $((4096 * K)) ]"

_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
