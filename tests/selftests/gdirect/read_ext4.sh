#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Reads of files on ext4 on the switch NVMe into GPU memory: peer to peer,
# holes as zeros, a short read at EOF reported; checked from the host.
# (The body is fs_read_common.sh, shared with read_xfs.sh.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
FS=ext4
. "$GDIRECT_LIB/fs_read_common.sh"
ktap_finished
