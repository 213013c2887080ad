// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The compat engine against host memory: every byte compared with the file, under random
//! offsets, lengths and settings, short reads, I/O errors and a file that shrinks.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use super::*;

/// A small deterministic generator (SplitMix64), so the property tests need no dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A file of `len` pseudo-random bytes in the temporary directory, removed on drop.
struct TempFile {
    path: PathBuf,
    data: Vec<u8>,
}

impl TempFile {
    fn new(name: &str, len: usize, seed: u64) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "gdirect-compat-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut rng = Rng(seed);
        let data: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|_| rng.next().to_le_bytes())
            .take(len)
            .collect();
        let mut f = std::fs::File::create(&path).expect("temp file");
        f.write_all(&data).expect("temp file write");
        f.sync_all().expect("temp file sync");
        Self { path, data }
    }
}

#[test]
fn reads_at_once_share_the_engines_threads_and_lanes() {
    let f = TempFile::new("lanes", 4 << 20, 14);
    let src = Source::open(&f.path).expect("open");
    let e = engine(3, 128 << 10, PageCache::Direct);
    // Five callers at once, each with reads of 3 workers: each caller runs one of its workers
    // itself and queues the others on the 3 threads, and a worker takes its lane (pinned
    // staging, for CUDA) only when it runs: at most one lane per thread, the engine's 3 and
    // the callers' 5.
    std::thread::scope(|s| {
        for c in 0..5u64 {
            let (e, f, src) = (&e, &f, &src);
            s.spawn(move || {
                for k in 0..4u64 {
                    check_read(e, f, src, (c * 4 + k) * 4096, 2 << 20);
                }
            });
        }
    });
    let lanes = lock(&e.lanes).len();
    assert!((1..=8).contains(&lanes), "{lanes} lanes for 3 + 5 threads");
    // And one read's workers run at once (a lock held across a worker would serialise them:
    // it once did, and reads ran at one thread's speed): reads that take 30 ms each overlap.
    let mut input = Faulty::new(&src);
    input.delay = Some(std::time::Duration::from_millis(30));
    let mut mem = vec![0u8; 3 << 20];
    let r = faulty_read(&e, &input, &mut mem, 0, 3 << 20).expect("read");
    assert_eq!(r.bytes, 3 << 20);
    assert!(mem[..] == f.data[..3 << 20]);
    let most = input.most_at_once.load(Ordering::SeqCst);
    assert!(most >= 2, "at most {most} of 3 workers read at once");
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn engine(threads: usize, task: u64, mode: PageCache) -> CompatEngine<HostBackend> {
    CompatEngine::builder()
        .threads(threads)
        .task_size(task)
        .staging_size(task * 2)
        .page_cache(mode)
        .max_piece(task * 4)
        .write_piece(task)
        .latencies(true)
        .build_host()
        .expect("engine")
}

/// Reads through the engine and checks every byte against the file's, and that bytes beyond
/// the read are untouched.
fn check_read(
    e: &CompatEngine<HostBackend>,
    f: &TempFile,
    src: &Source,
    off: u64,
    len: u64,
) -> Report {
    let pad = 4096u64;
    let mut mem = vec![0xa5u8; (len + 2 * pad) as usize];
    let r = e.read(src, &mut mem, pad, off, len).expect("read");
    let size = f.data.len() as u64;
    let want = len.min(size.saturating_sub(off));
    assert_eq!(r.bytes, want, "bytes at {off}+{len} of {size}");
    assert_eq!(r.eof, want < len);
    assert_eq!(r.direct_bytes + r.buffered_bytes + r.mapped_bytes, want);
    let got = &mem[pad as usize..(pad + want) as usize];
    let start = off.min(size) as usize;
    let exp = &f.data[start..start + want as usize];
    assert!(
        got == exp,
        "bytes differ at {off}+{len} ({:?})",
        e.settings().page_cache
    );
    assert!(
        mem[..pad as usize].iter().all(|&b| b == 0xa5),
        "wrote before the range"
    );
    assert!(
        mem[(pad + want) as usize..].iter().all(|&b| b == 0xa5),
        "wrote after the range"
    );
    r
}

#[test]
fn random_reads_are_exact_in_every_page_cache_mode() {
    let f = TempFile::new("random", (9 << 20) + 1234, 1);
    let src = Source::open(&f.path).expect("open");
    assert!(
        src.has_direct_io(),
        "the test directory's file system takes O_DIRECT"
    );
    let mut rng = Rng(2);
    for mode in [
        PageCache::Auto,
        PageCache::Direct,
        PageCache::Buffered,
        PageCache::Mapped,
    ] {
        for &(threads, task) in &[(1usize, 4096u64), (3, 64 << 10), (8, 1 << 20)] {
            let e = engine(threads, task, mode);
            for _ in 0..25 {
                let off = match rng.below(3) {
                    0 => rng.below(f.data.len() as u64 + 8192),
                    1 => rng.below(64) * 4096,
                    _ => f.data.len() as u64 - rng.below(9000).min(f.data.len() as u64),
                };
                let len = match rng.below(3) {
                    0 => rng.below(5000),
                    1 => rng.below(3 << 20),
                    _ => rng.below(12 << 20),
                };
                let r = check_read(&e, &f, &src, off, len);
                if mode == PageCache::Direct && r.bytes > 0 {
                    assert_eq!(r.direct_bytes, r.bytes);
                }
                if mode == PageCache::Buffered {
                    assert_eq!(r.buffered_bytes, r.bytes);
                }
                if mode == PageCache::Mapped {
                    assert_eq!(r.mapped_bytes, r.bytes);
                }
                if mode != PageCache::Mapped {
                    assert_eq!(r.latencies_ns.len() as u64, r.ios, "a latency for each I/O");
                }
            }
        }
    }
}

#[test]
fn auto_reads_cached_data_through_the_page_cache_and_the_rest_direct() {
    let f = TempFile::new("auto", 8 << 20, 3);
    let src = Source::open(&f.path).expect("open");
    let e = engine(4, 1 << 20, PageCache::Auto);
    src.evict().expect("evict");
    assert!(!src.is_cached(0..8 << 20));
    let cold = check_read(&e, &f, &src, 0, 8 << 20);
    assert_eq!(cold.direct_bytes, 8 << 20, "nothing cached: all direct");
    // Warm the first half, without readahead into the second.
    let file = std::fs::File::open(&f.path).expect("open");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: plain syscall on our descriptor.
    let r = unsafe { nix::libc::posix_fadvise(fd, 0, 0, nix::libc::POSIX_FADV_RANDOM) };
    assert_eq!(r, 0);
    let mut sink = vec![0u8; 4 << 20];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut sink, 0).expect("warm");
    assert!(src.is_cached(0..4 << 20));
    assert!(!src.is_cached(4 << 20..8 << 20));
    let half = check_read(&e, &f, &src, 0, 8 << 20);
    assert_eq!(
        half.buffered_bytes,
        4 << 20,
        "the cached half through the page cache"
    );
    assert_eq!(half.direct_bytes, 4 << 20, "the rest direct");
}

#[test]
fn reads_past_the_end_are_short_and_say_so() {
    let f = TempFile::new("eof", 100_000, 4);
    let src = Source::open(&f.path).expect("open");
    let e = engine(4, 8192, PageCache::Direct);
    let r = check_read(&e, &f, &src, 90_000, 50_000);
    assert!(r.eof && r.bytes == 10_000);
    let r = check_read(&e, &f, &src, 100_000, 4096);
    assert!(r.eof && r.bytes == 0);
    let r = check_read(&e, &f, &src, 1 << 30, 4096);
    assert!(r.eof && r.bytes == 0);
    let r = check_read(&e, &f, &src, 0, 0);
    assert!(!r.eof && r.bytes == 0);
}

#[test]
fn a_destination_too_small_is_refused_before_any_io() {
    let f = TempFile::new("dest", 65536, 5);
    let src = Source::open(&f.path).expect("open");
    let e = engine(2, 4096, PageCache::Auto);
    let mut mem = vec![0u8; 8192];
    let err = e
        .read(&src, &mut mem, 4096, 0, 8192)
        .expect_err("too small");
    assert!(
        matches!(
            err,
            Error::OutOfMemoryRange {
                offset: 4096,
                len: 8192,
                size: 8192
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), Some(Errno::EOVERFLOW));
    let err = e
        .read(&src, &mut mem, u64::MAX, 0, 2)
        .expect_err("overflow");
    assert!(matches!(err, Error::OutOfMemoryRange { .. }));
}

/// A [`Source`] with faults: reads return at most `short` bytes (a multiple of 4 KiB for
/// direct reads, as the kernel does), fail at `fail_at`, or find the file ending at `end`; the
/// first direct read over `cut` stops there (inside a block, though the file goes on); direct
/// reads fail with `EINVAL` when `einval`; the read over `panic_at` panics.
struct Faulty<'a> {
    src: &'a Source,
    short: usize,
    fail_at: Option<u64>,
    panic_at: Option<u64>,
    end: Option<u64>,
    cut: Mutex<Option<u64>>,
    einval: bool,
    direct_failed: AtomicBool,
    reads: AtomicU64,
    /// Each read takes at least this long, and the most reads at once are counted.
    delay: Option<std::time::Duration>,
    at_once: AtomicU64,
    most_at_once: AtomicU64,
}

impl Faulty<'_> {
    fn new(src: &Source) -> Faulty<'_> {
        Faulty {
            src,
            short: usize::MAX,
            fail_at: None,
            panic_at: None,
            end: None,
            cut: Mutex::new(None),
            einval: false,
            direct_failed: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            delay: None,
            at_once: AtomicU64::new(0),
            most_at_once: AtomicU64::new(0),
        }
    }
}

impl Input for Faulty<'_> {
    fn path(&self) -> &Path {
        self.src.path()
    }
    fn id(&self) -> source::FileId {
        self.src.id()
    }
    fn direct_io(&self) -> bool {
        !self.direct_failed.load(Ordering::Relaxed)
    }
    fn direct_align(&self) -> u64 {
        4096
    }
    fn direct_failed(&self) {
        self.direct_failed.store(true, Ordering::Relaxed);
    }
    fn current_size(&self) -> io::Result<u64> {
        let size = self.src.current_size()?;
        Ok(self.end.map_or(size, |e| size.min(e)))
    }
    fn current_id(&self) -> io::Result<source::FileId> {
        self.src.current_id()
    }
    fn read_at(&self, buf: &mut [u8], off: u64, how: How) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(d) = self.delay {
            let now = self.at_once.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_at_once.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(d);
            self.at_once.fetch_sub(1, Ordering::SeqCst);
        }
        if self.einval && how == How::Direct {
            return Err(io::Error::from_raw_os_error(nix::libc::EINVAL));
        }
        if how == How::Direct {
            let mut cut = self.cut.lock().expect("cut");
            if let Some(c) = cut.filter(|&c| (off..off + buf.len() as u64).contains(&c)) {
                *cut = None;
                self.src.read_at(buf, off, how)?;
                return Ok((c - off) as usize);
            }
        }
        if self
            .fail_at
            .is_some_and(|f| (off..off + buf.len() as u64).contains(&f))
        {
            return Err(io::Error::from_raw_os_error(nix::libc::EIO));
        }
        if let Some(p) = self
            .panic_at
            .filter(|p| (off..off + buf.len() as u64).contains(p))
        {
            panic!("a planted panic in the read at {p}");
        }
        // Read all that is asked (a direct read needs its aligned length), report less.
        let mut n = self.src.read_at(buf, off, how)?.min(self.short);
        if let Some(end) = self.end {
            n = n.min(end.saturating_sub(off) as usize);
        }
        Ok(n)
    }
    fn resident(&self, range: Range<u64>) -> bool {
        self.src.resident(range)
    }
    fn mapping(&self) -> Option<&Arc<Mapping>> {
        None
    }
}

fn faulty_read(
    e: &CompatEngine<HostBackend>,
    input: &Faulty<'_>,
    mem: &mut [u8],
    off: u64,
    len: u64,
) -> Result<Report> {
    e.read_input(input, HostBackend::dest(mem), 0, off, len)
}

#[test]
fn short_reads_are_retried_until_the_bytes_are_all_there() {
    let f = TempFile::new("short", 3 << 20, 6);
    let src = Source::open(&f.path).expect("open");
    let mut rng = Rng(7);
    for mode in [PageCache::Direct, PageCache::Buffered] {
        let e = engine(4, 256 << 10, mode);
        for short in [4096usize, 12288, 65536] {
            let mut input = Faulty::new(&src);
            input.short = short;
            let off = rng.below(1 << 20) & !4095;
            let len = rng.below(2 << 20) + 1;
            let mut mem = vec![0u8; len as usize];
            let r = faulty_read(&e, &input, &mut mem, off, len).expect("read");
            assert_eq!(r.bytes, len);
            assert!(
                mem[..] == f.data[off as usize..(off + len) as usize],
                "{mode:?} short {short}"
            );
            assert!(input.reads.load(Ordering::Relaxed) >= len / short as u64);
        }
    }
}

#[test]
fn reads_and_writes_run_on_the_engines_own_threads_every_time() {
    let f = TempFile::new("pool", 4 << 20, 12);
    let src = Source::open(&f.path).expect("open");
    let e = engine(3, 128 << 10, PageCache::Direct);
    for k in 0..8u64 {
        check_read(&e, &f, &src, k * 4096, 3 << 20);
    }
    let mut room = vec![7u8; (1 << 20) + 4096];
    let at = room.as_ptr().align_offset(4096);
    let out = TempFile::new("pool-out", 1 << 20, 13);
    let sink = Sink::open(&out.path, false, false).expect("open for writing");
    for _ in 0..3 {
        // SAFETY: `room[at..]` holds 1 MiB readable bytes for the call.
        let r = unsafe { e.write_host_ptr(&sink, room[at..].as_ptr(), 1 << 20, 0) }.expect("write");
        assert_eq!(r.bytes, 1 << 20);
    }
    room.truncate(0);
    let threads = lock(&e.worker_threads).clone();
    // Threads spawned per read would be new ones every time: 8 reads and 3 writes, each
    // handing 2 tasks to the pool, would have shown up to 22. Which of the pool's 3 threads
    // take the tasks is the scheduler's choice (on a loaded machine one may take none).
    assert!(
        (1..=3).contains(&threads.len()),
        "the workers ran on {} threads",
        threads.len()
    );
    assert!(!threads.contains(&std::thread::current().id()));
}

#[test]
fn a_panicking_worker_is_an_error_and_the_engine_goes_on() {
    let f = TempFile::new("panic", 2 << 20, 14);
    let src = Source::open(&f.path).expect("open");
    let e = engine(4, 128 << 10, PageCache::Direct);
    let mut input = Faulty::new(&src);
    input.panic_at = Some(1 << 20);
    let mut mem = vec![0u8; 2 << 20];
    match faulty_read(&e, &input, &mut mem, 0, 2 << 20) {
        Err(Error::Worker { what }) => assert!(what.contains("panicked"), "{what}"),
        other => panic!("expected a Worker error, got {other:?}"),
    }
    // The pool survived the panic: the next read is whole.
    check_read(&e, &f, &src, 0, 2 << 20);
}

#[test]
fn an_io_error_fails_the_read_with_the_file_and_offset() {
    let f = TempFile::new("eio", 4 << 20, 8);
    let src = Source::open(&f.path).expect("open");
    for mode in [PageCache::Direct, PageCache::Buffered] {
        let e = engine(4, 64 << 10, mode);
        let mut input = Faulty::new(&src);
        input.fail_at = Some(3 << 20);
        let mut mem = vec![0u8; 4 << 20];
        let err = faulty_read(&e, &input, &mut mem, 0, 4 << 20).expect_err("EIO");
        match &err {
            Error::FileIo {
                path,
                offset,
                errno,
            } => {
                assert_eq!(path, &f.path);
                assert_eq!(*errno, Errno::EIO);
                assert!(
                    (3 << 20) - (64 << 10) < *offset && *offset <= 3 << 20,
                    "{err}"
                );
            }
            other => panic!("expected FileIo, got {other}"),
        }
        assert!(err.to_string().contains("EIO"), "{err}");
        // The engine is still usable: its lanes came back.
        let r = check_read(&e, &f, &src, 0, 1 << 20);
        assert_eq!(r.bytes, 1 << 20);
    }
}

#[test]
fn a_file_that_ends_early_gives_a_short_read_of_the_bytes_before_its_end() {
    let f = TempFile::new("shrink", 4 << 20, 9);
    let src = Source::open(&f.path).expect("open");
    let mut rng = Rng(10);
    for mode in [PageCache::Direct, PageCache::Buffered] {
        for threads in [1, 5] {
            let e = engine(threads, 64 << 10, mode);
            let mut input = Faulty::new(&src);
            let end = rng.below(4 << 20);
            input.end = Some(end);
            let mut mem = vec![0u8; 4 << 20];
            let r = faulty_read(&e, &input, &mut mem, 0, 4 << 20).expect("read");
            assert!(r.eof, "{mode:?}");
            assert_eq!(r.bytes, end, "{mode:?} threads {threads}");
            assert!(mem[..end as usize] == f.data[..end as usize]);
        }
    }
}

/// A host engine of `threads` workers that reads cached data through the file's mapping and
/// keeps `keep` bytes of its registrations between reads.
fn mapped_engine(threads: usize, keep: u64) -> CompatEngine<HostBackend> {
    CompatEngine::builder()
        .threads(threads)
        .task_size(1 << 20)
        .page_cache(PageCache::Mapped)
        .keep_mapped(keep)
        .build_host()
        .expect("engine")
}

#[test]
fn mapped_registrations_are_kept_up_to_the_limit_and_released_beyond_it() {
    let f = TempFile::new("keep", 5 << 20, 11);
    let src = Source::open(&f.path).expect("open");
    let e = mapped_engine(3, 1 << 30);
    let first = check_read(&e, &f, &src, 0, 5 << 20);
    assert_eq!(
        first.registered_bytes,
        5 << 20,
        "the whole file, page-rounded"
    );
    assert_eq!(e.kept_mapped(), 5 << 20);
    let again = check_read(&e, &f, &src, 4096, 4 << 20);
    assert_eq!(again.registered_bytes, 0, "kept from the first read");
    assert_eq!(again.mapped_bytes, 4 << 20);
    let none = mapped_engine(3, 0);
    check_read(&none, &f, &src, 0, 5 << 20);
    assert_eq!(none.kept_mapped(), 0, "released after the read");
    let r = check_read(&none, &f, &src, 0, 5 << 20);
    assert_eq!(r.registered_bytes, 5 << 20, "registered again");
}

/// A file rewritten in place (truncated and written again, through the same open `Source`)
/// has other pages: the registrations kept from a read before pin the old ones (on a GPU, a
/// `cuMemHostRegister` of pages the page cache dropped), so the next read registers the file
/// again rather than copy from them, and gets the new bytes.
#[test]
fn kept_mapped_registrations_of_a_file_rewritten_in_place_are_not_reused() {
    let mut f = TempFile::new("rewrite", 2 << 20, 12);
    let src = Source::open(&f.path).expect("open");
    let e = mapped_engine(2, 1 << 30);
    assert_eq!(
        check_read(&e, &f, &src, 0, 2 << 20).registered_bytes,
        2 << 20
    );
    assert_eq!(
        check_read(&e, &f, &src, 0, 2 << 20).registered_bytes,
        0,
        "kept"
    );
    // Rewritten in place: the same inode and size, other bytes, later times.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut rng = Rng(13);
    f.data.iter_mut().for_each(|b| *b = rng.next() as u8);
    std::fs::write(&f.path, &f.data).expect("rewrite");
    let r = check_read(&e, &f, &src, 0, 2 << 20);
    assert_eq!(
        r.registered_bytes,
        2 << 20,
        "registered again, not the old pages"
    );
    assert_eq!(e.kept_mapped(), 2 << 20, "the stale registrations released");
}

/// A [`Source`] whose size and times never move from `then`'s (what a kernel with coarse
/// timestamps shows of a write within the same tick).
struct Frozen<'a> {
    src: &'a Source,
    then: source::FileId,
}

impl Input for Frozen<'_> {
    fn path(&self) -> &Path {
        self.src.path()
    }
    fn id(&self) -> source::FileId {
        self.src.id()
    }
    fn direct_io(&self) -> bool {
        self.src.direct_io()
    }
    fn direct_align(&self) -> u64 {
        self.src.direct_align()
    }
    fn direct_failed(&self) {
        self.src.direct_failed()
    }
    fn current_size(&self) -> io::Result<u64> {
        Ok(self.then.size())
    }
    fn current_id(&self) -> io::Result<source::FileId> {
        Ok(self.src.current_id()?.with_times_of(&self.then))
    }
    fn read_at(&self, buf: &mut [u8], off: u64, how: How) -> io::Result<usize> {
        self.src.read_at(buf, off, how)
    }
    fn resident(&self, range: Range<u64>) -> bool {
        self.src.resident(range)
    }
    fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.src.mapping()
    }
}

/// A write this process made to a file (through the engine's writer or the module) retires the
/// registrations kept of it, even where the file's size and times show no change: on a GPU an
/// `O_DIRECT` write drops the cached pages a kept registration pins, and a read through it
/// would give the bytes from before the write.
#[test]
fn kept_mapped_registrations_are_not_reused_after_this_process_writes_the_file() {
    let mut f = TempFile::new("written", 2 << 20, 14);
    let src = Source::open(&f.path).expect("open");
    let input = Frozen {
        src: &src,
        then: src.current_id().expect("id"),
    };
    let e = mapped_engine(2, 1 << 30);
    let read = |f: &TempFile| {
        let mut mem = vec![0u8; 2 << 20];
        let r = e
            .read_input(&input, HostBackend::dest(&mut mem), 0, 0, 2 << 20)
            .expect("read");
        assert!(mem == f.data, "the file's bytes");
        r
    };
    assert_eq!(read(&f).registered_bytes, 2 << 20);
    assert_eq!(read(&f).registered_bytes, 0, "kept");
    // New bytes over the first 64 KiB, through the engine's writer (O_DIRECT where it can).
    let mut rng = Rng(15);
    let new: Vec<u8> = (0..65536).map(|_| rng.next() as u8).collect();
    f.data[..65536].copy_from_slice(&new);
    let sink = Sink::open(&f.path, false, false).expect("sink");
    // SAFETY: `new` is readable for its length for the whole call.
    unsafe { e.write_host_ptr(&sink, new.as_ptr(), new.len() as u64, 0) }.expect("write");
    let r = read(&f);
    assert_eq!(r.registered_bytes, 2 << 20, "registered again");
    assert_eq!(
        e.kept_mapped(),
        2 << 20,
        "the registrations from before released"
    );
    // A write refused before it starts (past the largest offset) changes nothing: not counted.
    let before = src.current_id().expect("id");
    // SAFETY: as above.
    let err = unsafe { e.write_host_ptr(&sink, new.as_ptr(), 1, u64::MAX - 1) };
    assert!(err.is_err(), "a write past the largest offset fails");
    assert_eq!(
        src.current_id().expect("id"),
        before,
        "a write refused before any byte moved is not counted"
    );
}

#[test]
fn settings_come_from_defaults_then_environment_then_builder() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let s = Settings::default()
        .with_env(env(&[
            ("GDIRECT_THREADS", "7"),
            ("GDIRECT_TASK_SIZE", "2M"),
            ("GDIRECT_STAGING_SIZE", "8m"),
            ("GDIRECT_PAGE_CACHE", "buffered"),
            ("GDIRECT_KEEP_MAPPED", "1G"),
            ("GDIRECT_DIRECT_THRESHOLD", "1M"),
        ]))
        .expect("env");
    assert_eq!(s.direct_threshold, 1 << 20);
    assert_eq!(
        (s.threads, s.task_size, s.staging_size),
        (7, 2 << 20, 8 << 20)
    );
    assert_eq!(
        (s.page_cache, s.keep_mapped),
        (PageCache::Buffered, 1 << 30)
    );
    let err = Settings::default()
        .with_env(env(&[("GDIRECT_TASK_SIZE", "4 MiB")]))
        .expect_err("bad size");
    assert!(
        matches!(
            err,
            Error::BadSetting {
                name: "GDIRECT_TASK_SIZE",
                ..
            }
        ),
        "{err}"
    );
    let err = Settings::default()
        .with_env(env(&[("GDIRECT_PAGE_CACHE", "sometimes")]))
        .expect_err("bad mode");
    assert!(
        err.to_string().contains("auto, direct, buffered or mapped"),
        "{err}"
    );

    let mut b = CompatEngine::builder().threads(3);
    b.env = Ok(s);
    let built = b.settings().expect("settings");
    assert_eq!(built.threads, 3, "the builder wins over the environment");
    assert_eq!(
        built.task_size,
        2 << 20,
        "the environment wins over the defaults"
    );

    for bad in [
        CompatEngine::builder().threads(0),
        CompatEngine::builder().task_size(1000),
        CompatEngine::builder().task_size(0),
        CompatEngine::builder().max_piece(0),
        CompatEngine::builder().write_piece(0),
        CompatEngine::builder().write_piece(5000),
        CompatEngine::builder().write_piece(2 << 30),
    ] {
        let err = bad.build_host().err().expect("refused");
        assert_eq!(err.errno(), Some(Errno::EINVAL), "{err}");
    }
    assert_eq!(parse_size("64K"), Some(65536));
    assert_eq!(parse_size("12"), Some(12));
    assert_eq!(parse_size("99999999999G"), None);
    assert_eq!(parse_size(""), None);
}

#[test]
fn process_counters_add_up() {
    let f = TempFile::new("stats", 1 << 20, 12);
    let src = Source::open(&f.path).expect("open");
    let e = engine(2, 64 << 10, PageCache::Buffered);
    let before = stats();
    check_read(&e, &f, &src, 0, 1 << 20);
    let after = stats();
    assert!(after.reads > before.reads);
    assert!(after.bytes - before.bytes >= 1 << 20);
    assert!(after.buffered_bytes - before.buffered_bytes >= 1 << 20);
}

/// The CUDA context current on the calling thread (null for none).
#[cfg(feature = "cuda")]
fn current_context() -> cudarc::driver::sys::CUcontext {
    let mut c = std::ptr::null_mut();
    // SAFETY: `c` receives the current context.
    let r = unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut c) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    c
}

/// The engine waits for the GPU as the context's owner chose: asking and yielding the CPU in a
/// context of the default flags (PyTorch's, CuPy's), asleep in one made with
/// `CU_CTX_SCHED_BLOCKING_SYNC`. Run on a GPU machine:
/// `cargo test -p gdirect --features cuda -- --ignored waited_for_as`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_context_is_waited_for_as_its_flags_say() {
    use super::cuda::Waits;
    use cudarc::driver::{sys, CudaContext};
    let ctx = CudaContext::new(0).expect("CUDA context");
    std::thread::scope(|s| {
        s.spawn(|| {
            ctx.bind_to_thread().expect("the primary context, current");
            // A context of each scheduling flag, made current in turn: only one made to sleep
            // while waiting is waited for asleep; the others (spin, yield, and the driver's
            // choice between them) are asked and yielded to.
            use sys::CUctx_flags::*;
            for (flag, want) in [
                (CU_CTX_SCHED_AUTO, Waits::Yield),
                (CU_CTX_SCHED_SPIN, Waits::Yield),
                (CU_CTX_SCHED_YIELD, Waits::Yield),
                (CU_CTX_SCHED_BLOCKING_SYNC, Waits::Block),
            ] {
                let mut own = std::ptr::null_mut();
                // SAFETY: a new context of device 0 with `flag`, made current on this thread;
                // destroyed below.
                let r =
                    unsafe { sys::cuCtxCreate_v4(&mut own, std::ptr::null_mut(), flag as u32, 0) };
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{flag:?}");
                let mut flags = 0;
                // SAFETY: `flags` receives the current context's flags.
                let r = unsafe { sys::cuCtxGetFlags(&mut flags) };
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
                assert_eq!(
                    flags & CU_CTX_SCHED_MASK as u32,
                    flag as u32,
                    "{flag:?} set"
                );
                assert_eq!(Waits::of_current(), want, "{flag:?}");
                // SAFETY: the context created above, current on this thread only.
                unsafe { sys::cuCtxDestroy_v2(own) };
            }
        });
    });
}

/// A read into GPU memory leaves the caller's thread with the context it had: none, or another
/// one the caller made current. Run on a GPU machine:
/// `cargo test -p gdirect --features cuda -- --ignored callers_context`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_read_leaves_the_callers_context_as_it_was() {
    use cudarc::driver::{sys, CudaContext};
    let f = TempFile::new("ctx", 8 << 20, 7);
    let src = Source::open(&f.path).expect("source");
    let ctx = CudaContext::new(0).expect("CUDA context");
    let stream = ctx.default_stream();
    let mut mem = stream.alloc_zeros::<u8>(f.data.len()).expect("GPU memory");
    let e = CompatEngine::builder()
        .threads(4)
        .task_size(1 << 20)
        .build(CudaBackend::from_context(ctx.clone()))
        .expect("engine");
    let check = |mem: &cudarc::driver::CudaSlice<u8>| {
        let back = stream.clone_dtoh(mem).expect("copy back");
        assert!(back == f.data, "the GPU holds the file's bytes");
    };
    // A thread with no context current: none after the read.
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(current_context().is_null());
            let r = e
                .read(&src, &mut mem, 0, 0, f.data.len() as u64)
                .expect("read");
            assert_eq!(r.bytes, f.data.len() as u64);
            assert!(
                current_context().is_null(),
                "the engine left its context bound"
            );
        });
    });
    check(&mem);
    // A thread with another context of its own current: that one after the read.
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut own = std::ptr::null_mut();
            // SAFETY: a new context of device 0, made current on this thread; destroyed below.
            let r = unsafe { sys::cuCtxCreate_v4(&mut own, std::ptr::null_mut(), 0, 0) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
            assert_eq!(current_context(), own);
            e.read(&src, &mut mem, 0, 0, f.data.len() as u64)
                .expect("read");
            assert_eq!(
                current_context(),
                own,
                "the engine replaced the caller's context"
            );
            // SAFETY: the context created above, current on this thread only.
            unsafe { sys::cuCtxDestroy_v2(own) };
        });
    });
    check(&mem);
}

/// A write from device memory waits for the work queued on it, whatever stream it is on: the
/// memory (poisoned first) is filled by a device-to-device copy queued on a non-blocking stream
/// behind a kernel
/// that spins for about half a second, and the file gets the filled bytes. The same write
/// through the settled variant (which trusts its caller to have waited) gets the poison: the
/// fill was still queued, so the check can fail. Run on a GPU machine:
/// `cargo test -p gdirect --features cuda -- --ignored queued_on_any_stream`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_write_waits_for_work_queued_on_any_stream() {
    let f = TempFile::new("wsrc", 8 << 20, 21);
    let (ctx, e) = gpu_engine();
    let spin = Spin::load();
    let side = ctx.new_stream().expect("a non-blocking stream");
    // The bytes, on the GPU already: the fill is a device-to-device copy, which the host does
    // not wait for (a copy from pageable host memory would make the host wait for the stream).
    let src = side.clone_htod(&f.data).expect("the bytes on the GPU");
    side.synchronize().expect("copied");
    let write = |settled: bool| -> Vec<u8> {
        let mut mem = side.alloc_zeros::<u8>(f.data.len()).expect("GPU memory");
        side.memcpy_htod(&vec![0xa5u8; f.data.len()], &mut mem)
            .expect("poison");
        side.synchronize().expect("poisoned");
        spin.launch(&side);
        side.memcpy_dtod(&src, &mut mem).expect("the queued fill");
        let ptr = cudarc::driver::DevicePtr::device_ptr(&mem, &side).0;
        let out = std::env::temp_dir().join(format!(
            "gdirect-compat-{}-queued-{settled}",
            std::process::id()
        ));
        let sink = Sink::open(&out, true, true).expect("sink");
        // SAFETY: `mem` is a live allocation of this context, `len` bytes, alive until the
        // call returns; nothing queued after the call writes it.
        let r = unsafe {
            if settled {
                e.write_device_ptr_settled(&sink, ptr, f.data.len() as u64, 0)
            } else {
                e.write_device_ptr(&sink, ptr, f.data.len() as u64, 0)
            }
        }
        .expect("write");
        assert_eq!(r.bytes, f.data.len() as u64);
        side.synchronize().expect("the stream's work");
        let got = std::fs::read(&out).expect("read back");
        let _ = std::fs::remove_file(&out);
        got
    };
    let got = write(false);
    let right = got.iter().zip(&f.data).filter(|(a, b)| a == b).count();
    assert!(
        got == f.data,
        "{right} of {} bytes written right",
        f.data.len()
    );
    let early = write(true);
    assert!(
        early != f.data,
        "without the wait the write should have copied the poison: the fill was not still queued"
    );
}

/// CUDA device 0's primary context, current on this thread, and an engine of 4 workers on it.
#[cfg(feature = "cuda")]
fn gpu_engine() -> (
    std::sync::Arc<cudarc::driver::CudaContext>,
    CompatEngine<CudaBackend>,
) {
    let ctx = cudarc::driver::CudaContext::new(0).expect("CUDA context");
    ctx.bind_to_thread().expect("context current");
    let e = CompatEngine::builder()
        .threads(4)
        .task_size(1 << 20)
        .build(CudaBackend::from_context(ctx.clone()))
        .expect("engine");
    (ctx, e)
}

/// A kernel that spins for about half a second (2^30 GPU clocks; hand-written PTX: no compiler
/// needed), to keep what is queued behind it on a stream waiting.
#[cfg(feature = "cuda")]
struct Spin {
    module: cudarc::driver::sys::CUmodule,
    function: cudarc::driver::sys::CUfunction,
}

#[cfg(feature = "cuda")]
impl Spin {
    const PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        .visible .entry spin(.param .u64 cycles)\n{\n.reg .u64 %n, %t0, %t1, %d;\n.reg .pred %p;\n\
        ld.param.u64 %n, [cycles];\nmov.u64 %t0, %clock64;\nLOOP:\nmov.u64 %t1, %clock64;\n\
        sub.u64 %d, %t1, %t0;\nsetp.lt.u64 %p, %d, %n;\n@%p bra LOOP;\nret;\n}\n\0";

    /// Loads it into the current context.
    fn load() -> Self {
        use cudarc::driver::sys;
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a NUL-terminated PTX image; `module` receives the handle.
        let r = unsafe { sys::cuModuleLoadData(&mut module, Self::PTX.as_ptr().cast()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "loading the spin kernel");
        // SAFETY: the module just loaded; a NUL-terminated name.
        let r = unsafe { sys::cuModuleGetFunction(&mut function, module, c"spin".as_ptr()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        Self { module, function }
    }

    /// Queues it on `stream`, one thread.
    fn launch(&self, stream: &cudarc::driver::CudaStream) {
        use cudarc::driver::sys;
        let mut cycles: u64 = 1 << 30;
        let mut params = [(&raw mut cycles).cast::<std::ffi::c_void>()];
        // SAFETY: the kernel takes one u64 parameter, passed by address (copied at the launch).
        let r = unsafe {
            sys::cuLaunchKernel(
                self.function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "launching the spin kernel");
    }
}

#[cfg(feature = "cuda")]
impl Drop for Spin {
    fn drop(&mut self) {
        // SAFETY: the module loaded by `load`; the tests synchronize its launches first.
        unsafe { cudarc::driver::sys::cuModuleUnload(self.module) };
    }
}

/// A read into a cudarc slice waits for the work other streams queued on it (cudarc records
/// it in the slice's events): the slice is filled by a device-to-device copy queued on a
/// second stream behind a kernel that spins for about half a second, then read into from a
/// file, and it ends with the file's bytes, not the fill's, which came first. Run on a GPU
/// machine: `cargo test -p gdirect --features cuda -- --ignored other_streams`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_read_waits_for_work_other_streams_queued_on_its_slice() {
    let f = TempFile::new("rsrc", 8 << 20, 22);
    let (ctx, e) = gpu_engine();
    let spin = Spin::load();
    let (main, side) = (
        ctx.default_stream(),
        ctx.new_stream().expect("a second stream"),
    );
    let fill = side
        .clone_htod(&vec![0x5au8; f.data.len()])
        .expect("the fill on the GPU");
    let mut mem = main.alloc_zeros::<u8>(f.data.len()).expect("GPU memory");
    main.synchronize().expect("allocated");
    side.synchronize().expect("filled");
    spin.launch(&side);
    side.memcpy_dtod(&fill, &mut mem).expect("the queued fill");
    let src = Source::open(&f.path).expect("open");
    let r = e
        .read(&src, &mut mem, 0, 0, f.data.len() as u64)
        .expect("read");
    assert_eq!(r.bytes, f.data.len() as u64);
    ctx.synchronize().expect("every stream's work");
    let got = main.clone_dtoh(&mem).expect("copied back");
    let right = got.iter().zip(&f.data).filter(|(a, b)| a == b).count();
    assert!(
        got == f.data,
        "{right} of {} bytes are the file's",
        f.data.len()
    );
}

#[test]
fn a_fifo_and_a_character_device_are_refused_at_open_without_waiting() {
    let fifo = std::env::temp_dir().join(format!("gdirect-compat-{}-fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for (path, what) in [
        (fifo.as_path(), "a FIFO"),
        (Path::new("/dev/null"), "a character device"),
    ] {
        match Source::open(path) {
            Err(Error::NotSeekable { what: w, .. }) => assert_eq!(w, what),
            other => panic!("reading {}: {other:?}", path.display()),
        }
    }
    // A write sink may be a character device (its pwrite answers); never a FIFO.
    match Sink::open(&fifo, false, false) {
        Err(e @ Error::NotSeekable { .. }) => {
            assert_eq!(e.errno(), Some(Errno::ESPIPE));
            assert!(e.to_string().contains("a FIFO"), "{e}");
        }
        other => panic!("writing the FIFO: {other:?}"),
    }
    let _ = std::fs::remove_file(&fifo);
}

#[test]
fn a_direct_read_cut_inside_a_block_is_not_the_end_when_the_file_goes_on() {
    let f = TempFile::new("cut", 4 << 20, 12);
    let src = Source::open(&f.path).expect("open");
    for threads in [1, 4] {
        let e = engine(threads, 256 << 10, PageCache::Direct);
        let input = Faulty::new(&src);
        *input.cut.lock().expect("cut") = Some((1 << 20) + 1000);
        let mut mem = vec![0u8; 4 << 20];
        let r = faulty_read(&e, &input, &mut mem, 0, 4 << 20).expect("read");
        assert_eq!((r.bytes, r.eof), (4 << 20, false), "threads {threads}");
        assert!(mem == f.data, "every byte, threads {threads}");
        assert!(input.cut.lock().expect("cut").is_none(), "the cut happened");
        assert!(
            r.buffered_bytes > 0,
            "the rest of the cut task went through the page cache"
        );
    }
}

#[test]
fn direct_reads_refused_with_einval_go_through_the_page_cache() {
    let f = TempFile::new("einval", 3 << 20, 13);
    let src = Source::open(&f.path).expect("open");
    let e = engine(3, 256 << 10, PageCache::Direct);
    let mut input = Faulty::new(&src);
    input.einval = true;
    let mut mem = vec![0u8; 3 << 20];
    let r = faulty_read(&e, &input, &mut mem, 0, 3 << 20).expect("read");
    assert_eq!(
        (r.bytes, r.direct_bytes, r.buffered_bytes),
        (3 << 20, 0, 3 << 20)
    );
    assert!(mem == f.data);
    assert!(!input.direct_io(), "later reads skip direct I/O");
}

#[test]
fn a_file_that_grew_since_it_was_opened_is_read_to_its_new_end() {
    for mode in [
        PageCache::Direct,
        PageCache::Buffered,
        PageCache::Mapped,
        PageCache::Auto,
    ] {
        let f = TempFile::new("grow", 2 << 20, 14);
        let src = Source::open(&f.path).expect("open");
        let more: Vec<u8> = (0..(1 << 20) + 5000)
            .map(|i: u32| (i * 7 + 3) as u8)
            .collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&f.path)
            .and_then(|mut w| w.write_all(&more))
            .expect("append");
        let e = engine(4, 256 << 10, mode);
        let len = (f.data.len() + more.len()) as u64;
        let mut mem = vec![0u8; len as usize + 4096];
        let r = e.read(&src, &mut mem[..], 0, 0, len + 4096).expect("read");
        assert_eq!((r.bytes, r.eof), (len, true), "{mode:?}");
        assert!(mem[..f.data.len()] == f.data[..], "{mode:?}");
        assert!(
            mem[f.data.len()..len as usize] == more[..],
            "{mode:?}: the new bytes"
        );
    }
}

#[test]
fn a_changed_file_leaves_no_stale_mapping_in_the_cache() {
    let f = TempFile::new("stale", 3 << 20, 15);
    let e = mapped_engine(2, 1 << 30);
    let src = Source::open(&f.path).expect("open");
    check_read(&e, &f, &src, 0, 3 << 20);
    assert_eq!(e.kept_mapped(), 3 << 20);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&f.path)
        .and_then(|mut w| w.write_all(&[1u8; 4096]))
        .expect("append");
    let changed = Source::open(&f.path).expect("open again");
    let mut mem = vec![0u8; (3 << 20) + 4096];
    let r = e
        .read(&changed, &mut mem[..], 0, 0, (3 << 20) + 4096)
        .expect("read");
    assert_eq!(r.bytes, (3 << 20) + 4096);
    assert!(mem[..3 << 20] == f.data[..] && mem[3 << 20..].iter().all(|&b| b == 1));
    assert_eq!(
        e.kept_mapped(),
        (3 << 20) + 4096,
        "the old file's mapping was released"
    );
}

#[test]
fn a_vectored_read_fills_each_segment_from_its_own_file() {
    let a = TempFile::new("vec-a", 3 << 20, 21);
    let b = TempFile::new("vec-b", (1 << 20) + 777, 22);
    let (sa, sb) = (
        Source::open(&a.path).expect("open"),
        Source::open(&b.path).expect("open"),
    );
    for mode in [
        PageCache::Direct,
        PageCache::Buffered,
        PageCache::Mapped,
        PageCache::Auto,
    ] {
        for threads in [1, 3] {
            let e = engine(threads, 256 << 10, mode);
            let mut mem = vec![0xa5u8; 6 << 20];
            let segs = [
                Segment {
                    src: &sa,
                    file_offset: 4096,
                    len: 2 << 20,
                    mem_offset: 0,
                },
                Segment {
                    src: &sb,
                    file_offset: 0,
                    len: 2 << 20,
                    mem_offset: 3 << 20,
                },
                Segment {
                    src: &sa,
                    file_offset: 77,
                    len: 1000,
                    mem_offset: (2 << 20) + 5,
                },
            ];
            let (r, each) = e.read_vectored(&mut mem[..], &segs).expect("read");
            let b_len = b.data.len() as u64;
            assert_eq!(
                each,
                [
                    SegmentRead {
                        bytes: 2 << 20,
                        eof: false
                    },
                    SegmentRead {
                        bytes: b_len,
                        eof: true
                    },
                    SegmentRead {
                        bytes: 1000,
                        eof: false
                    },
                ],
                "{mode:?} threads {threads}"
            );
            assert_eq!((r.bytes, r.eof), ((2 << 20) + b_len + 1000, true));
            assert!(mem[..2 << 20] == a.data[4096..4096 + (2 << 20)], "{mode:?}");
            assert!(
                mem[(2 << 20) + 5..(2 << 20) + 1005] == a.data[77..1077],
                "{mode:?}"
            );
            assert!(
                mem[3 << 20..(3 << 20) + b.data.len()] == b.data[..],
                "{mode:?}"
            );
            // Nothing else was written: the gaps keep their poison.
            assert!(mem[(2 << 20)..(2 << 20) + 5].iter().all(|&x| x == 0xa5));
            assert!(mem[(3 << 20) + b.data.len()..].iter().all(|&x| x == 0xa5));
        }
    }
}

#[test]
fn overlapping_or_oversized_segments_are_refused_before_any_io() {
    let a = TempFile::new("vec-bad", 1 << 20, 23);
    let sa = Source::open(&a.path).expect("open");
    let e = engine(2, 256 << 10, PageCache::Buffered);
    let mut mem = vec![0u8; 1 << 20];
    let overlap = [
        Segment {
            src: &sa,
            file_offset: 0,
            len: 4096,
            mem_offset: 0,
        },
        Segment {
            src: &sa,
            file_offset: 0,
            len: 4096,
            mem_offset: 4095,
        },
    ];
    let err = e
        .read_vectored(&mut mem[..], &overlap)
        .expect_err("overlap");
    assert!(err.to_string().contains("do not overlap"), "{err}");
    let past = [Segment {
        src: &sa,
        file_offset: 0,
        len: 4096,
        mem_offset: (1 << 20) - 100,
    }];
    assert!(matches!(
        e.read_vectored(&mut mem[..], &past),
        Err(Error::OutOfMemoryRange { .. })
    ));
    assert!(mem.iter().all(|&x| x == 0), "nothing was written");
}

/// Writes of host memory, at aligned and unaligned offsets and lengths, over every thread count:
/// the file then holds exactly those bytes, and nothing around them changed.
#[test]
fn host_writes_land_exactly_and_touch_nothing_else() {
    let mut rng = Rng(77);
    let old = TempFile::new("write", 6 << 20, 21);
    let mut model = old.data.clone();
    for threads in [1, 3, 8] {
        let e = engine(threads, 256 << 10, PageCache::Auto);
        for _ in 0..6 {
            let len = match rng.below(3) {
                0 => rng.below(64 << 10) + 1,
                1 => (rng.below(8) + 1) << 20,
                _ => (rng.below(16) + 1) * 4096,
            }
            .min(5 << 20);
            let offset = match rng.below(2) {
                0 => rng.below((6 << 20) - len) / 4096 * 4096,
                _ => rng.below((6 << 20) - len),
            };
            let bytes = TempFile::new("src", len as usize, rng.next()).data.clone();
            // The source 4 KiB-aligned, so that aligned ranges can go direct.
            let mut room = vec![0u8; len as usize + 4096];
            let at = room.as_ptr().align_offset(4096);
            room[at..at + len as usize].copy_from_slice(&bytes);
            let data = &room[at..at + len as usize];
            let sink = Sink::open(&old.path, false, false).expect("open for writing");
            // SAFETY: `data` is `len` readable bytes for the call.
            let r = unsafe { e.write_host_ptr(&sink, data.as_ptr(), len, offset) }.expect("write");
            assert_eq!(r.bytes, len);
            assert_eq!(r.direct_bytes + r.buffered_bytes, len);
            if sink.takes_direct() && offset % 4096 == 0 && len % 4096 == 0 {
                assert_eq!(r.direct_bytes, len, "aligned: every piece direct");
            }
            model[offset as usize..(offset + len) as usize].copy_from_slice(data);
            let got = std::fs::read(&old.path).expect("read back");
            // The range holds the new bytes; around it, the file's old content (or an earlier
            // round's), byte for byte.
            assert!(
                got == model,
                "{len} bytes at {offset} with {threads} threads"
            );
        }
    }
}

/// The page-cache policy holds for writes: `buffered` and `mapped` write every piece through
/// the page cache, aligned or not; `auto` and `direct` write aligned pieces with `O_DIRECT`
/// where the file takes it. The bytes are the same either way.
#[test]
fn writes_follow_the_page_cache_policy() {
    let out = TempFile::new("policy", 8 << 20, 31);
    let data = TempFile::new("src", 4 << 20, 32).data.clone();
    let mut room = vec![0u8; data.len() + 4096];
    let at = room.as_ptr().align_offset(4096);
    room[at..at + data.len()].copy_from_slice(&data);
    let src = &room[at..at + data.len()];
    for mode in [
        PageCache::Auto,
        PageCache::Direct,
        PageCache::Buffered,
        PageCache::Mapped,
    ] {
        let e = engine(2, 256 << 10, mode);
        let sink = Sink::open(&out.path, false, false).expect("open for writing");
        // SAFETY: `src` is readable for the call.
        let r = unsafe { e.write_host_ptr(&sink, src.as_ptr(), src.len() as u64, 1 << 20) }
            .expect("write");
        assert_eq!(r.direct_bytes + r.buffered_bytes, src.len() as u64);
        let buffered_only = matches!(mode, PageCache::Buffered | PageCache::Mapped);
        if buffered_only {
            assert_eq!(r.direct_bytes, 0, "{mode:?}: nothing direct");
        } else if sink.takes_direct() {
            assert_eq!(
                r.direct_bytes,
                src.len() as u64,
                "{mode:?}: aligned, all direct"
            );
        }
        let got = std::fs::read(&out.path).expect("read back");
        assert!(got[1 << 20..(1 << 20) + src.len()] == *src, "{mode:?}");
    }
}

/// A write is cut at multiples of the write piece (16 MiB by default) where that is larger
/// than the task size, and of the task size where it is not: its report counts the pieces.
#[test]
fn writes_are_cut_at_the_write_piece_or_the_task_size() {
    let out = TempFile::new("pieces", 40 << 20, 23);
    let sink = Sink::open(&out.path, false, false).expect("open for writing");
    let data = TempFile::new("src", 40 << 20, 24).data.clone();
    let built = |piece: Option<u64>| {
        let b = CompatEngine::builder().threads(4).task_size(1 << 20);
        piece
            .map_or(b.clone(), |p| b.write_piece(p))
            .build_host()
            .expect("engine")
    };
    assert_eq!(built(None).settings().write_piece, 16 << 20);
    // (offset, length, write piece, pieces): the first piece ends at a multiple of the piece.
    for (offset, len, piece, want) in [
        (0u64, 40u64 << 20, None, 3u64),
        (4096, 32 << 20, None, 3),
        (0, 40 << 20, Some(4 << 20), 10),
        (0, 8 << 20, Some(4096), 8),
    ] {
        let e = built(piece);
        // SAFETY: `data` is readable for the call.
        let r = unsafe { e.write_host_ptr(&sink, data.as_ptr(), len, offset) }.expect("write");
        assert_eq!(
            (r.bytes, r.ios),
            (len, want),
            "{len} at {offset}, piece {piece:?}"
        );
        let got = std::fs::read(&out.path).expect("read back");
        assert!(got[offset as usize..(offset + len) as usize] == data[..len as usize]);
    }
}

/// `err` is a write's failure with `errno`.
fn assert_write_errno(err: &Error, want: Errno) {
    assert!(
        matches!(err, Error::FileWrite { errno, .. } if *errno == want),
        "expected a write failing with {want:?}, got {err}"
    );
}

#[test]
fn a_write_past_the_end_extends_the_file_and_a_new_file_is_made() {
    let dir = std::env::temp_dir().join(format!("gdirect-write-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("new.bin");
    let e = engine(4, 64 << 10, PageCache::Auto);
    assert!(matches!(
        Sink::open(&path, false, false),
        Err(Error::OpenFile { .. })
    ));
    let sink = Sink::open(&path, true, true).expect("create");
    let data = TempFile::new("src", (1 << 20) + 333, 5).data.clone();
    // SAFETY: `data` is readable for the call.
    let r =
        unsafe { e.write_host_ptr(&sink, data.as_ptr(), data.len() as u64, 8192) }.expect("write");
    assert_eq!(r.bytes, data.len() as u64);
    let got = std::fs::read(&path).expect("read back");
    assert_eq!(got.len(), 8192 + data.len());
    assert!(
        got[..8192].iter().all(|&b| b == 0),
        "the hole before reads as zeros"
    );
    assert_eq!(&got[8192..], &data[..]);
    // Nothing to write: nothing written, no thread busy.
    // SAFETY: no byte is read.
    let r = unsafe { e.write_host_ptr(&sink, data.as_ptr(), 0, 0) }.expect("empty write");
    assert_eq!((r.bytes, r.ios, r.threads), (0, 0, 0));
    // A range past the largest file offset is refused before any byte is written.
    // SAFETY: no byte is read (refused first).
    let err = unsafe { e.write_host_ptr(&sink, data.as_ptr(), 4096, i64::MAX as u64 - 100) }
        .expect_err("past the largest offset");
    assert_write_errno(&err, Errno::EFBIG);
    assert_eq!(
        std::fs::metadata(&path).expect("stat").len(),
        8192 + data.len() as u64
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_write_the_device_cannot_take_fails_with_the_file_and_offset() {
    let e = engine(2, 64 << 10, PageCache::Auto);
    let sink = Sink::open("/dev/full", false, false).expect("/dev/full");
    let data = vec![7u8; 200 << 10];
    // SAFETY: `data` is readable for the call.
    let err = unsafe { e.write_host_ptr(&sink, data.as_ptr(), data.len() as u64, 4096) }
        .expect_err("/dev/full takes nothing");
    match err {
        Error::FileWrite {
            path,
            errno,
            offset,
        } => {
            assert_eq!(path, Path::new("/dev/full"));
            assert_eq!(errno, Errno::ENOSPC);
            assert!(
                (4096..4096 + (200 << 10)).contains(&offset),
                "offset {offset}"
            );
        }
        other => panic!("expected FileWrite, got {other}"),
    }
    assert!(matches!(
        Sink::open("/", false, false),
        Err(Error::OpenFile {
            errno: Errno::EISDIR,
            ..
        })
    ));
}

/// `start_writeback` hands a written range to the device (sync_file_range): fine on a regular
/// file, refused with the kernel's errno where the file has no pages to write back (a
/// character device: `ESPIPE`), and before the call with `EFBIG` past the largest file offset.
#[test]
fn start_writeback_takes_a_written_range_and_refuses_what_it_cannot_take() {
    let dir = std::env::temp_dir().join(format!("gdirect-writeback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("out.bin");
    let e = engine(2, 64 << 10, PageCache::Auto);
    let sink = Sink::open(&path, true, true).expect("create");
    let data = TempFile::new("wb", (3 << 20) + 77, 9).data.clone();
    // SAFETY: `data` is readable for the call.
    unsafe { e.write_host_ptr(&sink, data.as_ptr(), data.len() as u64, 0) }.expect("write");
    sink.start_writeback(0, data.len() as u64)
        .expect("writeback of what was written");
    sink.start_writeback(1 << 20, 0)
        .expect("to the end of the file");
    assert_eq!(std::fs::read(&path).expect("read back"), data);
    let err = sink
        .start_writeback(i64::MAX as u64 + 1, 4096)
        .expect_err("past the largest offset");
    assert_write_errno(&err, Errno::EFBIG);
    let full = Sink::open("/dev/full", false, false).expect("/dev/full");
    match full.start_writeback(0, 4096) {
        Err(Error::FileWrite { errno, path, .. }) => {
            assert_eq!(errno, Errno::ESPIPE);
            assert_eq!(path, Path::new("/dev/full"));
        }
        other => panic!("expected ESPIPE, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A descriptor opened later by the source's path names another file once one was renamed
/// over it (a saver's atomic replace): `same_file` tells them apart, so a second descriptor is
/// never used for a file the caller did not open.
#[test]
fn same_file_tells_a_file_renamed_over_the_path() {
    let dir = std::env::temp_dir().join(format!("gdirect-same-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (path, other) = (dir.join("a"), dir.join("b"));
    std::fs::write(&path, b"old bytes").expect("write");
    let src = Source::open(&path).expect("open");
    let again = std::fs::File::open(&path).expect("open again");
    assert!(src.same_file(&again), "the same file, opened twice");
    std::fs::write(&other, b"new bytes").expect("write");
    std::fs::rename(&other, &path).expect("rename over");
    let replaced = std::fs::File::open(&path).expect("open the new one");
    assert!(
        !src.same_file(&replaced),
        "another file under the same path"
    );
    assert!(
        src.same_file(&again),
        "the first descriptor still names the opened file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
