// SPDX-License-Identifier: GPL-2.0
//! Pinned host memory charged to the caller, as RDMA memory registration does: the pages count
//! in the process's `mm->pinned_vm` and may not exceed `RLIMIT_MEMLOCK` unless the caller has
//! `CAP_IPC_LOCK`. Device memory (GPU, P2P BARs) holds no host RAM and is not charged; every
//! provider's bytes count towards the module's own `max_pinned_bytes`.

use core::ffi::c_void;
use kernel::{
    bindings,
    mm::Mm,
    prelude::*,
    sync::aref::ARef, //
};

// `struct mm_struct` crosses as `void *`: bindgen's version holds a zero-sized type that the
// `improper_ctypes` lint rejects.
unsafe extern "C" {
    fn gdirect_mm_pinned_add(mm: *mut c_void, pages: i64) -> i64;
    fn gdirect_memlock_limit_pages() -> u64;
    /// `current->mm`, read in C (see `shim.c`: `CurrentTask::mm()` reads the wrong field here).
    fn gdirect_current_mm() -> *mut c_void;
}

/// The calling task's address space, held (`mmgrab`); `None` for a kernel thread.
pub(crate) fn current_mm() -> Option<ARef<Mm>> {
    // SAFETY: no preconditions; the result is the current task's own mm (or NULL), which stays
    // valid while the task runs this call.
    let raw = unsafe { gdirect_current_mm() };
    if raw.is_null() {
        return None;
    }
    // SAFETY: a live `mm_struct` (see above); `ARef::from` takes its own reference.
    Some(ARef::from(unsafe { Mm::from_raw(raw.cast()) }))
}

/// Whether the calling task runs in the address space `mm`.
pub(crate) fn is_current_mm(mm: &Mm) -> bool {
    // SAFETY: no preconditions; only the address is compared.
    let raw = unsafe { gdirect_current_mm() };
    core::ptr::eq(raw.cast_const().cast(), mm.as_raw().cast_const())
}

/// Pages charged to a process's `pinned_vm`, uncharged on drop.
pub(crate) struct MemlockCharge {
    mm: ARef<Mm>,
    pages: i64,
}

impl MemlockCharge {
    /// Charges `pages` to the calling process: `ENOMEM` past `RLIMIT_MEMLOCK` (as `mlock` and
    /// RDMA registration answer) unless it has `CAP_IPC_LOCK`. `None` for a caller without an
    /// address space (a kernel thread), which pins nothing of its own.
    pub(crate) fn new(pages: u64) -> Result<Option<Self>> {
        // SAFETY: no preconditions; the result is the current task's own mm (or NULL), which
        // stays valid while the task runs this call.
        let raw = unsafe { gdirect_current_mm() };
        if raw.is_null() {
            return Ok(None);
        }
        // SAFETY: a live `mm_struct` (see above).
        let mm = unsafe { Mm::from_raw(raw.cast()) };
        let pages = i64::try_from(pages).map_err(|_| ENOMEM)?;
        // SAFETY: `raw` is the live mm of the current task; `pinned_vm` is an atomic counter.
        let total = unsafe { gdirect_mm_pinned_add(raw, pages) };
        // SAFETY: no preconditions.
        let limit = unsafe { gdirect_memlock_limit_pages() };
        // SAFETY: `capable` only reads the current task's credentials.
        if u64::try_from(total).unwrap_or(u64::MAX) > limit
            && !unsafe { bindings::capable(bindings::CAP_IPC_LOCK as i32) }
        {
            // SAFETY: as above; undoes the addition.
            unsafe { gdirect_mm_pinned_add(raw, -pages) };
            return Err(ENOMEM);
        }
        Ok(Some(Self {
            mm: ARef::from(mm),
            pages,
        }))
    }
}

impl Drop for MemlockCharge {
    fn drop(&mut self) {
        // SAFETY: the `mmgrab` reference keeps the `mm_struct` (and its counter) alive, even
        // after the process exits.
        unsafe { gdirect_mm_pinned_add(self.mm.as_raw().cast(), -self.pages) };
    }
}
