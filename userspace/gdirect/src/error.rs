// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The library's one error type: a variant for each meaning, with the context a user needs.

use std::path::PathBuf;

pub use nix::errno::Errno;

/// Everything that can go wrong talking to the gdirect module.
///
/// `Display` says what happened and, where there is one, what to do about it; errno values
/// print with their names (`EINVAL: Invalid argument`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device node does not exist or has no driver behind it.
    #[error(
        "the gdirect kernel module is not loaded: {path} {reason}. Load it with \
         `sudo insmod gdirect.ko` (built by `make` in the gdirect source tree)"
    )]
    ModuleNotLoaded {
        /// The device path that was tried.
        path: PathBuf,
        /// What open(2) said, in words.
        reason: &'static str,
    },

    /// The caller may not open the device.
    #[error(
        "permission denied opening {path}: the device is mode 0660; run as root or as a \
         member of the device's group"
    )]
    PermissionDenied {
        /// The device path.
        path: PathBuf,
    },

    /// Opening the device failed for another reason.
    #[error("cannot open {path}: {errno}")]
    Open {
        /// The device path.
        path: PathBuf,
        /// The error of open(2).
        errno: Errno,
    },

    /// The file opened is not a gdirect device (it does not know `GET_INFO`).
    #[error("{path} is not a gdirect device: GDIRECT_IOC_GET_INFO failed with {errno}")]
    NotGdirect {
        /// The path opened.
        path: PathBuf,
        /// The error of the ioctl (`ENOTTY` for a device of another driver).
        errno: Errno,
    },

    /// The module speaks another version of the ABI than this library.
    #[error(
        "gdirect ABI mismatch: the module at {path} speaks ABI version {module}, this library \
         version {library}; load a module and a library built from the same release"
    )]
    VersionMismatch {
        /// The device path.
        path: PathBuf,
        /// `GDIRECT_ABI_VERSION` of the module.
        module: u32,
        /// `GDIRECT_ABI_VERSION` this library was built with.
        library: u32,
    },

    /// An ioctl failed.
    #[error("{ioctl} on {path} failed: {errno}")]
    Ioctl {
        /// The name of the command, as in the header (`GDIRECT_IOC_GET_INFO`).
        ioctl: &'static str,
        /// The device path.
        path: PathBuf,
        /// The errno the module returned; its meaning is documented in the header.
        errno: Errno,
    },
}

impl Error {
    /// The errno behind the error, where there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Open { errno, .. }
            | Self::NotGdirect { errno, .. }
            | Self::Ioctl { errno, .. } => Some(*errno),
            Self::PermissionDenied { .. } => Some(Errno::EACCES),
            Self::ModuleNotLoaded { .. } | Self::VersionMismatch { .. } => None,
        }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
