// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Transfers between files and registered memory: [`File`], [`Transfer`], [`Batch`].

use std::{
    fmt,
    fs::OpenOptions,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
        unix::fs::OpenOptionsExt,
    },
    path::{Path, PathBuf},
};

use crate::{
    driver::Driver,
    error::{Errno, Error, Result},
    registration::Registration,
    sys,
};

/// Where the bytes of a transfer went (`enum gdirect_path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoPath {
    /// DMA between the storage and the device memory, peer to peer.
    P2p,
    /// Through the module's pool of host pages and a CPU copy.
    Bounce,
    /// The memory is host memory: DMA to it directly.
    Host,
    /// A value this library does not know (a newer module): reported as it came.
    Unknown(u32),
}

impl IoPath {
    /// Every path, in the order of the ABI.
    pub const ALL: [IoPath; 3] = [IoPath::P2p, IoPath::Bounce, IoPath::Host];

    pub(crate) fn from_raw(raw: u32) -> Self {
        match raw {
            sys::GDIRECT_PATH_P2P => Self::P2p,
            sys::GDIRECT_PATH_BOUNCE => Self::Bounce,
            sys::GDIRECT_PATH_HOST => Self::Host,
            raw => Self::Unknown(raw),
        }
    }

    /// The position in [`IoPath::ALL`] (and in [`Stats::io`]); `None` for an unknown path.
    pub fn index(self) -> Option<usize> {
        Self::ALL.iter().position(|p| *p == self)
    }

    /// The name the CLI and JSON use (`unknown` for a value this library does not know).
    pub fn name(self) -> &'static str {
        match self {
            Self::P2p => "p2p",
            Self::Bounce => "bounce",
            Self::Host => "host",
            Self::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for IoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a transfer took its path (`enum gdirect_path_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Nothing stood in the way (P2P, or host memory).
    None,
    /// The caller asked for the bounce path.
    Forced,
    /// The file's block queue does not accept P2P pages.
    QueueNoP2p,
    /// The storage's DMA device cannot reach the memory peer to peer.
    Distance,
    /// The provider's memory has no pages the block layer can use.
    NoPages,
    /// The file is on an NVMe native multipath head that does not accept P2P pages although one
    /// of its paths does (a head takes them only when all its paths do).
    Multipath,
    /// The file's data is not on its file system's block device (an XFS realtime file), so its
    /// device's queue and reach could not be checked.
    DataDevice,
    /// The file system does no direct I/O for the file (ext4 journalling its data, fs-verity,
    /// inline data), or for a request off the alignment it needs: peer to peer, the CPU would
    /// copy between the page cache and the memory.
    NoDirectIo,
    /// A value this library does not know (a newer module): reported as it came.
    Unknown(u32),
}

impl Reason {
    /// Every reason, in the order of the ABI.
    pub const ALL: [Reason; 8] = [
        Reason::None,
        Reason::Forced,
        Reason::QueueNoP2p,
        Reason::Distance,
        Reason::NoPages,
        Reason::Multipath,
        Reason::DataDevice,
        Reason::NoDirectIo,
    ];

    pub(crate) fn from_raw(raw: u32) -> Self {
        match raw {
            sys::GDIRECT_REASON_NONE => Self::None,
            sys::GDIRECT_REASON_FORCED => Self::Forced,
            sys::GDIRECT_REASON_QUEUE_NO_P2P => Self::QueueNoP2p,
            sys::GDIRECT_REASON_DISTANCE => Self::Distance,
            sys::GDIRECT_REASON_NO_PAGES => Self::NoPages,
            sys::GDIRECT_REASON_MULTIPATH => Self::Multipath,
            sys::GDIRECT_REASON_DATA_DEVICE => Self::DataDevice,
            sys::GDIRECT_REASON_NO_DIRECT_IO => Self::NoDirectIo,
            raw => Self::Unknown(raw),
        }
    }

    /// The position in [`Reason::ALL`] (and in [`Stats::reasons`]); `None` for an unknown one.
    pub fn index(self) -> Option<usize> {
        Self::ALL.iter().position(|r| *r == self)
    }

    /// The name the CLI and JSON use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Forced => "forced",
            Self::QueueNoP2p => "queue_no_p2p",
            Self::Distance => "distance",
            Self::NoPages => "no_pages",
            Self::Multipath => "multipath",
            Self::DataDevice => "data_device",
            Self::NoDirectIo => "no_direct_io",
            Self::Unknown(_) => "unknown",
        }
    }

    /// Why the module took the path it did, in a sentence that names the storage transport.
    pub fn explain(self, transport: Transport) -> String {
        let t = transport.name();
        match self {
            Self::None => "nothing stood in the way".to_string(),
            Self::Forced => "the caller asked for the bounce path".to_string(),
            Self::QueueNoP2p => match transport {
                Transport::Rdma => {
                    "the nvme-rdma queue does not accept P2P pages: its RDMA device \
                                    cannot DMA to PCI peer memory (software RDMA such as soft-RoCE \
                                    cannot; a hardware RNIC that supports P2PDMA can)"
                        .to_string()
                }
                Transport::Tcp => "the NVMe/TCP queue does not accept P2P pages: the data goes \
                                   through the network stack in host memory"
                    .to_string(),
                _ => format!("the {t} block queue does not accept P2P pages"),
            },
            Self::Distance => match transport {
                Transport::Rdma => "the RDMA adapter (RNIC) the NVMe-oF connection goes through \
                                    cannot reach the memory peer to peer (across a host bridge \
                                    that is not known to forward it, or redirected by ACS)"
                    .to_string(),
                _ => format!(
                    "the storage's DMA device ({t}) cannot reach the memory peer to peer (across \
                     a host bridge that is not known to forward it, or redirected by ACS)"
                ),
            },
            Self::NoPages => {
                "the provider's memory has no pages the block layer can take".to_string()
            }
            Self::Multipath => format!(
                "the file is on an NVMe native multipath head ({t}), which takes P2P pages only \
                 when every path does, and not all of its paths do: disconnect the paths that \
                 cannot (over TCP, or an RDMA device without P2PDMA), or boot with \
                 nvme_core.multipath=N so that each controller has its own namespace"
            ),
            Self::DataDevice => "the file's data is not on its file system's block device (an \
                                 XFS realtime file is on the realtime device), whose queue and \
                                 reach the module cannot check"
                .to_string(),
            Self::NoDirectIo => "the file system does no direct I/O for this file (ext4 \
                                 journalling its data: mounted data=journal or chattr +j; \
                                 fs-verity; inline data), or for a request off the alignment it \
                                 needs (an encrypted ext4 file's block size, a reflinked XFS \
                                 file's allocation unit for writes): it would copy between the \
                                 page cache and the memory by CPU, so the copy is made in host \
                                 memory instead"
                .to_string(),
            Self::Unknown(raw) => format!(
                "reason {raw}, which this library does not know (the module is newer than it)"
            ),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The storage transport of a file's block device (`enum gdirect_transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// Not NVMe, and no PCI device found.
    Unknown,
    /// NVMe over PCIe (or another PCI block device).
    Pcie,
    /// NVMe over Fabrics, RDMA.
    Rdma,
    /// NVMe over Fabrics, TCP.
    Tcp,
    /// NVMe over Fabrics, loopback target.
    Loop,
    /// NVMe over Fabrics, Fibre Channel.
    Fc,
}

impl Transport {
    fn from_raw(raw: u32) -> Self {
        match raw {
            sys::GDIRECT_TRANSPORT_PCIE => Self::Pcie,
            sys::GDIRECT_TRANSPORT_RDMA => Self::Rdma,
            sys::GDIRECT_TRANSPORT_TCP => Self::Tcp,
            sys::GDIRECT_TRANSPORT_LOOP => Self::Loop,
            sys::GDIRECT_TRANSPORT_FC => Self::Fc,
            _ => Self::Unknown,
        }
    }

    /// The name the CLI and JSON use (the NVMe controller's `transport`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Pcie => "pcie",
            Self::Rdma => "rdma",
            Self::Tcp => "tcp",
            Self::Loop => "loop",
            Self::Fc => "fc",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which engine moved a transfer's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The kernel module (`path` and `reason` say how).
    Module,
    /// The library's compat engine ([`crate::compat`]), and why the module was not used.
    Compat(CompatReason),
}

/// Why a transfer went through the compat engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompatReason {
    /// The gdirect module is not loaded: no `/dev/gdirect`, or no driver behind it.
    NoModule,
    /// The module is loaded but this process may not open its device (its mode and group:
    /// see the README's permissions).
    NoAccess,
    /// The module speaks another ABI version than this library (or the device is not
    /// gdirect's): a module and library from different releases.
    Incompatible,
    /// Opening or asking the module failed otherwise (the errno says how).
    Unavailable(Errno),
    /// The module is loaded but its `nvidia` provider is not available (no NVIDIA driver
    /// exporting nv-p2p).
    NoProvider,
    /// The module refused to register the memory (the errno says why).
    Refused(Errno),
    /// Offsets or length are not multiples of the file's block size, or the memory is not
    /// aligned as the provider needs: direct transfers cannot serve them.
    Unaligned,
    /// The caller asked for the compat engine.
    Requested,
    /// The transfer is smaller than the direct threshold (`GDIRECT_DIRECT_THRESHOLD`).
    BelowThreshold,
    /// The CUDA driver says no third-party device may reach the memory
    /// (`CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE` is 0), so the module is not asked.
    NotRdmaCapable,
    /// The memory comes from a stream-ordered pool (`cudaMallocAsync`): its free returns it to
    /// the pool, never revoking a registration, so none is kept for it.
    PoolMemory,
}

impl Engine {
    /// The name the CLI and JSON use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Module => "module",
            Self::Compat(_) => "compat",
        }
    }

    /// Why this engine, in words.
    pub fn explain(self) -> String {
        match self {
            Self::Module => "the gdirect module moved the bytes".into(),
            Self::Compat(CompatReason::Requested) => "the compat engine, as asked".into(),
            Self::Compat(why) => {
                format!("{}: the library's compat engine read the file", why.cause())
            }
        }
    }
}

impl CompatReason {
    /// Why the module cannot serve, from the error opening or asking it.
    pub fn from_error(e: &crate::Error) -> Self {
        use crate::Error;
        match e {
            Error::ModuleNotLoaded { .. } => Self::NoModule,
            Error::PermissionDenied { .. } => Self::NoAccess,
            Error::VersionMismatch { .. } | Error::NotGdirect { .. } => Self::Incompatible,
            e => Self::Unavailable(e.errno().unwrap_or(Errno::EIO)),
        }
    }

    /// The reason's name, as JSON and the Python package spell it (`no_module`).
    pub fn name(self) -> &'static str {
        match self {
            Self::NoModule => "no_module",
            Self::NoAccess => "no_access",
            Self::Incompatible => "incompatible",
            Self::Unavailable(_) => "unavailable",
            Self::NoProvider => "no_provider",
            Self::Refused(_) => "refused",
            Self::Unaligned => "unaligned",
            Self::Requested => "requested",
            Self::BelowThreshold => "below_threshold",
            Self::NotRdmaCapable => "not_rdma_capable",
            Self::PoolMemory => "pool_memory",
        }
    }

    /// Why the module did not serve, in words (what [`Engine::explain`] says before the
    /// engine that did).
    pub fn cause(self) -> String {
        match self {
            Self::NoModule => "the gdirect module is not loaded".into(),
            Self::NoAccess => "the gdirect module is loaded but this process may not open its \
                 device (mode and group of /dev/gdirect)"
                .into(),
            Self::Incompatible => {
                "the gdirect module speaks another ABI version than this library \
                 (a module and a library of different releases)"
                    .into()
            }
            Self::Unavailable(e) => format!("the gdirect module could not be used ({e})"),
            Self::NoProvider => {
                "the module has no nvidia provider (no NVIDIA driver exports nv-p2p)".into()
            }
            Self::Refused(Errno::EMEDIUMTYPE) => {
                "the GPU driver gives this memory no struct pages \
                 (not in NVIDIA's P2PDMA mode), so no storage DMA can reach it"
                    .into()
            }
            Self::Refused(e) => format!("the module refused the GPU memory ({e})"),
            Self::Unaligned => "the range is not aligned for direct I/O or the memory not for the \
                 provider"
                .into(),
            Self::Requested => "the compat engine was asked for".into(),
            Self::BelowThreshold => "the transfer is smaller than GDIRECT_DIRECT_THRESHOLD".into(),
            Self::NotRdmaCapable => "the CUDA driver says no third-party device may reach this \
                 memory (it is not GPUDirect RDMA capable)"
                .into(),
            Self::PoolMemory => "the memory comes from a stream-ordered pool (cudaMallocAsync), \
                 whose free never revokes a registration"
                .into(),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a transfer did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Which engine moved the bytes, and why that one.
    pub engine: Engine,
    /// Bytes transferred.
    pub bytes: u64,
    /// The path they took.
    pub path: IoPath,
    /// Why.
    pub reason: Reason,
    /// The storage transport (over TCP or soft-RoCE, why the queue takes no P2P pages).
    pub transport: Transport,
    /// A read reached the end of the file (`bytes` is short).
    pub eof: bool,
    /// Bytes that went through host memory.
    pub bounce_bytes: u64,
}

/// Options of a transfer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoOptions {
    force_bounce: bool,
}

impl IoOptions {
    /// The defaults: the module picks the path.
    pub const fn new() -> Self {
        Self {
            force_bounce: false,
        }
    }

    /// Take the bounce path whatever the hardware allows (comparisons, tests).
    pub const fn force_bounce(mut self, on: bool) -> Self {
        self.force_bounce = on;
        self
    }

    fn flags(self) -> u32 {
        if self.force_bounce {
            sys::GDIRECT_IO_FORCE_BOUNCE
        } else {
            0
        }
    }
}

/// A file opened with `O_DIRECT` for transfers to and from registered memory: a raw block
/// device (`/dev/nvme0n1`) or a file on a file system with direct I/O.
#[derive(Debug)]
pub struct File {
    file: std::fs::File,
    path: PathBuf,
}

impl File {
    /// Opens `path` for reading with `O_DIRECT`.
    pub fn open_direct(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, false)
    }

    /// Opens `path` for reading and writing with `O_DIRECT`.
    pub fn open_direct_rw(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, true)
    }

    fn open_with(path: impl AsRef<Path>, write: bool) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(nix::libc::O_DIRECT)
            .open(&path)
            .map_err(|e| Error::OpenFile {
                path: path.clone(),
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
            })?;
        Ok(Self { file, path })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads `len` bytes at `file_offset` into `reg` at `buf_offset` (`GDIRECT_IOC_READ`).
    /// Not ordered after work queued on GPU memory: see [`Driver::register`].
    ///
    /// ```no_run
    /// use gdirect::{Driver, File, HostBuffer};
    /// let driver = Driver::open()?;
    /// let buf = HostBuffer::new(1 << 20)?;
    /// let reg = driver.register(&buf)?;
    /// let t = File::open_direct("/dev/nvme0n1")?.read_into(&reg, 0, 0, 1 << 20)?;
    /// println!("{} bytes by {} ({})", t.bytes, t.path, t.reason);
    /// # Ok::<(), gdirect::Error>(())
    /// ```
    pub fn read_into(
        &self,
        reg: &Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<Transfer> {
        self.read_into_with(reg, buf_offset, file_offset, len, IoOptions::new())
    }

    /// [`File::read_into`] with options.
    pub fn read_into_with(
        &self,
        reg: &Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        options: IoOptions,
    ) -> Result<Transfer> {
        self.transfer(reg, Direction::Read, buf_offset, file_offset, len, options)
    }

    /// Writes `len` bytes of `reg` at `buf_offset` to the file at `file_offset`
    /// (`GDIRECT_IOC_WRITE`; the file must be open for writing). Not ordered after work queued
    /// on GPU memory: see [`Driver::register`].
    pub fn write_from(
        &self,
        reg: &Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<Transfer> {
        self.write_from_with(reg, buf_offset, file_offset, len, IoOptions::new())
    }

    /// Writes all `len` bytes, as [`File::write_from`] does, and again from where a write came
    /// back short, as `write_all` loops over `write(2)`: the write after a short one says
    /// why, and fails with [`Error::FileWrite`] (its errno, `EFBIG` at a file size limit,
    /// `ENOSPC`, and the file offset reached). The other errors are [`File::write_from`]'s.
    pub fn write_all_from(
        &self,
        reg: &Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<Transfer> {
        let mut t = self.write_from(reg, buf_offset, file_offset, len)?;
        while t.bytes < len {
            let done = t.bytes;
            let stopped = |errno| Error::FileWrite {
                path: self.path.clone(),
                offset: file_offset + done,
                errno,
            };
            match self.write_from(reg, buf_offset + done, file_offset + done, len - done) {
                Ok(more) if more.bytes > 0 => {
                    t.bytes += more.bytes;
                    t.bounce_bytes += more.bounce_bytes;
                }
                Ok(_) => return Err(stopped(Errno::ENOSPC)),
                Err(Error::Io { errno, .. }) => return Err(stopped(errno)),
                Err(e) => return Err(e),
            }
        }
        Ok(t)
    }

    /// [`File::write_from`] with options.
    pub fn write_from_with(
        &self,
        reg: &Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        options: IoOptions,
    ) -> Result<Transfer> {
        self.transfer(reg, Direction::Write, buf_offset, file_offset, len, options)
    }

    fn transfer(
        &self,
        reg: &Registration<'_>,
        dir: Direction,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        options: IoOptions,
    ) -> Result<Transfer> {
        let mut args = sys::gdirect_io_args {
            handle: reg.handle(),
            buf_offset,
            file_offset,
            len,
            fd: self.file.as_raw_fd(),
            flags: options.flags(),
            ..Default::default()
        };
        let driver = reg.driver();
        // A write's file (one `fstat`): kept registrations of its page cache are not reused from
        // here on (and again after: an `O_DIRECT` write drops the pages one made meanwhile pins).
        let written = match dir {
            Direction::Write => crate::compat::file_key(&self.file),
            Direction::Read => None,
        };
        if let Some(key) = written {
            crate::compat::note_write_key(key);
        }
        // SAFETY: `args` is a valid, writable struct for the call; the module keeps no pointer.
        let r = unsafe {
            match dir {
                Direction::Read => sys::read(driver.as_raw_fd(), &mut args),
                Direction::Write => sys::write(driver.as_raw_fd(), &mut args),
            }
        };
        // Made or not.
        if let Some(key) = written {
            crate::compat::note_write_key(key);
        }
        r.map_err(|errno| io_error(driver, &self.path, dir, &args, errno))?;
        Ok(Transfer {
            engine: Engine::Module,
            bytes: args.bytes,
            path: IoPath::from_raw(args.path),
            reason: Reason::from_raw(args.reason),
            transport: Transport::from_raw(args.transport),
            eof: args.result_flags & sys::GDIRECT_RESULT_EOF != 0,
            bounce_bytes: args.bounce_bytes,
        })
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl From<OwnedFd> for File {
    /// A descriptor opened elsewhere (by another library, or passed over a socket), kept
    /// open for transfers. It must be open with `O_DIRECT` (and for writing, to be written):
    /// the module checks at each transfer and refuses one that is not with
    /// [`Error::NotDirect`] ([`Error::BadFile`] for the direction). Errors name the file by
    /// the path `/proc/self/fd` gives, or `fd N` where there is none.
    fn from(fd: OwnedFd) -> Self {
        let raw = fd.as_raw_fd();
        let path = std::fs::read_link(format!("/proc/self/fd/{raw}"))
            .unwrap_or_else(|_| PathBuf::from(format!("fd {raw}")));
        Self {
            file: std::fs::File::from(fd),
            path,
        }
    }
}

impl From<File> for OwnedFd {
    /// The descriptor back, still open.
    fn from(file: File) -> Self {
        file.file.into()
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Read,
    Write,
}

/// Maps the errno of a transfer to its meaning (see the uapi header).
fn io_error(
    driver: &Driver,
    path: &Path,
    dir: Direction,
    args: &sys::gdirect_io_args,
    errno: Errno,
) -> Error {
    let ioctl = match dir {
        Direction::Read => "GDIRECT_IOC_READ",
        Direction::Write => "GDIRECT_IOC_WRITE",
    };
    match errno {
        Errno::EBADFD => Error::NotDirect {
            path: path.to_path_buf(),
        },
        Errno::ERANGE => Error::IoMisaligned {
            path: path.to_path_buf(),
            file_offset: args.file_offset,
            buf_offset: args.buf_offset,
            len: args.len,
        },
        Errno::EOVERFLOW => Error::OutOfRegistration {
            handle: args.handle,
            buf_offset: args.buf_offset,
            len: args.len,
        },
        Errno::ENOTBLK => Error::NotBlockBacked {
            path: path.to_path_buf(),
        },
        Errno::EKEYREVOKED => Error::Revoked {
            handle: args.handle,
        },
        Errno::ENODEV => Error::DeviceGone {
            path: path.to_path_buf(),
        },
        Errno::EBADF => Error::BadFile {
            path: path.to_path_buf(),
        },
        Errno::EXDEV => driver.other_process(),
        errno => Error::Io {
            ioctl,
            path: path.to_path_buf(),
            errno,
            driver: driver.path().to_path_buf(),
        },
    }
}

/// A batch of transfers for [`Driver::submit`] (`GDIRECT_IOC_SUBMIT`).
///
/// Entries name their file and registration, which the batch borrows until it is dropped: an
/// entry records a file descriptor and a handle, and a file closed meanwhile could see its number
/// reused by another file, which the batch would then read. The module takes its own references
/// when the batch is submitted, so both may be dropped once the batch is, while the transfers
/// run, and so may the memory: no safe code frees memory under a transfer, since host and
/// p2pdma pages stay pinned until the module lets go, and GPU memory's free runs the module's
/// free callback, which waits for the storage I/O on it (memory of a stream-ordered pool,
/// whose free never reaches the driver, is not registered: [`Error::PoolMemory`]).
///
/// A batch cannot outlive the file it names (this does not compile):
///
/// ```compile_fail,E0597
/// use gdirect::{Batch, Driver, File, HostBuffer};
/// let driver = Driver::open()?;
/// let buf = HostBuffer::new(4096)?;
/// let reg = driver.register(&buf)?;
/// let mut batch = Batch::new();
/// {
///     let file = File::open_direct("/dev/nvme0n1")?;
///     batch.read(&file, &reg, 0, 0, 4096, 1);
/// }
/// driver.submit(&batch, 0)?;
/// # Ok::<(), gdirect::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct Batch<'a> {
    sqes: Vec<sys::gdirect_sqe>,
    /// The `Driver` of each entry's registration (its address: a registration borrows its
    /// driver, which cannot move while the batch lives): a handle means something only to the
    /// file that made it.
    drivers: Vec<usize>,
    /// The file each entry names.
    files: Vec<&'a File>,
    /// The files and registrations the entries name.
    names: std::marker::PhantomData<&'a ()>,
}

impl<'a> Batch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a read of `len` bytes at `file_offset` into `reg` at `buf_offset`, tagged `user_data`.
    pub fn read(
        &mut self,
        file: &'a File,
        reg: &'a Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        user_data: u64,
    ) -> &mut Self {
        self.push(
            sys::GDIRECT_OP_READ,
            file,
            reg,
            buf_offset,
            file_offset,
            len,
            user_data,
            IoOptions::new(),
        )
    }

    /// Adds a write of `len` bytes of `reg` at `buf_offset` to `file_offset`.
    pub fn write(
        &mut self,
        file: &'a File,
        reg: &'a Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        user_data: u64,
    ) -> &mut Self {
        self.push(
            sys::GDIRECT_OP_WRITE,
            file,
            reg,
            buf_offset,
            file_offset,
            len,
            user_data,
            IoOptions::new(),
        )
    }

    /// Adds a read with options.
    #[allow(clippy::too_many_arguments, reason = "the fields of one transfer")]
    pub fn read_with(
        &mut self,
        file: &'a File,
        reg: &'a Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        user_data: u64,
        options: IoOptions,
    ) -> &mut Self {
        self.push(
            sys::GDIRECT_OP_READ,
            file,
            reg,
            buf_offset,
            file_offset,
            len,
            user_data,
            options,
        )
    }

    /// Adds a write with options.
    #[allow(clippy::too_many_arguments, reason = "the fields of one transfer")]
    pub fn write_with(
        &mut self,
        file: &'a File,
        reg: &'a Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        user_data: u64,
        options: IoOptions,
    ) -> &mut Self {
        self.push(
            sys::GDIRECT_OP_WRITE,
            file,
            reg,
            buf_offset,
            file_offset,
            len,
            user_data,
            options,
        )
    }

    /// Adds an entry with a raw `enum gdirect_op` value (test programs send bad ones on purpose).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments, reason = "the fields of one transfer")]
    pub fn push(
        &mut self,
        op: u32,
        file: &'a File,
        reg: &'a Registration<'_>,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        user_data: u64,
        options: IoOptions,
    ) -> &mut Self {
        self.drivers.push(std::ptr::from_ref(reg.driver()) as usize);
        self.files.push(file);
        self.sqes.push(sys::gdirect_sqe {
            op,
            flags: options.flags(),
            handle: reg.handle(),
            buf_offset,
            file_offset,
            len,
            fd: file.as_fd().as_raw_fd(),
            user_data,
            ..Default::default()
        });
        self
    }

    /// Entries in the batch.
    pub fn len(&self) -> usize {
        self.sqes.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.sqes.is_empty()
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.sqes.clear();
        self.drivers.clear();
        self.files.clear();
    }
}

/// The most entries one `SUBMIT` takes.
pub const BATCH_MAX: usize = sys::GDIRECT_BATCH_MAX as usize;

/// The completion of one batched transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The tag given at submit.
    pub user_data: u64,
    /// What the transfer did, or its errno.
    pub result: std::result::Result<Transfer, Errno>,
}

impl Driver {
    /// Submits the batch's entries from `start` (`GDIRECT_IOC_SUBMIT`, at most [`BATCH_MAX`] at
    /// a time): returns how many were queued, which is less than asked when the file's
    /// in-flight limit or its user's is reached (reap, then submit the rest; 0 when the file's
    /// left no room). [`Error::UserTransferLimit`] when the user's limit left no room: its
    /// other files and processes hold it.
    pub fn submit(&self, batch: &Batch<'_>, start: usize) -> Result<usize> {
        self.submit_at_most(batch, start, BATCH_MAX)
    }

    /// [`submit`](Self::submit), of at most `max` entries from `start`: for a caller that keeps
    /// its own queue depth (submit as many as have completed, reap, and so on).
    pub fn submit_at_most(&self, batch: &Batch<'_>, start: usize, max: usize) -> Result<usize> {
        let entries = batch.sqes.get(start..).unwrap_or(&[]);
        let count = entries.len().min(BATCH_MAX).min(max);
        if count == 0 {
            return Ok(0);
        }
        // An entry whose registration is another driver's (another open file's) is refused
        // here, as the module refuses a handle it did not make (the entries before it are
        // submitted, as the module queues those before a bad entry): its handle could
        // otherwise name one of this file's registrations.
        let me = std::ptr::from_ref(self) as usize;
        let foreign = batch.drivers[start..start + count]
            .iter()
            .position(|&d| d != me);
        let count = foreign.unwrap_or(count);
        let refused = |at: usize| Error::Submit {
            index: start + at,
            errno: Errno::EPERM,
        };
        if count == 0 {
            return Err(refused(0));
        }
        // Writes count against their files as they start (kept registrations of the page cache
        // are not reused from here on), again once submitted (one may have ended, reaped by
        // another thread, before its file is on the list below), and at each reap while they
        // may run.
        let writes: Vec<(u64, u64)> = entries[..count]
            .iter()
            .zip(&batch.files[start..start + count])
            .filter(|(e, _)| e.op == sys::GDIRECT_OP_WRITE)
            .filter_map(|(_, f)| crate::compat::file_key(*f))
            .collect();
        writes
            .iter()
            .copied()
            .for_each(crate::compat::note_write_key);
        let mut args = sys::gdirect_submit_args {
            sqes: entries.as_ptr() as u64,
            count: count as u32,
            ..Default::default()
        };
        // SAFETY: `args.sqes` points to `count` readable entries that outlive the call; the module
        // copies them and keeps no pointer.
        let r = unsafe { sys::submit(self.as_raw_fd(), &mut args) };
        if !writes.is_empty() {
            // Numbered after the ioctl: a reap that began before it cannot forget these.
            let mut pending = self.batch_writes.lock().unwrap_or_else(|p| p.into_inner());
            pending.submits += 1;
            let n = pending.submits;
            for key in writes {
                crate::compat::note_write_key(key);
                match pending.files.iter_mut().find(|(k, _)| *k == key) {
                    Some(f) => f.1 = n,
                    None => pending.files.push((key, n)),
                }
            }
        }
        match r {
            Ok(_) if foreign.is_some() && args.submitted as usize == count => Err(refused(count)),
            Ok(_) => Ok(args.submitted as usize),
            Err(Errno::EAGAIN) => Ok(0),
            Err(Errno::EXDEV) => Err(self.other_process()),
            Err(Errno::EDQUOT) => Err(Error::UserTransferLimit {
                path: self.path().to_path_buf(),
            }),
            Err(errno) => Err(Error::Submit {
                index: start + args.submitted as usize,
                errno,
            }),
        }
    }

    /// Collects up to `max` completions (`GDIRECT_IOC_REAP`); with `wait`, blocks until at least
    /// one is there (or nothing is in flight).
    pub fn reap(&self, max: usize, wait: bool) -> Result<Vec<Completion>> {
        let mut cqes = vec![sys::gdirect_cqe::default(); max];
        let mut args = sys::gdirect_reap_args {
            cqes: cqes.as_mut_ptr() as u64,
            max: max as u32,
            flags: if wait { sys::GDIRECT_REAP_WAIT } else { 0 },
            ..Default::default()
        };
        // Writes submitted up to here, if none is in flight when the reap returns, have ended.
        let submitted = self
            .batch_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .submits;
        // SAFETY: `args.cqes` points to `max` writable entries that outlive the call.
        unsafe { sys::reap(self.as_raw_fd(), &mut args) }
            .map_err(|errno| self.ioctl_error("GDIRECT_IOC_REAP", errno))?;
        cqes.truncate(args.reaped as usize);
        if args.reaped > 0 {
            // A write among these may have ended: its file counts again (and the files of the
            // writes still in flight, which this cannot tell apart), before the caller learns
            // of it. None in flight: those submitted before this reap are forgotten (not one
            // another thread submitted since, whose end a later reap must count).
            let mut pending = self.batch_writes.lock().unwrap_or_else(|p| p.into_inner());
            for (key, _) in &pending.files {
                crate::compat::note_write_key(*key);
            }
            if args.in_flight == 0 {
                pending.files.retain(|(_, n)| *n > submitted);
            }
        }
        Ok(cqes
            .into_iter()
            .map(|c| Completion {
                user_data: c.user_data,
                result: if c.result < 0 {
                    Err(Errno::from_raw(-c.result as i32))
                } else {
                    Ok(Transfer {
                        engine: Engine::Module,
                        bytes: c.result as u64,
                        path: IoPath::from_raw(c.path),
                        reason: Reason::from_raw(c.reason),
                        transport: Transport::from_raw(c.transport),
                        eof: c.result_flags & sys::GDIRECT_RESULT_EOF != 0,
                        bounce_bytes: c.bounce_bytes,
                    })
                },
            })
            .collect())
    }

    /// Signals `eventfd` once per completion from now on (`GDIRECT_IOC_SET_EVENTFD`); `None`
    /// stops.
    pub fn set_eventfd(&self, eventfd: Option<BorrowedFd<'_>>) -> Result<()> {
        let args = sys::gdirect_eventfd_args {
            fd: eventfd.map_or(-1, |fd| fd.as_raw_fd()),
            flags: 0,
        };
        // SAFETY: `args` is a valid struct for the call.
        unsafe { sys::set_eventfd(self.as_raw_fd(), &args) }
            .map_err(|errno| self.ioctl_error("GDIRECT_IOC_SET_EVENTFD", errno))?;
        Ok(())
    }

    /// The module's I/O counters (`GDIRECT_IOC_GET_STATS`; from a module older than
    /// [`Reason::NoDirectIo`], `GDIRECT_IOC_GET_STATS_V1`'s, and [`Stats::reasons_counted`] says
    /// how many reasons it counts).
    pub fn stats(&self) -> Result<Stats> {
        let mut args = sys::gdirect_stats_args::default();
        let mut counted = Reason::ALL.len();
        // SAFETY: `args` is a valid, writable struct for the call.
        match unsafe { sys::get_stats(self.as_raw_fd(), &mut args) } {
            Ok(_) => {}
            // A module that knows only the first struct refuses this one's size.
            Err(Errno::EINVAL) => {
                let mut v1 = sys::gdirect_stats_args_v1::default();
                // SAFETY: `v1` is a valid, writable struct for the call.
                unsafe { sys::get_stats_v1(self.as_raw_fd(), &mut v1) }
                    .map_err(|errno| self.ioctl_error("GDIRECT_IOC_GET_STATS_V1", errno))?;
                args.io = v1.io;
                args.reasons[..v1.reasons.len()].copy_from_slice(&v1.reasons);
                counted = v1.reasons.len();
            }
            Err(errno) => return Err(self.ioctl_error("GDIRECT_IOC_GET_STATS", errno)),
        }
        let mut stats = Stats {
            reasons_counted: counted,
            ..Stats::default()
        };
        for (p, row) in args.io.iter().enumerate() {
            for (d, s) in row.iter().enumerate() {
                stats.io[p][d] = PathStats {
                    ops: s.ops,
                    bytes: s.bytes,
                    errors: s.errors,
                    bounce_bytes: s.bounce_bytes,
                    latency_us_log2: s.latency_us_log2,
                };
            }
        }
        stats.reasons = args.reasons;
        Ok(stats)
    }
}

/// Counters of one path and direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStats {
    /// Completed transfers, errors included.
    pub ops: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Transfers that failed.
    pub errors: u64,
    /// Bytes that went through host memory.
    pub bounce_bytes: u64,
    /// Bucket `i`: transfers that took `[2^i, 2^(i+1))` microseconds.
    pub latency_us_log2: [u64; sys::GDIRECT_LATENCY_BUCKETS as usize],
}

/// The module's I/O counters since load. (Fields may be added, as the module counts more:
/// read them, build one with `Default`.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// By `[path][direction]`: paths in [`IoPath::ALL`] order, direction 0 read, 1 write.
    pub io: [[PathStats; 2]; 3],
    /// Transfers by reason, in [`Reason::ALL`] order.
    pub reasons: [u64; Reason::ALL.len()],
    /// How many of [`Reason::ALL`] the module counts: all of them, or fewer for a module older
    /// than this library (the others read 0).
    pub reasons_counted: usize,
}

impl Stats {
    /// The counters of a path and direction (`write` false for reads); zeros for a path this
    /// library does not know.
    pub fn get(&self, path: IoPath, write: bool) -> &PathStats {
        const NONE: PathStats = PathStats {
            ops: 0,
            bytes: 0,
            errors: 0,
            bounce_bytes: 0,
            latency_us_log2: [0; sys::GDIRECT_LATENCY_BUCKETS as usize],
        };
        path.index()
            .and_then(|p| self.io.get(p))
            .map_or(&NONE, |dirs| &dirs[usize::from(write)])
    }

    /// Transfers that took the bounce path for `reason`, or P2P/host ones for `Reason::None`;
    /// 0 for a reason this library does not know.
    pub fn by_reason(&self, reason: Reason) -> u64 {
        reason
            .index()
            .and_then(|r| self.reasons.get(r).copied())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_comes_from_a_descriptor_opened_elsewhere_and_goes_back() {
        let path = std::env::temp_dir().join(format!("gdirect-fd-{}", std::process::id()));
        std::fs::write(&path, b"x").expect("temp file");
        let opened = std::fs::File::open(&path).expect("open");
        let raw = opened.as_raw_fd();
        let file = File::from(OwnedFd::from(opened));
        assert_eq!(file.path(), path.canonicalize().expect("canonical path"));
        assert_eq!(
            file.as_fd().as_raw_fd(),
            raw,
            "the same descriptor, not a copy"
        );
        let back = OwnedFd::from(file);
        assert_eq!(back.as_raw_fd(), raw, "still open, still the same");
        drop(back);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn abi_values_round_trip_and_unknown_ones_are_kept() {
        for (i, p) in IoPath::ALL.iter().enumerate() {
            assert_eq!(IoPath::from_raw(i as u32), *p);
            assert_eq!(p.index(), Some(i));
        }
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(Reason::from_raw(i as u32), *r);
            assert_eq!(r.index(), Some(i));
        }
        let (path, reason) = (IoPath::from_raw(99), Reason::from_raw(77));
        assert_eq!((path, reason), (IoPath::Unknown(99), Reason::Unknown(77)));
        assert_eq!((path.name(), reason.name()), ("unknown", "unknown"));
        assert!(reason.explain(Transport::Pcie).contains("77"));
        let mut stats = Stats::default();
        stats.io[1][0].ops = 5;
        stats.reasons[2] = 3;
        assert_eq!(stats.get(IoPath::Bounce, false).ops, 5);
        assert_eq!(stats.get(path, false), &PathStats::default());
        assert_eq!(stats.by_reason(Reason::QueueNoP2p), 3);
        assert_eq!(stats.by_reason(reason), 0);
    }

    #[test]
    fn every_reason_round_trips_through_the_abi() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(Reason::from_raw(i as u32), *r, "{}", r.name());
        }
    }

    #[test]
    fn a_fabric_queue_reason_names_its_transport() {
        let rdma = Reason::QueueNoP2p.explain(Transport::Rdma);
        assert!(
            rdma.contains("nvme-rdma") && rdma.contains("RNIC"),
            "{rdma}"
        );
        let tcp = Reason::QueueNoP2p.explain(Transport::Tcp);
        assert!(tcp.contains("NVMe/TCP"), "{tcp}");
        let pcie = Reason::Distance.explain(Transport::Pcie);
        assert!(pcie.contains("pcie"), "{pcie}");
    }
}
