// SPDX-License-Identifier: GPL-2.0 OR MIT
//! [`Driver`]: an open handle to `/dev/gdirect`, and what the module says about itself.

use std::{
    fmt,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use nix::{fcntl::OFlag, sys::stat::Mode};

use crate::{
    error::{Errno, Error, Result},
    sys,
};

/// The device path, unless `GDIRECT_DEVICE` names another.
pub const DEFAULT_DEVICE_PATH: &str = "/dev/gdirect";

/// The ABI version this library speaks (`GDIRECT_ABI_VERSION` of the header it was built from).
pub const ABI_VERSION: u32 = sys::GDIRECT_ABI_VERSION;

/// Where registered device memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Provider {
    /// Ordinary user memory, pinned.
    Host,
    /// NVIDIA GPU memory through the nv-p2p kernel interface.
    Nvidia,
    /// Memory registered with PCI P2PDMA, through a user mapping.
    P2pdma,
}

impl Provider {
    /// Every provider the ABI defines.
    pub const ALL: [Provider; 3] = [Provider::Host, Provider::Nvidia, Provider::P2pdma];

    /// The provider's name, as the CLI and JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Host => "host",
            Provider::Nvidia => "nvidia",
            Provider::P2pdma => "p2pdma",
        }
    }

    /// The provider's `GDIRECT_PROVIDER_*` value.
    pub fn id(self) -> u32 {
        match self {
            Provider::Host => sys::GDIRECT_PROVIDER_HOST,
            Provider::Nvidia => sys::GDIRECT_PROVIDER_NVIDIA,
            Provider::P2pdma => sys::GDIRECT_PROVIDER_P2PDMA,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A module version, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What the module reports about itself (`GDIRECT_IOC_GET_INFO`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The module's ABI version.
    pub abi_version: u32,
    /// The module's version.
    pub version: Version,
    /// Mask of `1 << GDIRECT_PROVIDER_*` the module can use now.
    providers_mask: u32,
    /// Files open on the device, the caller's included.
    pub open_files: u32,
    /// Registrations held by this handle.
    pub file_registrations: u32,
    /// Bytes pinned by them.
    pub file_pinned_bytes: u64,
    /// Live registrations, all processes.
    pub registrations: u64,
    /// Bytes pinned by them.
    pub pinned_bytes: u64,
    /// Registrations revoked by their provider since the module was loaded.
    pub revocations: u64,
    /// The module's limit on pinned bytes, all registrations together.
    pub max_pinned_bytes: u64,
    /// The module's limit on registrations per open handle.
    pub max_registrations: u32,
    /// Bytes pinned by the registrations of the caller's user (real uid), all its processes.
    pub user_pinned_bytes: u64,
    /// The module's limit on them; 0 when only `max_pinned_bytes` applies.
    pub max_pinned_bytes_per_user: u64,
}

impl Info {
    /// Whether the module can use `provider` now (its backing driver is present).
    pub fn has_provider(&self, provider: Provider) -> bool {
        self.providers_mask & (1 << provider.id()) != 0
    }

    /// The providers the module can use now.
    pub fn providers(&self) -> impl Iterator<Item = Provider> + '_ {
        Provider::ALL.into_iter().filter(|p| self.has_provider(*p))
    }
}

/// An open handle to the gdirect module.
///
/// Opening performs the version handshake: a module with another ABI version is refused with
/// [`Error::VersionMismatch`] before anything else is asked of it.
///
/// ```no_run
/// let driver = gdirect::Driver::open()?;
/// let info = driver.info()?;
/// println!("gdirect {} (ABI {})", info.version, info.abi_version);
/// # Ok::<(), gdirect::Error>(())
/// ```
#[derive(Debug)]
pub struct Driver {
    fd: OwnedFd,
    path: PathBuf,
    /// The files that batched writes submitted through this handle may still be writing.
    pub(crate) batch_writes: std::sync::Mutex<BatchWrites>,
}

/// The files (device, inode) that batched writes submitted through a [`Driver`] may still be
/// writing, each with the number of the last submit that named it: counted again at each reap
/// until a reap finds none in flight (see `compat::note_write`; a handle closed with writes in
/// flight leaves them to the files' times).
#[derive(Debug, Default)]
pub(crate) struct BatchWrites {
    /// Submits of writes so far.
    pub(crate) submits: u64,
    pub(crate) files: Vec<((u64, u64), u64)>,
}

impl Driver {
    /// Opens the device at `GDIRECT_DEVICE`, or `/dev/gdirect`.
    pub fn open() -> Result<Self> {
        let path = std::env::var_os("GDIRECT_DEVICE")
            .map_or_else(|| PathBuf::from(DEFAULT_DEVICE_PATH), PathBuf::from);
        Self::open_path(path)
    }

    /// Opens the device at `path` and checks its ABI version.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let fd = nix::fcntl::open(&path, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty()).map_err(
            |errno| match errno {
                Errno::ENOENT => Error::ModuleNotLoaded {
                    path: path.clone(),
                    reason: "does not exist",
                },
                Errno::ENODEV | Errno::ENXIO => Error::ModuleNotLoaded {
                    path: path.clone(),
                    reason: "has no driver behind it",
                },
                Errno::EACCES | Errno::EPERM => Error::PermissionDenied { path: path.clone() },
                errno => Error::Open {
                    path: path.clone(),
                    errno,
                },
            },
        )?;
        let driver = Self {
            fd,
            path,
            batch_writes: std::sync::Mutex::new(BatchWrites::default()),
        };
        let info = driver.info().map_err(|e| match e {
            // Any other driver answers an unknown ioctl with ENOTTY.
            Error::Ioctl {
                errno: Errno::ENOTTY,
                path,
                ..
            } => Error::NotGdirect {
                path,
                errno: Errno::ENOTTY,
            },
            e => e,
        })?;
        if info.abi_version != ABI_VERSION {
            return Err(Error::VersionMismatch {
                path: driver.path,
                module: info.abi_version,
                library: ABI_VERSION,
            });
        }
        Ok(driver)
    }

    /// The device path this handle was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks the module what it is and what it can do (`GDIRECT_IOC_GET_INFO`).
    pub fn info(&self) -> Result<Info> {
        let mut args = sys::gdirect_info_args::default();
        // SAFETY: `args` is a valid, writable `gdirect_info_args` for the duration of the call,
        // and the module keeps no pointer to it.
        unsafe { sys::get_info(self.fd.as_raw_fd(), &mut args) }
            .map_err(|errno| self.ioctl_error("GDIRECT_IOC_GET_INFO", errno))?;
        Ok(Info {
            abi_version: args.abi_version,
            version: Version {
                major: args.version_major,
                minor: args.version_minor,
                patch: args.version_patch,
            },
            providers_mask: args.providers,
            open_files: args.open_files,
            file_registrations: args.file_registrations,
            file_pinned_bytes: args.file_pinned_bytes,
            registrations: args.registrations,
            pinned_bytes: args.pinned_bytes,
            revocations: args.revocations,
            max_pinned_bytes: args.max_pinned_bytes,
            max_registrations: args.max_registrations,
            user_pinned_bytes: args.user_pinned_bytes,
            max_pinned_bytes_per_user: args.max_pinned_bytes_per_user,
        })
    }

    pub(crate) fn ioctl_error(&self, ioctl: &'static str, errno: Errno) -> Error {
        match errno {
            Errno::EXDEV => self.other_process(),
            errno => Error::Ioctl {
                ioctl,
                path: self.path.clone(),
                errno,
            },
        }
    }

    /// The module's answer to a command from another address space than the opener's.
    pub(crate) fn other_process(&self) -> Error {
        Error::OtherProcess {
            path: self.path.clone(),
        }
    }
}

impl AsRawFd for Driver {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_is_module_not_loaded() {
        let err = Driver::open_path("/nonexistent/gdirect").unwrap_err();
        assert!(matches!(err, Error::ModuleNotLoaded { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/gdirect") && text.contains("modprobe gdirect"),
            "{text}"
        );
    }

    #[test]
    fn other_device_is_not_gdirect() {
        // /dev/null answers every ioctl with ENOTTY.
        let err = Driver::open_path("/dev/null").unwrap_err();
        match err {
            Error::NotGdirect { errno, ref path } => {
                assert_eq!(errno, Errno::ENOTTY);
                assert_eq!(path, Path::new("/dev/null"));
                assert!(err.to_string().contains("ENOTTY"), "{err}");
            }
            other => panic!("expected NotGdirect, got {other:?}"),
        }
    }

    #[test]
    fn other_device_is_why_the_compat_engine_reads() {
        // What `gdirect --device /dev/null read --gpu` reports (tests/gpu/cli.sh): the node is
        // no gdirect device, not a missing module.
        let err = Driver::open_path("/dev/null").unwrap_err();
        let why = crate::CompatReason::from_error(&err);
        assert_eq!(why.name(), "incompatible");
        assert!(why.cause().contains("ABI") && !why.cause().contains("not loaded"));
    }

    #[test]
    fn provider_bits_follow_the_header() {
        let info = Info {
            abi_version: ABI_VERSION,
            version: Version {
                major: 0,
                minor: 1,
                patch: 0,
            },
            providers_mask: 1 << sys::GDIRECT_PROVIDER_P2PDMA,
            open_files: 1,
            file_registrations: 0,
            file_pinned_bytes: 0,
            registrations: 0,
            pinned_bytes: 0,
            revocations: 0,
            max_pinned_bytes: 0,
            max_registrations: 0,
            user_pinned_bytes: 0,
            max_pinned_bytes_per_user: 0,
        };
        assert_eq!(info.providers().collect::<Vec<_>>(), vec![Provider::P2pdma]);
        assert!(!info.has_provider(Provider::Host));
        assert_eq!(Provider::ALL.len() as u32, sys::GDIRECT_PROVIDER_COUNT);
    }
}
