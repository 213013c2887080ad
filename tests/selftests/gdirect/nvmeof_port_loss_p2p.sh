#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# nvmeof_port_loss.sh on the P2P path: the target port goes away while GPU-targeted reads
# run through the P2P-capable RNIC under the GPU's switch (port rdma-near, see
# nvmeof_common.sh), whose DMA goes straight into GPU memory.

dir=$(dirname "$0")
[ -x "$dir/nvmeof_port_loss.sh" ] || dir=/selftests/gdirect
GDIRECT_FABRIC_PORT=rdma-near exec "$dir/nvmeof_port_loss.sh"
