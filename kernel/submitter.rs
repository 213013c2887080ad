// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The identity a batch's transfers run under.
//!
//! A batch runs on the module's workqueue, in kernel threads: left alone, its I/O would run with
//! the kernel's credentials (a write would keep the setuid bit a user's write clears, and skip
//! the LSM's checks of the writer), ignore the submitter's `RLIMIT_FSIZE`, and be charged to the
//! root io and memory cgroups. `SUBMIT` captures the submitter ([`Submitter::current`]) and each
//! transfer runs under it ([`Submitter::run`]), as io_uring's workers run under their ring's
//! task: its credentials, its io cgroup (`kthread_associate_blkcg`: the block layer charges the
//! bios to it), its memory cgroup (`set_active_memcg`: `GFP_KERNEL_ACCOUNT` allocations are
//! charged to it), and its file size limit ([`Submitter::write_limit`]: the one check of
//! `generic_write_check_limits` that reads the task rather than its credentials).

use core::{ffi::c_void, ptr::NonNull};
use kernel::{
    bindings,
    cred::Credential,
    prelude::*,
    sync::aref::ARef,
    task::Task, //
};

use crate::dio::fsize_limit;

unsafe extern "C" {
    // `shim.c`: inline functions and macros. Pointers to `cred`, `cgroup_subsys_state` and
    // `mem_cgroup` cross as `void *`.
    fn gdirect_current_cred() -> *const c_void;
    fn gdirect_override_creds(cred: *const c_void) -> *const c_void;
    fn gdirect_revert_creds(cred: *const c_void) -> *const c_void;
    // `task_struct`'s layout in the bindings is not C's (`layout`): its fields are read in C.
    fn gdirect_task_exec_id(task: *mut c_void) -> u64;
    fn gdirect_current_blkcg_css() -> *mut c_void;
    fn gdirect_css_put(css: *mut c_void);
    fn gdirect_kthread_associate_blkcg(css: *mut c_void);
    fn gdirect_current_memcg() -> *mut c_void;
    fn gdirect_set_active_memcg(memcg: *mut c_void) -> *mut c_void;
    fn gdirect_mem_cgroup_put(memcg: *mut c_void);
}

/// A referenced io cgroup (`struct cgroup_subsys_state`).
struct Blkcg(NonNull<c_void>);

impl Drop for Blkcg {
    fn drop(&mut self) {
        // SAFETY: the reference `task_get_css()` gave, put once.
        unsafe { gdirect_css_put(self.0.as_ptr()) };
    }
}

/// A referenced memory cgroup (`struct mem_cgroup`).
struct Memcg(NonNull<c_void>);

impl Drop for Memcg {
    fn drop(&mut self) {
        // SAFETY: the reference `get_mem_cgroup_from_mm()` gave, put once.
        unsafe { gdirect_mem_cgroup_put(self.0.as_ptr()) };
    }
}

/// `RLIM_INFINITY` as `generic_write_check_limits()` reads it (a `loff_t`).
const NO_LIMIT: i64 = -1;

/// The task that submitted a batch, as its transfers need it.
pub(crate) struct Submitter {
    cred: ARef<Credential>,
    task: ARef<Task>,
    blkcg: Option<Blkcg>,
    memcg: Option<Memcg>,
    /// `RLIMIT_FSIZE` at the submit, as a `loff_t` (`NO_LIMIT` for none).
    fsize: i64,
    /// The task's `self_exec_id` at the submit: `SIGXFSZ` goes only to the program that
    /// submitted, not to one the task `exec`'d since.
    exec_id: u64,
}

// SAFETY: the cgroup references may be used and put from any thread; the rest is `Send`.
unsafe impl Send for Submitter {}
// SAFETY: shared references only read the fields.
unsafe impl Sync for Submitter {}

impl Submitter {
    /// The calling task.
    pub(crate) fn current() -> Self {
        // SAFETY: the calling task's credentials are valid while it runs, and `ARef::from`
        // takes a reference of its own before this call returns.
        let cred = ARef::from(unsafe { Credential::from_ptr(gdirect_current_cred().cast()) });
        let task = ARef::from(&**kernel::current!());
        // SAFETY: the calling task is valid; only it changes its `self_exec_id` (at `exec`).
        let exec_id = unsafe { gdirect_task_exec_id(task.as_ptr().cast()) };
        // SAFETY: no preconditions; a non-NULL result is referenced and becomes `Blkcg`'s.
        let blkcg = NonNull::new(unsafe { gdirect_current_blkcg_css() }).map(Blkcg);
        // SAFETY: as above, for `Memcg`.
        let memcg = NonNull::new(unsafe { gdirect_current_memcg() }).map(Memcg);
        let fsize = fsize_limit() as i64;
        Self {
            cred,
            task,
            blkcg,
            memcg,
            fsize,
            exec_id,
        }
    }

    /// Runs `f` under the submitter's credentials and cgroups. Called on the module's
    /// workqueue (the io cgroup is attached only to a kernel thread).
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        let blkcg = self
            .blkcg
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.0.as_ptr());
        let memcg = self
            .memcg
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.0.as_ptr());
        // SAFETY: `self.cred` holds a reference for longer than the override, which is reverted
        // below, on this thread, before `run` returns; the css and memcg are referenced by
        // `self` for as long as they are attached (`kthread_associate_blkcg` takes its own).
        let (old_cred, old_memcg) = unsafe {
            let old_cred = gdirect_override_creds(self.cred.as_ptr().cast());
            gdirect_kthread_associate_blkcg(blkcg);
            (old_cred, gdirect_set_active_memcg(memcg))
        };
        let r = f();
        // SAFETY: restores what was replaced above, in reverse order, on the same thread.
        unsafe {
            gdirect_set_active_memcg(old_memcg);
            gdirect_kthread_associate_blkcg(core::ptr::null_mut());
            gdirect_revert_creds(old_cred);
        }
        r
    }

    /// How much of a write of `len` bytes at `pos` of a regular file the submitter's
    /// `RLIMIT_FSIZE` allows, as `generic_write_check_limits()` decides it for a write of the
    /// task's own: `EFBIG` with `SIGXFSZ` to the submitter at or past the limit, fewer bytes
    /// across it. (A worker's own limit is infinite; block devices have no such limit.)
    pub(crate) fn write_limit(&self, pos: u64, len: u64) -> Result<u64> {
        // A position no `loff_t` holds fails as the transfer itself would (`direct_io`), with
        // no signal.
        i64::try_from(pos).map_err(|_| EOVERFLOW)?;
        if self.fsize == NO_LIMIT {
            return Ok(len);
        }
        // A limit that is negative as a `loff_t` (other than `RLIM_INFINITY`) is below every
        // position, as in C.
        let limit = u64::try_from(self.fsize).unwrap_or(0);
        if pos >= limit {
            // Sent as from the kernel (`SI_KERNEL`): the sender is a worker, not the task. Not
            // to a program the task `exec`'d since the submit (which did not ask for this
            // write), as the kernel keeps a parent's death signal from a child that exec'd a
            // new program (`exit_notify`: `self_exec_id` against `parent_exec_id`).
            // SAFETY: `self.task` holds a reference to the task; `exec` bumps `self_exec_id`
            // (`WRITE_ONCE`) under the task's own lock, and a stale read only misses the bump
            // by a moment.
            let exec_id = unsafe { gdirect_task_exec_id(self.task.as_ptr().cast()) };
            if exec_id == self.exec_id {
                // SAFETY: as above; sending to a task that has exited does nothing.
                unsafe { bindings::send_sig(bindings::SIGXFSZ as i32, self.task.as_ptr(), 1) };
            }
            return Err(EFBIG);
        }
        Ok(len.min(limit - pos))
    }
}
