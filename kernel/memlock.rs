// SPDX-License-Identifier: GPL-2.0
//! Pinned host memory charged as io_uring charges its registered buffers: to the user that
//! opened the device file, in its `user_struct`'s `locked_vm`, held against the caller's
//! `RLIMIT_MEMLOCK` by a compare-exchange that checks before it adds (`ENOMEM` past it, as
//! `mlock` answers). The charge lives as long as the pins, not as the process: pins kept in a
//! file that another process holds after its opener exec'd or exited still count against the
//! user, and a new process of the user cannot pin the same limit a second time. An opener with
//! `CAP_IPC_LOCK` (in the initial user namespace, as io_uring asks) is not limited. The pages also
//! count in the opener's `mm->pinned_vm` (`VmPin` in `/proc/PID/status`), as RDMA's and
//! io_uring's do.
//!
//! Device memory (GPU, P2P BARs) holds no host RAM and is not charged here; every provider's
//! bytes count towards the module's own `max_pinned_bytes` and the per-user limit (`users`).

use core::{
    ffi::c_void,
    ptr::NonNull, //
};
use kernel::{
    bindings,
    mm::Mm,
    prelude::*,
    sync::{
        aref::ARef,
        Arc, //
    },
};

// `struct mm_struct` and `struct user_struct` cross as `void *`: bindgen's version of the first
// holds a zero-sized type that the `improper_ctypes` lint rejects.
unsafe extern "C" {
    fn gdirect_mm_pinned_add(mm: *mut c_void, pages: i64) -> i64;
    fn gdirect_memlock_limit_pages() -> u64;
    /// `current->mm`, read in C (see `shim.c`: `CurrentTask::mm()` reads the wrong field here).
    fn gdirect_current_mm() -> *mut c_void;
    fn gdirect_get_current_user() -> *mut c_void;
    fn gdirect_user_locked_vm(user: *mut c_void) -> core::ffi::c_long;
    fn gdirect_user_locked_vm_try_cmpxchg(
        user: *mut c_void,
        old: *mut core::ffi::c_long,
        new: core::ffi::c_long,
    ) -> bool;
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

/// The user whose `locked_vm` a file's host pins are charged to: a counted reference to its
/// `user_struct`, taken at `open`.
pub(crate) struct LockedVmUser(NonNull<c_void>);

// SAFETY: a counted reference to a `user_struct`, which is shared by every task of the user;
// `locked_vm` is only changed atomically and `free_uid` may run in any task.
unsafe impl Send for LockedVmUser {}
// SAFETY: as above: no method needs exclusive access.
unsafe impl Sync for LockedVmUser {}

impl LockedVmUser {
    /// The calling task's user, or `None` where it has `CAP_IPC_LOCK` (no limit to keep).
    pub(crate) fn opener() -> Result<Option<Arc<Self>>> {
        // SAFETY: `init_user_ns` is a static that lives forever; the check only reads the
        // current task's credentials.
        if unsafe {
            bindings::ns_capable_noaudit(
                &raw mut bindings::init_user_ns,
                bindings::CAP_IPC_LOCK as i32,
            )
        } {
            return Ok(None);
        }
        // SAFETY: no preconditions; takes a reference to the current credentials' user.
        let user = NonNull::new(unsafe { gdirect_get_current_user() }).ok_or(EINVAL)?;
        Ok(Some(Arc::new(Self(user), GFP_KERNEL)?))
    }

    /// Adds `pages` to `locked_vm` unless that passes `limit` (checked first).
    fn charge(&self, pages: i64, limit: u64) -> bool {
        // SAFETY: the reference keeps the user_struct alive.
        let mut cur = unsafe { gdirect_user_locked_vm(self.0.as_ptr()) };
        loop {
            let Some(new) = cur.checked_add(pages) else {
                return false;
            };
            if u64::try_from(new).map_or(true, |n| n > limit) {
                return false;
            }
            // SAFETY: as above; `cur` is a valid location for the value found.
            if unsafe { gdirect_user_locked_vm_try_cmpxchg(self.0.as_ptr(), &mut cur, new) } {
                return true;
            }
        }
    }

    fn uncharge(&self, pages: i64) {
        // SAFETY: the reference keeps the user_struct alive.
        let mut cur = unsafe { gdirect_user_locked_vm(self.0.as_ptr()) };
        loop {
            let new = cur - pages;
            // SAFETY: as above; `cur` is a valid location for the value found.
            if unsafe { gdirect_user_locked_vm_try_cmpxchg(self.0.as_ptr(), &mut cur, new) } {
                return;
            }
        }
    }
}

impl Drop for LockedVmUser {
    fn drop(&mut self) {
        // SAFETY: gives back the reference `get_current_user` took.
        unsafe { bindings::free_uid(self.0.as_ptr().cast()) };
    }
}

/// Host pages charged to a user's `locked_vm` and an address space's `pinned_vm`, uncharged on
/// drop (which may come after the opener exec'd or exited).
pub(crate) struct MemlockCharge {
    user: Option<Arc<LockedVmUser>>,
    mm: ARef<Mm>,
    pages: i64,
}

impl MemlockCharge {
    /// Charges `pages` to `user` (`ENOMEM` past the caller's `RLIMIT_MEMLOCK`; no limit for a
    /// `None` user, one with `CAP_IPC_LOCK`) and to `mm`'s `pinned_vm`.
    pub(crate) fn new(user: Option<&Arc<LockedVmUser>>, mm: &ARef<Mm>, pages: u64) -> Result<Self> {
        let pages = i64::try_from(pages).map_err(|_| ENOMEM)?;
        if let Some(user) = user {
            // SAFETY: no preconditions.
            let limit = unsafe { gdirect_memlock_limit_pages() };
            if !user.charge(pages, limit) {
                return Err(ENOMEM);
            }
        }
        // SAFETY: the `mmgrab` reference keeps the `mm_struct` (and its atomic counter) alive.
        unsafe { gdirect_mm_pinned_add(mm.as_raw().cast(), pages) };
        Ok(Self {
            user: user.cloned(),
            mm: mm.clone(),
            pages,
        })
    }
}

impl Drop for MemlockCharge {
    fn drop(&mut self) {
        // SAFETY: the `mmgrab` reference keeps the `mm_struct` (and its counter) alive, even
        // after the process exits.
        unsafe { gdirect_mm_pinned_add(self.mm.as_raw().cast(), -self.pages) };
        if let Some(user) = &self.user {
            user.uncharge(self.pages);
        }
    }
}
