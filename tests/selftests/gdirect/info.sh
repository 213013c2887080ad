#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# `gdirect info` reports what the module says about itself, as text and as
# JSON that matches the documented schema: the providers it can use now (host
# and p2pdma here; nvidia only with a GPU driver, see register_nvidia.sh), its
# counters and limits; with the module absent it says so, explains how to load
# it, and exits nonzero.

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

cleanup() {
	exec 3<&- 2>/dev/null
	_unload_module_if_ours
}
trap cleanup EXIT

_require_root
_require_cmd gdirect jq
_module_loaded && ktap_exit_fail_msg "gdirect is already loaded before the test"

ktap_print_header
ktap_set_plan 9

# Module absent.
absent_text() {
	out=$(gdirect info 2>&1)
	rc=$?
	ktap_print_msg "absent: $out"
	[ $rc -ne 0 ] && echo "$out" | grep -q "module is not loaded" && echo "$out" | grep -q "modprobe gdirect"
}
_test "without the module: nonzero exit, says it is not loaded and how to load it" absent_text
absent_json() {
	out=$(gdirect info --json 2>/dev/null)
	rc=$?
	[ $rc -ne 0 ] && _expect_eq kind module_not_loaded "$(echo "$out" | jq -r .error.kind)"
}
_test "without the module: --json error kind module_not_loaded" absent_json

_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"

text=$(gdirect info)
rc=$?
ktap_print_msg "info: $text"
_test "info exits 0" _expect_eq "exit status" 0 "$rc"
text_ok() {
	echo "$text" | grep -qE '^module +gdirect [0-9]+\.[0-9]+\.[0-9]+ \(ABI 1\) at /dev/gdirect$' &&
		echo "$text" | grep -qE '^providers +host, p2pdma \(not available: nvidia\)$' &&
		echo "$text" | grep -qE '^open files +1$'
}
_test "text names module version, ABI, providers and open files" text_ok

json=$(gdirect info --json)
rc=$?
ktap_print_msg "json: $(echo "$json" | jq -c .)"
valid_json() { [ "$rc" -eq 0 ] && echo "$json" | jq -e . >/dev/null; }
_test "info --json exits 0 with valid JSON" valid_json
# The schema (README): every key present with its type, and the values the module reported.
schema='
	(.device | type == "string") and
	(.module.version | test("^[0-9]+\\.[0-9]+\\.[0-9]+$")) and
	(.module.abi_version == 1) and
	(.library.abi_version == 1) and (.library.version | type == "string") and
	(.providers == {"host": true, "nvidia": false, "p2pdma": true}) and
	(.open_files == 1) and
	(.counters == {"file_registrations": 0, "file_pinned_bytes": 0, "registrations": 0,
	               "pinned_bytes": 0, "revocations": 0, "user_pinned_bytes": 0}) and
	(.limits == {"max_pinned_bytes": 68719476736, "max_pinned_bytes_per_user": 34359738368,
	             "max_registrations": 65536}) and
	(keys == ["counters", "device", "library", "limits", "module", "open_files", "providers"])'
matches_schema() { echo "$json" | jq -e "$schema" >/dev/null; }
_test "JSON matches the schema and the module's answer" matches_schema
text_version=$(echo "$text" | sed -n 's/^module *gdirect \([0-9.]*\) .*/\1/p')
_test "text and JSON agree on the version" _expect_eq version "$text_version" "$(echo "$json" | jq -r .module.version)"

# A file held open elsewhere is counted.
exec 3<"$GDIRECT_DEV"
_test "open_files counts another open file" _expect_eq open_files 2 "$(gdirect info --json | jq .open_files)"
exec 3<&-

_test "a device of another driver is reported as not_gdirect" \
	_expect_eq kind not_gdirect "$(gdirect --device /dev/null info --json 2>/dev/null | jq -r .error.kind)"

ktap_finished
