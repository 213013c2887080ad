// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-io`: I/O scenarios for the selftests. Each prints `key=value` lines (and `FAIL: ...`
//! lines for failed checks) that the scripts assert, and exits 1 when a check failed.
//!
//! Usage: gdirect-io SCENARIO ARGS...
//!   slot-power PORT on|off        power the PCIe slot below PORT (a sysfs PCI name) on or off
//!                                 through its Slot Control register, as a hot-plug controller
//!                                 does (QEMU 7.2 leaves its device unpowered, answering nothing)
//!   random COUNT SEED DEV...      COUNT reads of random offsets and lengths from random DEVs into
//!                                 emulated GPU memory, random paths; every byte checked against
//!                                 a buffered read of the same range
//!   batch DEV                     256-entry batches of reads into GPU memory: in-flight limit,
//!                                 eventfd notification, reap, every byte checked; an entry of
//!                                 another open file's registration refused (`foreign_*=`)
//!   errors DEV                    each bad transfer's errno, one `case=ERRNO` line each
//!   revoke DEV [COUNT [bounce]]   free GPU memory while COUNT (default 128, at most 128) 1 MiB
//!                                 reads into it are in flight (with `bounce`, every one forced
//!                                 through the bounce path: the module's copy into GPU memory
//!                                 races the free)
//!   revoke-latency DEV MIB        one synchronous MIB MiB read of DEV into GPU memory, freed
//!                                 0.3 s after it started: how long the free took, how long its
//!                                 callback ran (the emulated GPU's time), and whether the read
//!                                 was still running when the free returned
//!   free-bound DEV THREADS MIB REGS
//!                                 THREADS threads read MIB MiB of DEV again and again, each into
//!                                 its own part of REGS registrations of GPU memory (in turn),
//!                                 until the first registration's memory is freed 0.3 s after
//!                                 they start: how long the free callbacks ran, as the emulated
//!                                 GPU timed them (`callback_ms=`), and each read's outcome
//!   direct-cleared DEV            4 batched 16 MiB reads of DEV (two 8 MiB chunks each) into GPU
//!                                 memory, then O_DIRECT cleared on DEV's file (fcntl F_SETFL)
//!                                 at once: each completion whole or EBADFD (a chunk started
//!                                 after the clear), at least one EBADFD (`ebadfd=`, `whole=`)
//!   revoke-copies DEV THREADS ROUNDS
//!                                 ROUNDS times: THREADS threads of forced-bounce 1 MiB reads of
//!                                 DEV (offsets changing each time) into their own MiB of GPU
//!                                 memory, the memory freed 0.2 s in; after the threads stop,
//!                                 every byte must still be the free's poison (a CPU copy made
//!                                 after the free returned is not); `dirty_rounds=`
//!   queue-exit DEV COUNT          COUNT batched 2 MiB reads of the first 48 MiB of DEV (in turn)
//!                                 into kept GPU memory (64 slots at most), then
//!                                 exit at once with them queued (never reaped): prints `va=`,
//!                                 the memory to free later, and `submitted=`
//!   user-cap DEV CAP              max_in_flight_per_user (the module loaded with CAP): uid 1000
//!                                 queues 2 x CAP reads of DEV on one file and one on another
//!                                 while root queues CAP (see the function)
//!   bounce-cap DEV THREADS        THREADS threads of forced-bounce reads of DEV for 3 s, their
//!                                 states sampled: the most of them in I/O at once
//!                                 (`max_in_io=`; see the function)
//!   inflight DEV COUNT            COUNT batched 1 MiB reads of the first 48 MiB of DEV (in turn)
//!                                 into GPU memory, all reaped: how many
//!                                 completed and with which errno, and how long it took
//!   faults COUNT SEED DEV         COUNT random reads of DEV into GPU memory (synchronous or in
//!                                 batches, P2P or bounced) while faults may be injected: each
//!                                 either delivers every byte right or fails with an errno,
//!                                 never a partial success; prints the tally (GDIRECT_GATE=PATH:
//!                                 wait for PATH.go after setup, announced by PATH.ready)
//!   allocfail COUNT DEV           COUNT rounds of open, register (host and GPU), query, read,
//!                                 batch, unregister and close while the module's allocations
//!                                 may fail: each step succeeds (every byte right) or fails with
//!                                 an errno; prints the tally per step
//!   revclose COUNT DEV            COUNT rounds: 32 batched reads into registered GPU memory in
//!                                 flight, then the memory freed (revocation) and the device file
//!                                 closed at once, from two threads
//!   module-range NAME             the start and end of the module's code, in hex (root only)
//!   limits DEV HOST_BYTES         a 32-entry batch against max_in_flight (first_submit), 16
//!                                 threads of bounced 1 MiB reads against the bounce pool (every
//!                                 byte checked), and registrations of HOST_BYTES of host memory
//!                                 and 1 MiB of GPU memory against RLIMIT_MEMLOCK
//!   stress OPS SEED THREADS DEV READ_START READ_LEN RW_START RW_LEN
//!                                 THREADS threads, OPS operations each, on DEV: reads of the
//!                                 read window (which nobody writes) and reads and writes of
//!                                 each thread's slice of the RW window, between DEV and GPU
//!                                 memory, P2P or bounced at random, with the GPU memory freed
//!                                 (revoked) and registered again underneath; every byte of
//!                                 every read compared with a snapshot or the thread's shadow
//!   readmem KIND DEV OFFSET LEN   one synchronous read of LEN bytes of DEV at OFFSET into memory
//!                                 of KIND (host, egpu, p2pmem:BDF), poisoned first; prints the
//!                                 transfer and the sha256 of the bytes in memory (for a host
//!                                 check of memory the host cannot see); for host memory,
//!                                 first `pages=`, `dirty_before=` and `dirty_after=`: its
//!                                 pages that the kernel holds dirty before the registration
//!                                 and after it ends (/proc/kpageflags)
//!   batchwrite DEV OFFSET COUNT SEED
//!                                 COUNT 1 MiB writes from emulated GPU memory filled with the
//!                                 pattern of SEED to DEV at OFFSET, in one batch (every fourth
//!                                 forced through the bounce path); each completion must be
//!                                 whole; prints the sha256 of the bytes written and of the
//!                                 bytes read back from DEV
//!   keptwrite DEV OFFSET SEED [sync]
//!                                 the compat engine reads 1 MiB of DEV at OFFSET into host
//!                                 memory through the page cache's mapping, its registrations
//!                                 kept, twice; then one batched (or, with `sync`, synchronous)
//!                                 1 MiB write of the pattern of SEED from emulated GPU memory
//!                                 through the module, and a third read; prints the bytes each
//!                                 read registered (`registered=` A,B,C: B is 0, kept; C is not,
//!                                 the write retired them) and whether the third read is the
//!                                 pattern, and the library's write stamp of DEV before
//!                                 and after (`writes_counted=` X,Y)
//!   credwrite sync|batch|all|batch-append PATH OFFSET LEN
//!                                 one write of LEN bytes from registered host memory to PATH
//!                                 at OFFSET, synchronous or as a batch, as the caller (all:
//!                                 `write_all_from`, which writes again after a short write,
//!                                 and prints `stopped_at=` where a write then failed;
//!                                 batch-append: as batch, the file open with O_APPEND); prints
//!                                 `result=BYTES` (read back and compared) or `errno=NAME`,
//!                                 and `sigxfsz=N`, the SIGXFSZ signals it got
//!   xfsz-exec exec|stay SLOW FILE LIMIT
//!                                 with SIGXFSZ blocked: a 1 MiB batched read of the block
//!                                 device SLOW (its requests take seconds) holds the caller's
//!                                 share of in-flight bytes (the module loaded with
//!                                 max_in_flight_bytes_per_user=1048576) while two batched
//!                                 64 KiB writes to FILE queue behind it, one across LIMIT
//!                                 (RLIMIT_FSIZE, in bytes: cut to 16 KiB) and one at it
//!                                 (EFBIG); prints `pending_before=` 0.3 s later, then `exec`
//!                                 (or `stay`) waits for the three completions in the program
//!                                 it `exec`s (or in itself), and prints `completions=`,
//!                                 `sigxfsz_pending=` (a SIGXFSZ sent at any time stays
//!                                 pending, through the exec too), the file's size and
//!                                 whether its last 16 KiB are the bytes written
//!   reflink SRC DST               DST (created) made a clone of SRC sharing its extents
//!                                 (FICLONE, as `cp --reflink=always`, which busybox lacks)
//!   fiemap FILE                   the file's extents as its file system maps them (FIEMAP,
//!                                 synced first): one `logical physical length flags` line each,
//!                                 in bytes, so that the host can find the data in a drive image
//! Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or setup error.

mod debugfs;

use std::{
    fs::File as StdFile,
    io::{Read, Seek, SeekFrom},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    process::ExitCode,
    sync::atomic::{AtomicU64, Ordering},
};

use gdirect::{raw, Batch, Driver, Errno, Error, File, IoOptions, IoPath};
use gdirect_internals::egpu::{Egpu, EgpuAllocation};

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
        Some("revoke") if args.len() == 2 => revoke(&args[1], 128, false),
        Some("revoke") if args.len() == 3 || args.len() == 4 => {
            match (args[2].parse(), args.get(3).map(String::as_str)) {
                (Ok(count @ 1..=128), None) => revoke(&args[1], count, false),
                (Ok(count @ 1..=128), Some("bounce")) => revoke(&args[1], count, true),
                _ => return usage(),
            }
        }
        Some("revoke-latency") if args.len() == 3 => match args[2].parse() {
            Ok(mib @ 1..=256) => revoke_latency(&args[1], mib),
            _ => return usage(),
        },
        Some("free-bound") if args.len() == 5 => {
            match (args[2].parse(), args[3].parse(), args[4].parse()) {
                (Ok(threads @ 1..=64), Ok(mib @ 1..=16), Ok(regs @ 1..=4)) => {
                    free_bound(&args[1], threads, mib, regs)
                }
                _ => return usage(),
            }
        }
        Some("direct-cleared") if args.len() == 2 => direct_cleared(&args[1]),
        Some("revoke-copies") if args.len() == 4 => match (args[2].parse(), args[3].parse()) {
            (Ok(threads @ 1..=16), Ok(rounds @ 1..=100)) => {
                revoke_copies(&args[1], threads, rounds)
            }
            _ => return usage(),
        },
        Some("queue-exit") if args.len() == 3 => match args[2].parse() {
            Ok(count @ 1..=128) => queue_exit(&args[1], count),
            _ => return usage(),
        },
        Some("user-cap") if args.len() == 3 => match args[2].parse() {
            Ok(cap @ 1..=16) => user_cap(&args[1], cap),
            _ => return usage(),
        },
        Some("bounce-cap") if args.len() == 3 => match args[2].parse() {
            Ok(threads @ 2..=16) => bounce_cap(&args[1], threads),
            _ => return usage(),
        },
        Some("inflight") if args.len() == 3 => match args[2].parse() {
            Ok(count) => inflight(&args[1], count),
            _ => return usage(),
        },
        Some("faults") if args.len() == 4 => match (args[1].parse(), args[2].parse()) {
            (Ok(count), Ok(seed)) => faults(count, seed, &args[3]),
            _ => return usage(),
        },
        Some("revclose") if args.len() == 3 => match args[1].parse() {
            Ok(count) => revclose(count, &args[2]),
            _ => return usage(),
        },
        Some("allocfail") if args.len() == 3 => match args[1].parse() {
            Ok(count) => allocfail(count, &args[2]),
            _ => return usage(),
        },
        Some("readmem") if args.len() == 5 => match (args[3].parse(), args[4].parse()) {
            (Ok(offset), Ok(len)) => readmem(&args[1], &args[2], offset, len),
            _ => return usage(),
        },
        Some("batchwrite") if args.len() == 5 => {
            match (args[2].parse(), args[3].parse(), args[4].parse()) {
                (Ok(offset), Ok(count @ 1..=256), Ok(seed)) => {
                    batchwrite(&args[1], offset, count, seed)
                }
                _ => return usage(),
            }
        }
        Some("keptwrite") if args.len() == 4 || args.len() == 5 => {
            match (
                args[2].parse(),
                args[3].parse(),
                args.get(4).map(String::as_str),
            ) {
                (Ok(offset), Ok(seed), None | Some("sync")) => {
                    keptwrite(&args[1], offset, seed, args.len() == 5)
                }
                _ => return usage(),
            }
        }
        Some("credwrite") if args.len() == 5 => {
            match (args[1].as_str(), args[3].parse(), args[4].parse()) {
                (
                    mode @ ("sync" | "batch" | "all" | "batch-append"),
                    Ok(offset),
                    Ok(len @ 1..=16777216),
                ) => credwrite(mode, &args[2], offset, len),
                _ => return usage(),
            }
        }
        Some("xfsz-exec") if args.len() == 5 => match (args[1].as_str(), args[4].parse()) {
            (mode @ ("exec" | "stay"), Ok(limit @ 65536..)) => {
                xfsz_exec(mode == "exec", &args[2], &args[3], limit)
            }
            _ => return usage(),
        },
        Some(XFSZ_AFTER_EXEC) if args.len() == 4 => match (args[1].parse(), args[3].parse()) {
            (Ok(efd @ 0..), Ok(limit @ 65536..)) => {
                // SAFETY: the fd number the program before the exec passed: the eventfd it
                // left open for this one, owned by nothing else here.
                let efd = unsafe { OwnedFd::from_raw_fd(efd) };
                xfsz_report(&efd, &args[2], limit)
            }
            _ => return usage(),
        },
        Some("fiemap") if args.len() == 2 => fiemap(&args[1]),
        Some("reflink") if args.len() == 3 => reflink(&args[1], &args[2]),
        Some("slot-power") if args.len() == 3 => match args[2].as_str() {
            "on" => slot_power(&args[1], true),
            "off" => slot_power(&args[1], false),
            _ => return usage(),
        },
        Some("direct-cache") if args.len() == 3 => direct_cache(&args[1], &args[2]),
        Some("module-range") if args.len() == 2 => {
            return match module_text_range(&args[1]) {
                Some((start, end)) => {
                    println!("{start:#x} {end:#x}");
                    ExitCode::SUCCESS
                }
                None => ExitCode::FAILURE,
            };
        }
        Some("limits") if args.len() == 3 => match args[2].parse() {
            Ok(host) => limits(&args[1], host),
            _ => return usage(),
        },
        Some("stress") if args.len() == 9 => {
            let n: Vec<Option<u64>> = args[1..].iter().map(|a| a.parse().ok()).collect();
            match (n[0], n[1], n[2], n[4], n[5], n[6], n[7]) {
                (Some(ops), Some(seed), Some(threads), Some(rs), Some(rl), Some(ws), Some(wl)) => {
                    stress(ops, seed, threads, &args[4], rs..rs + rl, ws..ws + wl)
                }
                _ => return usage(),
            }
        }
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

/// `struct fiemap` (linux/fiemap.h) with room for `N` extents.
#[repr(C)]
struct Fiemap<const N: usize> {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; N],
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);
const _: () = assert!(std::mem::size_of::<Fiemap<0>>() == 32);
nix::ioctl_readwrite_bad!(fs_ioc_fiemap, 0xC020_660B, Fiemap<64>);

/// Powers the PCIe slot of downstream or root port `port` (a sysfs name) off or on through its
/// Slot Control register (power controller and power indicator), as a hot-plug controller would:
/// QEMU 7.2 leaves the device of a slot whose power is off unpowered (its config space reads all
/// ones, its BAR decodes nothing) and powers it again when the slot's power comes back. Prints
/// the register before and after, and the slot's presence bit after.
fn slot_power(port: &str, on: bool) -> gdirect::Result<()> {
    use std::os::unix::fs::FileExt;
    let path = format!("/sys/bus/pci/devices/{port}/config");
    let io_error = |path: &str, e: std::io::Error| Error::OpenFile {
        path: path.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    let config = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    let read16 = |at: u64| -> gdirect::Result<u16> {
        let mut b = [0u8; 2];
        config
            .read_exact_at(&mut b, at)
            .map_err(|e| io_error(&path, e))?;
        Ok(u16::from_le_bytes(b))
    };
    // The PCI Express capability (ID 0x10), from the capability list at 0x34.
    let mut at = u64::from(read16(0x34)? & 0xfc);
    let mut cap = None;
    for _ in 0..48 {
        if at == 0 {
            break;
        }
        let header = read16(at)?;
        if header & 0xff == 0x10 {
            cap = Some(at);
            break;
        }
        at = u64::from((header >> 8) & 0xfc);
    }
    let Some(cap) = cap else {
        println!("FAIL: {port} has no PCI Express capability");
        return Ok(());
    };
    // Slot Control at +0x18: Power Indicator Control bits 9:8 (01 on, 11 off), Power Controller
    // Control bit 10 (1: off). Slot Status at +0x1a: Presence Detect State bit 6.
    let before = read16(cap + 0x18)?;
    let after = (before & !0x0700) | if on { 0x0100 } else { 0x0700 };
    config
        .write_all_at(&after.to_le_bytes(), cap + 0x18)
        .map_err(|e| io_error(&path, e))?;
    let now = read16(cap + 0x18)?;
    let present = read16(cap + 0x1a)? & 0x40 != 0;
    println!("slot_control={before:#06x} written={after:#06x} now={now:#06x} present={present}");
    Ok(())
}

/// `reflink SRC DST`: DST, created, made a clone of SRC (`FICLONE`): its extents shared.
fn reflink(src: &str, dst: &str) -> gdirect::Result<()> {
    /// `FICLONE`, `_IOW(0x94, 9, int)` (`linux/fs.h`).
    const FICLONE: u64 = 0x4004_9409;
    let open_err = |path: &str| {
        let path = path.to_owned();
        move |e: std::io::Error| Error::OpenFile {
            path: path.clone().into(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
        }
    };
    let from = StdFile::open(src).map_err(open_err(src))?;
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(open_err(dst))?;
    // SAFETY: FICLONE takes the source descriptor by value; both descriptors are open.
    let r = unsafe { nix::libc::ioctl(to.as_raw_fd(), FICLONE as _, from.as_raw_fd()) };
    if r < 0 {
        return Err(Error::OpenFile {
            path: dst.into(),
            errno: Errno::last(),
        });
    }
    Ok(())
}

fn fiemap(path: &str) -> gdirect::Result<()> {
    const FIEMAP_FLAG_SYNC: u32 = 1;
    let f = StdFile::open(path).map_err(|e| Error::OpenFile {
        path: path.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    })?;
    let mut map = Fiemap::<64> {
        start: 0,
        length: u64::MAX,
        flags: FIEMAP_FLAG_SYNC,
        mapped_extents: 0,
        extent_count: 64,
        reserved: 0,
        extents: [FiemapExtent::default(); 64],
    };
    // SAFETY: `map` is a `struct fiemap` with room for the 64 extents its `extent_count` says,
    // valid for the whole call; the fd is open.
    unsafe { fs_ioc_fiemap(f.as_raw_fd(), &mut map) }.map_err(|errno| Error::Io {
        ioctl: "FS_IOC_FIEMAP",
        path: path.into(),
        errno,
        driver: "".into(),
    })?;
    for e in &map.extents[..(map.mapped_extents as usize).min(64)] {
        println!("{} {} {} {:#x}", e.logical, e.physical, e.length, e.flags);
    }
    Ok(())
}

/// `len` bytes of the xorshift64* stream of `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn print_transfer(t: &gdirect::Transfer) {
    println!(
        "bytes={} path={} reason={} bounce_bytes={}",
        t.bytes,
        t.path.name(),
        t.reason.name(),
        t.bounce_bytes
    );
}

fn readmem(kind: &str, dev: &str, offset: u64, len: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let file = File::open_direct(dev)?;
    let n = len as usize;
    let poison = pattern(0xdead_beef, n);
    let mut got = vec![0u8; n];
    match kind.split_once(':') {
        None if kind == "host" => {
            let mut mem = gdirect::HostBuffer::new(n)?;
            mem.write(0, &poison);
            // The CPU's writes dirty the page-table entries, not the pages: only an unpin
            // that marks them dirty tells the kernel that a device wrote them, and a page left
            // clean (a file's, shmem's, one freed with MADV_FREE) may be dropped by reclaim
            // with the device's bytes.
            let before = dirty_pages(&mem)?;
            let reg = driver.register(&mem)?;
            print_transfer(&file.read_into(&reg, 0, offset, len)?);
            drop(reg);
            let after = dirty_pages(&mem)?;
            println!(
                "pages={} dirty_before={before} dirty_after={after}",
                n.div_ceil(4096)
            );
            mem.read(0, &mut got);
        }
        None if kind == "egpu" => {
            let mut mem = Egpu::open()?.alloc(len.div_ceil(1 << 16) << 16)?;
            mem.write(0, &poison)?;
            let reg = driver.register(&mem)?;
            print_transfer(&file.read_into(&reg, 0, offset, len)?);
            drop(reg);
            mem.read(0, &mut got)?;
        }
        Some(("p2pmem", bdf)) => {
            let dev = bdf.parse().map_err(|_| Error::Allocation {
                what: format!("P2P memory of '{bdf}'"),
                errno: Errno::EINVAL,
            })?;
            let mut mem = gdirect::P2pMem::allocate(dev, n)?;
            mem.write(0, &poison);
            let reg = driver.register(&mem)?;
            print_transfer(&file.read_into(&reg, 0, offset, len)?);
            drop(reg);
            mem.read(0, &mut got);
        }
        _ => {
            return Err(Error::Allocation {
                what: format!("memory of kind '{kind}'"),
                errno: Errno::EINVAL,
            })
        }
    }
    println!("sha256={}", sha256_hex(&got));
    Ok(())
}

/// How many of `mem`'s pages the kernel holds dirty (PG_dirty): each page's frame from
/// `/proc/self/pagemap`, its flags from `/proc/kpageflags` (both need CAP_SYS_ADMIN).
fn dirty_pages(mem: &gdirect::HostBuffer) -> gdirect::Result<usize> {
    use gdirect::DeviceMemory;
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    const PRESENT: u64 = 1 << 63;
    const PFN: u64 = (1 << 55) - 1;
    const KPF_DIRTY: u64 = 1 << 4;
    let fail = |what: &str, errno: Errno| Error::Allocation {
        what: what.into(),
        errno,
    };
    let open = |path: &str| {
        StdFile::open(path).map_err(|e| fail(path, Errno::from_raw(e.raw_os_error().unwrap_or(5))))
    };
    let read_u64 = |f: &StdFile, at: u64, what: &str| -> gdirect::Result<u64> {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, at)
            .map_err(|e| fail(what, Errno::from_raw(e.raw_os_error().unwrap_or(5))))?;
        Ok(u64::from_le_bytes(b))
    };
    let (pagemap, flags) = (open("/proc/self/pagemap")?, open("/proc/kpageflags")?);
    let start = mem.device_address() / PAGE;
    let mut dirty = 0;
    for page in start..start + mem.len().div_ceil(PAGE) {
        let entry = read_u64(&pagemap, page * 8, "/proc/self/pagemap")?;
        if entry & PRESENT == 0 || entry & PFN == 0 {
            // Not present, or its frame hidden (no CAP_SYS_ADMIN): no evidence either way.
            return Err(fail("a page frame from /proc/self/pagemap", Errno::ENODATA));
        }
        if read_u64(&flags, (entry & PFN) * 8, "/proc/kpageflags")? & KPF_DIRTY != 0 {
            dirty += 1;
        }
    }
    Ok(dirty)
}

/// The library's `DirectCache` (what the Python package moves CUDA memory through) on emulated
/// GPU memory: reads into parts of one allocation through one registration (the emulator
/// counts the page tables it handed out), a request outside the allocation's registrable part
/// left to the compat engine, the allocation freed and another made at its address (the
/// cache's registration revoked: registered again, the bytes land in the new pages), and
/// nothing held once the cache lets go. Every destination poisoned first; every read compared
/// with the device's bytes, from `copy`: its first 13 MiB, copied before (so that QEMU's trace
/// of the drive's DMA shows the module's reads alone).
fn direct_cache(dev: &str, copy: &str) -> gdirect::Result<()> {
    use std::os::unix::fs::FileExt;
    const LEN: u64 = 8 << 20;
    let file = File::open_direct(dev)?;
    let reference = StdFile::open(copy).map_err(|e| Error::OpenFile {
        path: copy.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    })?;
    let want = |offset: u64, len: u64| -> gdirect::Result<Vec<u8>> {
        let mut b = vec![0u8; len as usize];
        reference
            .read_exact_at(&mut b, offset)
            .map_err(|e| Error::FileIo {
                path: copy.into(),
                offset,
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
            })?;
        Ok(b)
    };
    let gpu = Egpu::open()?;
    let base = gpu.info()?;
    let cache = match gdirect::DirectCache::open(None, gdirect::Provider::Nvidia) {
        Ok(c) => c,
        Err(why) => {
            return Err(Error::Worker {
                what: Box::leak(format!("no cache: {}", why.cause()).into_boxed_str()),
            })
        }
    };
    // (offset in the allocation, file offset, length)
    let requests = [
        (0, 0, 1 << 20),
        (3 << 16, 5 << 20, 4096),
        ((1 << 20) + 4096, 9 << 20, 3 << 20),
        (LEN - (1 << 16), 1 << 20, 1 << 16),
    ];
    let read_all = |mem: &mut EgpuAllocation, round: &str| -> gdirect::Result<usize> {
        let mut module = 0;
        for &(at, off, len) in &requests {
            mem.write(at, &pattern(0xdead_beef ^ at, len as usize))?;
            // SAFETY: the allocation is the emulated GPU's, freed only through it (its free
            // runs the module's callback); the request lies inside it; nothing else uses it.
            let r = unsafe {
                cache.read(
                    &file,
                    mem.va()..mem.va() + LEN,
                    mem.va() + at,
                    len,
                    off,
                    || Ok(()),
                )
            }?;
            match r {
                Ok(t) => {
                    module += 1;
                    check(
                        &format!("{round}: {len} bytes at {at}"),
                        t.bytes == len,
                        || format!("{} bytes", t.bytes),
                    );
                }
                Err(why) => println!("{round}: {len} bytes at {at}: compat ({})", why.name()),
            }
            let mut got = vec![0u8; len as usize];
            mem.read(at, &mut got)?;
            check(
                &format!("{round}: the bytes at {at}"),
                got == want(off, len)?,
                || "differ from the device's".into(),
            );
        }
        Ok(module)
    };
    let mut mem = gpu.alloc(LEN)?;
    let va = mem.va();
    let module = read_all(&mut mem, "first")?;
    let held = gpu.info()?;
    println!(
        "first: module={module} of {} registrations={} page_tables={}",
        requests.len(),
        cache.registrations(),
        held.mappings - base.mappings
    );
    // Past the end of the allocation: not the module's, not a byte moved.
    // SAFETY: as above; the range is refused before any I/O.
    let past = unsafe { cache.read(&file, va..va + LEN, va + LEN - 4096, 8192, 0, || Ok(())) }?;
    println!(
        "past_end={}",
        past.map_or_else(
            |why| why.name().to_string(),
            |t| format!("module {}", t.bytes)
        )
    );
    let freed = mem.free()?;
    let mut again = gpu.alloc(LEN)?;
    println!(
        "freed: callbacks={} same_address={}",
        freed.callbacks,
        again.va() == va
    );
    let module = read_all(&mut again, "again")?;
    println!(
        "again: module={module} of {} registrations={} page_tables={}",
        requests.len(),
        cache.registrations(),
        gpu.info()?.mappings - base.mappings
    );
    cache.clear();
    println!(
        "cleared: registrations={} page_tables={}",
        cache.registrations(),
        gpu.info()?.mappings - base.mappings
    );
    drop(again);
    Ok(())
}

fn batchwrite(dev: &str, offset: u64, count: u64, seed: u64) -> gdirect::Result<()> {
    const LEN: u64 = 1 << 20;
    let driver = Driver::open()?;
    let mut mem = Egpu::open()?.alloc(count * LEN)?;
    let data = pattern(seed, (count * LEN) as usize);
    mem.write(0, &data)?;
    let reg = driver.register(&mem)?;
    let file = File::open_direct_rw(dev)?;
    let mut b = Batch::new();
    for i in 0..count {
        let options = IoOptions::new().force_bounce(i % 4 == 3);
        b.write_with(&file, &reg, i * LEN, offset + i * LEN, LEN, i, options);
    }
    let (mut submitted, mut reaped) = (0, 0);
    let (mut p2p, mut bounce, mut bounce_bytes) = (0u64, 0u64, 0u64);
    while reaped < b.len() {
        if submitted < b.len() {
            submitted += driver.submit(&b, submitted)?;
        }
        for c in driver.reap(b.len(), true)? {
            reaped += 1;
            match c.result {
                Ok(t) => {
                    check("a whole write", t.bytes == LEN, || {
                        format!("write {} moved {} bytes", c.user_data, t.bytes)
                    });
                    match t.path {
                        IoPath::P2p => p2p += 1,
                        _ => bounce += 1,
                    }
                    bounce_bytes += t.bounce_bytes;
                }
                Err(e) => check("every write completes", false, || {
                    format!("write {} failed: {e:?}", c.user_data)
                }),
            }
        }
    }
    drop(reg);
    let back = buffered(dev, offset, (count * LEN) as usize)?;
    check("the device holds what was written", back == data, || {
        "the bytes read back differ".into()
    });
    println!("writes={reaped} p2p={p2p} bounce={bounce} bounce_bytes={bounce_bytes}");
    println!("sha256_written={}", sha256_hex(&data));
    println!("sha256_read_back={}", sha256_hex(&back));
    Ok(())
}

fn keptwrite(dev: &str, offset: u64, seed: u64, sync: bool) -> gdirect::Result<()> {
    use gdirect::compat::{CompatEngine, PageCache, Source};
    const LEN: u64 = 1 << 20;
    let engine = CompatEngine::builder()
        .threads(2)
        .page_cache(PageCache::Mapped)
        .keep_mapped(1 << 30)
        .build_host()?;
    let src = Source::open(dev)?;
    let mut mem = vec![0u8; LEN as usize];
    let mut registered = Vec::new();
    for _ in 0..2 {
        registered.push(
            engine
                .read(&src, &mut mem, 0, offset, LEN)?
                .registered_bytes,
        );
    }
    let driver = Driver::open()?;
    let mut gpu = Egpu::open()?.alloc(LEN)?;
    let data = pattern(seed, LEN as usize);
    gpu.write(0, &data)?;
    let reg = driver.register(&gpu)?;
    let file = File::open_direct_rw(dev)?;
    let counted = gdirect::compat::writes_counted(&file);
    if sync {
        file.write_all_from(&reg, 0, offset, LEN)?;
    } else {
        let mut b = Batch::new();
        b.write(&file, &reg, 0, offset, LEN, 7);
        let mut submitted = 0;
        while submitted == 0 {
            submitted = driver.submit(&b, 0)?;
        }
        let done = driver.reap(1, true)?;
        check(
            "the batched write completes whole",
            matches!(done.as_slice(), [c] if c.result.is_ok_and(|t| t.bytes == LEN)),
            || format!("{done:?}"),
        );
    }
    drop(reg);
    mem.fill(0);
    registered.push(
        engine
            .read(&src, &mut mem, 0, offset, LEN)?
            .registered_bytes,
    );
    let same = mem == data;
    check(
        "the read after the write is the bytes written",
        same,
        || "the bytes differ".into(),
    );
    println!(
        "registered={}",
        registered
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    println!("read_after_write_equal={}", u8::from(same));
    // The library's write stamp of the device: the write raised it, whatever the node's
    // times did (they move here: the block layer updates them).
    println!(
        "writes_counted={counted},{}",
        gdirect::compat::writes_counted(&file)
    );
    Ok(())
}

/// SIGXFSZ signals received (see `credwrite`).
static SIGXFSZ_SEEN: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigxfsz(_: nix::libc::c_int) {
    SIGXFSZ_SEEN.fetch_add(1, Ordering::Relaxed);
}

/// `credwrite sync|batch PATH OFFSET LEN`: writes `LEN` bytes of a pattern from registered host
/// memory to `PATH` (opened `O_DIRECT`, not created) at `OFFSET`, by the synchronous `WRITE` or
/// as a one-entry batch, as whoever runs it (batch_creds.sh compares the two). Prints
/// `result=BYTES` or `errno=NAME`, and `sigxfsz=` the SIGXFSZ signals it got; the bytes a
/// write reports are read back and compared.
fn credwrite(mode: &str, path: &str, offset: u64, len: u64) -> gdirect::Result<()> {
    // SIGXFSZ counted, not ignored or fatal: the write past RLIMIT_FSIZE must send it to the
    // submitter (`sigxfsz=` after the result).
    let action = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(on_sigxfsz),
        nix::sys::signal::SaFlags::empty(),
        nix::sys::signal::SigSet::empty(),
    );
    // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
    let installed =
        unsafe { nix::sys::signal::sigaction(nix::sys::signal::Signal::SIGXFSZ, &action) };
    check("a SIGXFSZ handler", installed.is_ok(), || {
        format!("{installed:?}")
    });
    let driver = Driver::open()?;
    let mut mem = gdirect::HostBuffer::new(len as usize)?;
    let data = pattern(offset ^ len, len as usize);
    mem.write(0, &data);
    let reg = driver.register(&mem)?;
    let file = if mode == "batch-append" {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(nix::libc::O_DIRECT)
            .open(path)
            .map(|f| File::from(OwnedFd::from(f)))
            .map_err(|e| Error::OpenFile {
                path: path.into(),
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
            })?
    } else {
        File::open_direct_rw(path)?
    };
    let result = if mode.starts_with("batch") {
        let mut b = Batch::new();
        b.write(&file, &reg, 0, offset, len, 7);
        let queued = driver.submit(&b, 0)?;
        check("the batch is queued", queued == 1, || {
            format!("{queued} queued")
        });
        // The write's SIGXFSZ may interrupt the wait (the handler has no SA_RESTART): wait
        // again, as a program that handles signals does.
        let done = loop {
            match driver.reap(1, true) {
                Err(e) if e.errno() == Some(Errno::EINTR) => continue,
                r => break r?,
            }
        };
        match done.into_iter().next() {
            Some(c) => c.result,
            None => {
                check("the write completes", false, || "nothing reaped".into());
                return Ok(());
            }
        }
    } else {
        let written = if mode == "all" {
            file.write_all_from(&reg, 0, offset, len).inspect_err(|e| {
                if let Error::FileWrite { offset, .. } = e {
                    println!("stopped_at={offset}");
                }
            })
        } else {
            file.write_from(&reg, 0, offset, len)
        };
        match written {
            Ok(t) => Ok(t),
            Err(e) => Err(e.errno().ok_or(e)?),
        }
    };
    drop(reg);
    match result {
        Ok(t) => {
            let back = buffered(path, offset, t.bytes as usize)?;
            check(
                "the file holds what the write reported",
                back == data[..back.len()] && back.len() as u64 == t.bytes,
                || {
                    format!(
                        "{} bytes reported, {} read back, equal: {}",
                        t.bytes,
                        back.len(),
                        back == data[..back.len()]
                    )
                },
            );
            println!(
                "result={} sigxfsz={}",
                t.bytes,
                SIGXFSZ_SEEN.load(Ordering::Relaxed)
            );
        }
        Err(errno) => println!(
            "errno={errno:?} sigxfsz={}",
            SIGXFSZ_SEEN.load(Ordering::Relaxed)
        ),
    }
    Ok(())
}

/// The scenario `xfsz-exec` continues in the program it `exec`s with this name, the eventfd's
/// number, the file and the limit.
const XFSZ_AFTER_EXEC: &str = "xfsz-after-exec";

/// `xfsz-exec`: see the usage. The writes' SIGXFSZ must reach the program that submitted them
/// (`stay`) and never the one it `exec`d since (`exec`): with the signal blocked, one sent
/// before the exec would still be pending after it, so only a check made after the exec, and
/// skipped for the new program, passes.
fn xfsz_exec(exec: bool, slow: &str, path: &str, limit: u64) -> gdirect::Result<()> {
    const HOLD: u64 = 1 << 20;
    const LEN: u64 = 64 << 10;
    let mut xfsz = nix::sys::signal::SigSet::empty();
    xfsz.add(nix::sys::signal::Signal::SIGXFSZ);
    let blocked = xfsz.thread_block();
    check("SIGXFSZ blocked", blocked.is_ok(), || {
        format!("{blocked:?}")
    });
    let driver = Driver::open()?;
    let hold_mem = gdirect::HostBuffer::new(HOLD as usize)?;
    let mut mem = gdirect::HostBuffer::new(2 * LEN as usize)?;
    mem.write(0, &pattern(limit, 2 * LEN as usize));
    let hold_reg = driver.register(&hold_mem)?;
    let reg = driver.register(&mem)?;
    let slow_file = File::open_direct(slow)?;
    let file = File::open_direct_rw(path)?;
    // Blocking and inherited by the exec'd program: it counts the completions there.
    // SAFETY: eventfd(2) with valid flags; the new fd is owned by the `OwnedFd`.
    let efd = unsafe { OwnedFd::from_raw_fd(nix::libc::eventfd(0, 0)) };
    driver.set_eventfd(Some(efd.as_fd()))?;
    let mut hold = Batch::new();
    hold.read(&slow_file, &hold_reg, 0, 0, HOLD, 1);
    let queued = driver.submit(&hold, 0)?;
    // The read in the block layer's hands (its inflight count, not the module's word) before
    // the writes queue: they wait for the room it holds.
    let in_disk = wait_disk_reads(slow);
    check(
        "the holding read is in flight",
        queued == 1 && in_disk > 0,
        || format!("{queued} queued, {slow}: none in flight"),
    );
    let mut writes = Batch::new();
    writes.write(&file, &reg, 0, limit - 16 * 1024, LEN, 2);
    writes.write(&file, &reg, LEN, limit, LEN, 3);
    let queued = driver.submit(&writes, 0)?;
    check("the writes are queued", queued == 2, || {
        format!("{queued} queued")
    });
    // Time for the workers to take the writes up (and for a check made before their wait to
    // send its signal, which shows here), long before the read lets them go.
    std::thread::sleep(std::time::Duration::from_millis(300));
    println!("pending_before={}", sigxfsz_pending());
    if !exec {
        return xfsz_report(&efd, path, limit);
    }
    // The device file stays open across the exec (its queued work keeps running; the new
    // program may not use it: EXDEV), as does the eventfd.
    // SAFETY: `driver` holds the fd open for longer than this borrow.
    let dev = unsafe { std::os::fd::BorrowedFd::borrow_raw(driver.as_raw_fd()) };
    let keep = nix::fcntl::fcntl(
        dev,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    );
    check(
        "the device file kept open across exec",
        keep.is_ok(),
        || format!("{keep:?}"),
    );
    let arg = |s: String| std::ffi::CString::new(s).unwrap_or_default();
    let argv = [
        arg("gdirect-io".into()),
        arg(XFSZ_AFTER_EXEC.into()),
        arg(efd.as_raw_fd().to_string()),
        arg(path.into()),
        arg(limit.to_string()),
    ];
    // Not `Command`, which would unblock every signal in the new program.
    let err = nix::unistd::execv(c"/proc/self/exe", &argv);
    check("exec", false, || format!("{err:?}"));
    Ok(())
}

/// Waits for three completions on `efd` (30 s at most), then prints them, whether SIGXFSZ is
/// pending for this process, the size of `path`, and whether its 16 KiB below `limit` are the
/// cut write's bytes.
fn xfsz_report(efd: &OwnedFd, path: &str, limit: u64) -> gdirect::Result<()> {
    let start = std::time::Instant::now();
    let mut completions = 0;
    while completions < 3 && start.elapsed() < std::time::Duration::from_secs(30) {
        let mut pfd = [nix::poll::PollFd::new(
            efd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if let Ok(1..) = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(1000u16)) {
            completions += drain_eventfd(efd);
        }
    }
    let pending = sigxfsz_pending();
    let blocked = status_mask("SigBlk:").is_some_and(|m| m & SIGXFSZ_BIT != 0);
    check("SIGXFSZ still blocked", blocked, || "it is not".into());
    let size = file_len(path)?;
    let cut = 16 << 10;
    let tail = buffered(path, limit - cut, cut as usize)?;
    let same = tail == pattern(limit, cut as usize);
    println!(
        "completions={completions} waited_ms={} sigxfsz_pending={pending} size={size} cut_written={same}",
        start.elapsed().as_millis()
    );
    Ok(())
}

/// SIGXFSZ's bit in the signal masks of `/proc/self/status`.
const SIGXFSZ_BIT: u64 = 1 << (nix::libc::SIGXFSZ - 1);

/// The signal mask `key` (`SigPnd:`, ...) of `/proc/self/status`.
fn status_mask(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Whether SIGXFSZ is pending for this thread or process: `true`, `false` or `unknown`.
fn sigxfsz_pending() -> String {
    match (status_mask("SigPnd:"), status_mask("ShdPnd:")) {
        (Some(own), Some(shared)) => ((own | shared) & SIGXFSZ_BIT != 0).to_string(),
        _ => "unknown".into(),
    }
}

/// The size of `dev` (a block device or a file), in bytes.
fn file_len(dev: &str) -> gdirect::Result<u64> {
    let err = |e: std::io::Error| Error::OpenFile {
        path: dev.into(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    StdFile::open(dev)
        .and_then(|mut f| f.seek(SeekFrom::End(0)))
        .map_err(err)
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
    let mut alloc = gpu.alloc(BUF)?;
    // SAFETY: `alloc` outlives `reg`; the CPU writes it only between transfers, which are
    // synchronous here.
    let reg = unsafe { register_for_poisoning(&driver, &alloc) }?;
    let poison = pattern(seed ^ 0xa5a5, BUF as usize);
    let files: Vec<(File, u64, &String)> = devs
        .iter()
        .map(|d| Ok((File::open_direct(d)?, size_of(d)?, d)))
        .collect::<gdirect::Result<_>>()?;
    let mut rng = Rng(seed | 1);
    let (mut bytes, mut p2p, mut bounce, mut eofs, mut p2p_bytes) = (0, 0, 0, 0, 0);
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
        // Poisoned first: bytes the read did not deliver cannot pass for data.
        let span = buf_offset as usize..(buf_offset + len) as usize;
        alloc.write(buf_offset, &poison[span])?;
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
            IoPath::P2p => {
                p2p += 1;
                p2p_bytes += t.bytes;
            }
            _ => bounce += 1,
        }
    }
    println!(
        "reads={count} bytes={bytes} p2p={p2p} bounce={bounce} eof={eofs} p2p_bytes={p2p_bytes} bar_pages={}",
        alloc.bar_pages()?.len()
    );
    Ok(())
}

/// Registers all of `alloc` by its address range, so that the registration does not borrow it
/// and the CPU can poison it again while it is registered.
///
/// # Safety
///
/// `alloc` outlives the registration, and the CPU writes it only while no transfer into it is
/// queued.
unsafe fn register_for_poisoning<'d>(
    driver: &'d Driver,
    alloc: &EgpuAllocation,
) -> gdirect::Result<gdirect::Registration<'d>> {
    // SAFETY: the caller's contract: the memory outlives the registration and is not written
    // by the CPU under a transfer.
    unsafe {
        driver.register_range(
            gdirect::Provider::Nvidia,
            alloc.va(),
            gdirect::DeviceMemory::len(alloc),
            gdirect::RegisterOptions::new(),
        )
    }
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
    Ok(drain_eventfd(efd))
}

/// The eventfd's count without waiting (it is non-blocking): 0 when nothing was signalled.
fn drain_eventfd(efd: &OwnedFd) -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: reading 8 bytes into `v` from an eventfd.
    let n = unsafe { nix::libc::read(efd.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
    if n == 8 {
        u64::from_ne_bytes(v)
    } else {
        0
    }
}

fn batch(dev: &str) -> gdirect::Result<()> {
    const ENTRIES: u64 = 256;
    const LEN: u64 = 64 << 10;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let mut alloc = gpu.alloc(ENTRIES * LEN)?;
    // A new allocation holds the emulated GPU's poison: a slot no read filled cannot match.
    // SAFETY: `alloc` outlives `reg`; the CPU writes it only while no transfer is queued
    // (between the two batches).
    let reg = unsafe { register_for_poisoning(&driver, &alloc) }?;
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
    // A completion that landed between a round's eventfd read and its REAP was reaped in
    // that round, but its signal is still in the counter: the module signals under the lock
    // that queues the completion, so once all are reaped one more read holds the rest.
    signals += drain_eventfd(&efd);
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
    // A batch with REAP_WAIT instead of the eventfd, into slots poisoned again first (they hold
    // the first batch's bytes, which differ: slot i read the device at 2*i*64 KiB, this one at
    // i*64 KiB).
    driver.set_eventfd(None)?;
    alloc.write(0, &pattern(0x5eed_0b0b, 8 * LEN as usize))?;
    let mut small = Batch::new();
    for i in 0..8 {
        small.read(&file, &reg, i * LEN, i * LEN, LEN, i);
    }
    let n = driver.submit(&small, 0)?;
    let mut waited = 0;
    while waited < n {
        waited += driver.reap(8, true)?.len();
    }
    let mut small_bad = 0;
    for i in 0..8 {
        alloc.read(i * LEN, &mut got)?;
        if got != buffered(dev, i * LEN, LEN as usize)? {
            small_bad += 1;
        }
    }
    println!("reap_wait_completed={waited} reap_wait_mismatched={small_bad}");
    // An entry naming a registration of another open file: the library refuses it (EPERM,
    // as the module refuses a handle it did not make) after queuing the entries before it.
    let other = Driver::open()?;
    let host = gdirect::HostBuffer::new(LEN as usize)?;
    let foreign = other.register(&host)?;
    let mut mixed = Batch::new();
    mixed
        .read(&file, &reg, 0, 0, LEN, 1)
        .read(&file, &foreign, 0, 0, LEN, 2);
    let refused = |r: gdirect::Result<usize>| match r {
        Err(Error::Submit { index, errno }) => format!("{index}:{errno:?}"),
        other => format!("{other:?}"),
    };
    let first = refused(driver.submit(&mixed, 0));
    let queued = driver.reap(2, true)?;
    let again = refused(driver.submit(&mixed, 1));
    println!(
        "foreign_submit={first} foreign_queued_before={} foreign_again={again}",
        queued.iter().filter(|c| c.user_data == 1).count()
    );
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
    // The access mode 3 (O_RDONLY | O_WRONLY | O_RDWR's bits both set) opens for ioctls alone:
    // neither read nor write access (no FMODE_READ, no FMODE_WRITE), so neither direction.
    let mode3 = nix::fcntl::open(
        dev,
        nix::fcntl::OFlag::from_bits_retain(3) | nix::fcntl::OFlag::O_DIRECT,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| Error::OpenFile {
        path: dev.into(),
        errno,
    })?;
    out(
        "mode3_read",
        raw_read(&driver, h, mode3.as_raw_fd(), 0, 0, 4096, 0, read),
    );
    out(
        "mode3_write",
        raw_read(
            &driver,
            h,
            mode3.as_raw_fd(),
            0,
            0,
            4096,
            0,
            raw::GDIRECT_IOC_WRITE,
        ),
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
    // An entry that cannot be read (it lies on an unmapped page) is refused with its index like
    // a malformed one: the entries before it are queued and said so, not lost.
    let (fault, queued) = submit_across_hole(&driver, &direct, reg2.handle())?;
    out("batch_entry_fault", format!("{fault}@{queued}"));
    let drained = driver.reap(8, true)?.len();
    out("batch_entry_fault_completed", drained.to_string());
    Ok(())
}

/// SUBMIT of two reads whose second entry starts on an unmapped page: the errno and the
/// `submitted` the module wrote back.
fn submit_across_hole(driver: &Driver, file: &File, handle: u64) -> gdirect::Result<(String, u32)> {
    use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
    const PAGE: usize = 4096;
    let sqe_len = std::mem::size_of::<raw::gdirect_sqe>();
    // Evaluated at build time.
    const LEN: std::num::NonZeroUsize = std::num::NonZeroUsize::new(2 * PAGE).unwrap();
    let map_err = |e: Errno| Error::Allocation {
        what: "two pages for the entries".into(),
        errno: e,
    };
    // SAFETY: a new private anonymous mapping; nothing else refers to it.
    let base = unsafe {
        mmap_anonymous(
            None,
            LEN,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .map_err(map_err)?;
    // SAFETY: the second page of the mapping just made, which nothing uses.
    unsafe { munmap(base.byte_add(PAGE), PAGE) }.map_err(map_err)?;
    let first = raw::gdirect_sqe {
        op: raw::GDIRECT_OP_READ,
        handle,
        len: 4096,
        fd: file.as_fd().as_raw_fd(),
        user_data: 77,
        ..Default::default()
    };
    // SAFETY: the last `sqe_len` bytes of the mapped first page: writable, and aligned for the
    // entry (8 bytes, which divides both the page and the entry's size).
    let at = unsafe { base.cast::<u8>().as_ptr().add(PAGE - sqe_len) };
    // SAFETY: as above.
    unsafe { std::ptr::write(at.cast::<raw::gdirect_sqe>(), first) };
    let mut a = raw::gdirect_submit_args {
        sqes: at as u64,
        count: 2,
        ..Default::default()
    };
    // SAFETY: `a` is a valid, writable argument struct; its entries are where it says (the
    // second on the unmapped page, on purpose: the module must fault cleanly).
    let ret =
        unsafe { nix::libc::ioctl(driver.as_raw_fd(), raw::GDIRECT_IOC_SUBMIT as _, &raw mut a) };
    let errno = match Errno::result(ret) {
        Ok(_) => "OK".to_string(),
        Err(e) => format!("{e:?}"),
    };
    // SAFETY: the first page, still mapped, which nothing refers to any more.
    unsafe { munmap(base, PAGE) }.map_err(map_err)?;
    Ok((errno, a.submitted))
}

fn queue_exit(dev: &str, count: u64) -> gdirect::Result<()> {
    const LEN: u64 = 2 << 20;
    // Each read lands in one of 64 slots of the memory, and reads one of the first 24 pieces
    // of DEV (48 MiB, inside the rig's 64 MiB throttled namespace): all COUNT move their bytes,
    // none ends at once past the end.
    let slots = count.min(64);
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    // Kept: the memory outlives this process, so that the registration the queued reads hold
    // ends on the module's worker (left to the GPU driver) and its free comes later.
    let alloc = gpu.alloc_kept(slots * LEN)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    for i in 0..count {
        b.read(&file, &reg, i % slots * LEN, i % 24 * LEN, LEN, i);
    }
    let mut submitted = 0;
    while submitted < b.len() {
        match driver.submit(&b, submitted)? {
            0 => break,
            n => submitted += n,
        }
    }
    println!("va={:#x}", alloc.va());
    println!("submitted={submitted}");
    use std::io::Write as _;
    // A failed flush leaves the script without `va=`, which fails it.
    let _ = std::io::stdout().flush();
    // Out without closing anything by hand or reaping: the exit closes the device file with
    // the reads still queued.
    std::process::exit(0)
}

/// The per-user cap on batched transfers (the module loaded with `max_in_flight_per_user=CAP`):
/// a child that became uid 1000 (group gdirect; DEV opened before, as root) queues 2 x CAP reads
/// of 4 MiB of DEV into GPU memory on one device file (`user_first=`: how many were queued,
/// CAP and one more for each done by then, `user_first_done=`), then its second file queues
/// into what completes until refused (`user_second_file=`: the library's error kind,
/// `user_transfer_limit`); meanwhile root queues CAP on its own file (`root=`: all of them);
/// once the child has reaped its reads, its second file queues one (`user_after=`).
fn user_cap(dev: &str, cap: u64) -> gdirect::Result<()> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    use std::io::Write as _;
    const LEN: u64 = 4 << 20;
    let fail = |what: &'static str| Error::Worker { what };
    let (mut parent_end, mut child_end) =
        std::os::unix::net::UnixStream::pair().map_err(|_| fail("socketpair"))?;
    let step = |s: &mut std::os::unix::net::UnixStream| {
        let mut b = [0u8; 1];
        s.write_all(&[1]).is_ok() && s.read_exact(&mut b).is_ok()
    };
    let queue = |driver: &Driver, file: &File, count: u64| -> gdirect::Result<String> {
        let gpu = Egpu::open()?;
        let alloc = gpu.alloc(count * LEN)?;
        let reg = driver.register(&alloc)?;
        let mut b = Batch::new();
        for i in 0..count {
            b.read(file, &reg, i * LEN, i % 12 * LEN, LEN, i);
        }
        let queued = match driver.submit(&b, 0) {
            Ok(n) => n.to_string(),
            Err(e) => e.kind().to_string(),
        };
        Ok(queued)
    };
    let _ = std::io::stdout().flush();
    // SAFETY: this program has no other thread; the child makes syscalls, transfers and prints.
    match unsafe { nix::unistd::fork() } {
        Err(_) => return Err(fail("fork")),
        Ok(nix::unistd::ForkResult::Child) => {
            drop(parent_end);
            let mut run = || -> gdirect::Result<()> {
                let file = File::open_direct(dev)?;
                let (g, u) = (Gid::from_raw(1000), Uid::from_raw(1000));
                if setgroups(&[Gid::from_raw(990)]).is_err()
                    || setresgid(g, g, g).is_err()
                    || setresuid(u, u, u).is_err()
                {
                    return Err(fail("become uid 1000"));
                }
                let (first, second) = (Driver::open()?, Driver::open()?);
                let gpu = Egpu::open()?;
                let alloc = gpu.alloc(2 * cap * LEN)?;
                let reg = first.register(&alloc)?;
                let mut b = Batch::new();
                for i in 0..2 * cap {
                    b.read(&file, &reg, i * LEN, i % 12 * LEN, LEN, i);
                }
                // The second file's read, made ready before the first file's submit.
                let gpu2 = Egpu::open()?;
                let alloc2 = gpu2.alloc(LEN)?;
                let reg2 = second.register(&alloc2)?;
                let mut b2 = Batch::new();
                b2.read(&file, &reg2, 0, 0, LEN, 0);
                let queued = first.submit(&b, 0)?;
                // Those already done: a throttle lets a first request through at once, and a
                // slow kernel's SUBMIT may see it complete before the last entries (the cap
                // counts transfers until done), so 8 + those may have been queued. A transfer
                // gives its user's count back just before its completion is posted (so that a
                // reaper finds nothing of it held): 50 ms for such a completion to show, well
                // under the 125 ms the throttle takes for the next read.
                std::thread::sleep(std::time::Duration::from_millis(50));
                let done_then = first.reap(queued, false)?.len();
                println!("user_first={queued} user_first_done={done_then}");
                // The throttle lets a first request through at once, and then one about every
                // 125 ms: the second file queues into what completes until the user's 8 are in
                // flight again, and is refused then.
                let (mut second_queued, mut refusal) = (0, "no_refusal".to_string());
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while std::time::Instant::now() < deadline {
                    match second.submit(&b2, 0) {
                        Ok(n) => second_queued += n,
                        Err(e) => {
                            refusal = e.kind().to_string();
                            break;
                        }
                    }
                }
                println!("user_second_file={refusal} user_second_file_queued={second_queued}");
                // Root queues its own meanwhile.
                step(&mut child_end);
                let mut reaped = done_then;
                while reaped < queued {
                    reaped += first.reap(queued, true)?.len();
                }
                let mut reaped2 = 0;
                while reaped2 < second_queued {
                    reaped2 += second.reap(second_queued, true)?.len();
                }
                drop(reg);
                let after = queue(&second, &file, 1)?;
                println!("user_after={after}");
                while second.reap(1, true)?.is_empty() {}
                drop(reg2);
                Ok(())
            };
            if let Err(e) = run() {
                println!("user_error={}", e.kind());
            }
            let _ = std::io::stdout().flush();
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { nix::libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(child_end);
            let mut b = [0u8; 1];
            if parent_end.read_exact(&mut b).is_ok() {
                let driver = Driver::open()?;
                let file = File::open_direct(dev)?;
                let root = queue(&driver, &file, cap)?;
                println!("root={root}");
                let _ = std::io::stdout().flush();
                let _ = parent_end.write_all(&[1]);
                if let Ok(n) = root.parse::<usize>() {
                    let mut reaped = 0;
                    while reaped < n {
                        reaped += driver.reap(n, true)?.len();
                    }
                }
            }
            let _ = nix::sys::wait::waitpid(child, None);
        }
    }
    Ok(())
}

/// `threads` threads of one user read DEV through the bounce path (forced) for 3 s, 4 MiB at a
/// time, from the namespace QEMU throttles (so each chunk's read waits in the block layer):
/// where each thread sleeps is sampled meanwhile, as the kernel tells
/// (`/proc/self/task/TID/stat` and `wchan`), and the most of them at once asleep in
/// `submit_bio_wait` (or `bio_await`) in two rounds of looks, where a chunk's read waits for
/// its bio (one waiting for a chunk sleeps interruptibly
/// in the pool), is printed (`max_in_io=`), with the reads done (`reads=`, every byte checked
/// against a buffered read of DEV: `bad=`) and where the most threads slept uninterruptibly at
/// once (`most_asleep_at=`). With `max_bounce_per_user=1` the user holds one chunk at a time:
/// at most one thread reads.
fn bounce_cap(dev: &str, threads: u64) -> gdirect::Result<()> {
    const LEN: u64 = 4 << 20;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let file = File::open_direct(dev)?;
    let mut want = vec![0u8; LEN as usize];
    StdFile::open(dev)
        .and_then(|mut f| f.read_exact(&mut want))
        .map_err(|_| Error::Worker {
            what: "cannot read DEV",
        })?;
    let poison = pattern(0xb0b0, LEN as usize);
    let tids: Vec<std::sync::atomic::AtomicI32> = (0..threads)
        .map(|_| std::sync::atomic::AtomicI32::new(0))
        .collect();
    let (reads, bad) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let state = |tid: i32| -> Option<String> {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        let (_, rest) = s.rsplit_once(')')?;
        rest.split_whitespace().next().map(str::to_string)
    };
    let (mut max_in_io, mut max_asleep, mut samples) = (0, 0, 0);
    let mut wchans = String::new();
    std::thread::scope(|s| -> gdirect::Result<()> {
        let mut workers = Vec::new();
        for tid in tids.iter() {
            let (driver, gpu, file, want, poison) = (&driver, &gpu, &file, &want, &poison);
            let (reads, bad, stop) = (&reads, &bad, &stop);
            workers.push(s.spawn(move || -> gdirect::Result<()> {
                let mut alloc = gpu.alloc(LEN)?;
                // SAFETY: `alloc` outlives `reg`; the CPU writes it only between this thread's
                // transfers, which are synchronous.
                let reg = unsafe { register_for_poisoning(driver, &alloc) }?;
                tid.store(nix::unistd::gettid().as_raw(), Ordering::SeqCst);
                let mut got = vec![0u8; LEN as usize];
                while !stop.load(Ordering::SeqCst) {
                    // Poisoned first: bytes the read did not deliver cannot pass for data.
                    alloc.write(0, poison)?;
                    let options = IoOptions::new().force_bounce(true);
                    let t = file.read_into_with(&reg, 0, 0, LEN, options)?;
                    alloc.read(0, &mut got)?;
                    if t.bytes != LEN || got != *want {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                drop(reg);
                Ok(())
            }));
        }
        let wchan = |t: i32| {
            std::fs::read_to_string(format!("/proc/self/task/{t}/wchan"))
                .map_or("?".into(), |w| w.trim().to_string())
        };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let in_io = |w: &str| w == "submit_bio_wait" || w == "bio_await";
        while std::time::Instant::now() < end {
            // Where each thread sleeps, twice over: `wchan` names where a task sleeps (0 once
            // woken), and a chunk's read waits for its bio in `submit_bio_wait` (or `bio_await`,
            // where a kernel did not inline it). A thread seen there in both rounds waited for
            // one bio all along (another would need the chunk back, a read's 30 ms later), so two
            // such threads were reading at once: the second's first look falls inside the
            // first's two.
            let ids: Vec<i32> = tids.iter().map(|t| t.load(Ordering::SeqCst)).collect();
            let first: Vec<String> = ids.iter().map(|&t| wchan(t)).collect();
            let second: Vec<String> = ids.iter().map(|&t| wchan(t)).collect();
            let both = first
                .iter()
                .zip(&second)
                .filter(|(a, b)| in_io(a) && in_io(b))
                .count();
            max_in_io = max_in_io.max(both);
            let asleep: Vec<&str> = ids
                .iter()
                .zip(&second)
                .filter(|(&t, _)| t != 0 && state(t).as_deref() == Some("D"))
                .map(|(_, w)| w.as_str())
                .collect();
            if asleep.len() > max_asleep {
                max_asleep = asleep.len();
                wchans = asleep.join(",");
            }
            samples += 1;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        }
        Ok(())
    })?;
    println!(
        "threads={threads} max_in_io={max_in_io} samples={samples} reads={} bad={} \
         most_asleep_at={}",
        reads.load(Ordering::Relaxed),
        bad.load(Ordering::Relaxed),
        if wchans.is_empty() { "none" } else { &wchans }
    );
    Ok(())
}

/// `O_DIRECT` cleared on a file with batched reads of it queued (see the command's help): a
/// chunk that starts afterwards must not become a buffered read through the page cache into
/// device memory, but fail with `EBADFD`, as a request on such a file does.
fn direct_cleared(dev: &str) -> gdirect::Result<()> {
    const LEN: u64 = 16 << 20;
    const COUNT: u64 = 4;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(COUNT * LEN)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    for i in 0..COUNT {
        b.read(&file, &reg, i * LEN, (i * LEN) % (48 << 20), LEN, i);
    }
    let queued = driver.submit(&b, 0)?;
    check("all 4 queued", queued == COUNT as usize, || {
        format!("{queued}")
    });
    let fd = file.as_fd().as_raw_fd();
    // SAFETY: `fd` is the open file's; F_GETFL and F_SETFL take and give an int.
    let cleared = unsafe {
        let flags = nix::libc::fcntl(fd, nix::libc::F_GETFL);
        flags >= 0 && nix::libc::fcntl(fd, nix::libc::F_SETFL, flags & !nix::libc::O_DIRECT) == 0
    };
    check("O_DIRECT cleared", cleared, || {
        std::io::Error::last_os_error().to_string()
    });
    let (mut whole, mut ebadfd, mut other) = (0, 0, Vec::new());
    let mut reaped = 0;
    while reaped < queued {
        for c in driver.reap(queued, true)? {
            reaped += 1;
            match c.result {
                Ok(t) if t.bytes == LEN => whole += 1,
                Err(Errno::EBADFD) => ebadfd += 1,
                r => other.push(format!("{r:?}")),
            }
        }
    }
    println!("whole={whole} ebadfd={ebadfd} other={}", other.len());
    check("each read whole or EBADFD", other.is_empty(), || {
        other.join(", ")
    });
    check(
        "a chunk started after the clear fails with EBADFD",
        ebadfd > 0,
        || format!("{whole} whole"),
    );
    drop(reg);
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
        // The first 48 MiB of DEV over and over: more reads than DEV holds keep the batch in
        // flight longer (the rig's throttled namespace has 64 MiB).
        b.read(&file, &reg, i * LEN, i % 48 * LEN, LEN, i);
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

/// A free while one long synchronous read into the memory runs: with the revocation fence held
/// per bounded chunk, the free returns after the chunk in flight and the read fails with
/// EKEYREVOKED; a fence held for the whole transfer would make the free wait for all of it.
fn revoke_latency(dev: &str, mib: u64) -> gdirect::Result<()> {
    use std::time::Instant;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let len = mib << 20;
    let alloc = gpu.alloc(len)?;
    let va = alloc.va();
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let start = Instant::now();
    let (read, free_ms, free_end) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let r = file.read_into(&reg, 0, 0, len);
            (r, start.elapsed())
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        let t = Instant::now();
        let freed = gpu.free_va(va);
        let free_ms = t.elapsed().as_millis();
        let free_end = start.elapsed();
        check(
            "free",
            freed.as_ref().is_ok_and(|r| r.callbacks == 1),
            || format!("{freed:?}"),
        );
        let callback_ms = freed.map_or(0, |r| r.callback_time.as_millis());
        (reader.join(), (free_ms, callback_ms), free_end)
    });
    let (free_ms, callback_ms) = free_ms;
    let Ok((read, read_end)) = read else {
        check("read thread", false, || "panicked".into());
        return Ok(());
    };
    let revoked = matches!(read, Err(Error::Revoked { .. }));
    println!(
        "read_mib={mib} free_ms={free_ms} callback_ms={callback_ms} read_ms={} free_returned_before_read_ended={} read_revoked={revoked}",
        read_end.as_millis(),
        free_end < read_end
    );
    check(
        "the read stopped at the revocation (EKEYREVOKED)",
        revoked,
        || format!("{read:?}"),
    );
    drop(reg);
    Ok(())
}

/// The outcomes of reads made again and again until a free revokes their memory: whole,
/// `EKEYREVOKED`, or anything else (printed).
#[derive(Default)]
struct ReadTally {
    ok: AtomicU64,
    revoked: AtomicU64,
    other: AtomicU64,
}

impl ReadTally {
    /// Reads `len` bytes with `read(i)` for i = 0, 1, ... until `stop` is set or a read gets
    /// `EKEYREVOKED`, counting each outcome.
    fn read_until_revoked(
        &self,
        stop: &std::sync::atomic::AtomicBool,
        len: u64,
        mut read: impl FnMut(u64) -> gdirect::Result<gdirect::Transfer>,
    ) {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            match read(i) {
                Ok(t) if t.bytes == len => self.ok.fetch_add(1, Ordering::Relaxed),
                Err(Error::Revoked { .. }) => {
                    self.revoked.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                r => {
                    println!("read: {r:?}");
                    self.other.fetch_add(1, Ordering::Relaxed)
                }
            };
            i += 1;
        }
    }
}

/// The wait of a free behind the storage I/O running on the memory (see the command's help):
/// `threads` synchronous reads of `mib` MiB from `dev`, spread over `regs` registrations of
/// their own allocations, started together; 0.3 s later the first allocation is freed, and the
/// emulated GPU reports how long the module's free callback held its lock. Each read either
/// completes whole or fails with `EKEYREVOKED` (the freed memory), nothing else; the threads
/// stop at the free. Prints `callback_ms=`, `reads_ok=`, `reads_revoked=`.
fn free_bound(dev: &str, threads: u64, mib: u64, regs: u64) -> gdirect::Result<()> {
    use std::sync::{atomic::AtomicBool, Barrier};
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let len = mib << 20;
    let per_reg = threads.div_ceil(regs);
    let allocs = (0..regs)
        .map(|_| gpu.alloc(per_reg * len))
        .collect::<gdirect::Result<Vec<_>>>()?;
    let registrations = allocs
        .iter()
        .map(|a| driver.register(a))
        .collect::<gdirect::Result<Vec<_>>>()?;
    let file = File::open_direct(dev)?;
    let dev_len = file_len(dev)?;
    let tally = ReadTally::default();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads as usize + 1);
    let freed = std::thread::scope(|s| {
        for t in 0..threads {
            let (reg, file, stop, start, tally) = (
                &registrations[(t % regs) as usize],
                &file,
                &stop,
                &start,
                &tally,
            );
            s.spawn(move || {
                let buf = (t / regs) * len;
                let pos = (t * len) % (dev_len - dev_len % len).max(len);
                start.wait();
                tally.read_until_revoked(stop, len, |_| file.read_into(reg, buf, pos, len));
            });
        }
        start.wait();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let freed = gpu.free_va(allocs[0].va());
        stop.store(true, Ordering::Relaxed);
        freed
    });
    let freed = freed?;
    check(
        "the free ran the registration's callback",
        freed.callbacks == 1,
        || format!("{freed:?}"),
    );
    let (ok, revoked, other) = (
        tally.ok.into_inner(),
        tally.revoked.into_inner(),
        tally.other.into_inner(),
    );
    println!(
        "callback_ms={} reads_ok={ok} reads_revoked={revoked} reads_other={other}",
        freed.callback_time.as_millis()
    );
    check("every read whole or EKEYREVOKED", other == 0, || {
        format!("{other} others")
    });
    check(
        "reads of the freed memory stopped with EKEYREVOKED",
        revoked > 0,
        || "none".into(),
    );
    drop(registrations);
    Ok(())
}

/// Waits (at most 10 s) until the block layer holds reads of `dev` in flight (its `inflight`
/// count in sysfs, not the module's word), and returns how many it holds then (0: none came).
fn wait_disk_reads(dev: &str) -> u64 {
    let stat = format!(
        "/sys/class/block/{}/inflight",
        dev.rsplit('/').next().unwrap_or(dev)
    );
    let reads = || {
        std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let start = std::time::Instant::now();
    let mut n = reads();
    while n == 0 && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
        n = reads();
    }
    n
}

/// The bounce path's CPU copies against a free (see the command's help). On a namespace the
/// rig does not throttle, a 1 MiB read takes about as long as the copy of its bytes into GPU
/// memory, so with a few threads a free often lands inside a copy: the free must wait for
/// it (the copy holds a use of the pages), and no byte may change after the free returned and
/// the emulated GPU poisoned the memory.
fn revoke_copies(dev: &str, threads: u64, rounds: u64) -> gdirect::Result<()> {
    use std::sync::atomic::AtomicBool;
    const LEN: u64 = 1 << 20;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let file = File::open_direct(dev)?;
    let span = (file_len(dev)? / LEN).max(1);
    let options = IoOptions::new().force_bounce(true);
    let (mut dirty_rounds, mut reads, mut revoked, mut other) = (0, 0, 0, 0);
    for round in 0..rounds {
        let alloc = gpu.alloc(threads * LEN)?;
        let (va, pages) = (alloc.va(), alloc.bar_pages()?);
        let reg = driver.register(&alloc)?;
        let stop = AtomicBool::new(false);
        let tally = ReadTally::default();
        std::thread::scope(|s| -> gdirect::Result<()> {
            for t in 0..threads {
                let (reg, file, stop, tally) = (&reg, &file, &stop, &tally);
                s.spawn(move || {
                    // Each read from another place of DEV, so that each copy changes the memory.
                    tally.read_until_revoked(stop, LEN, |i| {
                        let pos = ((t + round + i * threads) % span) * LEN;
                        file.read_into_with(reg, t * LEN, pos, LEN, options)
                    });
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            let freed = gpu.free_va(va);
            stop.store(true, Ordering::Relaxed);
            check(
                "the free ran the callback",
                freed.as_ref().is_ok_and(|f| f.callbacks == 1),
                || format!("{freed:?}"),
            );
            Ok(())
        })?;
        // The threads have stopped: whatever they did after the free is in the memory now.
        let bytes = bar_pages_bytes(&pages)?;
        let changed = bytes.iter().filter(|&&b| b != FREED_POISON).count();
        if changed > 0 {
            dirty_rounds += 1;
            println!("round {round}: {changed} bytes changed after the free returned");
        }
        reads += tally.ok.into_inner();
        revoked += tally.revoked.into_inner();
        other += tally.other.into_inner();
        drop(reg);
        std::mem::forget(alloc);
    }
    println!(
        "rounds={rounds} dirty_rounds={dirty_rounds} reads={reads} revoked={revoked} other={other}"
    );
    check(
        "no byte changed after a free returned",
        dirty_rounds == 0,
        || format!("{dirty_rounds} rounds"),
    );
    check("every read whole or EKEYREVOKED", other == 0, || {
        format!("{other} others")
    });
    Ok(())
}

fn revoke(dev: &str, count: u64, bounce: bool) -> gdirect::Result<()> {
    const LEN: u64 = 1 << 20;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let mut alloc = gpu.alloc(count * LEN)?;
    let (va, pages) = (alloc.va(), alloc.bar_pages()?);
    // Poisoned, so that a read that did not land cannot pass for one that did.
    let poison = vec![0xa5u8; LEN as usize];
    for i in 0..count {
        alloc.write(i * LEN, &poison)?;
    }
    let reference = buffered(dev, 0, 16 * LEN as usize)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    let options = IoOptions::new().force_bounce(bounce);
    for i in 0..count {
        b.read_with(&file, &reg, i * LEN, (i % 16) * LEN, LEN, i, options);
    }
    let mut submitted = 0;
    while submitted < b.len() {
        let queued = driver.submit(&b, submitted)?;
        if queued == 0 {
            break;
        }
        submitted += queued;
    }
    // Reads already complete before the free: their bytes are checked in the memory now (the
    // emulated GPU poisons memory when it is freed, so no read's bytes can be seen after).
    let (mut ok, mut revoked, mut other, mut bounced) = (0, 0, 0, 0);
    let (mut checked, mut mismatches) = (0, 0);
    let mut reaped = 0;
    let mut tally =
        |c: gdirect::Completion, memory: Option<&EgpuAllocation>| -> gdirect::Result<()> {
            match c.result {
                Ok(t) if t.bytes == LEN => {
                    ok += 1;
                    bounced += u64::from(t.path == IoPath::Bounce);
                    // At most 8 checked before the free: each check reads 1 MiB through the
                    // BAR's CPU mapping, slow under TCG (a debug kernel's run checked 44, and
                    // every other read was done before the free began).
                    if let Some(alloc) = memory.filter(|_| checked < 8) {
                        let i = c.user_data;
                        let mut got = vec![0u8; LEN as usize];
                        alloc.read(i * LEN, &mut got)?;
                        let src = ((i % 16) * LEN) as usize;
                        checked += 1;
                        if reference.get(src..src + LEN as usize) != Some(&got[..]) {
                            mismatches += 1;
                            println!("completed read {i} holds other bytes than the drive's");
                        }
                    }
                }
                Err(Errno::EKEYREVOKED) => revoked += 1,
                r => {
                    other += 1;
                    println!("unexpected completion {}: {r:?}", c.user_data);
                }
            }
            Ok(())
        };
    for c in driver.reap(count as usize, false)? {
        reaped += 1;
        tally(c, Some(&alloc))?;
    }
    // Free while the reads are in flight: the free returns once no read can touch the memory.
    // First the drive must hold some (the block layer's count: a forced bounce can take longer
    // to reach it than the free, on the IOMMU rig, and then the free races nothing); the
    // module's debugfs counter is read just before, and only printed.
    let mut disk_reads = wait_disk_reads(dev);
    // The count rises when the driver starts a request, before it rings the doorbell and before
    // QEMU takes the command from the queue (in its main loop, behind the vCPUs): a free made at
    // the count's first sight once began before QEMU's trace showed any command outstanding
    // (CI, bounce). 20 ms more lets QEMU take them, well inside the time the throttled
    // namespace (32 MB/s, 31 ms a MiB) takes for the reads queued at once.
    if disk_reads > 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        disk_reads = wait_disk_reads(dev);
    }
    let in_flight = debugfs::counter("active_transfers")?;
    let report = gpu.free_va(va)?;
    // The free poisoned the memory (EGPU_FREED_POISON): every byte must be that, and stay so
    // while the reads still queued end.
    let snapshot = bar_pages_bytes(&pages)?;
    let poisoned = snapshot.iter().all(|&b| b == FREED_POISON);
    while reaped < submitted {
        for c in driver.reap(count as usize, true)? {
            reaped += 1;
            tally(c, None)?;
        }
    }
    let after = bar_pages_bytes(&pages)?;
    println!(
        "submitted={submitted} completed_ok={ok} revoked={revoked} other={other} callbacks={} bounced={bounced}",
        report.callbacks
    );
    println!(
        "unchanged_after_revocation={} poisoned_at_free={poisoned}",
        snapshot == after && poisoned
    );
    println!(
        "data_checked={checked} data_mismatches={mismatches} in_flight_at_free={in_flight} \
         disk_reads_at_free={disk_reads}"
    );
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

/// The byte the emulated GPU fills freed memory with (`EGPU_FREED_POISON`).
const FREED_POISON: u8 = gdirect_internals::egpu::FREED_POISON;

/// The bytes of BAR2's 64 KiB pages at `pages` (BAR offsets), in order, read through a fresh
/// mapping of the BAR (the allocation they were may be freed).
fn bar_pages_bytes(pages: &[u64]) -> gdirect::Result<Vec<u8>> {
    let path = gdirect_internals::egpu::sysfs_device()?.join("resource2");
    let err = |e: std::io::Error| Error::OpenFile {
        path: path.clone(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    };
    let mut f = StdFile::open(&path).map_err(err)?;
    let bar_len = f.metadata().map_err(err)?.len();
    let map = MapRead::new(&mut f, 0, bar_len)?;
    let page = gdirect_internals::egpu::PAGE_SIZE as usize;
    let mut out = Vec::with_capacity(pages.len() * page);
    for &p in pages {
        let bytes =
            map.bytes()
                .get(p as usize..p as usize + page)
                .ok_or(Error::OutOfMemoryRange {
                    offset: p,
                    len: page as u64,
                    size: bar_len,
                })?;
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// A read-only mapping of part of a file (sysfs BAR files cannot be read with read(2)).
struct MapRead {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl MapRead {
    fn new(f: &mut StdFile, offset: u64, len: u64) -> gdirect::Result<Self> {
        let size = std::num::NonZeroUsize::new(len as usize).ok_or(Error::OutOfRegistration {
            handle: 0,
            buf_offset: 0,
            len: 0,
        })?;
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

/// Counters of a stress run, summed over its threads.
#[derive(Default)]
struct StressTally {
    ops: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    mismatches: u64,
    revocations: u64,
    revoked_errors: u64,
    registrations: u64,
    p2p: u64,
    bounce: u64,
    /// Bytes that P2P reads and writes moved (QEMU's trace must find them in the GPU's BAR).
    p2p_read_bytes: u64,
    p2p_write_bytes: u64,
}

fn stress(
    ops: u64,
    seed: u64,
    threads: u64,
    dev: &str,
    read: std::ops::Range<u64>,
    rw: std::ops::Range<u64>,
) -> gdirect::Result<()> {
    println!("seed={seed} threads={threads} ops={ops} dev={dev}");
    let snapshot = buffered(dev, read.start, (read.end - read.start) as usize)?;
    let slice = (rw.end - rw.start) / threads.max(1) / 4096 * 4096;
    let total = std::sync::Mutex::new(StressTally::default());
    let failed = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (snapshot, total, read) = (&snapshot, &total, read.clone());
                let mine = rw.start + t * slice..rw.start + (t + 1) * slice;
                s.spawn(move || {
                    stress_thread(
                        ops,
                        seed ^ ((t + 1) * 0x9e37_79b9),
                        dev,
                        read,
                        snapshot,
                        mine,
                        total,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .filter(|r| r.is_err())
            .count()
    });
    let t = total.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "ops={} reads={} writes={} bytes={} mismatches={} revocations={} revoked_errors={} registrations={} p2p={} bounce={} p2p_read_bytes={} p2p_write_bytes={} thread_errors={failed}",
        t.ops, t.reads, t.writes, t.bytes, t.mismatches, t.revocations, t.revoked_errors, t.registrations, t.p2p, t.bounce, t.p2p_read_bytes, t.p2p_write_bytes
    );
    check("no thread failed", failed == 0, || {
        format!("{failed} thread(s) failed")
    });
    check("no byte differs", t.mismatches == 0, || {
        format!("{} mismatches", t.mismatches)
    });
    Ok(())
}

/// What a stress read's destination holds before the read (64 pages, its longest).
static POISON_PAGES: [u8; 64 * 4096] = [0xd3; 64 * 4096];

fn stress_thread(
    ops: u64,
    seed: u64,
    dev: &str,
    read: std::ops::Range<u64>,
    snapshot: &[u8],
    mine: std::ops::Range<u64>,
    total: &std::sync::Mutex<StressTally>,
) -> gdirect::Result<()> {
    const LEN: u64 = 4 << 20;
    let mut rng = Rng(seed | 1);
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let file = File::open_direct_rw(dev)?;
    let mut shadow = buffered(dev, mine.start, (mine.end - mine.start) as usize)?;
    let mut tally = StressTally::default();
    let mut alloc = gpu.alloc(LEN)?;
    // By range, so that the CPU can fill the allocation while it is registered.
    let register = |va: u64| {
        // SAFETY: `va` is an allocation of this thread's that outlives each registration; the
        // CPU fills it only between transfers, which are synchronous here.
        unsafe {
            driver.register_range(
                gdirect::Provider::Nvidia,
                va,
                LEN,
                gdirect::RegisterOptions::new(),
            )
        }
    };
    let mut reg = Some(register(alloc.va())?);
    tally.registrations += 1;
    let mut scratch = vec![0u8; LEN as usize];
    for i in 0..ops {
        // Now and then the GPU memory goes away under the registration (cudaFree), or the
        // registration is replaced.
        match rng.below(100) {
            0 | 1 => {
                let va = alloc.va();
                gpu.free_va(va)?;
                tally.revocations += 1;
                if let Some(r) = &reg {
                    match file.read_into(r, 0, mine.start, 4096) {
                        Err(Error::Revoked { .. }) => tally.revoked_errors += 1,
                        other => check("a revoked registration refuses I/O", false, || {
                            format!("op {i}: {other:?}")
                        }),
                    }
                }
                // The allocation is gone (freed above): forget the handle, allocate anew.
                std::mem::forget(alloc);
                alloc = gpu.alloc(LEN)?;
                reg = Some(register(alloc.va())?);
                tally.registrations += 1;
            }
            2 | 3 => {
                drop(reg.take());
                reg = Some(register(alloc.va())?);
                tally.registrations += 1;
            }
            _ => {}
        }
        let Some(r) = &reg else { continue };
        let len = (1 + rng.below(64)) * 4096;
        let buf_offset = rng.below((LEN - len) / 4096 + 1) * 4096;
        let opts = IoOptions::new().force_bounce(rng.below(3) == 0);
        let kind = rng.below(4);
        let t = match kind {
            0 | 1 => {
                // The read window: compare with the snapshot.
                let span = read.end - read.start;
                let off = rng.below((span - len) / 4096 + 1) * 4096;
                // Poisoned first: what an earlier operation left there cannot pass.
                alloc.write(buf_offset, &POISON_PAGES[..len as usize])?;
                let t = file.read_into_with(r, buf_offset, read.start + off, len, opts)?;
                alloc.read(buf_offset, &mut scratch[..len as usize])?;
                let want = &snapshot[off as usize..(off + len) as usize];
                if t.bytes != len || scratch[..len as usize] != *want {
                    tally.mismatches += 1;
                    println!(
                        "FAIL: op {i}: read window {}+{len}: {} bytes, content differs",
                        read.start + off,
                        t.bytes
                    );
                }
                tally.reads += 1;
                t
            }
            2 => {
                // My slice: new bytes from GPU memory to the device.
                let span = mine.end - mine.start;
                let off = rng.below((span - len) / 4096 + 1) * 4096;
                for b in scratch[..len as usize].iter_mut() {
                    *b = rng.next() as u8;
                }
                alloc.write(buf_offset, &scratch[..len as usize])?;
                let t = file.write_from_with(r, buf_offset, mine.start + off, len, opts)?;
                if t.bytes == len {
                    shadow[off as usize..(off + len) as usize]
                        .copy_from_slice(&scratch[..len as usize]);
                } else {
                    tally.mismatches += 1;
                    println!(
                        "FAIL: op {i}: write of {len} at {} wrote {}",
                        mine.start + off,
                        t.bytes
                    );
                }
                tally.writes += 1;
                t
            }
            _ => {
                // My slice back: compare with the shadow.
                let span = mine.end - mine.start;
                let off = rng.below((span - len) / 4096 + 1) * 4096;
                // Poisoned first: a write of these very bytes may have come from this slot.
                alloc.write(buf_offset, &POISON_PAGES[..len as usize])?;
                let t = file.read_into_with(r, buf_offset, mine.start + off, len, opts)?;
                alloc.read(buf_offset, &mut scratch[..len as usize])?;
                if t.bytes != len
                    || scratch[..len as usize] != shadow[off as usize..(off + len) as usize]
                {
                    tally.mismatches += 1;
                    println!(
                        "FAIL: op {i}: my slice {}+{len}: content differs from what was written",
                        mine.start + off
                    );
                }
                tally.reads += 1;
                t
            }
        };
        tally.ops += 1;
        tally.bytes += t.bytes;
        match t.path {
            IoPath::P2p if kind == 2 => {
                tally.p2p += 1;
                tally.p2p_write_bytes += t.bytes;
            }
            IoPath::P2p => {
                tally.p2p += 1;
                tally.p2p_read_bytes += t.bytes;
            }
            _ => tally.bounce += 1,
        }
    }
    drop(reg);
    let mut total = total.lock().unwrap_or_else(|e| e.into_inner());
    total.ops += tally.ops;
    total.reads += tally.reads;
    total.writes += tally.writes;
    total.bytes += tally.bytes;
    total.mismatches += tally.mismatches;
    total.revocations += tally.revocations;
    total.revoked_errors += tally.revoked_errors;
    total.registrations += tally.registrations;
    total.p2p += tally.p2p;
    total.bounce += tally.bounce;
    total.p2p_read_bytes += tally.p2p_read_bytes;
    total.p2p_write_bytes += tally.p2p_write_bytes;
    Ok(())
}

fn limits(dev: &str, host_bytes: u64) -> gdirect::Result<()> {
    const LEN: u64 = 1 << 20;
    let outcome = |r: &gdirect::Result<gdirect::Registration<'_>>| match r {
        Ok(_) => "OK".to_string(),
        Err(e) => e.errno().map_or("?".into(), |e| format!("{e:?}")),
    };
    let driver = Driver::open()?;
    let host = gdirect::HostBuffer::new(host_bytes as usize)?;
    println!("host_register={}", outcome(&driver.register(&host)));
    let gpu = Egpu::open()?;
    let small = gpu.alloc(LEN)?;
    println!("gpu_register={}", outcome(&driver.register(&small)));
    drop(small);

    // In flight: one SUBMIT of 32 queues at most max_in_flight of them.
    let alloc = gpu.alloc(32 * LEN)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let mut b = Batch::new();
    for i in 0..32 {
        b.read(&file, &reg, i * LEN, i * LEN, LEN, i);
    }
    let first = driver.submit(&b, 0)?;
    println!("first_submit={first}");
    let (mut submitted, mut reaped, mut ok) = (first, 0, 0);
    while reaped < b.len() {
        for c in driver.reap(32, true)? {
            reaped += 1;
            ok += u64::from(matches!(c.result, Ok(t) if t.bytes == LEN));
        }
        if submitted < b.len() {
            submitted += driver.submit(&b, submitted)?;
        }
    }
    println!("batch_ok={ok}");

    // The bounce pool: 16 threads of forced-bounce reads wait for buffers, never fail.
    let want = buffered(dev, 0, (16 * LEN) as usize)?;
    let (good, bad) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16u64)
            .map(|t| {
                let (file, reg, alloc, want) = (&file, &reg, &alloc, &want);
                s.spawn(move || {
                    let mut got = vec![0u8; LEN as usize];
                    let (mut good, mut bad) = (0u64, 0u64);
                    for k in 0..4u64 {
                        let off = ((t + k) % 16) * LEN;
                        let r = file.read_into_with(
                            reg,
                            t * LEN,
                            off,
                            LEN,
                            IoOptions::new().force_bounce(true),
                        );
                        let same = alloc.read(t * LEN, &mut got).is_ok()
                            && got[..] == want[off as usize..(off + LEN) as usize];
                        match r {
                            Ok(tr) if tr.bytes == LEN && tr.path == IoPath::Bounce && same => {
                                good += 1
                            }
                            _ => bad += 1,
                        }
                    }
                    (good, bad)
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().ok())
            .fold((0, 0), |(g, b), (g2, b2)| (g + g2, b + b2))
    });
    println!("bounce_ok={good} bounce_bad={bad}");
    Ok(())
}

fn faults(count: u64, seed: u64, dev: &str) -> gdirect::Result<()> {
    const LEN: u64 = 8 << 20;
    println!("seed={seed}");
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let mut alloc = gpu.alloc(LEN)?;
    // SAFETY: `alloc` outlives `reg`; the CPU writes it only where no transfer is queued
    // (before each read or batch is submitted).
    let reg = unsafe { register_for_poisoning(&driver, &alloc) }?;
    // What every destination holds before its read: no device byte run of 4 KiB equals it.
    let poison = vec![0xd1u8; 1 << 20];
    let file = File::open_direct(dev)?;
    let size = size_of(dev)?.min(64 << 20);
    let reference = buffered(dev, 0, size as usize)?;
    // With GDIRECT_GATE=PATH: say PATH.ready once set up, and start when PATH.go exists, so
    // that faults injected from then on hit only the reads.
    if let Some(gate) = std::env::var_os("GDIRECT_GATE") {
        let gate = std::path::PathBuf::from(gate);
        let _ = std::fs::write(gate.with_extension("ready"), b"");
        while !gate.with_extension("go").exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    let mut rng = Rng(seed | 1);
    let (mut ok, mut failed, mut partial, mut mismatches) = (0u64, 0u64, 0u64, 0u64);
    let mut errnos: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut got = vec![0u8; LEN as usize];
    let mut judge = |r: Result<u64, Errno>,
                     alloc: &EgpuAllocation,
                     buf: u64,
                     off: u64,
                     len: u64,
                     got: &mut Vec<u8>| match r {
        Ok(n) if n == len => {
            let view = &mut got[..len as usize];
            let same = alloc.read(buf, view).is_ok()
                && *view == reference[off as usize..(off + len) as usize];
            if same {
                ok += 1;
            } else {
                mismatches += 1;
                println!("FAIL: {len} bytes at {off} read, but not the device's");
            }
        }
        Ok(n) => {
            partial += 1;
            println!("FAIL: a read of {len} at {off} reported {n} bytes: partial success");
        }
        Err(e) => {
            failed += 1;
            *errnos.entry(format!("{e:?}")).or_default() += 1;
        }
    };
    let mut i = 0;
    while i < count {
        let opts = IoOptions::new().force_bounce(rng.below(2) == 0);
        if rng.below(2) == 0 {
            let len = (1 + rng.below(256)) * 4096;
            let off = rng.below((size - len) / 4096 + 1) * 4096;
            let buf = rng.below((LEN - len) / 4096 + 1) * 4096;
            alloc.write(buf, &poison[..len as usize])?;
            let r = file
                .read_into_with(&reg, buf, off, len, opts)
                .map(|t| t.bytes)
                .map_err(|e| e.errno().unwrap_or(Errno::EIO));
            judge(r, &alloc, buf, off, len, &mut got);
            i += 1;
        } else {
            // A batch of up to 8 reads into disjoint 1 MiB slots.
            let n = (1 + rng.below(8)).min(count - i);
            let mut b = Batch::new();
            let mut want = Vec::new();
            for k in 0..n {
                let len = (1 + rng.below(256)) * 4096;
                let off = rng.below((size - len) / 4096 + 1) * 4096;
                alloc.write(k * (1 << 20), &poison[..len as usize])?;
                b.push(0, &file, &reg, k * (1 << 20), off, len, k, opts);
                want.push((k * (1 << 20), off, len));
            }
            let (mut submitted, mut reaped, mut refused) = (0, 0, false);
            while reaped < submitted || (!refused && submitted < b.len()) {
                if !refused && submitted < b.len() {
                    match driver.submit(&b, submitted) {
                        Ok(m) => submitted += m,
                        Err(e) => {
                            // The rest of the batch was refused: each one a failure.
                            for _ in submitted..b.len() {
                                let e = Err(e.errno().unwrap_or(Errno::EIO));
                                judge(e, &alloc, 0, 0, 0, &mut got);
                            }
                            refused = true;
                        }
                    }
                }
                if reaped < submitted {
                    for c in driver.reap(8, true)? {
                        reaped += 1;
                        let (buf, off, len) = want[c.user_data as usize];
                        judge(c.result.map(|t| t.bytes), &alloc, buf, off, len, &mut got);
                    }
                }
            }
            i += n;
        }
    }
    let errs: Vec<String> = errnos.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!(
        "ops={count} ok={ok} failed={failed} partial={partial} mismatches={mismatches} errnos={}",
        if errs.is_empty() {
            "none".into()
        } else {
            errs.join(",")
        }
    );
    check("no partial success", partial == 0, || format!("{partial}"));
    check("no wrong byte", mismatches == 0, || format!("{mismatches}"));
    Ok(())
}

fn allocfail(count: u64, dev: &str) -> gdirect::Result<()> {
    const LEN: u64 = 1 << 20;
    let reference = buffered(dev, 0, LEN as usize)?;
    let gpu = Egpu::open()?;
    let mut tally: std::collections::BTreeMap<(&str, String), u64> =
        std::collections::BTreeMap::new();
    let mut note = |step: &'static str, r: Result<(), Errno>| {
        let o = r.map_or_else(|e| format!("{e:?}"), |()| "OK".into());
        *tally.entry((step, o)).or_default() += 1;
    };
    let errno = |e: Error| e.errno().unwrap_or(Errno::EIO);
    let mut mismatches = 0u64;
    let mut partial = 0u64;
    let mut got = vec![0u8; LEN as usize];
    let poison: Vec<u8> = reference.iter().map(|b| !b).collect();
    for _ in 0..count {
        let driver = match Driver::open() {
            Ok(d) => d,
            Err(e) => {
                note("open", Err(errno(e)));
                continue;
            }
        };
        note("open", Ok(()));
        let host = gdirect::HostBuffer::new(1 << 16)?;
        match driver.register(&host) {
            Ok(r) => {
                note("register_host", Ok(()));
                note("unregister", r.unregister().map_err(errno));
            }
            Err(e) => note("register_host", Err(errno(e))),
        }
        let mut alloc = gpu.alloc(LEN)?;
        // Poisoned before every round: a read that moved nothing cannot pass on the bytes an
        // earlier round left where this allocation lies.
        alloc.write(0, &poison)?;
        let reg = match driver.register(&alloc) {
            Ok(r) => r,
            Err(e) => {
                note("register_gpu", Err(errno(e)));
                continue;
            }
        };
        note("register_gpu", Ok(()));
        note(
            "query",
            reg.query(gdirect::PciAddress {
                domain: 0,
                bus: 3,
                device: 0,
                function: 0,
            })
            .map(|_| ())
            .map_err(errno),
        );
        match File::open_direct(dev).map_err(errno) {
            Err(e) => note("read", Err(e)),
            Ok(file) => {
                let bounce = got[0] & 1 == 0;
                match file.read_into_with(&reg, 0, 0, LEN, IoOptions::new().force_bounce(bounce)) {
                    Ok(t) if t.bytes == LEN => {
                        alloc.read(0, &mut got)?;
                        if got != reference {
                            mismatches += 1;
                        }
                        note("read", Ok(()));
                    }
                    Ok(_) => partial += 1,
                    Err(e) => note("read", Err(errno(e))),
                }
                let mut b = Batch::new();
                for k in 0..4 {
                    b.read(&file, &reg, k * 65536, k * 65536, 65536, k);
                }
                match driver.submit(&b, 0) {
                    Err(e) => note("submit", Err(errno(e))),
                    Ok(n) => {
                        note("submit", Ok(()));
                        let mut reaped = 0;
                        while reaped < n {
                            match driver.reap(4, true) {
                                Ok(cs) => {
                                    for c in cs {
                                        reaped += 1;
                                        match c.result {
                                            Ok(t) if t.bytes == 65536 => note("batch_read", Ok(())),
                                            Ok(_) => partial += 1,
                                            Err(e) => note("batch_read", Err(e)),
                                        }
                                    }
                                }
                                Err(e) => {
                                    note("reap", Err(errno(e)));
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
        drop(reg);
        drop(alloc);
        drop(driver);
    }
    let t: Vec<String> = tally
        .iter()
        .map(|((s, o), n)| format!("{s}:{o}:{n}"))
        .collect();
    println!("rounds={count} partial={partial} mismatches={mismatches}");
    println!("outcomes={}", t.join(","));
    check("no partial success", partial == 0, || format!("{partial}"));
    check("no wrong byte", mismatches == 0, || format!("{mismatches}"));
    Ok(())
}

fn revclose(count: u64, dev: &str) -> gdirect::Result<()> {
    const LEN: u64 = 256 << 10;
    let gpu = Egpu::open()?;
    let file = File::open_direct(dev)?;
    let mut submitted_total = 0;
    for _ in 0..count {
        let driver = Driver::open()?;
        let alloc = gpu.alloc(32 * LEN)?;
        let va = alloc.va();
        // By range: the registration must not borrow the allocation freed below.
        // SAFETY: the free below goes through the GPU driver, which revokes the registration
        // before the memory goes; no Rust reference to the memory exists.
        let reg = unsafe {
            driver.register_range(
                gdirect::Provider::Nvidia,
                va,
                32 * LEN,
                gdirect::RegisterOptions::new(),
            )
        }?;
        let mut b = Batch::new();
        for i in 0..32 {
            b.read(&file, &reg, i * LEN, i * LEN, LEN, i);
        }
        submitted_total += driver.submit(&b, 0)?;
        // The registration and the file go while the reads are in flight, racing the free.
        std::mem::forget(reg);
        std::thread::scope(|s| {
            s.spawn(|| gpu.free_va(va));
            s.spawn(move || drop(driver));
        });
        std::mem::forget(alloc);
    }
    println!("rounds={count} submitted={submitted_total}");
    Ok(())
}

/// The module's code: from its text base (`/proc/modules`) to the page after its last code
/// symbol (`/proc/kallsyms`). Its size in `/proc/modules` counts data too, which lies elsewhere:
/// base + size may run into another module's code. Code is allocated in whole pages, so no
/// other module's code shares the last page.
fn module_text_range(name: &str) -> Option<(u64, u64)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let modules = std::fs::read_to_string("/proc/modules").ok()?;
    let base = modules
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name))
        .and_then(|f| f.get(5).and_then(|a| hex(a)))
        .filter(|&b| b != 0)?;
    let tag = format!("[{name}]");
    let syms = std::fs::read_to_string("/proc/kallsyms").ok()?;
    let last = syms
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 4 && f[3] == tag && matches!(f[1], "t" | "T"))
        .filter_map(|f| hex(f[0]))
        .filter(|&a| a >= base)
        .max()?;
    Some((base, (last | 0xfff) + 1))
}
