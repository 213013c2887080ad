// SPDX-License-Identifier: GPL-2.0 OR MIT
//! gdirect: read file data straight into GPU memory.
//!
//! The library drives the gdirect kernel module through the ioctls of `/dev/gdirect`, defined
//! in `include/uapi/linux/gdirect.h`. It is layered as cudarc is:
//!
//! | layer | what | unsafe |
//! | --- | --- | --- |
//! | `sys` (private) | bindgen output of the uapi header (committed), one ioctl wrapper per command | yes |
//! | [`Driver`] and friends | safe handles that return [`Result`] with a named [`Error`] | no |
//!
//! Without the module, [`compat`] reads files into host or (feature `cuda`) GPU memory itself,
//! and `gpu::GpuReader` picks the module or the compat engine for CUDA memory, saying which
//! and why in every [`Transfer`].
//!
//! Features: `cuda` (cudarc device memory, `gpu`; `cuda-13000` with cudarc's CUDA 13.0
//! bindings) and `serde`. The `gdirect` command's and the test rig's own parts (the model
//! behind `gdirect check`, the checksums reads are verified with, the rig's emulated GPU) live
//! in an unpublished crate of the repository, `gdirect-internals`.
//!
//! # Quick start
//!
//! ```no_run
//! use gdirect::{Driver, Provider};
//!
//! // 1. Open the device; this checks that module and library speak the same ABI.
//! let driver = Driver::open()?;
//! // 2. Ask what the module can do.
//! let info = driver.info()?;
//! println!("module {} (ABI {})", info.version, info.abi_version);
//! for provider in Provider::ALL {
//!     println!("{provider}: {}", if info.has_provider(provider) { "available" } else { "not available" });
//! }
//! # Ok::<(), gdirect::Error>(())
//! ```

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod cache;
pub mod compat;
mod driver;
mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
mod io;
mod memory;
mod pci;
mod registration;
#[cfg(feature = "serde")]
mod ser;
mod sys;
mod sysfs;

/// The kernel's path decision, tested here (see `sys::path_decision`), in the repository (a
/// packaged crate has no `kernel/`: the build script's `gdirect_mirror`).
#[cfg(all(test, gdirect_mirror))]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "shared with the kernel, which uses all of it"
)]
#[path = "../../../kernel/path.rs"]
mod kernel_path;

pub use cache::{DirectCache, Routed};
pub use driver::{Driver, Info, Provider, Version, ABI_VERSION, DEFAULT_DEVICE_PATH};
pub use error::{CudaError, Errno, Error, ErrorKind, Result};
pub use io::{
    Batch, CompatReason, Completion, Engine, File, IoOptions, IoPath, PathStats, Reason, Stats,
    Transfer, Transport, BATCH_MAX,
};
pub use memory::{DeviceMemory, HostBuffer, P2pMem};
pub use pci::{ParsePciAddressError, PciAddress};
pub use registration::{MapType, PeerMap, PeerVerdict, RegisterOptions, Registration};

/// The request codes and structs of the ABI, for test programs that must send malformed
/// requests on purpose. Applications use [`Driver`].
#[doc(hidden)]
pub mod raw {
    pub use crate::sys::{
        gdirect_cqe, gdirect_info_args, gdirect_io_args, gdirect_peer_args, gdirect_query_args,
        gdirect_reap_args, gdirect_register_args, gdirect_sqe, gdirect_stats_args,
        gdirect_stats_args_v1, gdirect_submit_args, gdirect_unregister_args, GDIRECT_IOC_GET_INFO,
        GDIRECT_IOC_GET_STATS, GDIRECT_IOC_GET_STATS_V1, GDIRECT_IOC_MAGIC, GDIRECT_IOC_PEER_CHECK,
        GDIRECT_IOC_QUERY, GDIRECT_IOC_READ, GDIRECT_IOC_REAP, GDIRECT_IOC_REGISTER,
        GDIRECT_IOC_SET_EVENTFD, GDIRECT_IOC_SUBMIT, GDIRECT_IOC_UNREGISTER, GDIRECT_IOC_WRITE,
        GDIRECT_OP_READ, GDIRECT_REAP_WAIT, GDIRECT_REGISTER_PERSISTENT,
    };
}

#[cfg(test)]
mod shareable {
    /// Compiles only for types that threads can share (behind an `Arc`) and send.
    fn shareable<T: Send + Sync>() {}

    #[test]
    fn the_handles_can_be_shared_between_threads() {
        shareable::<crate::Driver>();
        shareable::<crate::File>();
        shareable::<crate::Registration<'static>>();
        shareable::<crate::compat::CompatEngine<crate::compat::HostBackend>>();
        shareable::<crate::compat::Source>();
        #[cfg(feature = "cuda")]
        {
            shareable::<crate::compat::CompatEngine<crate::compat::CudaBackend>>();
            shareable::<crate::gpu::GpuReader>();
            shareable::<crate::gpu::GpuFile>();
            shareable::<crate::gpu::RawGpuMemory>();
            shareable::<crate::gpu::PendingRead<cudarc::driver::CudaSlice<f32>>>();
            // A registered buffer moves to another thread with the read it is for.
            fn sendable<T: Send>() {}
            sendable::<crate::gpu::GpuBuffer<'static, cudarc::driver::CudaSlice<u8>>>();
        }
    }
}
