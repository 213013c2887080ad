// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The kernel's mirror of `include/uapi/linux/gdirect.h`.
//!
//! An out-of-tree module cannot add to `kernel::uapi`, so the header is mirrored here by hand,
//! one `uapi_struct!` per struct. The macro checks the size and the offset of every field at
//! compile time, and the userspace crate's build script reads the same declarations and checks
//! them against its bindgen output (`userspace/gdirect/build.rs`): if the header, this file and
//! the library disagree, a build fails.
//!
//! Keep the declarations in the macro's exact shape: one field a line, `name @ offset: type,`.

use kernel::{
    ioctl::_IOWR,
    transmute::{
        AsBytes,
        FromBytes, //
    },
};

/// `GDIRECT_ABI_VERSION`.
pub(crate) const ABI_VERSION: u32 = 1;
/// `GDIRECT_IOC_MAGIC`.
pub(crate) const IOC_MAGIC: u32 = 0xD6;

/// Declares a `#[repr(C)]` mirror of a uapi struct with compile-time layout checks.
macro_rules! uapi_struct {
    (
        $(#[$meta:meta])*
        pub(crate) struct $name:ident: $cname:ident, size $size:literal {
            $( $(#[$fmeta:meta])* $field:ident @ $offset:literal: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[doc = concat!("Mirror of `struct ", stringify!($cname), "`.")]
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        pub(crate) struct $name {
            $( $(#[$fmeta])* pub(crate) $field: $ty, )*
        }

        kernel::static_assert!(core::mem::size_of::<$name>() == $size);
        $( kernel::static_assert!(core::mem::offset_of!($name, $field) == $offset); )*
        // No implicit padding: the fields fill the struct exactly, so every byte is a field.
        kernel::static_assert!(0 $( + core::mem::size_of::<$ty>() )* == $size);

        // SAFETY: `$name` is `repr(C)`, has only integer fields and integer arrays, and no padding
        // (checked above), so every bit pattern is a valid value.
        unsafe impl FromBytes for $name {}
        // SAFETY: `$name` is `repr(C)` with only integer fields and no padding (checked above), so
        // all of its bytes are initialized.
        unsafe impl AsBytes for $name {}
    };
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_GET_INFO`.
    pub(crate) struct InfoArgs: gdirect_info_args, size 64 {
        flags @ 0: u32,
        pad @ 4: u32,
        abi_version @ 8: u32,
        providers @ 12: u32,
        version_major @ 16: u32,
        version_minor @ 20: u32,
        version_patch @ 24: u32,
        open_files @ 28: u32,
        reserved @ 32: [u64; 4],
    }
}

/// `GDIRECT_IOC_GET_INFO`.
pub(crate) const IOC_GET_INFO: u32 = _IOWR::<InfoArgs>(IOC_MAGIC, 0x00);
