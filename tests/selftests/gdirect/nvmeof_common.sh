# SPDX-License-Identifier: GPL-2.0
#
# NVMe over Fabrics inside the guest, as an operator sets it up: sourced after
# gdirect_common.sh by the NVMe-oF selftests and the demo. Everything lives in
# the guest: a veth pair (gdv0, gdv1) carries the traffic, soft-RoCE (rxe0) on
# gdv0 for RDMA; the nvmet target exports subsystems through configfs on an
# RDMA port (1) and a TCP port (2) at the same address, and a second TCP port
# (3, "tcp2", on the next service id) for a second path; the host side connects
# with nvme-cli. _nvmeof_down removes all of it and checks that nothing is left.
#
# Two more RDMA ports run over P2P-capable "RNICs": soft-RoCE (the rig's patched
# rxe, tests/rxe) on a virtio NIC whose PCI function it DMA-maps through, as a
# hardware RNIC does. "rdma-near" (port 4, rxe_near) is on the NIC under the
# GPU's PCIe switch, "rdma-far" (port 5, rxe_far) on the NIC across the host
# bridge. The NICs have no backend: the traffic loops inside the guest.

GDIRECT_NVMEOF_ADDR=169.254.77.1
GDIRECT_NVMEOF_PORT=4420
GDIRECT_NVMET=/sys/kernel/config/nvmet
GDIRECT_NQN_PREFIX=nqn.2026-11.io.gdirect
GDIRECT_RNIC_NEAR_ADDR=169.254.78.1
GDIRECT_RNIC_FAR_ADDR=169.254.79.1
# Jumbo frames, as RoCE fabrics are run: soft-RoCE then uses the 4096-byte IB MTU
# (1024 at 1500), a quarter of the packets per read.
GDIRECT_FABRIC_MTU=9000

_veth_up() {
	ip link show gdv0 >/dev/null 2>&1 && return 0
	ip link add gdv0 type veth peer name gdv1 &&
		ip link set gdv0 mtu "$GDIRECT_FABRIC_MTU" && ip link set gdv1 mtu "$GDIRECT_FABRIC_MTU" &&
		ip link set gdv0 up && ip link set gdv1 up &&
		ip addr add "$GDIRECT_NVMEOF_ADDR/24" dev gdv0
}
_veth_down() { ip link del gdv0 2>/dev/null; }
_rxe_up() { modprobe rdma_rxe && { [ -d /sys/class/infiniband/rxe0 ] || rdma link add rxe0 type rxe netdev gdv0; }; }
_rxe_down() { rdma link delete rxe0 2>/dev/null; }

# The netdev of the NIC with MAC address $1.
_netdev_by_mac() {
	local n
	for n in /sys/class/net/*; do
		[ "$(cat "$n/address" 2>/dev/null)" = "$1" ] && { basename "$n"; return 0; }
	done
	return 1
}

# The MAC and the address of RNIC $1 (near or far).
_rnic_mac() { if [ "$1" = near ]; then echo "$GDIRECT_RNIC_NEAR_MAC"; else echo "$GDIRECT_RNIC_FAR_MAC"; fi; }
_rnic_addr() { if [ "$1" = near ]; then echo "$GDIRECT_RNIC_NEAR_ADDR"; else echo "$GDIRECT_RNIC_FAR_ADDR"; fi; }

# Soft-RoCE on RNIC $1 (near or far): its NIC up with its address, and the
# rdma link rxe_$1 on it.
_rnic_up() {
	local ndev addr
	ndev=$(_netdev_by_mac "$(_rnic_mac "$1")") || { ktap_print_msg "no NIC with MAC $(_rnic_mac "$1")"; return 1; }
	addr=$(_rnic_addr "$1")
	modprobe rdma_rxe && ip link set "$ndev" mtu "$GDIRECT_FABRIC_MTU" up || return 1
	[ -e /sys/module/rdma_rxe/parameters/pci_dma ] ||
		{ ktap_print_msg "rdma_rxe is not the rig's soft-RoCE (tests/rxe): $(modinfo -n rdma_rxe 2>&1)"; return 1; }
	ip -4 addr show dev "$ndev" | grep -q "inet $addr/" || ip addr add "$addr/24" dev "$ndev" || return 1
	[ -d "/sys/class/infiniband/rxe_$1" ] || rdma link add "rxe_$1" type rxe netdev "$ndev"
}

# RNIC $1 down: no rdma link, no address, link down.
_rnic_down() {
	local ndev
	rdma link delete "rxe_$1" 2>/dev/null
	ndev=$(_netdev_by_mac "$(_rnic_mac "$1")") || return 0
	ip addr flush dev "$ndev" 2>/dev/null
	ip link set "$ndev" down 2>/dev/null
	return 0
}

# The PCI function (bus:device.function) of RNIC $1.
_rnic_pci() {
	local ndev
	ndev=$(_netdev_by_mac "$(_rnic_mac "$1")") || return 1
	basename "$(readlink -f "/sys/class/net/$ndev/device/..")"
}

# A hardware counter of rdma link $1 (rdma statistic: the patched rxe counts the
# bytes it copied into and out of P2PDMA pages and RAM).
_rdma_counter() {
	rdma statistic show link "$1/1" 2>/dev/null | awk -v k="$2" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }'
}

# The nvmet port id of a port name: rdma, tcp, tcp2 (the second TCP port),
# rdma-near or rdma-far (the RNICs).
_nvmet_portid() {
	case $1 in
	rdma) echo 1 ;;
	tcp) echo 2 ;;
	tcp2) echo 3 ;;
	rdma-near) echo 4 ;;
	rdma-far) echo 5 ;;
	esac
}

# The transport (nvme -t) and the address of a port name.
_nvmet_trtype() { case $1 in rdma*) echo rdma ;; *) echo tcp ;; esac; }
_nvmet_addr() {
	case $1 in
	rdma-near) echo "$GDIRECT_RNIC_NEAR_ADDR" ;;
	rdma-far) echo "$GDIRECT_RNIC_FAR_ADDR" ;;
	*) echo "$GDIRECT_NVMEOF_ADDR" ;;
	esac
}

# The service id (TCP port) of a port name.
_nvmet_svcid() {
	case $1 in
	tcp2) echo $((GDIRECT_NVMEOF_PORT + 1)) ;;
	*) echo "$GDIRECT_NVMEOF_PORT" ;;
	esac
}

# A subsystem exporting namespace 1 backed by $2 (a block device or a file).
_nvmet_subsystem_add() {
	local s="$GDIRECT_NVMET/subsystems/$1"
	mkdir "$s" && echo 1 >"$s/attr_allow_any_host" &&
		mkdir "$s/namespaces/1" && echo "$2" >"$s/namespaces/1/device_path" &&
		echo 1 >"$s/namespaces/1/enable"
}

_nvmet_subsystem_del() {
	local s="$GDIRECT_NVMET/subsystems/$1"
	[ -d "$s/namespaces/1" ] && { echo 0 >"$s/namespaces/1/enable"; rmdir "$s/namespaces/1"; }
	[ -d "$s" ] && rmdir "$s"
	return 0
}

# A port $1 (a port name, above) on its address.
_nvmet_port_add() {
	local p="$GDIRECT_NVMET/ports/$(_nvmet_portid "$1")"
	[ -d "$p" ] && return 0
	mkdir "$p" && _nvmet_trtype "$1" >"$p/addr_trtype" && echo ipv4 >"$p/addr_adrfam" &&
		_nvmet_addr "$1" >"$p/addr_traddr" && _nvmet_svcid "$1" >"$p/addr_trsvcid"
}

_nvmet_port_del() {
	local p="$GDIRECT_NVMET/ports/$(_nvmet_portid "$1")" l
	[ -d "$p" ] || return 0
	for l in "$p"/subsystems/*; do [ -L "$l" ] && rm "$l"; done
	rmdir "$p"
}

# Export subsystem $2 on the port of transport $1 (and stop: _nvmet_unlink).
_nvmet_link() { ln -s "$GDIRECT_NVMET/subsystems/$2" "$GDIRECT_NVMET/ports/$(_nvmet_portid "$1")/subsystems/$2"; }
_nvmet_unlink() {
	local l="$GDIRECT_NVMET/ports/$(_nvmet_portid "$1")/subsystems/$2"
	[ -L "$l" ] && rm "$l"
	return 0
}

# The target side, whole: fabric, subsystem $2 backed by $3, port $1, exported.
# Usage: _nvmeof_target_up rdma|tcp|rdma-near|rdma-far NQN DEVICE_OR_FILE
_nvmeof_target_up() {
	case $1 in
	rdma) _veth_up && _rxe_up ;;
	rdma-near) _rnic_up near ;;
	rdma-far) _rnic_up far ;;
	*) _veth_up ;;
	esac || return 1
	[ -d "$GDIRECT_NVMET/subsystems/$2" ] || _nvmet_subsystem_add "$2" "$3" || return 1
	_nvmet_port_add "$1" && _nvmet_link "$1" "$2"
}

# The host-side controller (nvmeN) connected to subsystem $1, if any.
_nvmeof_ctrl_by_nqn() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && { basename "$c"; return 0; }
	done
	return 1
}

# The block device of namespace 1 of subsystem $1 as the host sees it: under
# the controller without NVMe multipath, under the subsystem with it.
_nvmeof_ns_by_nqn() {
	local ctrl ns
	ctrl=$(_nvmeof_ctrl_by_nqn "$1") || return 1
	for ns in /sys/class/nvme/"$ctrl"/nvme*n1 /sys/class/nvme-subsystem/*/nvme*n1; do
		[ -e "$ns" ] || continue
		# A multipath path disk (nvme0c1n1) has no device node: the head is the namespace.
		case "$(basename "$ns")" in nvme*c*n*) continue ;; esac
		case "$ns" in
		/sys/class/nvme-subsystem/*) [ "$(cat "$(dirname "$ns")/subsysnqn")" = "$1" ] || continue ;;
		esac
		echo "/dev/$(basename "$ns")"
		return 0
	done
	return 1
}

# The host side, as an operator runs it: discover, connect, wait until live.
# Sets NVMEOF_CTRL and NVMEOF_NS. Usage: _nvmeof_connect PORT NQN [nvme connect options...]
# (PORT: rdma, tcp, rdma-near or rdma-far)
_nvmeof_connect() {
	local trtype addr nqn=$2 i
	trtype=$(_nvmet_trtype "$1") addr=$(_nvmet_addr "$1")
	shift 2
	nvme discover -t "$trtype" -a "$addr" -s "$GDIRECT_NVMEOF_PORT" 2>&1 | grep -q "subnqn: *$nqn" ||
		{ ktap_print_msg "nvme discover -t $trtype -a $addr does not list $nqn"; return 1; }
	nvme connect -t "$trtype" -n "$nqn" -a "$addr" -s "$GDIRECT_NVMEOF_PORT" "$@" >/dev/null || return 1
	i=0
	while [ $i -lt 100 ]; do
		NVMEOF_CTRL=$(_nvmeof_ctrl_by_nqn "$nqn") && NVMEOF_NS=$(_nvmeof_ns_by_nqn "$nqn") &&
			[ "$(cat /sys/class/nvme/$NVMEOF_CTRL/state)" = live ] && [ -b "$NVMEOF_NS" ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
	ktap_print_msg "no live controller for $nqn over $trtype"
	return 1
}

# A 1 MiB read at byte $1 of the connected namespace ($NVMEOF_NS) into GPU
# memory takes the P2P path over rdma and is exact (host check against the
# host's image $2, default nvme0): how the fault tests show that the controller
# they break is on the P2P path.
_fabric_read_p2p() {
	_gd_read_exact "$NVMEOF_NS" "$1" 1048576 "${2:-nvme0}" "$1" &&
		_expect_eq "path reason transport" "p2p none rdma" "$(_rj .path) $(_rj .reason) $(_rj .transport)"
}

# Disconnect subsystem $1 and wait until its controller is gone.
_nvmeof_disconnect() {
	local i=0
	nvme disconnect -n "$1" >/dev/null 2>&1
	while _nvmeof_ctrl_by_nqn "$1" >/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	! _nvmeof_ctrl_by_nqn "$1" >/dev/null
}

# The EXIT trap of a fabric test: stops its background reader ($_BG_PID) if it
# started one, tears the fabric down and unloads the modules.
_nvmeof_cleanup() {
	[ -n "${_BG_PID:-}" ] && kill -9 "$_BG_PID" 2>/dev/null
	_nvmeof_down
	_unload_all
}

# Everything down, in reverse: host controllers of our subsystems, ports,
# subsystems, rxe, veth. Succeeds only when nothing is left.
_nvmeof_down() {
	local s
	for s in "$GDIRECT_NVMET"/subsystems/"$GDIRECT_NQN_PREFIX":*; do
		[ -d "$s" ] && _nvmeof_disconnect "$(basename "$s")"
	done
	_nvmet_port_del rdma
	_nvmet_port_del tcp
	_nvmet_port_del tcp2
	_nvmet_port_del rdma-near
	_nvmet_port_del rdma-far
	for s in "$GDIRECT_NVMET"/subsystems/"$GDIRECT_NQN_PREFIX":*; do
		[ -d "$s" ] && _nvmet_subsystem_del "$(basename "$s")"
	done
	_rxe_down
	_rnic_down near
	_rnic_down far
	_veth_down
	[ -z "$(ls "$GDIRECT_NVMET/ports" 2>/dev/null)" ] &&
		! ls -d "$GDIRECT_NVMET"/subsystems/"$GDIRECT_NQN_PREFIX":* >/dev/null 2>&1 &&
		[ -z "$(rdma link show 2>/dev/null)" ] && ! ip link show gdv0 >/dev/null 2>&1 &&
		! ip -4 addr show 2>/dev/null | grep -q "inet $GDIRECT_RNIC_NEAR_ADDR/\|inet $GDIRECT_RNIC_FAR_ADDR/"
}

# The whole NVMe-oF loop as an operator runs it, over transport $1 (rdma or
# tcp), with KTAP results: target up, discover, connect, list, an O_DIRECT read
# compared byte for byte with the backing drive and the host's checksum, then
# teardown in reverse with each step verified. Plan: 9 results.
_nvmeof_loop_test() {
	trtype=$1
	nqn=$GDIRECT_NQN_PREFIX:loop-$trtype
	local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no namespace for $GDIRECT_NVME0_SERIAL"

	_test "$trtype target up: veth$([ "$trtype" = rdma ] && echo ', soft-RoCE'), nvmet subsystem and port" \
		_nvmeof_target_up "$trtype" "$nqn" "$local_ns"
	discover() {
		out=$(nvme discover -t "$trtype" -a "$GDIRECT_NVMEOF_ADDR" -s "$GDIRECT_NVMEOF_PORT" 2>&1)
		echo "$out" | grep -q "subnqn: *$nqn" && echo "$out" | grep -q "trtype: *$trtype"
	}
	_test "nvme discover -t $trtype lists the subsystem" discover
	_test "nvme connect -t $trtype, controller live" _nvmeof_connect "$trtype" "$nqn"
	ns=${NVMEOF_NS:-}
	ctrl=${NVMEOF_CTRL:-}
	ktap_print_msg "controller $ctrl ($(cat /sys/class/nvme/$ctrl/transport 2>/dev/null)), namespace $ns"
	_test "the controller's transport is $trtype" _expect_eq transport "$trtype" "$(cat /sys/class/nvme/$ctrl/transport 2>/dev/null)"
	_test "nvme list shows the remote namespace" sh -c "nvme list 2>/dev/null | grep -q '^$ns '"
	_test "16 MiB read over $trtype with O_DIRECT match the host's checksum" \
		_expect_eq sha256 "$GDIRECT_NVME0_SHA256_16M" "$(_sha256_direct "$ns" 16)"
	same_bytes() {
		dd if="$ns" iflag=direct bs=1M count=16 of=/tmp/remote.bin 2>/dev/null &&
			dd if="$local_ns" iflag=direct bs=1M count=16 of=/tmp/local.bin 2>/dev/null &&
			cmp /tmp/remote.bin /tmp/local.bin
		rc=$?
		rm -f /tmp/remote.bin /tmp/local.bin
		return $rc
	}
	_test "the remote bytes equal the backing drive's, byte for byte" same_bytes
	disconnected() {
		_nvmeof_ctrl_by_nqn "$nqn" >/dev/null || { ktap_print_msg "no controller to disconnect"; return 1; }
		_nvmeof_disconnect "$nqn"
	}
	_test "nvme disconnect removes the controller" disconnected
	_test "teardown leaves no subsystem, port, rxe link or veth" _nvmeof_down
}

# GPU-targeted reads from the remote raw namespace over transport $1, with KTAP
# results: the bytes are the drive image's (host check), the path is bounce for
# a queue without P2P on that transport, the bytes through host memory are
# counted, and QEMU's trace shows the target's NVMe DMA the bytes into guest RAM,
# none into the GPU's BAR. Plan: 9 results.
_nvmeof_gpu_read_test() {
	trtype=$1
	nqn=$GDIRECT_NQN_PREFIX:read-$trtype
	local_ns=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL") || ktap_exit_fail_msg "no namespace for $GDIRECT_NVME0_SERIAL"
	_test "target up over $trtype" _nvmeof_target_up "$trtype" "$nqn" "$local_ns"
	_test "discovered and connected over $trtype" _nvmeof_connect "$trtype" "$nqn"
	bounced=$(_stat bounce read bounce_bytes)
	_dma_mark
	_test "16 MiB of the remote namespace read into GPU memory" _gd_read "$NVMEOF_NS" --mem egpu --len 16M
	_test "QEMU saw the target's NVMe DMA all 16 MiB into guest RAM, none into the GPU's BAR" \
		_dma_expect ram_read=16777216 bar_read=0
	ktap_print_msg "why: $(_rj .why)"
	bounced_why() {
		_expect_eq "path reason transport" "bounce queue_no_p2p $trtype" "$(_rj .path) $(_rj .reason) $(_rj .transport)" &&
			_rj .why | grep -qi "$trtype"
	}
	_test "bounced: the $trtype queue takes no P2P pages, and the report says why, naming $trtype" bounced_why
	_test "the GPU memory holds the drive image's bytes (host check)" \
		_host_compare "gva:$(_rj .memory.address)" nvme0:0 16777216
	_test "the 16 MiB are counted as through host memory" \
		_expect_eq bounced $((bounced + 16777216)) "$(_stat bounce read bounce_bytes)"
	at() {
		_gd_read_exact "$NVMEOF_NS" 20971520 3145728 nvme0 20971520
	}
	_test "a read at an offset is exact too" at
	_test "teardown leaves nothing behind" _nvmeof_down
}

# Runs `gdirect read ARGS... --json` in the background; _bg_read_wait waits for
# it (at most $1 seconds) and sets BG_RC, BG_JSON and BG_SECONDS.
_bg_read_start() {
	_gd_free_kept
	_BG_START=$(date +%s)
	gdirect read "$@" --json >/tmp/bg-read.json 2>/tmp/bg-read.err &
	_BG_PID=$!
}
_bg_read_wait() {
	deadline=$(($(date +%s) + $1))
	while kill -0 "$_BG_PID" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
	if kill -0 "$_BG_PID" 2>/dev/null; then
		ktap_print_msg "the read did not end within $1 s"
		kill -9 "$_BG_PID"
	fi
	wait "$_BG_PID"
	BG_RC=$?
	BG_SECONDS=$(($(date +%s) - _BG_START))
	BG_JSON=$(cat /tmp/bg-read.json)
	[ "$(echo "$BG_JSON" | jq -r .memory.kind 2>/dev/null)" = egpu ] &&
		_GD_KEPT_VA=$(echo "$BG_JSON" | jq -r .memory.address)
	ktap_print_msg "read ended after ${BG_SECONDS}s, exit $BG_RC: $(echo "$BG_JSON" | jq -c '{bytes,path,error:.error.errno}' 2>/dev/null) $(head -c 200 /tmp/bg-read.err)"
}

# The read failed as a whole: an error, and no byte count claimed.
_bg_read_failed_cleanly() {
	[ "$BG_RC" -ne 0 ] && [ "$(echo "$BG_JSON" | jq -r .error.kind)" != null ] &&
		[ "$(echo "$BG_JSON" | jq -r .bytes)" = null ]
}
