// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Registrations kept for memory that another library owns and hands over one request at a
//! time (a PyTorch tensor's allocation, a CuPy array's): each allocation is registered once,
//! at its first transfer, and the registration serves every later transfer into any part of
//! it, as cuFile's buffer registration does, without a pin and an unpin per request.
//!
//! The Python package moves CUDA memory through it; the rig's selftests run it on the
//! emulated GPU (`direct_cache.sh`).

use std::{
    collections::HashMap,
    ops::Range,
    path::Path,
    sync::{Arc, Mutex},
};

use crate::{
    CompatReason, Driver, Errno, Error, File, Provider, RegisterOptions, Registration, Result,
    Transfer,
};

/// The most allocations the cache keeps an entry for: a registration of memory freed since
/// (revoked, its entry not met again) pins nothing and holds no share of the pin limits, but
/// counts in its file's `max_registrations` until it is dropped, so the entries are bounded and
/// any one may go (it is made again when next needed).
const MOST: usize = 256;

/// One allocation's entry.
#[derive(Clone, Debug)]
enum Slot {
    Registered(Arc<Registration<'static>>),
    /// Refused for a reason that holds for as long as the allocation does (the node's GPU
    /// driver gives its memory no struct pages, an unknown page-table generation).
    Refused(CompatReason),
}

/// Registrations of one provider's memory on one open gdirect device, by allocation.
///
/// The device stays open for the rest of the process (the registrations refer to it): make
/// one cache per process and provider, as the Python package does.
#[derive(Debug)]
pub struct DirectCache {
    driver: &'static Driver,
    provider: Provider,
    /// By the allocation's first address.
    slots: Mutex<HashMap<u64, (u64, Slot)>>,
}

/// What a cached transfer did: the module's transfer, or why the compat engine is to move
/// the bytes instead.
pub type Routed = std::result::Result<Transfer, CompatReason>;

impl DirectCache {
    /// Opens the device at `path` (the device a [`Driver::open`] takes when `None`) for
    /// registrations of `provider`'s memory; why the module cannot serve if it cannot.
    pub fn open(
        path: Option<&Path>,
        provider: Provider,
    ) -> std::result::Result<Self, CompatReason> {
        let driver = match path {
            Some(p) => Driver::open_path(p),
            None => Driver::open(),
        }
        .map_err(|e| CompatReason::from_error(&e))?;
        match driver.info() {
            Ok(i) if i.has_provider(provider) => {}
            Ok(_) => return Err(CompatReason::NoProvider),
            Err(e) => return Err(CompatReason::from_error(&e)),
        }
        Ok(Self {
            driver: Box::leak(Box::new(driver)),
            provider,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The open device.
    pub fn driver(&self) -> &'static Driver {
        self.driver
    }

    /// Registrations held now.
    pub fn registrations(&self) -> usize {
        self.lock()
            .values()
            .filter(|(_, s)| matches!(s, Slot::Registered(_)))
            .count()
    }

    /// Drops every registration the cache holds (transfers running keep theirs until they end).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Reads `len` bytes of `file` at `file_offset` into the memory at `addr`, inside the
    /// allocation `alloc`: through the module with the
    /// allocation's registration (made now if it has none, once `vet` has found the memory
    /// fit: it answers why not, and that answer is kept for the allocation), or `Ok(Err(why))`
    /// when the module cannot serve this request and the compat engine is to. A failure of the
    /// module's own is the error.
    ///
    /// # Safety
    ///
    /// `alloc` is one allocation of the provider's memory that
    /// the caller may have written, and `addr..addr + len` lies inside it. It is freed only
    /// through its provider, whose free revokes registrations of it first (device memory from
    /// `cuMemAlloc`, not from a stream-ordered pool; never host memory, which a free unmaps
    /// while the cache keeps it pinned): the registration outlives this call. No Rust
    /// reference points into the range, and the work queued on it has finished.
    pub unsafe fn read(
        &self,
        file: &File,
        alloc: Range<u64>,
        addr: u64,
        len: u64,
        file_offset: u64,
        vet: impl Fn() -> std::result::Result<(), CompatReason>,
    ) -> Result<Routed> {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            self.transfer(alloc, addr, len, vet, |reg, off| {
                file.read_into(reg, off, file_offset, len)
            })
        }
    }

    /// Writes `len` bytes of the memory at `addr` to `file` at `file_offset`, as
    /// [`read`](Self::read) reads (`file` open for writing); all of them, or
    /// [`Error::FileWrite`] where a write stopped ([`File::write_all_from`]).
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read): the work that writes the range has finished.
    pub unsafe fn write(
        &self,
        file: &File,
        alloc: Range<u64>,
        addr: u64,
        len: u64,
        file_offset: u64,
        vet: impl Fn() -> std::result::Result<(), CompatReason>,
    ) -> Result<Routed> {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            self.transfer(alloc, addr, len, vet, |reg, off| {
                file.write_all_from(reg, off, file_offset, len)
            })
        }
    }

    /// # Safety
    ///
    /// As for [`read`](Self::read).
    unsafe fn transfer(
        &self,
        alloc: Range<u64>,
        addr: u64,
        len: u64,
        vet: impl Fn() -> std::result::Result<(), CompatReason>,
        io: impl Fn(&Registration<'static>, u64) -> Result<Transfer>,
    ) -> Result<Routed> {
        // The registrable part of the allocation: whole provider pages inside it.
        let page = match self.provider {
            Provider::Nvidia => 64 << 10,
            _ => crate::sys::page_size(),
        };
        let alloc_start = alloc.start;
        let lo = alloc.start.next_multiple_of(page);
        let hi = (alloc.end / page) * page;
        if addr < lo || addr.checked_add(len).is_none_or(|end| end > hi) || lo >= hi {
            return Ok(Err(CompatReason::Unaligned));
        }
        for attempt in 0..2 {
            // SAFETY: `lo..hi` lies in the allocation, as the caller's contract describes it.
            let reg = match unsafe { self.slot(alloc_start, lo, hi - lo, &vet) }? {
                Ok(reg) => reg,
                Err(why) => return Ok(Err(why)),
            };
            match io(&reg, addr - lo) {
                Ok(t) => return Ok(Ok(t)),
                // The allocation was freed since it was registered (another now has its
                // address): register it again, once.
                Err(Error::Revoked { .. }) if attempt == 0 => self.forget(alloc_start, &reg),
                Err(Error::IoMisaligned { .. } | Error::NotBlockBacked { .. }) => {
                    return Ok(Err(CompatReason::Unaligned))
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Revoked { handle: 0 })
    }

    /// The registration of `len` bytes at `lo` for the allocation at `start`, made if there is
    /// none; `Ok(Err(why))` when the module refuses it.
    ///
    /// # Safety
    ///
    /// `lo..lo + len` is memory of the allocation at `start`, as [`read`](Self::read) requires.
    unsafe fn slot(
        &self,
        start: u64,
        lo: u64,
        len: u64,
        vet: &impl Fn() -> std::result::Result<(), CompatReason>,
    ) -> Result<std::result::Result<Arc<Registration<'static>>, CompatReason>> {
        if let Some((at, slot)) = self.lock().get(&start) {
            match slot {
                Slot::Registered(reg) if reg.addr() == lo && reg.len() == len => {
                    return Ok(Ok(reg.clone()))
                }
                Slot::Refused(why) if *at == len => return Ok(Err(*why)),
                // Another allocation at the same address since: registered anew below.
                _ => {}
            }
        }
        if let Err(why) = vet() {
            self.insert(start, (len, Slot::Refused(why)));
            return Ok(Err(why));
        }
        for attempt in 0..2 {
            // SAFETY: the caller's contract: the range is the provider's memory, freed only
            // through the provider, which revokes the registration first.
            let r = unsafe {
                self.driver
                    .register_range(self.provider, lo, len, RegisterOptions::new())
            };
            let why = match r {
                Ok(reg) => {
                    let reg = Arc::new(reg);
                    self.insert(start, (len, Slot::Registered(reg.clone())));
                    return Ok(Ok(reg));
                }
                // The limits (pinned bytes, registrations per file): the cache's own
                // registrations, some of memory freed since, may be what fills them. Let them
                // go (transfers running keep theirs) and try once more.
                Err(
                    Error::PinLimit { .. }
                    | Error::UserPinLimit { .. }
                    | Error::TooManyRegistrations,
                ) if attempt == 0 => {
                    self.clear();
                    continue;
                }
                Err(Error::Misaligned { .. }) => CompatReason::Unaligned,
                Err(e @ (Error::NoStructPages { .. } | Error::UnknownPageTable { .. })) => {
                    let why = CompatReason::Refused(e.errno().unwrap_or(Errno::EIO));
                    self.insert(start, (len, Slot::Refused(why)));
                    why
                }
                Err(e) => match e.errno() {
                    // Refused for this request (a limit, memory the provider does not know
                    // now): asked again next time.
                    Some(errno) => CompatReason::Refused(errno),
                    None => return Err(e),
                },
            };
            return Ok(Err(why));
        }
        Ok(Err(CompatReason::Refused(Errno::EDQUOT)))
    }

    /// Enters the allocation's entry, another one going first when the cache holds [`MOST`].
    fn insert(&self, start: u64, entry: (u64, Slot)) {
        let mut slots = self.lock();
        if slots.len() >= MOST && !slots.contains_key(&start) {
            if let Some(&other) = slots.keys().next() {
                slots.remove(&other);
            }
        }
        slots.insert(start, entry);
    }

    /// Drops the allocation's entry if it is still `reg`.
    fn forget(&self, start: u64, reg: &Arc<Registration<'static>>) {
        let mut slots = self.lock();
        if matches!(slots.get(&start), Some((_, Slot::Registered(r))) if Arc::ptr_eq(r, reg)) {
            slots.remove(&start);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Slot)>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}
