// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Providers: where registered memory comes from, and how it is pinned and translated.
//!
//! - `host`: ordinary user memory, pinned with `pin_user_pages_fast`.
//! - `p2pdma`: a user mapping of PCI P2PDMA memory, pinned the same way with `FOLL_PCI_P2PDMA`.
//! - `nvidia`: GPU memory through the nv-p2p interface of `nvidia.ko`, found at run time.
//!
//! [`pin`] turns a `REGISTER` request into [`Pinned`] memory; the registration owns it and drops
//! it last.
//!
//! Below `region` (which owns the pinned memory) and above `revocation` (the state a provider's
//! callback shares with the registration) and `topology` (which BAR holds device memory):
//! nothing here imports a registration. Lock order: see `provider/nvidia.rs` for the GPU
//! driver's lock; host and P2PDMA pinning take no lock of the module's.

use core::num::NonZeroU64;
use kernel::{
    bindings,
    prelude::*,
    sync::Arc, //
};

use crate::{error, revocation::RegShared, topology::Owner, uapi};

pub(crate) mod host;
pub(crate) mod nvidia;
pub(crate) mod p2pdma;

unsafe extern "C" {
    /// `page_to_phys()` (a macro in C; `shim.c`). `page` is a `struct page *`, as `void *`:
    /// bindgen's `struct page` holds a zero-sized array the `improper_ctypes` lint rejects.
    fn gdirect_page_to_phys(page: *mut core::ffi::c_void) -> u64;
    fn gdirect_pfn_valid(pfn: usize) -> i32;
    fn gdirect_pfn_to_page(pfn: usize) -> *mut core::ffi::c_void;
    fn gdirect_is_pci_p2pdma_page(page: *const core::ffi::c_void) -> bool;
    /// `fatal_signal_pending(current)` (inline in C; `shim.c`).
    fn gdirect_fatal_signal_pending() -> bool;
}

/// The `struct page` of physical address `phys` if it is a PCI P2PDMA page: device memory that
/// the block layer and the DMA API can address by page. BAR memory without `struct page`, or
/// with one of another kind, is `None` (whatever `pfn_valid` says of it).
pub(crate) fn p2pdma_page(phys: u64) -> Option<*mut bindings::page> {
    let pfn = (phys / PAGE_SIZE) as usize;
    // SAFETY: `pfn_valid` takes any value.
    if unsafe { gdirect_pfn_valid(pfn) } == 0 {
        return None;
    }
    // SAFETY: `pfn` is valid (checked above), so it has a `struct page`.
    let page = unsafe { gdirect_pfn_to_page(pfn) };
    // SAFETY: a valid page.
    unsafe { gdirect_is_pci_p2pdma_page(page) }.then_some(page.cast())
}

/// The CPU page size, the unit of the host and p2pdma providers.
pub(crate) const PAGE_SIZE: u64 = bindings::PAGE_SIZE as u64;
/// [`PAGE_SIZE`], as a divisor. (A constant: the `unwrap` runs in the compiler, and a zero
/// would fail the build; there is no panic path in the module.)
pub(crate) const PAGE: NonZeroU64 = NonZeroU64::new(PAGE_SIZE).unwrap();

/// A pinned user page.
#[derive(Clone, Copy)]
pub(crate) struct PagePtr(pub(crate) *mut bindings::page);
// SAFETY: a pinned page may be referred to from any thread; the pin keeps it valid.
unsafe impl Send for PagePtr {}
// SAFETY: as above; only the page's address is shared.
unsafe impl Sync for PagePtr {}

/// User pages pinned with `pin_user_pages_fast`, unpinned on drop.
pub(crate) struct UserPages {
    pages: KVVec<PagePtr>,
    /// Host pages: devices may have written them (reads into host memory), so they are
    /// unpinned dirty, as RDMA unpins writable memory, lest a shmem or memfd page that went
    /// clean (swapped out and back) be dropped with the data. P2PDMA pages have no page cache.
    host: bool,
}

/// Pages pinned per `pin_user_pages_fast` call; bounds the work done between checks. Their
/// pointers are gathered on the stack: 1 KiB of the kernel's 16 KiB stack, under the ioctl.
const PIN_BATCH: usize = 128;

impl UserPages {
    /// Pins the user pages of `[addr, addr + len)` of the calling process for writing. `ENXIO`
    /// when part of the range is not mapped, or is P2PDMA memory without `p2pdma`; `ENOMEM` when
    /// the kernel is out of memory.
    ///
    /// Host pages are pinned for the long term (`FOLL_LONGTERM` moves them out of movable zones
    /// first). P2PDMA pages cannot be: GUP refuses `FOLL_LONGTERM` with `FOLL_PCI_P2PDMA` so that
    /// the device memory stays hot-unpluggable; a registration of it holds ordinary pins, and the
    /// device's removal waits for them.
    pub(crate) fn pin(addr: u64, len: u64, p2pdma: bool) -> Result<Self> {
        let n = usize::try_from(len / PAGE_SIZE).map_err(|_| ENXIO)?;
        let flags = if p2pdma {
            bindings::FOLL_WRITE | bindings::FOLL_PCI_P2PDMA
        } else {
            bindings::FOLL_WRITE | bindings::FOLL_LONGTERM
        };
        // Every page pinned so far is in `me`, whose drop unpins them if a later step fails.
        let mut me = Self {
            pages: KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?,
            // Set once every page is pinned: pages of a pin that fails were never written.
            host: false,
        };
        let mut batch = [core::ptr::null_mut::<bindings::page>(); PIN_BATCH];
        while me.pages.len() < n {
            // A long pin stops for a fatal signal (`pin_user_pages_fast` checks only while it
            // faults pages in), as GUP itself does: the caller is being killed.
            // SAFETY: no preconditions.
            if unsafe { gdirect_fatal_signal_pending() } {
                return Err(EINTR);
            }
            let want = (n - me.pages.len()).min(PIN_BATCH);
            let start = addr + me.pages.len() as u64 * PAGE_SIZE;
            // SAFETY: `batch` has room for `want` page pointers; the range is the caller's own
            // user memory, checked by the GUP code itself.
            let got = unsafe {
                bindings::pin_user_pages_fast(start as _, want as i32, flags, batch.as_mut_ptr())
            };
            // Out of memory is said as such; any other failure (nothing pinned, EFAULT,
            // EREMOTEIO for P2PDMA pages, EOPNOTSUPP) means the range is not memory this
            // provider can pin.
            if got == ENOMEM.to_errno() {
                return Err(ENOMEM);
            }
            if got == EINTR.to_errno() {
                return Err(EINTR);
            }
            if got <= 0 {
                return Err(ENXIO);
            }
            let got = (got as usize).min(want);
            for (i, p) in batch[..got].iter().enumerate() {
                // Cannot fail: room for all `n` pages was reserved and `got <= want`.
                if me.pages.push_within_capacity(PagePtr(*p)).is_err() {
                    // SAFETY: `batch[i..got]` were pinned just above and are not in `me`.
                    unsafe {
                        bindings::unpin_user_pages(batch[i..got].as_mut_ptr(), (got - i) as _)
                    };
                    return Err(ENOMEM);
                }
            }
        }
        me.host = !p2pdma;
        Ok(me)
    }

    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    pub(crate) fn page(&self, i: usize) -> Option<*mut bindings::page> {
        self.pages.get(i).map(|p| p.0)
    }

    /// The CPU physical address of page `i`; `None` past the end.
    pub(crate) fn phys(&self, i: usize) -> Option<u64> {
        // SAFETY: the page is pinned for the life of `self`.
        self.pages
            .get(i)
            .map(|p| unsafe { gdirect_page_to_phys(p.0.cast()) })
    }
}

impl Drop for UserPages {
    fn drop(&mut self) {
        if !self.pages.is_empty() {
            let (pages, n) = (self.pages.as_mut_ptr().cast(), self.pages.len() as _);
            // SAFETY: these pages were pinned by `pin_user_pages_fast` and are unpinned once;
            // this runs in process or worker context, where marking a page dirty may sleep.
            unsafe {
                if self.host {
                    bindings::unpin_user_pages_dirty_lock(pages, n, true)
                } else {
                    bindings::unpin_user_pages(pages, n)
                }
            };
        }
    }
}

/// The memory of a registration, as its provider pinned it.
pub(crate) enum Pinned {
    /// `host` and `p2pdma`.
    User(UserPages),
    /// `nvidia`.
    Nvidia(nvidia::NvidiaPages),
}

impl Pinned {
    /// The `struct page` of page `i`, where the memory has them (user memory).
    pub(crate) fn page(&self, i: usize) -> Option<*mut bindings::page> {
        match self {
            Self::User(u) => u.page(i),
            Self::Nvidia(_) => None,
        }
    }

    /// The CPU physical address of page `i`; `None` past the end. For nvidia, the caller holds
    /// a use of the pages.
    pub(crate) fn phys(&self, i: usize) -> Option<u64> {
        match self {
            Self::User(u) => u.phys(i),
            Self::Nvidia(n) => n.phys(i),
        }
    }
}

/// What [`pin`] returns: the memory, its owner device, its page size and how many pages.
pub(crate) struct PinResult {
    pub(crate) pinned: Pinned,
    pub(crate) owner: Option<Owner>,
    pub(crate) page_size: NonZeroU64,
    pub(crate) page_count: u64,
}

/// The alignment `REGISTER` requires of `addr` and `len` for a provider.
pub(crate) fn alignment(provider: u32) -> Result<u64> {
    match provider {
        uapi::PROVIDER_HOST | uapi::PROVIDER_P2PDMA => Ok(PAGE_SIZE),
        uapi::PROVIDER_NVIDIA => Ok(nvidia::ALIGNMENT),
        _ => Err(error::unknown_provider()),
    }
}

/// Whether a provider can be used now (for `GET_INFO`).
pub(crate) fn available(provider: u32) -> bool {
    match provider {
        uapi::PROVIDER_HOST => true,
        uapi::PROVIDER_P2PDMA => cfg!(CONFIG_PCI_P2PDMA),
        uapi::PROVIDER_NVIDIA => nvidia::NvP2p::present(),
        _ => false,
    }
}

/// Pins a validated range of a provider's memory, after `reserve` has taken the limits' share
/// of it (given back, by its drop, when the pin fails). `reserve` runs right before the pin,
/// after any wait of the provider's own (nvidia's `GET_PUT`), so that a caller waiting there
/// holds no share of a limit that another user could be refused for meanwhile.
pub(crate) fn pin<R>(
    provider: u32,
    addr: u64,
    len: u64,
    flags: u32,
    shared: &Arc<RegShared>,
    reserve: impl FnOnce() -> Result<R>,
) -> Result<(PinResult, R)> {
    let persistent = flags & uapi::REGISTER_PERSISTENT != 0;
    if persistent && provider != uapi::PROVIDER_NVIDIA {
        return Err(EINVAL);
    }
    match provider {
        uapi::PROVIDER_HOST => {
            let reserved = reserve()?;
            Ok((host::pin(addr, len)?, reserved))
        }
        uapi::PROVIDER_P2PDMA => {
            let reserved = reserve()?;
            Ok((p2pdma::pin(addr, len)?, reserved))
        }
        uapi::PROVIDER_NVIDIA => nvidia::pin(addr, len, persistent, shared, reserve),
        _ => Err(error::unknown_provider()),
    }
}
