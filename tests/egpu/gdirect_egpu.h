/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR MIT */
/*
 * gdirect_egpu: the emulated GPU of the gdirect test rig. Test-only.
 *
 * A PCI driver for the rig's ivshmem device (1af4:1110) whose 256 MiB BAR2 is
 * backed by a file in the host's /dev/shm. It registers BAR2 as PCI P2PDMA
 * memory, hands out "GPU allocations" of it through /dev/gdirect_egpu, and
 * exports the NVIDIA nv-p2p kernel interface (nvidia_p2p_get_pages and
 * friends) over those allocations, as nvidia.ko does over cudaMalloc memory.
 *
 * An allocation is 64 KiB aligned and has a fake GPU virtual address, the
 * address a CUDA program would pass to the nv-p2p functions. Its bytes are at
 * bar_offset in BAR2 (mmap /sys/bus/pci/devices/<bdf>/resource2 to see them)
 * and at the same offset of the host's backing file. Allocations belong to the
 * open file that made them: FREE or closing the file frees them, and, as
 * cudaFree does, runs the free callback of every nvidia_p2p_get_pages mapping
 * on them; mappings made with nvidia_p2p_get_pages_persistent instead keep the
 * memory until nvidia_p2p_put_pages_persistent. As with NVIDIA's driver, a
 * GPU virtual address means something only to the process that allocated it:
 * nvidia_p2p_get_pages from another process does not find it (EINVAL).
 *
 * Locking and revocation follow nvidia.ko (see egpu_main.rs for the table of
 * behaviours and their sources): a free runs the free callbacks under a lock
 * standing for RM's API lock, which nvidia_p2p_get_pages, _put_pages and
 * _dma_map_pages also take; put_pages of a table that a free already unlinked
 * returns 0; the page table is freed only after its callback returns.
 *
 * Errors: EINVAL malformed request (flags, reserved, zero or unaligned length),
 * ENOMEM no free BAR range of that size, ENOENT no allocation at that address
 * owned by this file, ENODEV the device is gone, ENOTTY unknown command.
 */
#ifndef _UAPI_LINUX_GDIRECT_EGPU_H
#define _UAPI_LINUX_GDIRECT_EGPU_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define EGPU_DEVICE_PATH "/dev/gdirect_egpu"
#define EGPU_IOC_MAGIC 0xD7
/* Allocation granularity and alignment: the nv-p2p page size. */
#define EGPU_PAGE_SIZE 0x10000
/* Fake GPU virtual addresses start here: va = EGPU_VA_BASE + bar_offset. */
#define EGPU_VA_BASE 0x7e0000000000ULL
/* Free on a kernel worker: the free callbacks run in a kworker, not the caller. */
#define EGPU_FREE_FROM_WORKER 1
/* The longest delay_us of a free. */
#define EGPU_FREE_MAX_DELAY_US 1000000

struct egpu_alloc_args {
	/* in */
	__u64 len; /* a multiple of EGPU_PAGE_SIZE */
	__u32 flags; /* must be 0 */
	__u32 pad;
	/* out */
	__u64 va; /* fake GPU virtual address */
	__u64 bar_offset; /* offset of the memory in BAR2 */
};

struct egpu_free_args {
	/* in */
	__u64 va; /* as returned by ALLOC */
	__u32 flags; /* 0 or EGPU_FREE_FROM_WORKER */
	/*
	 * Debug knob: hold the driver lock this long (at most
	 * EGPU_FREE_MAX_DELAY_US) between unlinking the mappings, after which
	 * put_pages finds nothing, and running their free callbacks.
	 */
	__u32 delay_us;
	/* out: how many mappings the free revoked (callbacks run) or deferred (persistent) */
	__u32 callbacks;
	__u32 deferred;
};

struct egpu_info_args {
	/* out */
	__u64 bar_bus_addr; /* PCI bus address of BAR2 */
	__u64 bar_len;
	__u64 free_bytes;
	__u32 allocations; /* live allocations, all files */
	__u32 mappings; /* nv-p2p page tables handed out and not yet put or revoked */
	__u64 callbacks; /* free callbacks run since load */
	/* put_pages calls that found their table unlinked by a free, and returned 0 */
	__u64 puts_unlinked;
	/* put_pages calls from another process than get_pages's: they put nothing, return 0 */
	__u64 puts_foreign;
};

#define EGPU_IOC_ALLOC _IOWR(EGPU_IOC_MAGIC, 0x00, struct egpu_alloc_args)
#define EGPU_IOC_FREE _IOWR(EGPU_IOC_MAGIC, 0x01, struct egpu_free_args)
#define EGPU_IOC_INFO _IOR(EGPU_IOC_MAGIC, 0x02, struct egpu_info_args)

#endif /* _UAPI_LINUX_GDIRECT_EGPU_H */
