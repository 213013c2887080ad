// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Registrations: pinned provider memory and the addresses of its pages for peer devices.
//!
//! One [`Registration`] exists per successful `REGISTER`. The file that made it owns it (in its
//! xarray); a `QUERY` or an I/O holds another reference while it runs. The memory is unpinned
//! when the last reference goes: after `UNREGISTER` or the close of the file, once no operation
//! uses it any more. What a registration shares with its provider's free callback, and the
//! revocation, are in `revocation`, below both this and the providers.
//!
//! Lock order: a registration takes no lock of its own; it uses `RegShared::inner` (a leaf, see
//! `revocation`) for its peer mappings, and makes a mapping (which may sleep) under a use of the
//! pages but with no lock held. nv-p2p functions are called only at `REGISTER` (get_pages) and
//! when the registration ends (put_pages), with nothing held; peer addresses of GPU memory are
//! made by gdirect itself, as for any P2PDMA memory.

use core::{ffi::c_void, num::NonZeroU64};
use kernel::{
    bindings, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc, //
    },
};

use crate::{
    memlock::MemlockCharge,
    provider::Pinned,
    revocation::{
        peer_device,
        PeerKind,
        PeerMapping,
        PinAccount,
        RegShared, //
    },
    stats,
    topology::{
        self,
        MapType,
        Owner, //
    },
    uapi,
    users::{
        UserBytes,
        UserCharge, //
    },
};

unsafe extern "C" {
    /// `dma_mapping_error()` (inline in C; `shim.c`); `dev` is a `struct device *`.
    fn gdirect_dma_mapping_error(dev: *mut c_void, addr: bindings::dma_addr_t) -> i32;
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

/// A registration's share of the pin limits: its bytes in `max_pinned_bytes`, in its file's
/// count and in its user's (`max_pinned_bytes_per_user`), given back when dropped. Its
/// registration's [`RegShared`] holds it: a revocation drops it, else the registration's end.
pub(crate) struct PinCharge {
    pub(crate) len: u64,
    pub(crate) counters: Arc<FileCounters>,
    /// The user's share, given back by its own `Drop` after this one's.
    pub(crate) _user: UserBytes,
}

impl PinAccount for PinCharge {}

impl Drop for PinCharge {
    fn drop(&mut self) {
        stats::PINNED_BYTES.fetch_sub(self.len, Relaxed);
        self.counters.pinned_bytes.fetch_sub(self.len, Relaxed);
        // `_user` gives the user's share back next.
    }
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
    /// which uncharges them after the pages are unpinned (the field order). Host memory is
    /// never revoked.
    pub(crate) _memlock: Option<MemlockCharge>,
    /// The registering user's accounts, for the I/O limits (its pinned bytes are in the
    /// registration's [`PinCharge`]).
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
        if let Some(r) = self.shared.with_peer(peer, &copy) {
            return r;
        }
        // Made without the lock (it may sleep), under the use; another QUERY may have made
        // one meanwhile, which is kept instead.
        let mapping = self.map_for(peer)?;
        self.shared.add_peer(mapping, copy)
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
        let peers = self.shared.take_peers();
        drop(peers);
        // The share of the pin limits, unless a revocation gave it back already: user pages'
        // here (they are unpinned next); GPU pages' when they are put or freed (`NvidiaPages`'s
        // drop), which an end outside the pinning process leaves to the memory's free.
        if let Pinned::User(_) = &self.pinned {
            drop(self.shared.take_account());
        }
        stats::REGISTRATIONS.fetch_sub(1, Relaxed);
        stats::BY_PROVIDER[self.provider as usize].fetch_sub(1, Relaxed);
        self.counters.registrations.fetch_sub(1, Relaxed);
        // `pinned` is dropped next: it unpins or puts the pages.
    }
}

/// `GDIRECT_MAP_*` of a map type.
pub(crate) fn uapi_map_type(m: MapType) -> u32 {
    match m {
        MapType::NotSupported => uapi::MAP_NOT_SUPPORTED,
        MapType::BusAddr => uapi::MAP_BUS_ADDR,
        MapType::ThruHostBridge => uapi::MAP_THRU_HOST_BRIDGE,
    }
}
