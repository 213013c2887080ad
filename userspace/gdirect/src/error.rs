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
         `sudo modprobe gdirect` once installed (README: Installing on a GPU node); \
         `gdirect check` says whether this node can"
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
        #[source]
        errno: Errno,
    },

    /// The file opened is not a gdirect device (it does not know `GET_INFO`).
    #[error("{path} is not a gdirect device: GDIRECT_IOC_GET_INFO failed with {errno}")]
    NotGdirect {
        /// The path opened.
        path: PathBuf,
        /// The error of the ioctl (`ENOTTY` for a device of another driver).
        #[source]
        errno: Errno,
    },

    /// The device file was opened by another process (another address space): the module takes
    /// a file's commands only from the address space that opened it (`EXDEV`).
    #[error(
        "{path} was opened by another process: a gdirect device file serves only the address \
         space that opened it, not a child after fork, a program after exec or a process it was \
         passed to; open the device in this process"
    )]
    OtherProcess {
        /// The device path.
        path: PathBuf,
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
        #[source]
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

    /// GPU memory from a stream-ordered pool (`cuMemAllocAsync`, what cudarc allocates wherever
    /// the device has pools): freeing it hands it back to the pool, not to the driver, so the
    /// NVIDIA driver never revokes a registration of it and a transfer still queued could write
    /// into the pool's next allocation. [`Driver::register`](crate::Driver::register) refuses
    /// it; allocate with [`DeviceBuffer`](crate::gpu::DeviceBuffer) (`cuMemAlloc`).
    #[error(
        "GPU memory at {addr:#x} comes from a stream-ordered pool (cuMemAllocAsync, cudarc's \
         allocation): its free returns it to the pool without revoking a registration, so the \
         module does not register it; allocate with cuMemAlloc (gdirect::gpu::DeviceBuffer)"
    )]
    PoolMemory {
        /// The address given.
        addr: u64,
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

    /// nvidia.ko returned a page table of an nv-p2p generation the module does not know (a
    /// driver newer than the module): the module reads page table versions 1.2 (drivers before
    /// 580.65.06) and 2.x (580.65.06 through 595). The kernel log names the version.
    #[error(
        "the NVIDIA driver's nv-p2p page table for {len} bytes at {addr:#x} is of a version this \
         gdirect module does not know (see the kernel log, and `gdirect check` for the driver's \
         version): install a gdirect that supports this driver"
    )]
    UnknownPageTable {
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
    },

    /// The module's pinned-bytes limit would be exceeded.
    #[error(
        "registering {len} more bytes would exceed the module's max_pinned_bytes limit (see \
         `gdirect info`; set it when loading: `options gdirect max_pinned_bytes=N` in \
         /etc/modprobe.d/gdirect.conf)"
    )]
    PinLimit {
        /// The length asked for.
        len: u64,
    },

    /// The module's pinned-bytes limit for the caller's user would be exceeded.
    #[error(
        "registering {len} more bytes would exceed the module's max_pinned_bytes_per_user limit \
         of {limit} bytes, of the user that opened the device (real uid, all its processes: \
         {pinned} pinned) or of a user whose user namespace it runs in (a container's uids \
         share the limit of the user that made it) (see `gdirect info`; an administrator sets \
         it: `options gdirect max_pinned_bytes_per_user=N` in /etc/modprobe.d/gdirect.conf)"
    )]
    UserPinLimit {
        /// The length asked for.
        len: u64,
        /// The bytes the user had pinned.
        pinned: u64,
        /// The limit.
        limit: u64,
    },

    /// The user has the most batched transfers running that the module allows one user.
    #[error(
        "no transfer of this batch was queued: the user that opened {path} has \
         max_in_flight_per_user batched transfers queued or running already, over all its \
         files and processes (or a user whose user namespace it runs in has); reap completions \
         or wait for them, or an administrator raises the limit: `options gdirect \
         max_in_flight_per_user=N` in /etc/modprobe.d/gdirect.conf"
    )]
    UserTransferLimit {
        /// The device path.
        path: PathBuf,
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

    /// A persistent registration needs CAP_SYS_ADMIN: it is never revoked, and holds GPU
    /// memory past `cudaFree`.
    #[error(
        "a persistent registration of {len} bytes at {addr:#x} needs CAP_SYS_ADMIN (it is never \
         revoked, and holds GPU memory past cudaFree); register without persistent"
    )]
    PersistentNeedsAdmin {
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
    },

    /// A file could not be opened for transfers.
    #[error("cannot open {path} with O_DIRECT: {errno}")]
    OpenFile {
        /// The file.
        path: PathBuf,
        /// The error of open(2).
        #[source]
        errno: Errno,
    },

    /// The file is not open with `O_DIRECT` (`File::open_direct` opens it so).
    #[error("{path} is not open with O_DIRECT: gdirect transfers only do direct I/O")]
    NotDirect {
        /// The file.
        path: PathBuf,
    },

    /// Neither a regular file nor a block device: no positional reads or writes.
    #[error(
        "{path} is {what}: gdirect reads and writes regular files and block devices, by offset"
    )]
    NotSeekable {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },

    /// The file is not open for the transfer's direction, or not an open file.
    #[error("{path} is not open for this transfer (read needs reading, write needs writing)")]
    BadFile {
        /// The file.
        path: PathBuf,
    },

    /// Offsets or length are not multiples of the file's logical block size.
    #[error(
        "transfer of {len} bytes at file offset {file_offset} (buffer offset {buf_offset}) on \
         {path}: file offset, buffer offset and length must be multiples of its logical block \
         size (512 bytes or more; `blockdev --getss`)"
    )]
    IoMisaligned {
        /// The file.
        path: PathBuf,
        /// The file offset given.
        file_offset: u64,
        /// The offset in the registration given.
        buf_offset: u64,
        /// The length given.
        len: u64,
    },

    /// The buffer range is past the end of the registration.
    #[error("{len} bytes at offset {buf_offset} do not fit in registration {handle:#x}")]
    OutOfRegistration {
        /// The registration's handle.
        handle: u64,
        /// The offset in the registration given.
        buf_offset: u64,
        /// The length given.
        len: u64,
    },

    /// The file is not on a block device.
    #[error("{path} is not on a block device: there is no direct I/O to route")]
    NotBlockBacked {
        /// The file.
        path: PathBuf,
    },

    /// A device of the transfer went away during it: the file's block device (hot removal, an
    /// NVMe-oF controller deleted), or the PCI function of the registered device memory (a GPU
    /// that fell off the bus).
    #[error("a device of the transfer went away during it: the block device of {path}, or the PCI function of the registered memory")]
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
        #[source]
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
        #[source]
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
        #[source]
        errno: Errno,
    },

    /// Writing a file failed (the compat engine's own I/O).
    #[error("writing {path} at offset {offset} failed: {errno}")]
    FileWrite {
        /// The file.
        path: PathBuf,
        /// The file offset where the write stopped.
        offset: u64,
        /// The error of the write.
        #[source]
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

    /// The module could not serve a read and the compat engine is switched off
    /// (`GDIRECT_COMPAT_MODE=off`).
    #[error("the gdirect module cannot serve this read ({}) and GDIRECT_COMPAT_MODE=off forbids the compat engine", reason.cause())]
    CompatModeOff {
        /// Why the module could not serve it.
        reason: crate::CompatReason,
    },

    /// A registered buffer's memory was replaced (through `GpuBuffer::memory_mut`) since it was
    /// registered.
    #[error("the buffer's memory was replaced since it was registered (address {registered:#x}, now {now:#x}): register the new memory")]
    StaleBuffer {
        /// The address registered.
        registered: u64,
        /// The memory's address now.
        now: u64,
    },

    /// GPU memory of one CUDA device was given to a reader of another.
    #[error("the memory is on CUDA device {memory} but the reader's engine copies to device {engine}: make the reader with a backend of device {memory}")]
    WrongDevice {
        /// The memory's device.
        memory: usize,
        /// The device of the reader's engine.
        engine: usize,
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
        #[source]
        errno: Errno,
    },
}

impl Error {
    /// The kind of error, without its fields.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ModuleNotLoaded { .. } => ErrorKind::ModuleNotLoaded,
            Self::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            Self::NotGdirect { .. } => ErrorKind::NotGdirect,
            Self::VersionMismatch { .. } => ErrorKind::VersionMismatch,
            Self::Open { .. } => ErrorKind::Open,
            Self::OtherProcess { .. } => ErrorKind::OtherProcess,
            Self::DeviceMissing { .. } => ErrorKind::DeviceMissing,
            Self::Allocation { .. } => ErrorKind::Allocation,
            Self::Misaligned { .. } => ErrorKind::Misaligned,
            Self::NotProviderMemory { .. } => ErrorKind::NotProviderMemory,
            Self::NoStructPages { .. } => ErrorKind::NoStructPages,
            Self::PoolMemory { .. } => ErrorKind::PoolMemory,
            Self::UnknownPageTable { .. } => ErrorKind::UnknownPageTable,
            Self::PinLimit { .. } => ErrorKind::PinLimit,
            Self::UserPinLimit { .. } => ErrorKind::UserPinLimit,
            Self::UserTransferLimit { .. } => ErrorKind::UserTransferLimit,
            Self::TooManyRegistrations => ErrorKind::TooManyRegistrations,
            Self::ProviderUnavailable { .. } => ErrorKind::ProviderUnavailable,
            Self::Revoked { .. } => ErrorKind::Revoked,
            Self::NoSuchPeer { .. } => ErrorKind::NoSuchPeer,
            Self::PeerNotKernelDriven { .. } => ErrorKind::PeerNotKernelDriven,
            Self::AddressesNeedAdmin { .. } => ErrorKind::AddressesNeedAdmin,
            Self::PersistentNeedsAdmin { .. } => ErrorKind::PersistentNeedsAdmin,
            Self::OpenFile { .. } => ErrorKind::OpenFile,
            Self::NotDirect { .. } => ErrorKind::NotDirect,
            Self::BadFile { .. } => ErrorKind::BadFile,
            Self::NotSeekable { .. } => ErrorKind::NotSeekable,
            Self::IoMisaligned { .. } => ErrorKind::IoMisaligned,
            Self::OutOfRegistration { .. } => ErrorKind::OutOfRegistration,
            Self::NotBlockBacked { .. } => ErrorKind::NotBlockBacked,
            Self::DeviceGone { .. } => ErrorKind::DeviceGone,
            Self::Io { .. } => ErrorKind::Io,
            Self::Submit { .. } => ErrorKind::Submit,
            Self::FileIo { .. } => ErrorKind::FileIo,
            Self::FileWrite { .. } => ErrorKind::FileWrite,
            Self::OutOfMemoryRange { .. } => ErrorKind::OutOfMemoryRange,
            Self::BadSetting { .. } => ErrorKind::BadSetting,
            Self::Cuda { .. } => ErrorKind::Cuda,
            Self::Worker { .. } => ErrorKind::Worker,
            Self::WrongDevice { .. } => ErrorKind::WrongDevice,
            Self::StaleBuffer { .. } => ErrorKind::StaleBuffer,
            Self::CompatModeOff { .. } => ErrorKind::CompatModeOff,
            Self::Ioctl { .. } => ErrorKind::Ioctl,
        }
    }

    /// What kind of CUDA failure a [`Error::Cuda`] is, for a caller that acts on it (free
    /// memory and retry on [`CudaError::OutOfMemory`]); `None` for other errors.
    pub fn cuda_error(&self) -> Option<CudaError> {
        match self {
            Self::Cuda { error, .. } => Some(CudaError::from_name(error)),
            _ => None,
        }
    }

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
            | Self::FileWrite { errno, .. }
            | Self::Submit { errno, .. } => Some(*errno),
            Self::OutOfMemoryRange { .. } => Some(Errno::EOVERFLOW),
            Self::BadSetting { .. } => Some(Errno::EINVAL),
            Self::Cuda { .. } | Self::Worker { .. } => None,
            Self::CompatModeOff { .. } => Some(Errno::EOPNOTSUPP),
            Self::WrongDevice { .. } | Self::OtherProcess { .. } => Some(Errno::EXDEV),
            Self::StaleBuffer { .. } => Some(Errno::ESTALE),
            Self::NotDirect { .. } => Some(Errno::EBADFD),
            Self::BadFile { .. } => Some(Errno::EBADF),
            Self::NotSeekable { .. } => Some(Errno::ESPIPE),
            Self::IoMisaligned { .. } => Some(Errno::ERANGE),
            Self::OutOfRegistration { .. } => Some(Errno::EOVERFLOW),
            Self::NotBlockBacked { .. } => Some(Errno::ENOTBLK),
            Self::DeviceGone { .. } => Some(Errno::ENODEV),
            Self::PermissionDenied { .. } => Some(Errno::EACCES),
            Self::Misaligned { .. } => Some(Errno::ERANGE),
            Self::NotProviderMemory { .. } => Some(Errno::ENXIO),
            Self::NoStructPages { .. } => Some(Errno::EMEDIUMTYPE),
            Self::PoolMemory { .. } => Some(Errno::EINVAL),
            Self::UnknownPageTable { .. } => Some(Errno::EPROTO),
            Self::PinLimit { .. } | Self::UserPinLimit { .. } | Self::UserTransferLimit { .. } => {
                Some(Errno::EDQUOT)
            }
            Self::TooManyRegistrations => Some(Errno::EMFILE),
            Self::ProviderUnavailable { .. } => Some(Errno::EOPNOTSUPP),
            Self::Revoked { .. } => Some(Errno::EKEYREVOKED),
            Self::NoSuchPeer { .. } => Some(Errno::ENODEV),
            Self::PeerNotKernelDriven { .. } => Some(Errno::EUNATCH),
            Self::AddressesNeedAdmin { .. } | Self::PersistentNeedsAdmin { .. } => {
                Some(Errno::EACCES)
            }
            Self::ModuleNotLoaded { .. }
            | Self::VersionMismatch { .. }
            | Self::DeviceMissing { .. } => None,
        }
    }
}

/// A CUDA driver failure, by what a caller can do about it (from the driver's error name,
/// `cuGetErrorName`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CudaError {
    /// `CUDA_ERROR_OUT_OF_MEMORY`: device (or pinned host) memory is exhausted.
    OutOfMemory,
    /// `CUDA_ERROR_NO_DEVICE`: no CUDA device.
    NoDevice,
    /// `CUDA_ERROR_INVALID_DEVICE`: no device of that ordinal.
    InvalidDevice,
    /// `CUDA_ERROR_NOT_INITIALIZED` or `CUDA_ERROR_DEINITIALIZED`: the driver is not (or no
    /// longer) usable in this process.
    NotInitialized,
    /// `CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_INVALID_CONTEXT` or
    /// `CUDA_ERROR_INVALID_HANDLE`: a bad argument (an address that is not CUDA memory, say).
    InvalidValue,
    /// `CUDA_ERROR_NOT_PERMITTED` or `CUDA_ERROR_NOT_SUPPORTED`.
    NotPermitted,
    /// Anything else, or a failure gdirect found itself.
    Other,
}

impl CudaError {
    /// The kind of the driver error named `name` (`CUDA_ERROR_OUT_OF_MEMORY`...).
    pub fn from_name(name: &str) -> Self {
        match name {
            "CUDA_ERROR_OUT_OF_MEMORY" => Self::OutOfMemory,
            "CUDA_ERROR_NO_DEVICE" => Self::NoDevice,
            "CUDA_ERROR_INVALID_DEVICE" => Self::InvalidDevice,
            "CUDA_ERROR_NOT_INITIALIZED" | "CUDA_ERROR_DEINITIALIZED" => Self::NotInitialized,
            "CUDA_ERROR_INVALID_VALUE"
            | "CUDA_ERROR_INVALID_CONTEXT"
            | "CUDA_ERROR_INVALID_HANDLE" => Self::InvalidValue,
            "CUDA_ERROR_NOT_PERMITTED" | "CUDA_ERROR_NOT_SUPPORTED" => Self::NotPermitted,
            _ => Self::Other,
        }
    }
}

/// What kind of error an [`Error`] is: one per variant, for matching without fields and for
/// machine-readable output (`gdirect --json` prints [`ErrorKind::name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The kernel module is not loaded ([`Error::ModuleNotLoaded`]).
    ModuleNotLoaded,
    /// The caller may not open the device ([`Error::PermissionDenied`]).
    PermissionDenied,
    /// The device is not a gdirect device ([`Error::NotGdirect`]).
    NotGdirect,
    /// The module speaks another ABI version ([`Error::VersionMismatch`]).
    VersionMismatch,
    /// Opening the device failed ([`Error::Open`]).
    Open,
    /// The device file was opened by another process ([`Error::OtherProcess`]).
    OtherProcess,
    /// A device node the operation needs is missing ([`Error::DeviceMissing`]).
    DeviceMissing,
    /// Memory could not be allocated ([`Error::Allocation`]).
    Allocation,
    /// A registration is not aligned for its provider ([`Error::Misaligned`]).
    Misaligned,
    /// The range is not memory of the provider ([`Error::NotProviderMemory`]).
    NotProviderMemory,
    /// GPU memory without struct pages ([`Error::NoStructPages`]).
    NoStructPages,
    /// GPU memory from a stream-ordered pool ([`Error::PoolMemory`]).
    PoolMemory,
    /// A page table of an unknown nv-p2p generation ([`Error::UnknownPageTable`]).
    UnknownPageTable,
    /// The module's pinned-bytes limit ([`Error::PinLimit`]).
    PinLimit,
    /// The module's pinned-bytes limit for one user ([`Error::UserPinLimit`]).
    UserPinLimit,
    /// The module's limit on one user's batched transfers ([`Error::UserTransferLimit`]).
    UserTransferLimit,
    /// The registrations limit of one handle ([`Error::TooManyRegistrations`]).
    TooManyRegistrations,
    /// The provider's driver is not loaded ([`Error::ProviderUnavailable`]).
    ProviderUnavailable,
    /// The provider took the memory back ([`Error::Revoked`]).
    Revoked,
    /// No PCI device at the peer address ([`Error::NoSuchPeer`]).
    NoSuchPeer,
    /// No driver of this kernel drives the peer ([`Error::PeerNotKernelDriven`]).
    PeerNotKernelDriven,
    /// Peer addresses need CAP_SYS_ADMIN ([`Error::AddressesNeedAdmin`]).
    AddressesNeedAdmin,
    /// A persistent registration needs CAP_SYS_ADMIN ([`Error::PersistentNeedsAdmin`]).
    PersistentNeedsAdmin,
    /// A file could not be opened for transfers ([`Error::OpenFile`]).
    OpenFile,
    /// The file is not open with O_DIRECT ([`Error::NotDirect`]).
    NotDirect,
    /// The file is not open for the transfer's direction ([`Error::BadFile`]).
    BadFile,
    /// Neither a regular file nor a block device ([`Error::NotSeekable`]).
    NotSeekable,
    /// Offsets or length not multiples of the logical block size ([`Error::IoMisaligned`]).
    IoMisaligned,
    /// The range is past the end of the registration ([`Error::OutOfRegistration`]).
    OutOfRegistration,
    /// The file is not on a block device ([`Error::NotBlockBacked`]).
    NotBlockBacked,
    /// The block device, or the registered memory's PCI function, went away
    /// ([`Error::DeviceGone`]).
    DeviceGone,
    /// A transfer failed in the storage stack ([`Error::Io`]).
    Io,
    /// A batch entry was refused ([`Error::Submit`]).
    Submit,
    /// The compat engine's file I/O failed ([`Error::FileIo`]).
    FileIo,
    /// The compat engine's write of a file failed ([`Error::FileWrite`]).
    FileWrite,
    /// A range is past the end of the memory ([`Error::OutOfMemoryRange`]).
    OutOfMemoryRange,
    /// A setting has a value that cannot be used ([`Error::BadSetting`]).
    BadSetting,
    /// A CUDA driver call failed ([`Error::Cuda`]).
    Cuda,
    /// A worker thread of the compat engine died ([`Error::Worker`]).
    Worker,
    /// GPU memory of another device than the reader's ([`Error::WrongDevice`]).
    WrongDevice,
    /// A registered buffer's memory was replaced ([`Error::StaleBuffer`]).
    StaleBuffer,
    /// The module cannot serve a read and compat mode is off ([`Error::CompatModeOff`]).
    CompatModeOff,
    /// An ioctl failed ([`Error::Ioctl`]).
    Ioctl,
}

impl ErrorKind {
    /// The kind's name in snake case, as `gdirect --json` prints it (`module_not_loaded`).
    pub fn name(self) -> &'static str {
        match self {
            Self::ModuleNotLoaded => "module_not_loaded",
            Self::PermissionDenied => "permission_denied",
            Self::NotGdirect => "not_gdirect",
            Self::VersionMismatch => "version_mismatch",
            Self::Open => "open",
            Self::OtherProcess => "other_process",
            Self::DeviceMissing => "device_missing",
            Self::Allocation => "allocation",
            Self::Misaligned => "misaligned",
            Self::NotProviderMemory => "not_provider_memory",
            Self::NoStructPages => "no_struct_pages",
            Self::PoolMemory => "pool_memory",
            Self::UnknownPageTable => "unknown_page_table",
            Self::PinLimit => "pin_limit",
            Self::UserPinLimit => "user_pin_limit",
            Self::UserTransferLimit => "user_transfer_limit",
            Self::TooManyRegistrations => "too_many_registrations",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::Revoked => "revoked",
            Self::NoSuchPeer => "no_such_peer",
            Self::PeerNotKernelDriven => "peer_not_kernel_driven",
            Self::AddressesNeedAdmin => "addresses_need_admin",
            Self::PersistentNeedsAdmin => "persistent_needs_admin",
            Self::OpenFile => "open_file",
            Self::NotDirect => "not_direct",
            Self::BadFile => "bad_file",
            Self::NotSeekable => "not_seekable",
            Self::IoMisaligned => "io_misaligned",
            Self::OutOfRegistration => "out_of_registration",
            Self::NotBlockBacked => "not_block_backed",
            Self::DeviceGone => "device_gone",
            Self::Io => "io",
            Self::Submit => "submit",
            Self::FileIo => "file_io",
            Self::FileWrite => "file_write",
            Self::OutOfMemoryRange => "out_of_memory_range",
            Self::BadSetting => "bad_setting",
            Self::Cuda => "cuda",
            Self::Worker => "worker",
            Self::WrongDevice => "wrong_device",
            Self::StaleBuffer => "stale_buffer",
            Self::CompatModeOff => "compat_mode_off",
            Self::Ioctl => "ioctl",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An [`Error`] as an [`std::io::Error`]: its [`std::io::ErrorKind`] from the errno (`Other` where
/// there is none), the gdirect error inside, with its message and fields
/// (`io::Error::get_ref()` and `downcast`).
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        let kind = e.errno().map_or(std::io::ErrorKind::Other, |errno| {
            std::io::Error::from_raw_os_error(errno as i32).kind()
        });
        std::io::Error::new(kind, e)
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn cuda_failures_are_typed_by_the_drivers_error_name() {
        let e = |name: &str| Error::Cuda {
            what: "cuMemAlloc",
            error: name.into(),
        };
        assert_eq!(
            e("CUDA_ERROR_OUT_OF_MEMORY").cuda_error(),
            Some(CudaError::OutOfMemory)
        );
        assert_eq!(
            e("CUDA_ERROR_DEINITIALIZED").cuda_error(),
            Some(CudaError::NotInitialized)
        );
        assert_eq!(
            e("CUDA_ERROR_INVALID_VALUE").cuda_error(),
            Some(CudaError::InvalidValue)
        );
        assert_eq!(e("a null buffer").cuda_error(), Some(CudaError::Other));
        assert_eq!(Error::TooManyRegistrations.cuda_error(), None);
    }

    #[test]
    fn kind_names_are_the_cli_json_kinds() {
        let e = Error::ModuleNotLoaded {
            path: "/dev/gdirect".into(),
            reason: "does not exist",
        };
        assert_eq!(e.kind(), ErrorKind::ModuleNotLoaded);
        assert_eq!(e.kind().name(), "module_not_loaded");
        assert_eq!(
            Error::TooManyRegistrations.kind().name(),
            "too_many_registrations"
        );
        let e = Error::UserPinLimit {
            len: 1,
            pinned: 2,
            limit: 3,
        };
        assert_eq!(e.kind().to_string(), "user_pin_limit");
    }

    #[test]
    fn errno_is_the_source_and_the_io_error_kind() {
        let e = Error::OpenFile {
            path: "/nonexistent".into(),
            errno: Errno::ENOENT,
        };
        let source = e.source().and_then(|s| s.downcast_ref::<Errno>());
        assert_eq!(source, Some(&Errno::ENOENT));
        let io: std::io::Error = e.into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let inner = io.get_ref().and_then(|i| i.downcast_ref::<Error>());
        assert!(matches!(inner, Some(Error::OpenFile { .. })));
        assert!(io.to_string().contains("/nonexistent"));
        let io: std::io::Error = Error::Worker {
            what: "a worker died",
        }
        .into();
        assert_eq!(io.kind(), std::io::ErrorKind::Other);
    }

    #[test]
    fn misaligned_transfer_says_where() {
        let e = Error::IoMisaligned {
            path: "/dev/nvme0n1".into(),
            file_offset: 513,
            buf_offset: 0,
            len: 4096,
        };
        let text = e.to_string();
        assert!(text.contains("4096 bytes at file offset 513"), "{text}");
        let e = Error::OutOfRegistration {
            handle: 0x10,
            buf_offset: 4096,
            len: 8192,
        };
        assert_eq!(
            e.to_string(),
            "8192 bytes at offset 4096 do not fit in registration 0x10"
        );
    }
}
