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
 *
 * open(2) of the device fails with ENODEV while the module is being unloaded.
 * Every open file holds a reference on the module: rmmod fails with EBUSY
 * (EAGAIN from delete_module(2)) until the last one is closed.
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
	/* Ordinary user memory, pinned. addr is a user virtual address. Page size 4 KiB. */
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
	 * of /sys/bus/pci/devices/<bdf>/p2pmem/allocate. Page size 4 KiB.
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
	__u64 file_pinned_bytes; /* bytes pinned by them */
	/* out: the whole module */
	__u64 registrations; /* live registrations, all files */
	__u64 pinned_bytes; /* bytes pinned by them */
	__u64 revocations; /* registrations revoked by their provider since load */
	/* out: limits (module parameters max_pinned_bytes, max_registrations) */
	__u64 max_pinned_bytes; /* all registrations together */
	__u32 max_registrations; /* per file */
	__u32 pad3; /* must be 0 */
	/* in, must be 0: room for later outputs */
	__u64 reserved[4];
};

#define GDIRECT_IOC_GET_INFO _IOWR(GDIRECT_IOC_MAGIC, 0x00, struct gdirect_info_args)

/*
 * Errors of the commands on registrations, each with one meaning:
 *
 *  EINVAL          a flag bit the command does not define (or one the provider
 *                  does not support), a nonzero reserved/pad field, zero length.
 *  ERANGE          addr or len is not a multiple of the provider's alignment
 *                  (4 KiB for host and p2pdma, 64 KiB for nvidia).
 *  EOVERFLOW       addr + len overflows.
 *  EPROTONOSUPPORT provider is not a GDIRECT_PROVIDER_* value.
 *  EOPNOTSUPP      the provider exists but not on this system now (nvidia
 *                  without nvidia.ko's nv-p2p symbols).
 *  ENXIO           the range is not (entirely) memory of that provider: not
 *                  mapped in the process, not P2PDMA memory, not a GPU
 *                  allocation, or spanning two devices.
 *  EDQUOT          pinning len more bytes would exceed max_pinned_bytes.
 *  EMFILE          this file already holds max_registrations registrations.
 *  ENOENT          no registration with this handle was ever made on this file.
 *  ESTALE          the handle was unregistered already.
 *  EPERM           the handle belongs to another open file of the device.
 *  ENOLINK         the provider took the memory back (for example cudaFree of
 *                  registered GPU memory): the registration is revoked. Only
 *                  UNREGISTER still works on it.
 *  ENODEV          QUERY: no PCI device at that address.
 *  ENOMEM          out of memory.
 */

/* REGISTER flags */
/*
 * nvidia only: pin with nvidia_p2p_get_pages_persistent. The GPU driver keeps
 * the memory until the registration ends, even across cudaFree: it is never
 * revoked.
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

#endif /* _UAPI_LINUX_GDIRECT_H */
