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
    ioctl::{
        _IOW,
        _IOWR, //
    },
    transmute::{
        AsBytes,
        FromBytes, //
    },
};

/// `GDIRECT_ABI_VERSION`.
pub(crate) const ABI_VERSION: u32 = 1;
/// `GDIRECT_IOC_MAGIC`.
pub(crate) const IOC_MAGIC: u32 = 0xD6;

/// `GDIRECT_PROVIDER_HOST`.
pub(crate) const PROVIDER_HOST: u32 = 0;
/// `GDIRECT_PROVIDER_NVIDIA`.
pub(crate) const PROVIDER_NVIDIA: u32 = 1;
/// `GDIRECT_PROVIDER_P2PDMA`.
pub(crate) const PROVIDER_P2PDMA: u32 = 2;
/// `GDIRECT_PROVIDER_COUNT`.
pub(crate) const PROVIDER_COUNT: u32 = 3;

/// `GDIRECT_REGISTER_PERSISTENT`.
pub(crate) const REGISTER_PERSISTENT: u32 = 1;
/// `GDIRECT_REGISTER_FLAGS`: every `REGISTER` flag.
pub(crate) const REGISTER_FLAGS: u32 = 1;

/// `GDIRECT_MAP_NOT_SUPPORTED`.
pub(crate) const MAP_NOT_SUPPORTED: u32 = 0;
/// `GDIRECT_MAP_BUS_ADDR`.
pub(crate) const MAP_BUS_ADDR: u32 = 1;
/// `GDIRECT_MAP_THRU_HOST_BRIDGE`.
pub(crate) const MAP_THRU_HOST_BRIDGE: u32 = 2;
/// `GDIRECT_MAP_HOST_MEMORY`.
pub(crate) const MAP_HOST_MEMORY: u32 = 3;

// The GDIRECT_PATH_* and GDIRECT_REASON_* values are in `path.rs`, which the userspace tests
// include and check against the header.

/// `GDIRECT_PATH_COUNT`.
pub(crate) const PATH_COUNT: u32 = 3;

/// `GDIRECT_REASON_COUNT`.
pub(crate) const REASON_COUNT: u32 = 8;
/// `GDIRECT_REASON_COUNT_V1`.
pub(crate) const REASON_COUNT_V1: u32 = 7;

/// `GDIRECT_TRANSPORT_UNKNOWN`.
pub(crate) const TRANSPORT_UNKNOWN: u32 = 0;
/// `GDIRECT_TRANSPORT_PCIE`.
pub(crate) const TRANSPORT_PCIE: u32 = 1;
/// `GDIRECT_TRANSPORT_RDMA`.
pub(crate) const TRANSPORT_RDMA: u32 = 2;
/// `GDIRECT_TRANSPORT_TCP`.
pub(crate) const TRANSPORT_TCP: u32 = 3;
/// `GDIRECT_TRANSPORT_LOOP`.
pub(crate) const TRANSPORT_LOOP: u32 = 4;
/// `GDIRECT_TRANSPORT_FC`.
pub(crate) const TRANSPORT_FC: u32 = 5;

/// `GDIRECT_IO_FORCE_BOUNCE`.
pub(crate) const IO_FORCE_BOUNCE: u32 = 1;
/// `GDIRECT_IO_FLAGS`.
pub(crate) const IO_FLAGS: u32 = 1;
/// `GDIRECT_RESULT_EOF`.
pub(crate) const RESULT_EOF: u32 = 1;

/// `GDIRECT_BATCH_MAX`.
pub(crate) const BATCH_MAX: u32 = 256;
/// `GDIRECT_OP_READ`.
pub(crate) const OP_READ: u32 = 0;
/// `GDIRECT_OP_WRITE`.
pub(crate) const OP_WRITE: u32 = 1;
/// `GDIRECT_REAP_WAIT`.
pub(crate) const REAP_WAIT: u32 = 1;
/// `GDIRECT_LATENCY_BUCKETS`.
pub(crate) const LATENCY_BUCKETS: u32 = 20;

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
    pub(crate) struct InfoArgs: gdirect_info_args, size 120 {
        flags @ 0: u32,
        pad @ 4: u32,
        abi_version @ 8: u32,
        providers @ 12: u32,
        version_major @ 16: u32,
        version_minor @ 20: u32,
        version_patch @ 24: u32,
        open_files @ 28: u32,
        file_registrations @ 32: u32,
        pad2 @ 36: u32,
        file_pinned_bytes @ 40: u64,
        registrations @ 48: u64,
        pinned_bytes @ 56: u64,
        revocations @ 64: u64,
        max_pinned_bytes @ 72: u64,
        max_registrations @ 80: u32,
        pad3 @ 84: u32,
        user_pinned_bytes @ 88: u64,
        max_pinned_bytes_per_user @ 96: u64,
        reserved @ 104: [u64; 2],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_REGISTER`.
    pub(crate) struct RegisterArgs: gdirect_register_args, size 64 {
        provider @ 0: u32,
        flags @ 4: u32,
        addr @ 8: u64,
        len @ 16: u64,
        handle @ 24: u64,
        page_size @ 32: u64,
        page_count @ 40: u64,
        reserved @ 48: [u64; 2],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_UNREGISTER`.
    pub(crate) struct UnregisterArgs: gdirect_unregister_args, size 16 {
        handle @ 0: u64,
        flags @ 8: u32,
        pad @ 12: u32,
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_QUERY`.
    pub(crate) struct QueryArgs: gdirect_query_args, size 80 {
        handle @ 0: u64,
        peer_domain @ 8: u32,
        peer_bdf @ 12: u32,
        first_page @ 16: u64,
        addrs @ 24: u64,
        max_entries @ 32: u32,
        flags @ 36: u32,
        map_type @ 40: u32,
        entries @ 44: u32,
        page_size @ 48: u64,
        page_count @ 56: u64,
        owner @ 64: u64,
        reserved @ 72: [u64; 1],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_READ` and `GDIRECT_IOC_WRITE`.
    pub(crate) struct IoArgs: gdirect_io_args, size 88 {
        handle @ 0: u64,
        buf_offset @ 8: u64,
        file_offset @ 16: u64,
        len @ 24: u64,
        fd @ 32: i32,
        flags @ 36: u32,
        bytes @ 40: u64,
        path @ 48: u32,
        reason @ 52: u32,
        result_flags @ 56: u32,
        transport @ 60: u32,
        bounce_bytes @ 64: u64,
        reserved @ 72: [u64; 2],
    }
}

uapi_struct! {
    /// One transfer of a batch.
    pub(crate) struct Sqe: gdirect_sqe, size 64 {
        op @ 0: u32,
        flags @ 4: u32,
        handle @ 8: u64,
        buf_offset @ 16: u64,
        file_offset @ 24: u64,
        len @ 32: u64,
        fd @ 40: i32,
        pad @ 44: u32,
        user_data @ 48: u64,
        reserved @ 56: u64,
    }
}

uapi_struct! {
    /// The completion of one transfer.
    pub(crate) struct Cqe: gdirect_cqe, size 40 {
        user_data @ 0: u64,
        result @ 8: i64,
        path @ 16: u32,
        reason @ 20: u32,
        result_flags @ 24: u32,
        transport @ 28: u32,
        bounce_bytes @ 32: u64,
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_SUBMIT`.
    pub(crate) struct SubmitArgs: gdirect_submit_args, size 40 {
        sqes @ 0: u64,
        count @ 8: u32,
        flags @ 12: u32,
        submitted @ 16: u32,
        in_flight @ 20: u32,
        reserved @ 24: [u64; 2],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_REAP`.
    pub(crate) struct ReapArgs: gdirect_reap_args, size 40 {
        cqes @ 0: u64,
        max @ 8: u32,
        flags @ 12: u32,
        reaped @ 16: u32,
        in_flight @ 20: u32,
        reserved @ 24: [u64; 2],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_SET_EVENTFD`.
    pub(crate) struct EventfdArgs: gdirect_eventfd_args, size 8 {
        fd @ 0: i32,
        flags @ 4: u32,
    }
}

uapi_struct! {
    /// The counters of one path and direction.
    pub(crate) struct IoStats: gdirect_io_stats, size 192 {
        ops @ 0: u64,
        bytes @ 8: u64,
        errors @ 16: u64,
        bounce_bytes @ 24: u64,
        latency_us_log2 @ 32: [u64; 20],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_GET_STATS`.
    pub(crate) struct StatsArgs: gdirect_stats_args, size 1224 {
        flags @ 0: u32,
        pad @ 4: u32,
        io @ 8: [[IoStats; 2]; 3],
        reasons @ 1160: [u64; 8],
    }
}

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_GET_STATS_V1`.
    pub(crate) struct StatsArgsV1: gdirect_stats_args_v1, size 1216 {
        flags @ 0: u32,
        pad @ 4: u32,
        io @ 8: [[IoStats; 2]; 3],
        reasons @ 1160: [u64; 7],
    }
}

// The first struct's reasons are the first `REASON_COUNT_V1` of the current one's.
kernel::static_assert!(
    core::mem::size_of::<StatsArgsV1>() + 8 * (REASON_COUNT - REASON_COUNT_V1) as usize
        == core::mem::size_of::<StatsArgs>()
);

uapi_struct! {
    /// Arguments of `GDIRECT_IOC_PEER_CHECK`.
    pub(crate) struct PeerArgs: gdirect_peer_args, size 32 {
        provider_domain @ 0: u32,
        provider_bdf @ 4: u32,
        client_domain @ 8: u32,
        client_bdf @ 12: u32,
        flags @ 16: u32,
        map_type @ 20: u32,
        distance @ 24: i32,
        reserved @ 28: u32,
    }
}

/// `GDIRECT_IOC_GET_INFO`.
pub(crate) const IOC_GET_INFO: u32 = _IOWR::<InfoArgs>(IOC_MAGIC, 0x00);
/// `GDIRECT_IOC_REGISTER`.
pub(crate) const IOC_REGISTER: u32 = _IOWR::<RegisterArgs>(IOC_MAGIC, 0x01);
/// `GDIRECT_IOC_UNREGISTER`.
pub(crate) const IOC_UNREGISTER: u32 = _IOW::<UnregisterArgs>(IOC_MAGIC, 0x02);
/// `GDIRECT_IOC_QUERY`.
pub(crate) const IOC_QUERY: u32 = _IOWR::<QueryArgs>(IOC_MAGIC, 0x03);
/// `GDIRECT_IOC_READ`.
pub(crate) const IOC_READ: u32 = _IOWR::<IoArgs>(IOC_MAGIC, 0x04);
/// `GDIRECT_IOC_WRITE`.
pub(crate) const IOC_WRITE: u32 = _IOWR::<IoArgs>(IOC_MAGIC, 0x05);
/// `GDIRECT_IOC_SUBMIT`.
pub(crate) const IOC_SUBMIT: u32 = _IOWR::<SubmitArgs>(IOC_MAGIC, 0x06);
/// `GDIRECT_IOC_REAP`.
pub(crate) const IOC_REAP: u32 = _IOWR::<ReapArgs>(IOC_MAGIC, 0x07);
/// `GDIRECT_IOC_SET_EVENTFD`.
pub(crate) const IOC_SET_EVENTFD: u32 = _IOW::<EventfdArgs>(IOC_MAGIC, 0x08);
/// `GDIRECT_IOC_GET_STATS`.
pub(crate) const IOC_GET_STATS: u32 = _IOWR::<StatsArgs>(IOC_MAGIC, 0x09);
/// `GDIRECT_IOC_GET_STATS_V1`.
pub(crate) const IOC_GET_STATS_V1: u32 = _IOWR::<StatsArgsV1>(IOC_MAGIC, 0x09);
/// `GDIRECT_IOC_PEER_CHECK`.
pub(crate) const IOC_PEER_CHECK: u32 = _IOWR::<PeerArgs>(IOC_MAGIC, 0x0a);
