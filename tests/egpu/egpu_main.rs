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
//! | the page table is freed only after the client's callback returns | `nv_p2p_mem_info_free_callback` |
//! | put_pages of a table that teardown already unlinked returns 0 | `nv_p2p_put_pages`: `NV_ERR_OBJECT_NOT_FOUND` -> `NV_OK` |
//! | put_pages while a free runs the callback blocks on the API lock, then returns 0 | as above |
//! | put_pages from another process than get_pages's (or a kworker) puts nothing, returns 0 | `RmP2PGetInfoWithoutToken` (`osGetCurrentProcess()`) |
//! | dma_unmap of a mapping no longer listed returns 0 | `nvidia_p2p_dma_unmap_pages` |
//! | dma_map for a peer that cannot reach the BAR: `-ENOTSUPP` | `rm_p2p_dma_map_pages`: `nv_grdma_pci_topology_supported` |
//! | free_page_table and free_dma_mapping do nothing | `nvidia_p2p_free_page_table`, `nvidia_p2p_free_dma_mapping` |
//! | persistent mappings keep freed memory until put | `rm_p2p_put_pages_persistent` |
//!
//! Harsher than the hardware, where the real driver would touch freed memory: using a page
//! table after it was freed (dma_map/dma_unmap/put_pages_persistent of an unknown table) is a
//! `WARN` (fatal on the debug kernel, a kernel report that fails the run on the other).
//! Debug knob: `EGPU_IOC_FREE`'s `delay_us` holds the API lock that long between unlinking the
//! mappings and running their callbacks, so tests force put_pages into that window.

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

#[path = "../../kernel/misc.rs"]
mod misc;
#[allow(
    dead_code,
    reason = "the nv-p2p definitions are shared with gdirect, which uses others"
)]
#[path = "../../kernel/nv_p2p.rs"]
mod nv_p2p;
#[path = "../../kernel/topology.rs"]
mod topology;

use misc::OwnedMiscDevice;
use topology::{
    raw_pci,
    MapType, //
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

kernel::sync::global_lock! {
    // SAFETY: `EgpuModule::init` initializes it before registering the driver and the device.
    unsafe(uninit) static DEVICE: Mutex<Option<Arc<Egpu>>> = None;
}

kernel::sync::global_lock! {
    // SAFETY: `EgpuModule::init` initializes it before registering the driver and the device.
    unsafe(uninit) static API_LOCK: Mutex<()> = ();
}

/// The bound device, or `ENODEV`.
fn device() -> Result<Arc<Egpu>> {
    DEVICE.lock().clone().ok_or(ENODEV)
}

/// A raw pointer that the locked state owns; only dereferenced as documented where it is used.
struct Owned<T>(NonNull<T>);
// SAFETY: the pointees are heap objects owned by `Inner` and only touched under its lock or after
// being taken out of it.
unsafe impl<T> Send for Owned<T> {}

/// A page table handed out by `nvidia_p2p_get_pages*`, with the storage it points into.
#[repr(C)]
struct TableBox {
    /// First, so that a `*mut nv_p2p::PageTable` is a `*mut TableBox`.
    table: nv_p2p::PageTable,
    pages: KVec<nv_p2p::Page>,
    page_ptrs: KVec<*mut nv_p2p::Page>,
    uuid: [u8; 16],
}

/// A DMA mapping handed out by `nvidia_p2p_dma_map_pages`.
#[repr(C)]
struct DmaBox {
    /// First, so that a `*mut nv_p2p::DmaMapping` is a `*mut DmaBox`.
    mapping: nv_p2p::DmaMapping,
    addrs: KVec<u64>,
    /// Mapped with `dma_map_resource` (through the host bridge) rather than bus addresses.
    mapped: bool,
    peer: ARef<pci::Device>,
}

/// One nv-p2p page table on an allocation.
struct Mapping {
    table: Owned<TableBox>,
    persistent: bool,
    /// The process that made it: nvidia.ko's put_pages finds a mapping only from there.
    tgid: i32,
    callback: Option<nv_p2p::FreeCallback>,
    data: *mut c_void,
    dmas: KVec<Owned<DmaBox>>,
}
// SAFETY: `data` is the caller's opaque pointer, only passed back to its callback.
unsafe impl Send for Mapping {}

/// One "GPU allocation".
struct Alloc {
    offset: u64,
    len: u64,
    owner: u64,
    /// The process that allocated it: as in NVIDIA's driver, a GPU virtual address means
    /// something only in its own process's address space.
    tgid: i32,
    /// Freed by its owner, kept for its persistent mappings.
    freed: bool,
    mappings: KVec<Mapping>,
}

/// The calling process.
fn current_tgid() -> i32 {
    kernel::current!().tgid_nr_ns(None)
}

impl Alloc {
    fn va(&self) -> u64 {
        VA_BASE + self.offset
    }
    fn contains(&self, va: u64, len: u64) -> bool {
        va >= self.va() && len <= self.len && va - self.va() <= self.len - len
    }
}

/// The state of the device memory, under `Egpu::inner`.
struct Inner {
    /// One entry per `PAGE` of BAR2: in use or not.
    used: KVec<bool>,
    allocs: KVec<Alloc>,
    mappings: u32,
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
    callbacks: Atomic<u64>,
    /// put_pages calls that found their table already unlinked by a free (and returned 0).
    puts_unlinked: Atomic<u64>,
    /// put_pages calls from another process than the one that got the pages (returned 0,
    /// put nothing).
    puts_foreign: Atomic<u64>,
    #[pin]
    inner: Mutex<Inner>,
}

// SAFETY: `provider` is only read, and lives as long as the binding that owns `Egpu`.
unsafe impl Sync for Owned<bindings::p2pdma_provider> {}

unsafe extern "C" {
    /// `dma_mapping_error()` (inline in C; `kernel/shim.c`). `dev` is a `struct device *`:
    /// bindgen's `struct device` holds a zero-sized array the `improper_ctypes` lint rejects.
    fn gdirect_dma_mapping_error(dev: *mut c_void, addr: bindings::dma_addr_t) -> i32;
}

impl Egpu {
    fn phys(&self, offset: u64) -> u64 {
        self.bar_start + offset
    }

    fn bus_offset(&self) -> u64 {
        self.bus_offset
    }

    fn alloc(&self, len: u64, owner: u64) -> Result<(u64, u64)> {
        if len == 0 || len % PAGE != 0 || len > self.bar_len {
            return Err(EINVAL);
        }
        let n = (len / PAGE) as usize;
        let mut inner = self.inner.lock();
        let mut run = 0;
        let mut start = None;
        for (i, used) in inner.used.iter().enumerate() {
            run = if *used { 0 } else { run + 1 };
            if run == n {
                start = Some(i + 1 - n);
                break;
            }
        }
        let start = start.ok_or(ENOMEM)?;
        let offset = start as u64 * PAGE;
        inner.allocs.push(
            Alloc {
                offset,
                len,
                owner,
                tgid: current_tgid(),
                freed: false,
                mappings: KVec::new(),
            },
            GFP_KERNEL,
        )?;
        for used in &mut inner.used[start..start + n] {
            *used = true;
        }
        Ok((VA_BASE + offset, offset))
    }

    /// Frees the allocations of `owner` (all, or the one at `va`): returns the mappings to
    /// revoke and the number of persistent ones that keep their memory for now.
    fn free(&self, owner: u64, va: Option<u64>) -> Result<(KVec<Mapping>, u32)> {
        let mut deferred = 0;
        let mut found = false;
        let mut inner = self.inner.lock();
        // Room for every mapping taken out below, reserved first: once a mapping leaves its
        // allocation nothing may fail, or its free callback would never run.
        let count = inner
            .allocs
            .iter()
            .filter(|a| a.owner == owner && !a.freed && va.is_none_or(|va| va == a.va()))
            .map(|a| a.mappings.iter().filter(|m| !m.persistent).count())
            .sum();
        let mut revoke = KVec::with_capacity(count, GFP_KERNEL)?;
        let mut i = 0;
        while i < inner.allocs.len() {
            let a = &mut inner.allocs[i];
            if a.owner != owner || a.freed || va.is_some_and(|va| va != a.va()) {
                i += 1;
                continue;
            }
            found = true;
            let mut j = 0;
            while j < a.mappings.len() {
                if a.mappings[j].persistent {
                    deferred += 1;
                    j += 1;
                } else {
                    let m = a.mappings.remove(j).map_err(|_| EINVAL)?;
                    // Cannot fail: room for every mapping taken out was reserved above.
                    revoke.push_within_capacity(m).map_err(|_| ENOMEM)?;
                }
            }
            if a.mappings.is_empty() {
                let a = inner.allocs.remove(i).map_err(|_| EINVAL)?;
                release_range_locked(&mut inner, &a);
            } else {
                a.freed = true;
                i += 1;
            }
        }
        inner.mappings -= revoke.len() as u32;
        drop(inner);
        if va.is_some() && !found {
            return Err(ENOENT);
        }
        Ok((revoke, deferred))
    }

    /// Frees the allocations of `owner` (all, or the one at `va`) as `cudaFree` does: under the
    /// API lock, unlinks their mappings (put_pages no longer finds them), waits `delay` (the
    /// debug knob), runs each free callback, then frees the page table (`video_mem.c` ->
    /// `CliDelThirdPartyP2PVidmemInfo` -> `nv_p2p_mem_info_free_callback`). Returns the numbers
    /// of callbacks run and of persistent mappings that keep their memory.
    fn free_and_revoke(&self, owner: u64, va: Option<u64>, delay_us: u32) -> Result<(u32, u32)> {
        let api = API_LOCK.lock();
        let (revoke, deferred) = self.free(owner, va)?;
        let callbacks = revoke.len() as u32;
        if delay_us > 0 && callbacks > 0 {
            kernel::time::delay::fsleep(kernel::time::Delta::from_micros(i64::from(delay_us)));
        }
        self.revoke(revoke);
        drop(api);
        Ok((callbacks, deferred))
    }

    /// Runs the free callbacks of `mappings`, then frees them. The caller holds the API lock.
    fn revoke(&self, mappings: KVec<Mapping>) {
        for m in mappings {
            if let Some(callback) = m.callback {
                // SAFETY: the callback and its data were given to `nvidia_p2p_get_pages` for
                // this page table, which is still valid: it is freed only below.
                unsafe { callback(m.data) };
                self.callbacks.fetch_add(1, Relaxed);
            }
            free_mapping(m);
        }
    }

    /// The allocation and mapping index of a page table handed out earlier.
    fn find_mapping_locked(inner: &Inner, table: *mut nv_p2p::PageTable) -> Option<(usize, usize)> {
        for (i, a) in inner.allocs.iter().enumerate() {
            for (j, m) in a.mappings.iter().enumerate() {
                if m.table.0.as_ptr().cast::<nv_p2p::PageTable>() == table {
                    return Some((i, j));
                }
            }
        }
        None
    }
}

/// Returns an allocation's BAR pages to the free pool.
fn release_range_locked(inner: &mut Inner, a: &Alloc) {
    let first = (a.offset / PAGE) as usize;
    for used in &mut inner.used[first..first + (a.len / PAGE) as usize] {
        *used = false;
    }
}

/// Frees a mapping's DMA mappings and page table.
fn free_mapping(m: Mapping) {
    for dma in m.dmas {
        free_dma(dma);
    }
    // SAFETY: `table` came from `KBox::into_raw` in `get_pages` and was taken out of the locked
    // state, so this is its only owner.
    drop(unsafe { KBox::from_raw(m.table.0.as_ptr()) });
}

fn free_dma(dma: Owned<DmaBox>) {
    // SAFETY: `dma` came from `KBox::into_raw` in `dma_map_pages` and was taken out of the
    // locked state, so this is its only owner.
    let dma = unsafe { KBox::from_raw(dma.0.as_ptr()) };
    if dma.mapped {
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
            if let Ok((_, deferred)) = self.egpu.free_and_revoke(owner, None, 0) {
                leaked += deferred;
            }
        }
        if leaked > 0 {
            pr_warn!("unbound with {leaked} persistent mapping(s) still held: leaking their page tables\n");
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
            let pages = (bar_len / PAGE) as usize;
            let egpu = Arc::pin_init(
                try_pin_init!(Egpu {
                    pdev: ARef::from(&**pdev),
                    bar_start,
                    bar_len,
                    provider,
                    bus_offset,
                    callbacks: Atomic::new(0),
                    puts_unlinked: Atomic::new(0),
                    puts_foreign: Atomic::new(0),
                    inner <- new_mutex!(Inner {
                        used: KVec::from_elem(false, pages, GFP_KERNEL)?,
                        allocs: KVec::new(),
                        mappings: 0,
                    }),
                }),
                GFP_KERNEL,
            )?;
            dev_info!(
                pdev,
                "emulated GPU: {} MiB of device memory in BAR{BAR}, {}\n",
                bar_len >> 20,
                if nopages {
                    "without struct pages (nopages)"
                } else {
                    "P2PDMA pages (p2pdma)"
                }
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
}
kernel::static_assert!(core::mem::size_of::<AllocArgs>() == 32);
kernel::static_assert!(core::mem::size_of::<FreeArgs>() == 24);
kernel::static_assert!(core::mem::size_of::<InfoArgs>() == 56);
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

/// A free handed to a kernel worker, and its outcome.
#[pin_data]
struct FreeJob {
    #[pin]
    done: kernel::sync::Completion,
    #[pin]
    result: Mutex<Option<Result<(u32, u32)>>>,
}

/// Runs `free_and_revoke` on the system's unbound workqueue and waits for it.
fn free_from_worker(egpu: Arc<Egpu>, owner: u64, va: u64, delay_us: u32) -> Result<(u32, u32)> {
    let job = Arc::pin_init(
        pin_init!(FreeJob {
            done <- kernel::sync::Completion::new(),
            result <- new_mutex!(None),
        }),
        GFP_KERNEL,
    )?;
    let worker_job = job.clone();
    kernel::workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
        let r = egpu.free_and_revoke(owner, Some(va), delay_us);
        *worker_job.result.lock() = Some(r);
        worker_job.done.complete_all();
    })?;
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
                if a.flags != 0 || a.pad != 0 {
                    return Err(EINVAL);
                }
                (a.va, a.bar_offset) = egpu.alloc(a.len, me.id)?;
                w.write(&a)?;
            }
            IOC_FREE => {
                let (mut r, mut w) = user.reader_writer();
                let mut f: FreeArgs = r.read()?;
                if f.flags & !FREE_FROM_WORKER != 0 || f.delay_us > MAX_DELAY_US {
                    return Err(EINVAL);
                }
                (f.callbacks, f.deferred) = if f.flags & FREE_FROM_WORKER != 0 {
                    free_from_worker(egpu, me.id, f.va, f.delay_us)?
                } else {
                    egpu.free_and_revoke(me.id, Some(f.va), f.delay_us)?
                };
                w.write(&f)?;
            }
            IOC_INFO => {
                let inner = egpu.inner.lock();
                let free = inner.used.iter().filter(|u| !**u).count() as u64 * PAGE;
                let info = InfoArgs {
                    bar_bus_addr: egpu.bar_start + egpu.bus_offset(),
                    bar_len: egpu.bar_len,
                    free_bytes: free,
                    allocations: inner.allocs.len() as u32,
                    mappings: inner.mappings,
                    callbacks: egpu.callbacks.load(Relaxed),
                    puts_unlinked: egpu.puts_unlinked.load(Relaxed),
                    puts_foreign: egpu.puts_foreign.load(Relaxed),
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

/// Builds the page table of `[va, va + len)` and records it on its allocation.
fn get_pages(
    va: u64,
    len: u64,
    out: *mut *mut nv_p2p::PageTable,
    persistent: bool,
    callback: Option<nv_p2p::FreeCallback>,
    data: *mut c_void,
) -> Result {
    if out.is_null() || len == 0 || va % PAGE != 0 || len % PAGE != 0 {
        return Err(EINVAL);
    }
    let egpu = device()?;
    let tgid = current_tgid();
    // `rm_p2p_get_pages` and `rm_p2p_get_pages_persistent` run under the API lock.
    let _api = API_LOCK.lock();
    let mut inner = egpu.inner.lock();
    let a = inner
        .allocs
        .iter_mut()
        .find(|a| !a.freed && a.tgid == tgid && a.contains(va, len))
        .ok_or(EINVAL)?;
    let n = (len / PAGE) as usize;
    let first = a.offset + (va - a.va());
    let mut pages = KVec::with_capacity(n, GFP_KERNEL)?;
    for i in 0..n as u64 {
        pages.push(
            nv_p2p::Page {
                physical_address: egpu.phys(first + i * PAGE),
                registers: [0; 6],
            },
            GFP_KERNEL,
        )?;
    }
    let mut table = KBox::new(
        TableBox {
            table: nv_p2p::PageTable {
                version: nv_p2p::PAGE_TABLE_VERSION,
                page_size: nv_p2p::PageSize::Size64K as u32,
                pages: core::ptr::null_mut(),
                entries: n as u32,
                gpu_uuid: core::ptr::null_mut(),
            },
            pages,
            page_ptrs: KVec::with_capacity(n, GFP_KERNEL)?,
            uuid: GPU_UUID,
        },
        GFP_KERNEL,
    )?;
    let base = table.pages.as_mut_ptr();
    for i in 0..n {
        // SAFETY: `i < n == pages.len()`.
        table.page_ptrs.push(unsafe { base.add(i) }, GFP_KERNEL)?;
    }
    table.table.pages = table.page_ptrs.as_mut_ptr();
    table.table.gpu_uuid = table.uuid.as_mut_ptr();
    let table = Owned(NonNull::from(KBox::leak(table)));
    let raw = table.0.as_ptr().cast::<nv_p2p::PageTable>();
    let mapping = Mapping {
        table,
        persistent,
        tgid,
        callback,
        data,
        dmas: KVec::new(),
    };
    if let Err(e) = a.mappings.push(mapping, GFP_KERNEL) {
        drop(inner);
        // SAFETY: `raw` was leaked above and never published.
        drop(unsafe { KBox::from_raw(raw.cast::<TableBox>()) });
        return Err(e.into());
    }
    inner.mappings += 1;
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
fn put_pages(table: *mut nv_p2p::PageTable, persistent: bool) -> Result {
    let egpu = device()?;
    let _api = API_LOCK.lock();
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
    if inner.allocs[i].freed && inner.allocs[i].mappings.is_empty() {
        let a = inner.allocs.remove(i).map_err(|_| EINVAL)?;
        release_range_locked(&mut inner, &a);
    }
    drop(inner);
    free_mapping(m);
    Ok(())
}

/// The mapping of a page table that must be live: NVIDIA's dma_map/dma_unmap reach the table's
/// `nv_p2p_mem_info` by `container_of` without any lookup, so a freed table is a use after free
/// there; here it is a `WARN` and `EINVAL`.
fn find_live_table(inner: &Inner, table: *mut nv_p2p::PageTable) -> Result<(usize, usize)> {
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
    page_table: *mut *mut nv_p2p::PageTable,
    free_callback: Option<nv_p2p::FreeCallback>,
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
    page_table: *mut *mut nv_p2p::PageTable,
    flags: u32,
) -> i32 {
    if flags & !nv_p2p::FLAGS_FORCE_BAR1_MAPPING != 0 {
        return EINVAL.to_errno();
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
    page_table: *mut nv_p2p::PageTable,
) -> i32 {
    errno(put_pages(page_table, false))
}

/// `nvidia_p2p_put_pages_persistent`: `flags` must be zero.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_put_pages_persistent(
    _virtual_address: u64,
    page_table: *mut nv_p2p::PageTable,
    flags: u32,
) -> i32 {
    if flags != 0 {
        return EINVAL.to_errno();
    }
    errno(put_pages(page_table, true))
}

/// `nvidia_p2p_dma_map_pages`: bus addresses for a peer under the same switch, DMA-mapped
/// addresses through an allowed host bridge, `-ENOTSUPP` when the peer cannot reach the memory.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_dma_map_pages(
    peer: *mut bindings::pci_dev,
    page_table: *mut nv_p2p::PageTable,
    dma_mapping: *mut *mut nv_p2p::DmaMapping,
) -> i32 {
    let r = (|| -> Result<i32> {
        if peer.is_null() || dma_mapping.is_null() {
            return Err(EINVAL);
        }
        let egpu = device()?;
        // SAFETY: the caller passes a valid, referenced `pci_dev`; `pci::Device` is a transparent
        // wrapper of it.
        let peer_dev: &pci::Device = unsafe { &*peer.cast::<pci::Device>() };
        let mapped = match topology::map_type(&egpu.pdev, peer_dev) {
            MapType::BusAddr => false,
            MapType::ThruHostBridge => true,
            MapType::NotSupported => return Ok(-nv_p2p::ENOTSUPP),
        };
        // `rm_p2p_dma_map_pages` runs under the API lock.
        let _api = API_LOCK.lock();
        let mut inner = egpu.inner.lock();
        let (i, j) = find_live_table(&inner, page_table)?;
        let m = &mut inner.allocs[i].mappings[j];
        // SAFETY: the table is live while it is recorded in the locked state.
        let table = unsafe { &m.table.0.as_ref().table };
        let n = table.entries as usize;
        let mut addrs = KVec::with_capacity(n, GFP_KERNEL)?;
        let mut dma = KBox::new(
            DmaBox {
                mapping: nv_p2p::DmaMapping {
                    version: nv_p2p::DMA_MAPPING_VERSION,
                    page_size_type: table.page_size,
                    entries: 0,
                    dma_addresses: core::ptr::null_mut(),
                    private: core::ptr::null_mut(),
                    pci_dev: peer,
                },
                addrs: KVec::new(),
                mapped,
                peer: ARef::from(peer_dev),
            },
            GFP_KERNEL,
        )?;
        for k in 0..n {
            // SAFETY: `pages` holds `entries` valid page pointers.
            let phys = unsafe { (**table.pages.add(k)).physical_address };
            let addr = if mapped {
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
                if unsafe { gdirect_dma_mapping_error((&raw mut (*peer).dev).cast(), addr) } != 0 {
                    dma.addrs = addrs;
                    free_dma(Owned(NonNull::from(KBox::leak(dma))));
                    return Err(ENOMEM);
                }
                addr
            } else {
                phys + egpu.bus_offset()
            };
            addrs.push(addr, GFP_KERNEL)?;
        }
        dma.addrs = addrs;
        dma.mapping.entries = n as u32;
        dma.mapping.dma_addresses = dma.addrs.as_mut_ptr();
        let dma = Owned(NonNull::from(KBox::leak(dma)));
        let raw = dma.0.as_ptr().cast::<nv_p2p::DmaMapping>();
        if let Err(e) = m.dmas.push(dma, GFP_KERNEL) {
            drop(inner);
            free_dma(Owned(NonNull::new(raw.cast::<DmaBox>()).ok_or(EINVAL)?));
            return Err(e.into());
        }
        // SAFETY: checked non-null; the caller passes a valid location.
        unsafe { *dma_mapping = raw };
        Ok(0)
    })();
    r.unwrap_or_else(|e| e.to_errno())
}

/// `nvidia_p2p_dma_unmap_pages`.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_dma_unmap_pages(
    _peer: *mut bindings::pci_dev,
    page_table: *mut nv_p2p::PageTable,
    dma_mapping: *mut nv_p2p::DmaMapping,
) -> i32 {
    errno((|| -> Result {
        let egpu = device()?;
        // `nv_p2p_remove_dma_mapping` runs under the table's own lock, not the API lock.
        let mut inner = egpu.inner.lock();
        let (i, j) = find_live_table(&inner, page_table)?;
        let dmas = &mut inner.allocs[i].mappings[j].dmas;
        // A mapping no longer listed: 0, as `nvidia_p2p_dma_unmap_pages` returns.
        let Some(k) = dmas
            .iter()
            .position(|d| d.0.as_ptr().cast::<nv_p2p::DmaMapping>() == dma_mapping)
        else {
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
pub(crate) extern "C" fn nvidia_p2p_free_page_table(page_table: *mut nv_p2p::PageTable) -> i32 {
    if page_table.is_null() {
        return EINVAL.to_errno();
    }
    0
}

/// `nvidia_p2p_free_dma_mapping`: a no-op, as in current NVIDIA drivers.
#[unsafe(no_mangle)]
pub(crate) extern "C" fn nvidia_p2p_free_dma_mapping(dma_mapping: *mut nv_p2p::DmaMapping) -> i32 {
    if dma_mapping.is_null() {
        return EINVAL.to_errno();
    }
    0
}

#[pin_data]
struct EgpuModule {
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
        try_pin_init!(Self {
            _misc <- OwnedMiscDevice::register(c"gdirect_egpu", 0o600, module),
            _driver <- driver::Registration::new(c"gdirect_egpu", module),
        })
    }
}
