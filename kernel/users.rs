// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Pinned bytes per user: `max_pinned_bytes_per_user` keeps the registrations of one user from
//! taking the whole of `max_pinned_bytes`, so that one user cannot make every other one get
//! `EDQUOT`. The user is the one that opened the device file (its real uid at `open`, as
//! io_uring charges the user that set a ring up), over all its files and processes: a process
//! that changed its uid after it opened the file registers on the account it opened it with.
//! (Only the opening address space may use a file at all: see `file`.)
//!
//! A registration holds a [`UserCharge`]; the users with something pinned are kept in a short
//! list, looked up at `REGISTER` under its lock. A charge is given back without the lock (an
//! atomic subtraction), so a registration may end in any context; a user whose bytes are back at
//! zero leaves the list at the next lookup.

use kernel::{
    prelude::*,
    sync::{
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc, //
    },
};

use crate::{
    error,
    stats, //
};

/// The bytes one user has pinned.
struct UserPins {
    /// The real uid, as the kernel knows it (`kuid_t`, the initial namespace's value).
    uid: u32,
    bytes: Atomic<u64>,
}

kernel::sync::global_lock! {
    // SAFETY: `init` initializes it from the module's init, before any file is opened.
    unsafe(uninit) static USERS: Mutex<KVec<Arc<UserPins>>> = KVec::new();
}

/// Owns the list for the module's lifetime: made usable at init, emptied at exit.
pub(crate) struct Users;

impl Users {
    /// Makes the list usable.
    ///
    /// # Safety
    ///
    /// Called once, from the module's init, before anything uses the list.
    pub(crate) unsafe fn init() -> Self {
        // SAFETY: the caller's contract.
        unsafe { USERS.init() };
        Self
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        // At the module's exit no file is open, so no registration holds a charge: free what
        // the list still holds (users whose bytes went back to zero since the last lookup).
        let users = core::mem::take(&mut *USERS.lock());
        drop(users);
    }
}

/// The user a file opened now belongs to: the calling task's real uid (the value in the
/// initial user namespace).
pub(crate) fn opener() -> Uid {
    Uid(kernel::current!().uid().into_raw().val)
}

/// A user, as [`opener`] found it.
#[derive(Clone, Copy)]
pub(crate) struct Uid(u32);

/// The bytes `uid` has pinned now.
pub(crate) fn bytes_of(Uid(uid): Uid) -> u64 {
    USERS
        .lock()
        .iter()
        .find(|u| u.uid == uid)
        .map_or(0, |u| u.bytes.load(Relaxed))
}

/// Bytes charged to a user, given back on drop.
pub(crate) struct UserCharge {
    user: Arc<UserPins>,
    bytes: u64,
}

impl UserCharge {
    /// Charges `bytes` to user `uid`: `EDQUOT` past `max_pinned_bytes_per_user` (0: no limit of
    /// its own).
    pub(crate) fn new(Uid(uid): Uid, bytes: u64) -> Result<Self> {
        let max = crate::max_pinned_bytes_per_user();
        let mut users = USERS.lock();
        // Users with nothing pinned leave; none is being charged (that happens under the lock).
        users.retain(|u| u.bytes.load(Relaxed) != 0);
        let user = match users.iter().find(|u| u.uid == uid) {
            Some(u) => u.clone(),
            None => {
                let u = Arc::new(
                    UserPins {
                        uid,
                        bytes: Atomic::new(0),
                    },
                    GFP_KERNEL,
                )?;
                users.push(u.clone(), GFP_KERNEL)?;
                u
            }
        };
        let max = if max == 0 { u64::MAX } else { max };
        if !stats::reserve_within(&user.bytes, bytes, max) {
            return Err(error::over_user_pin_limit());
        }
        Ok(Self { user, bytes })
    }
}

impl Drop for UserCharge {
    fn drop(&mut self) {
        self.user.bytes.fetch_sub(self.bytes, Relaxed);
    }
}
