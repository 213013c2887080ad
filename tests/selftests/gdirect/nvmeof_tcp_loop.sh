#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# NVMe over Fabrics over TCP inside the guest: an nvmet target exporting the rig's
# NVMe drive on an in-guest veth, discovered, connected and
# listed with nvme-cli as an operator would, an O_DIRECT read compared byte for
# byte with the drive and with the host's checksum, and a clean teardown.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
. "$GDIRECT_LIB/nvmeof_common.sh"

trap _nvmeof_down EXIT

_require_root
_require_cmd nvme ip
[ -d "$GDIRECT_NVMET" ] || { ktap_skip_all "no nvmet in configfs"; exit "$KSFT_SKIP"; }

ktap_print_header
ktap_set_plan 9
_nvmeof_loop_test tcp
ktap_finished
