#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A process exits with 128 batched reads of 2 MiB queued (from the namespace QEMU
# throttles to 32 MB/s: 8 s of I/O) into GPU memory it keeps: its device file
# closes with the reads in flight. Each queued transfer holds the module, so
# rmmod is refused (busy) until they are done, by the kernel's own reference
# count (/sys/module/gdirect/refcnt), not the module's word. The registration
# the reads held ends on the module's worker, which cannot hand the GPU pages
# back for the process (nv-p2p finds them only from the pinner): it is left to
# the GPU driver, with a reference of its own, and rmmod stays refused until the
# memory is freed and the free callback has run (the emulated GPU's count).
# Then the module unloads, and the emulated GPU holds no page table of it, so a
# later free cannot call into unloaded code. Without the transfers' references,
# rmmod succeeded with the reads queued, and the free afterwards ran the
# callback in freed module text.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io gdirect-reg
_load_all || ktap_exit_fail_msg "cannot load the modules"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 9

refcnt() { cat /sys/module/gdirect/refcnt 2>/dev/null || echo unloaded; }
# Tries rmmod; prints ok or refused (and why).
try_rmmod() {
	if err=$(rmmod gdirect 2>&1); then echo ok; else echo "refused: $err"; fi
}
# $1 (a try_rmmod outcome) is delete_module's refusal of a module in use (EWOULDBLOCK, not
# EBUSY: that is for one already going), and the module is loaded.
refused_busy() {
	case "$1" in
	refused*"temporarily unavailable"*) _module_loaded ;; # EWOULDBLOCK: in use
	*) false ;;
	esac
}
# No process has /dev/gdirect open, and the module's refcnt is above 1.
held_without_files() {
	! ls -l /proc/[0-9]*/fd 2>/dev/null | grep -q ' /dev/gdirect$' && [ "$1" -gt 1 ] 2>/dev/null
}

out=$(gdirect-io queue-exit "$slow" 128 2>&1)
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
va=$(_kv "$out" va)
queued_refs=$(refcnt)
first=$(try_rmmod)
ktap_print_msg "right after the exit: refcnt $queued_refs, rmmod $first"
_test "128 reads queued, then the process exited without reaping" \
	_expect_eq submitted 128 "$(_kv "$out" submitted)"
_test "no file of the device is open, and the queued reads hold the module (refcnt > 1)" \
	held_without_files "$queued_refs"
_test "rmmod is refused while they are queued, busy" \
	refused_busy "$first"

# The reads end within a few seconds; then only the registration left to the driver holds it.
i=0
while [ "$(refcnt)" != 1 ] && [ $i -lt 300 ]; do
	sleep 0.1
	i=$((i + 1))
done
ktap_print_msg "after the reads: refcnt $(refcnt), emulated GPU: $(_egpu_state)"
_test "the reads ended: the registration left to the GPU driver alone holds the module (refcnt 1), the emulated GPU its page table" \
	_expect_eq "refcnt, page tables held" "1 1" "$(refcnt) $(_egpu_tables_held)"
_test "rmmod is still refused" \
	refused_busy "$(try_rmmod)"

callbacks_before=$(_kv "$(_egpu_state)" callbacks)
freed=$(gdirect-reg egpu-free-kept "$va" 2>&1)
ktap_print_msg "$freed"
_test "the free runs the module's callback (the emulated GPU's count), which lets the module go (refcnt 0)" \
	_expect_eq "callbacks, refcnt" "$((callbacks_before + 1)) 0" \
	"$(_kv "$(_egpu_state)" callbacks) $(refcnt)"
_test "rmmod succeeds" _expect_eq rmmod ok "$(try_rmmod)"
_test "the emulated GPU holds no page table for the unloaded module, the kernel no pinned page" \
	_expect_eq "page tables held; pages pinned (kernel)" "0; 0" "$(_egpu_tables_held); $(_kernel_pins_settled)"
_test "the module loads again" _load_module

ktap_finished
