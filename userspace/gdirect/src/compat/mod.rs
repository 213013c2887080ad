// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The compat engine: file bytes into GPU (or host) memory without the kernel module.
//!
//! Where the module cannot load (containers, signed-module kernels, managed clouds) or the
//! hardware cannot do peer-to-peer DMA, this is how the library still moves file data into
//! device memory fast:
//!
//! - **Uncached data**: parallel `O_DIRECT` reads into pinned staging buffers, each worker
//!   with its own buffers and CUDA stream, the host-to-device copy of one buffer overlapping
//!   the read into the next.
//! - **Cached data** (every page of a piece in the page cache, asked with `mincore`): either
//!   the GPU DMAs straight from the page cache — a read-only mapping of the file registered
//!   with the CUDA driver, in pieces, by all workers at once (`PageCache::Mapped`) — or
//!   buffered reads copy it into the staging buffers (`PageCache::Buffered`). `Auto` takes the
//!   backend's preference for cached pieces and direct I/O for the rest, piece by piece.
//!
//! Settings ([`Settings`]) come from [`CompatEngine::builder`], over environment variables
//! (`GDIRECT_THREADS`, `GDIRECT_TASK_SIZE`, `GDIRECT_STAGING_SIZE`, `GDIRECT_PAGE_CACHE`,
//! `GDIRECT_KEEP_MAPPED`), over defaults measured on an H200 machine (`BENCHMARKS.md`).

mod host;
mod plan;
mod source;
mod write;

#[cfg(feature = "cuda")]
mod cuda;

use std::{
    io,
    ops::Range,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Instant,
};

#[cfg(feature = "cuda")]
pub(crate) use cuda::{cuda_err, Entered};
#[cfg(feature = "cuda")]
pub use cuda::{
    device_count, device_facts, driver_present, CudaBackend, DeviceAllocation, DeviceFacts,
};
pub use host::HostBackend;
#[doc(hidden)]
pub use source::writes_counted;
pub use source::Source;
pub(crate) use source::{file_key, note_write_key};
pub use write::Sink;

use crate::error::{Errno, Error, Result};
use plan::Plan;
use source::{FileId, How, Input, Mapping};

/// The alignment of direct I/O offsets and lengths: 4 KiB serves every logical block size up
/// to 4 KiB.
const DIRECT_ALIGN: u64 = 4096;

/// The unit in which a file's mapping is registered with the backend (and cached).
const MAP_CHUNK: u64 = 32 << 20;

/// What the engine copies into: host memory, or a GPU's.
///
/// # Safety
///
/// The engine's `unsafe` code relies on an implementation: [`Backend::dest`] returns a view of
/// exactly [`Backend::dest_len`] bytes of the memory, usable from any thread for as long as the
/// memory lives; a lane's [`Lane::buffer`] returns memory of at least the length asked that
/// only that lane writes, and its copies write only `off..off + len` of their destination;
/// [`Lane::finish`] returns only once every copy started on the lane is done. So implementing
/// it is `unsafe` (this does not compile):
///
/// ```compile_fail,E0200
/// struct Mine;
/// impl gdirect::compat::Backend for Mine {}
/// ```
pub unsafe trait Backend: Send + Sync {
    /// The memory a read fills.
    type Memory: ?Sized;
    /// A raw view of that memory for the workers, valid for one read.
    type Dest: Copy + Send + Sync;
    /// A worker's staging buffers and copy queue.
    type Lane: Lane<Dest = Self::Dest> + Send;
    /// What [`Backend::enter_thread`] returns: dropping it leaves the thread as it was.
    type Entered;

    /// The raw view of `memory`.
    fn dest(memory: &mut Self::Memory) -> Self::Dest;
    /// Its length in bytes.
    fn dest_len(dest: &Self::Dest) -> u64;
    /// A new lane of `buffers` staging buffers of `capacity` bytes each, allocated when first
    /// used (made in the worker thread that uses it).
    fn lane(&self, buffers: usize, capacity: usize) -> Result<Self::Lane>;
    /// Makes the backend usable on the calling thread until the returned value is dropped: a
    /// CUDA backend pushes its context and pops it then, so the caller's current context is
    /// the one it had before (the engine enters on the caller's thread for each read and in
    /// each worker).
    fn enter_thread(&self) -> Result<Self::Entered>;
    /// Waits for work on `memory` queued before the read (a CUDA allocation's stream).
    fn before_read(&self, _memory: &Self::Memory) -> Result<()> {
        Ok(())
    }
    /// Makes `len` bytes of page-cache mapping at `ptr` usable by [`Lane::send_mapped`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is mapped, page aligned, and stays mapped until
    /// [`Backend::unregister`] of `ptr`.
    unsafe fn register(&self, _ptr: *const u8, _len: usize) -> Result<()> {
        Ok(())
    }
    /// Undoes [`Backend::register`].
    ///
    /// # Safety
    ///
    /// `ptr` was registered by [`Backend::register`] and not unregistered since, and no copy
    /// from it is in flight on any lane.
    unsafe fn unregister(&self, _ptr: *const u8) {}
    /// Whether cached data should go by the mapped path when the settings say `Auto`.
    fn prefers_mapped(&self) -> bool {
        false
    }
}

/// A worker's staging buffers and copy queue.
///
/// # Safety
///
/// See [`Backend`]: an implementation keeps the promises made there for lanes.
pub unsafe trait Lane {
    /// See [`Backend::Dest`].
    type Dest;
    /// Staging buffer `i`, at least `len` bytes and 4 KiB aligned, once copies out of it are
    /// done.
    fn buffer(&mut self, i: usize, len: usize) -> Result<&mut [u8]>;
    /// Starts copying `buffer(i)[range]` to the destination at `off`.
    ///
    /// A destination outlives the memory it views, so safe code cannot send to one (this
    /// example, which writes freed memory, does not compile):
    ///
    /// ```compile_fail,E0133
    /// use gdirect::compat::{Backend, HostBackend, Lane};
    /// let mut mem = vec![0u8; 4096];
    /// let dest = HostBackend::dest(&mut mem[..]);
    /// drop(mem);
    /// let mut lane = HostBackend.lane(1, 4096)?;
    /// lane.buffer(0, 4096)?;
    /// lane.send(0, 0..4096, dest, 0)?;
    /// # Ok::<(), gdirect::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// `dest` was made by [`Backend::dest`] from memory that stays alive, and that nothing
    /// else reads or writes, until [`Lane::finish`] returns; no other copy in flight writes
    /// `off..off + range.len()` of it. (The range past the destination's end is checked: that
    /// panics.)
    unsafe fn send(
        &mut self,
        i: usize,
        range: Range<usize>,
        dest: Self::Dest,
        off: u64,
    ) -> Result<()>;
    /// Starts copying `len` bytes of registered page-cache mapping at `src` to the
    /// destination at `off`.
    ///
    /// # Safety
    ///
    /// As [`Lane::send`] for `dest`; and `src..src + len` lies in a range registered with
    /// [`Backend::register`] that stays registered until [`Lane::finish`] returns.
    unsafe fn send_mapped(
        &mut self,
        src: *const u8,
        len: usize,
        dest: Self::Dest,
        off: u64,
    ) -> Result<()>;
    /// Waits until every copy started has landed.
    fn finish(&mut self) -> Result<()>;
}

/// How the engine treats data in the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PageCache {
    /// Cached pieces by the backend's preferred page-cache path, the rest by direct I/O;
    /// writes direct where aligned.
    #[default]
    Auto,
    /// Everything by `O_DIRECT` (buffered reads only where the file system refuses it); writes
    /// direct where aligned.
    Direct,
    /// Everything through the page cache, by buffered reads into staging buffers; writes
    /// buffered.
    Buffered,
    /// Everything through the page cache, the device copying from a registered mapping;
    /// writes buffered.
    Mapped,
}

impl PageCache {
    /// The name in settings and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Direct => "direct",
            Self::Buffered => "buffered",
            Self::Mapped => "mapped",
        }
    }

    /// The policy named `s` (as in `GDIRECT_PAGE_CACHE`), if any.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Auto, Self::Direct, Self::Buffered, Self::Mapped]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

/// The engine's settings. Build them with [`CompatEngine::builder`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Settings {
    /// Worker threads (each with its own staging buffers and copy stream).
    pub threads: usize,
    /// Bytes per I/O: a multiple of 4 KiB.
    pub task_size: u64,
    /// Staging bytes per worker: `staging_size / task_size` buffers (at least one).
    pub staging_size: u64,
    /// Page-cache policy.
    pub page_cache: PageCache,
    /// Bytes of registered page-cache mappings kept between reads (so a file read again
    /// skips registration); 0 releases them after every read.
    pub keep_mapped: u64,
    /// The largest piece a worker claims at once.
    pub max_piece: u64,
    /// The least a write's piece is (a multiple of 4 KiB): a write is cut at multiples of
    /// this or of the task size, whichever is larger. Writers of one file take its inode's
    /// lock in turn: 16 workers writing 2 MiB pieces into the page cache wrote at half one
    /// thread's rate on an H200 node, 16 MiB pieces at its rate (BENCHMARKS.md, the save
    /// table).
    pub write_piece: u64,
    /// Record each I/O's latency in the [`Report`].
    pub latencies: bool,
    /// Reads and writes of fewer bytes than this do not try the module: `GpuReader` gives
    /// them to the compat engine at once (KvikIO's `gds_threshold`; ignored when
    /// `GDIRECT_COMPAT_MODE=off`). 0, the default, tries the module for every size.
    pub direct_threshold: u64,
}

impl Default for Settings {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self {
            threads: cpus.clamp(1, 16),
            task_size: 2 << 20,
            staging_size: 4 << 20,
            page_cache: PageCache::Auto,
            keep_mapped: 0,
            max_piece: 64 << 20,
            write_piece: 16 << 20,
            latencies: false,
            direct_threshold: 0,
        }
    }
}

/// Parses a size: a number of bytes with an optional `K`, `M` or `G` (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl Settings {
    /// The defaults, overridden by the environment variables that are set.
    pub fn from_env() -> Result<Self> {
        Self::default().with_env(|name| std::env::var(name).ok())
    }

    fn with_env(mut self, var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let bad = |name: &'static str, value: String| Error::BadSetting {
            name,
            value,
            expected: match name {
                "GDIRECT_PAGE_CACHE" => "auto, direct, buffered or mapped",
                "GDIRECT_THREADS" => "a number of threads, 1 to 1024",
                _ => "a size in bytes, with an optional K, M or G",
            },
        };
        if let Some(v) = var("GDIRECT_THREADS") {
            self.threads = v.trim().parse().map_err(|_| bad("GDIRECT_THREADS", v))?;
        }
        for (name, field) in [
            ("GDIRECT_TASK_SIZE", &mut self.task_size),
            ("GDIRECT_STAGING_SIZE", &mut self.staging_size),
            ("GDIRECT_KEEP_MAPPED", &mut self.keep_mapped),
            ("GDIRECT_DIRECT_THRESHOLD", &mut self.direct_threshold),
            ("GDIRECT_WRITE_PIECE", &mut self.write_piece),
        ] {
            if let Some(v) = var(name) {
                *field = parse_size(&v).ok_or_else(|| bad(name, v))?;
            }
        }
        if let Some(v) = var("GDIRECT_PAGE_CACHE") {
            self.page_cache =
                PageCache::parse(v.trim()).ok_or_else(|| bad("GDIRECT_PAGE_CACHE", v))?;
        }
        Ok(self)
    }

    fn check(&self) -> Result<()> {
        let bad = |name: &'static str, value: u64, expected: &'static str| {
            Err(Error::BadSetting {
                name,
                value: value.to_string(),
                expected,
            })
        };
        if !(1..=1024).contains(&self.threads) {
            return bad("threads", self.threads as u64, "1 to 1024");
        }
        if self.task_size == 0 || self.task_size % DIRECT_ALIGN != 0 || self.task_size > 1 << 30 {
            return bad(
                "task_size",
                self.task_size,
                "a multiple of 4 KiB, at most 1 GiB",
            );
        }
        if self.max_piece == 0 {
            return bad("max_piece", self.max_piece, "more than 0");
        }
        if self.write_piece == 0
            || self.write_piece % DIRECT_ALIGN != 0
            || self.write_piece > 1 << 30
        {
            return bad(
                "write_piece",
                self.write_piece,
                "a multiple of 4 KiB, at most 1 GiB",
            );
        }
        Ok(())
    }

    fn buffers(&self) -> usize {
        (self.staging_size / self.task_size).clamp(1, 64) as usize
    }
}

/// Builds a [`CompatEngine`]: the defaults, then the environment, then what is set here.
#[derive(Clone, Debug)]
pub struct Builder {
    settings: Settings,
    env: Result<Settings, String>,
    overrides: Vec<fn(&mut Settings, &Settings)>,
}

impl Builder {
    /// Worker threads.
    pub fn threads(mut self, n: usize) -> Self {
        self.settings.threads = n;
        self.overrides.push(|s, o| s.threads = o.threads);
        self
    }
    /// Bytes per I/O (a multiple of 4 KiB).
    pub fn task_size(mut self, bytes: u64) -> Self {
        self.settings.task_size = bytes;
        self.overrides.push(|s, o| s.task_size = o.task_size);
        self
    }
    /// Staging bytes per worker.
    pub fn staging_size(mut self, bytes: u64) -> Self {
        self.settings.staging_size = bytes;
        self.overrides.push(|s, o| s.staging_size = o.staging_size);
        self
    }
    /// Page-cache policy.
    pub fn page_cache(mut self, p: PageCache) -> Self {
        self.settings.page_cache = p;
        self.overrides.push(|s, o| s.page_cache = o.page_cache);
        self
    }
    /// Registered page-cache bytes kept between reads.
    pub fn keep_mapped(mut self, bytes: u64) -> Self {
        self.settings.keep_mapped = bytes;
        self.overrides.push(|s, o| s.keep_mapped = o.keep_mapped);
        self
    }
    /// The largest piece a worker claims at once.
    pub fn max_piece(mut self, bytes: u64) -> Self {
        self.settings.max_piece = bytes;
        self.overrides.push(|s, o| s.max_piece = o.max_piece);
        self
    }
    /// The least bytes a write's piece is (a multiple of 4 KiB; [`Settings::write_piece`]).
    pub fn write_piece(mut self, bytes: u64) -> Self {
        self.settings.write_piece = bytes;
        self.overrides.push(|s, o| s.write_piece = o.write_piece);
        self
    }
    /// Record per-I/O latencies in reports.
    pub fn latencies(mut self, on: bool) -> Self {
        self.settings.latencies = on;
        self.overrides.push(|s, o| s.latencies = o.latencies);
        self
    }
    /// Reads and writes smaller than this go to the compat engine without trying the module
    /// (in `GDIRECT_COMPAT_MODE=auto` only).
    pub fn direct_threshold(mut self, bytes: u64) -> Self {
        self.settings.direct_threshold = bytes;
        self.overrides
            .push(|s, o| s.direct_threshold = o.direct_threshold);
        self
    }

    /// The settings this builder makes.
    pub fn settings(&self) -> Result<Settings> {
        let mut s = match &self.env {
            Ok(env) => env.clone(),
            Err(_) => Settings::from_env()?,
        };
        for o in &self.overrides {
            o(&mut s, &self.settings);
        }
        s.check()?;
        Ok(s)
    }

    /// The engine, copying into host memory.
    pub fn build_host(self) -> Result<CompatEngine<HostBackend>> {
        self.build(HostBackend)
    }

    /// The engine, over `backend`.
    /// Starts the engine's worker threads, which serve every read and write it does.
    pub fn build<B: Backend>(self, backend: B) -> Result<CompatEngine<B>> {
        let settings = self.settings()?;
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(settings.threads)
            .thread_name(|i| format!("gdirect-io-{i}"))
            .build()
            .map_err(|_| Error::Worker {
                what: "the compat engine's worker threads could not be started",
            })?;
        Ok(CompatEngine {
            backend,
            settings,
            pool,
            lanes: Mutex::new(Vec::new()),
            maps: Mutex::new(Vec::new()),
            #[cfg(test)]
            worker_threads: Mutex::new(std::collections::HashSet::new()),
        })
    }
}

/// What one read did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// Bytes read into the memory.
    pub bytes: u64,
    /// The file ended before the length asked for (`bytes` is short).
    pub eof: bool,
    /// Bytes read with `O_DIRECT`.
    pub direct_bytes: u64,
    /// Bytes read through the page cache into staging buffers.
    pub buffered_bytes: u64,
    /// Bytes the device copied from the registered page cache.
    pub mapped_bytes: u64,
    /// Bytes of mapping registered for this read (0 when all were kept from earlier reads).
    pub registered_bytes: u64,
    /// I/Os issued (reads into staging buffers, and mapped copies).
    pub ios: u64,
    /// Workers that took part.
    pub threads: usize,
    /// Nanoseconds of each I/O, when the settings ask for them.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub latencies_ns: Vec<u64>,
}

impl Report {
    /// Adds the counts of a later read (a later piece of the same range): bytes, I/Os and
    /// latencies add up, `eof` is the later read's, `threads` the most either used.
    pub fn add(&mut self, later: &Report) {
        self.bytes += later.bytes;
        self.eof = later.eof;
        self.direct_bytes += later.direct_bytes;
        self.buffered_bytes += later.buffered_bytes;
        self.mapped_bytes += later.mapped_bytes;
        self.registered_bytes += later.registered_bytes;
        self.ios += later.ios;
        self.threads = self.threads.max(later.threads);
        self.latencies_ns.extend_from_slice(&later.latencies_ns);
    }
}

/// Counters of every compat read in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CompatStats {
    /// Reads.
    pub reads: u64,
    /// Reads that failed.
    pub errors: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Of which by `O_DIRECT`.
    pub direct_bytes: u64,
    /// Of which through the page cache into staging buffers.
    pub buffered_bytes: u64,
    /// Of which copied by the device from the registered page cache.
    pub mapped_bytes: u64,
}

static STATS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// The process's compat-engine counters.
pub fn stats() -> CompatStats {
    let g = |i: usize| STATS[i].load(Ordering::Relaxed);
    CompatStats {
        reads: g(0),
        errors: g(1),
        bytes: g(2),
        direct_bytes: g(3),
        buffered_bytes: g(4),
        mapped_bytes: g(5),
    }
}

/// `Ok` when there are as many destinations as segments.
fn one_destination_each(segments: usize, destinations: usize) -> Result<()> {
    if segments == destinations {
        return Ok(());
    }
    Err(Error::BadSetting {
        name: "segments",
        value: format!("{segments} segments, {destinations} destinations"),
        expected: "one destination per segment",
    })
}

/// `Ok` when no two `(offset, len)` ranges overlap.
pub(crate) fn disjoint(ranges: impl Iterator<Item = (u64, u64)>) -> Result<()> {
    let mut r: Vec<(u64, u64)> = ranges.filter(|&(_, len)| len > 0).collect();
    r.sort_unstable();
    for w in r.windows(2) {
        if w[0].0.saturating_add(w[0].1) > w[1].0 {
            return Err(Error::BadSetting {
                name: "segments",
                value: format!(
                    "{} bytes at {} and {} bytes at {}",
                    w[0].1, w[0].0, w[1].1, w[1].0
                ),
                expected: "segments that do not overlap in memory",
            });
        }
    }
    Ok(())
}

/// Counts a read in the process's statistics: its report, or `None` for a failed one.
fn count(r: Option<&Report>) {
    let add = |i: usize, v: u64| STATS[i].fetch_add(v, Ordering::Relaxed);
    add(0, 1);
    match r {
        Some(r) => {
            add(2, r.bytes);
            add(3, r.direct_bytes);
            add(4, r.buffered_bytes);
            add(5, r.mapped_bytes);
        }
        None => {
            add(1, 1);
        }
    }
}

/// Registration state of one [`MAP_CHUNK`] of a mapped file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Unregistered,
    Registered(usize, usize),
    Failed,
}

/// A file's mapping with its registered chunks, kept between reads up to `keep_mapped`.
struct MappedFile {
    id: FileId,
    map: Arc<Mapping>,
    chunks: Vec<Mutex<Chunk>>,
}

impl MappedFile {
    fn registered_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| match *lock(c) {
                Chunk::Registered(_, len) => len as u64,
                _ => 0,
            })
            .sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked leaves consistent state behind (every update is one store).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The compat engine over a backend: see the module docs.
pub struct CompatEngine<B: Backend> {
    backend: B,
    settings: Settings,
    /// The worker threads, started with the engine and kept for its life.
    pool: rayon_core::ThreadPool,
    lanes: Mutex<Vec<B::Lane>>,
    maps: Mutex<Vec<Arc<MappedFile>>>,
    /// The threads that ran workers (tests check that reads reuse them).
    #[cfg(test)]
    worker_threads: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

/// What one worker brings back.
#[derive(Default)]
struct Tally {
    direct: u64,
    buffered: u64,
    mapped: u64,
    registered: u64,
    ios: u64,
    latencies: Vec<u64>,
}

/// One range of a file to read into memory: for [`CompatEngine::read_vectored`].
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// The file.
    pub src: &'a Source,
    /// Where in the file.
    pub file_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// Where in the memory (for `CompatEngine::read_device_ptrs`, feature `cuda`: where in `ptr`'s memory).
    pub mem_offset: u64,
}

/// What one segment of a vectored read got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SegmentRead {
    /// Bytes read: fewer than asked only at the end of the file.
    pub bytes: u64,
    /// The file ended before the segment did.
    pub eof: bool,
}

/// What one part of a read asks for: `len` bytes of `src` at `file_offset` into `dest` at
/// `mem_offset`.
struct PartSpec<'a, I, D> {
    src: &'a I,
    dest: D,
    mem_offset: u64,
    file_offset: u64,
    len: u64,
}

/// One part of a read, planned.
struct Part<'a, I: Input, D> {
    src: &'a I,
    dest: D,
    /// `dest` offset of file offset `plan` start.
    dest_base: u64,
    file_base: u64,
    plan: Plan,
    /// Direct reads are possible: the file takes them, at an alignment that divides the task.
    direct: bool,
    /// Their alignment.
    align: u64,
    mapped: Option<Arc<MappedFile>>,
    /// The job-wide number of its first piece.
    first: usize,
    /// The bytes asked for, and those the file has of them.
    asked: u64,
    want: u64,
    /// The lowest file offset at which the file was found to end (short read).
    short_end: AtomicU64,
}

/// The shared state of one read: its parts, whose pieces the workers claim in turn.
struct Job<'a, I: Input, D> {
    parts: Vec<Part<'a, I, D>>,
    /// Pieces of all parts.
    pieces: usize,
    mode: PageCache,
    next: AtomicUsize,
    failed: AtomicBool,
}

impl<I: Input, D> Job<'_, I, D> {
    /// The part of job-wide piece `i`, and the piece's range in its file.
    fn piece(&self, i: usize) -> (&Part<'_, I, D>, Range<u64>) {
        let k = self.parts.partition_point(|p| p.first <= i) - 1;
        let part = &self.parts[k];
        (part, part.plan.piece(i - part.first))
    }
}

impl CompatEngine<HostBackend> {
    /// A builder: the defaults, then the environment, then its setters.
    pub fn builder() -> Builder {
        Builder {
            settings: Settings::default(),
            env: Settings::from_env().map_err(|e| e.to_string()),
            overrides: Vec::new(),
        }
    }
}

impl CompatEngine<HostBackend> {
    /// [`CompatEngine::read`] into `len` bytes of host memory at `ptr`, for memory no Rust
    /// reference may cover (a buffer other threads of another language can touch meanwhile):
    /// the engine writes it only through raw copies.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is writable memory of this process that stays allocated until the call
    /// returns, and no Rust reference points into it meanwhile.
    pub unsafe fn read_host_ptr(
        &self,
        src: &Source,
        ptr: *mut u8,
        len: u64,
        mem_offset: u64,
        file_offset: u64,
        n: u64,
    ) -> Result<Report> {
        let seg = Segment {
            src,
            file_offset,
            len: n,
            mem_offset,
        };
        // SAFETY: the caller's promise, for the one segment.
        unsafe { self.read_host_ptrs(&[seg], &[(ptr, len)]) }.map(|(r, _)| r)
    }

    /// [`CompatEngine::read_vectored`] into host memory no Rust reference may cover: segment
    /// `i` goes to the `len` bytes at `ptrs[i]` (at its `mem_offset`).
    ///
    /// # Safety
    ///
    /// Each `ptrs[i].0..ptrs[i].0 + ptrs[i].1` is writable memory of this process that stays
    /// allocated until the call returns, no Rust reference points into it meanwhile, and the
    /// segments' destinations do not overlap.
    pub unsafe fn read_host_ptrs(
        &self,
        segments: &[Segment<'_>],
        ptrs: &[(*mut u8, u64)],
    ) -> Result<(Report, Vec<SegmentRead>)> {
        let dests = ptrs
            .iter()
            .map(|&(p, l)| {
                // SAFETY: the caller's promise for each destination (this function's contract).
                unsafe { host::HostDest::from_raw(p, l) }
            })
            .collect();
        self.read_segments(segments, dests)
    }
}

#[cfg(feature = "cuda")]
impl CompatEngine<CudaBackend> {
    /// [`CompatEngine::read`] into `len` bytes of device memory at `ptr` (a CUDA device
    /// pointer of the backend's context), for memory another library allocated (a PyTorch
    /// tensor, a CuPy array). Work queued on the device before the call (the memory's
    /// initialisation, a kernel still reading it) is waited for first.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is device memory of the backend's context that stays allocated, and
    /// that nothing else reads or writes, until the call returns.
    pub unsafe fn read_device_ptr(
        &self,
        src: &Source,
        ptr: u64,
        len: u64,
        mem_offset: u64,
        file_offset: u64,
        n: u64,
    ) -> Result<Report> {
        let seg = Segment {
            src,
            file_offset,
            len: n,
            mem_offset,
        };
        // SAFETY: the caller's promise, for the one segment.
        unsafe { self.read_device_ptrs(&[seg], &[(ptr, len)]) }.map(|(r, _)| r)
    }

    /// [`CompatEngine::read_vectored`] into device memory that another library allocated:
    /// segment `i` goes to the `len` bytes at device pointer `ptrs[i]` (at its `mem_offset`).
    ///
    /// # Safety
    ///
    /// Each `ptrs[i].0..ptrs[i].0 + ptrs[i].1` is device memory of the backend's context that
    /// stays allocated, and that nothing else reads or writes, until the call returns; the
    /// segments' destinations do not overlap.
    pub unsafe fn read_device_ptrs(
        &self,
        segments: &[Segment<'_>],
        ptrs: &[(u64, u64)],
    ) -> Result<(Report, Vec<SegmentRead>)> {
        let _entered = self.backend.enter_thread()?;
        self.backend.synchronize()?;
        // SAFETY: the caller's promise; the context's work has finished.
        unsafe { self.read_device_ptrs_settled(segments, ptrs) }
    }

    /// [`CompatEngine::read_device_ptrs`] without waiting for the context's work first: the
    /// caller has waited for the work queued on the memory (its stream: see
    /// [`CudaBackend::wait_stream`]), so the read need not wait for every stream of the
    /// context (the engine's own copies of other reads among them).
    ///
    /// # Safety
    ///
    /// As [`CompatEngine::read_device_ptrs`], and no work queued on the device reads or writes
    /// the destinations.
    pub unsafe fn read_device_ptrs_settled(
        &self,
        segments: &[Segment<'_>],
        ptrs: &[(u64, u64)],
    ) -> Result<(Report, Vec<SegmentRead>)> {
        let dests = ptrs
            .iter()
            .map(|&(p, l)| cuda::CudaDest::from_raw(p, l))
            .collect();
        self.read_segments(segments, dests)
    }
}

impl<B: Backend> CompatEngine<B> {
    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Reads `len` bytes of `src` at `file_offset` into `memory` at `mem_offset`. A read past
    /// the end of the file is short and says so (`Report::eof`).
    pub fn read(
        &self,
        src: &Source,
        memory: &mut B::Memory,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<Report> {
        let _entered = self.backend.enter_thread()?;
        // The destination first: taking it orders its stream after the work other streams
        // queued on the memory (cudarc's events), which `before_read` then waits for too.
        let dest = B::dest(memory);
        self.backend.before_read(memory)?;
        let r = self.read_input(src, dest, mem_offset, file_offset, len);
        count(r.as_ref().ok());
        r
    }

    fn read_input<I: Input>(
        &self,
        src: &I,
        dest: B::Dest,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<Report> {
        let spec = PartSpec {
            src,
            dest,
            mem_offset,
            file_offset,
            len,
        };
        self.read_parts(vec![spec]).map(|(report, _)| report)
    }

    /// Reads every segment (ranges of one file or of several: a checkpoint's shards, a list of
    /// tensors) into `memory` with one set of workers, which take the segments' pieces in turn:
    /// one report for all, and what each segment got. Segments may not overlap in `memory`.
    pub fn read_vectored(
        &self,
        memory: &mut B::Memory,
        segments: &[Segment<'_>],
    ) -> Result<(Report, Vec<SegmentRead>)> {
        disjoint(segments.iter().map(|s| (s.mem_offset, s.len)))?;
        let _entered = self.backend.enter_thread()?;
        // The destination first: taking it orders its stream after the work other streams
        // queued on the memory (cudarc's events), which `before_read` then waits for too.
        let dest = B::dest(memory);
        self.backend.before_read(memory)?;
        self.read_segments(segments, vec![dest; segments.len()])
    }

    /// Reads segment `i` into `dests[i]`, counted in the process's statistics.
    fn read_segments(
        &self,
        segments: &[Segment<'_>],
        dests: Vec<B::Dest>,
    ) -> Result<(Report, Vec<SegmentRead>)> {
        one_destination_each(segments.len(), dests.len())?;
        let specs = segments
            .iter()
            .zip(dests)
            .map(|(s, dest)| PartSpec {
                src: s.src,
                dest,
                mem_offset: s.mem_offset,
                file_offset: s.file_offset,
                len: s.len,
            })
            .collect();
        let r = self.read_parts(specs);
        count(r.as_ref().ok().map(|(report, _)| report));
        r
    }

    /// Reads every part with one set of workers, which claim the parts' pieces in turn (a
    /// checkpoint's shards, a list of tensors): one report for all, and each part's bytes and
    /// end of file.
    fn read_parts<I: Input>(
        &self,
        specs: Vec<PartSpec<'_, I, B::Dest>>,
    ) -> Result<(Report, Vec<SegmentRead>)> {
        let s = &self.settings;
        let mode = match s.page_cache {
            PageCache::Auto if self.backend.prefers_mapped() => PageCache::Mapped,
            PageCache::Auto => PageCache::Auto,
            p => p,
        };
        let auto = s.page_cache == PageCache::Auto;
        let mut parts = Vec::with_capacity(specs.len());
        let mut pieces = 0;
        for spec in specs {
            let dest_len = B::dest_len(&spec.dest);
            if spec
                .mem_offset
                .checked_add(spec.len)
                .is_none_or(|end| end > dest_len)
            {
                return Err(Error::OutOfMemoryRange {
                    offset: spec.mem_offset,
                    len: spec.len,
                    size: dest_len,
                });
            }
            let src = spec.src;
            // A range inside the size the file had when it was opened is read as it is (a file
            // that shrank since gives a short read, found where it ends); one past it asks the
            // size now (`statx`: the file may have grown since), and so does every read through
            // a mapping (whose pages past a new end must not be touched). Small reads skip that
            // call.
            // Through a mapping, what the file is now also keys its registrations (below).
            let opened = src.id().size();
            let now = match mode {
                PageCache::Mapped => src.current_id().ok(),
                _ => None,
            };
            let size = match now {
                Some(id) => id.size(),
                None if spec.file_offset.saturating_add(spec.len) <= opened => opened,
                None => src.current_size().unwrap_or(opened),
            };
            let want = spec.len.min(size.saturating_sub(spec.file_offset));
            let piece = Plan::piece_size(want, s.threads, s.task_size, s.max_piece);
            let align = src.direct_align();
            let direct = src.direct_io() && s.task_size % align == 0;
            let align = if direct { align } else { DIRECT_ALIGN };
            let plan = Plan::new(spec.file_offset, want, align, s.task_size, piece);
            // Keyed by what the file is now, not when it was opened: a file rewritten in place
            // (truncated, written again) has other pages, and the chunks registered before
            // pin the old ones, which its page cache no longer holds.
            let mapped = match mode {
                PageCache::Mapped if want > 0 => src
                    .mapping()
                    .map(|m| self.mapped_file(now.unwrap_or_else(|| src.id()), m)),
                _ => None,
            };
            let first = pieces;
            pieces += plan.pieces();
            parts.push(Part {
                src,
                dest: spec.dest,
                dest_base: spec.mem_offset,
                file_base: spec.file_offset,
                plan,
                direct,
                align,
                mapped,
                first,
                asked: spec.len,
                want,
                short_end: AtomicU64::new(u64::MAX),
            });
        }
        let mut report = Report::default();
        let workers = s.threads.min(pieces);
        let job = Job {
            parts,
            pieces,
            mode: if auto { PageCache::Auto } else { mode },
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        };
        if workers > 0 {
            let shared = &job;
            // Each worker takes a lane from the pool when it starts and puts it back when it
            // ends (its copies finished), not when the whole read does: reads at once
            // (asynchronous ones) share the engine's threads, so no more lanes (pinned
            // staging) are in use than threads run workers (the engine's, and callers' running
            // a one-piece read themselves), and the pool stays that size.
            let results = self
                .on_workers(
                    (0..workers)
                        .map(|_| {
                            move || {
                                // (Its own statement: the pool's lock is not held while the
                                // worker runs.)
                                let lane = lock(&self.lanes).pop();
                                let (lane, r) = self.worker(shared, lane);
                                lock(&self.lanes).extend(lane);
                                r
                            }
                        })
                        .collect(),
                )
                .into_iter()
                .map(|r| {
                    r.unwrap_or(Err(Error::Worker {
                        what: "a compat worker panicked",
                    }))
                });
            let mut first_err = None;
            for r in results {
                match r {
                    Ok(t) => {
                        report.direct_bytes += t.direct;
                        report.buffered_bytes += t.buffered;
                        report.mapped_bytes += t.mapped;
                        report.registered_bytes += t.registered;
                        report.ios += t.ios;
                        report.latencies_ns.extend(t.latencies);
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                drop(job);
                self.trim_maps();
                return Err(e);
            }
        }
        report.threads = workers;
        let mut each = Vec::with_capacity(job.parts.len());
        for part in &job.parts {
            let short = part.short_end.load(Ordering::Relaxed);
            let bytes = part.want.min(short.saturating_sub(part.file_base));
            if bytes < part.want {
                // The file shrank under the read: only the bytes before its new end count.
                let over = part.want - bytes;
                report.direct_bytes = report.direct_bytes.saturating_sub(over);
                report.buffered_bytes = report.buffered_bytes.saturating_sub(over);
            }
            report.bytes += bytes;
            let eof = bytes < part.asked;
            report.eof |= eof;
            each.push(SegmentRead { bytes, eof });
        }
        drop(job);
        self.trim_maps();
        Ok((report, each))
    }

    /// Runs every task at once and waits for all of them: what each returned, in no particular
    /// order, or `None` for a task that panicked. The calling thread runs the first task
    /// itself and the engine's threads the rest: a lone task (a read or write of one piece: a
    /// small block) is never handed to another thread and back, which would cost two thread
    /// switches, more than a small block's I/O; and callers reading at once (batches from
    /// many threads) add their own threads to the engine's. (So lanes are used by callers'
    /// threads too: the engine keeps at most one per thread that reads or writes at once.)
    fn on_workers<T, F>(&self, tasks: Vec<F>) -> Vec<Option<T>>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let out = Mutex::new(Vec::with_capacity(tasks.len()));
        let run = |task: F, out: &Mutex<Vec<Option<T>>>| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task)).ok();
            lock(out).push(r);
        };
        let mut tasks = tasks.into_iter();
        let Some(first) = tasks.next() else {
            return Vec::new();
        };
        if tasks.len() == 0 {
            // No scope to set up for one task.
            run(first, &out);
            return out
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        self.pool.in_place_scope(|scope| {
            for task in tasks {
                let (out, run) = (&out, &run);
                scope.spawn(move |_| {
                    #[cfg(test)]
                    lock(&self.worker_threads).insert(std::thread::current().id());
                    run(task, out);
                });
            }
            run(first, &out);
        });
        out.into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One worker: claims pieces until none is left or a worker failed.
    fn worker<I: Input>(
        &self,
        job: &Job<'_, I, B::Dest>,
        lane: Option<B::Lane>,
    ) -> (Option<B::Lane>, Result<Tally>) {
        // Left (the thread's own context back) when the worker returns, its lane finished.
        let _entered = match self.backend.enter_thread() {
            Ok(e) => e,
            Err(e) => {
                job.failed.store(true, Ordering::Relaxed);
                return (lane, Err(e));
            }
        };
        let lane = match lane {
            Some(l) => Ok(l),
            None => self
                .backend
                .lane(self.settings.buffers(), self.settings.task_size as usize),
        };
        let mut lane = match lane {
            Ok(l) => l,
            Err(e) => {
                job.failed.store(true, Ordering::Relaxed);
                return (None, Err(e));
            }
        };
        let mut tally = Tally::default();
        let mut slot = 0;
        let mut r = Ok(());
        while !job.failed.load(Ordering::Relaxed) {
            let i = job.next.fetch_add(1, Ordering::Relaxed);
            if i >= job.pieces {
                break;
            }
            let (part, piece) = job.piece(i);
            r = self.piece(job, part, &mut lane, &mut tally, &mut slot, piece);
            if r.is_err() {
                job.failed.store(true, Ordering::Relaxed);
                break;
            }
        }
        // Every copy must land (or fail) before the read returns, error or not.
        let fin = lane.finish();
        (Some(lane), r.and(fin).map(|()| tally))
    }

    fn piece<I: Input>(
        &self,
        job: &Job<'_, I, B::Dest>,
        part: &Part<'_, I, B::Dest>,
        lane: &mut B::Lane,
        tally: &mut Tally,
        slot: &mut usize,
        piece: Range<u64>,
    ) -> Result<()> {
        if let Some(mf) = &part.mapped {
            let cached = job.mode != PageCache::Auto || part.src.resident(piece.clone());
            if cached && self.send_mapped(job, part, mf, lane, tally, piece.clone())? {
                return Ok(());
            }
        }
        let buffers = self.settings.buffers();
        for task in part.plan.tasks(piece) {
            let how = match job.mode {
                PageCache::Buffered | PageCache::Mapped => How::Buffered,
                PageCache::Direct => How::Direct,
                PageCache::Auto if part.src.resident(task.want.clone()) => How::Buffered,
                PageCache::Auto => How::Direct,
            };
            let how = if part.direct && part.src.direct_io() {
                how
            } else {
                How::Buffered
            };
            let range = match how {
                How::Direct => task.io.clone(),
                How::Buffered => task.want.clone(),
            };
            let b = *slot;
            *slot = (*slot + 1) % buffers;
            let buf = lane.buffer(b, (range.end - range.start) as usize)?;
            let t0 = self.settings.latencies.then(Instant::now);
            let (got, how) = read_full(part.src, buf, range.start, how, part.align)?;
            if let Some(t0) = t0 {
                tally.latencies.push(t0.elapsed().as_nanos() as u64);
            }
            tally.ios += 1;
            let valid_end = range.start + got as u64;
            let copy_end = valid_end.min(task.want.end);
            if copy_end > task.want.start {
                let n = copy_end - task.want.start;
                let from = (task.want.start - range.start) as usize;
                let off = part.dest_base + (task.want.start - part.file_base);
                // SAFETY: `part.dest` is the caller's memory, borrowed mutably for the whole
                // read, which waits for every lane's `finish`; tasks are disjoint, so no other
                // copy writes this range.
                unsafe { lane.send(b, from..from + n as usize, part.dest, off) }?;
                match how {
                    How::Direct => tally.direct += n,
                    How::Buffered => tally.buffered += n,
                }
            }
            if valid_end < task.want.end {
                part.short_end
                    .fetch_min(valid_end.max(task.want.start), Ordering::Relaxed);
                break;
            }
        }
        Ok(())
    }

    /// Sends `piece` from the registered mapping; `false` when a chunk of it cannot be
    /// registered (the caller reads it another way).
    fn send_mapped<I: Input>(
        &self,
        job: &Job<'_, I, B::Dest>,
        part: &Part<'_, I, B::Dest>,
        mf: &MappedFile,
        lane: &mut B::Lane,
        tally: &mut Tally,
        piece: Range<u64>,
    ) -> Result<bool> {
        let size = mf.id.size();
        if piece.end > size {
            // The file grew since it was mapped: the new bytes are read another way.
            return Ok(false);
        }
        let first = piece.start / MAP_CHUNK;
        let last = (piece.end - 1) / MAP_CHUNK;
        for c in first..=last {
            let mut state = lock(&mf.chunks[c as usize]);
            if *state == Chunk::Unregistered {
                let range = c * MAP_CHUNK..((c + 1) * MAP_CHUNK).min(size);
                // Registering pages that are not cached would read them from disk, one
                // thread at a time: under `Auto` those go by direct I/O instead.
                if job.mode == PageCache::Auto && !part.src.resident(range.clone()) {
                    return Ok(false);
                }
                *state = match mf.map.pages(range) {
                    // SAFETY: `p..p + len` is a page-aligned range of the file's mapping,
                    // which `mf` holds until `release` unregisters it.
                    Some((p, len)) => match unsafe { self.backend.register(p, len) } {
                        Ok(()) => {
                            tally.registered += len as u64;
                            Chunk::Registered(p as usize, len)
                        }
                        Err(_) => Chunk::Failed,
                    },
                    None => Chunk::Failed,
                };
            }
            if *state == Chunk::Failed {
                return Ok(false);
            }
        }
        let mut at = piece.start;
        while at < piece.end {
            let end = ((at / MAP_CHUNK + 1) * MAP_CHUNK).min(piece.end);
            let Some(p) = mf.map.at(at) else {
                return Ok(false);
            };
            let off = part.dest_base + (at - part.file_base);
            // SAFETY: as for `send` in `read_task`; `p..p + (end - at)` lies in the chunk
            // registered above, which stays registered while this read holds `mf`.
            unsafe { lane.send_mapped(p, (end - at) as usize, part.dest, off) }?;
            tally.ios += 1;
            tally.mapped += end - at;
            at = end;
        }
        Ok(true)
    }

    /// The cached mapping of file `id`, made if missing; stale ones of the same file go.
    fn mapped_file(&self, id: FileId, map: &Arc<Mapping>) -> Arc<MappedFile> {
        let mut maps = lock(&self.maps);
        if let Some(i) = maps.iter().position(|m| m.id == id) {
            let m = maps.remove(i);
            maps.push(m.clone());
            return m;
        }
        // Entries of the same file as it was before a change (size, times) show stale pages:
        // released now, unless a read still uses one (then the trim gets it later).
        let mut i = 0;
        while i < maps.len() {
            if maps[i].id.same_file(&id) && Arc::strong_count(&maps[i]) == 1 {
                let stale = maps.remove(i);
                self.release(&stale);
            } else {
                i += 1;
            }
        }
        let chunks = (0..id.size().div_ceil(MAP_CHUNK))
            .map(|_| Mutex::new(Chunk::Unregistered))
            .collect();
        let m = Arc::new(MappedFile {
            id,
            map: map.clone(),
            chunks,
        });
        maps.push(m.clone());
        m
    }

    /// Releases cached registrations beyond `keep_mapped`, least recently used first; entries
    /// a read is using stay.
    fn trim_maps(&self) {
        let mut maps = lock(&self.maps);
        let mut kept: u64 = maps.iter().map(|m| m.registered_bytes()).sum();
        let mut i = 0;
        while i < maps.len() && kept > self.settings.keep_mapped {
            if Arc::strong_count(&maps[i]) > 1 {
                i += 1;
                continue;
            }
            let m = maps.remove(i);
            kept -= m.registered_bytes();
            self.release(&m);
        }
    }

    fn release(&self, m: &MappedFile) {
        for c in &m.chunks {
            if let Chunk::Registered(p, _) = *lock(c) {
                // SAFETY: registered by `send_mapped` and unregistered only here, once: the
                // entry left the cache, and no read holds it (no copy from it is in flight).
                unsafe { self.backend.unregister(p as *const u8) };
            }
        }
    }

    /// Bytes of page-cache mapping registered and kept for later reads.
    pub fn kept_mapped(&self) -> u64 {
        lock(&self.maps).iter().map(|m| m.registered_bytes()).sum()
    }
}

impl<B: Backend> Drop for CompatEngine<B> {
    fn drop(&mut self) {
        let maps = std::mem::take(&mut *lock(&self.maps));
        for m in &maps {
            self.release(m);
        }
    }
}

/// Reads into all of `buf` from `off`, retrying short reads, until the file ends; returns the
/// bytes read and how the last of them were read. A direct read that ends inside an `align`
/// block has met the end of the file, if the file's size says so; otherwise the rest is read
/// through the page cache (a direct read cannot start there). A direct read refused with
/// `EINVAL` (an alignment or a file system the open did not reveal) is retried through the page
/// cache, and the file's later reads go that way too.
fn read_full<I: Input>(
    src: &I,
    buf: &mut [u8],
    off: u64,
    mut how: How,
    align: u64,
) -> Result<(usize, How)> {
    let mut done = 0;
    while done < buf.len() {
        match src.read_at(&mut buf[done..], off + done as u64, how) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                if how == How::Direct && done as u64 % align != 0 {
                    match src.current_size() {
                        Ok(size) if size > off + done as u64 => how = How::Buffered,
                        _ => break,
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if how == How::Direct && e.raw_os_error() == Some(nix::libc::EINVAL) => {
                src.direct_failed();
                how = How::Buffered;
            }
            Err(e) => {
                return Err(Error::FileIo {
                    path: src.path().to_path_buf(),
                    offset: off + done as u64,
                    errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
                })
            }
        }
    }
    Ok((done, how))
}

#[cfg(test)]
mod tests;
