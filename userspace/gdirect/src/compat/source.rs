// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The file side of the compat engine: a file open twice (with and without `O_DIRECT`),
//! mapped for the page-cache questions, and the [`Input`] seam the tests inject faults at.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    io,
    ops::Range,
    os::{
        fd::AsRawFd,
        unix::fs::{FileExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    ptr::NonNull,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use nix::libc;

use super::{lock, DIRECT_ALIGN};
use crate::{
    error::{Errno, Error, Result},
    sys::page_size,
};

/// What a file is, for telling whether a cached mapping still shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// The stamp of this process's last write to the file ([`note_write`]).
    writes: u64,
}

/// The writes this process has made through the library (the compat engine's and the kernel
/// module's), stamped by file (device, inode), as each starts and again as it ends: each stamp
/// is above every one given before. A file's stamp is part of its [`FileId`], so a registration
/// of its page cache kept from before or during such a write is never reused after it, even
/// where the write left the file's size and times as they were: their granularity is a clock
/// tick on kernels without multigrain timestamps (before 6.13), and an `O_DIRECT` write drops
/// the cached pages that a kept registration pins, which would then show the bytes from before
/// the write. The module's batched writes are stamped as they are submitted and again at each
/// reap while any of them may still run (`Driver::submit`, `Driver::reap`). Other processes'
/// writes are told by the file's times alone.
///
/// At most [`WRITES_KEPT`] files are kept: a write to one more empties the table and raises the
/// stamp of every file not written since (`floor`) above all earlier ones, so every kept
/// registration is made again once (a process that writes many files costs bounded memory, and
/// a registration is never reused across a write it did not see).
static WRITES: Mutex<Writes> = Mutex::new(Writes {
    stamps: BTreeMap::new(),
    floor: 0,
    last: 0,
});

/// The files [`WRITES`] keeps stamps for.
const WRITES_KEPT: usize = 4096;

struct Writes {
    stamps: BTreeMap<(u64, u64), u64>,
    /// The stamp of a file not in `stamps`.
    floor: u64,
    /// The last stamp given.
    last: u64,
}

impl Writes {
    /// Stamps a write to file `key`.
    fn note(&mut self, key: (u64, u64)) {
        self.last += 1;
        let stamp = self.last;
        if self.stamps.len() >= WRITES_KEPT && !self.stamps.contains_key(&key) {
            self.stamps.clear();
            self.floor = stamp;
        }
        self.stamps.insert(key, stamp);
    }

    /// The stamp of file `key`'s last write.
    fn stamp(&self, key: (u64, u64)) -> u64 {
        self.stamps.get(&key).copied().unwrap_or(self.floor)
    }
}

/// Counts a write to the file `f` is open on: called as it starts (a read that begins while it
/// runs registers anew) and after it ends, made, failed or cut short (any of its bytes may have
/// changed), before the writer returns.
pub(crate) fn note_write(f: &impl std::os::fd::AsFd) {
    if let Some(key) = file_key(f) {
        note_write_key(key);
    }
}

/// The file `f` is open on, as [`note_write_key`] takes it: its device and inode.
pub(crate) fn file_key(f: &impl std::os::fd::AsFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(f.as_fd())
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// [`note_write`] of the file `key` names.
pub(crate) fn note_write_key(key: (u64, u64)) {
    lock(&WRITES).note(key);
}

/// The stamp of this process's last write to the file `f` is open on: it rises with each write
/// (test programs check that a write path stamps).
#[doc(hidden)]
pub fn writes_counted(f: &impl std::os::fd::AsFd) -> u64 {
    file_key(f).map_or(0, |(dev, ino)| writes_to(dev, ino))
}

/// The stamp of this process's last write to file (`dev`, `ino`).
fn writes_to(dev: u64, ino: u64) -> u64 {
    lock(&WRITES).stamp((dev, ino))
}

/// A read-only shared mapping of a whole file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only memory that lives until `Drop`; sharing its address between
// threads is sound (reads of it race only with the file's writers, as any mmap reader does).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &std::fs::File, len: u64) -> Option<Self> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        // SAFETY: a new mapping at an address the kernel picks, of a file we hold open; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            ptr: NonNull::new(ptr.cast())?,
            len,
        })
    }

    /// The mapped bytes of file range `range`, page-aligned outward, as (address, length);
    /// `None` past the mapping.
    pub(crate) fn pages(&self, range: Range<u64>) -> Option<(*const u8, usize)> {
        let page = page_size();
        let start = range.start - range.start % page;
        let end = range.end.div_ceil(page) * page;
        let mapped = (self.len as u64).div_ceil(page) * page;
        if range.start >= range.end || end > mapped {
            return None;
        }
        // SAFETY: `start` is inside the mapping (checked above).
        let p = unsafe { self.ptr.as_ptr().add(start as usize) };
        Some((p.cast_const(), (end - start) as usize))
    }

    /// The address of file offset `off` in the mapping.
    pub(crate) fn at(&self, off: u64) -> Option<*const u8> {
        // SAFETY: `off` is inside the mapping (checked).
        (off < self.len as u64).then(|| unsafe { self.ptr.as_ptr().add(off as usize).cast_const() })
    }

    /// Whether every page of file range `range` is in the page cache (`mincore`).
    pub(crate) fn resident(&self, range: Range<u64>) -> bool {
        let Some((p, len)) = self.pages(range) else {
            return false;
        };
        let pages = len.div_ceil(page_size() as usize);
        let mut vec = vec![0u8; pages];
        // SAFETY: `p..p+len` is page-aligned and inside our mapping; `vec` has a byte per page.
        let r = unsafe { libc::mincore(p.cast_mut().cast(), len, vec.as_mut_ptr()) };
        r == 0 && vec.iter().all(|&v| v & 1 != 0)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once; no reference into it outlives `self` (users hold
        // an `Arc<Mapping>` while they use addresses in it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A file to read with the compat engine: open with `O_DIRECT` (where the file system allows
/// it) for data that is not cached, and without for data that is, and mapped so the engine can
/// ask which is which.
#[derive(Debug)]
pub struct Source {
    path: PathBuf,
    buffered: std::fs::File,
    direct: Option<std::fs::File>,
    /// See [`Input::direct_align`].
    direct_align: u64,
    /// See [`Input::direct_failed`].
    direct_failed: AtomicBool,
    id: FileId,
    map: Option<Arc<Mapping>>,
}

impl Source {
    /// Whether `f` is the file this source opened (the same device and inode): a descriptor
    /// opened later by the same path may name another file, renamed over it meanwhile.
    pub fn same_file(&self, f: &impl std::os::fd::AsFd) -> bool {
        nix::sys::stat::fstat(f.as_fd())
            .is_ok_and(|st| (st.st_dev, st.st_ino) == (self.id.dev, self.id.ino))
    }

    /// Opens `path` for reading: a regular file or a block device.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let open_err = |e: io::Error| Error::OpenFile {
            path: path.clone(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        // Non-blocking, so that a FIFO's open does not wait for a writer; refused just below.
        let buffered = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(open_err)?;
        positional(&buffered, &path, false)?;
        // Buffered reads serve data already cached (or a file system without O_DIRECT, read in
        // whole tasks): readahead would only pull in pages the direct reads then skip.
        // SAFETY: plain syscall on our descriptor; advice only.
        unsafe { libc::posix_fadvise(buffered.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        // Some file systems (tmpfs, overlay on some kernels) refuse O_DIRECT: every read of
        // them goes through the page cache.
        // The file's own direct-I/O alignment (`STATX_DIOALIGN`) where the kernel reports it:
        // none means the file takes no direct I/O; one the staging buffers (4 KiB aligned)
        // cannot meet leaves it to the page cache too. Offsets and lengths are aligned to at
        // least 4 KiB, which serves every smaller block size.
        let (direct, direct_align) = direct_twin(&buffered, &path, false);
        let id = file_id(&buffered).map_err(open_err)?;
        let map = Mapping::new(&buffered, id.size).map(Arc::new);
        Ok(Self {
            path,
            buffered,
            direct,
            direct_align,
            direct_failed: AtomicBool::new(false),
            id,
            map,
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size when opened (a block device's capacity).
    pub fn len(&self) -> u64 {
        self.id.size
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.id.size == 0
    }

    /// Whether reads of uncached data can bypass the page cache (`O_DIRECT`).
    pub fn has_direct_io(&self) -> bool {
        self.direct.is_some()
    }

    /// Whether all of `range` is in the page cache.
    pub fn is_cached(&self, range: Range<u64>) -> bool {
        self.map.as_ref().is_some_and(|m| m.resident(range))
    }

    /// Drops the file's clean pages from the page cache (`POSIX_FADV_DONTNEED`): the next read
    /// is cold. Needs no privilege; dirty pages are written first.
    pub fn evict(&self) -> Result<()> {
        self.buffered.sync_data().ok();
        // SAFETY: plain syscall on our descriptor.
        let r = unsafe {
            libc::posix_fadvise(self.buffered.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
        };
        if r != 0 {
            return Err(Error::FileIo {
                path: self.path.clone(),
                offset: 0,
                errno: Errno::from_raw(r),
            });
        }
        Ok(())
    }
}

/// The largest direct-I/O alignment the engine plans with (it must divide the task size).
const MAX_DIRECT_ALIGN: u32 = 64 << 10;

/// `STATX_DIOALIGN`: the file's direct-I/O offset and memory alignments, `(0, 0)` when it takes
/// no direct I/O; `None` when the kernel does not say (before Linux 6.1, or an old file system).
/// The file at `path` opened again with `O_DIRECT` (for writing, or reading), where the file
/// (`buffered`, the same one) takes direct I/O from 4 KiB-aligned buffers, and the offset
/// alignment direct I/O then needs.
pub(crate) fn direct_twin(
    buffered: &std::fs::File,
    path: &Path,
    write: bool,
) -> (Option<std::fs::File>, u64) {
    let (dio_ok, direct_align) = direct_alignment(buffered);
    let direct = dio_ok
        .then(|| {
            OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        })
        .flatten();
    (direct, direct_align)
}

/// Whether the file takes direct I/O from 4 KiB-aligned buffers, and the offset alignment it
/// then needs (at least 4 KiB).
fn direct_alignment(f: &std::fs::File) -> (bool, u64) {
    match dio_align(f) {
        Some((0, _)) => (false, DIRECT_ALIGN),
        Some((offset, mem)) => (
            offset.is_power_of_two()
                && offset <= MAX_DIRECT_ALIGN
                && u64::from(mem) <= DIRECT_ALIGN,
            u64::from(offset).max(DIRECT_ALIGN),
        ),
        None => (true, DIRECT_ALIGN),
    }
}

fn dio_align(f: &std::fs::File) -> Option<(u32, u32)> {
    // SAFETY: an all-zero `statx` is a valid value for the kernel to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor with an empty path and AT_EMPTY_PATH; `stx` is writable.
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    (r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0)
        .then_some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

/// Refuses what is neither a regular file nor a block device (`Error::NotSeekable`: a FIFO, a
/// socket, a character device, the last allowed where `char_ok`; `EISDIR` for a directory),
/// whose reads would not be positional, then clears the `O_NONBLOCK` it was opened with.
pub(crate) fn positional(f: &std::fs::File, path: &Path, char_ok: bool) -> Result<()> {
    let t = f
        .metadata()
        .map_err(|e| Error::OpenFile {
            path: path.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?
        .file_type();
    refuse_special(t, path, char_ok)?;
    // SAFETY: plain fcntl on our own descriptor.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    if flags >= 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    }
    Ok(())
}

/// `Ok` for a regular file or a block device (and a character device where `char_ok`: a write
/// sink, whose `pwrite` the device answers, as `/dev/full` with `ENOSPC`); the error for
/// anything else.
pub(crate) fn refuse_special(t: std::fs::FileType, path: &Path, char_ok: bool) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let what = if t.is_file() || t.is_block_device() || (char_ok && t.is_char_device()) {
        None
    } else if t.is_dir() {
        return Err(Error::OpenFile {
            path: path.to_path_buf(),
            errno: Errno::EISDIR,
        });
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else {
        Some("not a regular file")
    };
    match what {
        Some(what) => Err(Error::NotSeekable {
            path: path.to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

fn file_id(f: &std::fs::File) -> io::Result<FileId> {
    let m = f.metadata()?;
    let size = if m.file_type().is_file() {
        m.len()
    } else {
        // A block device: its capacity.
        let mut f = f;
        io::Seek::seek(&mut f, io::SeekFrom::End(0))?
    };
    Ok(FileId {
        dev: m.dev(),
        ino: m.ino(),
        size,
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        writes: writes_to(m.dev(), m.ino()),
    })
}

/// How a task's bytes are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// `O_DIRECT` into a staging buffer.
    Direct,
    /// Through the page cache into a staging buffer.
    Buffered,
}

/// What the engine needs of a file; [`Source`] is the real one, the tests wrap it to inject
/// short reads and errors.
pub(crate) trait Input: Sync {
    fn path(&self) -> &Path;
    fn id(&self) -> FileId;
    fn direct_io(&self) -> bool;
    /// The alignment of direct reads' offsets and lengths (a power of two, at least 4 KiB).
    fn direct_align(&self) -> u64;
    /// Direct reads turned out to fail (`EINVAL`): the rest go through the page cache.
    fn direct_failed(&self);
    /// The file's size now.
    fn current_size(&self) -> io::Result<u64>;
    /// What the file is now (its size and times may have changed since it was opened).
    fn current_id(&self) -> io::Result<FileId>;
    fn read_at(&self, buf: &mut [u8], off: u64, how: How) -> io::Result<usize>;
    fn resident(&self, range: Range<u64>) -> bool;
    fn mapping(&self) -> Option<&Arc<Mapping>>;
}

impl Input for Source {
    fn path(&self) -> &Path {
        &self.path
    }
    fn id(&self) -> FileId {
        self.id
    }
    fn direct_io(&self) -> bool {
        self.direct.is_some() && !self.direct_failed.load(Ordering::Relaxed)
    }
    fn direct_align(&self) -> u64 {
        self.direct_align
    }
    fn direct_failed(&self) {
        self.direct_failed.store(true, Ordering::Relaxed);
    }
    fn current_size(&self) -> io::Result<u64> {
        file_id(&self.buffered).map(|id| id.size)
    }
    fn current_id(&self) -> io::Result<FileId> {
        file_id(&self.buffered)
    }
    fn read_at(&self, buf: &mut [u8], off: u64, how: How) -> io::Result<usize> {
        match (how, &self.direct) {
            (How::Direct, Some(d)) => d.read_at(buf, off),
            _ => self.buffered.read_at(buf, off),
        }
    }
    fn resident(&self, range: Range<u64>) -> bool {
        self.is_cached(range)
    }
    fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.map.as_ref()
    }
}

impl FileId {
    /// The size the file had.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether `other` is the same file, perhaps changed since (another size or times, or
    /// written by this process since).
    pub(crate) fn same_file(&self, other: &FileId) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

#[cfg(test)]
impl FileId {
    /// This id with `then`'s size and times: the file as it looks where a write did not move
    /// them (a kernel whose timestamps tick coarsely, a write within the same tick).
    pub(crate) fn with_times_of(mut self, then: &FileId) -> FileId {
        (self.size, self.mtime, self.ctime) = (then.size, then.mtime, then.ctime);
        self
    }
}

#[cfg(test)]
mod writes_tests {
    use super::{Writes, WRITES_KEPT};
    use std::collections::BTreeMap;

    /// A write raises its file's stamp; past [`WRITES_KEPT`] files the table is emptied, and the
    /// stamp of a file not written since rises too (its kept registrations are made again),
    /// never falling back to one it had. (A table of the test's own: emptying the process's
    /// would retire the registrations that tests running beside it keep.)
    #[test]
    fn write_stamps_rise_and_their_table_stays_bounded() {
        let mut w = Writes {
            stamps: BTreeMap::new(),
            floor: 0,
            last: 0,
        };
        let key = |i: u64| (7, i);
        w.note(key(0));
        let first = w.stamp(key(0));
        w.note(key(0));
        assert!(w.stamp(key(0)) > first);
        let unwritten = w.stamp(key(u64::MAX));
        let mut seen = vec![w.stamp(key(0))];
        for i in 1..=WRITES_KEPT as u64 + 1 {
            w.note(key(i));
            assert!(w.stamps.len() <= WRITES_KEPT);
            seen.push(w.stamp(key(0)));
        }
        assert!(
            w.stamp(key(u64::MAX)) > unwritten,
            "a file's stamp stayed across the table's emptying"
        );
        assert!(
            seen.windows(2).all(|p| p[1] >= p[0]),
            "a file's stamp fell: {seen:?}"
        );
        assert!(*seen.last().unwrap_or(&0) > seen[0]);
    }
}
