#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Reads of files on xfs on the switch NVMe into GPU memory: peer to peer,
# holes as zeros, a short read at EOF reported; checked from the host.
# (The body is fs_read_common.sh, shared with read_ext4.sh.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"
FS=xfs
. "$GDIRECT_LIB/fs_read_common.sh"
ktap_finished
