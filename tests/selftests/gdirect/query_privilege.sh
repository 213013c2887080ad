#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Who sees what through QUERY (the header's "Who sees what"):
#  - root gets the addresses of registered host memory for a peer: the pages'
#    physical addresses here (the test first finds no IOMMU), as /proc/self/pagemap
#    tells root;
#  - a user in the device's group gets EACCES for addresses, yet the same map
#    type as root with max_entries = 0, and `gdirect query` shows the map type
#    and says the addresses are hidden;
#  - nobody gets anything for a peer that no driver of the kernel drives
#    (EUNATCH), root included. A PCI function of the rig with no driver bound
#    is that peer. (A vfio-bound peer takes the same branch of the module; the
#    rig's kernel has no VFIO, so that case is not run here.)

. "${GDIRECT_LIB:-$(dirname "$0")}/gdirect_common.sh"

# The device node goes with the module: its group and mode need no restoring.
trap _unload_all EXIT

_require_root
_require_cmd gdirect gdirect-reg jq
_load_module || ktap_exit_fail_msg "cannot load $GDIRECT_MODULE"
nvme0=$(_nvme_bdf_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no $GDIRECT_NVME0_SERIAL"
undriven=
for d in /sys/bus/pci/devices/*; do
	[ -e "$d/driver" ] && continue
	undriven=$(basename "$d")
	break
done
[ -n "$undriven" ] || ktap_exit_fail_msg "no PCI function without a driver in the rig"
_add_test_user
chgrp gdirect /dev/gdirect && chmod 0660 /dev/gdirect

ktap_print_header
ktap_set_plan 13

root=$(gdirect-reg query-privilege "$nvme0" "$undriven")
ktap_print_msg "root: $(echo "$root" | tr '\n' ' ') (undriven peer $undriven)"
_test "root: addresses for the peer" _expect_eq addrs "OK 4" "$(_kv "$root" addrs) $(_kv "$root" entries)"
_test "root: no IOMMU, so they are the pages' physical addresses (pagemap)" \
	_expect_eq "iommus pagemap_matches" "0 4" "$(ls /sys/class/iommu | wc -l) $(_kv "$root" pagemap_matches)"
_test "root: the map type alone, no entries" _expect_eq map_type_only "OK 0" \
	"$(_kv "$root" map_type_only) $(echo "$root" | sed -n 's/^map_type_only=.* entries=//p')"
_test "root: no addresses for a peer no driver drives (EUNATCH)" _expect_eq undriven EUNATCH "$(_kv "$root" undriven)"
_test "root: nor its map type (EUNATCH)" _expect_eq undriven_map_type_only EUNATCH "$(_kv "$root" undriven_map_type_only)"

user=$(_as_user gdirect-reg query-privilege "$nvme0" "$undriven")
ktap_print_msg "user: $(echo "$user" | tr '\n' ' ')"
_test "user: addresses refused (EACCES), none written" _expect_eq addrs "EACCES 0 0" \
	"$(_kv "$user" addrs) $(_kv "$user" entries) $(_kv "$user" pagemap_matches)"
_test "user: the map type, the same as root's" _expect_eq map_type "OK $(_kv "$root" map_type)" \
	"$(_kv "$user" map_type_only) $(_kv "$user" map_type)"
_test "user: a peer no driver drives (EUNATCH)" _expect_eq undriven EUNATCH "$(_kv "$user" undriven)"

q=$(gdirect query --mem host --size 64K --peer "$nvme0" --json)
_test "gdirect query as root: 16 addresses, not hidden" _expect_eq root "false 16 host_memory" \
	"$(echo "$q" | jq -r '.addresses_hidden, (.peers[0].addrs | length), .peers[0].map_type' | tr '\n' ' ' | sed 's/ $//')"
q=$(_as_user gdirect query --mem host --size 64K --peer "$nvme0" --json)
_test "gdirect query as a user: the map type, addresses hidden" _expect_eq user "true 0 host_memory" \
	"$(echo "$q" | jq -r '.addresses_hidden, (.peers[0].addrs | length), .peers[0].map_type' | tr '\n' ' ' | sed 's/ $//')"
text=$(_as_user gdirect query --mem host --size 64K --peer "$nvme0")
_test "gdirect query as a user says why the addresses are missing" \
	_expect_eq text yes "$(echo "$text" | grep -q 'need CAP_SYS_ADMIN' && echo yes || echo no)"
q=$(gdirect query --mem host --size 64K --peer "$undriven" --json)
_test "gdirect query of a peer no driver drives: a named error" _expect_eq error "peer_not_kernel_driven EUNATCH" \
	"$(echo "$q" | jq -r '.error.kind, .error.errno' | tr '\n' ' ' | sed 's/ $//')"
_test "nothing is left registered" \
	_expect_unpinned

ktap_finished
