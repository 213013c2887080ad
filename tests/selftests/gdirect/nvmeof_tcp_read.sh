#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# GPU-targeted reads from a remote NVMe namespace over TCP: byte-exact in GPU memory (checked from the host), and reported
# truthfully as bounced because the TCP queue takes no P2P pages.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

_require_root
_require_cmd nvme ip gdirect jq
_load_all || ktap_exit_fail_msg "cannot load the modules"

ktap_print_header
ktap_set_plan 9
_nvmeof_gpu_read_test tcp
ktap_finished
