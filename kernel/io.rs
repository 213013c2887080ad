// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Transfers between files and registered memory: the data path.
//!
//! A [`Transfer`] reads from a file into a registration or writes from one into a file, through
//! the file's own direct I/O (`dio`), with the permission checks the file system made when the
//! caller opened the file with `O_DIRECT`.
//!
//! Before anything is submitted the path is decided from facts (`path.rs`): the block queue's
//! `BLK_FEAT_PCI_P2PDMA` (the block layer does not check kernel-built bvecs itself), whether the
//! memory has P2P pages, and the PCI reach from the storage's DMA device (`storage`, `fabric`,
//! `multipath`) to the memory. P2P and host transfers DMA straight into the registration's
//! pages (`memory` builds their bvecs); bounce transfers go through the module's pool of host
//! pages (`bounce`) and a CPU copy.
//!
//! A transfer holds a use of the registration's pages (`revocation::UseGuard`) for as long as
//! DMA or a copy may touch them, one bounded chunk at a time, so a revocation waits for the
//! chunk in flight (not the whole transfer), and nothing is written into memory after its
//! revocation returns. The chunks of storage I/O are counted against the user's share of the
//! storage and the registration's cap (`max_in_flight_bytes_per_user`, `max_in_flight_bytes`).
//!
//! This is the top of the data path: `batch` and `file` run transfers; nothing here is imported
//! below it. A direct chunk takes room in the user's share of the storage (`users`' gate), then
//! a use of the pages with its size (`RegShared::inner`); a bounced chunk takes a chunk of the
//! pool first (`bounce`), then a plain use for its copy and room in the user's share for its I/O
//! (a write's copy before its I/O, a read's after), one at a time. Either waits for a busy inode
//! lock or a freeze with none of them held (`dio::wait_elsewhere`). Each lock is held only to
//! count or to wait (a condition variable lets it go), never two at once, and none across the
//! I/O itself.

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
        Arc, //
    },
    time::{
        Instant,
        Monotonic, //
    },
};

use crate::{
    bounce,
    dio::{
        direct_io,
        file_nowait,
        held_elsewhere,
        notify,
        open_for,
        settle,
        times_stale,
        touch,
        verify,
        wait_elsewhere,
        write_limits,
        Dir,
        Wait, //
    },
    error, fabric,
    memory::{
        bvecs,
        copy_device,
        memory_kind, //
    },
    multipath::{self, Paths},
    path::{
        self,
        Facts,
        Memory,
        Reach, //
    },
    region::Registration,
    stats,
    storage::queue_takes_p2p,
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
    // rejects cross as `void *`: `gendisk`, `file`.
    fn gdirect_get_capacity(disk: *mut c_void) -> u64;
    fn gdirect_fileattr_xflags(file: *mut c_void) -> i64;
}

/// The most bytes a direct transfer moves under one use of the registration's pages: bounds how
/// long a revocation waits for a transfer in flight (one chunk's I/O: about 2 ms on a 4 GB/s
/// drive, 250 ms on the rig's 32 MB/s namespace), while keeping enough requests in flight per
/// chunk to fill a drive's queue.
const DIRECT_CHUNK: u64 = 8 << 20;

/// How many times a chunk refused by the file system for a wait ([`Wait::NoWait`]) has what it
/// waits for done without a use ([`settle`]) and is tried again before it goes through the
/// bounce pool.
const SETTLES: u32 = 3;

/// How many more times a write's chunk so refused is tried again, its times only updated again
/// ([`touch`]), where they are stale ([`times_stale`]): updated right before each try (XFS
/// refuses to update them without waiting), they are stale again by the time the write looks
/// at them when the clock ticks in between, which a busy machine that deschedules the task
/// there makes likely (the rig saw a whole write bounce so, its three settles each met a tick).
const TOUCHES: u32 = 8;

/// How many times a chunk refused at a busy inode lock waits for the lock without what it holds
/// (a direct chunk its use of the memory, a bounced chunk its chunk of the pool) and is tried
/// again, before bytes move; then a direct chunk goes on as any refused one (its settles, a
/// write's halves, then the bounce pool) and a bounced chunk's I/O waits with its chunk held:
/// another task that takes the lock again each time in between must win every race.
const LOCK_WAITS: u32 = 8;

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
    /// A regular file's block (`i_blkbits`), the unit of its extents, at least the logical block;
    /// a block device's logical block.
    fs_block: NonZeroU64,
    /// A regular file whose data is not on the file system's block device (see
    /// [`data_elsewhere`]): the other facts are not about the device that does the I/O.
    data_elsewhere: bool,
}

// SAFETY: the disk and queue pointers are only dereferenced while the transfer that holds this
// value holds the open file, whose block device holds them; they may be used from any thread.
unsafe impl Send for Target {}
// SAFETY: as above; shared references only read through them.
unsafe impl Sync for Target {}

impl Target {
    /// The target of an open file: its block device, or the one its file system lives on.
    fn of(file: &File) -> Result<Self> {
        let f = file.as_ptr();
        // SAFETY: `file` is a valid, referenced file; its inode and superblock live as long.
        let (bdev, regular, blkbits) = unsafe {
            let inode = (*f).f_inode;
            let blkbits = (*inode).i_blkbits;
            let fmt = u32::from((*inode).i_mode) & bindings::S_IFMT;
            if fmt == bindings::S_IFBLK {
                // The device node's inode is the file system's; the block device's inode is
                // the mapping's host (`bdev_file_inode()`).
                (bindings::I_BDEV((*(*f).f_mapping).host), false, blkbits)
            } else if fmt == bindings::S_IFREG {
                ((*(*inode).i_sb).s_bdev, true, blkbits)
            } else {
                (core::ptr::null_mut(), false, blkbits)
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
        // A block device node's `i_blkbits` is its own file system's, not the device's.
        let fs_block = 1u64
            .checked_shl(u32::from(blkbits))
            .and_then(NonZeroU64::new)
            .filter(|_| regular)
            .map_or(logical_block_size, |b| b.max(logical_block_size));
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
            None => unsafe { fabric::dma_device_of(disk, disk_dev) },
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
            fs_block,
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

/// Whether the data of the regular file `f` may be on another block device than its super
/// block's: on a file system other than ext4 and XFS (btrfs and f2fs may spread a file over
/// several devices, and `s_bdev` is only one of them), or in an XFS realtime file
/// (`FS_XFLAG_REALTIME`), kept on the file system's realtime device, which only XFS knows. A
/// question XFS does not answer counts as yes, since the bounce path is right for any device.
///
/// # Safety
///
/// `f` is a valid, referenced regular file.
unsafe fn data_elsewhere(f: *mut bindings::file) -> bool {
    // SAFETY: a referenced file's inode, super block and file system type (whose name is a
    // static string) live as long as the file.
    unsafe {
        let sb = (*(*f).f_inode).i_sb;
        let fs = CStr::from_char_ptr((*(*sb).s_type).name);
        if fs == c"ext4" {
            return false;
        }
        if fs != c"xfs" {
            return true;
        }
        let xflags = gdirect_fileattr_xflags(f.cast());
        xflags < 0 || xflags & i64::from(bindings::FS_XFLAG_REALTIME) != 0
    }
}

/// Whether the file system does no direct I/O for this transfer of the regular file `f` (`dir`,
/// `len` bytes at `pos` of the file and `buf_offset` of the memory), and would serve the chunks'
/// `IOCB_DIRECT` through the page cache, the CPU copying between it and the memory. Its
/// `STATX_DIOALIGN` answer tells: ext4 answers alignment 0 for a file whose data it journals
/// (`data=journal`, `chattr +j`), with fs-verity, inline data, or an encryption policy the block
/// layer cannot apply (`ext4_dio_alignment()`), and the block size for an encrypted file, whose
/// direct I/O off that alignment falls back to the page cache (`ext4_should_use_dio()`); XFS
/// answers a reflinked file's allocation unit as a write's offset alignment, under which it
/// writes through the page cache (`xfs_report_dioalign()`, `STATX_DIO_READ_ALIGN` for reads). The
/// chunks start at `pos` plus multiples of [`DIRECT_CHUNK`] (a multiple of any such alignment),
/// so the transfer's ends and memory offset decide. A file system that gives no answer, or an
/// error, counts as yes: the bounce path is right for any file. (Only ext4 and XFS files ask:
/// others are [`data_elsewhere`].)
///
/// # Safety
///
/// `f` is a valid, referenced regular file.
unsafe fn no_direct_io(
    f: *mut bindings::file,
    dir: Dir,
    pos: u64,
    len: u64,
    buf_offset: u64,
) -> bool {
    let mut stat = bindings::kstat::default();
    // SAFETY: a referenced file's path is valid for as long as the file; `stat` is a local the
    // file system fills in. No security check: the module asks for its own use, of a file the
    // caller opened.
    let err = unsafe {
        bindings::vfs_getattr_nosec(
            &raw const (*f).__bindgen_anon_1.f_path,
            &mut stat,
            bindings::STATX_DIOALIGN | bindings::STATX_DIO_READ_ALIGN,
            bindings::AT_STATX_DONT_SYNC,
        )
    };
    if err != 0 || stat.result_mask & bindings::STATX_DIOALIGN == 0 || stat.dio_mem_align == 0 {
        return true;
    }
    let read_align = stat.result_mask & bindings::STATX_DIO_READ_ALIGN != 0;
    let offset_align = match dir {
        Dir::Read if read_align && stat.dio_read_offset_align != 0 => stat.dio_read_offset_align,
        _ => stat.dio_offset_align,
    };
    let misaligned =
        |x: u64, align: u32| NonZeroU64::new(u64::from(align)).is_some_and(|a| x % a != 0);
    misaligned(pos | len, offset_align) || misaligned(buf_offset, stat.dio_mem_align)
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
        // Opened for this direction: the file's mode, not its access flags (the access mode 3
        // opens for neither).
        open_for(&file, dir)?;
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

    /// The bytes to move: `len`, but for a write to a regular file, what its limits allow: the
    /// submitter's file size limit for a batch's (`Submitter::write_limit`), then the limits
    /// the write's own checks apply ([`write_limits`]: the calling task's `RLIMIT_FSIZE`, the
    /// file system's largest file). Asked once, by the first chunk, after its waits for room
    /// and right before its storage I/O, where a `write()` of the task's own would check it
    /// (`generic_write_checks()`): a write held behind other I/O while its task `exec`s a new
    /// program does not signal that program. Each chunk's own write checks them again, but a
    /// chunk that started at a limit would fail (`EFBIG`, and `SIGXFSZ` to the caller) a
    /// write whose earlier chunks are in the file, which `write()` cuts short there.
    fn allowed(&self, len: u64) -> Result<u64> {
        if self.dir != Dir::Write || !self.target.regular {
            return Ok(len);
        }
        let len = match &self.submitter {
            Some(s) => s.write_limit(self.file_offset, len)?,
            None => len,
        };
        write_limits(&self.file, self.file_offset, len)
    }

    /// The transfer's `len` and a chunk's `n`, cut by [`Transfer::allowed`] when the chunk is
    /// the first (`done == 0`), unchanged for the others.
    fn limit_first(&self, done: u64, len: u64, n: u64) -> Result<(u64, u64)> {
        if done > 0 {
            return Ok((len, n));
        }
        let len = self.allowed(len)?;
        Ok((len, n.min(len)))
    }

    fn run_here(&self) -> (u32, Result<Outcome>) {
        let _active = stats::ActiveTransfer::new();
        let start = Instant::<Monotonic>::now();
        let target = &self.target;
        let (path, reason, transport) = match self.decide(target) {
            Ok(d) => d,
            Err(e) => return (path::PATH_BOUNCE, Err(e)),
        };
        let io = match path {
            path::PATH_BOUNCE => self.bounce(),
            _ => self.direct(),
        };
        let result = match io {
            // A transfer that failed or came back short (a read's end of file) because the
            // device went away is a failure of that, `ENODEV`, whatever the block layer made
            // of it (`EIO`, or `ENOSPC` for a write to a device whose capacity fell to 0): no
            // bytes are reported as transferred.
            Err(e) => Err(target.check_live().err().unwrap_or(e)),
            Ok((bytes, eof, bounced)) if eof || bytes < self.len => {
                target.check_live().map(|()| (bytes, eof, bounced))
            }
            ok => ok,
        }
        .map(|(bytes, eof, bounce_bytes)| Outcome {
            bytes,
            path,
            reason,
            transport,
            eof,
            bounce_bytes,
        });
        let ns = start.elapsed().as_nanos();
        let moved = result.as_ref().ok().map(|o| (o.bytes, o.bounce_bytes));
        stats::record_io(path, self.dir, reason, moved, ns);
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
        // Asked only where the answer can matter (a file's journal mode may change at any time:
        // asked as each transfer starts, not when it was checked).
        let no_direct_io = memory == Memory::DevicePages
            && target.regular
            && !target.data_elsewhere
            // SAFETY: the transfer holds its file, a regular file.
            && unsafe {
                no_direct_io(
                    self.file.as_ptr(),
                    self.dir,
                    self.file_offset,
                    self.len,
                    self.buf_offset,
                )
            };
        let (path, reason) = path::decide(Facts {
            force_bounce: self.force_bounce,
            memory,
            data_elsewhere: target.data_elsewhere,
            no_direct_io,
            queue_p2p,
            path_p2p: target.paths.as_ref().is_some_and(|p| p.p2p > 0),
            reach,
        });
        Ok((path, reason, target.transport))
    }

    /// `ENODEV` when the PCI function of the registration's memory is gone: a GPU that fell off
    /// the bus (a surprise removal the kernel has not acted on yet) reads all ones in its config
    /// space, and its BAR decodes nothing: writes into it are dropped (posted writes get no
    /// completion, so the storage device completes the command as if they landed) and reads of
    /// it return no data of its. Checked around each chunk, so that no transfer claims bytes
    /// that went nowhere, and no write puts what a dead BAR returned into the file where the
    /// check comes first.
    fn owner_present(&self) -> Result {
        let Some(owner) = &self.reg.owner else {
            return Ok(());
        };
        // SAFETY: `owner.dev` is a referenced PCI device; the call reads its vendor ID.
        if unsafe { bindings::pci_device_is_present(topology::raw_pci(&owner.dev)) } {
            Ok(())
        } else {
            Err(ENODEV)
        }
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
    ///
    /// A use must never wait on what another task holds: a free waits for it, under the GPU
    /// driver's lock, so a chunk stalled behind, say, the inode lock of a buffered write whose
    /// source page faults into a userfaultfd (or a FUSE file) of a stalled process would stall
    /// every CUDA process on the node. So a regular file's chunk is tried with
    /// [`Wait::NoWait`] (a write's times updated first, [`touch`]); where the file system would
    /// wait first (`EAGAIN`), the use is dropped; the inode lock held exclusive or awaited by
    /// another task (or a write's file system frozen, [`held_elsewhere`]) is waited for without
    /// it ([`wait_elsewhere`]) and the chunk tried directly again, up to [`LOCK_WAITS`] times;
    /// otherwise what the file system would wait for is done without one
    /// ([`settle`]: dirty page cache written back, a write's blocks allocated, since no file
    /// system lets an extending or allocating write through without waiting), and the chunk
    /// tried again, up to [`SETTLES`] times (a write whose times went stale in between only
    /// touched again, up to [`TOUCHES`] times more); a write refused still is tried in halves
    /// (one that crosses extents is refused whole), down to a block of the file system;
    /// refused at every size (XFS extents not read in, the lock taken again after each wait),
    /// one block goes through the bounce pool, whose file I/O holds no use and waits for it,
    /// and the rest is tried directly again; refused again before any of it moved directly, the
    /// chunk goes through the pool. Bounced bytes are reported (`bounce_bytes`). A block
    /// device's direct I/O takes no lock of its file to wait on.
    ///
    /// A short chunk ends a transfer (a read's end of file). A read's chunk tried without
    /// waiting may have stopped where the file system would have waited (ext4 without direct
    /// I/O for the file reads it through the page cache, and a page cache read that would wait
    /// stops there): the read goes on from there, and a chunk that moves nothing, or ends off
    /// a block boundary, ends it. (Such a file bounces whole, [`no_direct_io`]: this is for one
    /// whose journal mode changed, `chattr +j`, after its transfer's path was chosen.)
    fn direct(&self) -> Result<(u64, bool, u64)> {
        let (mut len, mut done, mut bounced) = (self.len, 0, 0);
        let wait = if self.target.regular {
            Wait::NoWait
        } else {
            Wait::Block
        };
        // Whether the last chunk refused at every size had one block go through the bounce
        // pool, not the whole chunk (see below).
        let mut waited = false;
        while done < len {
            let mut n = (len - done).min(DIRECT_CHUNK);
            let (mut settles, mut touches, mut lock_waits) = (0, 0, 0);
            // The permission checks with no use held, once a chunk (its tries move this range
            // or less): their fsnotify events wait for a listener's answer.
            let checked = verify(&self.file, self.dir, self.file_offset + done, n)?;
            let got = loop {
                // The memory's device checked with no use held: a free never waits for a config
                // read (which a dead link may answer only at its completion timeout).
                self.owner_present()?;
                if self.dir == Dir::Write && wait == Wait::NoWait {
                    // The times a write updates first, with no use held, as near the write as
                    // that allows.
                    touch(&self.file);
                }
                let got = {
                    // Room in the user's share of the storage first, then in the
                    // registration's (what a revocation waits for): neither is held while the
                    // other is awaited.
                    let _io = self.reg.user.start_io(n)?;
                    let _use = self.reg.shared.begin_io(n)?;
                    (len, n) = self.limit_first(done, len, n)?;
                    let bvecs = bvecs(&self.reg, self.buf_offset + done, n)?;
                    let pos = self.file_offset + done;
                    direct_io(&self.file, &checked, pos, bvecs.as_slice(), n, wait)
                };
                notify(&self.file, self.dir, &got);
                match got {
                    // A write to a file ext4 writes through the page cache (no direct I/O:
                    // its journal mode changed, `chattr +j`, after the path was chosen, see
                    // [`no_direct_io`]) refuses to be tried without waiting at all
                    // (`ext4_buffered_write_iter()`): through the bounce pool.
                    Err(e)
                        if e == error::fs_unsupported()
                            && wait == Wait::NoWait
                            && self.dir == Dir::Write =>
                    {
                        break None;
                    }
                    Err(e) if e == EAGAIN && wait == Wait::NoWait => {
                        if self.dir == Dir::Write && touches < TOUCHES && times_stale(&self.file) {
                            touches += 1;
                            continue;
                        }
                        // The inode lock held exclusive or awaited by another task (a writer, one
                        // stalled on a page fault into a userfaultfd for ever), or a write's file
                        // system frozen: waited for with the memory let go, as a bounced chunk
                        // waits for it without its chunk of the pool, and the chunk tried
                        // directly again, not sent through host memory.
                        if lock_waits < LOCK_WAITS && held_elsewhere(&self.file, self.dir) {
                            lock_waits += 1;
                            wait_elsewhere(&self.file, self.dir)?;
                            continue;
                        }
                        if settles < SETTLES {
                            settles += 1;
                            settle(&self.file, self.dir, self.file_offset + done, n);
                            continue;
                        }
                        // Tried without waiting, ext4 and XFS refuse a write that one extent
                        // of the file does not hold whole, allocated or not
                        // (`ext4_overwrite_io()`, `imap_spans_range()`): its first half is
                        // tried, down to a block of the file system (the unit of its
                        // extents); what it leaves is a chunk of its own.
                        let block = self.target.fs_block.get();
                        let half = n / 2 / block * block;
                        if self.dir == Dir::Write && half > 0 {
                            n = half;
                            continue;
                        }
                        // Refused at every size: what the file system waits for (XFS extents
                        // not yet read in, which a direct read of a cold file with many extents
                        // meets; the inode lock taken again by others after each wait above)
                        // waited for by one block through the bounce pool, whose file I/O holds
                        // no use and may wait; then the rest tried directly again. Refused again
                        // with nothing moved directly in between: the whole chunk through the
                        // pool.
                        n = if waited {
                            (len - done).min(DIRECT_CHUNK)
                        } else {
                            block.min(len - done)
                        };
                        waited = true;
                        break None;
                    }
                    got => break Some(got),
                }
            };
            let Some(got) = got else {
                let (to, short) = self.bounce_range(done, done + n)?;
                bounced += to - done;
                done = to;
                if short {
                    return Ok((done, self.dir == Dir::Read, bounced));
                }
                continue;
            };
            // A chunk that failed or claimed bytes while the device went away: ENODEV (a read
            // of a dead BAR may also fail the command, with EIO).
            self.owner_present()?;
            let got = got?;
            done += got;
            waited = false;
            // Where a block-aligned count stopped short, a read tried without waiting goes on:
            // there the file ended or the file system would have waited. (An end of file off a
            // block boundary is the end: the direct I/O of the rest would not be aligned. A
            // short write is the writer's to see: a file size limit, a full disk.)
            let partial = self.dir == Dir::Read
                && wait == Wait::NoWait
                && got > 0
                && got % self.target.logical_block_size == 0;
            if got < n && !partial {
                return Ok((done, self.dir == Dir::Read, bounced));
            }
        }
        Ok((done, false, bounced))
    }

    /// Through the bounce pool.
    fn bounce(&self) -> Result<(u64, bool, u64)> {
        let (done, short) = self.bounce_range(0, self.len)?;
        Ok((done, short && self.dir == Dir::Read, done))
    }

    /// Bytes `start..end` of the transfer through the bounce pool, one chunk at a time. Returns
    /// where it stopped and whether a chunk came back short there (a read's end of file).
    ///
    /// A chunk of the pool is held while its I/O waits, so the pool (`bounce_buffers`, shared by
    /// every user) must not wait for what another task may hold for ever: the inode lock of a
    /// file whose buffered writer is stalled on a page fault into a userfaultfd or a stalled
    /// FUSE file, a fanotify listener's answer, a freeze. So the permission checks are made and
    /// a write's times updated ([`touch`], which waits for a freeze) before the chunk is taken,
    /// and a regular file's I/O is tried without waiting ([`Wait::NoWait`]) where its file
    /// system offers that (`FMODE_NOWAIT`: ext4, XFS, btrfs, f2fs; not FUSE); refused (`EAGAIN`)
    /// while the file's inode lock is held exclusive or awaited by another task, or a write's
    /// file system is frozen ([`held_elsewhere`]), the chunk goes back to the pool, that is
    /// waited for without it ([`wait_elsewhere`]) and the chunk tried again, up to
    /// [`LOCK_WAITS`] times before bytes move. Refused for anything else (dirty page cache to
    /// write back, extents to read in, blocks to allocate, a file ext4 writes through its page
    /// cache, `EOPNOTSUPP`), the same chunk's I/O waits: the file system's waits on its own I/O,
    /// and a write's for the lock exclusive behind tasks that hold it shared (ext4's extending
    /// and unaligned writes; see [`held_elsewhere`]). A task that takes the lock again between
    /// the look and that I/O keeps the chunk waiting, as does a file system that waits where
    /// asked not to.
    ///
    /// An I/O tried without waiting may stop short where the file system would have waited (a
    /// page cache read at a page it would read in; a buffered write, as XFS makes a reflinked
    /// file's unaligned write, at a block it would read in, or at the dirty page limit): a
    /// block-aligned count goes on from there, as in [`Self::direct`] (a read that stopped at
    /// the end of the file finds it again and moves nothing).
    fn bounce_range(&self, start: u64, mut end: u64) -> Result<(u64, bool)> {
        let pool = bounce::pool()?;
        let mut done = start;
        let nowait = self.target.regular && file_nowait(&self.file);
        // Waits made with no chunk held ([`wait_elsewhere`]), since bytes last moved.
        let mut lock_waits = 0;
        // The range checked before such a wait, kept for the try after it: as a `read(2)` or
        // `write(2)` that waits for the inode's lock, a chunk is checked (and a listener for
        // permission events asked) once, however long it waits.
        let mut verified = None;
        while done < end {
            let mut n = (end - done).min(bounce::CHUNK_BYTES);
            let (pos, buf) = (self.file_offset + done, self.buf_offset + done);
            let checked = match verified.take() {
                Some(checked) => checked,
                None => verify(&self.file, self.dir, pos, n)?,
            };
            let mut wait = if nowait && lock_waits < LOCK_WAITS {
                Wait::NoWait
            } else {
                Wait::Block
            };
            if self.dir == Dir::Write && wait == Wait::NoWait {
                touch(&self.file);
            }
            let chunk = pool.acquire(&self.reg.user)?;
            if self.dir == Dir::Write {
                {
                    let _use = self.reg.shared.begin_use()?;
                    copy_device(&self.reg, buf, n, |off, dev, len| {
                        // SAFETY: `dev` addresses `len` bytes of mapped memory (`copy_device`).
                        unsafe { chunk.copy_in(off, dev, len) }
                    })?;
                }
                // What a dead BAR returned never reaches the file.
                self.owner_present()?;
            }
            let got = {
                let _io = self.reg.user.start_io(n)?;
                if self.dir == Dir::Write {
                    (end, n) = self.limit_first(done, end, n)?;
                }
                let bvecs = chunk.bvecs(n)?;
                loop {
                    let got = direct_io(&self.file, &checked, pos, bvecs.as_slice(), n, wait);
                    notify(&self.file, self.dir, &got);
                    match got {
                        Err(e)
                            if wait == Wait::NoWait
                                && e == EAGAIN
                                && held_elsewhere(&self.file, self.dir) =>
                        {
                            break None;
                        }
                        Err(e)
                            if wait == Wait::NoWait
                                && (e == EAGAIN || e == error::fs_unsupported()) =>
                        {
                            wait = Wait::Block;
                        }
                        got => break Some(got?),
                    }
                }
            };
            let Some(got) = got else {
                drop(chunk);
                lock_waits += 1;
                verified = Some(checked);
                wait_elsewhere(&self.file, self.dir)?;
                continue;
            };
            if self.dir == Dir::Read {
                {
                    let _use = self.reg.shared.begin_use()?;
                    copy_device(&self.reg, buf, got, |off, dev, n| {
                        // SAFETY: `dev` addresses `n` bytes of mapped memory (`copy_device`).
                        unsafe { chunk.copy_out(off, dev, n) }
                    })?;
                }
                // Copied into a BAR that still decodes: else ENODEV (no use held).
                self.owner_present()?;
            }
            drop(chunk);
            done += got;
            if got > 0 {
                lock_waits = 0;
            }
            // Stopped short without waiting: on from there, block-aligned (see above).
            let partial =
                wait == Wait::NoWait && got > 0 && got % self.target.logical_block_size == 0;
            if got < n && !partial {
                return Ok((done, true));
            }
        }
        Ok((done, false))
    }
}
