// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The errnos gdirect returns that `kernel::error::code` does not name, by their meaning in
//! `include/uapi/linux/gdirect.h`.

use kernel::{
    bindings,
    prelude::*, //
};

fn errno(code: u32) -> Error {
    Error::from_errno(-(code as i32))
}

/// `EKEYREVOKED`: the provider took the memory back; the registration is revoked. Not
/// `ENOLINK`, which the block layer returns for transport errors of a transfer.
pub(crate) fn revoked() -> Error {
    errno(bindings::EKEYREVOKED)
}

/// `ESTALE`: the handle was unregistered already.
pub(crate) fn stale_handle() -> Error {
    errno(bindings::ESTALE)
}

/// `EDQUOT`: the registration would exceed `max_pinned_bytes`.
pub(crate) fn over_pin_limit() -> Error {
    errno(bindings::EDQUOT)
}

/// `EDQUOT`: the registration would exceed `max_pinned_bytes_per_user` for the caller's user.
pub(crate) fn over_user_pin_limit() -> Error {
    errno(bindings::EDQUOT)
}

/// `EDQUOT`: the user has `max_in_flight_per_user` batched transfers running already.
pub(crate) fn over_user_transfer_limit() -> Error {
    errno(bindings::EDQUOT)
}

/// `EPROTONOSUPPORT`: not a `GDIRECT_PROVIDER_*` value.
pub(crate) fn unknown_provider() -> Error {
    errno(bindings::EPROTONOSUPPORT)
}

/// `EOPNOTSUPP`: the provider's driver is not on this system now.
pub(crate) fn provider_unavailable() -> Error {
    errno(bindings::EOPNOTSUPP)
}

/// `EOPNOTSUPP` from a file system: what it does not do so (a write tried without waiting to a
/// file ext4 writes through the page cache).
pub(crate) fn fs_unsupported() -> Error {
    errno(bindings::EOPNOTSUPP)
}

/// `EBADFD`: the file is not open with `O_DIRECT`.
pub(crate) fn not_direct() -> Error {
    errno(bindings::EBADFD)
}

/// `EMEDIUMTYPE`: GPU memory that the GPU driver hands out without `struct page`s (BAR1 outside
/// NVIDIA's P2PDMA mode): no storage driver can DMA to it through the block layer.
pub(crate) fn no_struct_pages() -> Error {
    errno(bindings::EMEDIUMTYPE)
}

/// `EPROTO`: nvidia.ko returned a page table of an nv-p2p generation this module does not know
/// (a driver newer than it): nothing of the table past its version is read.
pub(crate) fn unknown_page_table() -> Error {
    errno(bindings::EPROTO)
}

/// `EUNATCH` (QUERY): no driver of this kernel drives the peer (none is bound, or a VFIO driver
/// hands its DMA to a userspace program), so no addresses are made for it.
pub(crate) fn peer_not_kernel_driven() -> Error {
    errno(bindings::EUNATCH)
}
