// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The path decision: does a transfer go peer to peer, through host memory, or straight to host
//! memory, and why.
//!
//! Pure logic over facts gathered elsewhere (`io.rs`), with no kernel types, so that the
//! userspace crate's tests exercise every case, including those this machine's hardware cannot
//! show (a P2P-capable fabric queue): `userspace/gdirect/tests/path_decision.rs` includes this
//! file. Values are the `GDIRECT_PATH_*` and `GDIRECT_REASON_*` of the uapi header.

/// `GDIRECT_PATH_P2P`.
pub(crate) const PATH_P2P: u32 = 0;
/// `GDIRECT_PATH_BOUNCE`.
pub(crate) const PATH_BOUNCE: u32 = 1;
/// `GDIRECT_PATH_HOST`.
pub(crate) const PATH_HOST: u32 = 2;

/// `GDIRECT_REASON_NONE`.
pub(crate) const REASON_NONE: u32 = 0;
/// `GDIRECT_REASON_FORCED`.
pub(crate) const REASON_FORCED: u32 = 1;
/// `GDIRECT_REASON_QUEUE_NO_P2P`.
pub(crate) const REASON_QUEUE_NO_P2P: u32 = 2;
/// `GDIRECT_REASON_DISTANCE`.
pub(crate) const REASON_DISTANCE: u32 = 3;
/// `GDIRECT_REASON_NO_PAGES`.
pub(crate) const REASON_NO_PAGES: u32 = 4;
/// `GDIRECT_REASON_MULTIPATH`.
pub(crate) const REASON_MULTIPATH: u32 = 5;
/// `GDIRECT_REASON_DATA_DEVICE`.
pub(crate) const REASON_DATA_DEVICE: u32 = 6;
/// `GDIRECT_REASON_NO_DIRECT_IO`.
pub(crate) const REASON_NO_DIRECT_IO: u32 = 7;

/// What the registered memory is, as far as the decision goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memory {
    /// System memory: DMA goes to it directly, no peer-to-peer question.
    Host,
    /// Device memory whose pages the block layer can carry (P2PDMA `struct page`s).
    DevicePages,
    /// Device memory without such pages (a GPU BAR not registered with P2PDMA).
    DeviceNoPages,
}

/// How the storage's DMA device reaches the memory (`topology::MapType`, or none found).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// No PCI DMA device was found for the storage: NVMe-oF whose RDMA adapter could not be
    /// identified (`fabric.rs`: an IPv6 address, say). Its driver checks the reach when it maps
    /// the pages, and fails the I/O rather than corrupt it.
    Unknown,
    /// Peer to peer is not possible on this path.
    NotSupported,
    /// Peer to peer, below a shared switch or through an allowed host bridge.
    Supported,
}

/// The facts a decision is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    /// `GDIRECT_IO_FORCE_BOUNCE` was given.
    pub(crate) force_bounce: bool,
    /// The memory.
    pub(crate) memory: Memory,
    /// The file's data is not on the block device the other facts are about (an XFS realtime
    /// file is on the realtime device, which the module cannot find).
    pub(crate) data_elsewhere: bool,
    /// The file system does no direct I/O for the file (its `STATX_DIOALIGN` alignment is 0),
    /// or for this request (off that alignment): its direct I/O goes through the page cache,
    /// and the CPU would copy between it and the memory.
    pub(crate) no_direct_io: bool,
    /// The file's block queue has `BLK_FEAT_PCI_P2PDMA`.
    pub(crate) queue_p2p: bool,
    /// The file's queue is an NVMe multipath head's, and at least one of its paths' queues has
    /// `BLK_FEAT_PCI_P2PDMA` (the head has it only when all do).
    pub(crate) path_p2p: bool,
    /// How the storage's DMA device reaches the memory.
    pub(crate) reach: Reach,
}

/// The path and the reason for it: `(GDIRECT_PATH_*, GDIRECT_REASON_*)`.
///
/// P2P only when the queue accepts P2P pages, the memory has them and the storage's DMA device
/// reaches the memory (or, for a queue with no PCI device below it, its driver will check the
/// reach when it maps the pages and fail rather than corrupt); the first missing condition is
/// the reason for the bounce. A file whose data is on a device the facts are not about bounces
/// (nothing is known of that device's queue or reach), and so does a file its file system does
/// no direct I/O for (peer to peer, the CPU would copy the page cache into the memory, unseen). A multipath head that refuses P2P pages although one of its paths
/// would take them bounces for the reason `multipath`: the head, not the hardware, is in the way.
pub(crate) fn decide(f: Facts) -> (u32, u32) {
    if f.force_bounce {
        return (PATH_BOUNCE, REASON_FORCED);
    }
    match f.memory {
        Memory::Host => return (PATH_HOST, REASON_NONE),
        Memory::DeviceNoPages => return (PATH_BOUNCE, REASON_NO_PAGES),
        Memory::DevicePages => {}
    }
    if f.data_elsewhere {
        return (PATH_BOUNCE, REASON_DATA_DEVICE);
    }
    if f.no_direct_io {
        return (PATH_BOUNCE, REASON_NO_DIRECT_IO);
    }
    if !f.queue_p2p {
        return match f.path_p2p {
            true => (PATH_BOUNCE, REASON_MULTIPATH),
            false => (PATH_BOUNCE, REASON_QUEUE_NO_P2P),
        };
    }
    match f.reach {
        Reach::Supported | Reach::Unknown => (PATH_P2P, REASON_NONE),
        Reach::NotSupported => (PATH_BOUNCE, REASON_DISTANCE),
    }
}
