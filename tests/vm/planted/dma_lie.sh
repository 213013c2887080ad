#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Planted for tests/vm/runner_test.sh: a test that asks the host to judge a P2P proof that is
# false (a read forced to bounce, claimed to have gone all into the BAR, then to have put less
# than 4 KiB into RAM), ignores the verdicts and exits 0. The host fails the run on the FAIL it answered, whatever the test said.
. "${GDIRECT_LIB:-/selftests/lib}/gdirect_common.sh"
trap _unload_all EXIT
_load_all || exit 1
dev=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || exit 1
_dma_mark || exit 1
_gd_read "$dev" --mem egpu --offset 99M --len 1M --force-bounce >/dev/null || exit 1
_dma_expect bar_read=1048576 ram_read=0 || echo "the host said FAIL; this test says nothing"
_dma_expect "ram_read<4096" || echo "the host said FAIL; this test says nothing"
exit 0
