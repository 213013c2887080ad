# SPDX-License-Identifier: GPL-2.0
#
# Helpers shared by the gdirect selftests. Sourced, not run. Helpers are
# `_`-prefixed, as in selftests/ublk. In the rig, scripts/vm sets GDIRECT_LIB
# and GDIRECT_MODULE and the facts of the run (/etc/gdirect/rig.env).

GDIRECT_LIB=${GDIRECT_LIB:-$(dirname "$0")}
. "$GDIRECT_LIB/ktap_helpers.sh"

# busybox sh runs its own applets before searching $PATH; its `ip` cannot make
# veth pairs. Use iproute2's where it is installed.
for _ip in /usr/sbin/ip /sbin/ip /bin/ip; do
	[ -x "$_ip" ] && [ ! -L "$_ip" ] && { eval "ip() { $_ip \"\$@\"; }"; break; }
done

# The same for kmod's modprobe, depmod and modinfo, which the rig installs beside busybox's.
for _t in modprobe depmod modinfo; do
	case "$(readlink -f "/usr/sbin/$_t" 2>/dev/null)" in
	*/kmod) eval "$_t() { /usr/sbin/$_t \"\$@\"; }" ;;
	esac
done

GDIRECT_MODULE=${GDIRECT_MODULE:-/lib/gdirect/gdirect.ko}
GDIRECT_DEV=/dev/gdirect

# `gdirect read/write --mem egpu` memory outlives the command, so that the host compares it
# (_host_compare gva:ADDRESS) after the command ended: until the next _gd_read, or the emulated
# GPU's unload at the end of the test, which frees (and poisons) it.
export GDIRECT_EGPU_KEEP=1

# One KTAP result: run the command (its arguments kept intact, unlike
# ktap_test_result, which word-splits them) and report it as description $1.
_test() {
	description=$1
	shift
	if "$@"; then
		ktap_test_pass "$description"
	else
		ktap_test_fail "$description"
	fi
}

# Exit with KSFT_SKIP unless running as root.
_require_root() {
	[ "$(id -u)" -eq 0 ] || { ktap_skip_all "needs root"; exit "$KSFT_SKIP"; }
}

# Exit with KSFT_SKIP unless every named command exists.
_require_cmd() {
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || { ktap_skip_all "needs $c"; exit "$KSFT_SKIP"; }
	done
}

_module_loaded() { [ -d /sys/module/gdirect ]; }

# Load the module unless it is loaded; remember whether this test loaded it.
_GDIRECT_LOADED_HERE=0
_load_module() {
	_module_loaded && return 0
	insmod "$GDIRECT_MODULE" || return 1
	_GDIRECT_LOADED_HERE=1
}

# Unload the module if this test loaded it.
_unload_module_if_ours() {
	[ "$_GDIRECT_LOADED_HERE" -eq 1 ] && _module_loaded && rmmod gdirect
	_GDIRECT_LOADED_HERE=0
}

GDIRECT_EGPU_MODULE=${GDIRECT_EGPU_MODULE:-/lib/gdirect/gdirect_egpu.ko}

# Loads the emulated GPU as the NVIDIA driver series this run emulates (scripts/vm
# --nv-driver: GDIRECT_NV_DRIVER in rig.env), with parameters $@.
_egpu_insmod() {
	insmod "$GDIRECT_EGPU_MODULE" nv_driver="${GDIRECT_NV_DRIVER:-580}" "$@"
}

# Keeps the whole of block device $1 in a file in guest memory until _ns_restore
# writes it back: for tests that write a namespace whose content other tests read.
_ns_save() {
	_ns_saved_dev=$1 _ns_saved=/tmp/ns-save.$$
	dd if="$1" of="$_ns_saved" bs=1M iflag=direct status=none
}
_ns_restore() {
	[ -n "${_ns_saved_dev:-}" ] && [ -s "$_ns_saved" ] || return 0
	dd if="$_ns_saved" of="$_ns_saved_dev" bs=1M oflag=direct status=none && rm -f "$_ns_saved"
}

# Load the emulated GPU (and gdirect) for a test; _unload_all undoes both.
_load_all() {
	_load_module || return 1
	[ -d /sys/module/gdirect_egpu ] || _egpu_insmod
}

_unload_all() {
	[ -d /sys/module/gdirect ] && rmmod gdirect
	[ -d /sys/module/gdirect_egpu ] && rmmod gdirect_egpu
	_GDIRECT_LOADED_HERE=0
	return 0
}

# The value of key $2 in `key=value` output $1 (first match).
_kv() {
	echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# The unprivileged test user: gduser (uid 1000), in the group gdirect (gid 990) that tests
# give the device nodes to. Idempotent.
_add_test_user() {
	grep -qs '^gduser:' /etc/passwd || echo 'gduser:x:1000:1000:gduser:/:/bin/sh' >>/etc/passwd
	grep -qs '^gdirect:' /etc/group || echo 'gdirect:x:990:gduser' >>/etc/group
	grep -qs '^gduser:' /etc/group || echo 'gduser:x:1000:' >>/etc/group
}

# Runs a shell command line as the test user.
_as_user() { su gduser -s /bin/sh -c "$*"; }

# A field of `gdirect info --json` (a jq path).
_info() {
	gdirect info --json | jq -r "$1"
}

# The state of the emulated GPU: `allocations=N mappings=N callbacks=N`.
_egpu_state() {
	gdirect-reg egpu-info
}

# Pages pinned with FOLL_PIN and not yet unpinned, system-wide, beyond the run's baseline: the
# kernel's own accounting (mm/gup.c counts every pin and unpin in /proc/vmstat's
# nr_foll_pin_acquired and nr_foll_pin_released, whoever pins), never the module's word.
# Reading /proc/sys/vm/stat_refresh folds the per-CPU deltas in first. The VM's runner
# writes the baseline at boot (GDIRECT_PIN_BASELINE, moved on by leftovers.sh past a leak
# it reported); elsewhere it is 0.
GDIRECT_PIN_BASELINE=${GDIRECT_PIN_BASELINE:-/run/gdirect-pin-baseline}
_kernel_pins() {
	local base=0
	cat /proc/sys/vm/stat_refresh >/dev/null 2>&1
	[ -r "$GDIRECT_PIN_BASELINE" ] && read -r base <"$GDIRECT_PIN_BASELINE"
	awk -v base="$base" '$1 == "nr_foll_pin_acquired" { a = $2 } $1 == "nr_foll_pin_released" { r = $2 }
		END { print a - r - base }' /proc/vmstat
}

# The emulated GPU's page tables handed out and neither put nor revoked (EGPU_IOC_INFO): 0
# when it is not loaded or its device is unbound (an unbind revokes every table), "unreadable"
# when it is bound and does not answer.
_egpu_tables_held() {
	local out
	if out=$(_egpu_state 2>/dev/null); then
		_kv "$out" mappings
	elif ls /sys/bus/pci/drivers/gdirect_egpu 2>/dev/null | grep -q '^0000:'; then
		echo unreadable
	else
		echo 0
	fi
}

# _kernel_pins once it is 0, or after 5 s: the unpin after an exit may lag by deferred work.
_kernel_pins_settled() {
	local i=0 pins
	pins=$(_kernel_pins)
	while [ "$pins" != 0 ] && [ $i -lt 50 ]; do
		sleep 0.1
		i=$((i + 1))
		pins=$(_kernel_pins)
	done
	echo "$pins"
}

# Nothing registered or pinned, by three accounts that must agree: the module's counters
# (registrations, pinned_bytes), the kernel's pages pinned beyond the baseline
# (_kernel_pins_settled) and the emulated GPU's page tables held.
# Usage: _expect_unpinned (in a _test)
_expect_unpinned() {
	local pins
	pins=$(_kernel_pins_settled)
	_expect_eq "registrations, pinned bytes (module); pages pinned (kernel); page tables held (emulated GPU)" \
		"0 0; 0; 0" "$(_info .counters.registrations) $(_info .counters.pinned_bytes); $pins; $(_egpu_tables_held)"
}

# Kernel log lines since the last _dmesg_mark.
_DMESG_MARK=0
_dmesg_mark() { _DMESG_MARK=$(dmesg | wc -l); }
_dmesg_since_mark() { dmesg | tail -n +$((_DMESG_MARK + 1)); }

# Compare two values; print both on mismatch. Usage: _expect_eq WHAT EXPECTED ACTUAL
_expect_eq() {
	[ "$2" = "$3" ] && return 0
	ktap_print_msg "$1: expected '$2', got '$3'"
	return 1
}

# A number at least the one expected. Usage: _expect_ge WHAT AT_LEAST ACTUAL
_expect_ge() {
	[ "$3" -ge "$2" ] 2>/dev/null && return 0
	ktap_print_msg "$1: expected at least '$2', got '$3'"
	return 1
}

# The NVMe controller (nvmeN) whose serial is $1.
_nvme_ctrl_by_serial() {
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/serial" 2>/dev/null | tr -d ' ')" = "$1" ] && { basename "$c"; return 0; }
	done
	return 1
}

# The PCI address of the NVMe controller whose serial is $1.
_nvme_bdf_by_serial() {
	ctrl=$(_nvme_ctrl_by_serial "$1") || return 1
	basename "$(readlink -f "/sys/class/nvme/$ctrl/device")"
}

# The block device of namespace $2 (default 1) of the NVMe controller whose
# serial is $1.
_nvme_ns_by_serial() {
	ctrl=$(_nvme_ctrl_by_serial "$1") || return 1
	for ns in /sys/block/nvme*; do
		case "$(readlink -f "$ns/device")" in
		*/"$ctrl")
			[ "$(cat "$ns/nsid" 2>/dev/null)" = "${2:-1}" ] && { echo "/dev/$(basename "$ns")"; return 0; }
			;;
		esac
	done
	return 1
}

# PCI addresses of the functions with vendor $1 and device $2 (as 0x1af4 0x1110).
_pci_by_id() {
	for d in /sys/bus/pci/devices/*; do
		[ "$(cat "$d/vendor")" = "$1" ] && [ "$(cat "$d/device")" = "$2" ] && basename "$d"
	done
}

# The emulated GPU memory of the rig (ivshmem-plain, 1af4:1110).
_gpu_bdf() { _pci_by_id 0x1af4 0x1110 | head -n 1; }

# The PCI address of the bridge above the function $1.
_pci_parent() { basename "$(dirname "$(readlink -f "/sys/bus/pci/devices/$1")")"; }

# Where a slot powered off is marked (_surprise_unplug, _slot_back, leftovers.sh).
_GDIRECT_SLOT_OFF=/run/gdirect-slot-off
# A device that falls off the bus: QEMU's device_del of the rig's device $1 (gpu or nvme0,
# through the host), then the power of its slot, the downstream port $2, cut. (QEMU 7.2 finishes
# a device_del only through the guest's hot-plug driver, which the rig's kernel lacks; with its
# slot unpowered the device answers nothing, and no driver is told.)
_surprise_unplug() {
	_host_request UNPLUG "$1" || return 1
	# Marked, so that the runner powers the slot again after a test that did not.
	: >"$_GDIRECT_SLOT_OFF.$2"
	_out=$(gdirect-io slot-power "$2" off) || return 1
	ktap_print_msg "slot of $2: $_out"
	_expect_eq "slot control (power indicator and controller off)" 0x07 "$(_kv "$_out" now | cut -c1-4)"
}
# What a hot-plug driver does next: PCI function $1 removed from the kernel.
_pci_remove() { echo 1 >"/sys/bus/pci/devices/$1/remove" && [ ! -e "/sys/bus/pci/devices/$1" ]; }
# The slot of downstream port $1 powered again (a function still below it, dead, removed
# first), and the bus rescanned.
_slot_back() {
	for _f in "/sys/bus/pci/devices/$1"/0000:*; do
		[ -e "$_f/remove" ] && echo 1 >"$_f/remove"
	done
	ktap_print_msg "slot of $1: $(gdirect-io slot-power "$1" on)"
	rm -f "$_GDIRECT_SLOT_OFF.$1"
	echo 1 >/sys/bus/pci/rescan
}
# Namespace 4 of the first NVMe at $1 bytes a second (QEMU's I/O limit, through the host);
# a rate other than the rig's is marked, so that the runner restores it after a test that did
# not.
_GDIRECT_THROTTLED=/run/gdirect-throttled
_throttle_ns4() {
	_host_request THROTTLE nvme0ns4 "$1" || return 1
	if [ "$1" = "$GDIRECT_NVME0_NS4_BPS" ]; then rm -f "$_GDIRECT_THROTTLED"; else echo "$1" >"$_GDIRECT_THROTTLED"; fi
}

# Whether PCI functions $1 and $2 sit below one switch: their downstream ports share an
# upstream port (a function on a root port of its own does not).
_pci_same_switch() {
	[ -n "$1" ] && [ -n "$2" ] &&
		[ "$(_pci_parent "$(_pci_parent "$1")")" = "$(_pci_parent "$(_pci_parent "$2")")" ]
}

# Size in bytes of BAR $2 of the function $1, from its sysfs resource table.
_pci_bar_size() {
	sed -n "$(($2 + 1))p" "/sys/bus/pci/devices/$1/resource" | {
		read -r start end _
		echo $((end - start + 1))
	}
}

# The host-check channel (ttyS1, see scripts/vm): bytes compared from outside
# the guest. Names: gva (emulated GPU memory at a GPU virtual address, such as
# a read report's .memory.address: the host follows the GPU's page directory to
# its scattered pages), gpu (the emulated GPU's backing file, at BAR offsets),
# nvme0 and nvme1 (the drive images the host wrote, namespace 1), nvme0ns2 and
# nvme0ns3 (the images of namespaces 2 and 3 of nvme0), nvme0ns4 (namespace 4:
# random data, throttled by QEMU to 32 MB/s so that transfers stay in flight), zero.
# Usage: _host_compare NAME:OFFSET NAME:OFFSET LEN - succeeds when they match.
_HOSTCTL=/dev/ttyS1
_host_request_open() {
	if [ -z "${_HOSTCTL_OPEN:-}" ]; then
		[ -c "$_HOSTCTL" ] || { ktap_print_msg "no host channel at $_HOSTCTL"; return 1; }
		# Held open for the whole test: a reply must not arrive at a closed port.
		exec 5<>"$_HOSTCTL"
		stty raw -echo <&5
		_HOSTCTL_OPEN=1
	fi
}
_host_request() {
	_host_request_open || return 1
	echo "$*" >&5
	reply=
	read -r -t 60 reply <&5
	[ "$reply" = OK ] && return 0
	ktap_print_msg "host check '$*': ${reply:-no reply}"
	return 1
}
_host_compare() { _host_request COMPARE "$1" "$2" "$3"; }

# Where the emulated NVMe controllers' DMA went, as QEMU traced it on the host (not
# what the module says). _dma_mark remembers the trace's position; _dma_since sets
# DMA_BAR_READ, DMA_RAM_READ, DMA_CMB_READ (device to memory), DMA_BAR_WRITE,
# DMA_RAM_WRITE, DMA_CMB_WRITE (memory to device): bytes since the mark, by target
# (the emulated GPU's BAR2, the NVMe CMB, guest RAM). In the IOMMU rig the mapped addresses
# are IOVAs, judged by the IOMMU's translations in the trace, and it also sets
# DMA_UNTRANSLATED (bytes mapped but never translated) and DMA_FAULTS (the IOMMU's faults).
_dma_mark() {
	_host_request_reply DMA-MARK || return 1
	_DMA_MARK=${reply#OK }
}
_dma_since() {
	_host_request_reply DMA-SINCE "${_DMA_MARK:?_dma_mark first}" || return 1
	for kv in ${reply#OK }; do
		case $kv in
		bar_read=*) DMA_BAR_READ=${kv#*=} ;;
		ram_read=*) DMA_RAM_READ=${kv#*=} ;;
		cmb_read=*) DMA_CMB_READ=${kv#*=} ;;
		bar_write=*) DMA_BAR_WRITE=${kv#*=} ;;
		ram_write=*) DMA_RAM_WRITE=${kv#*=} ;;
		cmb_write=*) DMA_CMB_WRITE=${kv#*=} ;;
		untranslated=*) DMA_UNTRANSLATED=${kv#*=} ;;
		faults=*) DMA_FAULTS=${kv#*=} ;;
		esac
	done
	ktap_print_msg "NVMe DMA since the mark (host trace): ${reply#OK }"
}
# The host's verdict on the DMA since the mark: _dma_expect KEY=BYTES... or KEY<BYTES (fewer; quote it) (keys as
# _dma_since's: bar_read, ram_read, cmb_read, bar_write, ram_write, cmb_write; in the IOMMU rig
# also untranslated, which the host requires to be 0 unless named). The host compares, answers
# OK or FAIL with what it found, and fails the whole run on a FAIL whatever the test does with
# it; a test makes at least as many of these as tests/selftests/gdirect/dma-expects declares.
_dma_expect() {
	_host_request_open || return 1
	echo "DMA-EXPECT ${_DMA_MARK:?_dma_mark first} $(basename "$0") $*" >&5
	reply=
	read -r -t 60 reply <&5
	ktap_print_msg "NVMe DMA since the mark, judged by the host (want $*): ${reply:-no reply}"
	case $reply in
	"OK "*) return 0 ;;
	esac
	return 1
}

# Whether frees raced device DMA, as QEMU traced it on the host (not what either module
# counts): _frees_mark switches on the trace of MMIO writes, in which the emulated GPU's
# driver marks each free that revokes page tables and the pages it frees; _frees_since
# switches it off and sets FREES (frees since the mark), FREES_DURING_BAR_DMA (those that
# began while an NVMe command moving data to or from a page they free was outstanding:
# submitted, not yet completed), FREES_DURING_DMA (while any data command was: a bounced
# read's DMA goes to host memory) and BAR_COMMANDS (commands with data in the BAR).
_frees_mark() {
	_host_request_reply FREES-MARK || return 1
	_FREES_MARK=${reply#OK }
}
_frees_since() {
	FREES= FREES_DURING_BAR_DMA= FREES_DURING_DMA= BAR_COMMANDS=
	[ -n "${_FREES_MARK:-}" ] || { ktap_print_msg "_frees_since: no mark"; return 1; }
	_host_request_reply FREES-SINCE "$_FREES_MARK" || return 1
	ktap_print_msg "frees since the mark (host trace): ${reply#OK }"
	FREES=$(_kv "$reply" frees)
	FREES_DURING_BAR_DMA=$(_kv "$reply" during_bar_dma)
	FREES_DURING_DMA=$(_kv "$reply" during_dma)
	BAR_COMMANDS=$(_kv "$reply" bar_commands)
}

# Like _host_request, for requests whose reply carries values: succeeds on "OK ...".
_host_request_reply() {
	_host_request_open || return 1
	echo "$*" >&5
	reply=
	read -r -t 60 reply <&5
	case $reply in
	"OK "*) return 0 ;;
	esac
	ktap_print_msg "host request '$*': ${reply:-no reply}"
	return 1
}

# Ask the host whether bytes have this sha256. Usage: _host_sha256 NAME:OFFSET LEN HEX
_host_sha256() { _host_request SHA256 "$1" "$2" "$3"; }

# Ask for the same comparison after the VM has shut down (drive images complete).
_host_compare_at_exit() {
	echo "GDIRECT-HOST-COMPARE-AT-EXIT $1 $2 $3 $(basename "$0")"
}

# A field of `gdirect stats --json`: the counter $3 of path $1, direction $2.
_stat() {
	gdirect stats --json | jq -r ".io[] | select(.path == \"$1\" and .direction == \"$2\") | .$3"
}

# Reads with `gdirect read ... --json` and keeps the report in $READ_JSON.
# Usage: _gd_read FILE [options...]
# The last read's kept GPU memory (see GDIRECT_EGPU_KEEP) is no longer needed: it is freed
# before the next read (_gd_read, _bg_read_start), which would otherwise find BAR space
# short after a few large reads.
_gd_free_kept() {
	[ -n "${_GD_KEPT_VA:-}" ] && gdirect-reg egpu-free-kept "$_GD_KEPT_VA" >/dev/null 2>&1
	_GD_KEPT_VA=
}
_gd_read() {
	_gd_free_kept
	READ_JSON=$(gdirect read "$@" --json)
	_READ_RC=$?
	[ "$(_rj .memory.kind)" = egpu ] && _GD_KEPT_VA=$(_rj .memory.address)
	ktap_print_msg "read $*: $(echo "$READ_JSON" | jq -c '{bytes,eof,path,reason,bounce_bytes,gpu_page_runs: (.memory.bar_runs // [] | length)}' 2>/dev/null)"
	return $_READ_RC
}

# A field of the last _gd_read report.
_rj() { echo "$READ_JSON" | jq -r "$1"; }

# Reads LEN bytes of FILE at OFFSET into GPU memory and checks them whole: the byte count,
# then the bytes from the host against its image NAME at IMAGE_OFFSET.
# Usage: _gd_read_exact FILE OFFSET LEN NAME IMAGE_OFFSET
_gd_read_exact() {
	_gd_read "$1" --mem egpu --offset "$2" --len "$3" &&
		_expect_eq bytes "$3" "$(_rj .bytes)" &&
		_host_compare "gva:$(_rj .memory.address)" "$4:$5" "$3"
}

# sha256 of the first $2 MiB of $1, read with O_DIRECT.
_sha256_direct() {
	dd if="$1" iflag=direct bs=1M count="$2" 2>/dev/null | sha256sum | cut -d' ' -f1
}

# Waits up to 30 s until the block device $1 holds reads: its count of reads issued and not
# ended (/sys/block/NAME/inflight, the block layer's, not the module's), for a test that must
# act while the device has a transfer. Succeeds when it does.
_wait_disk_busy() {
	_wdb_q=/sys/block/$(basename "$1")/inflight
	_wdb=0
	while [ $_wdb -lt 300 ]; do
		read -r _wdb_r _ <"$_wdb_q" 2>/dev/null && [ "${_wdb_r:-0}" -gt 0 ] && return 0
		sleep 0.1
		_wdb=$((_wdb + 1))
	done
	ktap_print_msg "$1 held no read within 30 s ($_wdb_q)"
	return 1
}

# The file system tests' namespace of the switch NVMe: 2 for ext4, 3 for xfs. Checks the
# tools that make $1 and sets FS_DEV. Usage: _fs_setup ext4|xfs [more commands to require...]
_fs_setup() {
	fs=$1
	shift
	case $fs in
	ext4) _require_cmd mke2fs "$@" && _fs_nsid=2 ;;
	xfs) _require_cmd mkfs.xfs "$@" && _fs_nsid=3 ;;
	esac
	FS_DEV=$(_nvme_ns_by_serial "$GDIRECT_NVME0_SERIAL" $_fs_nsid) || ktap_exit_fail_msg "no namespace $_fs_nsid"
}

# The bounce pool under a stall (fs_lock_stall.sh, fs_perm_stall.sh; the module loaded with
# bounce_buffers=1): on file system $1 mounted on $2, a bounced read and a bounced write of a
# file kept waiting by `gdirect-reg bounce-stall $3` (lock: a stalled buffered writer's inode
# lock; perm: an unanswered fanotify event), "$4" naming what it waits at; meanwhile another
# file's bounced read must get the pool's one chunk, every byte right, and the stalled transfer,
# once "$5", must move every byte right. Two tests for each direction, and at the lock a third:
# the transfer's range checked once across its wait.
_bounce_stall_cases() {
	local fs=$1 mnt=$2 kind=$3 at=$4 then=$5 dir out
	for dir in read write; do
		dd if=/dev/urandom of="$mnt/f" bs=1M count=4 status=none &&
			dd if=/dev/urandom of="$mnt/g" bs=1M count=1 status=none && sync
		out=$(gdirect-reg bounce-stall "$kind" "$dir" "$mnt/f" "$mnt/g" 2>&1)
		echo "$out" | while read -r l; do ktap_print_msg "$fs bounced $dir: $l"; done
		_test "$fs bounced $dir: the transfer was at $at, and another file's bounced read got the pool's one chunk meanwhile, every byte right" \
			_expect_eq "stalled other right" "true true true" \
			"$(_kv "$out" stalled) $(_kv "$out" other_done_while_stalled) $(_kv "$out" other_bytes_right)"
		_test "$fs bounced $dir: once $then, the stalled transfer moved every byte right" \
			_expect_eq "io right" "65536 true" "$(_kv "$out" io) $(_kv "$out" stalled_bytes_right)"
		# A listener answering at once counts the transfer's permission events: its range is
		# checked once, as a read(2) or write(2) that waits for the lock is, not once per wait.
		if [ "$kind" = lock ]; then
			_test "$fs bounced $dir: its range was checked once across the lock wait (one fanotify permission event)" \
				_expect_eq "checks" "1" "$(_kv "$out" checks)"
		fi
		rm -f "$mnt/f" "$mnt/g"
	done
}

# Makes file system $1 on $2 and mounts it on $3.
_fs_make() {
	case $1 in
	ext4) /usr/sbin/mke2fs -q -F -t ext4 "$2" ;; # not busybox's applet: it has no -t
	xfs) mkfs.xfs -q -f "$2" ;;
	esac && mkdir -p "$3" && mount -t "$1" "$2" "$3"
}
