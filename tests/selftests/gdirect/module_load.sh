#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The module loads, announces itself once with its version and ABI, registers
# /dev/gdirect, unloads cleanly, and loads again.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() { _module_loaded && rmmod gdirect; }
trap cleanup EXIT

_require_root
[ -f "$GDIRECT_MODULE" ] || { ktap_skip_all "no module at $GDIRECT_MODULE"; exit "$KSFT_SKIP"; }
_module_loaded && ktap_exit_fail_msg "gdirect is already loaded before the test"

ktap_print_header
ktap_set_plan 7

_dmesg_mark
_test "insmod succeeds" insmod "$GDIRECT_MODULE"
_test "/sys/module/gdirect exists" test -d /sys/module/gdirect

load_line() { _dmesg_since_mark | grep -E 'gdirect: version [0-9]+\.[0-9]+\.[0-9]+ loaded, ABI version 1, /dev/gdirect$'; }
count=$(load_line | wc -l)
ktap_print_msg "load line: $(load_line)"
_test "exactly one load line with version and ABI version" _expect_eq "load lines" 1 "$count"
_test "/dev/gdirect is registered" test -c /dev/gdirect

_test "rmmod succeeds" rmmod gdirect
gone() { [ ! -d /sys/module/gdirect ] && [ ! -e /dev/gdirect ]; }
_test "module and device are gone after rmmod" gone

reload() { insmod "$GDIRECT_MODULE" && test -c /dev/gdirect && rmmod gdirect && gone; }
_test "the module loads and unloads a second time" reload

ktap_finished
