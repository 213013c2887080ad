#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh: a test that dma-expects (beside it) declares to make two
# host-judged DMA checks, and makes one (true) before it exits 0. The host fails the run.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
trap _unload_all EXIT
_load_all || exit 1
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || exit 1
_dma_mark || exit 1
_gd_read "$dev" --mem egpu --offset 99M --len 1M --force-bounce >/dev/null || exit 1
_dma_expect bar_read=0 ram_read=1048576 || exit 1
exit 0
