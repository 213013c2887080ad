// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Registrations: pinned provider memory, the addresses of its pages for peer devices, and its
//! revocation.
//!
//! One [`Registration`] exists per successful `REGISTER`. The file that made it owns it (in its
//! xarray); a `QUERY` or an I/O holds another reference while it runs. The memory is unpinned
//! when the last reference goes: after `UNREGISTER` or the close of the file, once no operation
//! uses it any more.
//!
//! Revocation: a provider may take its memory back (nvidia's free callback on `cudaFree`). The
//! state that the provider's callback and the registration share is a [`RegShared`]: the
//! callback marks it revoked and waits until no operation uses the pages, and from then on every
//! use fails with `EKEYREVOKED` ([`error::revoked`]). Operations take a [`UseGuard`] for as long
//! as they touch the pages or their addresses.
//!
//! Who owns the callback's reference is decided by [`Callback`], a state machine under
//! `RegShared::inner` (see `provider/nvidia.rs`), never by what the GPU driver returns.
//!
//! Lock order: the GPU driver runs the free callback under its own lock (RM's API lock), and the
//! callback takes `RegShared::inner` and waits for the uses to end. So `RegShared::inner` is a
//! leaf (nothing is called under it but allocation), and nothing that may wait for the GPU
//! driver's lock runs under a use or under `inner`: no nv-p2p call and no copy to or from user
//! memory (which may fault into anything). nv-p2p functions are called only at `REGISTER`
//! (get_pages) and when the registration ends (put_pages), with nothing held; peer addresses of
//! GPU memory are made by gdirect itself, as for any P2PDMA memory.

use core::{ffi::c_void, num::NonZeroU64};
use kernel::{
    bindings, new_condvar, new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc,
        CondVar,
        Mutex, //
    },
};

use crate::{
    error,
    memlock::MemlockCharge,
    provider::Pinned,
    stats,
    topology::{
        self,
        MapType, //
    },
    uapi,
    users::UserCharge,
};

unsafe extern "C" {
    /// `dma_mapping_error()` (inline in C; `shim.c`); `dev` is a `struct device *`.
    fn gdirect_dma_mapping_error(dev: *mut c_void, addr: bindings::dma_addr_t) -> i32;
    /// `pci_domain_nr()` (inline in C; `shim.c`); `bus` is a `struct pci_bus *`.
    fn gdirect_pci_domain_nr(bus: *mut c_void) -> i32;
}

/// Counters of one open file, shared with its registrations so that they are kept right
/// whichever goes first.
pub(crate) struct FileCounters {
    pub(crate) registrations: Atomic<u32>,
    pub(crate) pinned_bytes: Atomic<u64>,
}

impl FileCounters {
    pub(crate) fn new() -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                registrations: Atomic::new(0),
                pinned_bytes: Atomic::new(0),
            },
            GFP_KERNEL_ACCOUNT,
        )?)
    }
}

/// How the addresses of a peer mapping were made, and so how to undo them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerKind {
    /// PCI bus addresses: nothing to undo.
    Bus,
    /// `dma_map_resource` of each page.
    Resource,
    /// `dma_map_page_attrs` of each page.
    HostPages,
}

/// The addresses one peer device uses for the pages of a registration; undone when dropped,
/// which needs no lock and no provider call (so the free callback may drop it).
pub(crate) struct PeerMapping {
    pub(crate) peer: ARef<pci::Device>,
    pub(crate) map_type: u32,
    pub(crate) addrs: KVVec<u64>,
    pub(crate) kind: PeerKind,
    /// The size of each mapped page.
    pub(crate) size: usize,
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        let dev = peer_device(&self.peer);
        let dir = bindings::dma_data_direction_DMA_BIDIRECTIONAL;
        for a in self.addrs.iter() {
            match self.kind {
                PeerKind::Bus => {}
                // SAFETY: `a` was mapped by `dma_map_resource` for `dev` with this size.
                PeerKind::Resource => unsafe {
                    bindings::dma_unmap_resource(dev, *a, self.size, dir, 0)
                },
                // SAFETY: `a` was mapped by `dma_map_page_attrs` for `dev` with this size.
                PeerKind::HostPages => unsafe {
                    bindings::dma_unmap_page_attrs(dev, *a, self.size, dir, 0)
                },
            }
        }
    }
}

/// What the nvidia free callback must hand back to the GPU driver (nv-p2p rules).
#[derive(Clone, Copy)]
pub(crate) struct NvidiaRevoke {
    pub(crate) free_page_table: crate::nv_p2p::FreePageTableFn,
    pub(crate) table: *mut crate::nv_p2p::PageTable,
}

/// Where a provider's free callback stands; decides who drops the reference it was given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Callback {
    /// No callback can run: none was given, or it was put back.
    None,
    /// Given to the provider, which may call it at any time.
    Armed,
    /// The registration is putting the pages back; the callback may still start meanwhile.
    Putting,
    /// Running: it owns the pages until `Done`.
    Running,
    /// Finished: it touches nothing of the registration any more.
    Done,
    /// The registration ended where put_pages cannot reach the pages (another process, a
    /// kernel worker: nvidia.ko finds them by the calling process), or put_pages failed: the
    /// driver keeps them until the memory is freed, and the callback then owns its reference
    /// and a reference on the module, and drops both.
    Orphaned,
}

/// The state that a registration shares with its provider's revocation callback.
struct SharedInner {
    revoked: bool,
    /// Operations using the pages now.
    users: u32,
    /// The bytes of storage I/O those uses have running on the pages: what a revocation waits
    /// for, kept within `max_in_flight_bytes` by [`RegShared::begin_io`].
    io_bytes: u64,
    callback: Callback,
    peers: KVec<PeerMapping>,
    /// Set once nvidia pages are pinned.
    nvidia: Option<NvidiaRevoke>,
    /// The map type from the owner to the storage device last read through (a one-entry
    /// cache; the device is referenced, so its address names it while cached).
    map_type: Option<(ARef<pci::Device>, MapType)>,
}

// SAFETY: the page table pointer is only passed back to the GPU driver that made it.
unsafe impl Send for NvidiaRevoke {}

/// What a registration and its provider's callback share (see the module docs).
#[pin_data]
pub(crate) struct RegShared {
    #[pin]
    inner: Mutex<SharedInner>,
    #[pin]
    changed: CondVar,
}

/// A use of a registration's pages, with the bytes of storage I/O it runs on them; revocation
/// waits for it to end.
pub(crate) struct UseGuard<'a>(&'a RegShared, u64);

impl Drop for UseGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.0.inner.lock();
        inner.users -= 1;
        inner.io_bytes -= self.1;
        // A revocation waits for no use; an I/O may wait for room under the cap.
        if inner.users == 0 || self.1 > 0 {
            self.0.changed.notify_all();
        }
    }
}

impl RegShared {
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                inner <- new_mutex!(SharedInner {
                    revoked: false,
                    users: 0,
                    io_bytes: 0,
                    callback: Callback::None,
                    peers: KVec::new(),
                    nvidia: None,
                    map_type: None,
                }, "RegShared::inner"),
                changed <- new_condvar!("RegShared::changed"),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// `EKEYREVOKED` once revoked (a check that holds nothing; a use started later checks
    /// again).
    pub(crate) fn check_revoked(&self) -> Result {
        if self.inner.lock().revoked {
            return Err(error::revoked());
        }
        Ok(())
    }

    /// Starts a use of the pages: `EKEYREVOKED` once revoked.
    pub(crate) fn begin_use(&self) -> Result<UseGuard<'_>> {
        let mut inner = self.inner.lock();
        if inner.revoked {
            return Err(error::revoked());
        }
        inner.users += 1;
        Ok(UseGuard(self, 0))
    }

    /// Starts a use of the pages that runs `bytes` of storage I/O on them: waits while the
    /// registration's I/O has `max_in_flight_bytes` running already (the first one always
    /// starts, whatever its size), so that a revocation never waits for more than that;
    /// `EKEYREVOKED` once revoked (a waiter too), `ERESTARTSYS` on a signal.
    pub(crate) fn begin_io(&self, bytes: u64) -> Result<UseGuard<'_>> {
        let cap = match crate::max_in_flight_bytes() {
            0 => u64::MAX,
            cap => cap,
        };
        let mut inner = self.inner.lock();
        loop {
            if inner.revoked {
                return Err(error::revoked());
            }
            if inner.io_bytes == 0 || inner.io_bytes.saturating_add(bytes) <= cap {
                break;
            }
            if self.changed.wait_interruptible(&mut inner) {
                return Err(ERESTARTSYS);
            }
        }
        inner.users += 1;
        inner.io_bytes += bytes;
        Ok(UseGuard(self, bytes))
    }

    /// The map type from the registration's owner to `dev`: `compute`d once per storage device
    /// and kept, as the kernel's P2PDMA code keeps its verdict per (provider, client) pair
    /// (`pci_p2pdma::map_types`). A 4 KiB read does not walk the PCI hierarchy again.
    pub(crate) fn cached_map_type(
        &self,
        dev: &ARef<pci::Device>,
        compute: impl FnOnce() -> MapType,
    ) -> MapType {
        if let Some((cached, m)) = &self.inner.lock().map_type {
            if core::ptr::eq::<pci::Device>(&**cached, &**dev) {
                return *m;
            }
        }
        let m = compute();
        let old = self.inner.lock().map_type.replace((dev.clone(), m));
        // The device reference is put with no lock held.
        drop(old);
        m
    }

    /// Records what the nvidia free callback hands back.
    pub(crate) fn set_nvidia(&self, revoke: NvidiaRevoke) {
        self.inner.lock().nvidia = Some(revoke);
    }

    /// The provider takes the memory back: no new use may start, and this returns once the
    /// current ones have ended, with the peer mappings for the provider to dispose of.
    pub(crate) fn revoke(&self) -> (KVec<PeerMapping>, Option<NvidiaRevoke>) {
        let mut inner = self.inner.lock();
        inner.revoked = true;
        // I/O waiting for room under the cap fails now instead.
        self.changed.notify_all();
        while inner.users > 0 {
            self.changed.wait(&mut inner);
        }
        (core::mem::take(&mut inner.peers), inner.nvidia)
    }

    /// Moves the callback's state from one of `from` to `to`; returns the state it found.
    pub(crate) fn callback_transition(&self, from: &[Callback], to: Callback) -> Callback {
        let mut inner = self.inner.lock();
        let found = inner.callback;
        if from.contains(&found) {
            inner.callback = to;
            self.changed.notify_all();
        }
        found
    }

    /// Waits until a callback that started has finished; returns the final state (`Done`, or
    /// the state it found when no callback was running).
    pub(crate) fn wait_callback(&self) -> Callback {
        let mut inner = self.inner.lock();
        while inner.callback == Callback::Running {
            self.changed.wait(&mut inner);
        }
        inner.callback
    }
}

/// The PCI function whose BAR holds some device memory.
pub(crate) struct Owner {
    pub(crate) dev: ARef<pci::Device>,
    pub(crate) bar: usize,
}

impl Owner {
    /// The function and BAR holding physical address `phys`, if any.
    pub(crate) fn of_phys(phys: u64) -> Option<Self> {
        let mut dev: *mut bindings::pci_dev = core::ptr::null_mut();
        loop {
            // SAFETY: `pci_get_device` drops the reference on `dev` (or NULL) and returns the
            // next device with a reference, or NULL at the end.
            dev = unsafe {
                bindings::pci_get_device(
                    bindings::PCI_ANY_ID as u32,
                    bindings::PCI_ANY_ID as u32,
                    dev,
                )
            };
            let Some(nn) = core::ptr::NonNull::new(dev) else {
                return None;
            };
            for bar in 0..bindings::PCI_STD_NUM_BARS as usize {
                // SAFETY: `dev` is a valid, referenced device.
                let res = unsafe { &(*dev).resource[bar] };
                let mem = res.flags & bindings::IORESOURCE_MEM as usize != 0;
                if mem && res.start <= phys && phys <= res.end {
                    // SAFETY: we own the reference `pci_get_device` took; `pci::Device` is a
                    // transparent wrapper of `pci_dev`.
                    let dev = unsafe { ARef::from_raw(nn.cast::<pci::Device>()) };
                    return Some(Self { dev, bar });
                }
            }
        }
    }

    fn resource(&self) -> &bindings::resource {
        // SAFETY: `dev` is a valid device and `bar` a standard BAR index.
        unsafe { &(*topology::raw_pci(&self.dev)).resource[self.bar] }
    }

    /// Whether `[phys, phys + len)` lies in this BAR.
    pub(crate) fn contains(&self, phys: u64, len: u64) -> bool {
        let res = self.resource();
        phys >= res.start && len > 0 && phys.checked_add(len - 1).is_some_and(|end| end <= res.end)
    }

    /// PCI bus address minus CPU physical address, for this BAR.
    fn bus_offset(&self) -> u64 {
        let pdev = topology::raw_pci(&self.dev);
        let mut region = bindings::pci_bus_region::default();
        // SAFETY: `pdev` is valid; its bus and resource outlive the call.
        unsafe {
            bindings::pcibios_resource_to_bus(
                (*pdev).bus,
                &mut region,
                &raw mut (*pdev).resource[self.bar],
            )
        };
        region.start.wrapping_sub(self.resource().start)
    }

    /// `domain << 16 | bus << 8 | devfn`, as `QUERY` reports it.
    pub(crate) fn id(&self) -> u64 {
        pci_id(&self.dev)
    }
}

/// `domain << 16 | bus << 8 | devfn` of a device.
pub(crate) fn pci_id(dev: &pci::Device) -> u64 {
    let pdev = topology::raw_pci(dev);
    // SAFETY: `pdev` and its bus are valid while `dev` is referenced.
    let (domain, bus, devfn) = unsafe {
        (
            gdirect_pci_domain_nr((*pdev).bus.cast()),
            (*(*pdev).bus).number,
            (*pdev).devfn,
        )
    };
    (u64::from(domain as u32) << 16) | (u64::from(bus) << 8) | u64::from(devfn)
}

/// A registration: see the module docs.
pub(crate) struct Registration {
    pub(crate) provider: u32,
    pub(crate) len: u64,
    pub(crate) page_size: NonZeroU64,
    pub(crate) page_count: u64,
    /// The PCI function whose memory this is; `None` for host memory.
    pub(crate) owner: Option<Owner>,
    pub(crate) shared: Arc<RegShared>,
    /// Dropped last (field order): after the peer mappings are undone.
    pub(crate) pinned: Pinned,
    pub(crate) counters: Arc<FileCounters>,
    /// Host pages charged to the registering process (`RLIMIT_MEMLOCK`): held for its `Drop`,
    /// which uncharges them after the pages are unpinned (the field order).
    pub(crate) _memlock: Option<MemlockCharge>,
    /// The bytes charged to the registering user (`max_pinned_bytes_per_user`).
    pub(crate) user: UserCharge,
}

impl Registration {
    /// The map type and addresses `first..first + max` of the pages for `peer` (fewer at the
    /// end), copied out so that the caller holds nothing while it hands them to user memory.
    /// The mapping is made once per peer and kept until the registration ends or is revoked.
    pub(crate) fn peer_addrs(
        &self,
        peer: &ARef<pci::Device>,
        first: u64,
        max: u32,
    ) -> Result<(u32, KVVec<u64>)> {
        let _use = self.shared.begin_use()?;
        // The map type alone maps nothing: a caller that may not see addresses cannot make
        // the module hold DMA mappings (IOVA space, swiotlb slots) for any peer it names.
        if max == 0 {
            return Ok((self.map_type_for(peer).0, KVVec::new()));
        }
        let copy = |p: &PeerMapping| -> Result<(u32, KVVec<u64>)> {
            let start = usize::try_from(first)
                .unwrap_or(usize::MAX)
                .min(p.addrs.len());
            let n = (p.addrs.len() - start).min(max as usize);
            let mut out = KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
            out.extend_from_slice(&p.addrs[start..start + n], GFP_KERNEL_ACCOUNT)?;
            Ok((p.map_type, out))
        };
        let find = |inner: &SharedInner| {
            inner
                .peers
                .iter()
                .position(|p| p.peer.as_ref() as *const _ == peer.as_ref() as *const _)
        };
        {
            let inner = self.shared.inner.lock();
            if let Some(i) = find(&inner) {
                return copy(&inner.peers[i]);
            }
        }
        // Made without the lock (it may sleep), under the use.
        let mapping = self.map_for(peer)?;
        let mut inner = self.shared.inner.lock();
        if let Some(i) = find(&inner) {
            // Another QUERY made it meanwhile: keep theirs (ours is undone when dropped).
            let r = copy(&inner.peers[i]);
            drop(inner);
            drop(mapping);
            return r;
        }
        let r = copy(&mapping)?;
        if inner.peers.reserve(1, GFP_KERNEL_ACCOUNT).is_err() {
            drop(inner);
            drop(mapping);
            return Err(ENOMEM);
        }
        // Cannot fail: room was reserved just above.
        inner
            .peers
            .push_within_capacity(mapping)
            .map_err(|_| ENOMEM)?;
        Ok(r)
    }

    /// How `peer` reaches the memory: the `GDIRECT_MAP_*` value, and the route for device
    /// memory (`None` for host memory).
    fn map_type_for(&self, peer: &ARef<pci::Device>) -> (u32, Option<MapType>) {
        let map_type = self
            .owner
            .as_ref()
            .map(|owner| topology::map_type(&owner.dev, peer));
        (
            map_type.map_or(uapi::MAP_HOST_MEMORY, uapi_map_type),
            map_type,
        )
    }

    /// Makes the addresses for `peer`. The caller holds a use of the pages. GPU memory is mapped
    /// as any P2P memory is (bus addresses under a common switch, `dma_map_resource` through an
    /// allowed host bridge), never with `nvidia_p2p_dma_map_pages`: that takes the GPU driver's
    /// API lock, under which a free runs the callback that waits for this use (see the module
    /// docs). What it would return is the same addresses (`rm_p2p_dma_map_pages` ->
    /// `nv_dma_map_peer`).
    fn map_for(&self, peer: &ARef<pci::Device>) -> Result<PeerMapping> {
        let n = self.page_count as usize;
        let size = self.page_size.get() as usize;
        let (uapi_type, map_type) = self.map_type_for(peer);
        let mut mapping = PeerMapping {
            peer: peer.clone(),
            map_type: uapi_type,
            // Room for every address first (charged to the caller's memory cgroup): each one
            // mapped is then in `mapping`, whose drop undoes them if a later one fails.
            addrs: KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?,
            kind: match map_type {
                None => PeerKind::HostPages,
                Some(MapType::ThruHostBridge) => PeerKind::Resource,
                Some(_) => PeerKind::Bus,
            },
            size,
        };
        if map_type == Some(MapType::NotSupported) {
            return Ok(mapping);
        }
        let dev = peer_device(peer);
        let bus_offset = self.owner.as_ref().map_or(0, Owner::bus_offset);
        let dir = bindings::dma_data_direction_DMA_BIDIRECTIONAL;
        for i in 0..n {
            let addr = match mapping.kind {
                PeerKind::Bus => self.pinned.phys(i).ok_or(EINVAL)?.wrapping_add(bus_offset),
                PeerKind::Resource => {
                    let phys = self.pinned.phys(i).ok_or(EINVAL)?;
                    // SAFETY: the page is a pinned page of the owner's BAR; `dev` is valid.
                    unsafe { bindings::dma_map_resource(dev, phys, size, dir, 0) }
                }
                PeerKind::HostPages => {
                    let page = self.pinned.page(i).ok_or(EINVAL)?;
                    // SAFETY: `page` is pinned for the life of the registration; `dev` is valid.
                    unsafe { bindings::dma_map_page_attrs(dev, page, 0, size, dir, 0) }
                }
            };
            // SAFETY: `dev` is valid; `addr` came from the DMA API for it (or is a bus address,
            // which this does not look at).
            if mapping.kind != PeerKind::Bus
                && unsafe { gdirect_dma_mapping_error(dev.cast(), addr) } != 0
            {
                return Err(ENOMEM);
            }
            // Cannot fail: room for `n` was reserved.
            mapping
                .addrs
                .push_within_capacity(addr)
                .map_err(|_| ENOMEM)?;
        }
        Ok(mapping)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Undo the peer mappings; once revoked, the provider's callback undid them.
        let peers = core::mem::take(&mut self.shared.inner.lock().peers);
        drop(peers);
        stats::REGISTRATIONS.fetch_sub(1, Relaxed);
        stats::PINNED_BYTES.fetch_sub(self.len, Relaxed);
        stats::BY_PROVIDER[self.provider as usize].fetch_sub(1, Relaxed);
        self.counters.registrations.fetch_sub(1, Relaxed);
        self.counters.pinned_bytes.fetch_sub(self.len, Relaxed);
        // `pinned` is dropped next: it unpins or puts the pages.
    }
}

/// The `struct device` of a PCI device, for the DMA API.
fn peer_device(peer: &pci::Device) -> *mut bindings::device {
    // SAFETY: `peer` is a valid PCI device; its `dev` lives as long as it does.
    unsafe { &raw mut (*topology::raw_pci(peer)).dev }
}

/// `GDIRECT_MAP_*` of a map type.
pub(crate) fn uapi_map_type(m: MapType) -> u32 {
    match m {
        MapType::NotSupported => uapi::MAP_NOT_SUPPORTED,
        MapType::BusAddr => uapi::MAP_BUS_ADDR,
        MapType::ThruHostBridge => uapi::MAP_THRU_HOST_BRIDGE,
    }
}
