#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# GPU-targeted reads from a remote NVMe namespace over RDMA (soft-RoCE on an
# in-guest veth): byte-exact in GPU memory (checked from the host), and reported
# truthfully as bounced because the RDMA queue takes no P2P pages - soft-RoCE
# "DMA" is a CPU copy; a hardware RNIC would take the P2P path (unit-tested).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_cleanup EXIT

_require_root
_require_cmd nvme ip gdirect jq rdma
_load_all || ktap_exit_fail_msg "cannot load the modules"

ktap_print_header
ktap_set_plan 9
_nvmeof_gpu_read_test rdma
ktap_finished
