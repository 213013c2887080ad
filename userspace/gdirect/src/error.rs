// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The library's one error type: a variant for each meaning, with the context a user needs.

use std::path::PathBuf;

pub use nix::errno::Errno;

use crate::Provider;

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

    /// A device node the operation needs is missing.
    #[error("{path} does not exist: {what} is not loaded")]
    DeviceMissing {
        /// The device path.
        path: PathBuf,
        /// What provides it.
        what: &'static str,
    },

    /// Memory could not be allocated.
    #[error("cannot allocate {what}: {errno}")]
    Allocation {
        /// What was asked for.
        what: String,
        /// The error.
        errno: Errno,
    },

    /// The address or length is not a multiple of the provider's alignment.
    #[error(
        "cannot register {len} bytes at {addr:#x} with the {provider} provider: address and \
         length must be multiples of its alignment (4 KiB for host and p2pdma, 64 KiB for nvidia)"
    )]
    Misaligned {
        /// The provider asked for.
        provider: Provider,
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
    },

    /// The range is not (entirely) memory of the provider.
    #[error("{len} bytes at {addr:#x} are not {provider} memory (unmapped, of another kind, or spanning devices)")]
    NotProviderMemory {
        /// The provider asked for.
        provider: Provider,
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
    },

    /// The GPU driver hands out this memory without `struct page`s (BAR1 outside NVIDIA's
    /// P2PDMA mode): no storage driver can DMA to it through the block layer. The compat engine
    /// still reads into it.
    #[error(
        "{len} bytes of GPU memory at {addr:#x} have no struct pages (the GPU driver is not in its \
         P2PDMA mode; see the README, \"On a real GPU node\"): no direct transfers into it"
    )]
    NoStructPages {
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
    },

    /// The module's pinned-bytes limit would be exceeded.
    #[error(
        "registering {len} more bytes would exceed the module's max_pinned_bytes limit (see \
         `gdirect info`; set it when loading: insmod gdirect.ko max_pinned_bytes=N)"
    )]
    PinLimit {
        /// The length asked for.
        len: u64,
    },

    /// The module's pinned-bytes limit for the caller's user would be exceeded.
    #[error(
        "registering {len} more bytes would exceed the module's max_pinned_bytes_per_user limit \
         of {limit} bytes: this user (real uid, all its processes) has {pinned} pinned (see \
         `gdirect info`; an administrator sets it: insmod gdirect.ko max_pinned_bytes_per_user=N)"
    )]
    UserPinLimit {
        /// The length asked for.
        len: u64,
        /// The bytes the user had pinned.
        pinned: u64,
        /// The limit.
        limit: u64,
    },

    /// The file holds the most registrations the module allows.
    #[error("this handle holds max_registrations registrations already (module parameter)")]
    TooManyRegistrations,

    /// The provider's driver is not on this system now.
    #[error("the {provider} provider is not available (its driver is not loaded)")]
    ProviderUnavailable {
        /// The provider asked for.
        provider: Provider,
    },

    /// The provider took the memory back (for example `cudaFree` of registered GPU memory).
    #[error("registration {handle:#x} was revoked: its provider took the memory back")]
    Revoked {
        /// The registration's handle.
        handle: u64,
    },

    /// No PCI device at the peer address.
    #[error("no PCI device at {peer}")]
    NoSuchPeer {
        /// The address given.
        peer: crate::PciAddress,
    },

    /// No driver of this kernel drives the peer (none is bound, or a VFIO driver hands its DMA
    /// to a userspace program): the module makes no addresses for it.
    #[error("{peer} is not driven by a driver of this kernel (no driver bound, or vfio): no addresses are made for it")]
    PeerNotKernelDriven {
        /// The address given.
        peer: crate::PciAddress,
    },

    /// Peer addresses were asked for without `CAP_SYS_ADMIN`; the map type needs no privilege
    /// ([`crate::Registration::map_type`]).
    #[error(
        "the addresses of registered memory for {peer} need CAP_SYS_ADMIN (the map type does not)"
    )]
    AddressesNeedAdmin {
        /// The peer asked about.
        peer: crate::PciAddress,
    },

    /// A file could not be opened for transfers.
    #[error("cannot open {path} with O_DIRECT: {errno}")]
    OpenFile {
        /// The file.
        path: PathBuf,
        /// The error of open(2).
        errno: Errno,
    },

    /// The file is not open with `O_DIRECT` (`File::open_direct` opens it so).
    #[error("{path} is not open with O_DIRECT: gdirect transfers only do direct I/O")]
    NotDirect {
        /// The file.
        path: PathBuf,
    },

    /// The file is not open for the transfer's direction, or not an open file.
    #[error("{path} is not open for this transfer (read needs reading, write needs writing)")]
    BadFile {
        /// The file.
        path: PathBuf,
    },

    /// Offsets or length are not multiples of the file's logical block size.
    #[error("transfer on {path}: file offset, buffer offset and length must be multiples of its logical block size")]
    IoMisaligned {
        /// The file.
        path: PathBuf,
    },

    /// The buffer range is past the end of the registration.
    #[error("registration {handle:#x} is shorter than buf_offset + len")]
    OutOfRegistration {
        /// The registration's handle.
        handle: u64,
    },

    /// The file is not on a block device.
    #[error("{path} is not on a block device: there is no direct I/O to route")]
    NotBlockBacked {
        /// The file.
        path: PathBuf,
    },

    /// The file's block device went away during the transfer (hot removal, an NVMe-oF
    /// controller deleted).
    #[error("the block device of {path} went away during the transfer")]
    DeviceGone {
        /// The file.
        path: PathBuf,
    },

    /// A transfer failed in the storage stack.
    #[error("{ioctl} of {path} through {driver} failed: {errno}")]
    Io {
        /// The command.
        ioctl: &'static str,
        /// The file.
        path: PathBuf,
        /// The error the file's read_iter/write_iter returned.
        errno: Errno,
        /// The device path.
        driver: PathBuf,
    },

    /// An entry of a batch was refused.
    #[error("batch entry {index} was refused: {errno} (entries before it were submitted)")]
    Submit {
        /// The index of the refused entry in the batch.
        index: usize,
        /// Its errno (see the uapi header).
        errno: Errno,
    },

    /// Reading a file failed (the compat engine's own I/O).
    #[error("reading {path} at offset {offset} failed: {errno}")]
    FileIo {
        /// The file.
        path: PathBuf,
        /// The file offset of the failed read.
        offset: u64,
        /// The error of the read.
        errno: Errno,
    },

    /// A destination range is past the end of the memory.
    #[error("{len} bytes at offset {offset} do not fit in {size} bytes of memory")]
    OutOfMemoryRange {
        /// The offset in the memory.
        offset: u64,
        /// The length asked for.
        len: u64,
        /// The memory's size.
        size: u64,
    },

    /// A setting (builder or environment variable) has a value that cannot be used.
    #[error("setting {name}={value} is not valid: expected {expected}")]
    BadSetting {
        /// The setting or environment variable.
        name: &'static str,
        /// The value given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },

    /// A CUDA driver call failed.
    #[error("CUDA {what} failed: {error}")]
    Cuda {
        /// What was being done.
        what: &'static str,
        /// The driver's error, by name.
        error: String,
    },

    /// A worker thread of the compat engine died.
    #[error("{what}")]
    Worker {
        /// What happened.
        what: &'static str,
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
            | Self::Ioctl { errno, .. }
            | Self::Allocation { errno, .. }
            | Self::OpenFile { errno, .. }
            | Self::Io { errno, .. }
            | Self::FileIo { errno, .. }
            | Self::Submit { errno, .. } => Some(*errno),
            Self::OutOfMemoryRange { .. } => Some(Errno::EOVERFLOW),
            Self::BadSetting { .. } => Some(Errno::EINVAL),
            Self::Cuda { .. } | Self::Worker { .. } => None,
            Self::NotDirect { .. } => Some(Errno::EBADFD),
            Self::BadFile { .. } => Some(Errno::EBADF),
            Self::IoMisaligned { .. } => Some(Errno::ERANGE),
            Self::OutOfRegistration { .. } => Some(Errno::EOVERFLOW),
            Self::NotBlockBacked { .. } => Some(Errno::ENOTBLK),
            Self::DeviceGone { .. } => Some(Errno::ENODEV),
            Self::PermissionDenied { .. } => Some(Errno::EACCES),
            Self::Misaligned { .. } => Some(Errno::ERANGE),
            Self::NotProviderMemory { .. } => Some(Errno::ENXIO),
            Self::NoStructPages { .. } => Some(Errno::EMEDIUMTYPE),
            Self::PinLimit { .. } | Self::UserPinLimit { .. } => Some(Errno::EDQUOT),
            Self::TooManyRegistrations => Some(Errno::EMFILE),
            Self::ProviderUnavailable { .. } => Some(Errno::EOPNOTSUPP),
            Self::Revoked { .. } => Some(Errno::EKEYREVOKED),
            Self::NoSuchPeer { .. } => Some(Errno::ENODEV),
            Self::PeerNotKernelDriven { .. } => Some(Errno::EUNATCH),
            Self::AddressesNeedAdmin { .. } => Some(Errno::EACCES),
            Self::ModuleNotLoaded { .. }
            | Self::VersionMismatch { .. }
            | Self::DeviceMissing { .. } => None,
        }
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
