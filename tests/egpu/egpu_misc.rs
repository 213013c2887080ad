// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The emulated GPU's misc device registration, which pins the emulator while a file is open.
//!
//! The emulator's own: it shares no source file with gdirect's module (`independent.sh`), so
//! this generic mechanism is written here again rather than included.
//!
//! `kernel::miscdevice::MiscDeviceRegistration` leaves `file_operations.owner` NULL and the device
//! mode 0 (so 0600). With a NULL owner the VFS takes no module reference when the device is
//! opened, and `rmmod` would free the module's code and the per-file state's `release` while a
//! file still points at them. [`OwnedMiscDevice`] registers a copy of the Rust misc vtable with
//! `owner` set to this module, so `misc_open()`'s `fops_get()` takes a module reference for every
//! open file and `delete_module()` refuses with `EBUSY` until the last one is closed; and it sets
//! the node's mode.
//!
//! One instance exists, owned by the emulator's module object (`/dev/gdirect_egpu`), as
//! nvidia.ko's `/dev/nvidia*` files hold a reference on it (`nvidia_fops.owner`).

use core::marker::PhantomData;
use kernel::{
    bindings,
    error::to_result,
    miscdevice::{
        MiscDevice,
        MiscDeviceOptions, //
    },
    prelude::*,
    types::Opaque,
};

/// A registered misc device whose files hold a reference on the owning module.
///
/// # Invariants
///
/// - `misc` holds a `struct miscdevice` registered with `misc_register()`, built by
///   [`MiscDeviceOptions::into_raw`] for `T`, except that `fops` points to `self.fops` and `mode`
///   is the requested mode.
/// - `fops` is a copy of the Rust misc vtable of `T` with `owner` set to the owning module.
/// - Deregistration happens exactly once, in [`Drop`].
#[pin_data(PinnedDrop)]
pub(crate) struct OwnedMiscDevice<T: MiscDevice> {
    #[pin]
    fops: Opaque<bindings::file_operations>,
    #[pin]
    misc: Opaque<bindings::miscdevice>,
    _t: PhantomData<T>,
}

// SAFETY: `misc_deregister` may be called from any thread, and the registration is not otherwise
// touched after `misc_register`.
unsafe impl<T: MiscDevice> Send for OwnedMiscDevice<T> {}
// SAFETY: No `&self` method mutates anything.
unsafe impl<T: MiscDevice> Sync for OwnedMiscDevice<T> {}

impl<T: MiscDevice> OwnedMiscDevice<T> {
    /// Registers `/dev/<name>` with the given mode, owned by `module`.
    pub(crate) fn register(
        name: &'static CStr,
        mode: u16,
        module: &'static ThisModule,
    ) -> impl PinInit<Self, Error> {
        let mut raw = MiscDeviceOptions { name }.into_raw::<T>();
        // SAFETY: `into_raw` points `fops` at the static vtable of `T`, valid forever.
        let mut fops = unsafe { *raw.fops };
        fops.owner = module.as_ptr();
        raw.mode = mode;

        try_pin_init!(&this in Self {
            fops: Opaque::new(fops),
            misc <- Opaque::try_ffi_init(move |slot: *mut bindings::miscdevice| {
                // `fops` is initialized before `misc` (field order) and pinned with it.
                // SAFETY: `this` points to the `Self` being initialized; taking a field's address
                // does not read it.
                raw.fops = Opaque::cast_into(unsafe { &raw const (*this.as_ptr()).fops });
                // SAFETY: The initializer may write to `slot`.
                unsafe { slot.write(raw) };
                // INVARIANT: on success `misc` is registered.
                // SAFETY: `slot` holds a valid `miscdevice` whose `fops` and `name` outlive the
                // registration: both are pinned in (or static for) `Self`, and `Drop` deregisters
                // before they go away.
                to_result(unsafe { bindings::misc_register(slot) })
            }),
            _t: PhantomData,
        })
    }
}

#[pinned_drop]
impl<T: MiscDevice> PinnedDrop for OwnedMiscDevice<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: `misc` is registered (type invariant), and this is the only deregistration.
        // No file of the device is open: each holds a module reference, and the module is only
        // dropped once its reference count is zero.
        unsafe { bindings::misc_deregister(self.misc.get()) };
    }
}
