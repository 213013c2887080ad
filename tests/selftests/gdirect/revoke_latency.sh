#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# A free (cudaFree) during one long read into the memory: 64 MiB from the
# namespace QEMU throttles to 32 MB/s, a 2-second read, like 1 GiB at 512 MB/s.
# The module holds the revocation fence per 8 MiB chunk, so the free waits for
# the chunk in flight (at most 8 MiB of I/O: 250 ms here, about 2 ms on a
# 4 GB/s drive) and the read stops with EKEYREVOKED; a fence held for the whole
# transfer would make the free wait for the whole read, which would then
# succeed. The free's callback, timed by the emulated GPU (outside the module),
# must return within that chunk's 250 ms plus a 750 ms margin (the whole read
# would be 2 s). The free's duration is printed as a figure.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

trap _unload_all EXIT

_require_root
_require_cmd gdirect-io
_load_all || ktap_exit_fail_msg "cannot load the modules"
slow=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" 4) || ktap_exit_fail_msg "no namespace 4 of $GDIRECT_NVME0_SERIAL"

ktap_print_header
ktap_set_plan 4

out=$(gdirect-io revoke-latency "$slow" 64 2>&1)
rc=$?
echo "$out" | while read -r l; do ktap_print_msg "$l"; done
callback_ms=$(_kv "$out" callback_ms)
echo "GDIRECT-FIGURE revoke_latency read_mib=64 drive_mb_s=32 free_ms=$(_kv "$out" free_ms) callback_ms=$callback_ms read_ms=$(_kv "$out" read_ms)"
_test "the read stopped at the free with EKEYREVOKED" _expect_eq read_revoked true "$(_kv "$out" read_revoked)"
_test "the free ran its callback" _expect_eq "exit status" 0 "$rc"
_test "the callback waited for one 8 MiB chunk at most (250 ms + 750; ${callback_ms:-?} ms)" \
	sh -c "[ -n '$callback_ms' ] && [ '$callback_ms' -le 1000 ]"
_test "nothing stays registered or pinned" \
	_expect_unpinned

ktap_finished
