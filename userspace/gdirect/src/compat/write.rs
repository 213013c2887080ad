// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Writes through the compat engine: memory to a file, without the module.
//!
//! The range is cut at multiples of the task size in the file, and the engine's threads take
//! the pieces in turn. Host memory goes to the file by `pwrite` from where it is; device memory
//! is first copied into a pinned host buffer of the worker's (`cuMemcpyDtoH`). With the page
//! cache policy `auto` or `direct`, a piece whose file offset, length and memory address meet
//! the file's direct-I/O alignment is written with `O_DIRECT` (where the file takes it), any
//! other through the page cache; with `buffered` or `mapped`, every piece goes through the page
//! cache. A direct write the file refuses with `EINVAL` is redone buffered, and later ones are
//! buffered. Nothing is synced: as with `pwrite`, durability is the caller's `fsync`.

use std::{
    fs::OpenOptions,
    io,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Mutex,
    },
};

#[cfg(feature = "cuda")]
use cudarc::driver::sys;
use nix::libc;

#[cfg(feature = "cuda")]
use super::CudaBackend;
use super::{
    lock, source::direct_twin, Backend, CompatEngine, HostBackend, PageCache, Report, DIRECT_ALIGN,
};
use crate::error::{Errno, Error, Result};

/// A file open for writing through the compat engine.
#[derive(Debug)]
pub struct Sink {
    path: PathBuf,
    buffered: std::fs::File,
    direct: Option<std::fs::File>,
    direct_align: u64,
    direct_failed: AtomicBool,
}

impl Sink {
    /// Opens `path` for writing (a regular file or a block device): `create` makes a missing
    /// file (mode 0666 less the umask), `truncate` empties it.
    pub fn open(path: impl AsRef<Path>, create: bool, truncate: bool) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let open_err = |e: io::Error| Error::OpenFile {
            path: path.clone(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        // A FIFO or a socket is refused before it is opened (a FIFO's write side without a
        // reader cannot be opened at all); a character device takes positional writes as it
        // answers them (`/dev/full`: `ENOSPC`).
        if let Ok(m) = std::fs::metadata(&path) {
            super::source::refuse_special(m.file_type(), &path, true)?;
        }
        let buffered = OpenOptions::new()
            .write(true)
            .create(create)
            .truncate(truncate)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(open_err)?;
        super::source::positional(&buffered, &path, true)?;
        if truncate {
            // Emptied: its cached pages are gone.
            super::source::note_write(&buffered);
        }
        let (direct, direct_align) = direct_twin(&buffered, &path, true);
        Ok(Self {
            path,
            buffered,
            direct,
            direct_align,
            direct_failed: AtomicBool::new(false),
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether aligned writes can go to the file with `O_DIRECT` (the file takes direct I/O, and
    /// has not refused it); an engine whose page-cache policy is `buffered` or `mapped` writes
    /// through the page cache all the same.
    pub fn takes_direct(&self) -> bool {
        self.direct.is_some() && !self.direct_failed.load(Ordering::Relaxed)
    }

    /// Writes `len` bytes at `src` to the file at `offset`, directly when `may_direct` and
    /// everything is aligned; returns whether it went direct.
    ///
    /// # Safety
    ///
    /// `src` is valid for reading `len` bytes for the call.
    unsafe fn put(
        &self,
        src: *const u8,
        len: usize,
        offset: u64,
        may_direct: bool,
    ) -> Result<bool> {
        let align = self.direct_align;
        let direct = self.direct.as_ref().filter(|_| {
            may_direct
                && !self.direct_failed.load(Ordering::Relaxed)
                && offset % align == 0
                && len as u64 % align == 0
                && src as usize as u64 % DIRECT_ALIGN == 0
        });
        if let Some(f) = direct {
            // SAFETY: as this function's contract says.
            match unsafe { pwrite_all(f, src, len, offset) } {
                Ok(()) => return Ok(true),
                Err((0, Errno::EINVAL)) => self.direct_failed.store(true, Ordering::Relaxed),
                Err((done, errno)) => return Err(self.failed(offset + done as u64, errno)),
            }
        }
        // SAFETY: as above.
        unsafe { pwrite_all(&self.buffered, src, len, offset) }
            .map_err(|(done, errno)| self.failed(offset + done as u64, errno))?;
        Ok(false)
    }

    /// Starts writing back the file's dirty pages in `[offset, offset + len)` and returns
    /// without waiting for them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). Called on the part
    /// of a long write already done, it lets the device write those bytes while the rest are
    /// written, so that the `fsync` after the last byte finds most of them on their way (a
    /// writer of a checkpoint with `fsync`, `gdirect.safetensors.save`). `len` 0 is to the end
    /// of the file, as `sync_file_range` takes it. It makes nothing durable: it waits for no
    /// page and writes no metadata; only `fsync` does.
    pub fn start_writeback(&self, offset: u64, len: u64) -> Result<()> {
        let (Ok(at), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(self.failed(offset, Errno::EFBIG));
        };
        // SAFETY: a system call on our open descriptor that reads only its arguments.
        let rc = unsafe {
            libc::sync_file_range(
                self.buffered.as_raw_fd(),
                at,
                n,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if rc != 0 {
            return Err(self.failed(offset, Errno::last()));
        }
        Ok(())
    }

    fn failed(&self, offset: u64, errno: Errno) -> Error {
        Error::FileWrite {
            path: self.path.clone(),
            offset,
            errno,
        }
    }
}

/// `pwrite` until all of `len` is written; on failure, how much was and the errno.
///
/// # Safety
///
/// `src` is valid for reading `len` bytes for the call.
unsafe fn pwrite_all(
    f: &std::fs::File,
    src: *const u8,
    len: usize,
    offset: u64,
) -> std::result::Result<(), (usize, Errno)> {
    let mut done = 0;
    while done < len {
        let at = i64::try_from(offset + done as u64).map_err(|_| (done, Errno::EFBIG))?;
        // SAFETY: `src + done .. src + len` is readable (see the contract); our descriptor.
        let n = unsafe { libc::pwrite(f.as_raw_fd(), src.add(done).cast(), len - done, at) };
        match n {
            n if n > 0 => done += n as usize,
            // A write that makes no progress: the device or file system is full.
            0 => return Err((done, Errno::ENOSPC)),
            _ => match Errno::last() {
                Errno::EINTR => {}
                e => return Err((done, e)),
            },
        }
    }
    Ok(())
}

/// A lane of the engine's for one worker of a write (its first staging buffer holds the
/// device bytes of a piece), back in the engine's pool when dropped: repeated writes, like
/// reads, pin no new memory.
#[cfg(feature = "cuda")]
struct PooledLane<'e, B: Backend> {
    lane: Option<B::Lane>,
    pool: &'e Mutex<Vec<B::Lane>>,
}

#[cfg(feature = "cuda")]
impl<B: Backend> Drop for PooledLane<'_, B> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            lock(self.pool).push(lane);
        }
    }
}

/// What the workers did, together.
#[derive(Default)]
struct WriteTally {
    direct: u64,
    buffered: u64,
    ios: u64,
}

impl<B: Backend> CompatEngine<B> {
    /// Cuts `[offset, offset + len)` at multiples of the task size or the write piece
    /// ([`Settings::write_piece`](super::Settings::write_piece)), whichever is larger, and has the workers write the pieces: `piece(worker_state,
    /// memory_offset, n)` gives the address of the piece's bytes, readable until the next call
    /// on that worker.
    fn write_pieces<S>(
        &self,
        dst: &Sink,
        len: u64,
        offset: u64,
        state: impl Fn() -> Result<S> + Sync,
        piece: impl Fn(&mut S, u64, usize) -> Result<*const u8> + Sync,
    ) -> Result<Report> {
        let task = self.settings.task_size.max(self.settings.write_piece);
        // A range past the largest file offset: the file cannot grow that far.
        let end = offset
            .checked_add(len)
            .filter(|&e| i64::try_from(e).is_ok())
            .ok_or_else(|| dst.failed(offset, Errno::EFBIG))?;
        if len == 0 {
            // Nothing to write: no worker, no staging buffer.
            return Ok(Report::default());
        }
        let first_end = end.min((offset / task + 1).saturating_mul(task));
        let pieces = 1 + (end - first_end).div_ceil(task);
        let range = |i: u64| {
            let a = if i == 0 {
                offset
            } else {
                first_end + (i - 1) * task
            };
            let b = if i == 0 { first_end } else { end.min(a + task) };
            (a, b)
        };
        let threads = (self.settings.threads as u64).min(pieces).max(1) as usize;
        // Kept registrations of the file's page cache are not reused from here on (and again
        // below: one made while the write runs may pin pages it drops). One `fstat` for both.
        let written = super::source::file_key(&dst.buffered);
        if let Some(key) = written {
            super::source::note_write_key(key);
        }
        // `buffered` and `mapped` keep everything in the page cache, writes as reads.
        let may_direct = matches!(
            self.settings.page_cache,
            PageCache::Auto | PageCache::Direct
        );
        let next = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let first_err: Mutex<Option<Error>> = Mutex::new(None);
        let total = Mutex::new(WriteTally::default());
        let worker = || {
            let work = || -> Result<()> {
                let _entered = self.backend.enter_thread()?;
                let mut st = state()?;
                let mut mine = WriteTally::default();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= pieces {
                        break;
                    }
                    let (a, b) = range(i);
                    let n = (b - a) as usize;
                    let src = piece(&mut st, a - offset, n)?;
                    // SAFETY: `piece` vouches for `n` readable bytes at `src`.
                    let direct = unsafe { dst.put(src, n, a, may_direct) }?;
                    *if direct {
                        &mut mine.direct
                    } else {
                        &mut mine.buffered
                    } += n as u64;
                    mine.ios += 1;
                }
                let mut t = lock(&total);
                t.direct += mine.direct;
                t.buffered += mine.buffered;
                t.ios += mine.ios;
                Ok(())
            };
            if let Err(e) = work() {
                stop.store(true, Ordering::Relaxed);
                lock(&first_err).get_or_insert(e);
            }
        };
        // A worker that panicked wrote some of its pieces, or none: the write failed.
        let panicked = self
            .on_workers((0..threads).map(|_| &worker).collect())
            .contains(&None);
        // Whatever it wrote.
        if let Some(key) = written {
            super::source::note_write_key(key);
        }
        if panicked {
            lock(&first_err).get_or_insert(Error::Worker {
                what: "a compat worker panicked",
            });
        }
        if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let t = total.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(Report {
            bytes: len,
            direct_bytes: t.direct,
            buffered_bytes: t.buffered,
            ios: t.ios,
            threads,
            ..Default::default()
        })
    }
}

impl CompatEngine<HostBackend> {
    /// Writes `len` bytes of host memory at `src` to `dst` at `offset`, on the engine's threads.
    /// The report's `bytes` is `len` (a write that cannot complete is an error, with the file
    /// offset it stopped at).
    ///
    /// # Safety
    ///
    /// `src` is valid for reading `len` bytes until the call returns.
    pub unsafe fn write_host_ptr(
        &self,
        dst: &Sink,
        src: *const u8,
        len: u64,
        offset: u64,
    ) -> Result<Report> {
        let base = src as usize;
        self.write_pieces(
            dst,
            len,
            offset,
            || Ok(()),
            |(), off, _n| Ok((base + off as usize) as *const u8),
        )
    }
}

#[cfg(feature = "cuda")]
impl CompatEngine<CudaBackend> {
    /// Writes `len` bytes of device memory at `src` (of this engine's GPU) to `dst` at
    /// `offset`: each piece copied into a pinned buffer of the worker's, then written.
    ///
    /// The write is ordered after every piece of work queued on the context when it is
    /// called, on any stream (PyTorch's current or side streams, another library's, a
    /// launched CUDA graph): it waits for the context as `cuCtxSynchronize` does, then copies.
    /// The file gets the bytes that work left in the memory, never older ones. A caller that
    /// knows the one stream that wrote the memory and has waited for it can use the crate's
    /// settled variant; from outside the crate this is the only one.
    ///
    /// # Safety
    ///
    /// `[src, src + len)` is device memory of this engine's context, readable until the call
    /// returns, and no work queued after this call begins writes it before the call returns.
    pub unsafe fn write_device_ptr(
        &self,
        dst: &Sink,
        src: u64,
        len: u64,
        offset: u64,
    ) -> Result<Report> {
        let _entered = self.backend.enter_thread()?;
        self.backend.synchronize()?;
        // SAFETY: the caller's promise; the work queued on the context has finished.
        unsafe { self.write_device_ptr_settled(dst, src, len, offset) }
    }

    /// [`CompatEngine::write_device_ptr`] without waiting for the context first: the caller
    /// has waited for the work queued on the memory (its stream).
    ///
    /// # Safety
    ///
    /// As [`CompatEngine::write_device_ptr`], and no work queued on the device writes the
    /// source.
    pub(crate) unsafe fn write_device_ptr_settled(
        &self,
        dst: &Sink,
        src: u64,
        len: u64,
        offset: u64,
    ) -> Result<Report> {
        use super::Lane;
        let task = self.settings.task_size as usize;
        self.write_pieces(
            dst,
            len,
            offset,
            || {
                let pooled = lock(&self.lanes).pop();
                let lane = match pooled {
                    Some(l) => l,
                    None => self.backend.lane(self.settings.buffers(), task)?,
                };
                Ok(PooledLane::<CudaBackend> {
                    lane: Some(lane),
                    pool: &self.lanes,
                })
            },
            |pooled, off, n| {
                let lane = pooled.lane.as_mut().ok_or(Error::Worker {
                    what: "a write worker without its lane",
                })?;
                // A piece is at most a write piece or a task long (the buffer grows to it once).
                let stage = lane.buffer(0, n)?;
                // SAFETY: `n` bytes of the caller's device memory (see the contract) into the
                // lane's pinned buffer of at least `n`; synchronous, so the bytes are there
                // after it, and nothing else uses the buffer until this worker's next piece.
                let r = unsafe { sys::cuMemcpyDtoH_v2(stage.as_mut_ptr().cast(), src + off, n) };
                super::cuda::cuda("cuMemcpyDtoH", r)?;
                Ok(stage.as_ptr())
            },
        )
    }
}
