// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Revocation: what a registration shares with its provider's free callback.
//!
//! A provider may take its memory back (nvidia's free callback on `cudaFree`). The state that
//! the callback and the registration share is a [`RegShared`]: the callback marks it revoked
//! and waits until no operation uses the pages, and from then on every use fails with
//! `EKEYREVOKED` ([`error::revoked`]). Operations take a [`UseGuard`] for as long as they touch
//! the pages or their addresses; storage I/O takes it with its size ([`RegShared::begin_io`]),
//! and the I/O of one registration stays within `max_in_flight_bytes`, which bounds what a
//! revocation waits for (README, "A free's wait is bounded").
//!
//! Who owns the callback's reference is decided by [`Callback`], a state machine under
//! `RegShared::inner` (see `provider/nvidia.rs`), never by what the GPU driver returns. The
//! peer devices' mappings of the pages ([`PeerMapping`]) live here too, so that the callback
//! can undo them without reaching the registration.
//!
//! This sits below both the providers (`provider/`, whose callbacks revoke) and the
//! registrations (`region`, which own one each): it knows neither.
//!
//! Lock order: the GPU driver runs the free callback under its own lock (RM's API lock), and the
//! callback takes `RegShared::inner` and waits for the uses to end. So `RegShared::inner` is a
//! leaf (nothing is called under it but allocation; mappings are undone after it is let go), and
//! nothing that may wait for the GPU driver's lock runs under a use or under `inner`: no nv-p2p
//! call and no copy to or from user memory (which may fault into anything). A transfer takes
//! its room in the user's share of the storage (`users::UserCharge::start_io`) before a use,
//! never while holding one.

use kernel::{
    bindings, new_condvar, new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        Arc,
        CondVar,
        Mutex, //
    },
};

use crate::{
    error, nv_p2p,
    topology::{
        self,
        MapType, //
    },
};

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
    pub(crate) free_page_table: nv_p2p::FreePageTableFn,
    pub(crate) table: *mut nv_p2p::PageTable,
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

/// A registration's share of the pin limits (`max_pinned_bytes`, its user's, its file's), given
/// back when it is dropped (`region::PinCharge`). The registration hands it to its [`RegShared`]:
/// a revocation gives it back at once, since the provider has taken the pages back and nothing
/// is pinned any more, so that memory freed under a registration that its owner has not yet
/// unregistered (a process that does not know of the free) blocks no one's limit; otherwise the
/// registration's end does.
pub(crate) trait PinAccount: Send {}

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
    /// The registration's share of the pin limits, until revoked or taken back.
    account: Option<KBox<dyn PinAccount>>,
}

impl SharedInner {
    /// The index of the mapping kept for `peer`.
    fn find_peer(&self, peer: &pci::Device) -> Option<usize> {
        self.peers
            .iter()
            .position(|p| core::ptr::eq::<pci::Device>(&*p.peer, peer))
    }
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
                    account: None,
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

    /// `f` of the mapping kept for `peer`, if there is one.
    pub(crate) fn with_peer<R>(
        &self,
        peer: &pci::Device,
        f: impl FnOnce(&PeerMapping) -> R,
    ) -> Option<R> {
        let inner = self.inner.lock();
        inner.find_peer(peer).map(|i| f(&inner.peers[i]))
    }

    /// Keeps `mapping` for its peer, unless another was kept meanwhile (then `mapping` is
    /// undone), and returns `f` of the one kept; `ENOMEM`, keeping nothing, without room.
    pub(crate) fn add_peer<R>(
        &self,
        mapping: PeerMapping,
        f: impl Fn(&PeerMapping) -> Result<R>,
    ) -> Result<R> {
        let mut inner = self.inner.lock();
        if let Some(i) = inner.find_peer(&mapping.peer) {
            let r = f(&inner.peers[i]);
            // Undone with no lock held.
            drop(inner);
            drop(mapping);
            return r;
        }
        let r = f(&mapping)?;
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

    /// Holds the registration's share of the pin limits until a revocation or
    /// [`Self::take_account`]; given back at once if the memory was revoked already (a free
    /// that came between the pin and the registration).
    pub(crate) fn hold_account(&self, account: KBox<dyn PinAccount>) {
        let mut inner = self.inner.lock();
        if inner.revoked {
            drop(inner);
            drop(account);
            return;
        }
        inner.account = Some(account);
    }

    /// The share of the pin limits, unless a revocation gave it back (to be dropped by the
    /// caller).
    pub(crate) fn take_account(&self) -> Option<KBox<dyn PinAccount>> {
        self.inner.lock().account.take()
    }

    /// The peer mappings, taken out (to be undone by the caller, with no lock held).
    pub(crate) fn take_peers(&self) -> KVec<PeerMapping> {
        core::mem::take(&mut self.inner.lock().peers)
    }

    /// The provider takes the memory back: no new use may start, and this returns once the
    /// current ones have ended, with the peer mappings for the provider to dispose of. The
    /// registration's share of the pin limits is given back: the pages are the provider's.
    pub(crate) fn revoke(&self) -> (KVec<PeerMapping>, Option<NvidiaRevoke>) {
        let mut inner = self.inner.lock();
        inner.revoked = true;
        // I/O waiting for room under the cap fails now instead.
        self.changed.notify_all();
        while inner.users > 0 {
            self.changed.wait(&mut inner);
        }
        let taken = (core::mem::take(&mut inner.peers), inner.nvidia);
        let account = inner.account.take();
        drop(inner);
        drop(account);
        taken
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

/// The `struct device` of a PCI device, for the DMA API.
pub(crate) fn peer_device(peer: &pci::Device) -> *mut bindings::device {
    // SAFETY: `peer` is a valid PCI device; its `dev` lives as long as it does.
    unsafe { &raw mut (*topology::raw_pci(peer)).dev }
}
