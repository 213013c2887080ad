// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-io`: I/O scenarios for the selftests. Each prints `key=value` lines (and `FAIL: ...`
//! lines for failed checks) that the scripts assert, and exits 1 when a check failed.
//!
//! Usage: gdirect-io SCENARIO ARGS...
//!   random COUNT SEED DEV...      COUNT reads of random offsets and lengths from random DEVs into
//!                                 emulated GPU memory, random paths; every byte checked against
//!                                 a buffered read of the same range
//!   batch DEV                     256-entry batches of reads into GPU memory: in-flight limit,
//!                                 eventfd notification, reap, every byte checked
//!   errors DEV                    each bad transfer's errno, one `case=ERRNO` line each
//!   revoke DEV                    free GPU memory while reads into it are in flight
//!   inflight DEV COUNT            COUNT batched 1 MiB reads into GPU memory, all reaped: how many
//!                                 completed and with which errno, and how long it took
//! Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or setup error.

use std::{
    fs::File as StdFile,
    io::{Read, Seek, SeekFrom},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    process::ExitCode,
    sync::atomic::{AtomicU64, Ordering},
};

use gdirect::{egpu::Egpu, raw, Batch, Driver, Errno, Error, File, IoOptions, IoPath};

static FAILURES: AtomicU64 = AtomicU64::new(0);

fn check(what: &str, ok: bool, detail: impl FnOnce() -> String) {
    if !ok {
        FAILURES.fetch_add(1, Ordering::Relaxed);
        println!("FAIL: {what}: {}", detail());
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: gdirect-io random COUNT SEED DEV... | batch DEV | errors DEV | revoke DEV");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("random") if args.len() >= 4 => match (args[1].parse(), args[2].parse()) {
            (Ok(count), Ok(seed)) => random(count, seed, &args[3..]),
            _ => return usage(),
        },
        Some("batch") if args.len() == 2 => batch(&args[1]),
        Some("errors") if args.len() == 2 => errors(&args[1]),
        Some("revoke") if args.len() == 2 => revoke(&args[1]),
        Some("inflight") if args.len() == 3 => match args[2].parse() {
            Ok(count) => inflight(&args[1], count),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Err(e) => {
            println!("FAIL: {e}");
            ExitCode::from(2)
        }
        Ok(()) if FAILURES.load(Ordering::Relaxed) > 0 => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
    }
}

/// xorshift64*: deterministic from the seed, printed so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `len` bytes of `dev` at `offset`, read through the page cache (the reference).
fn buffered(dev: &str, offset: u64, len: usize) -> gdirect::Result<Vec<u8>> {
    let err = |e: std::io::Error| Error::OpenFile {
        path: dev.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    let mut f = StdFile::open(dev).map_err(err)?;
    f.seek(SeekFrom::Start(offset)).map_err(err)?;
    let mut out = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.read(&mut out[got..]).map_err(err)? {
            0 => break,
            n => got += n,
        }
    }
    out.truncate(got);
    Ok(out)
}

fn size_of(dev: &str) -> gdirect::Result<u64> {
    let err = |e: std::io::Error| Error::OpenFile {
        path: dev.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    StdFile::open(dev)
        .map_err(err)?
        .seek(SeekFrom::End(0))
        .map_err(err)
}

const BUF: u64 = 8 << 20;
const SECTOR: u64 = 512;

fn random(count: u64, seed: u64, devs: &[String]) -> gdirect::Result<()> {
    println!("seed={seed}");
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(BUF)?;
    let reg = driver.register(&alloc)?;
    let files: Vec<(File, u64, &String)> = devs
        .iter()
        .map(|d| Ok((File::open_direct(d)?, size_of(d)?, d)))
        .collect::<gdirect::Result<_>>()?;
    let mut rng = Rng(seed | 1);
    let (mut bytes, mut p2p, mut bounce, mut eofs) = (0, 0, 0, 0);
    let mut got = vec![0u8; BUF as usize];
    for i in 0..count {
        let (file, size, name) = &files[rng.below(files.len() as u64) as usize];
        let len = (1 + rng.below(2048)) * SECTOR; // 512 B to 1 MiB
        let buf_offset = rng.below((BUF - len) / SECTOR + 1) * SECTOR;
        // Now and then, a read that runs past the end of the device.
        let file_offset = if i % 97 == 0 {
            size - SECTOR * (1 + rng.below(8))
        } else {
            rng.below((size - len) / SECTOR + 1) * SECTOR
        };
        let bounce_it = rng.below(4) == 0;
        let t = file.read_into_with(
            &reg,
            buf_offset,
            file_offset,
            len,
            IoOptions::new().force_bounce(bounce_it),
        )?;
        let want = buffered(name, file_offset, len as usize)?;
        check(
            "bytes read equal the bytes the device has",
            t.bytes == want.len() as u64,
            || format!("read {i}: {} bytes, expected {}", t.bytes, want.len()),
        );
        check(
            "the end of the device is reported",
            t.eof == (want.len() < len as usize),
            || format!("read {i}: eof={}", t.eof),
        );
        let view = &mut got[..want.len()];
        alloc.read(buf_offset, view)?;
        if let Some(at) = (0..want.len()).find(|&k| view[k] != want[k]) {
            check("every byte equals the reference", false, || {
                format!("read {i} of {name} at {file_offset}+{len} into {buf_offset}: byte {at} differs")
            });
        }
        bytes += t.bytes;
        eofs += u64::from(t.eof);
        match t.path {
            IoPath::P2p => p2p += 1,
            _ => bounce += 1,
        }
    }
    println!(
        "reads={count} bytes={bytes} p2p={p2p} bounce={bounce} eof={eofs} bar_offset={}",
        alloc.bar_offset()
    );
    Ok(())
}

/// Waits until the eventfd is readable; returns its counter.
fn wait_eventfd(efd: &OwnedFd) -> gdirect::Result<u64> {
    let mut pfd = [nix::poll::PollFd::new(
        efd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(10_000u16)).map_err(|errno| {
        Error::Allocation {
            what: "poll".into(),
            errno,
        }
    })?;
    let mut v = [0u8; 8];
    // SAFETY: reading 8 bytes into `v` from an eventfd.
    let n = unsafe { nix::libc::read(efd.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
    Ok(if n == 8 { u64::from_ne_bytes(v) } else { 0 })
}

fn batch(dev: &str) -> gdirect::Result<()> {
    const ENTRIES: u64 = 256;
    const LEN: u64 = 64 << 10;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(ENTRIES * LEN)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    // SAFETY: eventfd(2) with valid flags; the new fd is owned by the `OwnedFd`.
    let efd = unsafe {
        OwnedFd::from_raw_fd(nix::libc::eventfd(
            0,
            nix::libc::EFD_NONBLOCK | nix::libc::EFD_CLOEXEC,
        ))
    };
    driver.set_eventfd(Some(efd.as_fd()))?;
    // Entry i reads the 64 KiB at 2*i*64 KiB of the device into slot i: offsets that a wrong
    // placement could not satisfy by accident.
    let mut b = Batch::new();
    for i in 0..ENTRIES {
        b.read(&file, &reg, i * LEN, 2 * i * LEN, LEN, 1000 + i);
    }
    let (mut submitted, mut completed, mut signals, mut max_in_flight, mut rounds) =
        (0usize, 0u64, 0u64, 0u32, 0);
    let mut first_submit = None;
    let mut seen = vec![false; ENTRIES as usize];
    while completed < ENTRIES {
        if submitted < b.len() {
            let n = driver.submit(&b, submitted)?;
            first_submit.get_or_insert(n);
            submitted += n;
        }
        let in_flight = (submitted as u64 - completed) as u32;
        max_in_flight = max_in_flight.max(in_flight);
        signals += wait_eventfd(&efd)?;
        for c in driver.reap(ENTRIES as usize, false)? {
            let i = c.user_data.wrapping_sub(1000);
            match c.result {
                Ok(t) if t.bytes == LEN && i < ENTRIES && !seen[i as usize] => {
                    seen[i as usize] = true
                }
                other => check("each completion is one entry's full read", false, || {
                    format!("user_data {}: {other:?}", c.user_data)
                }),
            }
            completed += 1;
        }
        rounds += 1;
        if rounds > 10_000 {
            check("the batch completes", false, || {
                format!("{completed} of {ENTRIES} after {rounds} rounds")
            });
            break;
        }
    }
    // Wait-mode reap with nothing in flight returns at once.
    let empty = driver.reap(8, true)?;
    println!(
        "entries={ENTRIES} first_submit={} max_in_flight={max_in_flight} completed={completed} eventfd_signals={signals} reap_wait_empty={}",
        first_submit.unwrap_or(0),
        empty.len()
    );
    let mut got = vec![0u8; LEN as usize];
    let mut bad = 0;
    for i in 0..ENTRIES {
        alloc.read(i * LEN, &mut got)?;
        if got != buffered(dev, 2 * i * LEN, LEN as usize)? {
            bad += 1;
        }
    }
    println!("mismatched_entries={bad}");
    // A batch with REAP_WAIT instead of the eventfd.
    driver.set_eventfd(None)?;
    let mut small = Batch::new();
    for i in 0..8 {
        small.read(&file, &reg, i * LEN, i * LEN, LEN, i);
    }
    let n = driver.submit(&small, 0)?;
    let mut waited = 0;
    while waited < n {
        waited += driver.reap(8, true)?.len();
    }
    println!("reap_wait_completed={waited}");
    Ok(())
}

/// One raw READ with the given fields; the errno name or `OK`.
#[allow(clippy::too_many_arguments, reason = "the fields of one request")]
fn raw_read(
    driver: &Driver,
    handle: u64,
    fd: i32,
    buf_offset: u64,
    file_offset: u64,
    len: u64,
    flags: u32,
    cmd: u32,
) -> String {
    let mut a = raw::gdirect_io_args {
        handle,
        buf_offset,
        file_offset,
        len,
        fd,
        flags,
        ..Default::default()
    };
    // SAFETY: `a` is a valid, writable argument struct for the call.
    let ret = unsafe { nix::libc::ioctl(driver.as_raw_fd(), cmd as _, &raw mut a) };
    match Errno::result(ret) {
        Ok(_) => "OK".into(),
        Err(e) => format!("{e:?}"),
    }
}

fn errors(dev: &str) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(1 << 20)?;
    let reg = driver.register(&alloc)?;
    let h = reg.handle();
    let direct = File::open_direct(dev)?;
    let fd = direct.as_fd().as_raw_fd();
    let read = raw::GDIRECT_IOC_READ;
    let out = |case: &str, r: String| println!("{case}={r}");
    out("read_ok", raw_read(&driver, h, fd, 0, 0, 4096, 0, read));
    let buffered_file = StdFile::open(dev).map_err(|_| Error::OpenFile {
        path: dev.into(),
        errno: Errno::EIO,
    })?;
    out(
        "not_o_direct",
        raw_read(&driver, h, buffered_file.as_raw_fd(), 0, 0, 4096, 0, read),
    );
    out(
        "misaligned_file_offset",
        raw_read(&driver, h, fd, 0, 100, 4096, 0, read),
    );
    out(
        "misaligned_length",
        raw_read(&driver, h, fd, 0, 0, 1000, 0, read),
    );
    out(
        "misaligned_buf_offset",
        raw_read(&driver, h, fd, 100, 0, 4096, 0, read),
    );
    out(
        "buf_out_of_range",
        raw_read(&driver, h, fd, 1 << 20, 0, 4096, 0, read),
    );
    out(
        "buf_overflow",
        raw_read(&driver, h, fd, u64::MAX - 4095, 0, 8192, 0, read),
    );
    out("zero_length", raw_read(&driver, h, fd, 0, 0, 0, 0, read));
    out(
        "unknown_flags",
        raw_read(&driver, h, fd, 0, 0, 4096, 1 << 9, read),
    );
    out(
        "write_on_read_only",
        raw_read(&driver, h, fd, 0, 0, 4096, 0, raw::GDIRECT_IOC_WRITE),
    );
    // A descriptor number that is not open.
    let closed = {
        let f = StdFile::open("/dev/null").map_err(|_| Error::OpenFile {
            path: "/dev/null".into(),
            errno: Errno::EIO,
        })?;
        f.as_raw_fd()
    };
    out(
        "closed_fd",
        raw_read(&driver, h, closed, 0, 0, 4096, 0, read),
    );
    // A file on a file system without a block device (tmpfs, which has O_DIRECT).
    std::fs::write("/tmp/gdirect-io-tmpfs", vec![0u8; 8192]).map_err(|_| Error::OpenFile {
        path: "/tmp".into(),
        errno: Errno::EIO,
    })?;
    match File::open_direct("/tmp/gdirect-io-tmpfs") {
        Ok(t) => out(
            "not_block_backed",
            raw_read(&driver, h, t.as_fd().as_raw_fd(), 0, 0, 4096, 0, read),
        ),
        Err(e) => out("not_block_backed", format!("open failed: {e}")),
    }
    out(
        "unknown_handle",
        raw_read(&driver, h + 7, fd, 0, 0, 4096, 0, read),
    );
    // A revoked registration.
    gpu.free_va(alloc.va())?;
    out("revoked", raw_read(&driver, h, fd, 0, 0, 4096, 0, read));
    // A malformed batch entry is refused with its index.
    let other = gpu.alloc(1 << 20)?;
    let reg2 = driver.register(&other)?;
    let mut b = Batch::new();
    b.read(&direct, &reg2, 0, 0, 4096, 1);
    b.push(9, &direct, &reg2, 0, 0, 4096, 2, IoOptions::new());
    match driver.submit(&b, 0) {
        Err(Error::Submit { index, errno }) => out("batch_bad_op", format!("{errno:?}@{index}")),
        other => out("batch_bad_op", format!("{other:?}")),
    }
    let drained = driver.reap(8, true)?.len();
    out("batch_good_entry_completed", drained.to_string());
    Ok(())
}

fn inflight(dev: &str, count: u64) -> gdirect::Result<()> {
    const LEN: u64 = 1 << 20;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(count * LEN)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    for i in 0..count {
        b.read(&file, &reg, i * LEN, i * LEN, LEN, i);
    }
    let start = std::time::Instant::now();
    let (mut submitted, mut reaped) = (0usize, 0usize);
    let mut errnos: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut ok = 0;
    println!("started count={count}");
    while reaped < b.len() {
        if submitted < b.len() {
            match driver.submit(&b, submitted) {
                Ok(n) => submitted += n,
                // The device went away between batches: what is left cannot be submitted.
                Err(e) => {
                    *errnos
                        .entry(format!(
                            "submit_{}",
                            e.errno().map_or("?".into(), |e| format!("{e:?}"))
                        ))
                        .or_default() += (b.len() - submitted) as u64;
                    reaped += b.len() - submitted;
                    submitted = b.len();
                }
            }
        }
        for c in driver.reap(count as usize, true)? {
            reaped += 1;
            match c.result {
                Ok(t) if t.bytes == LEN => ok += 1,
                Ok(t) => *errnos.entry(format!("short_{}", t.bytes)).or_default() += 1,
                Err(e) => *errnos.entry(format!("{e:?}")).or_default() += 1,
            }
        }
    }
    let errors: Vec<String> = errnos.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!(
        "completed_ok={ok} failed={} errors={} seconds={:.1}",
        reaped as u64 - ok,
        errors.join(","),
        start.elapsed().as_secs_f64()
    );
    drop(reg);
    let info = driver.info()?;
    println!(
        "registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    Ok(())
}

fn revoke(dev: &str) -> gdirect::Result<()> {
    const N: u64 = 128;
    const LEN: u64 = 1 << 20;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(N * LEN)?;
    let (va, bar_offset) = (alloc.va(), alloc.bar_offset());
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    for i in 0..N {
        b.read(&file, &reg, i * LEN, (i % 16) * LEN, LEN, i);
    }
    let mut submitted = 0;
    while submitted < b.len() {
        let n = driver.submit(&b, submitted)?;
        if n == 0 {
            break;
        }
        submitted += n;
    }
    // Free while the reads are in flight: the free returns once no read can touch the memory.
    let report = gpu.free_va(va)?;
    // The allocation's bytes must not change from here on.
    let snapshot = bar_bytes(&gpu, bar_offset, N * LEN)?;
    let (mut ok, mut revoked, mut other) = (0, 0, 0);
    let mut reaped = 0;
    while reaped < submitted {
        for c in driver.reap(N as usize, true)? {
            reaped += 1;
            match c.result {
                Ok(t) if t.bytes == LEN => ok += 1,
                Err(Errno::EKEYREVOKED) => revoked += 1,
                r => {
                    other += 1;
                    println!("unexpected completion {}: {r:?}", c.user_data);
                }
            }
        }
    }
    let after = bar_bytes(&gpu, bar_offset, N * LEN)?;
    println!(
        "submitted={submitted} completed_ok={ok} revoked={revoked} other={other} callbacks={}",
        report.callbacks
    );
    println!("unchanged_after_revocation={}", snapshot == after);
    let query_after = reg.query(gdirect::PciAddress {
        domain: 0,
        bus: 0,
        device: 0,
        function: 0,
    });
    println!(
        "use_after={}",
        query_after
            .err()
            .and_then(|e| e.errno())
            .map_or("OK".into(), |e| format!("{e:?}"))
    );
    drop(reg);
    std::mem::forget(alloc);
    let info = driver.info()?;
    println!(
        "registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    Ok(())
}

/// The bytes of BAR2 at `[offset, offset + len)`, read through a fresh allocation-free mapping.
fn bar_bytes(gpu: &std::sync::Arc<Egpu>, offset: u64, len: u64) -> gdirect::Result<Vec<u8>> {
    let _ = gpu;
    let path = gdirect::egpu::sysfs_device()?.join("resource2");
    let err = |e: std::io::Error| Error::OpenFile {
        path: path.clone(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    let mut f = StdFile::open(&path).map_err(err)?;
    let mut out = vec![0u8; len as usize];
    let map = MapRead::new(&mut f, offset, len)?;
    out.copy_from_slice(map.bytes());
    Ok(out)
}

/// A read-only mapping of part of a file (sysfs BAR files cannot be read with read(2)).
struct MapRead {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl MapRead {
    fn new(f: &mut StdFile, offset: u64, len: u64) -> gdirect::Result<Self> {
        let size = std::num::NonZeroUsize::new(len as usize)
            .ok_or(Error::OutOfRegistration { handle: 0 })?;
        // SAFETY: a new shared read-only mapping; nothing else in this program aliases it.
        let ptr = unsafe {
            nix::sys::mman::mmap(
                None,
                size,
                nix::sys::mman::ProtFlags::PROT_READ,
                nix::sys::mman::MapFlags::MAP_SHARED,
                f.as_fd(),
                offset as i64,
            )
        }
        .map_err(|errno| Error::Allocation {
            what: "a BAR mapping".into(),
            errno,
        })?;
        Ok(Self {
            ptr: ptr.cast(),
            len: len as usize,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MapRead {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) };
    }
}
