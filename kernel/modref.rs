// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! References on the module itself, for work that outlives the operation that started it.
//!
//! An open file holds a reference on the module (the misc device's `owner`), so `rmmod` is
//! refused while one is open. Work that can outlive its file needs one of its own: a batched
//! transfer queued on the module's workqueue (the file may be closed with it queued), and an
//! orphaned GPU registration whose free callback the GPU driver will still call. With them,
//! `rmmod` is refused (`EWOULDBLOCK`) until the work is done, and no gdirect code can run after the
//! module's exit: the exit destroys the workqueue, which waits for a transfer's work item to
//! return after it put its reference, and waits for a callback that put its own.

use kernel::bindings;

/// A reference on this module, put when dropped.
pub(crate) struct ModuleRef(());

impl ModuleRef {
    /// Takes a reference on the module.
    ///
    /// # Safety
    ///
    /// The module is live and cannot start unloading during the call: the caller runs on
    /// behalf of something that already holds a reference (an open file in one of its
    /// operations, or another `ModuleRef`).
    pub(crate) unsafe fn get() -> Self {
        // SAFETY: the caller's promise: the module's refcount is above zero, which is what
        // `__module_get` needs (unlike `try_module_get`, it cannot fail).
        unsafe { bindings::__module_get(crate::THIS_MODULE.as_ptr()) };
        Self(())
    }

    /// Hands the reference to code that will take it back with [`ModuleRef::adopt`] (a free
    /// callback, through the GPU driver).
    pub(crate) fn leak(self) {
        core::mem::forget(self);
    }

    /// Takes back a reference that [`ModuleRef::leak`] handed over.
    ///
    /// # Safety
    ///
    /// A reference leaked earlier and not adopted since is owned by the caller.
    pub(crate) unsafe fn adopt() -> Self {
        Self(())
    }
}

impl Drop for ModuleRef {
    fn drop(&mut self) {
        // SAFETY: the reference this value owns (`get`, or a leaked one it adopted).
        unsafe { bindings::module_put(crate::THIS_MODULE.as_ptr()) };
    }
}
