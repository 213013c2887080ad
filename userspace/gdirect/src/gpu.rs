// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Reading files into CUDA memory: through the module where it can, the compat engine
//! everywhere else, and the [`Transfer`] says which and why.

use std::{
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock},
    task::{Context, Poll, Waker},
};

use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice};

use crate::{
    compat::{Backend, CompatEngine, CudaBackend, DeviceAllocation, Report, Segment, Sink, Source},
    io::{CompatReason, Engine},
    Driver, Errno, Error, File, IoPath, Provider, Reason, RegisterOptions, Registration, Result,
    Transfer, Transport,
};

mod buffer;

pub(crate) use buffer::not_pool_memory;
pub use buffer::{DeviceBuffer, RdmaFacts};

/// What [`GpuReader::read`] (or [`GpuReader::write_from`]) did: the transfer, and the compat
/// engine's report when it ran.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GpuRead {
    /// The transfer (its `engine` says which engine and why).
    pub transfer: Transfer,
    /// The compat engine's report (how much went direct, through the page cache, ...).
    pub compat: Option<Report>,
}

/// Reads files into GPU memory allocated with cudarc: through the module where it serves, the
/// compat engine everywhere else. Open a file once and register memory once, then read as
/// often as needed (this is the README's example, which a test keeps equal to it):
///
/// ```no_run
/// use gdirect::{compat::{CompatEngine, CudaBackend}, gpu::{DeviceBuffer, GpuReader}};
/// let backend = CudaBackend::new(0)?;
/// let ctx = backend.context().clone();
/// let reader = GpuReader::from_env(CompatEngine::builder().build(backend)?)?;
/// let mut mem = DeviceBuffer::new(&ctx.default_stream(), 64 << 20)?; // cuMemAlloc
/// let file = reader.open("weights.bin")?; // opened once
/// let mut buf = reader.register(&mut mem); // registered once
/// for offset in [0, 64 << 20] {
///     let r = reader.read_into(&file, &mut buf, 0, offset, 64 << 20)?;
///     let t = r.transfer;
///     println!("{} bytes by {} ({})", t.bytes, t.engine, t.engine.explain());
/// }
/// # Ok::<(), gdirect::Error>(())
/// ```
pub struct GpuReader {
    engine: CompatEngine<CudaBackend>,
    module: std::result::Result<Driver, CompatReason>,
    mode: CompatMode,
}

/// Whether reads may go through the compat engine (`GDIRECT_COMPAT_MODE`, as KvikIO's
/// `KVIKIO_COMPAT_MODE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompatMode {
    /// The module where it can serve, the compat engine otherwise (the transfer says why).
    #[default]
    Auto,
    /// Always the compat engine.
    On,
    /// Only the module: a read it cannot serve is an error ([`Error::CompatModeOff`]), never
    /// a silent fallback through host memory.
    Off,
}

impl CompatMode {
    /// The mode `GDIRECT_COMPAT_MODE` asks for (`auto`, `on` or `off`; `auto` when unset).
    pub fn from_env() -> Result<Self> {
        match std::env::var("GDIRECT_COMPAT_MODE") {
            Err(_) => Ok(Self::Auto),
            Ok(v) => Self::parse(&v).ok_or(Error::BadSetting {
                name: "GDIRECT_COMPAT_MODE",
                value: v,
                expected: "auto, on or off",
            }),
        }
    }

    /// `auto`, `on` or `off` (also `true`/`false`, `yes`/`no`, `1`/`0`), any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Self::Auto),
            "on" | "true" | "yes" | "1" => Some(Self::On),
            "off" | "false" | "no" | "0" => Some(Self::Off),
            _ => None,
        }
    }

    /// Whether a read the module cannot serve, for `why`, goes to the compat engine (`Ok`) or
    /// fails.
    fn allow(self, why: CompatReason) -> Result<CompatReason> {
        match self {
            Self::Off => Err(Error::CompatModeOff { reason: why }),
            Self::Auto | Self::On => Ok(why),
        }
    }
}

impl GpuReader {
    /// A reader that uses the module when it is loaded with the `nvidia` provider, and
    /// `engine` otherwise.
    pub fn new(engine: CompatEngine<CudaBackend>) -> Self {
        Self::with_mode(engine, CompatMode::Auto)
    }

    /// A reader in the mode `GDIRECT_COMPAT_MODE` asks for ([`CompatMode::from_env`]).
    pub fn from_env(engine: CompatEngine<CudaBackend>) -> Result<Self> {
        Ok(Self::with_mode(engine, CompatMode::from_env()?))
    }

    /// A reader in `mode`: [`CompatMode::On`] never asks the module, [`CompatMode::Off`] never
    /// uses `engine`. The module is asked through `GDIRECT_DEVICE`, or `/dev/gdirect`
    /// ([`Driver::open`]).
    pub fn with_mode(engine: CompatEngine<CudaBackend>, mode: CompatMode) -> Self {
        Self::asking(engine, mode, Driver::open)
    }

    /// A reader in `mode` that asks the module through the device node `device` (a node made
    /// elsewhere, or in a container's own `/dev`), whatever `GDIRECT_DEVICE` says.
    pub fn with_device(
        engine: CompatEngine<CudaBackend>,
        mode: CompatMode,
        device: impl AsRef<Path>,
    ) -> Self {
        Self::asking(engine, mode, || Driver::open_path(device))
    }

    /// A reader in `mode` that asks the module through what `open` opens.
    fn asking(
        engine: CompatEngine<CudaBackend>,
        mode: CompatMode,
        open: impl FnOnce() -> Result<Driver>,
    ) -> Self {
        if mode == CompatMode::On {
            return Self::compat_only(engine);
        }
        let module = match open() {
            Err(e) => Err(CompatReason::from_error(&e)),
            Ok(d) => match d.info() {
                Ok(info) if info.has_provider(Provider::Nvidia) => Ok(d),
                Ok(_) => Err(CompatReason::NoProvider),
                Err(e) => Err(CompatReason::from_error(&e)),
            },
        };
        Self {
            engine,
            module,
            mode,
        }
    }

    /// A reader that always uses the compat engine.
    pub fn compat_only(engine: CompatEngine<CudaBackend>) -> Self {
        Self {
            engine,
            module: Err(CompatReason::Requested),
            mode: CompatMode::On,
        }
    }

    /// Its mode.
    pub fn mode(&self) -> CompatMode {
        self.mode
    }

    /// The compat engine.
    pub fn engine(&self) -> &CompatEngine<CudaBackend> {
        &self.engine
    }

    /// Why the compat engine will run, or `None` when the module will be tried first.
    pub fn compat_reason(&self) -> Option<CompatReason> {
        self.module.as_ref().err().copied()
    }

    /// Reads `len` bytes of the file at `path`, from `file_offset`, into `memory` at
    /// `mem_offset` (in bytes). A read past the end of the file is short and says so.
    ///
    /// This opens the file and registers the memory for this one read; to read a file or
    /// into memory many times, open it once ([`GpuReader::open`]) and register the memory once
    /// ([`GpuReader::register`]).
    pub fn read<M: GpuMemory + ?Sized>(
        &self,
        path: impl AsRef<Path>,
        memory: &mut M,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        let file = self.open(path)?;
        let mut buf = self.register(memory);
        self.read_into(&file, &mut buf, mem_offset, file_offset, len)
    }

    /// Opens `path` once for any number of reads ([`GpuReader::read_into`]): where the module
    /// may serve, an `O_DIRECT` descriptor for it; the compat engine's view of the file (its
    /// descriptors and mapping) when it is first needed, so that a file the module reads costs
    /// one open. Errors opening the file are reported here either way. Should the path name
    /// another file by the time the compat engine first needs it (one renamed over it), that
    /// read fails with [`Error::OpenFile`] (`ESTALE`) rather than mix the two files.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<GpuFile> {
        let path = path.as_ref().to_path_buf();
        // A file system without O_DIRECT (tmpfs) has no direct transfers to offer: such a
        // file is read by the compat engine, and the transfer says why.
        let direct = match &self.module {
            Ok(_) => File::open_direct(&path).ok(),
            Err(_) => None,
        };
        let src = OnceLock::new();
        if direct.is_none() {
            // The compat engine reads it: open its view now (and report a missing file).
            let _ = src.set(Source::open(&path)?);
        }
        Ok(GpuFile { path, src, direct })
    }

    /// Registers `memory` with the module once, for any number of reads into it
    /// ([`GpuReader::read_into`]): no pin and unpin per read. Where the module cannot
    /// register it (not loaded, compat mode on, memory it refuses) reads into it go through
    /// the compat engine, and each transfer says why. The buffer holds `memory` mutably for
    /// its life, so the allocation cannot be freed or touched meanwhile.
    ///
    /// `memory` is a cudarc slice or mutable view of plain numbers (`CudaSlice<f32>`,
    /// `CudaViewMut<u8>`, ...: see [`Plain`]), or device memory another library allocated
    /// ([`RawGpuMemory`]).
    pub fn register<'a, M: GpuMemory + ?Sized>(&'a self, memory: &'a mut M) -> GpuBuffer<'a, M> {
        let reg = match &self.module {
            Err(why) => Err(*why),
            // The driver's own word that no peer may reach it: the module is not asked. (Memory
            // of a stream-ordered pool is asked: the buffer holds it for the registration's
            // life, and no transfer outlives a read, so its free cannot race one.)
            Ok(_)
                if RdmaFacts::of(memory.address())
                    .ok()
                    .and_then(|f| f.rdma_capable)
                    == Some(false) =>
            {
                Err(CompatReason::NotRdmaCapable)
            }
            Ok(driver) => {
                let (addr, len) = (memory.address(), memory.bytes());
                // SAFETY: the range is the CUDA memory `memory` stands for (a cudarc allocation
                // or a view of one, or a `RawGpuMemory` whose maker vouched for it), and the
                // `GpuBuffer` holds `memory` by `&mut` for the registration's whole life: it
                // stays allocated, and no safe code can reach it meanwhile. No Rust reference
                // ever points into device memory.
                match unsafe {
                    driver.register_range(Provider::Nvidia, addr, len, RegisterOptions::new())
                } {
                    Ok(reg) => Ok(reg),
                    Err(Error::Misaligned { .. }) => Err(CompatReason::Unaligned),
                    Err(e) => Err(CompatReason::Refused(e.errno().unwrap_or(Errno::EIO))),
                }
            }
        };
        let at = (memory.address(), memory.bytes());
        GpuBuffer { memory, reg, at }
    }

    /// Reads `len` bytes of `file` from `file_offset` into `buf` at byte `mem_offset`: through
    /// the module where the file and the memory allow it, the compat engine otherwise (as the
    /// mode permits). Work queued on the memory before the call (a kernel still reading it)
    /// finishes first. A read past the end of the file is short and says so.
    pub fn read_into<M: GpuMemory + ?Sized>(
        &self,
        file: &GpuFile,
        buf: &mut GpuBuffer<'_, M>,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        let seg = GpuSegment {
            file,
            file_offset,
            len,
            mem_offset,
        };
        let mut v = self.read_vectored_into(buf, &[seg])?;
        Ok(GpuRead {
            transfer: v.transfers.remove(0),
            compat: v.compat,
        })
    }

    /// Reads every segment (ranges of one file or of several: a checkpoint's tensors or
    /// shards) into `buf`, each at its own byte offset, in one call: segments the module can
    /// serve go through it, the others through the compat engine in one read whose workers
    /// take all their pieces in turn. Each segment's transfer says which engine served it and
    /// why. Segments may not overlap in the memory; every one must lie inside it (checked
    /// before any byte moves).
    pub fn read_vectored_into<M: GpuMemory + ?Sized>(
        &self,
        buf: &mut GpuBuffer<'_, M>,
        segments: &[GpuSegment<'_>],
    ) -> Result<GpuReadVectored> {
        let size = buf.len();
        for s in segments {
            in_range(s.mem_offset, s.len, size)?;
        }
        crate::compat::disjoint(segments.iter().map(|s| (s.mem_offset, s.len)))?;
        let backend = self.engine.backend();
        let _entered = backend.enter_thread()?;
        let address = buf.prepare(backend)?;
        if self.mode == CompatMode::Off {
            // Refused before any segment moves, where it is known now that the module
            // cannot serve one.
            for s in segments {
                let why = match (&buf.reg, &s.file.direct) {
                    (Err(why), _) => *why,
                    (Ok(_), None) => CompatReason::Unaligned,
                    (Ok(_), Some(_)) => continue,
                };
                return Err(Error::CompatModeOff { reason: why });
            }
        }
        let mut transfers: Vec<Option<Transfer>> = vec![None; segments.len()];
        // The segments for the compat engine, with why the module does not serve each.
        let mut compat = Vec::new();
        for (i, s) in segments.iter().enumerate() {
            let module =
                self.through_module(&buf.reg, s.file.direct.as_ref(), s.len, |reg, f| {
                    f.read_into(reg, s.mem_offset, s.file_offset, s.len)
                })?;
            match module {
                Ok(t) => transfers[i] = Some(t),
                Err(why) => compat.push((i, why)),
            }
        }
        let mut report = None;
        if !compat.is_empty() {
            let segs = compat
                .iter()
                .map(|&(i, _)| {
                    let s = &segments[i];
                    Ok(Segment {
                        src: s.file.source()?,
                        file_offset: s.file_offset,
                        len: s.len,
                        mem_offset: s.mem_offset,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let ptrs = vec![(address, size); segs.len()];
            // SAFETY: `buf` holds the memory by `&mut` (a cudarc allocation or view, or a
            // `RawGpuMemory` whose maker vouched for it) for the whole call, so it stays
            // allocated and nothing else reaches it; the work queued on it has finished
            // (`settle`); the segments lie inside it and do not overlap (checked above).
            let (r, got) = unsafe { self.engine.read_device_ptrs_settled(&segs, &ptrs) }?;
            for (&(i, why), got) in compat.iter().zip(got) {
                transfers[i] = Some(compat_transfer(got.bytes, got.eof, why));
            }
            report = Some(r);
        }
        Ok(GpuReadVectored {
            transfers: transfers.into_iter().flatten().collect(),
            compat: report,
        })
    }

    /// A transfer of `len` bytes through the module (`io`) where the registration, the file
    /// and the size allow it: `Ok(Ok(transfer))`; `Ok(Err(why))` when the compat engine is to
    /// do it instead (as the mode permits: off makes that an error); a failure of the module's
    /// own is the error.
    fn through_module(
        &self,
        reg: &std::result::Result<Registration<'_>, CompatReason>,
        direct: Option<&File>,
        len: u64,
        io: impl FnOnce(&Registration<'_>, &File) -> Result<Transfer>,
    ) -> Result<std::result::Result<Transfer, CompatReason>> {
        let why = match (reg, direct) {
            (Ok(_), Some(_)) if self.below_threshold(len).is_some() => CompatReason::BelowThreshold,
            (Ok(reg), Some(f)) => match io(reg, f) {
                Ok(t) => return Ok(Ok(t)),
                Err(Error::IoMisaligned { .. } | Error::NotBlockBacked { .. }) => {
                    self.mode.allow(CompatReason::Unaligned)?
                }
                Err(e) => return Err(e),
            },
            // The module serves but the file has no direct I/O.
            (Ok(_), None) => self.mode.allow(CompatReason::Unaligned)?,
            (Err(why), _) => self.mode.allow(*why)?,
        };
        Ok(Err(why))
    }

    /// `Some` when a transfer of `len` bytes goes to the compat engine without trying the
    /// module: smaller than the threshold, in a mode that allows the compat engine, where the
    /// module would be tried.
    fn below_threshold(&self, len: u64) -> Option<CompatReason> {
        below_threshold(
            len,
            self.engine.settings().direct_threshold,
            self.mode,
            self.module.is_ok(),
        )
    }

    /// Opens `path` for writes from GPU memory ([`GpuReader::write_from`]), creating it if it
    /// is missing and emptying it when `truncate`: where the module may serve, an `O_DIRECT`
    /// descriptor for it, and the compat engine's.
    pub fn create(&self, path: impl AsRef<Path>, truncate: bool) -> Result<GpuSink> {
        let path = path.as_ref();
        let sink = Sink::open(path, true, truncate)?;
        let direct = match &self.module {
            Ok(_) => File::open_direct_rw(path).ok(),
            Err(_) => None,
        };
        Ok(GpuSink { sink, direct })
    }

    /// Writes `len` bytes of `buf` from byte `mem_offset` to `file` at `file_offset`: through
    /// the module where the file and the memory allow it, the compat engine otherwise (each
    /// piece copied into a pinned buffer of a worker's, then written `O_DIRECT` where aligned,
    /// through the page cache otherwise). Work queued on the memory (the kernel that made the
    /// bytes) finishes first. A write that cannot complete (a file size limit, a full device)
    /// fails with [`Error::FileWrite`] and the offset it reached, by either path: never a
    /// short success. Nothing is synced: durability is the caller's `fsync`.
    pub fn write_from<M: GpuMemory + ?Sized>(
        &self,
        file: &GpuSink,
        buf: &mut GpuBuffer<'_, M>,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        in_range(mem_offset, len, buf.len())?;
        let backend = self.engine.backend();
        let _entered = backend.enter_thread()?;
        let address = buf.prepare(backend)?;
        let module = self.through_module(&buf.reg, file.direct.as_ref(), len, |reg, f| {
            f.write_all_from(reg, mem_offset, file_offset, len)
        })?;
        let why = match module {
            Ok(transfer) => {
                return Ok(GpuRead {
                    transfer,
                    compat: None,
                })
            }
            Err(why) => why,
        };
        // SAFETY: `buf` holds the memory by `&mut` for the whole call (a cudarc allocation or
        // view, or a `RawGpuMemory` whose maker vouched for it), the range lies inside it
        // (checked above), and the work queued on it has finished (`settle`).
        let r = unsafe {
            self.engine
                .write_device_ptr_settled(&file.sink, address + mem_offset, len, file_offset)
        }?;
        Ok(GpuRead {
            transfer: compat_transfer(r.bytes, false, why),
            compat: Some(r),
        })
    }

    /// Starts reading `len` bytes of `file` from `file_offset` into `memory` at byte
    /// `mem_offset`, and returns at once: the read runs on a thread of its own (several run
    /// at once, sharing the engine's workers) and gives the memory back with its result, from
    /// [`PendingRead::wait`] or as a [`std::future::Future`]. The memory is registered with
    /// the module for this one read.
    pub fn read_async<M: GpuMemory + Send + 'static>(
        self: &Arc<Self>,
        file: Arc<GpuFile>,
        mut memory: M,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<PendingRead<M>> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot {
                done: None,
                waker: None,
                taken: false,
            }),
            ready: Condvar::new(),
        });
        let (reader, theirs) = (self.clone(), shared.clone());
        std::thread::Builder::new()
            .name("gdirect-async".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut buf = reader.register(&mut memory);
                    reader.read_into(&file, &mut buf, mem_offset, file_offset, len)
                }))
                .unwrap_or(Err(Error::Worker {
                    what: "an asynchronous read panicked",
                }));
                let mut slot = lock(&theirs.slot);
                slot.done = Some((memory, r));
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
                theirs.ready.notify_all();
            })
            .map_err(|_| Error::Worker {
                what: "the thread of an asynchronous read could not be started",
            })?;
        Ok(PendingRead { shared })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update of the slot is one store: a panic cannot leave it half made.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One range of a file to read into a buffer, for [`GpuReader::read_vectored_into`].
#[derive(Clone, Copy, Debug)]
pub struct GpuSegment<'f> {
    /// The file.
    pub file: &'f GpuFile,
    /// Where in the file.
    pub file_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// Where in the memory, in bytes.
    pub mem_offset: u64,
}

/// What [`GpuReader::read_vectored_into`] did.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GpuReadVectored {
    /// Each segment's transfer, in the segments' order (fewer bytes than asked only at the
    /// end of its file; its `engine` says which engine and why).
    pub transfers: Vec<Transfer>,
    /// The compat engine's report for the segments it read, when it read any.
    pub compat: Option<Report>,
}

impl GpuReadVectored {
    /// The bytes of every segment.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.bytes).sum()
    }
}

/// A read started by [`GpuReader::read_async`]: wait for it ([`PendingRead::wait`]) or await
/// it; either gives the memory back with the read's result. Dropping it does not stop the
/// read: the memory is freed when the read ends.
pub struct PendingRead<M> {
    shared: Arc<Shared<M>>,
}

struct Shared<M> {
    slot: Mutex<Slot<M>>,
    ready: Condvar,
}

struct Slot<M> {
    done: Option<(M, Result<GpuRead>)>,
    waker: Option<Waker>,
    /// The result was handed out (a `Future` polled after it was ready).
    taken: bool,
}

impl<M> PendingRead<M> {
    /// Whether the read has ended (so [`PendingRead::wait`] will not block).
    pub fn is_done(&self) -> bool {
        lock(&self.shared.slot).done.is_some()
    }

    /// Waits for the read to end: the memory, and what the read did.
    ///
    /// # Panics
    ///
    /// If the read's result was already taken by polling it as a future to completion.
    pub fn wait(self) -> (M, Result<GpuRead>) {
        let mut slot = lock(&self.shared.slot);
        loop {
            if let Some(done) = slot.done.take() {
                return done;
            }
            assert!(!slot.taken, "PendingRead::wait after its future completed");
            slot = self
                .shared
                .ready
                .wait(slot)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<M> std::future::Future for PendingRead<M> {
    type Output = (M, Result<GpuRead>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(&self.shared.slot);
        match slot.done.take() {
            Some(done) => {
                slot.taken = true;
                Poll::Ready(done)
            }
            // As futures may: a future polled again after it completed panics.
            None if slot.taken => panic!("PendingRead polled after it completed"),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<M> std::fmt::Debug for PendingRead<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRead")
            .field("done", &self.is_done())
            .finish()
    }
}

/// [`GpuReader::below_threshold`], for a reader in `mode` whose module is usable or not.
fn below_threshold(
    len: u64,
    threshold: u64,
    mode: CompatMode,
    module: bool,
) -> Option<CompatReason> {
    (len < threshold && mode == CompatMode::Auto && module).then_some(CompatReason::BelowThreshold)
}

/// A file opened once by [`GpuReader::create`] for any number of writes.
#[derive(Debug)]
pub struct GpuSink {
    sink: Sink,
    direct: Option<File>,
}

impl GpuSink {
    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        self.sink.path()
    }
}

/// A file opened once by [`GpuReader::open`] for any number of reads.
#[derive(Debug)]
pub struct GpuFile {
    path: PathBuf,
    /// The compat engine's view, opened when first needed.
    src: OnceLock<Source>,
    direct: Option<File>,
}

impl GpuFile {
    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compat engine's view of the file, opened on first use.
    fn source(&self) -> Result<&Source> {
        if let Some(src) = self.src.get() {
            return Ok(src);
        }
        let src = Source::open(&self.path)?;
        // The path may name another file by now (one renamed over it, a saver's atomic
        // replace): reads through the module and through this view would then mix two files.
        if self.direct.as_ref().is_some_and(|d| !src.same_file(d)) {
            return Err(Error::OpenFile {
                path: self.path.clone(),
                errno: Errno::ESTALE,
            });
        }
        // Two threads may both open it; one view is kept, the other closed.
        Ok(self.src.get_or_init(|| src))
    }

    /// Whether the module can read it directly (it is open with `O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }
}

/// GPU memory registered once by [`GpuReader::register`]; unregistered when dropped.
#[derive(Debug)]
pub struct GpuBuffer<'a, M: GpuMemory + ?Sized = CudaSlice<u8>> {
    memory: &'a mut M,
    reg: std::result::Result<Registration<'a>, CompatReason>,
    /// The address and length registered: reads and writes refuse memory that is no longer
    /// that (replaced through [`GpuBuffer::memory_mut`]).
    at: (u64, u64),
}

impl<M: GpuMemory + ?Sized> GpuBuffer<'_, M> {
    /// Whether the module registered the memory; `Err` says why reads into it go through
    /// the compat engine.
    pub fn registered(&self) -> std::result::Result<(), CompatReason> {
        self.reg.as_ref().map(|_| ()).map_err(|why| *why)
    }

    /// The memory, for CUDA work between reads (copies, kernels that read it).
    pub fn memory(&self) -> &M {
        self.memory
    }

    /// The memory, for CUDA work that changes it between reads and writes (filling it with
    /// what [`GpuReader::write_from`] is to write). Reads and writes are synchronous, so no
    /// transfer is in flight while this borrow lives. Replacing the memory itself (with
    /// `std::mem::replace`) makes every later read and write of the buffer
    /// [`Error::StaleBuffer`]: the registration is the old memory's, which the caller owns
    /// again.
    pub fn memory_mut(&mut self) -> &mut M {
        self.memory
    }

    /// Readies the memory for a transfer by `backend`'s engine (on its GPU, the work queued on
    /// it finished) and returns its address; `Err` when it is no longer the memory registered.
    fn prepare(&mut self, backend: &CudaBackend) -> Result<u64> {
        let now = (self.memory.settle(backend)?, self.memory.bytes());
        if now != self.at {
            return Err(Error::StaleBuffer {
                registered: self.at.0,
                now: now.0,
            });
        }
        Ok(now.0)
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.memory.bytes()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Element types for which every bit pattern is a value (integers and floats): a read fills
/// memory of them with a file's bytes, and copying those back to the host must give valid
/// values (a `bool` or `char` could not be one, so this does not compile):
///
/// ```compile_fail,E0277
/// fn fill(reader: &gdirect::gpu::GpuReader, flags: &mut cudarc::driver::CudaSlice<bool>) {
///     let _ = reader.register(flags);
/// }
/// ```
pub trait Plain: private::Sealed + DeviceRepr {}

macro_rules! plain {
    ($($t:ty)*) => {$(
        impl private::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8 i8 u16 i16 u32 i32 u64 i64 u128 i128 usize isize f32 f64);

/// CUDA memory a [`GpuReader`] reads into: a [`CudaSlice`] or [`CudaViewMut`] of
/// [`Plain`] elements (offsets and lengths are in bytes), or a [`RawGpuMemory`]. Implemented
/// by this crate only (this does not compile):
///
/// ```compile_fail,E0277
/// struct Mine;
/// impl gdirect::gpu::GpuMemory for Mine {}
/// ```
pub trait GpuMemory: private::Target {}

impl<T: private::Target + ?Sized> GpuMemory for T {}

/// Device memory that another library allocated (a PyTorch tensor's, a CuPy array's), known
/// by its address and length, as a [`GpuReader`] destination. Neither `Copy` nor `Clone`: the
/// value stands for the caller's exclusive use of the memory, which [`RawGpuMemory::new`]'s
/// contract promises.
#[derive(Debug, PartialEq, Eq)]
pub struct RawGpuMemory {
    ptr: u64,
    len: u64,
    ordinal: usize,
}

impl RawGpuMemory {
    /// The `len` bytes of device memory at `ptr`; an error where the driver does not know
    /// them as one allocation of device memory.
    ///
    /// # Safety
    ///
    /// The memory stays allocated, and nothing but the reads this value is given to reads or
    /// writes it, until every such read has ended (for [`GpuReader::read_async`], until its
    /// [`PendingRead`] says it is done); no Rust reference points into it meanwhile.
    pub unsafe fn new(ptr: u64, len: u64) -> Result<Self> {
        let a = DeviceAllocation::of(ptr)?;
        if ptr
            .checked_add(len)
            .is_none_or(|end| end > a.start + a.size)
        {
            return Err(Error::OutOfMemoryRange {
                offset: ptr - a.start,
                len,
                size: a.size,
            });
        }
        Ok(Self {
            ptr,
            len,
            ordinal: a.ordinal,
        })
    }

    /// Its address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its CUDA device.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

mod private {
    use super::*;
    use crate::compat::cuda_err;

    pub trait Sealed {}

    /// What a reader needs of its destination.
    pub trait Target {
        /// Its size in bytes.
        fn bytes(&self) -> u64;
        /// Its device address.
        fn address(&self) -> u64;
        /// The CUDA device it is on.
        fn ordinal(&self) -> usize;
        /// Waits until the work queued on it has finished (the backend's context is current);
        /// its address.
        fn wait_queued(&mut self, backend: &CudaBackend) -> Result<u64>;
        /// Readies it for a transfer by `backend`'s engine (on its device, nothing queued on
        /// it); its address.
        fn settle(&mut self, backend: &CudaBackend) -> Result<u64> {
            let engine = backend.context().ordinal();
            if self.ordinal() != engine {
                return Err(Error::WrongDevice {
                    memory: self.ordinal(),
                    engine,
                });
            }
            self.wait_queued(backend)
        }
    }

    /// Waits for the work on `stream` and on the streams whose use of `mem` cudarc tracks.
    fn settle_slice<T, S: DevicePtrMut<T>>(mem: &mut S) -> Result<u64> {
        let stream = mem.stream().clone();
        // The stream waits for every earlier use of the memory (cudarc's events), then the
        // host waits for the stream.
        let (ptr, _written) = mem.device_ptr_mut(&stream);
        stream
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the destination's stream", e))?;
        Ok(ptr)
    }

    impl<T: Plain> Target for CudaSlice<T> {
        fn bytes(&self) -> u64 {
            self.num_bytes() as u64
        }
        fn address(&self) -> u64 {
            DevicePtr::device_ptr(self, self.stream()).0
        }
        fn ordinal(&self) -> usize {
            CudaSlice::ordinal(self)
        }
        fn wait_queued(&mut self, _: &CudaBackend) -> Result<u64> {
            settle_slice(self)
        }
    }

    impl<T: Plain> Target for CudaViewMut<'_, T> {
        fn bytes(&self) -> u64 {
            DeviceSlice::num_bytes(self) as u64
        }
        fn address(&self) -> u64 {
            DevicePtr::device_ptr(self, DeviceSlice::stream(self)).0
        }
        fn ordinal(&self) -> usize {
            DeviceSlice::stream(self).context().ordinal()
        }
        fn wait_queued(&mut self, _: &CudaBackend) -> Result<u64> {
            settle_slice(self)
        }
    }

    impl Target for DeviceBuffer {
        fn bytes(&self) -> u64 {
            DeviceSlice::num_bytes(self) as u64
        }
        fn address(&self) -> u64 {
            self.ptr()
        }
        fn ordinal(&self) -> usize {
            DeviceBuffer::ordinal(self)
        }
        fn wait_queued(&mut self, _: &CudaBackend) -> Result<u64> {
            // Work on other streams was waited for when it was queued (`DevicePtr`).
            self.synchronize()?;
            Ok(self.ptr())
        }
    }

    impl Target for RawGpuMemory {
        fn bytes(&self) -> u64 {
            self.len
        }
        fn address(&self) -> u64 {
            self.ptr
        }
        fn ordinal(&self) -> usize {
            self.ordinal
        }
        fn wait_queued(&mut self, backend: &CudaBackend) -> Result<u64> {
            // The stream that last used it is not known: all of the context's work.
            backend.synchronize()?;
            Ok(self.ptr)
        }
    }
}

/// `Ok` when `len` bytes at `offset` lie inside memory of `size` bytes.
fn in_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfMemoryRange { offset, len, size }),
    }
}

/// The [`Transfer`] of a compat read: every byte went through host memory (the page cache or
/// a staging buffer).
pub(crate) fn compat_transfer(bytes: u64, eof: bool, why: CompatReason) -> Transfer {
    Transfer {
        engine: Engine::Compat(why),
        bytes,
        path: IoPath::Bounce,
        reason: Reason::None,
        transport: Transport::Unknown,
        eof,
        bounce_bytes: bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_names_why_the_module_cannot_serve() {
        let gone = Driver::open_path("/nonexistent/gdirect").map(|_| ());
        assert_eq!(
            gone.as_ref().map_err(CompatReason::from_error),
            Err(CompatReason::NoModule)
        );
        // Another driver's device answers GET_INFO with ENOTTY: not gdirect.
        let other = Driver::open_path("/dev/null").map(|_| ());
        assert_eq!(
            other.as_ref().map_err(CompatReason::from_error),
            Err(CompatReason::Incompatible)
        );
        let denied = Error::PermissionDenied {
            path: "/dev/gdirect".into(),
        };
        assert_eq!(CompatReason::from_error(&denied), CompatReason::NoAccess);
        let newer = Error::VersionMismatch {
            path: "/dev/gdirect".into(),
            module: 2,
            library: 1,
        };
        assert_eq!(CompatReason::from_error(&newer), CompatReason::Incompatible);
        for r in [CompatReason::NoAccess, CompatReason::Incompatible] {
            assert!(!Engine::Compat(r).explain().contains("not loaded"), "{r:?}");
        }
    }

    /// A file of `len` pseudo-random bytes from `seed` in the temporary directory, and its bytes.
    fn random_file(tag: &str, len: usize, seed: u64) -> (PathBuf, Vec<u8>) {
        let path = std::env::temp_dir().join(format!("gdirect-{tag}-{}", std::process::id()));
        let mut state = seed;
        let mut data: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        data.truncate(len);
        std::fs::write(&path, &data).expect("test file");
        (path, data)
    }

    /// Runs a future to its end on this thread (the test's executor).
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let mut f = std::pin::pin!(f);
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    const POISON: u8 = 0xa5;

    /// Every destination a reader takes (a slice of `f32`, a view into part of a slice, memory
    /// known only by its address), vectored reads from two files, and reads in flight at once
    /// (waited for, and awaited): each range exact, the bytes around it still the poison put
    /// there first, and each bad request refused before a byte moves. Run on a GPU machine:
    /// `cargo test -p gdirect --features cuda -- --ignored handles`.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn handles_take_any_plain_memory_vectored_and_async_reads() {
        use cudarc::driver::CudaContext;
        let mib = 1usize << 20;
        let (pa, a) = random_file("any-a", 6 * mib + 12345, 0x9e37_79b9_7f4a_7c15);
        let (pb, b) = random_file("any-b", 3 * mib, 0xd1b5_4a32_d192_ed03);
        let ctx = CudaContext::new(0).expect("CUDA context");
        let stream = ctx.default_stream();
        let engine = CompatEngine::builder()
            .threads(4)
            .build(CudaBackend::from_context(ctx.clone()))
            .expect("engine");
        let reader = Arc::new(GpuReader::new(engine));
        let (fa, fb) = (
            Arc::new(reader.open(&pa).expect("open a")),
            reader.open(&pb).expect("open b"),
        );
        let poisoned = |n: usize| {
            let mut m = stream.alloc_zeros::<u8>(n).expect("GPU memory");
            stream
                .memcpy_htod(&vec![POISON; n], &mut m)
                .expect("poison");
            m
        };
        // (memory offset, expected bytes) pieces of `got`; everything else is poison.
        let check = |got: &[u8], pieces: &[(usize, &[u8])], what: &str| {
            let mut want = vec![POISON; got.len()];
            for &(at, bytes) in pieces {
                want[at..at + bytes.len()].copy_from_slice(bytes);
            }
            let bad = got.iter().zip(&want).position(|(g, w)| g != w);
            assert_eq!(bad, None, "{what}: first wrong byte");
        };

        // A slice of f32: offsets and lengths in bytes.
        let mut f32s = stream
            .clone_htod(&vec![f32::from_bits(u32::from_ne_bytes([POISON; 4])); mib])
            .expect("f32 memory");
        {
            let mut buf = reader.register(&mut f32s);
            assert_eq!(buf.len(), 4 * mib as u64);
            let r = reader
                .read_into(&fa, &mut buf, 4096, 8192, 2 * mib as u64)
                .expect("read into f32");
            assert_eq!(r.transfer.bytes, 2 * mib as u64);
        }
        let got: Vec<u8> = stream
            .clone_dtoh(&f32s)
            .expect("copy back")
            .iter()
            .flat_map(|f| f.to_ne_bytes())
            .collect();
        check(&got, &[(4096, &a[8192..8192 + 2 * mib])], "f32 slice");

        // A view of the middle of a slice, read by segments of two files.
        let mut big = poisoned(8 * mib);
        {
            let mut view = big.slice_mut(mib..5 * mib);
            let mut buf = reader.register(&mut view);
            assert_eq!(buf.len(), 4 * mib as u64);
            let seg = |file, file_offset, len, mem_offset| GpuSegment {
                file,
                file_offset,
                len,
                mem_offset,
            };
            let m = mib as u64;
            // Refused before any byte moves (the first segment's range stays poison): a
            // segment past the view's end, overlapping ones.
            for bad in [
                vec![seg(&*fa, 0, m / 2, 2 * m), seg(&fb, 0, m, 3 * m + 1)],
                vec![seg(&*fa, 0, m / 2, 2 * m), seg(&fb, 0, m, 2 * m + m / 4)],
            ] {
                let r = reader.read_vectored_into(&mut buf, &bad);
                assert!(
                    matches!(
                        r,
                        Err(Error::OutOfMemoryRange { .. } | Error::BadSetting { .. })
                    ),
                    "{r:?}"
                );
            }
            let v = reader
                .read_vectored_into(
                    &mut buf,
                    &[
                        seg(&*fa, 0, m, 0),
                        // Past the end of b: 1 MiB of 2.
                        seg(&fb, 2 * m, 2 * m, m),
                        seg(&*fa, 6 * m, 64 << 10, 3 * m + 4096),
                    ],
                )
                .expect("vectored read");
            let bytes: Vec<u64> = v.transfers.iter().map(|t| t.bytes).collect();
            assert_eq!(bytes, [m, m, 12345]);
            let eofs: Vec<bool> = v.transfers.iter().map(|t| t.eof).collect();
            assert_eq!(eofs, [false, true, true]);
            assert_eq!(v.bytes(), 2 * m + 12345);
        }
        let got = stream.clone_dtoh(&big).expect("copy back");
        check(
            &got,
            &[
                (mib, &a[..mib]),
                (2 * mib, &b[2 * mib..]),
                (4 * mib + 4096, &a[6 * mib..]),
            ],
            "view",
        );

        // Memory known only by its address (as another library's would be).
        let backing = poisoned(2 * mib);
        let ptr = backing.device_ptr(&stream).0;
        // SAFETY: the first MiB of `backing`, which lives to the end of the test and which
        // nothing else touches while `raw` is read into.
        let mut raw = unsafe { RawGpuMemory::new(ptr, mib as u64) }.expect("raw memory");
        assert_eq!(raw.ordinal(), 0);
        let r = reader
            .read(&pb, &mut raw, 4096, mib as u64, 65536)
            .expect("read into raw memory");
        assert_eq!(r.transfer.bytes, 65536);
        // Beyond its allocation, and host memory, are refused.
        // SAFETY: refused before any use.
        let past = unsafe { RawGpuMemory::new(ptr + mib as u64, 2 * mib as u64) };
        assert!(
            matches!(past, Err(Error::OutOfMemoryRange { .. })),
            "{past:?}"
        );
        let host = [0u8; 64];
        // SAFETY: refused before any use.
        let host = unsafe { RawGpuMemory::new(host.as_ptr() as u64, 64) };
        assert!(matches!(host, Err(Error::Cuda { .. })), "{host:?}");
        // Memory of another device than the engine's is refused before a byte moves.
        let mut other = RawGpuMemory { ordinal: 1, ..raw };
        let r = reader.read(&pb, &mut other, 0, 0, 65536);
        assert!(
            matches!(
                r,
                Err(Error::WrongDevice {
                    memory: 1,
                    engine: 0
                })
            ),
            "{r:?}"
        );
        let got = stream.clone_dtoh(&backing).expect("copy back");
        check(&got, &[(4096, &b[mib..mib + 65536])], "raw memory");

        // Two reads in flight: one waited for, one awaited; an error comes back with its
        // memory.
        let p1 = reader
            .read_async(fa.clone(), poisoned(4 * mib), 0, 0, 4 * mib as u64)
            .expect("start 1");
        let p2 = reader
            .read_async(
                fa.clone(),
                poisoned(4 * mib),
                4096,
                2 * mib as u64,
                4 * mib as u64 - 4096,
            )
            .expect("start 2");
        let p3 = reader
            .read_async(fa.clone(), poisoned(mib), 0, 0, 2 * mib as u64)
            .expect("start 3");
        let (m1, r1) = p1.wait();
        let (m2, r2) = block_on(p2);
        let (m3, r3) = p3.wait();
        assert_eq!(r1.expect("read 1").transfer.bytes, 4 * mib as u64);
        assert!(matches!(r3, Err(Error::OutOfMemoryRange { .. })), "{r3:?}");
        assert_eq!(m3.len(), mib);
        let r2 = r2.expect("read 2").transfer;
        assert_eq!((r2.bytes, r2.eof), (4 * mib as u64 - 4096, false));
        let got = stream.clone_dtoh(&m1).expect("copy back");
        check(&got, &[(0, &a[..4 * mib])], "async 1");
        let got = stream.clone_dtoh(&m2).expect("copy back");
        check(&got, &[(4096, &a[2 * mib..6 * mib - 4096])], "async 2");
        let got = stream.clone_dtoh(&m3).expect("copy back");
        check(&got, &[], "async 3 (refused)");
        for p in [pa, pb] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// GPU memory to files: aligned ranges and unaligned ones, at the start, in the middle and
    /// past the end of the file (which grows), from a slice of `u32` and from a view; the file
    /// holds exactly those bytes and nothing else changed; a range past the memory is refused
    /// before the file is touched. Run on a GPU machine:
    /// `cargo test -p gdirect --features cuda -- --ignored handles`.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn handles_write_gpu_memory_to_files() {
        use cudarc::driver::CudaContext;
        let mib = 1usize << 20;
        let (_, src) = random_file("write-src", 4 * mib, 0x94d0_49bb_1331_11eb);
        let out = std::env::temp_dir().join(format!("gdirect-write-out-{}", std::process::id()));
        let _ = std::fs::remove_file(&out);
        let ctx = CudaContext::new(0).expect("CUDA context");
        let stream = ctx.default_stream();
        let engine = CompatEngine::builder()
            .threads(3)
            .task_size(1 << 20)
            .build(CudaBackend::from_context(ctx.clone()))
            .expect("engine");
        let reader = GpuReader::new(engine);
        let words: Vec<u32> = src
            .chunks(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut mem = stream.clone_htod(&words).expect("GPU memory");
        let sink = reader.create(&out, true).expect("create");
        assert_eq!(sink.path(), out);
        let mut want: Vec<u8> = Vec::new();
        let put = |want: &mut Vec<u8>, at: usize, bytes: &[u8]| {
            if want.len() < at + bytes.len() {
                want.resize(at + bytes.len(), 0);
            }
            want[at..at + bytes.len()].copy_from_slice(bytes);
        };
        {
            let mut buf = reader.register(&mut mem);
            // (memory offset, file offset, length)
            for (mo, fo, len) in [
                (0, 0, 3 * mib),
                (mib, 5 * mib + 4096, 2 * mib),
                (12345, 777, 100_000),
                (4 * mib - 4096, 3 * mib - 10, 4096),
            ] {
                let r = reader
                    .write_from(&sink, &mut buf, mo as u64, fo as u64, len as u64)
                    .expect("write");
                assert_eq!(r.transfer.bytes, len as u64, "{len} bytes at {fo}");
                put(&mut want, fo, &src[mo..mo + len]);
            }
            let before = std::fs::read(&out).expect("read back");
            let r = reader.write_from(&sink, &mut buf, 4 * mib as u64 - 4096, 0, 8192);
            assert!(matches!(r, Err(Error::OutOfMemoryRange { .. })), "{r:?}");
            assert!(
                std::fs::read(&out).expect("read back") == before,
                "a refused write wrote"
            );
        }
        {
            let mut view = mem.slice_mut(mib / 4..mib / 2);
            let mut buf = reader.register(&mut view);
            let r = reader
                .write_from(&sink, &mut buf, 0, 8 * mib as u64, mib as u64)
                .expect("write from a view");
            assert_eq!(r.transfer.bytes, mib as u64);
            put(&mut want, 8 * mib, &src[mib..2 * mib]);
        }
        let got = std::fs::read(&out).expect("read back");
        assert_eq!(got.len(), want.len());
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(bad, None, "first wrong byte of the file");
        let _ = std::fs::remove_file(&out);
    }

    /// Open once, register once, many reads: every range exact, short at the end of the file,
    /// and each transfer saying which engine served it and why (the GPU machines we have run
    /// no module, so the compat engine; a node with the module registers the buffer). Run on a
    /// GPU machine: `cargo test -p gdirect --features cuda -- --ignored handles`.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn handles_read_many_ranges_from_one_open_and_one_registration() {
        use cudarc::driver::CudaContext;
        let (path, data) = random_file("handles", 8 << 20, 0x2545_f491_4f6c_dd1d);
        let ctx = CudaContext::new(0).expect("CUDA context");
        let stream = ctx.default_stream();
        let mut mem = stream.alloc_zeros::<u8>(4 << 20).expect("GPU memory");
        let engine = CompatEngine::builder()
            .threads(4)
            .build(CudaBackend::from_context(ctx.clone()))
            .expect("engine");
        let reader = GpuReader::new(engine);
        let missing = reader.open(path.with_extension("missing"));
        assert!(
            matches!(missing, Err(Error::OpenFile { .. })),
            "{missing:?}"
        );
        let file = reader.open(&path).expect("open");
        assert_eq!(file.path(), path);
        let mut buf = reader.register(&mut mem);
        assert_eq!(buf.len(), 4 << 20);
        match reader.compat_reason() {
            Some(why) => assert_eq!(buf.registered(), Err(why)),
            None => assert_eq!(buf.registered(), Ok(())),
        }
        let mib = 1u64 << 20;
        // (memory offset, file offset, length, bytes expected)
        for (mo, fo, len, want) in [
            (0, 0, 4 * mib, 4 * mib),
            (4096, mib, mib, mib),
            (mib, 7 * mib + 4096, 2 * mib, mib - 4096),
            (2 * mib, 3 * mib + 12288, 65536, 65536),
            (0, 8 * mib, mib, 0),
        ] {
            stream.memset_zeros(&mut *buf.memory_mut()).expect("clear");
            let r = reader
                .read_into(&file, &mut buf, mo, fo, len)
                .expect("read");
            assert_eq!(r.transfer.bytes, want, "{len} bytes at {fo}");
            assert_eq!(r.transfer.eof, want < len);
            assert_eq!(
                r.transfer.engine.name(),
                if r.compat.is_some() {
                    "compat"
                } else {
                    "module"
                }
            );
            let back = stream.clone_dtoh(buf.memory()).expect("copy back");
            let (mo, fo, want) = (mo as usize, fo as usize, want as usize);
            assert!(
                back[mo..mo + want] == data[fo..fo + want],
                "{len} bytes at {fo}"
            );
            assert!(
                back[..mo].iter().chain(&back[mo + want..]).all(|&b| b == 0),
                "wrote outside the range"
            );
        }
        let r = reader.read_into(&file, &mut buf, 4 * mib - 4096, 0, 8192);
        assert!(
            matches!(
                r,
                Err(Error::OutOfMemoryRange { .. } | Error::OutOfRegistration { .. })
            ),
            "{r:?}"
        );
        // Memory swapped under the registration is refused, old and new untouched.
        let other = stream.alloc_zeros::<u8>(4 << 20).expect("GPU memory");
        let old = std::mem::replace(buf.memory_mut(), other);
        let r = reader.read_into(&file, &mut buf, 0, 0, 4096);
        assert!(matches!(r, Err(Error::StaleBuffer { .. })), "{r:?}");
        let back = stream.clone_dtoh(buf.memory()).expect("copy back");
        assert!(back.iter().all(|&b| b == 0), "the new memory was written");
        drop(old);
        drop(buf);
        let _ = std::fs::remove_file(&path);
    }

    /// What the driver says of the two kinds of allocation (printed: the H200 run's record of
    /// it), the register check that refuses pool memory and takes `DeviceBuffer`s, and a
    /// `DeviceBuffer` as cudarc's copies and a reader's destination take it, on its own stream
    /// and another. Run on a GPU machine: `cargo test -p gdirect --features cuda-13000 --
    /// --ignored device_buffers`.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn device_buffers_are_registrable_and_pool_memory_is_not() {
        use crate::DeviceMemory;
        use cudarc::driver::CudaContext;
        let ctx = CudaContext::new(0).expect("CUDA context");
        let stream = ctx.default_stream();
        let pooled = stream.alloc_zeros::<u8>(4 << 20).expect("GPU memory");
        let pooled_facts = RdmaFacts::of(pooled.device_address()).expect("pointer query");
        let mut buf = DeviceBuffer::new(&stream, (4 << 20) - 1000).expect("cuMemAlloc");
        let facts = RdmaFacts::of(buf.ptr()).expect("pointer query");
        println!(
            "device pools supported: {}; cudarc's slice: {pooled_facts:?}; DeviceBuffer: {facts:?}",
            ctx.has_async_alloc()
        );
        assert_eq!(pooled_facts.pool, ctx.has_async_alloc());
        assert!(!facts.pool);
        match pooled.registrable() {
            Err(Error::PoolMemory { addr }) => {
                assert!(pooled_facts.pool);
                assert_eq!(addr, pooled.device_address());
            }
            Ok(()) => assert!(!pooled_facts.pool),
            Err(e) => panic!("{e}"),
        }
        assert!(buf.registrable().is_ok());
        assert_eq!(DeviceSlice::len(&buf), 4 << 20);
        assert_eq!(buf.ptr() % (64 << 10), 0);
        assert_eq!(stream.clone_dtoh(&buf).expect("copy"), vec![0u8; 4 << 20]);

        // Copies on its own stream and on another.
        let (path, data) = random_file("devbuf", 4 << 20, 0x9e37_79b9_7f4a_7c15);
        stream.memcpy_htod(&data, &mut buf).expect("copy in");
        let other = ctx.new_stream().expect("stream");
        assert!(other.clone_dtoh(&buf).expect("copy out") == data);
        other
            .memcpy_htod(&vec![0xa5u8; 4 << 20], &mut buf)
            .expect("poison");
        assert!(stream.clone_dtoh(&buf).expect("copy") == vec![0xa5u8; 4 << 20]);

        // A reader's destination: every byte from the file (over the poison).
        let engine = CompatEngine::builder()
            .threads(2)
            .build(CudaBackend::from_context(ctx.clone()))
            .expect("engine");
        let reader = GpuReader::new(engine);
        let file = reader.open(&path).expect("open");
        {
            let mut reg = reader.register(&mut buf);
            if let Some(why) = reader.compat_reason() {
                assert_eq!(reg.registered(), Err(why));
            }
            let r = reader
                .read_into(&file, &mut reg, 0, 0, 4 << 20)
                .expect("read");
            assert_eq!(r.transfer.bytes, 4 << 20);
            println!("read into a DeviceBuffer: {}", r.transfer.engine.explain());
        }
        assert!(stream.clone_dtoh(&buf).expect("copy") == data);
        drop(buf);
        let _ = std::fs::remove_file(&path);
    }

    /// The README shows the example of [`GpuReader`]'s documentation, which compiles as a
    /// doctest: the two stay the same code.
    #[test]
    fn the_readme_example_is_the_doctest() {
        let readme = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let Ok(readme) = std::fs::read_to_string(readme) else {
            return; // a packaged crate has no README of the repository
        };
        let src = include_str!("gpu.rs");
        let doc: String = src
            .lines()
            .skip_while(|l| *l != "/// ```no_run")
            .skip(1)
            .take_while(|l| *l != "/// ```")
            .filter(|l| !l.starts_with("/// #"))
            .map(|l| {
                format!(
                    "{}\n",
                    l.trim_start_matches("///").strip_prefix(' ').unwrap_or("")
                )
            })
            .collect();
        assert!(
            doc.contains("reader.register"),
            "the doc example was not found"
        );
        assert!(
            readme.contains(&format!("```rust\n{doc}```")),
            "README's GpuReader example differs from the doctest:\n{doc}"
        );
    }

    #[test]
    fn only_transfers_below_the_threshold_skip_the_module_and_only_in_auto_mode() {
        let t = 1 << 20;
        let below = Some(CompatReason::BelowThreshold);
        assert_eq!(below_threshold(4096, t, CompatMode::Auto, true), below);
        assert_eq!(below_threshold(t - 1, t, CompatMode::Auto, true), below);
        assert_eq!(below_threshold(t, t, CompatMode::Auto, true), None);
        // 0 (the default) never skips; off never leaves the module; without the module (or
        // with compat on) the reason is the module's, not the size.
        assert_eq!(below_threshold(0, 0, CompatMode::Auto, true), None);
        assert_eq!(below_threshold(4096, t, CompatMode::Off, true), None);
        assert_eq!(below_threshold(4096, t, CompatMode::Auto, false), None);
        assert_eq!(below_threshold(4096, t, CompatMode::On, false), None);
        assert!(Engine::Compat(CompatReason::BelowThreshold)
            .explain()
            .contains("GDIRECT_DIRECT_THRESHOLD"));
    }

    #[test]
    fn compat_mode_off_is_an_error_never_a_fallback() {
        assert_eq!(CompatMode::parse(" OFF "), Some(CompatMode::Off));
        assert_eq!(CompatMode::parse("1"), Some(CompatMode::On));
        assert_eq!(CompatMode::parse("Auto"), Some(CompatMode::Auto));
        assert_eq!(CompatMode::parse("sometimes"), None);
        assert_eq!(CompatMode::default(), CompatMode::Auto);
        assert_eq!(
            CompatMode::Auto.allow(CompatReason::NoModule).ok(),
            Some(CompatReason::NoModule)
        );
        let e = CompatMode::Off
            .allow(CompatReason::NoProvider)
            .expect_err("off never falls back");
        assert!(matches!(
            e,
            Error::CompatModeOff {
                reason: CompatReason::NoProvider
            }
        ));
        assert!(e.to_string().contains("GDIRECT_COMPAT_MODE=off"), "{e}");
        assert_eq!(e.errno(), Some(Errno::EOPNOTSUPP));
    }
}
