// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! gdirect_egpu: the emulated GPU of the gdirect test rig. Test-only.
//!
//! A PCI driver for the rig's ivshmem device (1af4:1110), whose 256 MiB BAR2 is backed by a file
//! in the host's `/dev/shm`. Two BAR modes, chosen at load (`nopages=`): **p2pdma** (the default)
//! registers BAR2 as PCI P2PDMA memory at probe, so the block layer and gdirect see its pages as
//! P2P pages, as with NVIDIA's P2PDMA mode (nvidia-uvm's `uvm_pmm_gpu_device_p2p_init()` over a
//! static, uncached BAR1 mapping); **nopages** leaves BAR2 plain memory without `struct page`,
//! as BAR1 is in every other configuration of NVIDIA's driver.
//! Programs get "GPU allocations" from `/dev/gdirect_egpu` (`tests/egpu/gdirect_egpu.h`), and
//! this module exports the NVIDIA nv-p2p kernel interface over those allocations with the
//! semantics of `nvidia.ko`: `nvidia_p2p_get_pages` mappings are revoked through their free
//! callback when the allocation is freed (as by `cudaFree`), persistent mappings keep the memory
//! until they are put, and page tables and DMA mappings are the driver's to free.
//!
//! One [`Egpu`] exists per bound device (the rig has one); it is reachable from the exported
//! functions through [`DEVICE`].
//!
//! The NVIDIA interface comes from the emulator's own definitions (`nv_p2p_h.rs`, written from
//! NVIDIA's header), never from gdirect's module: `independent.sh` fails the build if any file
//! of the module is included by or shared with this one. Parameters choose the driver
//! generation emulated (`nv_driver=535` or `580`) and, for tests, a page-table version no
//! driver has made yet (`page_table_version=`).
//!
//! Locking mirrors the open NVIDIA driver (`NVIDIA/open-gpu-kernel-modules`, 595.45.04), which
//! is what a client can observe: [`API_LOCK`] stands for RM's API lock. `rm_p2p_get_pages`,
//! `rm_p2p_put_pages` and `rm_p2p_dma_map_pages` (`arch/nvalloc/unix/src/osapi.c`) each take it
//! (`rmapiLockAcquire`), and a free (`cudaFree`: an RM free of the video memory, which holds it)
//! runs the free callbacks under it (`video_mem.c` -> `CliUnregisterMemoryFromThirdPartyP2P` ->
//! `CliDelThirdPartyP2PVidmemInfo` in `gpu/bus/third_party_p2p.c`). So a client that waits in
//! its callback for something that calls one of those functions deadlocks, and lockdep sees the
//! inversion. `Egpu::inner` nests inside it and is never held while a callback runs.
//!
//! What each exported function does, against its original in `kernel-open/nvidia/nv-p2p.c`:
//!
//! | behaviour | nvidia.ko |
//! |---|---|
//! | get_pages without a free callback: `-EINVAL` | `nvidia_p2p_get_pages` |
//! | a VA of another process or not allocated: `-EINVAL` | `rm_p2p_get_pages` -> `NV_ERR_INVALID_ARGUMENT` |
//! | get/put/dma_map take the API lock | `rm_p2p_get_pages`, `rm_p2p_put_pages`, `rm_p2p_dma_map_pages` |
//! | free callbacks run under the API lock, in the freeing thread | `CliDelThirdPartyP2PVidmemInfo` |
//! | ... which need not be the registration's user: a deferred last close (a kworker), GPU removal (`EGPU_FREE_FROM_WORKER`) | `nvidia_close`, `nv_pci_remove` |
//! | the client's callback runs first, with its table still linked; the table is unlinked and freed after it returns | `nv_p2p_mem_info_free_callback` |
//! | `dma_unmap_pages` from inside the callback finds the table and unmaps | `nvidia_p2p_dma_unmap_pages` -> `nv_p2p_remove_dma_mapping` (the table's own lock) |
//! | page tables stamped with the emulated series' `NVIDIA_P2P_PAGE_TABLE_VERSION` (1.2 up to 575, 2.0 with `flags` from 580.65.06), in an allocation of exactly that layout's size | `nv_p2p_get_pages` |
//! | each `struct nvidia_p2p_page` a separate allocation | `nv_p2p_get_pages`: `NV_KMEM_CACHE_ALLOC(nvidia_p2p_page_t_cache)` |
//! | the process is the global tgid, whatever pid namespace the caller is in | `os_get_current_process()`: `current->tgid` |
//! | put_pages of a table that teardown already unlinked returns 0 | `nv_p2p_put_pages`: `NV_ERR_OBJECT_NOT_FOUND` -> `NV_OK` |
//! | put_pages while a free runs the callback blocks on the API lock, then returns 0 | as above |
//! | put_pages from another process than get_pages's (or a kworker) puts nothing, returns 0 | `RmP2PGetInfoWithoutToken` (`osGetCurrentProcess()`) |
//! | dma_unmap of a mapping no longer listed returns 0 | `nvidia_p2p_dma_unmap_pages` |
//! | dma_map allows every peer (no P2PDMA switch rules) and maps each page with `dma_map_resource` | `rm_p2p_dma_map_pages`: `nv_grdma_pci_topology_supported`, `nv_dma_map_peer` -> `nv_dma_map_mmio` |
//! | free_page_table and free_dma_mapping do nothing (the emulator counts who calls free_page_table: the callback of a still-linked table, or anyone else) | `nvidia_p2p_free_page_table`, `nvidia_p2p_free_dma_mapping` |
//! | persistent mappings keep freed memory until put | `rm_p2p_put_pages_persistent` |
//! | an allocation's 64 KiB pages are wherever the memory manager put them, not one run of the BAR; each page-table entry is its own page's address | `nv_p2p_get_pages`: one `physical_address` per entry from RM's page list |
//! | a page table maps its range into BAR1, which is finite (`bar1_mib=`), sharing what earlier tables of the same memory mapped: a full aperture fails get_pages with `-ENOMEM` | `RmThirdPartyP2PBAR1GetPages` (`gpu/bus/p2p.c`) -> NV_ERR_INSUFFICIENT_RESOURCES -> `nvidia_p2p_map_status` |
//!
//! Harsher than the hardware, where the real driver would touch freed memory: using a page
//! table after it was freed (dma_map/dma_unmap/put_pages_persistent of an unknown table) is a
//! `WARN` (fatal on the debug kernel, a kernel report that fails the run on the other). Every
//! new allocation is poisoned (filled with `POISON`, where `cudaMalloc` leaves what was there),
//! so that a read that moved nothing cannot pass for one that landed; freed memory is poisoned
//! too (`FREED_POISON`), and a page given out again is first checked to still hold that
//! pattern, and so is every freed page at unbind, so a DMA that landed after the free is a
//! `WARN` (freed pages are reused last). Pages are scattered at random (`scatter_seed=`), no
//! page next to the one before it where the free space allows, so that a client that computes
//! a page's address from its neighbour's reads or writes the wrong place.
//! Where the pages are is in the page directory, BAR2's last page (`PAGEDIR_MAGIC`), for the
//! rig's tools and the host to follow.
//! Debug knob: `EGPU_IOC_FREE`'s `delay_us` holds the API lock that long between unlinking the
//! mappings and running their callbacks, so tests force put_pages into that window.
//! Test knob `reuse_tables=1`: the page table struct freed last is handed to the next
//! get_pages (a slab's per-CPU free list hands back the object freed last, so in nvidia.ko a
//! new table often has a freed one's address, the key put_pages finds a table by): a client
//! whose put of a freed table runs after a new get_pages puts the new table.

use core::{
    ffi::c_void,
    ptr::NonNull, //
};
use kernel::{
    bindings,
    device::Core,
    driver,
    fs::File,
    ioctl::{
        _IOC_NR,
        _IOC_SIZE,
        _IOC_TYPE,
        _IOR,
        _IOWR, //
    },
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc,
        Mutex, //
    },
    transmute::{
        AsBytes,
        FromBytes, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
};

mod egpu_misc;
mod nv_p2p_h;

use egpu_misc::OwnedMiscDevice;
use nv_p2p_h::{
    FreeCallback,
    Generation,
    NvidiaP2pDmaMapping,
    NvidiaP2pPage,
    NvidiaP2pPageTableR535,
    NvidiaP2pPageTableR580,
    PageTablePtr, //
};

module! {
    type: EgpuModule,
    name: "gdirect_egpu",
    authors: ["The gdirect authors"],
    description: "gdirect test rig: emulated GPU memory with the NVIDIA nv-p2p interface",
    license: "GPL",
    params: {
        nopages: u32 {
            default: 0,
            description: "0: BAR2 is P2PDMA memory with struct pages (NVIDIA's P2PDMA mode, the default); 1: plain BAR without struct pages (classic BAR1)",
        },
        nv_driver: u32 {
            default: 580,
            description: "the NVIDIA driver series emulated: 515 to 579 make nv-p2p page tables of version 1.2 (no flags), 580 to 599 of version 2.0 (with flags), as 580.65.06 and later do",
        },
        page_table_version: u32 {
            default: 0,
            description: "test knob: stamp this NVIDIA_P2P_PAGE_TABLE_VERSION into the page tables instead of the series' (0), to show a client a generation it does not know",
        },
        cpu_cacheable: u32 {
            default: 0,
            description: "1: set NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE in page tables of version 2 (nvidia.ko sets it for memory the CPU reaches coherently)",
        },
        bar1_mib: u32 {
            default: 0,
            description: "size of the emulated BAR1 aperture in MiB (0: as large as the device memory, as on GPUs with a static BAR1): nvidia_p2p_get_pages fails with -ENOMEM when the page tables handed out would map more",
        },
        reuse_tables: u32 {
            default: 0,
            description: "test knob: 1: the page table freed last (put or revoked) is kept, and the next get_pages hands out the same struct, as a slab's per-CPU free list hands back the object freed last; a client that puts a table after its free then puts the new one",
        },
        scatter_seed: u32 {
            default: 1,
            description: "seed of the placement of allocations' 64 KiB pages in BAR2: scattered, never adjacent where the free space allows (reproducible for a seed)",
        },
    },
}

/// The BAR that holds the device memory.
const BAR: u32 = 2;
/// Allocation granularity and alignment, and the nv-p2p page size (`EGPU_PAGE_SIZE`).
const PAGE: u64 = 0x10000;
/// Fake GPU virtual addresses: `VA_BASE + bar_offset` (`EGPU_VA_BASE`).
const VA_BASE: u64 = 0x7e00_0000_0000;
/// The ioctl type byte (`EGPU_IOC_MAGIC`).
const IOC_MAGIC: u32 = 0xD7;
/// The fake UUID reported in page tables.
const GPU_UUID: [u8; 16] = *b"gdirect-egpu-001";
/// The byte every new allocation is filled with before its owner gets it. `cudaMalloc` leaves
/// memory as the last user left it; the emulator is harsher, so that a transfer that moved
/// nothing, or too little, can never pass for one that landed: what a read did not write is
/// this byte, never an earlier round's right answer.
const POISON: u8 = 0xe9;
/// The byte freed memory is filled with (`EGPU_FREED_POISON`): a free overwrites the pages it
/// returns, so that nothing can read a freed allocation's bytes, and the next allocation of a
/// page checks that the pattern is still whole (a sample: 8 bytes of every 512),
/// so that a DMA that landed after the free is reported (a `WARN`, which fails the run).
const FREED_POISON: u8 = 0x6b;

/// ivshmem's register BAR (`IntrMask` at 0, `IntrStatus`, `IVPosition`, `Doorbell`), mapped to
/// leave marks in QEMU's trace (`memory_region_ops_write` of `ivshmem-mmio`): no part of
/// nvidia.ko, a witness for the rig. A free that revokes page tables writes
/// `FREE_MARK | (its number & 0xffff)` to `IntrMask`, then `PAGE_MARK | page` for each BAR page
/// of the allocations whose tables it revokes, before its first callback runs (ivshmem raises
/// nothing: its interrupt status stays 0). From them the host tells which device DMA into
/// those pages was outstanding when the free began (`tests/vm/dma_trace.py frees`).
const REG_BAR: u32 = 0;
const REG_BAR_LEN: usize = 256;
const REG_INTRMASK: usize = 0;
const FREE_MARK: u32 = 0x4652_0000;
const PAGE_MARK: u32 = 0x5047_0000;
/// The emulated GPU's page directory (`EGPU_PAGEDIR_*`): the last `PAGE` of BAR2, which no
/// allocation gets. As a GPU keeps its MMU's page tables in its own memory, the emulator keeps
/// there which BAR page backs each GPU virtual page, so that the test tools in the guest (through
/// the BAR) and the host (through the backing file) find an allocation's scattered pages
/// without asking the driver: a header (`PAGEDIR_MAGIC`, then the number of entries, u32, and a
/// reserved u32), then one little-endian u32 per GPU virtual page: its BAR page index plus one,
/// 0 where unmapped.
const PAGEDIR_MAGIC: u64 = u64::from_le_bytes(*b"EGPUDIR1");
/// Bytes of the page directory's header.
const PAGEDIR_HEADER: usize = 16;

kernel::sync::global_lock! {
    // SAFETY: `EgpuModule::init` initializes it before registering the driver and the device.
    unsafe(uninit) static DEVICE: Mutex<Option<Arc<Egpu>>> = None;
}

kernel::sync::global_lock! {
    // SAFETY: `EgpuModule::init` initializes it before registering the driver and the device.
    unsafe(uninit) static API_LOCK: Mutex<()> = ();
}

/// The task holding [`API_LOCK`] (its `task_struct` address), 0 when none: RM's
/// `rmapiLockIsOwner()`.
static API_OWNER: Atomic<usize> = Atomic::new(0);

/// The calling task, as [`API_OWNER`] records it.
fn current_task() -> usize {
    kernel::current!().as_ptr() as usize
}

/// Holds [`API_LOCK`] and records its owner while held.
struct ApiLock {
    _guard: kernel::sync::lock::GlobalGuard<API_LOCK>,
}

impl Drop for ApiLock {
    fn drop(&mut self) {
        API_OWNER.store(0, Relaxed);
    }
}

/// Takes the API lock as `rmapiLockAcquire` does: a task that already holds it (a client's
/// free callback calling get_pages, put_pages or dma_map_pages) is refused with
/// `NV_ERR_INVALID_LOCK_STATE` (`rmapi.c`), which nv-p2p answers with `-EIO`, and put_pages
/// with a `WARN_ON` as well (`nv_p2p_put_pages`), a kernel report that fails the run here.
fn api_lock() -> Result<ApiLock> {
    if API_OWNER.load(Relaxed) == current_task() {
        return Err(EIO);
    }
    let guard = API_LOCK.lock();
    API_OWNER.store(current_task(), Relaxed);
    Ok(ApiLock { _guard: guard })
}

/// The bound device, or `ENODEV`.
fn device() -> Result<Arc<Egpu>> {
    DEVICE.lock().clone().ok_or(ENODEV)
}

/// A CPU mapping of all of BAR2 (`ioremap`), through which new allocations are poisoned;
/// unmapped when the device state goes.
struct BarMapping(NonNull<c_void>);
// SAFETY: an address range, written only by `Egpu::alloc` at ranges the allocator has
// reserved for the caller, so no two threads write the same bytes.
unsafe impl Send for BarMapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for BarMapping {}
impl Drop for BarMapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `ioremap` in `probe`, unmapped once, here.
        unsafe { bindings::iounmap(self.0.as_ptr().cast()) };
    }
}

/// A CPU mapping of ivshmem's register BAR (`REG_BAR`), unmapped when the device state goes.
struct RegMapping(kernel::io::MmioRaw<REG_BAR_LEN>);
impl RegMapping {
    /// Writes `value` to the register at `offset`.
    fn write32<const OFFSET: usize>(&self, value: u32) {
        use kernel::io::Io;
        // SAFETY: `self.0` is the `ioremap` of `REG_BAR_LEN` bytes of the bound device's
        // register BAR (`probe`), mapped until `drop`.
        let io = unsafe { kernel::io::Mmio::from_raw(&self.0) };
        io.write32(value, OFFSET);
    }
}
impl Drop for RegMapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `ioremap` in `probe`, unmapped once, here.
        unsafe { bindings::iounmap(self.0.addr() as *mut c_void) };
    }
}

/// A raw pointer that the locked state owns; only dereferenced as documented where it is used.
struct Owned<T>(NonNull<T>);
// SAFETY: the pointees are heap objects owned by `Inner` and only touched under its lock or after
// being taken out of it.
unsafe impl<T> Send for Owned<T> {}

/// The `struct nvidia_p2p_page_table` handed to a client, in its generation's layout and in an
/// allocation of exactly its size, so that a client reading a field its generation lacks
/// (`flags` of a version 1.2 table) reads past the allocation, which KASAN reports: harsher
/// than nvidia.ko, whose table sits inside its larger `nv_p2p_mem_info`.
enum TableStruct {
    R535(KBox<NvidiaP2pPageTableR535>),
    R580(KBox<NvidiaP2pPageTableR580>),
}

/// A page table handed out by `nvidia_p2p_get_pages*`, with the storage it points into: each
/// `struct nvidia_p2p_page` in an allocation of its own, as `nv_p2p_get_pages` takes each from
/// its `nvidia_p2p_page_t_cache`.
struct TableBox {
    table: TableStruct,
    /// Storage the client's table points into: held, never read here, freed with the table.
    #[expect(dead_code, reason = "owned for the table's pointers into it")]
    pages: KVec<KBox<NvidiaP2pPage>>,
    #[expect(dead_code, reason = "owned for the table's pointers into it")]
    page_ptrs: KVec<*mut NvidiaP2pPage>,
    #[expect(dead_code, reason = "owned for the table's pointers into it")]
    uuid: KBox<[u8; nv_p2p_h::GPU_UUID_LEN]>,
    /// The physical address of each page (the emulator's own record, never read back from
    /// what the client was given).
    phys: KVec<u64>,
}

impl TableBox {
    /// The address the client knows the table by.
    fn ptr(&self) -> PageTablePtr {
        match &self.table {
            TableStruct::R535(t) => core::ptr::from_ref::<NvidiaP2pPageTableR535>(t)
                .cast_mut()
                .cast(),
            TableStruct::R580(t) => core::ptr::from_ref::<NvidiaP2pPageTableR580>(t)
                .cast_mut()
                .cast(),
        }
    }
}

/// A DMA mapping handed out by `nvidia_p2p_dma_map_pages`.
struct DmaBox {
    mapping: KBox<NvidiaP2pDmaMapping>,
    addrs: KVec<u64>,
    peer: ARef<pci::Device>,
}

impl DmaBox {
    /// The address the client knows the mapping by.
    fn ptr(&self) -> *mut NvidiaP2pDmaMapping {
        core::ptr::from_ref::<NvidiaP2pDmaMapping>(&self.mapping).cast_mut()
    }
}

/// One nv-p2p page table on an allocation.
struct Mapping {
    table: KBox<TableBox>,
    persistent: bool,
    /// The process that made it (its global tgid): nvidia.ko's put_pages finds a mapping only
    /// from there.
    tgid: i32,
    callback: Option<FreeCallback>,
    data: *mut c_void,
    dmas: KVec<KBox<DmaBox>>,
    /// Its first page in the allocation (its pages: `table.phys.len()` from there).
    first_page: usize,
}
// SAFETY: `data` is the caller's opaque pointer, only passed back to its callback.
unsafe impl Send for Mapping {}

/// One "GPU allocation": a run of GPU virtual pages, each backed by a BAR page of its own,
/// scattered over the BAR as a GPU's memory manager places them (never in one run).
struct Alloc {
    /// Its first GPU virtual page: its address is `VA_BASE + va_page * PAGE`.
    va_page: usize,
    /// The BAR page backing each of its virtual pages, in order.
    pages: KVec<u32>,
    /// For each of its pages, the page tables whose BAR1 mapping covers it: BAR1 space is
    /// taken by the first and given back by the last.
    bar1_refs: KVec<u32>,
    len: u64,
    /// The file that made it, or [`KEPT`].
    owner: u64,
    /// The process that allocated it: as in NVIDIA's driver, a GPU virtual address means
    /// something only in its own process's address space.
    tgid: i32,
    /// Freed by its owner, kept for its persistent mappings.
    freed: bool,
    mappings: KVec<Mapping>,
}

/// The calling process, by its global tgid: `current->tgid`, as nvidia.ko's
/// `os_get_current_process()` (`kernel-open/nvidia/os-interface.c`) returns it, whatever pid
/// namespace the caller is in.
fn current_tgid() -> i32 {
    // The tgid in the initial pid namespace, which is `current->tgid`, read through C: the
    // Rust bindings misplace `task_struct`'s later fields on a kernel without SCHEDSTATS (the
    // rig's; the module's C shim says why), and a field read gave -1 for every task.
    // SAFETY: `init_pid_ns` is the kernel's static initial namespace, valid forever.
    let init =
        unsafe { kernel::pid_namespace::PidNamespace::from_ptr(&raw const bindings::init_pid_ns) };
    kernel::current!().tgid_nr_ns(Some(init))
}

impl Alloc {
    fn va(&self) -> u64 {
        VA_BASE + self.va_page as u64 * PAGE
    }
    fn contains(&self, va: u64, len: u64) -> bool {
        va >= self.va() && len <= self.len && va - self.va() <= self.len - len
    }
}

/// The owner of kept allocations (`EGPU_ALLOC_KEPT`): no file (file identities start at 1).
const KEPT: u64 = 0;

/// The state of the device memory, under `Egpu::inner`.
struct Inner {
    /// One entry per `PAGE` of BAR2 that allocations may use (all but the page directory): in
    /// use or not.
    used: KVec<bool>,
    /// Which free BAR pages a free of this load poisoned (`FREED_POISON`): checked when reused.
    freed: KVec<bool>,
    /// One entry per GPU virtual page: in use or not.
    va_used: KVec<bool>,
    allocs: KVec<Alloc>,
    /// Page tables held by clients: handed out and neither put nor being revoked by a free.
    mappings: u32,
    /// Bytes of BAR1 that the handed-out page tables map: a page once, however many tables
    /// cover it (`Alloc::bar1_refs`).
    bar1_used: u64,
    /// The placement generator's state (xorshift64, from `scatter_seed`).
    rng: u64,
    /// The table struct freed last, kept for the next get_pages (`reuse_tables`).
    recycled: Option<Recycled>,
}

/// A freed page table's struct, kept to be handed out again (`reuse_tables`).
struct Recycled(TableStruct);
// SAFETY: the struct's pointers (into the storage of the table it was) are never read again:
// get_pages overwrites every field before handing it out.
unsafe impl Send for Recycled {}

impl Inner {
    /// The next number of the placement generator.
    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Takes a free BAR page for the page after `prev` of an allocation, at a random place: one
    /// adjacent to `prev` (either side) only when no other is free, one freed earlier in this
    /// load only when no never-used one is.
    fn take_page(&mut self, prev: Option<usize>) -> Option<usize> {
        let n = self.used.len();
        let apart = |p: usize| prev.is_none_or(|q| p + 1 != q && q + 1 != p);
        let mut pick = None;
        // Pages freed in this load wait (a quarantine) until no other is free: what landed in
        // freed memory stays there, for the check at reuse or at unbind to find.
        for _ in 0..32 {
            let p = (self.random() % n as u64) as usize;
            if !self.used[p] && !self.freed[p] && apart(p) {
                pick = Some(p);
                break;
            }
        }
        if pick.is_none() {
            let start = (self.random() % n as u64) as usize;
            let free = |p: &usize| !self.used[*p];
            let fresh = |p: &usize| !self.used[*p] && !self.freed[*p];
            let order = || (0..n).map(|k| (start + k) % n);
            pick = order()
                .filter(fresh)
                .find(|p| apart(*p))
                .or_else(|| order().filter(free).find(|p| apart(*p)))
                .or_else(|| order().find(free));
        }
        let p = pick?;
        self.used[p] = true;
        Some(p)
    }
}

/// The emulated GPU.
#[pin_data]
struct Egpu {
    pdev: ARef<pci::Device>,
    bar_start: u64,
    bar_len: u64,
    /// The P2PDMA provider of BAR2 (device-managed: valid while the driver is bound); `None` in
    /// nopages mode.
    provider: Option<Owned<bindings::p2pdma_provider>>,
    /// PCI bus address minus CPU physical address of BAR2.
    bus_offset: u64,
    /// BAR2 as the CPU sees it, for poisoning new allocations.
    bar: BarMapping,
    /// The register BAR, for the marks of frees in QEMU's trace (`REG_BAR`).
    regs: RegMapping,
    /// Frees that revoked page tables (numbering their marks).
    marked_frees: Atomic<u32>,
    callbacks: Atomic<u64>,
    /// put_pages calls that found their table already unlinked by a free (and returned 0).
    puts_unlinked: Atomic<u64>,
    /// put_pages calls from another process than the one that got the pages (returned 0,
    /// put nothing).
    puts_foreign: Atomic<u64>,
    /// The page table whose client's free callback runs now (null: none). Callbacks run one
    /// at a time, under the API lock.
    in_callback: Atomic<usize>,
    /// free_page_table calls from a callback on its own, still linked table; and the others.
    callback_frees: Atomic<u64>,
    stray_frees: Atomic<u64>,
    /// get_pages calls that handed out a freed table's struct again (`reuse_tables`).
    tables_reused: Atomic<u64>,
    #[pin]
    inner: Mutex<Inner>,
}

// SAFETY: `provider` is only read, and lives as long as the binding that owns `Egpu`.
unsafe impl Sync for Owned<bindings::p2pdma_provider> {}

unsafe extern "C" {
    /// `dma_mapping_error()` (inline in C; `egpu_exports.c`). `dev` is a `struct device *`:
    /// bindgen's `struct device` holds a zero-sized array the `improper_ctypes` lint rejects.
    fn egpu_dma_mapping_error(dev: *mut c_void, addr: bindings::dma_addr_t) -> i32;
}

impl Egpu {
    fn phys(&self, offset: u64) -> u64 {
        self.bar_start + offset
    }

    fn bus_offset(&self) -> u64 {
        self.bus_offset
    }

    /// A pointer to `offset` of BAR2 for the CPU.
    ///
    /// # Safety
    ///
    /// `offset` is inside BAR2 (`< bar_len`).
    unsafe fn bar_at(&self, offset: usize) -> *mut c_void {
        // SAFETY: the caller keeps `offset` inside the mapping of all of BAR2.
        unsafe { self.bar.0.as_ptr().cast::<u8>().add(offset).cast() }
    }

    /// Fills BAR page `page` with `byte`.
    fn fill_page(&self, page: usize, byte: u8) {
        // SAFETY: `page` indexes `Inner::used`, whose pages all lie inside BAR2; the callers
        // own the page (reserved for an allocation not yet handed out, or being freed under
        // the lock).
        unsafe {
            bindings::memset_io(
                self.bar_at(page * PAGE as usize),
                byte.into(),
                PAGE as usize,
            )
        };
    }

    /// Whether BAR page `page`, poisoned by a free, still holds the pattern: the 8 bytes at
    /// every 512 (any write of more than 512 bytes covers one of them; a device's DMA moves
    /// whole blocks of at least that).
    fn still_freed_poison(&self, page: usize) -> bool {
        let want = u64::from_ne_bytes([FREED_POISON; 8]);
        (0..PAGE as usize).step_by(512).all(|at| {
            let mut got = 0u64;
            // SAFETY: inside BAR page `page` (as in `fill_page`); 8 bytes into a local.
            unsafe {
                bindings::memcpy_fromio(
                    (&raw mut got).cast(),
                    self.bar_at(page * PAGE as usize + at),
                    8,
                )
            };
            got == want
        })
    }

    /// Writes the page directory's entries of GPU virtual pages `va_page..` (`pages`: each one's
    /// BAR page, or `None` to unmap them).
    fn write_dir(&self, va_page: usize, n: usize, pages: Option<&[u32]>) {
        for k in 0..n {
            let entry = pages.map_or(0u32, |p| p[k] + 1).to_le_bytes();
            let at = self.dir_offset() + PAGEDIR_HEADER + (va_page + k) * 4;
            // SAFETY: `va_page + k` indexes `Inner::va_used`, one entry per usable page: the
            // entry lies inside the directory page, inside BAR2.
            unsafe { bindings::memcpy_toio(self.bar_at(at), entry.as_ptr().cast(), 4) };
        }
    }

    /// Writes the page directory's header and unmaps all its `pages` entries.
    fn write_dir_header(&self, pages: usize) {
        let mut header = [0u8; PAGEDIR_HEADER];
        header[..8].copy_from_slice(&PAGEDIR_MAGIC.to_le_bytes());
        header[8..12].copy_from_slice(&(pages as u32).to_le_bytes());
        // SAFETY: the directory page lies inside BAR2.
        unsafe {
            bindings::memcpy_toio(
                self.bar_at(self.dir_offset()),
                header.as_ptr().cast(),
                PAGEDIR_HEADER,
            )
        };
        self.write_dir(0, pages, None);
    }

    /// BAR2 offset of the page directory: its last page.
    fn dir_offset(&self) -> usize {
        (self.bar_len - PAGE) as usize
    }

    /// Allocates `len` bytes for `owner` (a file, or [`KEPT`]): a run of GPU virtual pages, each
    /// backed by a BAR page placed at random (`Inner::take_page`), checked still poisoned by its
    /// last free, then filled with `POISON`, and entered in the page directory. Returns the
    /// GPU virtual address and the BAR offset of its first page.
    fn alloc(&self, len: u64, owner: u64) -> Result<(u64, u64)> {
        if len == 0 || len % PAGE != 0 || len > self.bar_len - PAGE {
            return Err(EINVAL);
        }
        let n = (len / PAGE) as usize;
        // Everything below happens under the lock, so that no free (of a kept allocation,
        // whose address any file may name, or at unbind) meets an allocation half made.
        let mut inner = self.inner.lock();
        let va_page = first_fit(&inner.va_used, n).ok_or(ENOMEM)?;
        if inner.used.iter().filter(|u| !**u).count() < n {
            return Err(ENOMEM);
        }
        // Every allocation that can fail, first: once pages are taken nothing may fail.
        inner.allocs.reserve(1, GFP_KERNEL)?;
        let mut pages = KVec::with_capacity(n, GFP_KERNEL)?;
        let bar1_refs = KVec::from_elem(0u32, n, GFP_KERNEL)?;
        let mut prev = None;
        for _ in 0..n {
            // Cannot fail: `n` pages were free and the lock is held.
            let p = inner.take_page(prev).ok_or(ENOMEM)?;
            pages.push_within_capacity(p as u32).map_err(|_| ENOMEM)?;
            prev = Some(p);
        }
        for p in pages.iter() {
            // A page a free of this load poisoned must still hold the pattern.
            if core::mem::replace(&mut inner.freed[*p as usize], false) {
                self.check_freed_page(*p as usize);
            }
            self.fill_page(*p as usize, POISON);
        }
        self.write_dir(va_page, n, Some(&pages));
        for used in &mut inner.va_used[va_page..va_page + n] {
            *used = true;
        }
        let first = u64::from(pages[0]) * PAGE;
        let alloc = Alloc {
            va_page,
            pages,
            bar1_refs,
            len,
            owner,
            tgid: current_tgid(),
            freed: false,
            mappings: KVec::new(),
        };
        // Cannot fail: reserved above.
        inner
            .allocs
            .push_within_capacity(alloc)
            .map_err(|_| ENOMEM)?;
        Ok((VA_BASE + va_page as u64 * PAGE, first))
    }

    /// Whether the GPU has fallen off the bus (a surprise removal): its config space reads all
    /// ones, as RM finds a lost GPU by a register read of all ones (`gpuSanityCheckRegRead`,
    /// then `osHandleGpuLost`). Its BAR then decodes nothing: what a read of it returns says
    /// nothing of what was written there.
    fn fell_off_bus(&self) -> bool {
        let mut vendor: u16 = 0xffff;
        // SAFETY: `pdev` is a referenced PCI device; `vendor` is a valid location (left all
        // ones if the read fails).
        unsafe { bindings::pci_read_config_word(raw_pci(&*self.pdev), 0, &mut vendor) };
        vendor == 0xffff
    }

    /// Reports (`WARN`) BAR page `page`, poisoned by a free, if it no longer holds the pattern
    /// (unless the GPU has fallen off the bus).
    fn check_freed_page(&self, page: usize) {
        if !self.still_freed_poison(page) && !self.fell_off_bus() {
            pr_err!(
                "BAR page {page} (offset {:#x}) was written after it was freed: a DMA or a CPU \
                 write reached GPU memory its owner had given back\n",
                page as u64 * PAGE
            );
            kernel::warn_on!(true);
        }
    }

    /// Marks the allocations of `owner` (all, or the one at `va`) freed: returns what the free
    /// must revoke (each non-persistent table, still linked) and the number of persistent
    /// mappings that keep their memory for now. Allocations without mappings go at once.
    fn begin_free(&self, owner: u64, va: Option<u64>) -> Result<(KVec<Revoke>, u32)> {
        let matches = |a: &Alloc| a.owner == owner && !a.freed && va.is_none_or(|va| va == a.va());
        let mut inner = self.inner.lock();
        // Room for every table to revoke, reserved first: once an allocation is marked freed
        // nothing may fail, or a free callback would never run.
        let count = inner
            .allocs
            .iter()
            .filter(|a| matches(&**a))
            .map(|a| a.mappings.iter().filter(|m| !m.persistent).count())
            .sum();
        let mut revoke = KVec::with_capacity(count, GFP_KERNEL)?;
        if count > 0 {
            let n = self.marked_frees.fetch_add(1, Relaxed);
            self.regs.write32::<REG_INTRMASK>(FREE_MARK | (n & 0xffff));
        }
        let mut deferred = 0;
        let mut found = false;
        for a in inner.allocs.iter_mut().filter(|a| matches(&**a)) {
            found = true;
            a.freed = true;
            if a.mappings.iter().any(|m| !m.persistent) {
                for p in a.pages.iter() {
                    // (A BAR holds at most 16381 pages: the index fits.)
                    self.regs.write32::<REG_INTRMASK>(PAGE_MARK | (*p & 0xffff));
                }
            }
            for m in a.mappings.iter() {
                if m.persistent {
                    deferred += 1;
                } else {
                    let r = Revoke {
                        table: m.table.ptr(),
                        callback: m.callback,
                        data: m.data,
                    };
                    // Cannot fail: room for every table was reserved above.
                    revoke.push_within_capacity(r).map_err(|_| ENOMEM)?;
                }
            }
        }
        // The tables being revoked no longer count as held (`EGPU_IOC_INFO`'s `mappings`):
        // from here the free holds the API lock until each callback is done, and tests watch
        // the count fall to act in that window.
        inner.mappings -= revoke.len() as u32;
        reap_locked(self, &mut inner);
        drop(inner);
        if va.is_some() && !found {
            return Err(ENOENT);
        }
        Ok((revoke, deferred))
    }

    /// Frees the allocations of `owner` (all, or the one at `va`) as `cudaFree` does, under the
    /// API lock (`video_mem.c` -> `CliUnregisterMemoryFromThirdPartyP2P` ->
    /// `CliDelThirdPartyP2PVidmemInfo`, `gpu/bus/third_party_p2p.c`): marks them freed, waits
    /// `delay` (the debug knob: put_pages meanwhile blocks on the API lock), then for each page
    /// table runs the client's free callback **first**, with the table still linked (so
    /// `nvidia_p2p_dma_unmap_pages` from the callback finds it, as in nvidia.ko), and only
    /// then unlinks and frees the table (`nv_p2p_mem_info_free_callback`: the callback, then
    /// `nv_p2p_free_page_table`). Returns the numbers of callbacks run and of persistent
    /// mappings that keep their memory, and how long the callbacks ran (the lock held for them).
    fn free_and_revoke(&self, owner: u64, va: Option<u64>, delay_us: u32) -> Result<Freed> {
        let api = api_lock()?;
        let (revoke, deferred) = self.begin_free(owner, va)?;
        let callbacks = revoke.len() as u32;
        if delay_us > 0 && callbacks > 0 {
            kernel::time::delay::fsleep(kernel::time::Delta::from_micros(i64::from(delay_us)));
        }
        let mut callback_ns = 0;
        for r in revoke {
            if let Some(callback) = r.callback {
                let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
                self.in_callback.store(r.table as usize, Relaxed);
                // SAFETY: the callback and its data were given to `nvidia_p2p_get_pages` for
                // this page table, which stays linked and valid until after it returns.
                unsafe { callback(r.data) };
                self.in_callback.store(0, Relaxed);
                callback_ns += start.elapsed().as_nanos().max(0) as u64;
                self.callbacks.fetch_add(1, Relaxed);
            }
            self.unlink(r.table);
        }
        drop(api);
        Ok(Freed {
            callbacks,
            deferred,
            callback_ns,
        })
    }

    /// Unlinks a page table from its allocation (the allocation goes too once freed and
    /// without mappings) and frees it with its DMA mappings.
    fn unlink(&self, table: PageTablePtr) {
        let mut inner = self.inner.lock();
        let Some((i, j)) = Self::find_mapping_locked(&inner, table) else {
            // Only a free unlinks a non-persistent table while it holds the API lock.
            kernel::warn_on!(true);
            return;
        };
        let Ok(m) = inner.allocs[i].mappings.remove(j) else {
            return;
        };
        release_bar1_locked(&mut inner, i, &m);
        reap_locked(self, &mut inner);
        drop(inner);
        free_mapping(self, m);
    }

    /// The allocation and mapping index of a page table handed out earlier.
    fn find_mapping_locked(inner: &Inner, table: PageTablePtr) -> Option<(usize, usize)> {
        for (i, a) in inner.allocs.iter().enumerate() {
            for (j, m) in a.mappings.iter().enumerate() {
                if m.table.ptr() == table {
                    return Some((i, j));
                }
            }
        }
        None
    }
}

/// A page table a free revokes: its callback runs, then it is unlinked.
struct Revoke {
    table: PageTablePtr,
    callback: Option<FreeCallback>,
    data: *mut c_void,
}

/// Removes the allocations that are freed and hold no mapping any more, returning their BAR
/// pages to the free pool: each poisoned (`FREED_POISON`) and unmapped from the page directory
/// first, so that nothing reads a freed allocation's bytes and its pages are free only once
/// poisoned.
fn reap_locked(egpu: &Egpu, inner: &mut Inner) {
    let mut i = 0;
    while i < inner.allocs.len() {
        if inner.allocs[i].freed && inner.allocs[i].mappings.is_empty() {
            if let Ok(a) = inner.allocs.remove(i) {
                let n = a.pages.len();
                egpu.write_dir(a.va_page, n, None);
                for p in a.pages.iter() {
                    egpu.fill_page(*p as usize, FREED_POISON);
                    inner.used[*p as usize] = false;
                    inner.freed[*p as usize] = true;
                }
                for used in &mut inner.va_used[a.va_page..a.va_page + n] {
                    *used = false;
                }
            }
        } else {
            i += 1;
        }
    }
}

/// Gives back the BAR1 space of a page table taken off allocation `i`: its pages that no other
/// table of the allocation covers (`RmThirdPartyP2PMappingFree`: an extent is unmapped when its
/// last user goes).
fn release_bar1_locked(inner: &mut Inner, i: usize, m: &Mapping) {
    let a = &mut inner.allocs[i];
    let mut freed = 0;
    for r in &mut a.bar1_refs[m.first_page..m.first_page + m.table.phys.len()] {
        *r -= 1;
        if *r == 0 {
            freed += 1;
        }
    }
    inner.bar1_used -= freed * PAGE;
}

/// The first run of `n` free entries of `used`.
fn first_fit(used: &[bool], n: usize) -> Option<usize> {
    let mut run = 0;
    for (i, u) in used.iter().enumerate() {
        run = if *u { 0 } else { run + 1 };
        if run == n {
            return Some(i + 1 - n);
        }
    }
    None
}

/// `value` in `recycled` (a freed table's struct, `reuse_tables`), or in a new allocation.
fn reuse_or_box<T>(recycled: Option<KBox<T>>, value: T) -> Result<KBox<T>> {
    match recycled {
        Some(mut b) => {
            *b = value;
            Ok(b)
        }
        None => Ok(KBox::new(value, GFP_KERNEL)?),
    }
}

/// Frees a mapping's DMA mappings and page table (with `reuse_tables`, keeps the table's
/// struct for the next get_pages).
fn free_mapping(egpu: &Egpu, m: Mapping) {
    for dma in m.dmas {
        free_dma(dma);
    }
    if *module_parameters::reuse_tables.value() != 0 {
        let TableBox { table, .. } = KBox::into_inner(m.table);
        egpu.inner.lock().recycled = Some(Recycled(table));
    }
}

/// Undoes a DMA mapping's `dma_map_resource` calls (`nv_dma_unmap_peer`), then frees it.
fn free_dma(dma: KBox<DmaBox>) {
    let dev = raw_pci(&dma.peer);
    for addr in dma.addrs.iter() {
        // SAFETY: each address was mapped by `dma_map_resource` for this device and size.
        unsafe {
            bindings::dma_unmap_resource(
                &raw mut (*dev).dev,
                *addr,
                PAGE as usize,
                bindings::dma_data_direction_DMA_BIDIRECTIONAL,
                0,
            )
        };
    }
}

/// The `struct pci_dev` of a PCI device: `pci::Device` is a transparent wrapper of
/// `Opaque<bindings::pci_dev>`.
fn raw_pci<Ctx: kernel::device::DeviceContext>(pdev: &pci::Device<Ctx>) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// The PCI driver.
struct EgpuDriver;

/// What a bound device holds: dropping it (unbind) revokes every mapping.
struct Binding {
    egpu: Arc<Egpu>,
}

impl Drop for Binding {
    fn drop(&mut self) {
        DEVICE.lock().take();
        let mut owners = KVec::new();
        {
            let inner = self.egpu.inner.lock();
            for a in inner.allocs.iter() {
                if !owners.contains(&a.owner) && owners.push(a.owner, GFP_KERNEL).is_err() {
                    break;
                }
            }
        }
        let mut leaked = 0;
        for owner in owners {
            if let Ok(Freed { deferred, .. }) = self.egpu.free_and_revoke(owner, None, 0) {
                leaked += deferred;
            }
        }
        if leaked > 0 {
            pr_warn!("unbound with {leaked} persistent mapping(s) still held: leaking their page tables\n");
        }
        // Every page freed in this load must still hold the freed poison: nothing may have
        // written GPU memory after its free (a DMA the free did not wait for).
        let inner = self.egpu.inner.lock();
        for (page, _) in inner.freed.iter().enumerate().filter(|(_, f)| **f) {
            self.egpu.check_freed_page(page);
        }
    }
}

kernel::pci_device_table!(
    PCI_TABLE,
    MODULE_PCI_TABLE,
    <EgpuDriver as pci::Driver>::IdInfo,
    [(
        pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110),
        ()
    )]
);

impl pci::Driver for EgpuDriver {
    type IdInfo = ();
    type Data<'bound> = Binding;
    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: &'bound Self::IdInfo,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        let egpu = (|| -> Result<Arc<Egpu>> {
            pdev.enable_device_mem()?;
            let bar_start = pdev.resource_start(BAR)?;
            let bar_len = pdev.resource_len(BAR)?;
            if bar_len == 0 || bar_len % PAGE != 0 {
                return Err(ENODEV);
            }
            let raw = raw_pci(pdev);
            let nopages = *module_parameters::nopages.value() != 0;
            // P2PDMA mode: the BAR gets `struct page`s, as `uvm_pmm_gpu_device_p2p_init()`
            // (nvidia-uvm) gives a static BAR1 mapping. Nopages mode: plain BAR memory, as BAR1
            // is on every other configuration of NVIDIA's driver.
            let provider = if nopages {
                None
            } else {
                // SAFETY: `raw` is the bound device; the resource is device-managed.
                kernel::error::to_result(unsafe {
                    bindings::pci_p2pdma_add_resource(raw, BAR as i32, 0, 0)
                })?;
                // SAFETY: `pci_p2pdma_add_resource` initialized the device's P2PDMA state.
                let provider =
                    NonNull::new(unsafe { bindings::pcim_p2pdma_provider(raw, BAR as i32) })
                        .ok_or(ENODEV)?;
                Some(Owned(provider))
            };
            let bus_offset = match &provider {
                // SAFETY: the provider is valid while bound.
                Some(p) => unsafe { p.0.as_ref().bus_offset },
                None => {
                    let mut region = bindings::pci_bus_region::default();
                    // SAFETY: `raw` is the bound device; its bus and resource outlive the call.
                    unsafe {
                        bindings::pcibios_resource_to_bus(
                            (*raw).bus,
                            &mut region,
                            &raw mut (*raw).resource[BAR as usize],
                        )
                    };
                    region.start.wrapping_sub(bar_start)
                }
            };
            // Every page but the last, which holds the page directory: one entry per page.
            let pages = (bar_len / PAGE) as usize - 1;
            if pages == 0 || PAGEDIR_HEADER + pages * 4 > PAGE as usize {
                dev_err!(
                    pdev,
                    "BAR{BAR} of {bar_len} bytes: the page directory holds 2 to 16381 pages of 64 KiB\n"
                );
                return Err(ENODEV);
            }
            // SAFETY: `bar_start..bar_start + bar_len` is the bound device's enabled BAR2.
            let bar = unsafe { bindings::ioremap(bar_start, bar_len as usize) };
            let bar = BarMapping(NonNull::new(bar).ok_or(ENOMEM)?);
            let (reg_start, reg_len) = (pdev.resource_start(REG_BAR)?, pdev.resource_len(REG_BAR)?);
            if reg_len < REG_BAR_LEN as u64 {
                return Err(ENODEV);
            }
            // SAFETY: `reg_start..reg_start + REG_BAR_LEN` lies in the bound device's enabled
            // register BAR.
            let regs =
                NonNull::new(unsafe { bindings::ioremap(reg_start, REG_BAR_LEN) }).ok_or(ENOMEM)?;
            let regs = match kernel::io::MmioRaw::new(regs.as_ptr() as usize, REG_BAR_LEN) {
                Ok(raw) => RegMapping(raw),
                Err(e) => {
                    // SAFETY: just mapped above, and not kept.
                    unsafe { bindings::iounmap(regs.as_ptr()) };
                    return Err(e);
                }
            };
            let egpu = Arc::pin_init(
                try_pin_init!(Egpu {
                    pdev: ARef::from(&**pdev),
                    bar_start,
                    bar_len,
                    provider,
                    bus_offset,
                    bar,
                    regs,
                    marked_frees: Atomic::new(0),
                    callbacks: Atomic::new(0),
                    puts_unlinked: Atomic::new(0),
                    puts_foreign: Atomic::new(0),
                    in_callback: Atomic::new(0),
                    callback_frees: Atomic::new(0),
                    stray_frees: Atomic::new(0),
                    tables_reused: Atomic::new(0),
                    inner <- new_mutex!(Inner {
                        used: KVec::from_elem(false, pages, GFP_KERNEL)?,
                        freed: KVec::from_elem(false, pages, GFP_KERNEL)?,
                        va_used: KVec::from_elem(false, pages, GFP_KERNEL)?,
                        allocs: KVec::new(),
                        mappings: 0,
                        bar1_used: 0,
                        rng: u64::from(*module_parameters::scatter_seed.value()) | 1 << 32,
                        recycled: None,
                    }),
                }),
                GFP_KERNEL,
            )?;
            egpu.write_dir_header(pages);
            let (generation, version) = table_generation();
            dev_info!(
                pdev,
                "emulated GPU: {} MiB of device memory in BAR{BAR}, {}; NVIDIA driver series {} \
                 (nv-p2p page table {:?}, version {:#010x})\n",
                bar_len >> 20,
                if nopages {
                    "without struct pages (nopages)"
                } else {
                    "P2PDMA pages (p2pdma)"
                },
                *module_parameters::nv_driver.value(),
                generation,
                version
            );
            *DEVICE.lock() = Some(egpu.clone());
            Ok(egpu)
        })();
        egpu.map(|egpu| Binding { egpu })
    }
}

/// The arguments of `EGPU_IOC_ALLOC` (`struct egpu_alloc_args`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AllocArgs {
    len: u64,
    flags: u32,
    pad: u32,
    va: u64,
    bar_offset: u64,
}
/// The arguments of `EGPU_IOC_FREE` (`struct egpu_free_args`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FreeArgs {
    va: u64,
    flags: u32,
    delay_us: u32,
    callbacks: u32,
    deferred: u32,
    callback_ns: u64,
}
/// The arguments of `EGPU_IOC_INFO` (`struct egpu_info_args`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InfoArgs {
    bar_bus_addr: u64,
    bar_len: u64,
    free_bytes: u64,
    allocations: u32,
    mappings: u32,
    callbacks: u64,
    puts_unlinked: u64,
    puts_foreign: u64,
    kept: u32,
    pad: u32,
    bar1_size: u64,
    bar1_used: u64,
    callback_frees: u64,
    stray_frees: u64,
    tables_reused: u64,
}
kernel::static_assert!(core::mem::size_of::<AllocArgs>() == 32);
kernel::static_assert!(core::mem::size_of::<FreeArgs>() == 32);
kernel::static_assert!(core::mem::size_of::<InfoArgs>() == 104);
// SAFETY: `repr(C)` integer-only structs without padding (sizes checked above).
unsafe impl FromBytes for AllocArgs {}
// SAFETY: as above.
unsafe impl AsBytes for AllocArgs {}
// SAFETY: as above.
unsafe impl FromBytes for FreeArgs {}
// SAFETY: as above.
unsafe impl AsBytes for FreeArgs {}
// SAFETY: as above.
unsafe impl AsBytes for InfoArgs {}

const IOC_ALLOC: u32 = _IOWR::<AllocArgs>(IOC_MAGIC, 0x00);
const IOC_FREE: u32 = _IOWR::<FreeArgs>(IOC_MAGIC, 0x01);
const IOC_INFO: u32 = _IOR::<InfoArgs>(IOC_MAGIC, 0x02);

/// `EGPU_FREE_FROM_WORKER`: the free runs on a kernel worker, so the callbacks run in another
/// thread (a kworker, with no user context) than the one that asked for the free.
const FREE_FROM_WORKER: u32 = 1;
/// `EGPU_FREE_KEPT`: the allocation is a kept one (`EGPU_ALLOC_KEPT`), which any file may free.
const FREE_KEPT: u32 = 2;
/// `EGPU_ALLOC_KEPT`: the allocation belongs to no file: it outlives the file that made it
/// (for the rig's host checks, made after the program that read into it has ended) until a
/// free with `EGPU_FREE_KEPT` or the device's unbind (module unload).
const ALLOC_KEPT: u32 = 1;

/// A free handed to a kernel worker, and its outcome.
#[pin_data]
struct FreeJob {
    #[pin]
    done: kernel::sync::Completion,
    #[pin]
    result: Mutex<Option<Result<Freed>>>,
}

/// What a free did: callbacks run, persistent mappings deferred, and the callbacks' time.
struct Freed {
    callbacks: u32,
    deferred: u32,
    callback_ns: u64,
}

/// A work item of the emulator's own, with its own lockdep class: the kernel crate's
/// `try_spawn` shares one class key among all modules that call it, each naming it with its
/// own copy of the name, which lockdep reports once two modules use it.
#[pin_data]
struct FreeWork<F> {
    #[pin]
    work: kernel::workqueue::Work<FreeWork<F>>,
    func: Option<F>,
}

kernel::impl_has_work! {
    impl{F} HasWork<Self> for FreeWork<F> { self.work }
}

impl<F: FnOnce() + Send + 'static> kernel::workqueue::WorkItem for FreeWork<F> {
    type Pointer = Pin<KBox<Self>>;

    fn run(mut this: Pin<KBox<Self>>) {
        if let Some(func) = this.as_mut().project().func.take() {
            func()
        }
    }
}

/// Runs `free_and_revoke` on the system's unbound workqueue and waits for it.
fn free_from_worker(egpu: Arc<Egpu>, owner: u64, va: u64, delay_us: u32) -> Result<Freed> {
    let job = Arc::pin_init(
        pin_init!(FreeJob {
            done <- kernel::sync::Completion::new(),
            result <- new_mutex!(None),
        }),
        GFP_KERNEL,
    )?;
    let worker_job = job.clone();
    let work = KBox::pin_init(
        pin_init!(FreeWork {
            work <- kernel::new_work!("gdirect_egpu::free_from_worker"),
            func: Some(move || {
                let r = egpu.free_and_revoke(owner, Some(va), delay_us);
                *worker_job.result.lock() = Some(r);
                worker_job.done.complete_all();
            }),
        }),
        GFP_KERNEL,
    )?;
    kernel::workqueue::system_unbound().enqueue(work);
    job.done.wait_for_completion();
    let r = job.result.lock().take();
    r.unwrap_or(Err(EINVAL))
}

/// The longest `delay_us` a free may ask for (`EGPU_FREE_MAX_DELAY_US`).
const MAX_DELAY_US: u32 = 1_000_000;

/// Source of file identities: allocations belong to the file that made them.
static NEXT_FILE: Atomic<u64> = Atomic::new(1);

/// An open file of `/dev/gdirect_egpu`: a "CUDA context".
struct EgpuFile {
    id: u64,
}

#[vtable]
impl MiscDevice for EgpuFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        Ok(KBox::new(
            Self {
                id: NEXT_FILE.fetch_add(1, Relaxed),
            },
            GFP_KERNEL,
        )?)
    }

    fn release(me: KBox<Self>, _file: &File) {
        if let Ok(egpu) = device() {
            let _ = egpu.free_and_revoke(me.id, None, 0);
        }
    }

    fn ioctl(me: &EgpuFile, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        if _IOC_TYPE(cmd) != IOC_MAGIC {
            return Err(ENOTTY);
        }
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        let egpu = device()?;
        match cmd {
            IOC_ALLOC => {
                let (mut r, mut w) = user.reader_writer();
                let mut a: AllocArgs = r.read()?;
                if a.flags & !ALLOC_KEPT != 0 || a.pad != 0 {
                    return Err(EINVAL);
                }
                let owner = if a.flags & ALLOC_KEPT != 0 {
                    KEPT
                } else {
                    me.id
                };
                (a.va, a.bar_offset) = egpu.alloc(a.len, owner)?;
                w.write(&a)?;
            }
            IOC_FREE => {
                let (mut r, mut w) = user.reader_writer();
                let mut f: FreeArgs = r.read()?;
                if f.flags & !(FREE_FROM_WORKER | FREE_KEPT) != 0 || f.delay_us > MAX_DELAY_US {
                    return Err(EINVAL);
                }
                let owner = if f.flags & FREE_KEPT != 0 {
                    KEPT
                } else {
                    me.id
                };
                let freed = if f.flags & FREE_FROM_WORKER != 0 {
                    free_from_worker(egpu, owner, f.va, f.delay_us)?
                } else {
                    egpu.free_and_revoke(owner, Some(f.va), f.delay_us)?
                };
                (f.callbacks, f.deferred, f.callback_ns) =
                    (freed.callbacks, freed.deferred, freed.callback_ns);
                w.write(&f)?;
            }
            IOC_INFO => {
                let inner = egpu.inner.lock();
                let free = inner.used.iter().filter(|u| !**u).count() as u64 * PAGE;
                let kept = inner.allocs.iter().filter(|a| a.owner == KEPT).count() as u32;
                let bar1_mib = u64::from(*module_parameters::bar1_mib.value());
                let info = InfoArgs {
                    bar_bus_addr: egpu.bar_start + egpu.bus_offset(),
                    bar_len: egpu.bar_len,
                    free_bytes: free,
                    allocations: inner.allocs.len() as u32 - kept,
                    mappings: inner.mappings,
                    callbacks: egpu.callbacks.load(Relaxed),
                    puts_unlinked: egpu.puts_unlinked.load(Relaxed),
                    puts_foreign: egpu.puts_foreign.load(Relaxed),
                    kept,
                    pad: 0,
                    bar1_size: if bar1_mib == 0 {
                        egpu.bar_len - PAGE
                    } else {
                        bar1_mib << 20
                    },
                    bar1_used: inner.bar1_used,
                    callback_frees: egpu.callback_frees.load(Relaxed),
                    stray_frees: egpu.stray_frees.load(Relaxed),
                    tables_reused: egpu.tables_reused.load(Relaxed),
                };
                drop(inner);
                user.writer().write(&info)?;
            }
            _ if _IOC_NR(cmd) <= 0x02 => return Err(EINVAL),
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }
}

/// The page-table layout and version this load of the emulator hands out (its parameters).
fn table_generation() -> (Generation, u32) {
    let generation =
        Generation::of_series(*module_parameters::nv_driver.value()).unwrap_or(Generation::R580);
    match *module_parameters::page_table_version.value() {
        0 => (generation, generation.page_table_version()),
        v => (generation, v),
    }
}

/// Builds the page table of `[va, va + len)` and records it on its allocation, as
/// `nv_p2p_get_pages` does: the table in its generation's layout, each page in an allocation of
/// its own, 64 KiB pages (`NVRM_P2P_PAGESIZE_BIG_64K`), the version stamped
/// (`NVIDIA_P2P_PAGE_TABLE_VERSION`), `flags` only in version 2.
fn get_pages(
    va: u64,
    len: u64,
    out: *mut PageTablePtr,
    persistent: bool,
    callback: Option<FreeCallback>,
    data: *mut c_void,
) -> Result {
    if out.is_null() || len == 0 || va % PAGE != 0 || len % PAGE != 0 {
        return Err(EINVAL);
    }
    let egpu = device()?;
    let tgid = current_tgid();
    // `rm_p2p_get_pages` and `rm_p2p_get_pages_persistent` run under the API lock.
    let _api = api_lock()?;
    let mut inner = egpu.inner.lock();
    if !inner
        .allocs
        .iter()
        .any(|a| !a.freed && a.tgid == tgid && a.contains(va, len))
    {
        return Err(EINVAL);
    }
    let n = (len / PAGE) as usize;
    let bar1_before = inner.bar1_used;
    // The struct freed last, to be handed out again (`reuse_tables`) with every field written
    // anew (a failure below frees it).
    let recycled = inner.recycled.take().map(|r| r.0);
    let a = inner
        .allocs
        .iter_mut()
        .find(|a| !a.freed && a.tgid == tgid && a.contains(va, len))
        .ok_or(EINVAL)?;
    let first = ((va - a.va()) / PAGE) as usize;
    // BAR1 is finite. The range is mapped into it, except where an earlier page table of the
    // same memory already mapped it (`RmThirdPartyP2PBAR1GetPages`, `gpu/bus/p2p.c`: the
    // memory's mapping extents are reused, refcounted); a mapping that does not fit fails with
    // NV_ERR_INSUFFICIENT_RESOURCES, which nv-p2p returns as `-ENOMEM`
    // (`nvidia_p2p_map_status`). The real check also keeps a 36 MiB reserve
    // (`CLI_THIRD_PARTY_P2P_BAR1_RESERVE`): `bar1_mib` is the space left above it.
    let bar1_new = a.bar1_refs[first..first + n]
        .iter()
        .filter(|r| **r == 0)
        .count() as u64
        * PAGE;
    let bar1_limit = u64::from(*module_parameters::bar1_mib.value()) << 20;
    if bar1_limit != 0 && bar1_before + bar1_new > bar1_limit {
        return Err(ENOMEM);
    }
    let mut pages = KVec::with_capacity(n, GFP_KERNEL)?;
    let mut phys = KVec::with_capacity(n, GFP_KERNEL)?;
    for i in 0..n {
        // Each 64 KiB page where the allocation's memory is: scattered over the BAR.
        let p = egpu.phys(u64::from(a.pages[first + i]) * PAGE);
        phys.push(p, GFP_KERNEL)?;
        pages.push(
            KBox::new(
                NvidiaP2pPage {
                    physical_address: p,
                    wreqmb_h: 0,
                    rreqmb_h: 0,
                    rreqmb_0: 0,
                    reserved: [0; 3],
                },
                GFP_KERNEL,
            )?,
            GFP_KERNEL,
        )?;
    }
    let mut page_ptrs = KVec::with_capacity(n, GFP_KERNEL)?;
    for p in pages.iter_mut() {
        page_ptrs.push(core::ptr::from_mut::<NvidiaP2pPage>(p), GFP_KERNEL)?;
    }
    let mut uuid = KBox::new(GPU_UUID, GFP_KERNEL)?;
    let (generation, version) = table_generation();
    let (pages_ptr, uuid_ptr) = (page_ptrs.as_mut_ptr(), uuid.as_mut_ptr());
    let recycled_used = recycled.is_some();
    let table = match (generation, recycled) {
        (Generation::R535, recycled) => TableStruct::R535(reuse_or_box(
            recycled.and_then(|t| match t {
                TableStruct::R535(b) => Some(b),
                TableStruct::R580(_) => None,
            }),
            NvidiaP2pPageTableR535 {
                version,
                page_size: nv_p2p_h::PAGE_SIZE_64KB,
                pages: pages_ptr,
                entries: n as u32,
                gpu_uuid: uuid_ptr,
            },
        )?),
        (Generation::R580, recycled) => TableStruct::R580(reuse_or_box(
            recycled.and_then(|t| match t {
                TableStruct::R580(b) => Some(b),
                TableStruct::R535(_) => None,
            }),
            NvidiaP2pPageTableR580 {
                version,
                page_size: nv_p2p_h::PAGE_SIZE_64KB,
                pages: pages_ptr,
                entries: n as u32,
                gpu_uuid: uuid_ptr,
                flags: if *module_parameters::cpu_cacheable.value() != 0 {
                    nv_p2p_h::PAGE_TABLE_FLAGS_CPU_CACHEABLE
                } else {
                    0
                },
            },
        )?),
    };
    if recycled_used {
        egpu.tables_reused.fetch_add(1, Relaxed);
    }
    let table = KBox::new(
        TableBox {
            table,
            pages,
            page_ptrs,
            uuid,
            phys,
        },
        GFP_KERNEL,
    )?;
    let raw = table.ptr();
    let mapping = Mapping {
        table,
        persistent,
        tgid,
        callback,
        data,
        dmas: KVec::new(),
        first_page: first,
    };
    a.mappings.push(mapping, GFP_KERNEL)?;
    for r in &mut a.bar1_refs[first..first + n] {
        *r += 1;
    }
    inner.mappings += 1;
    inner.bar1_used += bar1_new;
    // SAFETY: the caller passes a valid location for the page table pointer (checked non-null).
    unsafe { *out = raw };
    Ok(())
}

/// Removes the page table from its allocation; frees the allocation if it was freed and this
/// was its last persistent mapping.
///
/// As `nv_p2p_put_pages`: under the API lock (so it waits for a free running callbacks); a
/// non-persistent table that a free already unlinked (its callback pending, running or done)
/// is `NV_ERR_OBJECT_NOT_FOUND`, which it turns into success. The real driver dereferences a
/// persistent table it does not know (`container_of`): a use after free, a `WARN` here.
fn put_pages(table: PageTablePtr, persistent: bool) -> Result {
    let egpu = device()?;
    let _api = api_lock().inspect_err(|_| {
        kernel::warn_on!(true);
    })?;
    let mut inner = egpu.inner.lock();
    let Some((i, j)) = Egpu::find_mapping_locked(&inner, table) else {
        if persistent {
            kernel::warn_on!(true);
            return Err(EINVAL);
        }
        egpu.puts_unlinked.fetch_add(1, Relaxed);
        return Ok(());
    };
    // `rm_p2p_put_pages` looks for the table among the calling process's records only
    // (`RmP2PGetInfoWithoutToken`: `osGetCurrentProcess()`): from another process, or a kernel
    // worker, it finds nothing, puts nothing, and returns 0.
    if !persistent && inner.allocs[i].mappings[j].tgid != current_tgid() {
        egpu.puts_foreign.fetch_add(1, Relaxed);
        return Ok(());
    }
    if inner.allocs[i].mappings[j].persistent != persistent {
        return Err(EINVAL);
    }
    let m = inner.allocs[i].mappings.remove(j).map_err(|_| EINVAL)?;
    inner.mappings -= 1;
    release_bar1_locked(&mut inner, i, &m);
    reap_locked(&egpu, &mut inner);
    drop(inner);
    free_mapping(&egpu, m);
    Ok(())
}

/// The mapping of a page table that must be live: NVIDIA's dma_map/dma_unmap reach the table's
/// `nv_p2p_mem_info` by `container_of` without any lookup, so a freed table is a use after free
/// there; here it is a `WARN` and `EINVAL`.
fn find_live_table(inner: &Inner, table: PageTablePtr) -> Result<(usize, usize)> {
    let found = Egpu::find_mapping_locked(inner, table);
    if found.is_none() {
        kernel::warn_on!(true);
    }
    found.ok_or(EINVAL)
}

fn errno(r: Result) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    }
}

/// `nvidia_p2p_get_pages`: the free callback is required.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_get_pages(
    _p2p_token: u64,
    _va_space: u32,
    virtual_address: u64,
    length: u64,
    page_table: *mut PageTablePtr,
    free_callback: Option<FreeCallback>,
    data: *mut c_void,
) -> i32 {
    if free_callback.is_none() {
        return EINVAL.to_errno();
    }
    errno(get_pages(
        virtual_address,
        length,
        page_table,
        false,
        free_callback,
        data,
    ))
}

/// `nvidia_p2p_get_pages_persistent`.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_get_pages_persistent(
    virtual_address: u64,
    length: u64,
    page_table: *mut PageTablePtr,
    flags: u32,
) -> i32 {
    // 515 to 565 refuse any flag (`-EINVAL`); from 570 only FORCE_BAR1_MAPPING is looked at
    // (other bits are ignored), and it is `NV_ERR_NOT_SUPPORTED` (`-ENOTSUPP`) unless the GPU
    // is coherent (`RmP2PGetPagesPersistent`), which the emulated one is not.
    match table_generation().0 {
        Generation::R535 if flags != 0 => return EINVAL.to_errno(),
        Generation::R580 if flags & nv_p2p_h::FLAGS_FORCE_BAR1_MAPPING != 0 => {
            return -nv_p2p_h::ENOTSUPP
        }
        _ => {}
    }
    errno(get_pages(
        virtual_address,
        length,
        page_table,
        true,
        None,
        core::ptr::null_mut(),
    ))
}

/// `nvidia_p2p_put_pages`.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_put_pages(
    _p2p_token: u64,
    _va_space: u32,
    _virtual_address: u64,
    page_table: PageTablePtr,
) -> i32 {
    errno(put_pages(page_table, false))
}

/// `nvidia_p2p_put_pages_persistent`: `flags` must be zero.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_put_pages_persistent(
    _virtual_address: u64,
    page_table: PageTablePtr,
    flags: u32,
) -> i32 {
    if flags != 0 {
        return EINVAL.to_errno();
    }
    errno(put_pages(page_table, true))
}

/// `nvidia_p2p_dma_map_pages`, as `rm_p2p_dma_map_pages` (`arch/nvalloc/unix/src/osapi.c`)
/// does on a non-coherent GPU: under the API lock, the topology check
/// (`nv_grdma_pci_topology_supported`, `kernel-open/nvidia/nv-pci.c`), which allows every peer
/// unless the GPU's chipset is flagged unsupported (not the case here: the check applies none
/// of the kernel's P2PDMA rules), then each page mapped for the peer with `dma_map_resource`
/// (`nv_dma_map_peer` -> `nv_dma_map_mmio`, `nv-dma.c`: whenever the peer's DMA ops can, which
/// dma-direct always can), the ones already mapped undone if one fails (`-EIO`).
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_dma_map_pages(
    peer: *mut bindings::pci_dev,
    page_table: PageTablePtr,
    dma_mapping: *mut *mut NvidiaP2pDmaMapping,
) -> i32 {
    let r = (|| -> Result<i32> {
        if peer.is_null() || page_table.is_null() || dma_mapping.is_null() {
            return Err(EINVAL);
        }
        let egpu = device()?;
        // SAFETY: the caller passes a valid, referenced `pci_dev`; `pci::Device` is a transparent
        // wrapper of it.
        let peer_dev: &pci::Device = unsafe { &*peer.cast::<pci::Device>() };
        let _api = api_lock()?;
        let mut inner = egpu.inner.lock();
        let (i, j) = find_live_table(&inner, page_table)?;
        let m = &mut inner.allocs[i].mappings[j];
        let n = m.table.phys.len();
        // Room to record it, first: once mapped, recording it cannot fail.
        m.dmas.reserve(1, GFP_KERNEL)?;
        let mut dma = KBox::new(
            DmaBox {
                mapping: KBox::new(
                    NvidiaP2pDmaMapping {
                        version: nv_p2p_h::DMA_MAPPING_VERSION,
                        page_size_type: nv_p2p_h::PAGE_SIZE_64KB,
                        entries: 0,
                        dma_addresses: core::ptr::null_mut(),
                        private: core::ptr::null_mut(),
                        pci_dev: peer,
                    },
                    GFP_KERNEL,
                )?,
                addrs: KVec::with_capacity(n, GFP_KERNEL)?,
                peer: ARef::from(peer_dev),
            },
            GFP_KERNEL,
        )?;
        for k in 0..n {
            let phys = m.table.phys[k];
            // SAFETY: `phys` is a page of this device's BAR; `peer` is a valid device.
            let addr = unsafe {
                bindings::dma_map_resource(
                    &raw mut (*peer).dev,
                    phys,
                    PAGE as usize,
                    bindings::dma_data_direction_DMA_BIDIRECTIONAL,
                    0,
                )
            };
            // SAFETY: as above.
            if unsafe { egpu_dma_mapping_error((&raw mut (*peer).dev).cast(), addr) } != 0 {
                free_dma(dma);
                return Ok(EIO.to_errno());
            }
            // Cannot fail: the capacity is `n`.
            dma.addrs.push_within_capacity(addr).map_err(|_| ENOMEM)?;
        }
        dma.mapping.entries = n as u32;
        dma.mapping.dma_addresses = dma.addrs.as_mut_ptr();
        let raw = dma.ptr();
        if let Err(unrecorded) = m.dmas.push_within_capacity(dma) {
            drop(inner);
            free_dma(unrecorded.0);
            return Err(ENOMEM);
        }
        // SAFETY: checked non-null; the caller passes a valid location.
        unsafe { *dma_mapping = raw };
        Ok(0)
    })();
    r.unwrap_or_else(|e| e.to_errno())
}

/// `nvidia_p2p_dma_unmap_pages`: finds the table (it must be live: nvidia.ko reaches it by
/// `container_of`), then takes the mapping off its list under the table's own lock, not the
/// API lock (`nv_p2p_remove_dma_mapping`), so a free callback may call it for its table; a
/// mapping no longer listed returns 0.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_dma_unmap_pages(
    _peer: *mut bindings::pci_dev,
    page_table: PageTablePtr,
    dma_mapping: *mut NvidiaP2pDmaMapping,
) -> i32 {
    errno((|| -> Result {
        let egpu = device()?;
        let mut inner = egpu.inner.lock();
        let (i, j) = find_live_table(&inner, page_table)?;
        let dmas = &mut inner.allocs[i].mappings[j].dmas;
        let Some(k) = dmas.iter().position(|d| d.ptr() == dma_mapping) else {
            return Ok(());
        };
        let dma = dmas.remove(k).map_err(|_| EINVAL)?;
        drop(inner);
        free_dma(dma);
        Ok(())
    })())
}

/// `nvidia_p2p_free_page_table`: a no-op, as in current NVIDIA drivers; the driver frees page
/// tables when they are put or after their free callback.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_free_page_table(page_table: PageTablePtr) -> i32 {
    if page_table.is_null() {
        return EINVAL.to_errno();
    }
    // What it does is nothing; who calls it, and when, is recorded: from the free callback of
    // this very table, while the free path still has it linked (it unlinks it after the
    // callback returns), or anywhere else.
    if let Ok(egpu) = device() {
        let ours = egpu.in_callback.load(Relaxed) == page_table as usize
            && Egpu::find_mapping_locked(&egpu.inner.lock(), page_table).is_some();
        let counter = if ours {
            &egpu.callback_frees
        } else {
            &egpu.stray_frees
        };
        counter.fetch_add(1, Relaxed);
    }
    0
}

/// `nvidia_p2p_free_dma_mapping`: a no-op, as in current NVIDIA drivers.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_free_dma_mapping(dma_mapping: *mut NvidiaP2pDmaMapping) -> i32 {
    if dma_mapping.is_null() {
        return EINVAL.to_errno();
    }
    0
}

#[pin_data]
struct EgpuModule {
    _known: (),
    #[pin]
    _misc: OwnedMiscDevice<EgpuFile>,
    #[pin]
    _driver: driver::Registration<pci::Adapter<EgpuDriver>>,
}

impl kernel::InPlaceModule for EgpuModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: called once, before anything can use `DEVICE` or `API_LOCK`.
        unsafe {
            DEVICE.init();
            API_LOCK.init();
        }
        let series = *module_parameters::nv_driver.value();
        let known = Generation::of_series(series).is_some();
        if !known {
            pr_err!("nv_driver={series}: not a driver series with nv-p2p (515 to 599)\n");
        }
        try_pin_init!(Self {
            _known: if known { Ok(()) } else { Err(EINVAL) }?,
            _misc <- OwnedMiscDevice::register(c"gdirect_egpu", 0o600, module),
            _driver <- driver::Registration::new(c"gdirect_egpu", module),
        })
    }
}
