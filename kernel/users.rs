// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Pinned bytes per user: `max_pinned_bytes_per_user` keeps the registrations of one user from
//! taking the whole of `max_pinned_bytes`, so that one user cannot make every other one get
//! `EDQUOT`. The user is the one that opened the device file (its real uid at `open`, as
//! io_uring charges the user that set a ring up), over all its files and processes: a process
//! that changed its uid after it opened the file registers on the account it opened it with.
//! (Only the opening address space may use a file at all: see `file`.)
//!
//! A user namespace's uids count against the user that made the namespace too, and so on up to
//! the initial namespace, as the kernel's own `RLIMIT_MEMLOCK` accounting (ucounts) goes: a
//! registration is charged to the opener's uid and to the owner of each user namespace the opener
//! runs in (each once), and is refused when any of them would pass the limit. So the 65536
//! subordinate uids a user maps in a container share that user's limit. A namespace that root
//! made (a container runtime's: every pod or container of a node) is an account of its own
//! instead of root's: each such container's uids share one limit, and no container can take
//! another's, or root's own, by filling an account they all shared.
//!
//! Batched transfers per user: `max_in_flight_per_user` bounds the transfers the files of one
//! user (with the same accounts as its pins) have queued or running on the module's workers,
//! so that no user takes every worker; `SUBMIT` queues no more past it (`EDQUOT` when it could
//! queue none).
//!
//! Bounce chunks per user: `max_bounce_per_user` bounds the chunks of the bounce pool one user
//! holds at a time (see `bounce`).
//!
//! Storage I/O per user: `max_in_flight_bytes_per_user` bounds the bytes of storage I/O the
//! transfers of one user have running at a time ([`UserCharge::start_io`]; beyond it, an I/O
//! waits for the user's own to end), so that one user fills at most that much of a drive's
//! queue: a free of another user's memory waits behind no more than that of it (see the
//! README's bound on a free's wait). The counts change under one gate, which the waiters sleep
//! on; a transfer takes its room before it starts a use of the registration's pages
//! (`RegShared::begin_io`), so it never holds a use while it waits here (it may hold its room
//! while it waits under the registration's cap, which only I/O already running frees).
//!
//! A registration holds a [`UserCharge`]; the users with something pinned are kept in a short
//! list, looked up at `REGISTER` under its lock. A charge is given back without the lock (an
//! atomic subtraction), so a registration may end in any context; a user whose bytes are back at
//! zero leaves the list at the next lookup.

use core::ffi::c_void;
use kernel::{
    alloc::kvec::PushError,
    bindings, new_condvar, new_mutex,
    prelude::*,
    sync::{
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc,
        CondVar, //
    },
};

use crate::{
    error,
    stats, //
};

// `struct user_namespace` crosses as `void *` (see `shim.c`).
unsafe extern "C" {
    fn gdirect_current_user_ns() -> *mut c_void;
    fn gdirect_user_ns_parent(ns: *mut c_void) -> *mut c_void;
    fn gdirect_user_ns_owner(ns: *mut c_void) -> u32;
    fn gdirect_user_ns_inum(ns: *mut c_void) -> u32;
}

/// An account's key: a uid (`kuid_t`, the initial namespace's value), or, with this bit, the
/// inode number of a user namespace that root made (`/proc/PID/ns/user`; unique while the
/// namespace lives: a later namespace given the number of one whose charges outlive it, held by
/// registrations orphaned with the GPU until its free, shares what is left of them).
const NS_ACCOUNT: u64 = 1 << 32;

/// The bytes one user has pinned, and its batched transfers running.
struct UserPins {
    /// The account: a real uid, or a namespace ([`NS_ACCOUNT`]).
    key: u64,
    bytes: Atomic<u64>,
    /// The [`UserCharge`]s that hold the account: one per registration, revoked ones too (their
    /// bytes given back, their transfers still counted here until they end). A user stays
    /// listed while it has bytes or charges, so that every charge of one uid counts against the
    /// same limits.
    charges: Atomic<u64>,
    /// Batched transfers queued or running, until their work item is done (each holds a
    /// registration, and so a charge).
    transfers: Atomic<u64>,
    /// Bounce chunks held (changed only under the bounce pool's lock).
    bounce: Atomic<u64>,
    /// Bytes of storage I/O running (changed only under [`IoGate::lock`]).
    io_bytes: Atomic<u64>,
}

/// Where storage I/O waits for room under `max_in_flight_bytes_per_user`.
#[pin_data]
struct IoGate {
    /// Every user's `io_bytes` changes under it.
    #[pin]
    lock: kernel::sync::Mutex<()>,
    #[pin]
    returned: CondVar,
}

kernel::sync::global_lock! {
    // SAFETY: `Users::init` initializes it from the module's init, before any file is opened.
    unsafe(uninit) static IO_GATE: Mutex<Option<Arc<IoGate>>> = None;
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
    pub(crate) unsafe fn init() -> Result<Self> {
        // SAFETY: the caller's contract.
        unsafe {
            USERS.init();
            IO_GATE.init();
        }
        let gate = Arc::pin_init(
            pin_init!(IoGate {
                lock <- new_mutex!((), "users::IoGate::lock"),
                returned <- new_condvar!("users::IoGate::returned"),
            }),
            GFP_KERNEL,
        )?;
        *IO_GATE.lock() = Some(gate);
        Ok(Self)
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        // At the module's exit no file is open, so no registration holds a charge: free what
        // the list still holds (users whose bytes went back to zero since the last lookup).
        let users = core::mem::take(&mut *USERS.lock());
        drop(users);
        let gate = IO_GATE.lock().take();
        drop(gate);
    }
}

/// The accounts a file opened now is charged to: the calling task's real uid (the value in the
/// initial user namespace), then the owner of each user namespace it runs in, innermost first,
/// each once; a namespace that root owns is its own account ([`NS_ACCOUNT`]).
pub(crate) fn opener() -> Result<Opener> {
    let mut keys = KVec::new();
    keys.push(
        u64::from(kernel::current!().uid().into_raw().val),
        GFP_KERNEL,
    )?;
    let init = (&raw mut bindings::init_user_ns).cast::<c_void>();
    // SAFETY: no preconditions; the namespace of the current credentials, which hold it (and it
    // its parents) while this task runs.
    let mut ns = unsafe { gdirect_current_user_ns() };
    while !ns.is_null() && ns != init {
        // SAFETY: `ns` is live (see above).
        let key = match unsafe { gdirect_user_ns_owner(ns) } {
            // SAFETY: as above.
            0 => NS_ACCOUNT | u64::from(unsafe { gdirect_user_ns_inum(ns) }),
            owner => u64::from(owner),
        };
        if !keys.contains(&key) {
            keys.push(key, GFP_KERNEL)?;
        }
        // SAFETY: as above.
        ns = unsafe { gdirect_user_ns_parent(ns) };
    }
    Ok(Opener { keys })
}

/// The accounts of a file, as [`opener`] found them; the first is the opener's own uid.
pub(crate) struct Opener {
    keys: KVec<u64>,
}

/// The bytes the opener's own uid has pinned now.
pub(crate) fn bytes_of(opener: &Opener) -> u64 {
    let Some(&key) = opener.keys.first() else {
        return 0;
    };
    USERS
        .lock()
        .iter()
        .find(|u| u.key == key)
        .map_or(0, |u| u.bytes.load(Relaxed))
}

/// Bytes charged to each account of a file, given back on drop.
pub(crate) struct UserCharge {
    users: KVec<Arc<UserPins>>,
    bytes: u64,
    gate: Arc<IoGate>,
}

impl UserCharge {
    /// Charges `bytes` to every account of `opener`: `EDQUOT` if one would pass
    /// `max_pinned_bytes_per_user` (0: no limit of its own), with nothing charged.
    pub(crate) fn new(opener: &Opener, bytes: u64) -> Result<Self> {
        let max = match crate::max_pinned_bytes_per_user() {
            0 => u64::MAX,
            max => max,
        };
        let mut charge = Self {
            users: KVec::with_capacity(opener.keys.len(), GFP_KERNEL)?,
            bytes,
            gate: IO_GATE.lock().clone().ok_or(ENODEV)?,
        };
        let mut users = USERS.lock();
        // Users with nothing pinned and no charge leave; none is being charged (that happens
        // under the lock).
        users.retain(|u| u.bytes.load(Relaxed) != 0 || u.charges.load(Relaxed) != 0);
        for &key in opener.keys.iter() {
            let user = match users.iter().find(|u| u.key == key) {
                Some(u) => u.clone(),
                None => {
                    let u = Arc::new(
                        UserPins {
                            key,
                            bytes: Atomic::new(0),
                            charges: Atomic::new(0),
                            transfers: Atomic::new(0),
                            bounce: Atomic::new(0),
                            io_bytes: Atomic::new(0),
                        },
                        GFP_KERNEL,
                    )?;
                    users.push(u.clone(), GFP_KERNEL)?;
                    u
                }
            };
            if !stats::reserve_within(&user.bytes, bytes, max) {
                // The accounts charged so far are given back by `charge`'s drop.
                return Err(error::over_user_pin_limit());
            }
            // Room for every account was made above.
            if let Err(PushError(user)) = charge.users.push_within_capacity(user) {
                user.bytes.fetch_sub(bytes, Relaxed);
                return Err(ENOMEM);
            }
            // Given back by `charge`'s drop, as its bytes are.
            if let Some(user) = charge.users.last() {
                user.charges.fetch_add(1, Relaxed);
            }
        }
        Ok(charge)
    }
}

/// A charge's pinned bytes, taken out of it ([`UserCharge::take_bytes`]) to be given back on
/// their own: at a revocation, while the charge stays with its registration for its I/O.
pub(crate) struct UserBytes {
    users: KVec<Arc<UserPins>>,
    bytes: u64,
}

impl Drop for UserBytes {
    fn drop(&mut self) {
        for user in self.users.iter() {
            user.bytes.fetch_sub(self.bytes, Relaxed);
        }
    }
}

impl UserCharge {
    /// The charge's pinned bytes, to be given back when the result is dropped; the charge keeps
    /// its accounts for the I/O limits (listed while it holds them) and gives back no bytes of
    /// its own any more.
    pub(crate) fn take_bytes(&mut self) -> Result<UserBytes> {
        let mut users = KVec::with_capacity(self.users.len(), GFP_KERNEL)?;
        for user in self.users.iter() {
            users.push(user.clone(), GFP_KERNEL)?;
        }
        Ok(UserBytes {
            users,
            bytes: core::mem::take(&mut self.bytes),
        })
    }

    /// One more batched transfer for each account of the charge: `EDQUOT`, with nothing
    /// taken, when one of them has `max_in_flight_per_user` running already.
    pub(crate) fn start_transfer(&self) -> Result<TransferCharge> {
        let max = match crate::max_in_flight_per_user() {
            0 => u64::MAX,
            max => u64::from(max),
        };
        let mut charge = Counted {
            users: KVec::with_capacity(self.users.len(), GFP_KERNEL)?,
            count: |u| &u.transfers,
        };
        for user in self.users.iter() {
            // The accounts taken so far are given back by `charge`'s drop.
            if !stats::reserve_within(&user.transfers, 1, max) {
                return Err(error::over_user_transfer_limit());
            }
            // Room for every account was made above.
            if let Err(PushError(user)) = charge.users.push_within_capacity(user.clone()) {
                user.transfers.fetch_sub(1, Relaxed);
                return Err(ENOMEM);
            }
        }
        Ok(charge)
    }
}

impl UserCharge {
    /// Whether every account of the charge holds fewer than `cap` bounce chunks.
    pub(crate) fn bounce_below(&self, cap: u64) -> bool {
        self.users.iter().all(|u| u.bounce.load(Relaxed) < cap)
    }

    /// One more bounce chunk for each account (under the bounce pool's lock).
    pub(crate) fn start_bounce(&self) -> Result<BounceCharge> {
        let mut users = KVec::with_capacity(self.users.len(), GFP_KERNEL)?;
        for user in self.users.iter() {
            // Room for every account was made above.
            if users.push_within_capacity(user.clone()).is_err() {
                return Err(ENOMEM);
            }
        }
        for user in users.iter() {
            user.bounce.fetch_add(1, Relaxed);
        }
        Ok(Counted {
            users,
            count: |u| &u.bounce,
        })
    }
}

impl UserCharge {
    /// Room for `bytes` of storage I/O on each account of the charge: waits while one of them
    /// has `max_in_flight_bytes_per_user` running (an account with none running always has
    /// room, whatever the size), `ERESTARTSYS` on a signal.
    pub(crate) fn start_io(&self, bytes: u64) -> Result<IoCharge<'_>> {
        let cap = match crate::max_in_flight_bytes_per_user() {
            0 => u64::MAX,
            cap => cap,
        };
        let room = |u: &Arc<UserPins>| {
            let running = u.io_bytes.load(Relaxed);
            running == 0 || running.saturating_add(bytes) <= cap
        };
        let mut gate = self.gate.lock.lock();
        while !self.users.iter().all(room) {
            if self.gate.returned.wait_interruptible(&mut gate) {
                return Err(ERESTARTSYS);
            }
        }
        for user in self.users.iter() {
            user.io_bytes.fetch_add(bytes, Relaxed);
        }
        Ok(IoCharge {
            charge: self,
            bytes,
        })
    }
}

/// Bytes of storage I/O counted against each account of a user, until dropped.
pub(crate) struct IoCharge<'a> {
    charge: &'a UserCharge,
    bytes: u64,
}

impl Drop for IoCharge<'_> {
    fn drop(&mut self) {
        let gate = self.charge.gate.lock.lock();
        for user in self.charge.users.iter() {
            user.io_bytes.fetch_sub(self.bytes, Relaxed);
        }
        drop(gate);
        // Every waiter: the one with room now may be another than the next in line.
        self.charge.gate.returned.notify_all();
    }
}

/// One unit of a per-user count (`transfers`, `bounce`) on each account of a user, given back
/// on drop.
pub(crate) struct Counted {
    users: KVec<Arc<UserPins>>,
    count: fn(&UserPins) -> &Atomic<u64>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        for user in self.users.iter() {
            (self.count)(user).fetch_sub(1, Relaxed);
        }
    }
}

/// A batched transfer counted against each account of its registration's user, until dropped
/// (when its work item is done).
pub(crate) type TransferCharge = Counted;

/// A bounce chunk counted against each account of a user, until dropped (under the bounce
/// pool's lock).
pub(crate) type BounceCharge = Counted;

impl Drop for UserCharge {
    fn drop(&mut self) {
        for user in self.users.iter() {
            user.bytes.fetch_sub(self.bytes, Relaxed);
            user.charges.fetch_sub(1, Relaxed);
        }
    }
}
