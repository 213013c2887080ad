// SPDX-License-Identifier: GPL-2.0 OR MIT
//! gdirect: read file data straight into GPU memory.
//!
//! The library drives the gdirect kernel module through the ioctls of `/dev/gdirect`, defined
//! in `include/uapi/linux/gdirect.h`. It is layered as cudarc is:
//!
//! | layer | what | unsafe |
//! | --- | --- | --- |
//! | `sys` (private) | bindgen output of the uapi header, one ioctl wrapper per command | yes |
//! | [`Driver`] and friends | safe handles that return [`Result`] with a named [`Error`] | no |
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

mod driver;
mod error;
mod sys;

pub use driver::{Driver, Info, Provider, Version, ABI_VERSION, DEFAULT_DEVICE_PATH};
pub use error::{Errno, Error, Result};

/// The request codes and structs of the ABI, for test programs that must send malformed
/// requests on purpose. Applications use [`Driver`].
#[doc(hidden)]
pub mod raw {
    pub use crate::sys::{gdirect_info_args, GDIRECT_IOC_GET_INFO, GDIRECT_IOC_MAGIC};
}
