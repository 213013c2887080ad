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
 * address a CUDA program would pass to the nv-p2p functions. Its 64 KiB pages
 * are scattered over BAR2, as a GPU's memory manager places them: never
 * adjacent where the free space allows, at places a seed (the scatter_seed
 * parameter) makes reproducible. The page directory, BAR2's last 64 KiB page,
 * says where each is (EGPU_PAGEDIR_*): mmap /sys/bus/pci/devices/<bdf>/resource2
 * in the guest, or read the host's backing file at the same offsets. A new
 * allocation is filled with EGPU_POISON; a freed one with EGPU_FREED_POISON,
 * which the next allocation of each page checks is still whole (a kernel
 * warning if not: something wrote GPU memory after its free). nv-p2p page
 * tables are limited by the emulated BAR1 aperture (the bar1_mib parameter):
 * nvidia_p2p_get_pages fails with -ENOMEM when it is full.
 *
 * Allocations belong to the open file that made them (or, made with
 * EGPU_ALLOC_KEPT, to none: they live until freed with EGPU_FREE_KEPT or the
 * driver is unbound): FREE or closing the file frees them, and, as
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
 * ENOMEM not enough free GPU memory or virtual space of that size, ENOENT no allocation at that address
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
/* Free a kept allocation (any file may). */
#define EGPU_FREE_KEPT 2
/* Allocate memory that belongs to no file: it outlives the file until EGPU_FREE_KEPT or unbind. */
#define EGPU_ALLOC_KEPT 1
/* The byte a new allocation is filled with, and the byte freed memory is. */
#define EGPU_POISON 0xe9
#define EGPU_FREED_POISON 0x6b
/*
 * The page directory, in BAR2's last EGPU_PAGE_SIZE bytes: a header (the
 * little-endian u64 EGPU_PAGEDIR_MAGIC, "EGPUDIR1" in memory order, then the
 * u32 number of entries and a reserved u32), then one little-endian u32 per
 * GPU virtual page (va = EGPU_VA_BASE + index * EGPU_PAGE_SIZE): the index of
 * the BAR page backing it plus one, 0 where unmapped.
 */
#define EGPU_PAGEDIR_MAGIC 0x3152494455504745ULL
#define EGPU_PAGEDIR_HEADER 16
/* The longest delay_us of a free. */
#define EGPU_FREE_MAX_DELAY_US 1000000

struct egpu_alloc_args {
	/* in */
	__u64 len; /* a multiple of EGPU_PAGE_SIZE */
	__u32 flags; /* 0 or EGPU_ALLOC_KEPT */
	__u32 pad;
	/* out */
	__u64 va; /* fake GPU virtual address */
	__u64 bar_offset; /* offset in BAR2 of its first page (the others: the page directory) */
};

struct egpu_free_args {
	/* in */
	__u64 va; /* as returned by ALLOC */
	__u32 flags; /* EGPU_FREE_FROM_WORKER, EGPU_FREE_KEPT */
	/*
	 * Debug knob: hold the driver lock this long (at most
	 * EGPU_FREE_MAX_DELAY_US) between unlinking the mappings, after which
	 * put_pages finds nothing, and running their free callbacks.
	 */
	__u32 delay_us;
	/* out: how many mappings the free revoked (callbacks run) or deferred (persistent) */
	__u32 callbacks;
	__u32 deferred;
	/*
	 * out: how long the clients' free callbacks ran, in ns, all together (the time the
	 * driver's lock is held for them: every other user of the GPU driver waits that long)
	 */
	__u64 callback_ns;
};

struct egpu_info_args {
	/* out */
	__u64 bar_bus_addr; /* PCI bus address of BAR2 */
	__u64 bar_len;
	__u64 free_bytes;
	__u32 allocations; /* live allocations, all files, not counting kept ones */
	__u32 mappings; /* nv-p2p page tables handed out and not yet put or revoked */
	__u64 callbacks; /* free callbacks run since load */
	/* put_pages calls that found their table unlinked by a free, and returned 0 */
	__u64 puts_unlinked;
	/* put_pages calls from another process than get_pages's: they put nothing, return 0 */
	__u64 puts_foreign;
	__u32 kept; /* live kept allocations (EGPU_ALLOC_KEPT) */
	__u32 pad;
	__u64 bar1_size; /* the emulated BAR1 aperture */
	__u64 bar1_used; /* bytes of it that handed-out page tables map */
	/*
	 * nvidia_p2p_free_page_table calls from a client's free callback, on the table that
	 * callback is about, while that table was still linked: nv-p2p's rule (the callback
	 * hands its table back with this function, never with put_pages)
	 */
	__u64 callback_frees;
	/* nvidia_p2p_free_page_table calls anywhere else: outside a callback, another table */
	__u64 stray_frees;
	/*
	 * get_pages calls that handed out the struct of the table freed last again (the
	 * reuse_tables knob), as a slab hands back the object freed last
	 */
	__u64 tables_reused;
};

#define EGPU_IOC_ALLOC _IOWR(EGPU_IOC_MAGIC, 0x00, struct egpu_alloc_args)
#define EGPU_IOC_FREE _IOWR(EGPU_IOC_MAGIC, 0x01, struct egpu_free_args)
#define EGPU_IOC_INFO _IOR(EGPU_IOC_MAGIC, 0x02, struct egpu_info_args)

#endif /* _UAPI_LINUX_GDIRECT_EGPU_H */
