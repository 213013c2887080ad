// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-fuzz`: a seeded, reproducible ioctl fuzzer for `/dev/gdirect`.
//!
//! Several threads send random commands — every defined one, undefined numbers, wrong sizes
//! and directions — with arguments drawn from pools of interesting values: handles that are
//! live, freed or made up; offsets and lengths at and around the edges; pointers that are NULL,
//! unmapped, read-only, kernel addresses, straddling a page end, or inside a scratch arena;
//! file descriptors that are closed, of the wrong type, not `O_DIRECT`, read-only or the
//! device itself; and another process's descriptor number, handles and host and GPU memory
//! (a helper child registers them and waits), which must never work from here. Valid operations are interleaved (registrations of host and emulated-GPU
//! memory, reads, batches, frees of registered GPU memory, files closed with registrations
//! alive). Afterwards every descriptor is closed and the module must report nothing
//! registered and nothing pinned.
//!
//! All memory the module may write to (registered buffers, query and completion arrays) lies
//! in the scratch arena, so the fuzzer cannot corrupt itself whatever the module is told.
//!
//! `--checked` runs the deterministic mode instead (one thread, an expected result for every
//! call, data checked; see `fuzz_checked.rs`): the same seed makes the same calls, and the
//! digest it prints must be the same.
//!
//! Usage: gdirect-fuzz [--checked] [--seed N] [--calls N] [--threads N] [--device PATH]
//!                     [--read-file PATH] [--rw-file PATH]
//!        (gdirect-fuzz --foreign-helper DEVICE is the helper child, run by the fuzzer itself)
//! Prints the seed first, a histogram of outcomes per command last.
//! Exit status: 0 when the invariants held, 1 when not, 2 on a usage or setup error.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    os::{
        fd::{AsRawFd, IntoRawFd, RawFd},
        unix::fs::OpenOptionsExt,
    },
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use gdirect::{raw, Driver};
use gdirect_internals::egpu::Egpu;
use nix::libc;

#[path = "fuzz_checked.rs"]
mod checked;
mod commands;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const ARENA: usize = 8 << 20;
const PAGE: usize = 4096;

/// The memory the fuzzer lets the module see: an arena it may write, a read-only page and an
/// unmapped one.
struct Memory {
    arena: usize,
    readonly: usize,
    unmapped: usize,
}

impl Memory {
    fn new() -> Option<Self> {
        // SAFETY: new anonymous mappings; nothing else refers to them.
        unsafe {
            let map = |len: usize| {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                (p != libc::MAP_FAILED).then_some(p as usize)
            };
            let arena = map(ARENA)?;
            let ro = map(2 * PAGE)?;
            libc::mprotect(ro as *mut _, PAGE, libc::PROT_READ);
            libc::munmap((ro + PAGE) as *mut _, PAGE);
            Some(Self {
                arena,
                readonly: ro,
                unmapped: ro + PAGE,
            })
        }
    }

    /// A pointer the module may be given: into the arena (maybe straddling its end), or one it
    /// must refuse.
    fn ptr(&self, rng: &mut Rng) -> u64 {
        match rng.below(10) {
            0 => 0,
            1 => self.unmapped as u64,
            2 => self.readonly as u64,
            3 => 0xffff_8880_0000_0000 + rng.below(1 << 30),
            4 => (self.readonly + PAGE - 8) as u64,
            5 => rng.next() | (1 << 63),
            _ => (self.arena + rng.below((ARENA - PAGE) as u64) as usize) as u64,
        }
    }

    /// An address for REGISTER: page-aligned in the arena mostly, edges otherwise.
    fn reg_addr(&self, rng: &mut Rng, gpu: &[u64]) -> u64 {
        match rng.below(10) {
            0..=3 => (self.arena + (rng.below((ARENA / PAGE) as u64 - 16) as usize) * PAGE) as u64,
            4 | 5 if !gpu.is_empty() => rng.pick(gpu) + rng.below(4) * 65536,
            6 => self.ptr(rng),
            7 => self.arena as u64 + rng.below(PAGE as u64),
            _ => rng.pick(&[0, 4096, u64::MAX - 4095, 1 << 47, self.readonly as u64]),
        }
    }
}

/// Shared state: the device path, files for I/O, live handles and GPU allocations.
struct World {
    device: String,
    mem: Memory,
    fds: Vec<RawFd>,
    handles: Mutex<Vec<u64>>,
    egpu: Option<Arc<Egpu>>,
    gpu_vas: Mutex<Vec<u64>>,
    outcomes: Mutex<BTreeMap<(String, String), u64>>,
    calls: AtomicU64,
    foreign: Option<ForeignRefs>,
    /// Calls that used another process's handle or memory and succeeded: must stay 0.
    foreign_breaches: AtomicU64,
}

/// Room for any command's argument struct (the kernel copies the command's size both ways).
/// (256 bytes until GET_STATS, whose 1216 or 1224 bytes the module would have written past it
/// had a fuzzed GET_STATS ever been well-formed.)
const ARGS_MAX: usize = 2048;
const _: () = assert!(
    size_of::<raw::gdirect_register_args>() <= ARGS_MAX
        && size_of::<raw::gdirect_io_args>() <= ARGS_MAX
        && size_of::<raw::gdirect_unregister_args>() <= ARGS_MAX
        && size_of::<raw::gdirect_stats_args>() <= ARGS_MAX
        && size_of::<raw::gdirect_stats_args_v1>() <= ARGS_MAX
);

/// What the helper child owns: its descriptor number, registration handles, and the
/// addresses of the host and GPU memory it registered.
#[derive(Clone, Default)]
struct ForeignRefs {
    fd: RawFd,
    handles: Vec<u64>,
    host: u64,
    gpu: Option<u64>,
}

impl ForeignRefs {
    /// Parses the helper's line: `fd=N handles=H,H host=A gpu=V|none`.
    fn parse(line: &str) -> Option<Self> {
        let mut r = Self::default();
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "fd" => r.fd = v.parse().ok()?,
                "handles" => {
                    r.handles = v
                        .split(',')
                        .map(|h| h.parse().ok())
                        .collect::<Option<_>>()?
                }
                "host" => r.host = v.parse().ok()?,
                "gpu" => r.gpu = v.parse().ok(),
                _ => return None,
            }
        }
        (!r.handles.is_empty()).then_some(r)
    }
}

/// The helper child: opens the device, registers 64 KiB of its host memory and (with the
/// emulated GPU) 64 KiB of GPU memory, prints what the fuzzer may try, then holds them until
/// its stdin closes.
fn foreign_helper(device: &str) -> ExitCode {
    let Ok(dev) = OpenOptions::new().read(true).write(true).open(device) else {
        return ExitCode::from(2);
    };
    let register = |provider: u32, addr: u64| -> Option<u64> {
        let mut args = [0u8; ARGS_MAX];
        args[0..4].copy_from_slice(&provider.to_le_bytes());
        args[8..16].copy_from_slice(&addr.to_le_bytes());
        args[16..24].copy_from_slice(&65536u64.to_le_bytes());
        raw_ioctl(
            dev.as_raw_fd(),
            raw::GDIRECT_IOC_REGISTER as u64,
            args.as_mut_ptr() as u64,
        )
        .ok()?;
        Some(u64::from_le_bytes(args[24..32].try_into().ok()?))
    };
    let mem = Memory::new();
    let host = mem.as_ref().map_or(0, |m| m.arena as u64);
    let mut handles: Vec<u64> = register(0, host).into_iter().collect();
    let egpu = Egpu::open().ok();
    let gpu = egpu.as_ref().and_then(|e| e.alloc(65536).ok());
    let gpu_va = gpu.as_ref().map(gdirect::DeviceMemory::device_address);
    if let Some(h) = gpu_va.and_then(|va| register(1, va)) {
        handles.push(h);
    }
    if handles.is_empty() {
        return ExitCode::from(2);
    }
    let list: Vec<String> = handles.iter().map(u64::to_string).collect();
    println!(
        "fd={} handles={} host={host} gpu={}",
        dev.as_raw_fd(),
        list.join(","),
        gpu_va.map_or("none".into(), |v| v.to_string())
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(gpu);
    ExitCode::SUCCESS
}

fn ioc_size(code: u32) -> usize {
    ((code >> 16) & 0x3fff) as usize
}

impl World {
    fn fd(&self, rng: &mut Rng, dev: RawFd) -> u64 {
        let v = match rng.below(10) {
            0 => -1,
            1 => dev,
            2 => 1 << 20,
            3 => 999,
            4 => self.foreign.as_ref().map_or(dev, |f| f.fd),
            _ => rng.pick(&self.fds),
        };
        v as u32 as u64
    }

    fn handle(&self, rng: &mut Rng) -> u64 {
        let live = self.handles.lock().map(|h| h.clone()).unwrap_or_default();
        if let Some(f) = self.foreign.as_ref().filter(|_| rng.chance(5)) {
            return rng.pick(&f.handles);
        }
        match rng.below(10) {
            0..=5 if !live.is_empty() => rng.pick(&live),
            6 if !live.is_empty() => rng.pick(&live) ^ (1 << rng.below(64)),
            7 => 0,
            8 => u64::MAX,
            _ => rng.next(),
        }
    }

    fn len(rng: &mut Rng) -> u64 {
        match rng.below(12) {
            0 => 0,
            1 => 1,
            2 => 4096,
            3 => 65536,
            4 => 1 << 20,
            5 => 512,
            6 => u64::MAX,
            7 => u64::MAX - 4095,
            8 => rng.below(1 << 22),
            9 => 1 << 40,
            _ => (1 + rng.below(64)) * 4096,
        }
    }

    fn offset(rng: &mut Rng) -> u64 {
        match rng.below(8) {
            0 => 0,
            1 => rng.below(64) * 4096,
            2 => rng.below(1 << 28),
            3 => u64::MAX - rng.below(8192),
            4 => 1 << 62,
            _ => rng.below(256) * 65536,
        }
    }

    fn word(rng: &mut Rng, zero_pct: u64) -> u64 {
        if rng.chance(zero_pct) {
            0
        } else {
            1 << rng.below(64)
        }
    }

    /// Fills the argument buffer of `name` with values from the pools; fields at their
    /// offsets in the header's structs.
    fn fill(&self, rng: &mut Rng, name: &str, buf: &mut [u8], dev: RawFd) {
        let put64 = |b: &mut [u8], at: usize, v: u64| {
            if let Some(s) = b.get_mut(at..at + 8) {
                s.copy_from_slice(&v.to_le_bytes());
            }
        };
        let put32 = |b: &mut [u8], at: usize, v: u32| {
            if let Some(s) = b.get_mut(at..at + 4) {
                s.copy_from_slice(&v.to_le_bytes());
            }
        };
        // Start from zeros or noise.
        if rng.chance(15) {
            buf.iter_mut().for_each(|b| *b = rng.next() as u8);
        } else {
            buf.fill(0);
        }
        let gpu = self.gpu_vas.lock().map(|v| v.clone()).unwrap_or_default();
        match name {
            "REGISTER" => {
                let provider = rng.pick(&[0u32, 0, 0, 1, 1, 2, 3, 99]);
                put32(buf, 0, provider);
                put32(buf, 4, Self::word(rng, 85) as u32);
                let addr = self.mem.reg_addr(rng, &gpu);
                put64(buf, 8, addr);
                let len = if rng.chance(60) {
                    (1 + rng.below(32)) * 65536
                } else {
                    Self::len(rng)
                };
                put64(buf, 16, len);
            }
            "UNREGISTER" => {
                put64(buf, 0, self.handle(rng));
                put32(buf, 8, Self::word(rng, 90) as u32);
            }
            "QUERY" => {
                put64(buf, 0, self.handle(rng));
                put32(buf, 8, rng.pick(&[0u32, 0, 0xffff, 1]));
                put32(
                    buf,
                    12,
                    rng.pick(&[0x300u32, 0x400, 0x500, 0, 0xffff, 0x1_0000]),
                );
                put64(buf, 16, Self::offset(rng) / 4096);
                put64(buf, 24, self.mem.ptr(rng));
                put32(buf, 32, rng.pick(&[0u32, 1, 16, 1024, u32::MAX]));
                put32(buf, 36, Self::word(rng, 90) as u32);
            }
            "READ" | "WRITE" if rng.chance(30) => {
                // Well-formed: a live handle, an aligned range the file holds, the read file.
                let live = self.handles.lock().map(|h| h.clone()).unwrap_or_default();
                put64(buf, 0, if live.is_empty() { 0 } else { rng.pick(&live) });
                put64(buf, 8, rng.below(16) * 4096);
                put64(buf, 16, rng.below(4096) * 4096);
                put64(buf, 24, (1 + rng.below(12)) * 4096);
                put32(buf, 32, self.fds.first().copied().unwrap_or(-1) as u32);
            }
            "READ" | "WRITE" => {
                put64(buf, 0, self.handle(rng));
                put64(buf, 8, Self::offset(rng) % (1 << 21));
                put64(buf, 16, Self::offset(rng));
                put64(buf, 24, Self::len(rng) % (1 << 21));
                put32(buf, 32, self.fd(rng, dev) as u32);
                put32(buf, 36, Self::word(rng, 70) as u32 & 3);
            }
            "SUBMIT" => {
                let valid = rng.chance(30);
                let count = if valid {
                    1 + rng.below(8) as u32
                } else {
                    rng.pick(&[0u32, 1, 2, 8, 32, 256, 257])
                };
                let sqes = if valid {
                    (self.mem.arena + ARENA - 64 * PAGE + rng.below(32) as usize * 64) as u64
                } else {
                    self.mem.ptr(rng)
                };
                // Write sqes into the arena where the pointer lands there.
                if sqes >= self.mem.arena as u64
                    && sqes + 64 * count as u64 <= (self.mem.arena + ARENA) as u64
                {
                    for i in 0..count.min(64) as u64 {
                        let at = (sqes + 64 * i) as *mut u8;
                        let mut sqe = [0u8; 64];
                        if valid {
                            let live = self.handles.lock().map(|h| h.clone()).unwrap_or_default();
                            put64(
                                &mut sqe,
                                8,
                                if live.is_empty() { 0 } else { rng.pick(&live) },
                            );
                            put64(&mut sqe, 16, rng.below(16) * 4096);
                            put64(&mut sqe, 24, rng.below(4096) * 4096);
                            put64(&mut sqe, 32, (1 + rng.below(12)) * 4096);
                            put32(&mut sqe, 40, self.fds.first().copied().unwrap_or(-1) as u32);
                        } else {
                            put32(&mut sqe, 0, rng.pick(&[0u32, 1, 2]));
                            put32(&mut sqe, 4, Self::word(rng, 80) as u32 & 3);
                            put64(&mut sqe, 8, self.handle(rng));
                            put64(&mut sqe, 16, Self::offset(rng) % (1 << 21));
                            put64(&mut sqe, 24, Self::offset(rng));
                            put64(&mut sqe, 32, Self::len(rng) % (1 << 20));
                            put32(&mut sqe, 40, self.fd(rng, dev) as u32);
                        }
                        put64(&mut sqe, 48, rng.next());
                        // SAFETY: 64 bytes inside the arena (checked above), which only this
                        // program and the module touch.
                        unsafe { std::ptr::copy_nonoverlapping(sqe.as_ptr(), at, 64) };
                    }
                }
                put64(buf, 0, sqes);
                put32(buf, 8, count);
                put32(buf, 12, Self::word(rng, 90) as u32);
            }
            "REAP" => {
                put64(buf, 0, self.mem.ptr(rng));
                put32(buf, 8, rng.pick(&[0u32, 1, 16, 256, u32::MAX]));
                put32(buf, 12, rng.pick(&[0u32, 0, 1, 2, 0x80]));
            }
            "SET_EVENTFD" => {
                put32(buf, 0, self.fd(rng, dev) as u32);
                put32(buf, 4, Self::word(rng, 90) as u32);
            }
            "PEER_CHECK" => {
                for at in [0usize, 8] {
                    put32(buf, at, rng.pick(&[0u32, 0, 1, 0xffff]));
                    put32(
                        buf,
                        at + 4,
                        rng.pick(&[0u32, 0x300, 0x400, 0x500, 0x10, 0x1_0000]),
                    );
                }
                put32(buf, 16, Self::word(rng, 90) as u32);
            }
            _ => {
                put32(buf, 0, Self::word(rng, 90) as u32);
            }
        }
    }

    fn record(&self, name: &str, r: Result<i32, nix::errno::Errno>) {
        let outcome = match r {
            Ok(_) => "OK".to_string(),
            Err(e) => format!("{e:?}"),
        };
        if let Ok(mut o) = self.outcomes.lock() {
            *o.entry((name.to_string(), outcome)).or_default() += 1;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

fn raw_ioctl(fd: RawFd, code: u64, arg: u64) -> Result<i32, nix::errno::Errno> {
    // SAFETY: the argument is a buffer of the code's size on our stack, or a pointer the
    // module must validate (NULL, unmapped, read-only, kernel, or inside the arena, which the
    // module may write).
    let r = unsafe { libc::ioctl(fd, code as _, arg as usize) };
    if r < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(r)
    }
}

/// One fuzzing thread.
fn worker(world: &World, seed: u64, calls: u64) {
    let mut rng = Rng(seed);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&world.device)
            .map(|f| f.into_raw_fd())
            .unwrap_or(-1)
    };
    let mut dev = open();
    let mut buf = [0u8; 2048];
    for _ in 0..calls {
        let roll = rng.below(100);
        if roll < 2 {
            // Close with whatever is registered and in flight, and start again.
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(dev) };
            if let Ok(mut h) = world.handles.lock() {
                h.retain(|_| rng.chance(50));
            }
            dev = open();
            world.record("reopen", Ok(0));
            continue;
        }
        if roll < 4 {
            if let Some(egpu) = &world.egpu {
                let mut vas = world.gpu_vas.lock().unwrap_or_else(|e| e.into_inner());
                if !vas.is_empty() && (vas.len() >= 8 || rng.chance(50)) {
                    // Free GPU memory that may be registered (revocation) by another thread.
                    let i = rng.below(vas.len() as u64) as usize;
                    let va = vas.swap_remove(i);
                    world.record(
                        "egpu_free",
                        egpu.free_va(va)
                            .map(|_| 0)
                            .map_err(|e| e.errno().unwrap_or(nix::errno::Errno::EIO)),
                    );
                } else {
                    match egpu.alloc((1 + rng.below(4)) * 65536) {
                        Ok(a) => {
                            vas.push(gdirect::DeviceMemory::device_address(&a));
                            // Keep it allocated until freed above (or the handle closes).
                            std::mem::forget(a);
                            world.record("egpu_alloc", Ok(0));
                        }
                        Err(e) => world.record(
                            "egpu_alloc",
                            Err(e.errno().unwrap_or(nix::errno::Errno::EIO)),
                        ),
                    }
                }
                continue;
            }
        }
        if roll < 6 {
            if let Some(f) = &world.foreign {
                foreign_op(world, f, &mut rng, dev);
                continue;
            }
        }
        let (name, code) = if rng.chance(92) {
            rng.pick(&commands::ALL)
        } else {
            // Undefined numbers, wrong sizes and directions, other types.
            let (n, c) = rng.pick(&commands::ALL);
            let bad = match rng.below(4) {
                0 => (c & !0xff) | (0x0b + rng.below(0xf0)) as u32,
                1 => c ^ (1 << (16 + rng.below(14))),
                2 => c ^ (1 << 30),
                _ => c ^ (1 << 8),
            };
            let _ = n;
            ("BAD_CODE", bad)
        };
        let size = ioc_size(code).min(buf.len());
        world.fill(&mut rng, name, &mut buf[..size], dev);
        let arg = if rng.chance(5) {
            world.mem.ptr(&mut rng)
        } else {
            buf.as_mut_ptr() as u64
        };
        let r = raw_ioctl(dev, code as u64, arg);
        if name == "REGISTER" && r.is_ok() && arg == buf.as_mut_ptr() as u64 {
            let handle = u64::from_le_bytes(buf[24..32].try_into().unwrap_or([0; 8]));
            if let Ok(mut h) = world.handles.lock() {
                h.push(handle);
                if h.len() > 256 {
                    h.remove(0);
                }
            }
        }
        world.record(name, r);
    }
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(dev) };
}

/// One use of the helper child's handles or memory through our own descriptor: unregistering
/// or reading through its handle and registering its GPU memory must fail; its host address
/// is tried too (it may happen to be mapped here, as our own memory).
fn foreign_op(world: &World, f: &ForeignRefs, rng: &mut Rng, dev: RawFd) {
    let mut buf = [0u8; ARGS_MAX];
    let put = |b: &mut [u8], at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    let handle = rng.pick(&f.handles);
    let (name, code, must_fail) = match rng.below(4) {
        0 => {
            put(&mut buf, 0, &handle.to_le_bytes());
            ("foreign_unregister", raw::GDIRECT_IOC_UNREGISTER, true)
        }
        1 => {
            put(&mut buf, 0, &handle.to_le_bytes());
            put(&mut buf, 24, &4096u64.to_le_bytes());
            put(
                &mut buf,
                32,
                &world.fds.first().copied().unwrap_or(-1).to_le_bytes(),
            );
            ("foreign_read", raw::GDIRECT_IOC_READ, true)
        }
        2 if f.gpu.is_some() => {
            put(&mut buf, 0, &1u32.to_le_bytes());
            put(&mut buf, 8, &f.gpu.unwrap_or(0).to_le_bytes());
            put(&mut buf, 16, &65536u64.to_le_bytes());
            ("foreign_gpu_reg", raw::GDIRECT_IOC_REGISTER, true)
        }
        _ => {
            put(&mut buf, 8, &f.host.to_le_bytes());
            put(&mut buf, 16, &65536u64.to_le_bytes());
            ("foreign_host_reg", raw::GDIRECT_IOC_REGISTER, false)
        }
    };
    let r = raw_ioctl(dev, code as u64, buf.as_mut_ptr() as u64);
    if r.is_ok() && must_fail {
        world.foreign_breaches.fetch_add(1, Ordering::Relaxed);
        println!("gdirect-fuzz: BREACH: {name} with the other process's handle {handle:#x} or memory succeeded");
    }
    if r.is_ok() && code == raw::GDIRECT_IOC_REGISTER {
        if let Ok(mut h) = world.handles.lock() {
            h.push(u64::from_le_bytes(buf[24..32].try_into().unwrap_or([0; 8])));
        }
    }
    world.record(name, r);
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--foreign-helper") {
        return foreign_helper(
            args.get(1)
                .map_or(gdirect::DEFAULT_DEVICE_PATH, String::as_str),
        );
    }
    let num = |name: &str, default: u64| -> Option<u64> {
        match arg(&args, name) {
            None => Some(default),
            Some(v) => v.parse().ok(),
        }
    };
    let seed_default = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let (Some(seed), Some(calls), Some(threads)) = (
        num("--seed", seed_default),
        num("--calls", 200_000),
        num("--threads", 4),
    ) else {
        eprintln!("usage: gdirect-fuzz [--seed N] [--calls N] [--threads N] [--device PATH] [--read-file PATH] [--rw-file PATH]");
        return ExitCode::from(2);
    };
    println!("gdirect-fuzz: seed {seed}, {calls} calls, {threads} threads");
    let device = arg(&args, "--device").unwrap_or_else(|| gdirect::DEFAULT_DEVICE_PATH.to_string());
    let Some(mem) = Memory::new() else {
        eprintln!("gdirect-fuzz: cannot map the arena");
        return ExitCode::from(2);
    };
    // Descriptors of every kind the I/O commands may be handed.
    let mut fds = Vec::new();
    let mut add = |f: std::io::Result<std::fs::File>| {
        if let Ok(f) = f {
            fds.push(f.into_raw_fd());
        }
    };
    if let Some(p) = arg(&args, "--read-file") {
        add(OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p));
        add(OpenOptions::new().read(true).open(&p));
    }
    if let Some(p) = arg(&args, "--rw-file") {
        add(OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p));
    }
    add(OpenOptions::new().read(true).write(true).open("/dev/null"));
    add(OpenOptions::new().read(true).open("/proc/self/stat"));
    // SAFETY: plain syscall; the descriptor is ours.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd >= 0 {
        fds.push(efd);
    }
    // A descriptor number that is closed by the time it is used.
    if let Ok(f) = OpenOptions::new().read(true).open("/dev/null") {
        let n = f.as_raw_fd();
        drop(f);
        fds.push(n);
    }
    // Another process's descriptor, handles and memory, held by a helper child until the end.
    let mut helper = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["--foreign-helper", &device])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
    });
    let foreign = helper.as_mut().ok().and_then(|c| {
        let mut line = String::new();
        let out = c.stdout.take()?;
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).ok()?;
        ForeignRefs::parse(&line)
    });
    let Some(foreign) = foreign else {
        eprintln!("gdirect-fuzz: the helper process could not register memory to try as foreign");
        return ExitCode::from(2);
    };
    println!(
        "gdirect-fuzz: another process holds fd {} with {} registration(s) (GPU memory: {})",
        foreign.fd,
        foreign.handles.len(),
        if foreign.gpu.is_some() { "yes" } else { "no" }
    );
    if args.iter().any(|a| a == "--checked") {
        let ok = checked::run(
            seed,
            calls,
            &device,
            &arg(&args, "--read-file").unwrap_or_default(),
            &arg(&args, "--rw-file").unwrap_or_default(),
            Some(foreign),
        );
        if let Ok(c) = helper.as_mut() {
            drop(c.stdin.take());
            let _ = c.wait();
        }
        return if ok && leftovers_ok(&device) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let world = World {
        device: device.clone(),
        mem,
        fds,
        handles: Mutex::new(Vec::new()),
        egpu: Egpu::open().ok(),
        gpu_vas: Mutex::new(Vec::new()),
        outcomes: Mutex::new(BTreeMap::new()),
        calls: AtomicU64::new(0),
        foreign: Some(foreign),
        foreign_breaches: AtomicU64::new(0),
    };
    println!(
        "gdirect-fuzz: emulated GPU {}",
        if world.egpu.is_some() {
            "present"
        } else {
            "absent"
        }
    );
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let world = &world;
            let per = calls / threads + u64::from(t < calls % threads);
            s.spawn(move || {
                worker(
                    world,
                    seed.wrapping_add(t.wrapping_mul(0x0010_0000_0001)),
                    per,
                )
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    // Free what is left of the GPU memory, then everything must be gone.
    if let Some(egpu) = &world.egpu {
        for va in world.gpu_vas.lock().map(|v| v.clone()).unwrap_or_default() {
            let _ = egpu.free_va(va);
        }
    }
    for (k, n) in world.outcomes.lock().map(|o| o.clone()).unwrap_or_default() {
        println!("  {:<12} {:<14} {n}", k.0, k.1);
    }
    let total = world.calls.load(Ordering::Relaxed);
    println!(
        "gdirect-fuzz: {total} calls in {secs:.1} s ({:.0}/s)",
        total as f64 / secs.max(1e-9)
    );
    // The helper lets go of its registrations when its stdin closes.
    if let Ok(c) = helper.as_mut() {
        drop(c.stdin.take());
        let _ = c.wait();
    }
    let breaches = world.foreign_breaches.load(Ordering::Relaxed);
    if breaches > 0 {
        println!(
            "gdirect-fuzz: {breaches} use(s) of another process's handles or memory succeeded"
        );
        return ExitCode::FAILURE;
    }
    if leftovers_ok(&device) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Once every descriptor is closed, nothing may stay registered or pinned.
fn leftovers_ok(device: &str) -> bool {
    match Driver::open_path(device).and_then(|d| d.info()) {
        Ok(i) if i.registrations == 0 && i.pinned_bytes == 0 => {
            println!("gdirect-fuzz: afterwards 0 registrations, 0 pinned bytes: ok");
            true
        }
        Ok(i) => {
            println!(
                "gdirect-fuzz: LEAK: {} registrations, {} pinned bytes after every descriptor closed",
                i.registrations, i.pinned_bytes
            );
            false
        }
        Err(e) => {
            println!("gdirect-fuzz: the module does not answer afterwards: {e}");
            false
        }
    }
}
