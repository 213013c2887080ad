// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! gdirect_egpu: the emulated GPU of the gdirect test rig. Test-only.
//!
//! A PCI driver for the rig's ivshmem device (1af4:1110), whose 256 MiB BAR2 is backed by a file
//! in the host's `/dev/shm`. At probe it registers BAR2 as PCI P2PDMA memory, so the block layer
//! and gdirect see its pages as P2P pages, as they would a real GPU's BAR published that way.
//! Programs get "GPU allocations" from `/dev/gdirect_egpu` (`tests/egpu/gdirect_egpu.h`), and
//! this module exports the NVIDIA nv-p2p kernel interface over those allocations with the
//! semantics of `nvidia.ko`: `nvidia_p2p_get_pages` mappings are revoked through their free
//! callback when the allocation is freed (as by `cudaFree`), persistent mappings keep the memory
//! until they are put, and page tables and DMA mappings are the driver's to free.
//!
//! One [`Egpu`] exists per bound device (the rig has one); it is reachable from the exported
//! functions through [`DEVICE`].
//!
//! Locking: `Egpu::inner` is never held while a free callback runs, so a callback may call any
//! nv-p2p function (gdirect's does not call back, as NVIDIA's rules require).

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
    /// The P2PDMA provider of BAR2 (device-managed: valid while the driver is bound).
    provider: Owned<bindings::p2pdma_provider>,
    callbacks: Atomic<u64>,
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
        // SAFETY: `provider` is valid while bound (see `Egpu::provider`).
        unsafe { self.provider.0.as_ref().bus_offset }
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

    /// Runs the free callbacks of `mappings`, then frees them, as `cudaFree` does.
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
            if let Ok((revoke, deferred)) = self.egpu.free(owner, None) {
                self.egpu.revoke(revoke);
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
            // SAFETY: `raw` is the bound device; the resource is device-managed.
            kernel::error::to_result(unsafe {
                bindings::pci_p2pdma_add_resource(raw, BAR as i32, 0, 0)
            })?;
            // SAFETY: `pci_p2pdma_add_resource` initialized the device's P2PDMA state.
            let provider = NonNull::new(unsafe { bindings::pcim_p2pdma_provider(raw, BAR as i32) })
                .ok_or(ENODEV)?;
            let pages = (bar_len / PAGE) as usize;
            let egpu = Arc::pin_init(
                try_pin_init!(Egpu {
                    pdev: ARef::from(&**pdev),
                    bar_start,
                    bar_len,
                    provider: Owned(provider),
                    callbacks: Atomic::new(0),
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
                "emulated GPU: {} MiB of P2P device memory in BAR{BAR}\n",
                bar_len >> 20
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
    pad: u32,
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
    reserved: [u64; 2],
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
            if let Ok((revoke, _)) = egpu.free(me.id, None) {
                egpu.revoke(revoke);
            }
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
                if f.flags != 0 || f.pad != 0 {
                    return Err(EINVAL);
                }
                let (revoke, deferred) = egpu.free(me.id, Some(f.va))?;
                f.callbacks = revoke.len() as u32;
                f.deferred = deferred;
                egpu.revoke(revoke);
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
                    reserved: [0; 2],
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
fn put_pages(table: *mut nv_p2p::PageTable, persistent: bool) -> Result {
    let egpu = device()?;
    let mut inner = egpu.inner.lock();
    let (i, j) = Egpu::find_mapping_locked(&inner, table).ok_or(EINVAL)?;
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
        let mut inner = egpu.inner.lock();
        let (i, j) = Egpu::find_mapping_locked(&inner, page_table).ok_or(EINVAL)?;
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
        let mut inner = egpu.inner.lock();
        let (i, j) = Egpu::find_mapping_locked(&inner, page_table).ok_or(EINVAL)?;
        let dmas = &mut inner.allocs[i].mappings[j].dmas;
        let k = dmas
            .iter()
            .position(|d| d.0.as_ptr().cast::<nv_p2p::DmaMapping>() == dma_mapping)
            .ok_or(EINVAL)?;
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
        // SAFETY: called once, before anything can use `DEVICE`.
        unsafe { DEVICE.init() };
        try_pin_init!(Self {
            _misc <- OwnedMiscDevice::register(c"gdirect_egpu", 0o600, module),
            _driver <- driver::Registration::new(c"gdirect_egpu", module),
        })
    }
}
