/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR MIT */
/*
 * gdirect: GPU-direct storage. The ioctl ABI of /dev/gdirect.
 *
 * This header is the single source of truth for both sides: the kernel module
 * mirrors it with compile-time size and offset checks (kernel/uapi.rs), and the
 * userspace library generates its bindings from it with bindgen.
 *
 * Rules every command follows:
 *  - One struct gdirect_<verb>_args per command, fields grouped as in / out.
 *    Only __u32 and __u64 fields; explicit padding; size a multiple of 8.
 *    Addresses and lengths are __u64.
 *  - The command number encodes the struct size (_IOC_SIZE). A command whose
 *    type and number are known but whose size or direction differs from this
 *    header is rejected with EINVAL, which leaves room to grow a struct later
 *    and to accept both sizes then.
 *  - `flags` and every `reserved`/`pad` field are inputs that must be zero;
 *    a set bit the module does not know gives EINVAL. Output-only fields are
 *    ignored on input.
 *  - Handles are per open file; closing the file releases what it holds.
 *  - New behaviour is a new command (or a new flag bit), never a change of the
 *    meaning of an existing field. GDIRECT_ABI_VERSION changes only when an
 *    existing command changes incompatibly.
 *
 * Errors common to every command (errno values, returned as -1/errno):
 *  ENOTTY   the command is not a gdirect command (wrong type or unknown number).
 *  EINVAL   known command with a wrong size or direction, unknown flag bits,
 *           or a nonzero reserved/pad field.
 *  EFAULT   the argument pointer is not readable/writable user memory.
 *  EXDEV    the caller does not run in the address space (mm) that opened
 *           the file: a child after fork(2), a program after execve(2) of a
 *           descriptor without O_CLOEXEC, or a process that received it over
 *           a Unix socket. Nothing is done, GET_INFO included; the file's
 *           registrations stay the opener's until it closes the file. Such a
 *           process opens the device itself.
 *
 * Permissions: the device is created mode 0660 (root; give a group access).
 * Transfers only ever use file descriptors the caller opened itself: the
 * module opens no path or device of its own, so the file system's checks
 * stand; WRITE needs a file open for writing, READ one open for reading.
 * Handles name registrations of one open file; host addresses are pinned in
 * the caller's address space and GPU addresses looked up in the caller's GPU
 * context. An open file is bound to the address space that opened it, as a
 * KVM VM is: every command from another one fails with EXDEV, so a process
 * cannot reach another's memory through a descriptor it inherited or was
 * passed (a forked child would otherwise read into the parent's pinned pages,
 * not its own copies of them). Host memory pinned by REGISTER counts against
 * the RLIMIT_MEMLOCK of the user that opened the file for as long as it stays
 * pinned (see ENOMEM below).
 *
 * open(2) of the device fails with ENODEV while the module is being unloaded.
 * Every open file holds a reference on the module, and so does every batched
 * transfer until it completes (a file may be closed with transfers queued),
 * and so does every GPU registration ended where the process that pinned it
 * cannot hand the pages back (by another process, or by a batched transfer's
 * worker): its pages are left to the GPU driver until the memory is freed and
 * the driver's free callback has run. Until the last of them is gone,
 * delete_module(2) fails with EWOULDBLOCK (EAGAIN: rmmod prints "Resource
 * temporarily unavailable").
 */
#ifndef _UAPI_LINUX_GDIRECT_H
#define _UAPI_LINUX_GDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* The character device, a misc device created with mode 0660. */
#define GDIRECT_DEVICE_PATH "/dev/gdirect"

/* Version of this ABI. Userspace refuses to talk to a module with another one. */
#define GDIRECT_ABI_VERSION 1

/* The ioctl type byte. 0xD6 is unused in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define GDIRECT_IOC_MAGIC 0xD6

/*
 * Providers: where registered device memory comes from. GET_INFO reports the
 * set of providers the running module can use now as a bit mask of
 * (1 << GDIRECT_PROVIDER_*). A provider whose backing driver is absent is not
 * reported.
 */
enum gdirect_provider {
	/*
	 * Ordinary user memory, pinned. addr is a user virtual address. Page size:
	 * the kernel's (4 KiB on x86-64; 16 or 64 KiB on some arm64 kernels).
	 */
	GDIRECT_PROVIDER_HOST = 0,
	/*
	 * NVIDIA GPU memory through the nv-p2p kernel interface of nvidia.ko
	 * (nvidia_p2p_get_pages), looked up when needed: the module loads and
	 * works without it. addr is a GPU virtual address (cudaMalloc), 64 KiB
	 * aligned; the page size is the GPU driver's (64 KiB).
	 */
	GDIRECT_PROVIDER_NVIDIA = 1,
	/*
	 * Memory already registered with PCI P2PDMA (an NVMe CMB, a GPU BAR
	 * published by its driver), through a user mapping of it such as an mmap
	 * of /sys/bus/pci/devices/<bdf>/p2pmem/allocate. Page size: the kernel's,
	 * as for host memory.
	 */
	GDIRECT_PROVIDER_P2PDMA = 2,
	GDIRECT_PROVIDER_COUNT = 3,
};

/*
 * GDIRECT_IOC_GET_INFO: what the module is and what it can do.
 *
 * The first command a library issues: it checks abi_version before anything
 * else. Its number and its first fields will not change.
 *
 * Errors: only the common ones.
 */
struct gdirect_info_args {
	/* in */
	__u32 flags; /* must be 0 */
	__u32 pad; /* must be 0 */
	/* out */
	__u32 abi_version; /* GDIRECT_ABI_VERSION of the module */
	__u32 providers; /* mask of (1 << GDIRECT_PROVIDER_*) available now */
	__u32 version_major; /* module version, major.minor.patch */
	__u32 version_minor;
	__u32 version_patch;
	__u32 open_files; /* files currently open on /dev/gdirect, this one included */
	/* out: this file */
	__u32 file_registrations; /* registrations held by this file */
	__u32 pad2; /* must be 0 */
	__u64 file_pinned_bytes; /* bytes pinned by them (none for revoked ones) */
	/* out: the whole module */
	__u64 registrations; /* live registrations, all files */
	__u64 pinned_bytes; /* bytes pinned by them (none for revoked ones) */
	__u64 revocations; /* registrations revoked by their provider since load */
	/* out: limits (module parameters max_pinned_bytes, max_registrations) */
	__u64 max_pinned_bytes; /* all registrations together */
	__u32 max_registrations; /* per file */
	__u32 pad3; /* must be 0 */
	/* out: the user that opened this file (its real uid at open), over all its files */
	__u64 user_pinned_bytes; /* bytes pinned by its registrations */
	__u64 max_pinned_bytes_per_user; /* module parameter (default 32 GiB); 0: none */
	/* in, must be 0: room for later outputs */
	__u64 reserved[2];
};

#define GDIRECT_IOC_GET_INFO _IOWR(GDIRECT_IOC_MAGIC, 0x00, struct gdirect_info_args)

/*
 * Errors of the commands on registrations, each with one meaning:
 *
 *  EINVAL          a flag bit the command does not define (or one the provider
 *                  does not support), a nonzero reserved/pad field, zero length.
 *  ERANGE          addr or len is not a multiple of the provider's alignment
 *                  (the kernel's page size for host and p2pdma, 64 KiB for
 *                  nvidia).
 *  EOVERFLOW       addr + len overflows.
 *  EPROTONOSUPPORT provider is not a GDIRECT_PROVIDER_* value.
 *  EOPNOTSUPP      the provider exists but not on this system now (nvidia
 *                  without nvidia.ko's nv-p2p symbols); or, nvidia, its driver
 *                  refused the pages for another reason than bad arguments or
 *                  memory (an nvidia_p2p_get_pages error other than -EINVAL
 *                  and -ENOMEM), or answered with a page table that does not
 *                  add up (an unknown page size, no pages, pages that do not
 *                  cover len): it cannot serve this memory now.
 *  ENXIO           the range is not (entirely) memory of that provider: not
 *                  mapped in the process, not P2PDMA memory, not a GPU
 *                  allocation, or spanning two devices.
 *  EMEDIUMTYPE     nvidia: the GPU driver hands out this memory without
 *                  P2PDMA struct pages: BAR1 outside NVIDIA's P2PDMA mode
 *                  (which needs a static, uncached BAR1 mapping), or coherent
 *                  memory of a CPU-coherent GPU (NVLink-C2C: a page table
 *                  flagged NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE, whose
 *                  addresses are not in a BAR). No storage driver can DMA to
 *                  it through the block layer peer to peer, so the module
 *                  takes no such registration (the library's compat engine
 *                  serves it). The pages are put back before REGISTER returns.
 *  EPROTO          nvidia: nvidia.ko returned a page table of an nv-p2p
 *                  generation this module does not know. It reads page table
 *                  version 1.2 (NVIDIA_P2P_PAGE_TABLE_VERSION 0x00010002,
 *                  drivers before 580.65.06) and 2.x (0x00020000, 580.65.06
 *                  through 595); a newer driver needs a newer gdirect. The
 *                  kernel log names the version; the pages are put back before
 *                  REGISTER returns.
 *  EDQUOT          pinning len more bytes would exceed max_pinned_bytes (the
 *                  module's limit over every provider and every process), or
 *                  max_pinned_bytes_per_user for the user that opened the file
 *                  (its real uid at open: a process that changed its uid
 *                  since registers on the account it opened the file with),
 *                  or for the owner of a user namespace the opener runs in
 *                  (and so on up: a container's uids share the limit of the
 *                  user that made its namespace, as RLIMIT_MEMLOCK's ucounts
 *                  do; a namespace that root made is an account of its own,
 *                  not root's). GET_INFO reports both limits and the
 *                  opener's own pinned bytes. The per-user limit is checked
 *                  first; neither check adds anything before it passes.
 *  EMFILE          this file already holds max_registrations registrations.
 *  ENOENT          no registration with this handle was ever made on this file
 *                  (the handle carries this file's cookie, see EPERM).
 *  ESTALE          the handle was unregistered already.
 *  EPERM           the handle was not issued by this file: it carries another
 *                  cookie (handles are cookie << 32 | index, the cookie random
 *                  per open file), as another file's handles do. A made-up
 *                  value gets EPERM too: the module does not tell another
 *                  file's handle from a forged one.
 *  EKEYREVOKED     the provider took the memory back (for example cudaFree of
 *                  registered GPU memory): the registration is revoked. Only
 *                  UNREGISTER still works on it. (Not ENOLINK, which the block
 *                  layer returns for transport errors of a transfer.)
 *  ENODEV          QUERY: no PCI device at that address.
 *  EUNATCH         QUERY: no driver of this kernel drives the peer: none is
 *                  bound, or one that hands its DMA to a userspace program
 *                  is (VFIO, UIO, pci-stub: any driver that manages DMA
 *                  ownership itself). Checked at each QUERY; a mapping made
 *                  earlier stays until the registration ends.
 *  EACCES          REGISTER: GDIRECT_REGISTER_PERSISTENT by a caller without
 *                  CAP_SYS_ADMIN (such a registration is never revoked);
 *                  checked before the provider and the alignment, so it is
 *                  the answer whatever they are.
 *                  QUERY: addresses asked for (max_entries > 0) by a caller
 *                  without CAP_SYS_ADMIN. They are bus addresses, or physical
 *                  ones where the IOMMU passes DMA through, which the kernel
 *                  otherwise shows only to the administrator. Anyone with the
 *                  device open may ask for the map type and the counts
 *                  (max_entries = 0), which map nothing.
 *  ENOMEM          out of memory; or, for the host provider, pinning len more
 *                  bytes would take the user that opened the file past the
 *                  caller's RLIMIT_MEMLOCK (host pages count in the user's
 *                  locked_vm until unpinned, as io_uring's registered buffers
 *                  do, and in the process's pinned_vm; an opener with
 *                  CAP_IPC_LOCK is not limited). Device memory is not charged.
 *                  For the nvidia provider, also: the GPU's BAR1 aperture is full
 *                  (nvidia_p2p_get_pages's -ENOMEM: every registration maps its
 *                  range into BAR1; GPUs whose BAR1 is smaller than their memory
 *                  run out); ending other registrations frees it.
 *  EINTR           REGISTER: a fatal signal came while the pages were being
 *                  pinned (the caller is being killed); nothing stays pinned.
 *                  QUERY with a peer: a signal came while it waited for the
 *                  peer's device lock (restarted where the handler asks).
 */

/* REGISTER flags */
/*
 * nvidia only: pin with nvidia_p2p_get_pages_persistent. The GPU driver keeps
 * the memory until the registration ends, even across cudaFree: it is never
 * revoked. Needs CAP_SYS_ADMIN (EACCES otherwise): on a shared node such a
 * registration holds GPU memory its owner freed.
 */
#define GDIRECT_REGISTER_PERSISTENT (1U << 0)
#define GDIRECT_REGISTER_FLAGS (GDIRECT_REGISTER_PERSISTENT)

/*
 * GDIRECT_IOC_REGISTER: pin [addr, addr + len) of a provider's memory and
 * translate its pages, for I/O and for peer devices.
 *
 * The memory stays pinned until UNREGISTER, the close of the file, or (for
 * nvidia without PERSISTENT) its revocation by the GPU driver.
 */
struct gdirect_register_args {
	/* in */
	__u32 provider; /* enum gdirect_provider */
	__u32 flags; /* GDIRECT_REGISTER_* */
	__u64 addr; /* see enum gdirect_provider */
	__u64 len; /* bytes, a multiple of the provider's alignment */
	/* out */
	__u64 handle; /* names the registration on this file only */
	__u64 page_size; /* bytes: the granularity of addresses reported by QUERY */
	__u64 page_count; /* len / page_size */
	/* in, must be 0 */
	__u64 reserved[2];
};

#define GDIRECT_IOC_REGISTER _IOWR(GDIRECT_IOC_MAGIC, 0x01, struct gdirect_register_args)

/*
 * GDIRECT_IOC_UNREGISTER: end a registration and unpin its memory. Works on a
 * revoked registration too.
 */
struct gdirect_unregister_args {
	/* in */
	__u64 handle;
	__u32 flags; /* must be 0 */
	__u32 pad; /* must be 0 */
};

#define GDIRECT_IOC_UNREGISTER _IOW(GDIRECT_IOC_MAGIC, 0x02, struct gdirect_unregister_args)

/* How a peer device reaches registered memory. */
enum gdirect_map_type {
	/* The peer cannot reach it: the path crosses a host bridge that does not allow P2P. */
	GDIRECT_MAP_NOT_SUPPORTED = 0,
	/* Device memory below a switch the peer shares: the addresses are PCI bus addresses. */
	GDIRECT_MAP_BUS_ADDR = 1,
	/* Device memory reached through the host bridge: the addresses are DMA addresses. */
	GDIRECT_MAP_THRU_HOST_BRIDGE = 2,
	/* System memory: the addresses are DMA addresses of its pages. */
	GDIRECT_MAP_HOST_MEMORY = 3,
};

/*
 * GDIRECT_IOC_QUERY: how a peer PCI device reaches a registration, and the
 * address it would use for each page. The mapping for that peer is made once
 * and kept until the registration ends.
 *
 * Paged: writes the addresses of pages [first_page, first_page + entries) to
 * addrs, entries = min(max_entries, page_count - first_page); call again with
 * a larger first_page for more. max_entries = 0 only reports the map type and
 * the counts. No addresses are written for GDIRECT_MAP_NOT_SUPPORTED.
 *
 * Who sees what: addresses need CAP_SYS_ADMIN in the calling task (EACCES
 * otherwise); the map type and the counts need only the open device and make
 * no mapping. The peer must be driven by a driver of this kernel (EUNATCH
 * otherwise). The address table made for a peer is charged to the caller's
 * memory cgroup.
 */
struct gdirect_query_args {
	/* in */
	__u64 handle;
	__u32 peer_domain; /* PCI domain (segment) of the peer */
	__u32 peer_bdf; /* bus << 8 | device << 3 | function */
	__u64 first_page;
	__u64 addrs; /* user pointer to __u64[max_entries] */
	__u32 max_entries;
	__u32 flags; /* must be 0 */
	/* out */
	__u32 map_type; /* enum gdirect_map_type */
	__u32 entries; /* addresses written */
	__u64 page_size;
	__u64 page_count;
	/* the PCI device that owns the memory (domain << 16 | bdf), ~0 for host memory */
	__u64 owner;
	/* in, must be 0 */
	__u64 reserved[1];
};

#define GDIRECT_IOC_QUERY _IOWR(GDIRECT_IOC_MAGIC, 0x03, struct gdirect_query_args)

/*
 * I/O between files and registered memory.
 *
 * The caller opens the file itself with O_DIRECT (a raw NVMe namespace, or a
 * file on ext4, xfs or any file system with direct I/O): every permission check
 * is the file system's, made at open. The module reads into, or writes from,
 * [buf_offset, buf_offset + len) of a registration with the file's own direct
 * I/O (read_iter/write_iter over bvecs of the registration's pages), and
 * reports for every request the path the bytes took and why. Transfers are
 * positional: a file open with O_APPEND is written at file_offset all the
 * same, as pwritev2(RWF_NOAPPEND) writes it.
 *
 * Errors of READ, WRITE and of each batch entry, each with one meaning (plus
 * the registration errors ENOENT, ESTALE, EPERM and EKEYREVOKED above):
 *
 *  EINVAL      zero length, unknown flag bits, nonzero reserved fields.
 *  EBADF       fd is not an open file, or not open for reading (READ) or
 *              writing (WRITE): open(2)'s access mode 3, which opens for
 *              ioctls alone, is open for neither.
 *  EBADFD      fd is not open with O_DIRECT (checked when the request is made,
 *              and again when its I/O starts: a batch entry whose file had
 *              O_DIRECT cleared by fcntl(F_SETFL) meanwhile fails with it).
 *  ERANGE      file_offset, buf_offset or len is not a multiple of the logical
 *              block size of the file's block device.
 *  EOVERFLOW   buf_offset + len is past the end of the registration, or
 *              file_offset is 2^63 or more (past what a file offset holds).
 *  ENOTBLK     the file is not on a block device (no direct I/O to route).
 *  ENODEV      the file's block device went away (hot removal, an NVMe-oF
 *              controller deleted): a transfer never reports the bytes it got
 *              before that as a short success. Or the PCI function of the
 *              registration's device memory is gone (a GPU that fell off the
 *              bus reads all ones in its config space; its BAR decodes
 *              nothing): checked before and after each chunk, so a transfer
 *              never claims bytes DMA'd into a dead BAR, and a write does not
 *              pass on what one returned when the check comes first.
 *  EINTR       READ and WRITE: a signal came while the transfer waited for
 *              room, for a bounce buffer or under max_in_flight_bytes or
 *              max_in_flight_bytes_per_user (the call is restarted instead
 *              where the handler asks for it, SA_RESTART); a batch's transfers
 *              run on the module's workers, which take no signals, and wait.
 *              Also a fatal signal while a chunk waits, with the memory not
 *              held, for an inode lock another task holds (see below): the
 *              task is ending, and the bytes moved before are not reported.
 *  EIO, ENOLINK (transport), ETIMEDOUT and the other errors of the file's
 *  read_iter/write_iter, passed on as the block layer reports them.
 *
 * A read that reaches the end of the file is short: bytes < len, and
 * GDIRECT_RESULT_EOF is set. Holes read as zeros.
 *
 * Revocation: a transfer moves its bytes in chunks of at most 8 MiB, each
 * under its own hold on the registration's pages. A revocation (cudaFree)
 * waits for the chunk in flight, never for the rest of the transfer, which
 * then fails with EKEYREVOKED; chunks before it may have been transferred.
 * No byte reaches the memory after the revocation returns. Likewise a transfer
 * that fails with any errno may have moved some chunks first (a failed WRITE
 * may have written part of its range): a failure says nothing of the bytes.
 */

/* Where the bytes went. */
enum gdirect_path {
	/* DMA between the storage and the device memory, peer to peer. */
	GDIRECT_PATH_P2P = 0,
	/* Through a bounded pool of host pages, copied to or from the memory by the CPU. */
	GDIRECT_PATH_BOUNCE = 1,
	/* The memory is host memory: DMA to it directly. */
	GDIRECT_PATH_HOST = 2,
	GDIRECT_PATH_COUNT = 3,
};

/*
 * Why a request took its path (GDIRECT_REASON_NONE for P2P and host). A later
 * module may add reasons (as GDIRECT_REASON_NO_DIRECT_IO was added): a reader
 * of a completion's reason takes a value it does not know for a reason it
 * cannot name, never as an index into a table of GDIRECT_REASON_COUNT.
 */
enum gdirect_path_reason {
	GDIRECT_REASON_NONE = 0,
	/* GDIRECT_IO_FORCE_BOUNCE was set. */
	GDIRECT_REASON_FORCED = 1,
	/* The file's block queue does not accept P2P pages (no BLK_FEAT_PCI_P2PDMA). */
	GDIRECT_REASON_QUEUE_NO_P2P = 2,
	/* The storage's DMA device cannot reach the memory peer to peer (PCI distance). */
	GDIRECT_REASON_DISTANCE = 3,
	/*
	 * The provider's memory has no struct pages the block layer can use. Not
	 * given by this version: REGISTER refuses such memory (EMEDIUMTYPE).
	 */
	GDIRECT_REASON_NO_PAGES = 4,
	/*
	 * The file is on an NVMe native multipath head whose queue does not
	 * accept P2P pages although one of its paths' queues does: a head takes
	 * them only when every path does (paths over TCP, for one, never do).
	 * Remedy: disconnect the paths that take no P2P pages, or boot with
	 * nvme_core.multipath=N so that each controller has its own namespace.
	 */
	GDIRECT_REASON_MULTIPATH = 5,
	/*
	 * The file's data may not be on its file system's block device: an XFS
	 * realtime file (FS_XFLAG_REALTIME) is on the realtime device, and a file
	 * system other than ext4 and XFS (btrfs, f2fs) may spread a file over
	 * several devices; the module cannot check their queues and reach.
	 */
	GDIRECT_REASON_DATA_DEVICE = 6,
	/*
	 * The file system does no direct I/O for this file: ext4 in data=journal
	 * mode or with the file's journal-data attribute (chattr +j), a file
	 * with fs-verity, inline data or an encryption policy the block layer
	 * cannot apply (statx(2) reports STATX_DIOALIGN with dio_mem_align 0);
	 * or none for this request, whose offsets are off the alignment statx
	 * reports (an encrypted ext4 file's block size; a reflinked XFS file's
	 * allocation unit, for writes). Its direct reads and writes go through
	 * the page cache, so that peer to peer the CPU would copy between the
	 * page cache and GPU memory; the bounce pool does that copy in host
	 * memory instead, and says so. Checked
	 * when each transfer starts: a file whose journal mode changes in the
	 * middle of a transfer may still have its last chunks copied by the file
	 * system. Not in GDIRECT_IOC_GET_STATS_V1's counts.
	 */
	GDIRECT_REASON_NO_DIRECT_IO = 7,
	GDIRECT_REASON_COUNT = 8,
};

/*
 * The storage transport of the file's block device, reported with every
 * transfer: the NVMe controller's own `transport` (pcie, rdma, tcp, loop, fc).
 * For an NVMe native multipath head, the transport its paths share (UNKNOWN
 * when they differ or none is live); the head's transfers go peer to peer only
 * when its queue takes P2P pages (all paths' do) and every path's PCI device,
 * where the module finds one, reaches the memory.
 * NVMe-oF over TCP and nvme-loop never take P2P pages; over RDMA they do when
 * the RDMA device DMAs for real (a hardware RNIC), not with soft-RoCE (rxe) or
 * soft-iWARP (siw), whose "DMA" is a CPU copy. For a queue that takes P2P pages
 * but has no PCI device the module can find below it (NVMe-oF over an RNIC), the
 * transfer goes peer to peer and the RDMA core checks the reach when it maps the
 * pages: an unreachable memory fails the transfer, it never corrupts it.
 */
enum gdirect_transport {
	GDIRECT_TRANSPORT_UNKNOWN = 0, /* not NVMe, no PCI device found */
	GDIRECT_TRANSPORT_PCIE = 1, /* NVMe over PCIe, or another PCI block device */
	GDIRECT_TRANSPORT_RDMA = 2,
	GDIRECT_TRANSPORT_TCP = 3,
	GDIRECT_TRANSPORT_LOOP = 4,
	GDIRECT_TRANSPORT_FC = 5,
};

/* READ/WRITE and batch entry flags */
/* Take the bounce path whatever the hardware allows (for tests and comparisons). */
#define GDIRECT_IO_FORCE_BOUNCE (1U << 0)
#define GDIRECT_IO_FLAGS (GDIRECT_IO_FORCE_BOUNCE)

/* Result flags */
/* The read reached the end of the file: bytes < len. */
#define GDIRECT_RESULT_EOF (1U << 0)

/*
 * GDIRECT_IOC_READ, GDIRECT_IOC_WRITE: one synchronous transfer between the
 * file at file_offset and the registration at buf_offset.
 *
 * On the P2P path the memory is held (a free of it waits) while a chunk's
 * storage I/O runs, not while the file system waits for a lock another task
 * holds: a regular file's chunks (8 MiB) are tried without waiting
 * (IOCB_NOWAIT). A chunk refused while its inode lock is held or awaited by
 * another task (a writer), or, for a write, while its file system is frozen,
 * waits for that with the memory not held and is tried directly again, up to
 * 8 times. A chunk the file system would wait for
 * first for anything else (dirty page cache in the range, XFS extents not yet
 * read in, a write that allocates blocks or extends the file) has that done
 * with the memory not held (the range written back; for a write, its blocks
 * allocated as fallocate(2) with mode 0 does and its cached pages dropped) and
 * is tried again, up to 3 times (a write whose times the clock made stale
 * again meanwhile has them updated and is tried again, up to 8 times more);
 * a write refused still is tried in halves, down to a block of the file
 * system (ext4 and XFS refuse one that crosses extents, written and unwritten
 * ones say, whatever is done first); refused at every size (XFS extents of
 * a cold file not yet read in, the lock taken again by others after each
 * wait), one block goes through
 * host memory, its I/O waiting for that with the memory not held, and the
 * rest is tried again; refused again before any of it moved, the chunk goes
 * through host memory. What went through host memory is
 * counted in bounce_bytes with path still P2P (so do the chunks of a file
 * that turned to journalling its data after its transfer started; one that
 * did so before bounces whole, GDIRECT_REASON_NO_DIRECT_IO). The permission
 * checks of each chunk (security modules, fanotify permission events, which
 * wait for a listener's answer) are made before the memory is held, and a
 * write tried without waiting that meets a freeze waits for the thaw with
 * the memory not held. Short waits inside the file system (journal or log
 * space, unwritten extents converted at the end) can still come while the
 * memory is held. A
 * write updates the file's times and, where it extends the file, its size
 * (the new part reading as zeros) before its data lands: one that fails may
 * leave them so. A write to a regular file is cut short at the caller's
 * RLIMIT_FSIZE and the file system's largest file, as write(2) is (bytes <
 * len, wherever a chunk ends); one that starts at or past them fails, EFBIG
 * (and SIGXFSZ for RLIMIT_FSIZE). A file open with O_APPEND is written at
 * file_offset, as pwritev2(RWF_NOAPPEND) writes; an append-only one (chattr
 * +a) is refused, EPERM, as that call refuses it.
 */
struct gdirect_io_args {
	/* in */
	__u64 handle;
	__u64 buf_offset;
	__u64 file_offset;
	__u64 len;
	__s32 fd;
	__u32 flags; /* GDIRECT_IO_* */
	/* out */
	__u64 bytes; /* transferred */
	__u32 path; /* enum gdirect_path */
	__u32 reason; /* enum gdirect_path_reason */
	__u32 result_flags; /* GDIRECT_RESULT_* */
	__u32 transport; /* enum gdirect_transport */
	__u64 bounce_bytes; /* bytes that went through host memory (also on P2P) */
	/* in, must be 0 */
	__u64 reserved[2];
};

#define GDIRECT_IOC_READ _IOWR(GDIRECT_IOC_MAGIC, 0x04, struct gdirect_io_args)
#define GDIRECT_IOC_WRITE _IOWR(GDIRECT_IOC_MAGIC, 0x05, struct gdirect_io_args)

/*
 * Batches: SUBMIT queues up to GDIRECT_BATCH_MAX transfers, which run
 * concurrently on the module's workqueue; REAP collects their completions.
 * Each transfer runs under the identity of the task that called SUBMIT, as
 * that task's own READ or WRITE would: its credentials (LSM checks; a write
 * clears setuid/setgid bits as the task's would), its io and memory cgroups,
 * and its RLIMIT_FSIZE as it was at SUBMIT (a write to a regular file at the
 * limit completes with -EFBIG and sends SIGXFSZ to that task, unless it has
 * exec'd another program since: the limit is checked when the write's first
 * chunk starts its storage I/O, after any wait for room under
 * max_in_flight_bytes and max_in_flight_bytes_per_user;
 * one across the limit is cut at it).
 *
 * In flight are the transfers submitted and not yet reaped; a file may have at
 * most max_in_flight of them (module parameter, default 128). The files of one
 * user may have at most max_in_flight_per_user transfers queued or running
 * (module parameter, default 256; counted until each is done, reaped or not;
 * the user is the one that opened the file, and the owners of the user
 * namespaces it runs in, as for max_pinned_bytes_per_user): the module's
 * workqueue runs at most 512 transfers at once on each CPU, each on the CPU
 * that submitted it, so with the default no user takes every worker.
 * SUBMIT takes 1 to GDIRECT_BATCH_MAX entries (EINVAL otherwise) and queues
 * them in order until one is malformed or cannot be read (EFAULT) or memory
 * runs out for it (ENOMEM) (its index is reported in `submitted`, the entries
 * before it are queued, and the call fails with that entry's errno) or a limit
 * is reached (the call succeeds with submitted < count; it fails with EAGAIN
 * when the file's limit left nothing to queue, EDQUOT when the user's did).
 * Errors of a transfer itself (EIO, ENOLINK, ...) are reported in its
 * completion.
 *
 * Notification: an eventfd registered with SET_EVENTFD is signalled once per
 * completion, so an event loop (epoll, io_uring, tokio) waits on it; REAP with
 * GDIRECT_REAP_WAIT blocks instead. An eventfd rather than poll() on the device:
 * it needs no file_operations hook (the kernel's Rust misc device has none for
 * poll), one eventfd can serve several device files, and it is what io_uring
 * and the GPU APIs (CUDA, Vulkan external semaphores) already wait on.
 */
#define GDIRECT_BATCH_MAX 256

enum gdirect_op {
	GDIRECT_OP_READ = 0,
	GDIRECT_OP_WRITE = 1,
};

/* One transfer of a batch: the fields of gdirect_io_args, and the caller's tag. */
struct gdirect_sqe {
	__u32 op; /* enum gdirect_op */
	__u32 flags; /* GDIRECT_IO_* */
	__u64 handle;
	__u64 buf_offset;
	__u64 file_offset;
	__u64 len;
	__s32 fd;
	__u32 pad; /* must be 0 */
	__u64 user_data; /* returned in the completion */
	__u64 reserved; /* must be 0 */
};

/* The completion of one transfer. */
struct gdirect_cqe {
	__u64 user_data;
	__s64 result; /* bytes transferred, or -errno */
	__u32 path; /* enum gdirect_path */
	__u32 reason; /* enum gdirect_path_reason */
	__u32 result_flags; /* GDIRECT_RESULT_* */
	__u32 transport; /* enum gdirect_transport */
	__u64 bounce_bytes;
};

struct gdirect_submit_args {
	/* in */
	__u64 sqes; /* user pointer to struct gdirect_sqe[count] */
	__u32 count; /* 1 to GDIRECT_BATCH_MAX */
	__u32 flags; /* must be 0 */
	/* out */
	__u32 submitted; /* entries queued (on error: the index of the bad entry) */
	__u32 in_flight; /* this file's transfers in flight after the call */
	/* in, must be 0 */
	__u64 reserved[2];
};

/* REAP flags */
/*
 * Block (interruptibly: EINTR, or the call restarted where the handler asks)
 * until at least one completion is there; with nothing in flight, return at
 * once with reaped = 0.
 */
#define GDIRECT_REAP_WAIT (1U << 0)

struct gdirect_reap_args {
	/* in */
	__u64 cqes; /* user pointer to struct gdirect_cqe[max] */
	__u32 max;
	__u32 flags; /* GDIRECT_REAP_* */
	/* out */
	__u32 reaped;
	__u32 in_flight; /* this file's transfers in flight after the call */
	/* in, must be 0 */
	__u64 reserved[2];
};

struct gdirect_eventfd_args {
	/* in */
	/* an eventfd, or -1 to stop signalling (EBADF: not an open file; EINVAL: not an eventfd) */
	__s32 fd;
	__u32 flags; /* must be 0 */
};

#define GDIRECT_IOC_SUBMIT _IOWR(GDIRECT_IOC_MAGIC, 0x06, struct gdirect_submit_args)
#define GDIRECT_IOC_REAP _IOWR(GDIRECT_IOC_MAGIC, 0x07, struct gdirect_reap_args)
#define GDIRECT_IOC_SET_EVENTFD _IOW(GDIRECT_IOC_MAGIC, 0x08, struct gdirect_eventfd_args)

/*
 * GDIRECT_IOC_GET_STATS: the module's I/O counters since load, per path and
 * direction, with a latency histogram: bucket i counts transfers that took
 * [2^i, 2^(i+1)) microseconds (bucket 0 also those under 1 us, the last one
 * everything longer).
 *
 * The counters (and GET_INFO's registration and pin counts) are the module's
 * totals over every user, as /proc/diskstats and /proc/meminfo are the
 * system's: counts and bytes, never an address, a file or a handle of another
 * user's. (A user's own share is in its library's per-call reports.)
 *
 * The struct has no reserved room: a path or reason added later comes with a
 * larger struct, so a new command code (its size is in the code), and the
 * module keeps answering the older ones with the counts they have
 * (GDIRECT_IOC_GET_STATS_V1 below).
 *
 * A transfer that fails before its path is chosen (its device gone, ENODEV;
 * its registration revoked, EKEYREVOKED) is in no path's counts; its batch
 * completion says path BOUNCE, reason NONE.
 */
#define GDIRECT_LATENCY_BUCKETS 20

struct gdirect_io_stats {
	__u64 ops; /* completed transfers, errors included */
	__u64 bytes; /* bytes transferred */
	__u64 errors; /* transfers that failed */
	__u64 bounce_bytes; /* bytes that went through host memory */
	__u64 latency_us_log2[GDIRECT_LATENCY_BUCKETS];
};

struct gdirect_stats_args {
	/* in */
	__u32 flags; /* must be 0 */
	__u32 pad; /* must be 0 */
	/* out: [path][direction], direction 0 = read, 1 = write */
	struct gdirect_io_stats io[GDIRECT_PATH_COUNT][2];
	__u64 reasons[GDIRECT_REASON_COUNT]; /* transfers by reason */
};

#define GDIRECT_IOC_GET_STATS _IOWR(GDIRECT_IOC_MAGIC, 0x09, struct gdirect_stats_args)

/*
 * GDIRECT_IOC_GET_STATS_V1: the same command with its first struct, from
 * before GDIRECT_REASON_NO_DIRECT_IO (the number is the same, the size in the
 * command code differs): the counts of the first GDIRECT_REASON_COUNT_V1
 * reasons (so its bounce ops may exceed the sum of its reasons' counts). Still answered, for programs built against that header; a program
 * built against this one may fall back to it on EINVAL (a module older than
 * this header).
 */
#define GDIRECT_REASON_COUNT_V1 7

struct gdirect_stats_args_v1 {
	/* in */
	__u32 flags; /* must be 0 */
	__u32 pad; /* must be 0 */
	/* out: as in struct gdirect_stats_args */
	struct gdirect_io_stats io[GDIRECT_PATH_COUNT][2];
	__u64 reasons[GDIRECT_REASON_COUNT_V1];
};

#define GDIRECT_IOC_GET_STATS_V1 _IOWR(GDIRECT_IOC_MAGIC, 0x09, struct gdirect_stats_args_v1)

/*
 * GDIRECT_IOC_PEER_CHECK: the kernel's PCI P2PDMA verdict for a pair of PCI
 * functions, without registering anything: how `client` (an NVMe controller,
 * an RDMA NIC) would reach memory in a BAR of `provider` (a GPU, a device
 * publishing P2P memory). The same verdict QUERY and the data path use.
 *
 * Errors: ENODEV (no such PCI function), EINVAL (flags or reserved not 0).
 */
struct gdirect_peer_args {
	/* in */
	__u32 provider_domain; /* PCI domain of the memory's function */
	__u32 provider_bdf; /* bus << 8 | device << 3 | function */
	__u32 client_domain; /* PCI domain of the DMA-ing function */
	__u32 client_bdf;
	__u32 flags; /* must be 0 */
	/* out */
	__u32 map_type; /* enum gdirect_map_type (never HOST_MEMORY) */
	__s32 distance; /* pci_p2pdma_distance(); -1 when not supported */
	/* in, must be 0 */
	__u32 reserved;
};

#define GDIRECT_IOC_PEER_CHECK _IOWR(GDIRECT_IOC_MAGIC, 0x0a, struct gdirect_peer_args)

#endif /* _UAPI_LINUX_GDIRECT_H */
