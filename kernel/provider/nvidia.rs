// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The `nvidia` provider: GPU memory through the nv-p2p interface of `nvidia.ko`.
//!
//! The nv-p2p functions are looked up when a registration needs them (`__symbol_get`), so gdirect
//! loads and works without any NVIDIA module, and holds a reference on the module that exports
//! them only while a registration uses them. The rig's emulated GPU exports the same functions.
//!
//! Revocation follows the nv-p2p rules: `nvidia_p2p_get_pages` takes a free callback that the
//! GPU driver runs when the memory is freed (`cudaFree`) while registered. The callback owns a
//! reference on the registration's [`RegShared`] from `get_pages` until either `put_pages`
//! succeeds (then no callback will run: we drop it) or the callback ends (it drops it). When
//! `put_pages` fails because a free is under way, we wait for the callback to finish.

use core::{
    ffi::c_void,
    ptr::NonNull, //
};
use kernel::{
    bindings, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::Relaxed,
        Arc, //
    },
};

use super::{
    PinResult,
    Pinned, //
};
use crate::{
    error, nv_p2p,
    region::{
        NvidiaRevoke,
        Owner,
        PeerKind,
        RegShared, //
    },
    stats, topology,
};

/// nv-p2p requires 64 KiB aligned GPU virtual addresses and lengths.
pub(crate) const ALIGNMENT: u64 = 64 << 10;

/// The nv-p2p functions, each with a reference on the module exporting it.
pub(crate) struct NvP2p {
    get_pages: nv_p2p::GetPagesFn,
    get_pages_persistent: nv_p2p::GetPagesPersistentFn,
    put_pages: nv_p2p::PutPagesFn,
    put_pages_persistent: nv_p2p::PutPagesPersistentFn,
    dma_map_pages: nv_p2p::DmaMapPagesFn,
    dma_unmap_pages: nv_p2p::DmaUnmapPagesFn,
    free_page_table: nv_p2p::FreePageTableFn,
    free_dma_mapping: nv_p2p::FreeDmaMappingFn,
}

/// The symbols, in the order of [`NvP2p`]'s fields.
const SYMBOLS: [&CStr; 8] = [
    c"nvidia_p2p_get_pages",
    c"nvidia_p2p_get_pages_persistent",
    c"nvidia_p2p_put_pages",
    c"nvidia_p2p_put_pages_persistent",
    c"nvidia_p2p_dma_map_pages",
    c"nvidia_p2p_dma_unmap_pages",
    c"nvidia_p2p_free_page_table",
    c"nvidia_p2p_free_dma_mapping",
];

fn symbol_get(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: `name` is a NUL-terminated string; a non-NULL result holds a module reference.
    NonNull::new(unsafe { bindings::__symbol_get(name.as_char_ptr()) })
}

fn symbol_put(name: &CStr) {
    // SAFETY: called once for each successful `symbol_get` of `name`.
    unsafe { bindings::__symbol_put(name.as_char_ptr()) };
}

impl NvP2p {
    /// Whether the GPU driver's nv-p2p interface is loaded now.
    pub(crate) fn present() -> bool {
        Self::get().is_ok()
    }

    /// Looks the functions up; `EOPNOTSUPP` unless all are exported.
    pub(crate) fn get() -> Result<Self> {
        let mut found = [None; SYMBOLS.len()];
        for (slot, name) in found.iter_mut().zip(SYMBOLS) {
            *slot = symbol_get(name);
        }
        let [Some(a), Some(b), Some(c), Some(d), Some(e), Some(f), Some(g), Some(h)] = found else {
            for (sym, name) in found.iter().zip(SYMBOLS) {
                if sym.is_some() {
                    symbol_put(name);
                }
            }
            return Err(error::provider_unavailable());
        };
        // SAFETY: each symbol is the nv-p2p function of that name, with the signature of
        // `nv-p2p.h` that the types spell out; the module stays loaded while we hold them.
        unsafe {
            Ok(Self {
                get_pages: core::mem::transmute::<*mut c_void, nv_p2p::GetPagesFn>(a.as_ptr()),
                get_pages_persistent: core::mem::transmute::<
                    *mut c_void,
                    nv_p2p::GetPagesPersistentFn,
                >(b.as_ptr()),
                put_pages: core::mem::transmute::<*mut c_void, nv_p2p::PutPagesFn>(c.as_ptr()),
                put_pages_persistent: core::mem::transmute::<
                    *mut c_void,
                    nv_p2p::PutPagesPersistentFn,
                >(d.as_ptr()),
                dma_map_pages: core::mem::transmute::<*mut c_void, nv_p2p::DmaMapPagesFn>(
                    e.as_ptr(),
                ),
                dma_unmap_pages: core::mem::transmute::<*mut c_void, nv_p2p::DmaUnmapPagesFn>(
                    f.as_ptr(),
                ),
                free_page_table: core::mem::transmute::<*mut c_void, nv_p2p::FreePageTableFn>(
                    g.as_ptr(),
                ),
                free_dma_mapping: core::mem::transmute::<*mut c_void, nv_p2p::FreeDmaMappingFn>(
                    h.as_ptr(),
                ),
            })
        }
    }
}

impl Drop for NvP2p {
    fn drop(&mut self) {
        for name in SYMBOLS {
            symbol_put(name);
        }
    }
}

/// GPU memory pinned through nv-p2p.
pub(crate) struct NvidiaPages {
    nv: NvP2p,
    va: u64,
    table: NonNull<nv_p2p::PageTable>,
    persistent: bool,
    shared: Arc<RegShared>,
    /// The callback's reference on `shared` (from `Arc::into_raw`), while it may still run.
    callback_ref: Option<NonNull<RegShared>>,
}

// SAFETY: the page table belongs to the GPU driver and is only read; the callback reference is
// an `Arc` in raw form.
unsafe impl Send for NvidiaPages {}
// SAFETY: as above.
unsafe impl Sync for NvidiaPages {}

/// The free callback: the GPU driver takes the memory back.
///
/// # Safety
///
/// `data` is the `Arc<RegShared>` given to `nvidia_p2p_get_pages` in raw form; the GPU driver
/// calls this at most once, and only if `put_pages` did not succeed first.
unsafe extern "C" fn free_callback(data: *mut c_void) {
    // SAFETY: see above: this takes back the reference leaked for the callback.
    let shared = unsafe { Arc::from_raw(data.cast::<RegShared>()) };
    // No use of the pages can start from here on, and the current ones have ended.
    let (peers, nvidia) = shared.revoke();
    // The nv-p2p rules: from the callback, hand the DMA mappings and the page table back with the
    // free functions (never put or unmap them); the GPU driver releases them.
    if let Some(nv) = nvidia {
        for p in peers {
            if let PeerKind::Nvidia(dma) = p.kind {
                // SAFETY: `dma` is a mapping of this page table that the driver made.
                unsafe { (nv.free_dma_mapping)(dma) };
            }
        }
        // SAFETY: `table` is the page table this callback is about.
        unsafe { (nv.free_page_table)(nv.table) };
    }
    stats::REVOCATIONS.fetch_add(1, Relaxed);
    shared.finish_callback();
}

/// Maps an nv-p2p error to gdirect's meaning.
fn get_pages_error(ret: i32) -> Error {
    match ret {
        // The GPU driver does not know the range: not GPU memory of this process.
        r if r == EINVAL.to_errno() => ENXIO,
        r if r == ENOMEM.to_errno() => ENOMEM,
        _ => error::provider_unavailable(),
    }
}

/// Pins the GPU memory at GPU virtual address `va`.
pub(crate) fn pin(
    va: u64,
    len: u64,
    persistent: bool,
    shared: &Arc<RegShared>,
) -> Result<PinResult> {
    let nv = NvP2p::get()?;
    let mut table: *mut nv_p2p::PageTable = core::ptr::null_mut();
    let mut callback_ref = None;
    let ret = if persistent {
        // SAFETY: `table` is a valid location for the result.
        unsafe { (nv.get_pages_persistent)(va, len, &mut table, 0) }
    } else {
        let data = Arc::into_raw(shared.clone()).cast_mut();
        callback_ref = NonNull::new(data);
        // SAFETY: as above; `data` stays valid until the callback or a successful `put_pages`.
        unsafe { (nv.get_pages)(0, 0, va, len, &mut table, Some(free_callback), data.cast()) }
    };
    let Some(table) = NonNull::new(table).filter(|_| ret == 0) else {
        if let Some(data) = callback_ref {
            // SAFETY: `get_pages` failed, so the callback will never run: take the reference back.
            drop(unsafe { Arc::from_raw(data.as_ptr()) });
        }
        return Err(get_pages_error(ret));
    };
    shared.set_nvidia(NvidiaRevoke {
        free_page_table: nv.free_page_table,
        free_dma_mapping: nv.free_dma_mapping,
        table: table.as_ptr(),
    });
    let pages = NvidiaPages {
        nv,
        va,
        table,
        persistent,
        shared: shared.clone(),
        callback_ref,
    };
    // Check what the GPU driver returned before trusting it.
    let _use = shared.begin_use()?;
    // SAFETY: the page table is valid while the pages are in use.
    let t = unsafe { table.as_ref() };
    let page_size = nv_p2p::PageSize::from_raw(t.page_size).ok_or(error::provider_unavailable())?;
    if !nv_p2p::version_compatible(t.version, nv_p2p::PAGE_TABLE_VERSION)
        || t.pages.is_null()
        || u64::from(t.entries) * page_size.get() != len
    {
        return Err(error::provider_unavailable());
    }
    let owner = Owner::of_phys(pages.phys(0)).ok_or(ENXIO)?;
    if (0..t.entries as usize).any(|i| !owner.contains(pages.phys(i), page_size.get())) {
        return Err(ENXIO);
    }
    let page_count = u64::from(t.entries);
    drop(_use);
    Ok(PinResult {
        pinned: Pinned::Nvidia(pages),
        owner: Some(owner),
        page_size,
        page_count,
    })
}

impl NvidiaPages {
    /// The physical address of page `i`; the caller holds a use of the pages.
    pub(crate) fn phys(&self, i: usize) -> u64 {
        // SAFETY: the table is valid while the pages are in use, and has `entries` pages.
        unsafe {
            let t = self.table.as_ref();
            if i >= t.entries as usize {
                return 0;
            }
            (**t.pages.add(i)).physical_address
        }
    }

    /// Maps the pages for `peer` with the GPU driver; the caller holds a use of the pages.
    pub(crate) fn dma_map(
        &self,
        peer: &ARef<pci::Device>,
    ) -> Result<(*mut nv_p2p::DmaMapping, &[u64])> {
        let mut dma: *mut nv_p2p::DmaMapping = core::ptr::null_mut();
        // SAFETY: `peer` is a valid, referenced device; the table is valid (in use).
        let ret = unsafe {
            (self.nv.dma_map_pages)(topology::raw_pci(peer), self.table.as_ptr(), &mut dma)
        };
        // The driver no longer knows a page table we still hold only while it frees the memory
        // (its free callback is on its way): the registration is being revoked.
        if ret == EINVAL.to_errno() {
            return Err(error::revoked());
        }
        nv_p2p::to_result(ret)?;
        // SAFETY: on success the GPU driver returns a valid mapping, kept until unmapped or revoked.
        let m = unsafe { dma.as_ref() }.ok_or(EINVAL)?;
        if !nv_p2p::version_compatible(m.version, nv_p2p::DMA_MAPPING_VERSION)
            || m.dma_addresses.is_null()
        {
            self.dma_unmap(peer, dma);
            return Err(error::provider_unavailable());
        }
        // SAFETY: the driver's mapping holds `entries` addresses, valid as long as the mapping.
        let addrs = unsafe { core::slice::from_raw_parts(m.dma_addresses, m.entries as usize) };
        Ok((dma, addrs))
    }

    /// Undoes a `dma_map`; the caller holds a use of the pages.
    pub(crate) fn dma_unmap(&self, peer: &pci::Device, dma: *mut nv_p2p::DmaMapping) {
        // SAFETY: `dma` was returned by `dma_map_pages` for this peer and table, not yet unmapped.
        let ret =
            unsafe { (self.nv.dma_unmap_pages)(topology::raw_pci(peer), self.table.as_ptr(), dma) };
        if ret != 0 {
            pr_warn!("nvidia_p2p_dma_unmap_pages failed: {ret}\n");
        }
    }
}

impl Drop for NvidiaPages {
    fn drop(&mut self) {
        if self.persistent {
            // SAFETY: the table came from `get_pages_persistent` and is put once.
            let ret = unsafe { (self.nv.put_pages_persistent)(self.va, self.table.as_ptr(), 0) };
            if ret != 0 {
                pr_warn!("nvidia_p2p_put_pages_persistent failed: {ret}\n");
            }
            return;
        }
        let Some(data) = self.callback_ref.take() else {
            return;
        };
        if !self.shared.is_revoked() {
            // SAFETY: the table came from `get_pages` and is put at most once.
            let ret = unsafe { (self.nv.put_pages)(0, 0, self.va, self.table.as_ptr()) };
            if ret == 0 {
                // SAFETY: after a successful put the callback never runs: its reference is ours.
                drop(unsafe { Arc::from_raw(data.as_ptr()) });
                return;
            }
        }
        // A free is under way: the callback owns its reference and will end soon.
        self.shared.wait_callback();
    }
}
