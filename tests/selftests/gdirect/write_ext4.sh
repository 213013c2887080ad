#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Writes from GPU memory into files on ext4: extending, preallocated and sparse,
# each read back in the guest and found by the host in the namespace's image
# (see fs_write_common.sh).

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
FS=ext4
. "$GDIRECT_LIB/fs_write_common.sh"
ktap_finished
