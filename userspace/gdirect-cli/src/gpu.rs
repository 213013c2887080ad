// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect read --gpu N` and `gdirect bench`: files into CUDA memory, through the module
//! where it serves, the compat engine everywhere else.
// Built without `cuda`, only the argument types and the "no CUDA" answers are used.
#![cfg_attr(not(feature = "cuda"), allow(dead_code, unused_imports))]

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;

use crate::{print_json, Failure, JsonContext};
use gdirect::{
    compat::{Builder, CompatEngine, PageCache, Report},
    Error,
};

/// The compat engine's settings on the command line (unset ones come from the environment,
/// then the defaults).
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct EngineArgs {
    /// Worker threads of the compat engine [env: GDIRECT_THREADS; default: CPUs, at most 16].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Bytes per I/O of the compat engine, a multiple of 4K [env: GDIRECT_TASK_SIZE; default: 2M].
    #[arg(long, alias = "task-size", value_parser = crate::parse_size)]
    pub(crate) block_size: Option<u64>,
    /// Pinned staging bytes per thread [env: GDIRECT_STAGING_SIZE; default: 4M].
    #[arg(long, value_parser = crate::parse_size)]
    pub(crate) staging_size: Option<u64>,
    /// Cached data: auto (by mincore, piece by piece), direct, buffered or mapped; the compat
    /// engine's writes go direct where aligned with auto and direct, through the page cache
    /// with buffered and mapped [env: GDIRECT_PAGE_CACHE; default: auto].
    #[arg(long, value_enum)]
    pub(crate) page_cache: Option<PageCacheArg>,
    /// Registered page-cache bytes kept between reads [env: GDIRECT_KEEP_MAPPED; default: 0].
    #[arg(long, value_parser = crate::parse_offset)]
    pub(crate) keep_mapped: Option<u64>,
    /// Reads and writes smaller than this go to the compat engine without trying the module,
    /// where GDIRECT_COMPAT_MODE is auto [env: GDIRECT_DIRECT_THRESHOLD; default: 0].
    #[arg(long, value_parser = crate::parse_offset)]
    pub(crate) direct_threshold: Option<u64>,
    /// Use the compat engine even when the module is loaded.
    #[arg(long)]
    pub(crate) compat: bool,
}

/// `--page-cache`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageCacheArg {
    Auto,
    Direct,
    Buffered,
    Mapped,
}

/// `bench --method`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    /// The library: the module where it serves, the compat engine otherwise.
    Gdirect,
    /// Read the whole file into host memory, then copy it to the GPU.
    Naive,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Gdirect => "gdirect",
            Self::Naive => "naive",
        }
    }
}

/// The CUDA device a read goes to when none is named: 0 where a CUDA GPU is visible.
pub(crate) fn default_device() -> gdirect::Result<usize> {
    #[cfg(feature = "cuda")]
    if gdirect::compat::device_count() > 0 {
        return Ok(0);
    }
    Err(Error::Cuda {
        what: "device discovery",
        error: "no CUDA GPU is visible to this process; read into other memory with --mem \
                host, --mem egpu (the test rig's emulated GPU) or --mem p2pmem"
            .into(),
    })
}

impl EngineArgs {
    /// Whether any of the engine's settings was given.
    pub(crate) fn is_set(&self) -> bool {
        self.threads.is_some()
            || self.block_size.is_some()
            || self.staging_size.is_some()
            || self.page_cache.is_some()
            || self.keep_mapped.is_some()
            || self.direct_threshold.is_some()
            || self.compat
    }

    fn builder(&self) -> Builder {
        let mut b = CompatEngine::builder();
        if let Some(t) = self.threads {
            b = b.threads(t);
        }
        if let Some(s) = self.block_size {
            b = b.task_size(s);
        }
        if let Some(s) = self.staging_size {
            b = b.staging_size(s);
        }
        if let Some(p) = self.page_cache {
            b = b.page_cache(match p {
                PageCacheArg::Direct => PageCache::Direct,
                PageCacheArg::Buffered => PageCache::Buffered,
                PageCacheArg::Mapped => PageCache::Mapped,
                PageCacheArg::Auto => PageCache::Auto,
            });
        }
        if let Some(k) = self.keep_mapped {
            b = b.keep_mapped(k);
        }
        if let Some(t) = self.direct_threshold {
            b = b.direct_threshold(t);
        }
        b
    }
}

/// The compat engine's report (the library's, serialised), with the settings it ran with.
#[derive(Serialize, Clone, Debug, Default)]
pub(crate) struct CompatJson {
    task_size: u64,
    page_cache: gdirect::compat::PageCache,
    #[serde(flatten)]
    report: Report,
}

#[cfg(feature = "cuda")]
fn compat_json(engine_settings: &gdirect::compat::Settings, r: &Report) -> CompatJson {
    CompatJson {
        task_size: engine_settings.task_size,
        page_cache: engine_settings.page_cache,
        report: r.clone(),
    }
}

#[derive(Serialize)]
struct GpuReadJson {
    file: String,
    gpu: usize,
    offset: u64,
    len: u64,
    bytes: u64,
    eof: bool,
    engine: &'static str,
    why: String,
    /// Bytes of GPU memory the read went through, and how many pieces it took.
    window: u64,
    pieces: u64,
    /// Seconds of reading (verification not included).
    seconds: f64,
    gb_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    compat: Option<CompatJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
}

/// `gdirect read FILE --gpu N`.
pub(crate) struct GpuReadJob {
    /// The module's device node (`--device`).
    pub(crate) device: PathBuf,
    pub(crate) file: PathBuf,
    pub(crate) gpu: usize,
    pub(crate) offset: u64,
    pub(crate) len: Option<u64>,
    /// Bytes of GPU memory to read through (`None`: the default of [`window_size`]).
    pub(crate) window: Option<u64>,
    pub(crate) verify: Option<PathBuf>,
    pub(crate) engine: EngineArgs,
    pub(crate) json: bool,
}

/// The GPU memory a read of `len` bytes goes through: `asked` rounded up to 4 KiB, or the
/// whole read where it fits in half of the `free` device memory, or that half (in MiB).
fn window_size(len: u64, asked: Option<u64>, free: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let whole = len.max(1).div_ceil(4096) * 4096;
    match asked {
        Some(w) => (w.div_ceil(4096) * 4096).min(whole),
        None if whole <= free / 2 => whole,
        None => (free / 2 / MIB * MIB).max(MIB).min(whole),
    }
}

/// The bytes to read: `len`, or to the end of the file.
fn read_len(file: &std::path::Path, offset: u64, len: Option<u64>) -> gdirect::Result<u64> {
    match len {
        Some(len) => Ok(len),
        None => Ok(crate::file_size(file)?.saturating_sub(offset)),
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> Error {
    Error::Cuda {
        what: "GPU support",
        error: "this gdirect was built without the `cuda` feature".into(),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn read(job: &GpuReadJob) -> Result<(), Failure> {
    let _ = (
        read_len(&job.file, job.offset, job.len),
        job.engine.builder(),
        job.gpu,
    );
    let _ = (
        &job.verify,
        job.window,
        CompatJson::default(),
        window_size(0, None, 0),
    );
    Err(no_cuda()).json(job.json)
}

#[cfg(feature = "cuda")]
pub(crate) fn read(job: &GpuReadJob) -> Result<(), Failure> {
    use gdirect::{
        compat::CudaBackend,
        gpu::{DeviceBuffer, GpuReader},
    };
    let json = job.json;
    let len = read_len(&job.file, job.offset, job.len).json(json)?;
    let backend = CudaBackend::new(job.gpu).json(json)?;
    let ctx = backend.context().clone();
    let engine = job.engine.builder().build(backend).json(json)?;
    let settings = engine.settings().clone();
    let reader = if job.engine.compat {
        GpuReader::compat_only(engine)
    } else {
        // GDIRECT_COMPAT_MODE (auto, on, off) decides, as for any user of the library.
        let mode = gdirect::gpu::CompatMode::from_env().json(json)?;
        GpuReader::with_device(engine, mode, &job.device)
    };
    let (free, _) = ctx
        .mem_get_info()
        .map_err(cuda("GPU memory query"))
        .json(json)?;
    let window = window_size(len, job.window, free as u64);
    // cuMemAlloc'd memory, which the module may register (cudarc's own allocation comes from
    // a stream-ordered pool, which the driver lets no peer reach).
    let mut mem = DeviceBuffer::new(&ctx.default_stream(), window as usize).json(json)?;
    // The file goes through the window piece by piece, opened once and into memory
    // registered once; each piece is verified before the next overwrites it.
    let file = reader.open(&job.file).json(json)?;
    let mut buf = reader.register(&mut mem);
    let mut bytes = 0u64;
    let mut eof = false;
    let mut pieces = 0u64;
    let mut seconds = 0.0;
    let mut first = None;
    let mut compat: Option<CompatJson> = None;
    let mut verified = job.verify.as_ref().map(|_| true);
    while bytes < len {
        let n = window.min(len - bytes);
        let t0 = Instant::now();
        let r = reader
            .read_into(&file, &mut buf, 0, job.offset + bytes, n)
            .json(json)?;
        seconds += t0.elapsed().as_secs_f64();
        pieces += 1;
        let t = r.transfer;
        first.get_or_insert((t.engine.name(), t.engine.explain()));
        if let Some(c) = &r.compat {
            match &mut compat {
                Some(sum) => sum.report.add(c),
                None => compat = Some(compat_json(&settings, c)),
            }
        }
        if let Some(reference) = &job.verify {
            let at = job.offset + bytes;
            let want =
                gdirect_internals::checksum::of_file(reference, at, t.bytes, 16).json(json)?;
            let got =
                gdirect_internals::checksum::of_buffer(buf.memory(), t.bytes, 16).json(json)?;
            if want != got {
                eprintln!(
                    "gdirect: verify: the {} bytes at offset {at} differ from {} (checksums {got:016x} in GPU memory, {want:016x} in the file)",
                    t.bytes,
                    reference.display()
                );
                verified = Some(false);
            }
        }
        bytes += t.bytes;
        if t.eof || t.bytes < n || verified == Some(false) {
            eof = t.eof;
            break;
        }
    }
    let (engine, why) = first.unwrap_or(("none", "nothing was read".into()));
    let report = GpuReadJson {
        file: job.file.display().to_string(),
        gpu: job.gpu,
        offset: job.offset,
        len,
        bytes,
        eof,
        engine,
        why,
        window,
        pieces,
        seconds,
        gb_per_s: bytes as f64 / f64::max(seconds, 1e-9) / 1e9,
        compat,
        verified,
    };
    if json {
        print_json(&report);
    } else {
        println!(
            "read {bytes} bytes at offset {} of {} into GPU {}",
            job.offset, report.file, job.gpu
        );
        println!("engine     {} ({})", report.engine, report.why);
        if pieces > 1 {
            println!("window     {window} bytes of GPU memory, {pieces} pieces");
        }
        if let Some(c) = &report.compat {
            let r = &c.report;
            println!(
                "compat     {} threads, {} B tasks, page cache {}: {} B direct, {} B buffered, {} B mapped",
                r.threads, c.task_size, c.page_cache.name(), r.direct_bytes, r.buffered_bytes, r.mapped_bytes
            );
        }
        println!("time       {seconds:.3} s, {:.2} GB/s", report.gb_per_s);
        if eof {
            println!("end        the file ended {bytes} bytes into the {len} asked for");
        }
        match verified {
            Some(true) => println!("verify     every byte matches the reference"),
            Some(false) => println!("verify     MISMATCH (see above)"),
            None => {}
        }
    }
    if verified == Some(false) {
        return Err(Failure::mismatch(Error::Cuda {
            what: "verification",
            error: "the GPU memory does not hold the reference's bytes".into(),
        }));
    }
    Ok(())
}

/// `gdirect bench`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct BenchArgs {
    /// The file to read.
    pub(crate) file: PathBuf,
    /// The CUDA device.
    #[arg(long, default_value_t = 0)]
    pub(crate) gpu: usize,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Drop the file's pages from the page cache before every read (POSIX_FADV_DONTNEED).
    #[arg(long)]
    pub(crate) cold: bool,
    /// Measured reads.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeat: usize,
    /// Unmeasured reads first [default: 1 warm, 0 cold].
    #[arg(long)]
    pub(crate) warmup: Option<usize>,
    /// Measure one read that includes making the engine (threads, pinned buffers,
    /// registrations): the first read of a fresh process.
    #[arg(long, conflicts_with_all = ["repeat", "warmup"])]
    pub(crate) first: bool,
    /// How to read.
    #[arg(long, value_enum, default_value_t = Method::Gdirect)]
    pub(crate) method: Method,
    /// Bytes to read from the start of the file [default: all of it].
    #[arg(long, value_parser = crate::parse_size)]
    pub(crate) len: Option<u64>,
    /// The file's checksum (hex, as a previous run printed it), instead of reading the file
    /// once more to compute it.
    #[arg(long, value_parser = parse_hex)]
    pub(crate) reference: Option<u64>,
    /// Bytes per I/O, a multiple of 4K: each I/O is one read (or, with --write, one write) of
    /// the library's GPU reader (the module where it is loaded, the compat engine otherwise)
    /// into (from) a slot of this size of its job's buffer, its bytes compared with the
    /// file's after its round, outside the time (--round-mib) [default: the whole --len in
    /// one read, verified by checksum]. Independent of --block-size, the
    /// engine's size of the reads it issues.
    #[arg(long, value_parser = crate::parse_size, conflicts_with = "first")]
    pub(crate) io_size: Option<u64>,
    /// Where each I/O reads: one after the other, or at random offsets (multiples of the I/O
    /// size).
    #[arg(long, value_enum, default_value_t = Pattern::Seq, requires = "io_size")]
    pub(crate) pattern: Pattern,
    /// Issue I/Os for this many seconds of the clock (the rounds' I/O time, after a first
    /// round of warm-up that is not counted) instead of --repeat passes over the file.
    #[arg(
        long,
        value_name = "SECONDS",
        requires = "io_size",
        conflicts_with = "repeat"
    )]
    pub(crate) duration: Option<f64>,
    /// Threads issuing I/Os at once, each with a buffer of its own (gdsio's workers).
    #[arg(long, default_value_t = 1, requires = "io_size")]
    pub(crate) jobs: usize,
    /// The I/Os of a round, in MiB of GPU memory shared among the jobs (at most 4096 I/Os a
    /// job): each job's buffer has a slot for each of its I/Os of a round. The clock runs while
    /// a round's I/Os do (from their common start to the last one's end); between rounds,
    /// outside it, every slot is compared with the file (tests/bench/blocks.py's rounds).
    #[arg(long, value_name = "MIB", default_value_t = 2048, requires = "io_size")]
    pub(crate) round_mib: u64,
    /// Write instead of read: each I/O writes a buffer of GPU memory holding a pattern of its
    /// file offset to FILE (created if missing; --len bytes, or the file's size), and the file's
    /// bytes are read back and compared after its round, outside the time.
    #[arg(long, requires = "io_size")]
    pub(crate) write: bool,
    /// Let --write overwrite a FILE that exists and is not empty.
    #[arg(long, requires = "write")]
    pub(crate) overwrite: bool,
}

/// `bench --pattern`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    Seq,
    Rand,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Self::Seq => "seq",
            Self::Rand => "rand",
        }
    }
}

/// The file offset of I/O `k` of job `job` of `jobs`: `slots` I/O-size slots in the file;
/// sequential jobs start evenly spread and wrap; random ones draw from `state`.
fn io_offset(pattern: Pattern, k: u64, job: u64, jobs: u64, slots: u64, state: &mut u64) -> u64 {
    match pattern {
        Pattern::Seq => (job * slots / jobs.max(1) + k) % slots.max(1),
        Pattern::Rand => {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state % slots.max(1)
        }
    }
}

/// The bytes `bench --write` writes at file offset `off`: a pattern of the offset, so that a
/// byte in the wrong place shows.
/// The most I/Os a job makes in one round of `bench --io-size` (a round of small I/Os from
/// one job stays short enough for `--duration`, which is looked at between rounds).
const ROUND_IOS: u64 = 4096;

/// What a read's slot holds before its round: no read can pass without landing.
const POISON: u8 = 0xe9;

fn offset_pattern(off: u64, out: &mut [u8]) {
    let mut state = off ^ 0x2545_f491_4f6c_dd1d;
    for chunk in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

fn parse_hex(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| format!("'{s}' is not a hex checksum"))
}

#[derive(Serialize, Clone, Debug)]
struct RunJson {
    seconds: f64,
    gb_per_s: f64,
    verified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    compat: Option<CompatJson>,
}

#[derive(Serialize)]
struct BenchJson {
    file: String,
    gpu: usize,
    bytes: u64,
    method: &'static str,
    cold: bool,
    first: bool,
    threads: usize,
    block_size: u64,
    page_cache: &'static str,
    runs: Vec<RunJson>,
    median_gb_per_s: f64,
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    reference_checksum: String,
    reference_seconds: f64,
}

/// A CUDA error of `what`, for `map_err`.
#[cfg(feature = "cuda")]
fn cuda<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Cuda {
        what,
        error: format!("{e:?}"),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn bench(args: &BenchArgs, device: &Path, json: bool) -> Result<(), Failure> {
    let _ = (
        read_len(&args.file, 0, args.len),
        args.engine.builder(),
        device,
    );
    let _ = io_offset(args.pattern, 0, 0, 1, 1, &mut 1);
    Err(no_cuda()).json(json)
}

#[derive(Serialize)]
struct BenchIoJson {
    /// `read` or `write`.
    op: &'static str,
    file: String,
    gpu: usize,
    pattern: &'static str,
    io_size: u64,
    jobs: usize,
    threads: usize,
    block_size: u64,
    page_cache: &'static str,
    /// Which engine read (the module where it serves, the compat engine otherwise), and why.
    engine: &'static str,
    why: String,
    ios: u64,
    bytes: u64,
    /// The wall-clock time of the rounds' I/Os, from each round's common start to its last
    /// I/O's end (the verification between rounds not included).
    seconds: f64,
    /// How many rounds were timed (with --duration, after one of warm-up), and each job's
    /// I/Os in one.
    rounds: u64,
    ios_per_round_per_job: u64,
    gb_per_s: f64,
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    /// Every I/O's bytes were compared with the file's.
    verified: bool,
}

/// What one job of an I/O benchmark did.
#[derive(Default)]
struct JobTally {
    ios: u64,
    bytes: u64,
    latencies: Vec<u64>,
    /// The engine of its first I/O, and why.
    engine: Option<(&'static str, String)>,
}

/// `bench --io-size`: jobs issuing I/Os of one size through the library's GPU reader (the
/// module where it is loaded and serves, the compat engine otherwise, as
/// `GDIRECT_COMPAT_MODE` allows), each job's buffer registered once with a slot for each of
/// its I/Os of a round, timed by the wall clock while a round's I/Os run, every slot compared
/// with the file's bytes after the round (until 2026-12-06 the time was the longest job's sum of
/// its I/Os' own times, with each I/O verified between them).
#[cfg(feature = "cuda")]
fn bench_ios(args: &BenchArgs, io: u64, device: &Path, json: bool) -> Result<(), Failure> {
    use gdirect::{
        compat::CudaBackend,
        gpu::{DeviceBuffer, GpuReader},
    };
    use std::{os::unix::fs::FileExt, time::Duration};

    let existing = crate::file_size(&args.file).ok().filter(|&n| n > 0);
    if args.write && existing.is_some() && !args.overwrite {
        crate::usage_error(&format!(
            "{} exists and is not empty: --write would overwrite it (add --overwrite)",
            args.file.display()
        ));
    }
    let len = match (args.len, args.write, existing) {
        (Some(len), _, _) => len,
        (None, true, None) => crate::usage_error("--write to a new or empty file needs --len"),
        (None, _, _) => read_len(&args.file, 0, None).json(json)?,
    };
    let io = io.div_ceil(4096) * 4096;
    let slots = len / io;
    if slots == 0 {
        crate::usage_error(&format!(
            "--io-size {io} is larger than the {len} bytes to read"
        ));
    }
    let jobs = args.jobs.max(1);
    let backend = CudaBackend::new(args.gpu).json(json)?;
    let ctx = backend.context().clone();
    let engine = args.engine.builder().build(backend).json(json)?;
    let settings = engine.settings().clone();
    let reader = if args.engine.compat {
        GpuReader::compat_only(engine)
    } else {
        let mode = gdirect::gpu::CompatMode::from_env().json(json)?;
        GpuReader::with_device(engine, mode, device)
    };
    let (src, sink) = if args.write {
        (None, Some(reader.create(&args.file, false).json(json)?))
    } else {
        (Some(reader.open(&args.file).json(json)?), None)
    };
    let file = std::fs::File::open(&args.file)
        .map_err(|e| Error::OpenFile {
            path: args.file.clone(),
            errno: gdirect::Errno::from_raw(e.raw_os_error().unwrap_or(5)),
        })
        .json(json)?;
    let per_job = (args.repeat.max(1) as u64 * slots).div_ceil(jobs as u64);
    // Each job's buffer: its share of a round, one slot an I/O (as tests/bench/blocks.py's).
    let slots_per_job = ((args.round_mib.max(1) << 20) / jobs as u64 / io).clamp(1, ROUND_IOS);
    let slots_per_job = match args.duration {
        Some(_) => slots_per_job,
        None => slots_per_job.min(per_job.max(1)),
    };
    // With --duration, I/Os for that many seconds of the clock, after a first round that is a
    // warm-up (not counted: registration, first touches), as blocks.py's first round is.
    let duration = args.duration.map(|d| Duration::from_secs_f64(d.max(0.0)));
    // Rounds: every job prepares its slots (outside the time), all start together, the clock
    // runs from the start until the last job's last I/O of the round ends (the wall clock, as
    // blocks.py times its threads), then every job verifies its slots (outside the time).
    let barrier = std::sync::Barrier::new(jobs);
    let go_on = std::sync::atomic::AtomicBool::new(true);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let clock = std::sync::Mutex::new((Instant::now(), Duration::ZERO, 0u64));
    // A job's failure: (the bytes differ, the error).
    type JobResult = Result<JobTally, (bool, Error)>;
    let job = |j: usize| -> JobResult {
        use std::sync::atomic::Ordering::{Acquire, Release};
        let other = |e: Error| (false, e);
        let mut t = JobTally::default();
        let mut first_error = None;
        let stream = ctx.default_stream();
        // Memory the module may register, as `read` allocates; a failure here still takes its
        // part in every round, so that no other job waits for it for ever.
        let mut mem = match DeviceBuffer::new(&stream, (slots_per_job * io) as usize) {
            Ok(m) => Some(m),
            Err(e) => {
                failed.store(true, Release);
                first_error = Some(other(e));
                None
            }
        };
        let mut buf = mem.as_mut().map(|m| reader.register(m));
        let mut host = vec![0u8; (slots_per_job * io) as usize];
        let mut want = vec![0u8; io as usize];
        let mut offsets = Vec::with_capacity(slots_per_job as usize);
        let mut state =
            0x9e37_79b9_7f4a_7c15u64 ^ (j as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let mut k = 0u64;
        for round in 0u64.. {
            let warmup = round == 0 && duration.is_some();
            // Prepared outside the time: the round's offsets; the slots poisoned (a read) or
            // holding what each I/O writes, a pattern of its offset (jobs that write the same
            // place write the same bytes).
            offsets.clear();
            let n = match duration {
                Some(_) => slots_per_job,
                None => slots_per_job.min(per_job.saturating_sub(k)).max(1),
            };
            for _ in 0..n {
                let at = io_offset(args.pattern, k, j as u64, jobs as u64, slots, &mut state);
                offsets.push(at * io);
                k += 1;
            }
            if let (Some(buf), None) = (buf.as_mut(), &first_error) {
                let bytes = &mut host[..offsets.len() * io as usize];
                for (slot, &off) in offsets.iter().enumerate() {
                    let slot = &mut bytes[slot * io as usize..(slot + 1) * io as usize];
                    match sink {
                        Some(_) => offset_pattern(off, slot),
                        None => slot.fill(POISON),
                    }
                }
                if let Err(e) = buf.memory_mut().copy_from_host(0, bytes) {
                    failed.store(true, Release);
                    first_error = Some(other(e));
                }
            }
            if barrier.wait().is_leader() {
                if let Ok(mut c) = clock.lock() {
                    c.0 = Instant::now();
                }
            }
            barrier.wait();
            if let (Some(buf), None) = (buf.as_mut(), &first_error) {
                for (slot, &off) in offsets.iter().enumerate() {
                    let at = slot as u64 * io;
                    let t0 = Instant::now();
                    let r = match (&src, &sink) {
                        (Some(src), _) => reader.read_into(src, buf, at, off, io),
                        (None, Some(sink)) => reader.write_from(sink, buf, at, off, io),
                        (None, None) => Err(Error::Worker {
                            what: "a bench job with neither a file to read nor one to write",
                        }),
                    };
                    let ns = t0.elapsed().as_nanos() as u64;
                    match r {
                        Ok(r) if r.transfer.bytes == io => {
                            let r = r.transfer;
                            t.engine
                                .get_or_insert_with(|| (r.engine.name(), r.engine.explain()));
                            if !warmup {
                                t.ios += 1;
                                t.bytes += io;
                                t.latencies.push(ns);
                            }
                        }
                        Ok(r) => {
                            failed.store(true, Release);
                            first_error = Some((
                                true,
                                Error::Cuda {
                                    what: "bench verification",
                                    error: format!(
                                        "the I/O at offset {off} moved {} of {io} bytes",
                                        r.transfer.bytes
                                    ),
                                },
                            ));
                            break;
                        }
                        Err(e) => {
                            failed.store(true, Release);
                            first_error = Some(other(e));
                            break;
                        }
                    }
                }
            }
            if barrier.wait().is_leader() {
                let timed = match clock.lock() {
                    Ok(mut c) => {
                        if !warmup {
                            let took = c.0.elapsed();
                            c.1 += took;
                            c.2 += 1;
                        }
                        c.1
                    }
                    Err(_) => Duration::MAX,
                };
                let more = match duration {
                    Some(d) => timed < d,
                    None => k < per_job,
                };
                go_on.store(more && !failed.load(Acquire), Release);
            }
            barrier.wait();
            // Verified outside the time: every slot against the file's bytes at its offset.
            if let (Some(buf), None) = (buf.as_ref(), &first_error) {
                let bytes = &mut host[..offsets.len() * io as usize];
                let checked = buf.memory().copy_to_host(0, bytes).map_err(other).and_then(|()| {
                    for (slot, &off) in offsets.iter().enumerate() {
                        let got = &bytes[slot * io as usize..(slot + 1) * io as usize];
                        // A write's bytes back from the file, through the page cache.
                        file.read_exact_at(&mut want, off).map_err(|e| {
                            other(Error::FileIo {
                                path: args.file.clone(),
                                offset: off,
                                errno: gdirect::Errno::from_raw(e.raw_os_error().unwrap_or(5)),
                            })
                        })?;
                        if got != &want[..] {
                            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                            return Err((
                                true,
                                Error::Cuda {
                                    what: "bench verification",
                                    error: format!(
                                        "the {} at file offset {off} (slot {slot}) differs from the file at byte {}: its round's time does not count",
                                        if sink.is_some() { "write" } else { "read" },
                                        off + at as u64,
                                    ),
                                },
                            ));
                        }
                    }
                    Ok(())
                });
                if let Err(e) = checked {
                    failed.store(true, Release);
                    first_error = Some(e);
                }
            }
            if !go_on.load(Acquire) {
                break;
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(t),
        }
    };
    let results: Vec<JobResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs).map(|j| scope.spawn(move || job(j))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or(Err((
                    false,
                    Error::Worker {
                        what: "a bench job panicked",
                    },
                )))
            })
            .collect()
    });
    let mut all = JobTally::default();
    for r in results {
        match r {
            Ok(t) => {
                all.ios += t.ios;
                all.bytes += t.bytes;
                all.latencies.extend(t.latencies);
                all.engine = all.engine.or(t.engine);
            }
            Err((true, error)) => {
                let mut failure = Failure::mismatch(error);
                failure.json = json;
                return Err(failure);
            }
            Err((false, error)) => return Err(Failure::new(error, json)),
        }
    }
    all.latencies.sort_unstable();
    let (wall, rounds) = clock
        .lock()
        .map(|c| (c.1, c.2))
        .unwrap_or((Duration::ZERO, 0));
    let seconds = wall.as_secs_f64();
    let (engine, why) = all.engine.unwrap_or(("none", "no I/O ran".into()));
    let out = BenchIoJson {
        op: if args.write { "write" } else { "read" },
        engine,
        why,
        file: args.file.display().to_string(),
        gpu: args.gpu,
        pattern: args.pattern.name(),
        io_size: io,
        jobs,
        threads: settings.threads,
        block_size: settings.task_size,
        page_cache: settings.page_cache.name(),
        ios: all.ios,
        bytes: all.bytes,
        seconds,
        rounds,
        ios_per_round_per_job: slots_per_job,
        gb_per_s: all.bytes as f64 / seconds.max(1e-9) / 1e9,
        iops: all.ios as f64 / seconds.max(1e-9),
        p50_us: percentile(&all.latencies, 0.50),
        p99_us: percentile(&all.latencies, 0.99),
        verified: true,
    };
    if json {
        print_json(&out);
    } else {
        println!(
            "bench {} on GPU {}: {} {} I/Os of {} bytes, {} job(s), {} threads, {} B blocks, page cache {}",
            out.file, out.gpu, out.pattern, out.op, out.io_size, out.jobs, out.threads, out.block_size, out.page_cache
        );
        println!(
            "{} I/Os, {} bytes in {:.3} s: {:.2} GB/s, {:.0} IOPS, latency p50 {:.0} us, p99 {:.0} us; every I/O verified",
            out.ios, out.bytes, out.seconds, out.gb_per_s, out.iops, out.p50_us, out.p99_us
        );
        println!("engine {} ({})", out.engine, out.why);
    }
    Ok(())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1e3
}

#[cfg(feature = "cuda")]
pub(crate) fn bench(args: &BenchArgs, device: &Path, json: bool) -> Result<(), Failure> {
    use gdirect::compat::{CudaBackend, Source};
    use indicatif::{ProgressBar, ProgressStyle};
    use std::io::IsTerminal;

    if let Some(io) = args.io_size {
        if args.method != Method::Gdirect {
            crate::usage_error("--io-size measures the library's reads: --method gdirect");
        }
        return bench_ios(args, io, device, json);
    }

    let len = read_len(&args.file, 0, args.len).json(json)?;
    let t0 = Instant::now();
    let reference = match args.reference {
        Some(r) => r,
        None => gdirect_internals::checksum::of_file(&args.file, 0, len, 16).json(json)?,
    };
    let reference_seconds = t0.elapsed().as_secs_f64();
    let backend = CudaBackend::new(args.gpu).json(json)?;
    let ctx = backend.context().clone();
    let stream = ctx.default_stream();
    let mut mem = stream
        .alloc_zeros::<u8>(len.max(1) as usize)
        .map_err(cuda("GPU memory allocation"))
        .json(json)?;
    let src = Source::open(&args.file).json(json)?;
    let settings = args
        .engine
        .builder()
        .latencies(true)
        .settings()
        .json(json)?;
    let runs_wanted = if args.first { 1 } else { args.repeat.max(1) };
    let warmups = match (args.first, args.warmup) {
        (true, _) => 0,
        (false, Some(w)) => w,
        (false, None) => usize::from(!args.cold),
    };
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new((warmups + runs_wanted) as u64);
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} reads")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(format!("bench {}", args.file.display()));
        b
    });
    let mut engine = None;
    if !args.first && args.method == Method::Gdirect {
        engine = Some(
            args.engine
                .builder()
                .latencies(true)
                .build(backend.clone())
                .json(json)?,
        );
    }
    let mut runs = Vec::new();
    let mut latencies = Vec::new();
    let mut ios = 0u64;
    for k in 0..warmups + runs_wanted {
        stream
            .memset_zeros(&mut mem)
            .and_then(|()| stream.synchronize())
            .map_err(cuda("clearing GPU memory"))
            .json(json)?;
        if args.cold {
            src.evict().json(json)?;
        }
        let t0 = Instant::now();
        let report: Option<Report> = if args.method == Method::Naive {
            let data = std::fs::read(&args.file)
                .map_err(|e| Error::FileIo {
                    path: args.file.clone(),
                    offset: 0,
                    errno: gdirect::Errno::from_raw(e.raw_os_error().unwrap_or(5)),
                })
                .json(json)?;
            let n = (len as usize).min(data.len());
            let mut view = mem.slice_mut(0..n);
            stream
                .memcpy_htod(&data[..n], &mut view)
                .and_then(|()| stream.synchronize())
                .map_err(cuda("host-to-device copy"))
                .json(json)?;
            None
        } else {
            let e = match &engine {
                Some(e) => e,
                None => engine.insert(
                    args.engine
                        .builder()
                        .latencies(true)
                        .build(backend.clone())
                        .json(json)?,
                ),
            };
            Some(e.read(&src, &mut mem, 0, 0, len).json(json)?)
        };
        let seconds = t0.elapsed().as_secs_f64();
        let got = gdirect_internals::checksum::of_device(&mem, len, 16).json(json)?;
        if got != reference {
            let mut failure = Failure::mismatch(Error::Cuda {
                what: "bench verification",
                error: format!(
                    "read {k}: GPU memory checksum {got:016x}, file {reference:016x}: the read is wrong and its time does not count"
                ),
            });
            failure.json = json;
            return Err(failure);
        }
        if let Some(b) = &bar {
            b.inc(1);
        }
        if k < warmups {
            continue;
        }
        if let Some(r) = &report {
            latencies.extend_from_slice(&r.latencies_ns);
            ios += r.ios;
        } else {
            ios += 1;
        }
        runs.push(RunJson {
            seconds,
            gb_per_s: len as f64 / seconds / 1e9,
            verified: true,
            compat: report.as_ref().map(|r| compat_json(&settings, r)),
        });
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut speeds: Vec<f64> = runs.iter().map(|r| r.gb_per_s).collect();
    speeds.sort_by(f64::total_cmp);
    latencies.sort_unstable();
    let total: f64 = runs.iter().map(|r| r.seconds).sum();
    let out = BenchJson {
        file: args.file.display().to_string(),
        gpu: args.gpu,
        bytes: len,
        method: args.method.name(),
        cold: args.cold,
        first: args.first,
        threads: settings.threads,
        block_size: settings.task_size,
        page_cache: settings.page_cache.name(),
        median_gb_per_s: speeds[speeds.len() / 2],
        iops: ios as f64 / total.max(1e-9),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        runs,
        reference_checksum: format!("{reference:016x}"),
        reference_seconds,
    };
    if json {
        print_json(&out);
    } else {
        println!(
            "bench {} ({} bytes) on GPU {}: {}{}, {} threads, {} B blocks, page cache {}",
            out.file,
            out.bytes,
            out.gpu,
            out.method,
            if out.cold {
                ", cold"
            } else if out.first {
                ", first read of a fresh process"
            } else {
                ", warm"
            },
            out.threads,
            out.block_size,
            out.page_cache
        );
        for (i, r) in out.runs.iter().enumerate() {
            println!(
                "  read {i}: {:.3} s, {:.2} GB/s, verified",
                r.seconds, r.gb_per_s
            );
        }
        println!(
            "median {:.2} GB/s, {:.0} IOPS, latency p50 {:.0} us, p99 {:.0} us",
            out.median_gb_per_s, out.iops, out.p50_us, out.p99_us
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{io_offset, window_size, Pattern};

    #[test]
    fn sequential_jobs_cover_every_slot_and_random_ones_stay_inside() {
        for (jobs, slots) in [(1u64, 10u64), (3, 10), (4, 4), (5, 3)] {
            let mut seen = vec![0u32; slots as usize];
            for j in 0..jobs {
                for k in 0..slots.div_ceil(jobs) {
                    seen[io_offset(Pattern::Seq, k, j, jobs, slots, &mut 0) as usize] += 1;
                }
            }
            assert!(
                seen.iter().all(|&n| n >= 1),
                "{jobs} jobs, {slots} slots: {seen:?}"
            );
        }
        let mut state = 12345;
        let mut seen = [false; 7];
        for k in 0..1000 {
            let s = io_offset(Pattern::Rand, k, 0, 1, 7, &mut state);
            seen[s as usize] = true;
        }
        assert!(seen.iter().all(|&b| b), "random offsets reach every slot");
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_window_is_the_read_unless_it_does_not_fit() {
        // Fits in half the free memory: the whole read, in 4 KiB.
        assert_eq!(window_size(100, None, 64 * MIB), 4096);
        assert_eq!(window_size(32 * MIB, None, 64 * MIB), 32 * MIB);
        // Larger: half the free memory, whole MiB.
        assert_eq!(window_size(33 * MIB, None, 64 * MIB), 32 * MIB);
        assert_eq!(window_size(1 << 40, None, 64 * MIB + 5), 32 * MIB);
        // Nearly no free memory: 1 MiB, for the allocation to fail with its own error.
        assert_eq!(window_size(1 << 40, None, 0), MIB);
        // Asked for: rounded up to 4 KiB, never more than the read.
        assert_eq!(window_size(64 * MIB, Some(MIB + 1), 0), MIB + 4096);
        assert_eq!(window_size(8192, Some(MIB), 0), 8192);
        assert_eq!(window_size(0, None, 0), 4096);
    }
}
