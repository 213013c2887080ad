// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Transfers between files and registered memory: the data path.
//!
//! A [`Transfer`] reads from a file into a registration or writes from one into a file, through
//! the file's own direct I/O (`vfs_iocb_iter_read`/`_write` over a bvec iterator), so that raw
//! namespaces and file systems alike work, holes read as zeros, and every permission check is
//! the file system's (made when the caller opened the file with `O_DIRECT`).
//!
//! Before anything is submitted the path is decided from facts (`path.rs`): the block queue's
//! `BLK_FEAT_PCI_P2PDMA` (the block layer does not check kernel-built bvecs itself), whether the
//! memory has P2P pages, and the PCI reach from the storage's DMA device to the memory. P2P and
//! host transfers DMA straight into the registration's pages; bounce transfers go through the
//! module's pool of host pages (`bounce.rs`) and a CPU copy.
//!
//! A transfer holds a use of the registration's pages (`region::UseGuard`) for as long as DMA
//! or a copy may touch them, one bounded chunk at a time, so a revocation waits for the chunk
//! in flight (not the whole transfer), and nothing is written into memory after its revocation
//! returns.

use core::{ffi::c_void, num::NonZeroU64};
use kernel::{
    bindings,
    fs::{
        file,
        File,
        LocalFile, //
    },
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc, //
    },
};

use crate::{
    bounce, error, fabric,
    multipath::{self, Paths},
    path::{
        self,
        Facts,
        Memory,
        Reach, //
    },
    provider::{
        p2pdma_page,
        Pinned,
        PAGE_SIZE, //
    },
    region::Registration,
    stats,
    submitter::Submitter,
    topology::{
        self,
        MapType, //
    },
    uapi,
    users::TransferCharge,
};

unsafe extern "C" {
    // `shim.c`; pointers to kernel structs whose bindgen types the `improper_ctypes` lint
    // rejects cross as `void *`: `kiocb`/`file`, `request_queue`.
    fn gdirect_init_sync_kiocb(kiocb: *mut c_void, file: *mut c_void);
    fn gdirect_blk_queue_pci_p2pdma(q: *mut c_void) -> bool;
    fn gdirect_get_capacity(disk: *mut c_void) -> u64;
    fn gdirect_fileattr_xflags(file: *mut c_void) -> i64;
    fn gdirect_page_address(page: *mut c_void) -> *mut c_void;
}

/// The most bytes a direct transfer moves under one use of the registration's pages: bounds how
/// long a revocation waits for a transfer in flight (one chunk's I/O: about 2 ms on a 4 GB/s
/// drive, 250 ms on the rig's 32 MB/s namespace), while keeping enough requests in flight per
/// chunk to fill a drive's queue.
const DIRECT_CHUNK: u64 = 8 << 20;

/// The direction of a transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

impl Dir {
    /// Index in the statistics: 0 read, 1 write.
    pub(crate) fn index(self) -> usize {
        match self {
            Self::Read => 0,
            Self::Write => 1,
        }
    }
}

/// What a transfer did.
pub(crate) struct Outcome {
    pub(crate) bytes: u64,
    pub(crate) path: u32,
    pub(crate) reason: u32,
    pub(crate) transport: u32,
    pub(crate) eof: bool,
    pub(crate) bounce_bytes: u64,
}

/// The smallest logical block there is. (Evaluated at build time: no panic path.)
const SECTOR: NonZeroU64 = NonZeroU64::new(512).unwrap();

/// The block device behind a file, as far as the data path cares. Found once per transfer, when
/// it is checked; its pointers stay valid while the transfer holds the file.
struct Target {
    logical_block_size: NonZeroU64,
    /// The disk's queue: whether it takes P2PDMA pages is read again when the transfer runs.
    queue: *mut bindings::request_queue,
    /// The PCI device that DMAs for the storage (the NVMe controller), if one is found.
    dma_dev: Option<ARef<pci::Device>>,
    /// The paths of an NVMe multipath head (`dma_dev` is then `None`).
    paths: Option<Paths>,
    /// `GDIRECT_TRANSPORT_*`.
    transport: u32,
    /// The disk, for telling a device that went away from one that ended.
    disk: *mut bindings::gendisk,
    /// The disk's size in sectors now.
    sectors: u64,
    /// A regular file (on a file system), not a block device.
    regular: bool,
    /// A regular file whose data is not on the file system's block device (see
    /// [`data_elsewhere`]): the other facts are not about the device that does the I/O.
    data_elsewhere: bool,
}

// SAFETY: the disk and queue pointers are only dereferenced while the transfer that holds this
// value holds the open file, whose block device holds them; they may be used from any thread.
unsafe impl Send for Target {}
// SAFETY: as above; shared references only read through them.
unsafe impl Sync for Target {}

/// Transports of the disks used lately, by `diskseq` (unique per disk and per media change,
/// never reused): `diskseq << 8 | transport`, 0 for none, direct-mapped by `diskseq % 8`. Reading
/// the controller's `transport` attribute costs a page and a scan of attribute groups, which a
/// 4 KiB read should not pay each time.
static TRANSPORTS: [Atomic<u64>; 8] = [const { Atomic::new(0) }; 8];

/// The transport of `disk`, whose device is `disk_dev` (see [`TRANSPORTS`]). An answer made
/// without the attribute because a page could not be allocated is reported, not cached.
pub(crate) fn transport_of(
    disk: *mut bindings::gendisk,
    disk_dev: *mut bindings::device,
    pci: bool,
) -> u32 {
    // SAFETY: the disk of an open file's block device outlives the file; `diskseq` is set
    // before the disk is added and changes only with its media.
    let seq = unsafe { (*disk).diskseq };
    let slot = &TRANSPORTS[(seq % TRANSPORTS.len() as u64) as usize];
    let cached = slot.load(Relaxed);
    if cached != 0 && cached >> 8 == seq {
        return (cached & 0xff) as u32;
    }
    let found = nvme_transport(disk_dev);
    let transport = match found {
        Ok(Some(t)) => t,
        _ if pci => uapi::TRANSPORT_PCIE,
        _ => uapi::TRANSPORT_UNKNOWN,
    };
    if found.is_ok() {
        slot.store(seq << 8 | u64::from(transport & 0xff), Relaxed);
    }
    transport
}

/// The PCI device that DMAs for `disk` (whose device is `disk_dev`) and its transport: the NVMe
/// controller's PCI function, or for NVMe-oF over RDMA the adapter the connection goes through
/// (`fabric::rnic_of`); none for other fabrics (TCP: the CPU copies).
///
/// # Safety
///
/// `disk` and `disk_dev` (with its ancestors) are valid for the call.
pub(crate) unsafe fn dma_device_of(
    disk: *mut bindings::gendisk,
    disk_dev: *mut bindings::device,
) -> (Option<ARef<pci::Device>>, u32) {
    let dma_dev = pci_ancestor(disk_dev);
    let transport = transport_of(disk, disk_dev, dma_dev.is_some());
    if dma_dev.is_some() || transport != uapi::TRANSPORT_RDMA {
        return (dma_dev, transport);
    }
    // SAFETY: as above.
    (unsafe { fabric::rnic_of(disk_dev) }, transport)
}

impl Target {
    /// The target of an open file: its block device, or the one its file system lives on.
    fn of(file: &File) -> Result<Self> {
        let f = file.as_ptr();
        // SAFETY: `file` is a valid, referenced file; its inode and superblock live as long.
        let (bdev, regular) = unsafe {
            let inode = (*f).f_inode;
            let fmt = u32::from((*inode).i_mode) & bindings::S_IFMT;
            if fmt == bindings::S_IFBLK {
                // The device node's inode is the file system's; the block device's inode is
                // the mapping's host (`bdev_file_inode()`).
                (bindings::I_BDEV((*(*f).f_mapping).host), false)
            } else if fmt == bindings::S_IFREG {
                ((*(*inode).i_sb).s_bdev, true)
            } else {
                (core::ptr::null_mut(), false)
            }
        };
        if bdev.is_null() {
            return Err(ENOTBLK);
        }
        // SAFETY: the block device of an open file, with its disk and queue, outlives the file.
        let (queue, disk_dev) = unsafe {
            let disk = (*bdev).bd_disk;
            ((*disk).queue, &raw mut (*(*disk).part0).bd_device)
        };
        // SAFETY: as above.
        let logical_block_size =
            NonZeroU64::new(u64::from(unsafe { (*queue).limits.logical_block_size }))
                .map_or(SECTOR, |lbs| lbs.max(SECTOR));
        // SAFETY: as above.
        let disk = unsafe { (*bdev).bd_disk };
        // SAFETY: as above.
        let paths = unsafe { multipath::paths_of(disk_dev) }?;
        // SAFETY: `file` is a valid, referenced file.
        let data_elsewhere = regular && unsafe { data_elsewhere(f) };
        let (dma_dev, transport) = match &paths {
            _ if data_elsewhere => (None, uapi::TRANSPORT_UNKNOWN),
            Some(p) => (None, p.transport),
            // SAFETY: the disk of an open file's block device, and its device, outlive the file.
            None => unsafe { dma_device_of(disk, disk_dev) },
        };
        // SAFETY: as above.
        let sectors = unsafe { gdirect_get_capacity(disk.cast()) };
        Ok(Self {
            logical_block_size,
            queue,
            dma_dev,
            paths,
            transport,
            disk,
            sectors,
            regular,
            data_elsewhere,
        })
    }

    /// `ENODEV` if the disk has gone away (deleted, hot-removed), or is going: a driver removing
    /// a disk first sets its size to zero (`nvme_ns_remove()`), and a read in that window ends
    /// early as if at the end of the device. `sectors` is the size when the request was checked:
    /// a queued request can start after the size went to zero, and it must not take that zero
    /// for the size it was submitted against.
    fn check_live(&self) -> Result {
        // SAFETY: the disk of an open file's block device outlives the file.
        let live = unsafe { bindings::disk_live(self.disk) };
        // SAFETY: as above.
        let emptied = self.sectors != 0 && unsafe { gdirect_get_capacity(self.disk.cast()) } == 0;
        if live && !emptied {
            Ok(())
        } else {
            Err(ENODEV)
        }
    }
}

/// The transport of the NVMe controller at or above `dev`, from the controller's own
/// `transport` attribute (`nvme_sysfs_show_transport`): the driver-model way to ask it, since
/// `struct nvme_ctrl` is private to the NVMe core.
fn nvme_transport(dev: *mut bindings::device) -> Result<Option<u32>> {
    // SAFETY: `dev` and its ancestors are valid while the disk below them is.
    unsafe {
        ancestor_attr(dev, c"transport", |text| {
            match text.split(|b| *b == b'\n').next().unwrap_or(&[]) {
                b"pcie" => uapi::TRANSPORT_PCIE,
                b"rdma" => uapi::TRANSPORT_RDMA,
                b"tcp" => uapi::TRANSPORT_TCP,
                b"loop" => uapi::TRANSPORT_LOOP,
                b"fc" => uapi::TRANSPORT_FC,
                _ => uapi::TRANSPORT_UNKNOWN,
            }
        })
    }
}

/// `parse` applied to the text of the device attribute `name` of the nearest device at or above
/// `dev` that has one (an NVMe controller's `transport` or `address`, for a disk below it).
/// `None` when no device on the way has it, or its show function gives nothing.
///
/// # Safety
///
/// `dev` and its ancestors are valid for the call.
pub(crate) unsafe fn ancestor_attr<R>(
    mut dev: *mut bindings::device,
    name: &CStr,
    parse: impl FnOnce(&[u8]) -> R,
) -> Result<Option<R>> {
    let page = kernel::page::Page::alloc_page(GFP_KERNEL)?;
    while !dev.is_null() {
        // SAFETY: `dev` is valid (see the safety section).
        if let Some(attr) = unsafe { device_attr(dev, name) } {
            // SAFETY: `attr` is an attribute of `dev`, which lives as long.
            let Some(show) = (unsafe { (*attr).__bindgen_anon_1.show }) else {
                return Ok(None);
            };
            // SAFETY: the page is ours, mapped, and a page long.
            let buf = unsafe { gdirect_page_address(page.as_ptr().cast()) }.cast::<u8>();
            // SAFETY: a show function writes at most a page into `buf`.
            let n = unsafe { show(dev, attr, buf.cast()) };
            if n <= 0 {
                return Ok(None);
            }
            // SAFETY: the show function wrote `n` bytes (at most a page) into `buf`.
            let text =
                unsafe { core::slice::from_raw_parts(buf, (n as usize).min(PAGE_SIZE as usize)) };
            return Ok(Some(parse(text)));
        }
        // SAFETY: as above.
        dev = unsafe { (*dev).parent };
    }
    Ok(None)
}

/// The device attribute `name` among `dev`'s attribute groups, if it has one that sysfs shows:
/// an attribute its group's `is_visible` hides (an NVMe controller's `address` when its
/// transport has no `get_address`, as nvme-loop) may have a show function that cannot run.
///
/// # Safety
///
/// `dev` is a valid device.
unsafe fn device_attr(
    dev: *mut bindings::device,
    name: &CStr,
) -> Option<*mut bindings::device_attribute> {
    // SAFETY: the groups of a registered device are NULL-terminated arrays of valid groups,
    // whose attribute arrays are NULL-terminated too, and live as long as the device; a
    // group's `is_visible` takes the device's kobject, an attribute of the group and its index.
    unsafe {
        let mut groups = (*dev).groups;
        while !groups.is_null() && !(*groups).is_null() {
            let group = *groups;
            let mut attrs = (*group).__bindgen_anon_2.attrs;
            let mut n = 0;
            while !attrs.is_null() && !(*attrs).is_null() {
                let attr = *attrs;
                if !(*attr).name.is_null() && CStr::from_char_ptr((*attr).name) == name {
                    // As sysfs decides it (`create_files()`): a mode of 0, past the group flag, hides.
                    let shown = match (*group).__bindgen_anon_1.is_visible {
                        Some(is_visible) => {
                            is_visible(&raw mut (*dev).kobj, attr, n)
                                & !(bindings::SYSFS_GROUP_INVISIBLE as u16)
                                != 0
                        }
                        None => true,
                    };
                    return shown
                        .then(|| kernel::container_of!(attr, bindings::device_attribute, attr));
                }
                attrs = attrs.add(1);
                n += 1;
            }
            groups = groups.add(1);
        }
    }
    None
}

/// Whether the data of the regular file `f` may be on another block device than its super
/// block's: an XFS realtime file (`FS_XFLAG_REALTIME`) keeps it on the file system's realtime
/// device, which only XFS knows. Only XFS is asked, so other file systems pay nothing; a question
/// XFS does not answer counts as yes, since the bounce path is right for any device.
///
/// # Safety
///
/// `f` is a valid, referenced regular file.
unsafe fn data_elsewhere(f: *mut bindings::file) -> bool {
    // SAFETY: a referenced file's inode, super block and file system type (whose name is a
    // static string) live as long as the file.
    unsafe {
        let sb = (*(*f).f_inode).i_sb;
        if CStr::from_char_ptr((*(*sb).s_type).name) != c"xfs" {
            return false;
        }
        let xflags = gdirect_fileattr_xflags(f.cast());
        xflags < 0 || xflags & i64::from(bindings::FS_XFLAG_REALTIME) != 0
    }
}

/// Whether `queue` takes P2PDMA pages (`BLK_FEAT_PCI_P2PDMA`).
///
/// # Safety
///
/// `queue` is the queue of a disk that stays registered for the call.
pub(crate) unsafe fn queue_takes_p2p(queue: *mut bindings::request_queue) -> bool {
    // SAFETY: see the function's safety section.
    unsafe { gdirect_blk_queue_pci_p2pdma(queue.cast()) }
}

/// The nearest PCI device at or above `dev` in the device tree, with a reference.
pub(crate) fn pci_ancestor(mut dev: *mut bindings::device) -> Option<ARef<pci::Device>> {
    while !dev.is_null() {
        // SAFETY: `dev` and its ancestors are valid while the disk below them is.
        if unsafe { (*dev).bus } == (&raw const bindings::pci_bus_type).cast_mut() {
            // SAFETY: a device on the PCI bus is embedded in a `pci_dev`.
            let pdev = unsafe { kernel::container_of!(dev, bindings::pci_dev, dev) };
            // SAFETY: `pci::Device` is a transparent wrapper of `pci_dev`, valid (see above).
            let pdev: &pci::Device = unsafe { &*pdev.cast::<pci::Device>() };
            return Some(ARef::from(pdev));
        }
        // SAFETY: as above.
        dev = unsafe { (*dev).parent };
    }
    None
}

/// A validated transfer, ready to run (now, or on the module's workqueue).
pub(crate) struct Transfer {
    dir: Dir,
    reg: Arc<Registration>,
    file: ARef<File>,
    buf_offset: u64,
    file_offset: u64,
    len: u64,
    force_bounce: bool,
    /// The file's block device, as it was when the request was checked (its size then: see
    /// `Target::check_live`).
    target: Target,
    /// For a batch's transfer: the task whose identity it runs under (`None`: the caller's).
    submitter: Option<Arc<Submitter>>,
}

impl Transfer {
    /// Checks a request against the registration and the file (errnos: see the uapi header).
    pub(crate) fn new(
        dir: Dir,
        reg: Arc<Registration>,
        fd: i32,
        buf_offset: u64,
        file_offset: u64,
        len: u64,
        flags: u32,
        submitter: Option<Arc<Submitter>>,
    ) -> Result<Self> {
        if flags & !uapi::IO_FLAGS != 0 || len == 0 {
            return Err(EINVAL);
        }
        if buf_offset.checked_add(len).is_none_or(|end| end > reg.len) {
            return Err(EOVERFLOW);
        }
        let fd = u32::try_from(fd).map_err(|_| EBADF)?;
        let local = LocalFile::fget(fd).map_err(|_| EBADF)?;
        // SAFETY: called from an ioctl of another file: this thread holds no `fdget_pos` on `fd`.
        let file = unsafe { LocalFile::assume_no_fdget_pos(local) };
        if file.flags() & file::flags::O_DIRECT == 0 {
            return Err(error::not_direct());
        }
        let access = file.flags() & file::flags::O_ACCMODE;
        let allowed = match dir {
            Dir::Read => access != file::flags::O_WRONLY,
            Dir::Write => access != file::flags::O_RDONLY,
        };
        if !allowed {
            return Err(EBADF);
        }
        let target = Target::of(&file)?;
        let lbs = target.logical_block_size;
        // `u64 % NonZeroU64`: no division-by-zero check, no panic path.
        if file_offset % lbs != 0 || buf_offset % lbs != 0 || len % lbs != 0 {
            return Err(ERANGE);
        }
        Ok(Self {
            dir,
            reg,
            file,
            buf_offset,
            file_offset,
            len,
            force_bounce: flags & uapi::IO_FORCE_BOUNCE != 0,
            target,
            submitter,
        })
    }

    /// Runs the transfer, under its submitter's identity for a batch's, and records it in the
    /// statistics.
    /// Counts the transfer against its registration's user (`max_in_flight_per_user`), until
    /// the charge is dropped.
    pub(crate) fn charge_user(&self) -> Result<TransferCharge> {
        self.reg.user.start_transfer()
    }

    pub(crate) fn run(&self) -> (u32, Result<Outcome>) {
        match &self.submitter {
            Some(s) => s.run(|| self.run_here()),
            None => self.run_here(),
        }
    }

    /// The bytes to move: all of them, but for a batch's write to a regular file, what the
    /// submitter's file size limit allows (the caller's own write has the kernel check it).
    fn len(&self) -> Result<u64> {
        match &self.submitter {
            Some(s) if self.dir == Dir::Write && self.target.regular => {
                s.write_limit(self.file_offset, self.len)
            }
            _ => Ok(self.len),
        }
    }

    fn run_here(&self) -> (u32, Result<Outcome>) {
        let _active = stats::ActiveTransfer::new();
        // SAFETY: no preconditions.
        let start = unsafe { bindings::ktime_get() };
        let target = &self.target;
        let (path, reason, transport) = match self.decide(target) {
            Ok(d) => d,
            Err(e) => return (path::PATH_BOUNCE, Err(e)),
        };
        let result = self
            .len()
            .and_then(|len| match path {
                path::PATH_BOUNCE => self.bounce(len),
                _ => self.direct(len),
            })
            // A read that came back short because the device went away is a failure, not an end
            // of file: report no bytes as transferred.
            .and_then(|(bytes, eof, bounced)| match eof {
                true => target.check_live().map(|()| (bytes, eof, bounced)),
                false => Ok((bytes, eof, bounced)),
            })
            .map(|(bytes, eof, bounce_bytes)| Outcome {
                bytes,
                path,
                reason,
                transport,
                eof,
                bounce_bytes,
            });
        // SAFETY: no preconditions.
        let ns = unsafe { bindings::ktime_get() } - start;
        stats::record_io(path, self.dir, reason, &result, ns);
        (path, result)
    }

    /// The path, the reason for it, and the transport.
    fn decide(&self, target: &Target) -> Result<(u32, u32, u32)> {
        target.check_live()?;
        let memory = {
            let _use = self.reg.shared.begin_use()?;
            memory_kind(&self.reg)
        };
        let reach = match (&target.paths, &target.dma_dev) {
            (Some(paths), _) => paths.reach(|dev| self.reach_from(dev)),
            (None, Some(dev)) => self.reach_from(dev),
            (None, None) => Reach::Unknown,
        };
        // SAFETY: the queue of an open file's block device outlives the file.
        let queue_p2p = unsafe { queue_takes_p2p(target.queue) };
        let (path, reason) = path::decide(Facts {
            force_bounce: self.force_bounce,
            memory,
            data_elsewhere: target.data_elsewhere,
            queue_p2p,
            path_p2p: target.paths.as_ref().is_some_and(|p| p.p2p > 0),
            reach,
        });
        Ok((path, reason, target.transport))
    }

    /// How the storage's DMA device `dev` reaches the registration's memory.
    fn reach_from(&self, dev: &ARef<pci::Device>) -> Reach {
        let Some(owner) = &self.reg.owner else {
            return Reach::Supported;
        };
        // The PCI topology is looked at once per (memory, storage device) pair.
        match self
            .reg
            .shared
            .cached_map_type(dev, || topology::map_type(&owner.dev, dev))
        {
            MapType::NotSupported => Reach::NotSupported,
            MapType::BusAddr | MapType::ThruHostBridge => Reach::Supported,
        }
    }

    /// DMA straight between the file and the registration's pages, [`DIRECT_CHUNK`] bytes at a
    /// time, each under its own use of the pages: a revocation (`cudaFree`) waits for the chunk
    /// in flight, not for the rest of the transfer, which then fails with `EKEYREVOKED`. The
    /// chunks of all the transfers on one registration stay within `max_in_flight_bytes`, so a
    /// revocation waits for that much storage I/O at most.
    fn direct(&self, len: u64) -> Result<(u64, bool, u64)> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(DIRECT_CHUNK);
            let got = {
                // Room in the user's share of the storage first, then in the registration's
                // (what a revocation waits for): neither is held while the other is awaited.
                let _io = self.reg.user.start_io(n)?;
                let _use = self.reg.shared.begin_io(n)?;
                let bvecs = bvecs(&self.reg, self.buf_offset + done, n)?;
                direct_io(
                    &self.file,
                    self.dir,
                    self.file_offset + done,
                    bvecs.as_slice(),
                    n,
                )?
            };
            done += got;
            if got < n {
                return Ok((done, self.dir == Dir::Read, 0));
            }
        }
        Ok((done, false, 0))
    }

    /// Through the bounce pool, one chunk at a time.
    fn bounce(&self, len: u64) -> Result<(u64, bool, u64)> {
        let pool = bounce::pool()?;
        let mut done = 0;
        while done < len {
            let chunk = pool.acquire(&self.reg.user)?;
            let n = (len - done).min(chunk.capacity());
            let (pos, buf) = (self.file_offset + done, self.buf_offset + done);
            let moved = match self.dir {
                Dir::Read => {
                    let bvecs = chunk.bvecs(n)?;
                    let got = {
                        let _io = self.reg.user.start_io(n)?;
                        direct_io(&self.file, Dir::Read, pos, bvecs.as_slice(), n)?
                    };
                    let _use = self.reg.shared.begin_use()?;
                    copy_device(&self.reg, buf, got, |off, dev, n| {
                        // SAFETY: `dev` addresses `n` bytes of mapped memory (`copy_device`).
                        unsafe { chunk.copy_out(off, dev, n) }
                    })?;
                    got
                }
                Dir::Write => {
                    {
                        let _use = self.reg.shared.begin_use()?;
                        copy_device(&self.reg, buf, n, |off, dev, len| {
                            // SAFETY: `dev` addresses `len` bytes of mapped memory (`copy_device`).
                            unsafe { chunk.copy_in(off, dev, len) }
                        })?;
                    }
                    let bvecs = chunk.bvecs(n)?;
                    let _io = self.reg.user.start_io(n)?;
                    direct_io(&self.file, Dir::Write, pos, bvecs.as_slice(), n)?
                }
            };
            done += moved;
            if moved < n {
                return Ok((done, self.dir == Dir::Read, done));
            }
        }
        Ok((done, false, done))
    }
}

/// What the decision needs to know of the registered memory. The caller holds a use.
fn memory_kind(reg: &Registration) -> Memory {
    match &reg.pinned {
        Pinned::User(_) if reg.owner.is_none() => Memory::Host,
        // The p2pdma provider only accepts P2PDMA pages.
        Pinned::User(_) => Memory::DevicePages,
        // `REGISTER` accepts only GPU memory whose every page is a P2PDMA page.
        Pinned::Nvidia(nv) => match nv.phys(0).and_then(p2pdma_page) {
            Some(_) => Memory::DevicePages,
            None => Memory::DeviceNoPages,
        },
    }
}

/// The CPU page holding byte `off` of a registration, and the offset in it. The caller holds a
/// use of the pages.
fn page_at(reg: &Registration, off: u64) -> Result<(*mut bindings::page, u32)> {
    let in_page = (off % PAGE_SIZE) as u32;
    let page = match &reg.pinned {
        Pinned::User(u) => u.page((off / PAGE_SIZE) as usize),
        Pinned::Nvidia(nv) => {
            let within = off % reg.page_size - u64::from(in_page);
            nv.phys((off / reg.page_size) as usize)
                .and_then(|p| p2pdma_page(p + within))
        }
    };
    Ok((page.ok_or(EFAULT)?, in_page))
}

/// Bvecs that fit on the stack: a transfer of up to 16 KiB builds its bvecs without an
/// allocation (measured in the rig: allocating them took a tenth of a 4 KiB read's time).
const INLINE_BVECS: usize = 4;

/// The bvecs of one chunk of a transfer: on the stack when few, else allocated.
pub(crate) enum Bvecs {
    Inline([bindings::bio_vec; INLINE_BVECS], usize),
    Heap(KVVec<bindings::bio_vec>),
}

impl Bvecs {
    /// `count` bvecs, each from `next`.
    pub(crate) fn build(
        count: usize,
        mut next: impl FnMut() -> Result<bindings::bio_vec>,
    ) -> Result<Self> {
        if count <= INLINE_BVECS {
            let mut v = [bindings::bio_vec {
                bv_page: core::ptr::null_mut(),
                bv_len: 0,
                bv_offset: 0,
            }; INLINE_BVECS];
            for slot in v.iter_mut().take(count) {
                *slot = next()?;
            }
            return Ok(Self::Inline(v, count));
        }
        let mut v = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
        for _ in 0..count {
            v.push(next()?, GFP_KERNEL_ACCOUNT)?;
        }
        Ok(Self::Heap(v))
    }

    pub(crate) fn as_slice(&self) -> &[bindings::bio_vec] {
        match self {
            // `n <= INLINE_BVECS` by construction; `get` keeps that from being a panic path.
            Self::Inline(v, n) => v.get(..*n).unwrap_or(&[]),
            Self::Heap(v) => v,
        }
    }
}

/// Bvecs over `[off, off + len)` of a registration, one per CPU page it spans. The caller holds
/// a use of the pages.
fn bvecs(reg: &Registration, off: u64, len: u64) -> Result<Bvecs> {
    let end = off + len;
    let pages = (end.div_ceil(PAGE_SIZE) - off / PAGE_SIZE) as usize;
    let mut at = off;
    Bvecs::build(pages, || {
        let (page, in_page) = page_at(reg, at)?;
        let n = (PAGE_SIZE - u64::from(in_page)).min(end - at);
        at += n;
        Ok(bindings::bio_vec {
            bv_page: page,
            bv_len: n as u32,
            bv_offset: in_page,
        })
    })
}

/// Runs `f(offset_in_chunk, device, n)` over `[off, off + len)` of a registration, one CPU page
/// at a time: `device` addresses `n` bytes of the memory, mapped for the CPU. The caller holds a
/// use of the pages. A raw pointer, never a slice: the memory (a GPU's BAR, P2PDMA memory, host
/// pages that user space maps too) may be written by a device or a task meanwhile, which a
/// `&mut [u8]` over it would promise cannot happen.
fn copy_device(
    reg: &Registration,
    off: u64,
    len: u64,
    mut f: impl FnMut(u64, *mut u8, usize),
) -> Result {
    let mut done = 0;
    while done < len {
        let (page, in_page) = page_at(reg, off + done)?;
        let n = (PAGE_SIZE - u64::from(in_page)).min(len - done);
        // SAFETY: `page` is pinned (or P2PDMA memory held by its provider) and mapped in the
        // kernel's direct map.
        let base = unsafe { gdirect_page_address(page.cast()) }.cast::<u8>();
        if base.is_null() {
            return Err(EFAULT);
        }
        // `in_page + n` stays within the page.
        f(done, base.wrapping_add(in_page as usize), n as usize);
        done += n;
    }
    Ok(())
}

/// One synchronous direct I/O of `len` bytes at `pos` over `bvecs`.
pub(crate) fn direct_io(
    file: &File,
    dir: Dir,
    pos: u64,
    bvecs: &[bindings::bio_vec],
    len: u64,
) -> Result<u64> {
    let pos = i64::try_from(pos).map_err(|_| EOVERFLOW)?;
    // SAFETY: `kiocb` and `iov_iter` are plain C structs for which all zeros is a valid start;
    // both are then initialized by the kernel's own functions.
    let mut kiocb: bindings::kiocb = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut iter: bindings::iov_iter = unsafe { core::mem::zeroed() };
    // SAFETY: `kiocb` is writable; `file` is a valid, referenced file.
    unsafe { gdirect_init_sync_kiocb((&raw mut kiocb).cast(), file.as_ptr().cast()) };
    kiocb.ki_pos = pos;
    let direction = match dir {
        Dir::Read => bindings::ITER_DEST,
        Dir::Write => bindings::ITER_SOURCE,
    };
    // SAFETY: `bvecs` lives until the synchronous I/O below returns; `len` is their total.
    unsafe {
        bindings::iov_iter_bvec(
            &mut iter,
            direction as _,
            bvecs.as_ptr(),
            bvecs.len(),
            len as usize,
        )
    };
    // SAFETY: `kiocb` was initialized for `file` without a completion callback, so the call
    // returns only when the I/O is done; `iter` describes `bvecs`.
    let ret = unsafe {
        match dir {
            Dir::Read => bindings::vfs_iocb_iter_read(file.as_ptr(), &mut kiocb, &mut iter),
            Dir::Write => bindings::vfs_iocb_iter_write(file.as_ptr(), &mut kiocb, &mut iter),
        }
    };
    if ret < 0 {
        return Err(Error::from_errno(ret as i32));
    }
    Ok(ret as u64)
}
