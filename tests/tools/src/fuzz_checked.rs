// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The checked mode of `gdirect-fuzz` (`--checked`): one thread, deterministic from the seed,
//! and every call with an expected result.
//!
//! Each call starts from a well-formed request (a registration the fuzzer knows the state of,
//! an aligned range inside it and inside the file, the right descriptor) and gets zero, one or
//! two faults from the argument classes below. The expected outcome is the union of the faults'
//! errnos as the uapi header documents them (plus the base request's own errno when its handle
//! is revoked, unregistered, unknown or another file's); with no fault and a live handle the
//! call must succeed, move exactly `len` bytes and, for host memory, deliver the file's bytes
//! (reads, into a poisoned buffer) or put them on the device (writes). Any success of a call
//! with a fault fails the run, as does any errno outside the expected set.
//!
//! Memory sits at fixed addresses and handles are chosen by index, never by value, so the same
//! seed makes the same calls with the same expectations: the run prints a digest of (call,
//! classes, outcome) that a replay must reproduce exactly.
//!
//! After the random calls come the host-memory events with I/O in flight: munmap,
//! `MADV_DONTNEED` and fork of registered memory while batched reads run into it. The
//! process's pinned memory (`VmPin`) must be back to its starting value at the end.

use std::{collections::BTreeSet, fmt::Write as _, os::unix::fs::FileExt};

use sha2::{Digest, Sha256};

use super::{ioc_size, raw_ioctl, ForeignRefs, Rng};
use gdirect::raw;
use gdirect_internals::egpu::Egpu;
use nix::{errno::Errno, libc};

const PAGE: u64 = 4096;
const GPU_PAGE: u64 = 65536;
/// Host memory the module may write: registrations live here (fixed address: a replay sees the
/// same layout).
const ARENA_AT: u64 = 0x6000_0000_0000;
const ARENA: u64 = 8 << 20;
/// Submission and completion arrays, after the arena.
const RINGS_AT: u64 = ARENA_AT + ARENA;
const RINGS: u64 = 64 * PAGE;
/// A read-only page and an unmapped one after it.
const RO_AT: u64 = RINGS_AT + RINGS;
const UNMAPPED_AT: u64 = RO_AT + PAGE;
/// The region the host-memory events map, unmap and fork (separate from the arena).
const EVENT_AT: u64 = 0x6100_0000_0000;
const EVENT_LEN: u64 = 1 << 20;
/// The live registrations kept at most (well below max_registrations).
const LIVE_MAX: usize = 24;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Live,
    Unregistered,
    Revoked,
}

struct Reg {
    handle: u64,
    /// Host: the arena address; GPU: the index of the allocation in `gpu`.
    host_addr: Option<u64>,
    gpu: Option<usize>,
    len: u64,
    state: State,
}

struct Gpu {
    va: u64,
    len: u64,
    freed: bool,
}

/// The expected outcome of one call.
#[derive(Default)]
struct Expect {
    classes: Vec<&'static str>,
    errnos: BTreeSet<i32>,
}

impl Expect {
    fn fault(&mut self, class: &'static str, errnos: &[Errno]) {
        self.classes.push(class);
        self.errnos.extend(errnos.iter().map(|e| *e as i32));
    }
    fn ok(&self) -> bool {
        self.errnos.is_empty()
    }
}

fn map_fixed(at: u64, len: u64, prot: i32) -> bool {
    // SAFETY: a new anonymous mapping at an address nothing else in this process uses
    // (MAP_FIXED_NOREPLACE fails rather than replace an existing mapping).
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            len as usize,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    p as u64 == at
}

/// `len` bytes of the process's memory at `at`, which this module mapped.
fn bytes(at: u64, len: u64) -> &'static mut [u8] {
    // SAFETY: every caller passes a range inside a mapping this module made and keeps; the
    // module under test writes it only during a call or a batch this thread waits for.
    unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len as usize) }
}

fn vm_pin_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmPin:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(u64::MAX)
}

struct Checked {
    rng: Rng,
    dev: i32,
    rd: std::fs::File,
    rw: std::fs::File,
    buffered: std::fs::File,
    devnull: std::fs::File,
    rd_size: u64,
    rw_size: u64,
    egpu: Option<std::sync::Arc<Egpu>>,
    regs: Vec<Reg>,
    gpu: Vec<Gpu>,
    foreign: Option<ForeignRefs>,
    calls: u64,
    mismatches: u64,
    digest: Sha256,
    bytes_checked: u64,
}

/// A descriptor number that is not open in this process.
const CLOSED_FD: i32 = 1000;

impl Checked {
    /// Records the outcome of call `what` against `expect`.
    fn judge(&mut self, what: &str, expect: &Expect, got: Result<(), Errno>) {
        self.calls += 1;
        let outcome = match got {
            Ok(()) => "OK".to_string(),
            Err(e) => format!("{e:?}"),
        };
        let _ = writeln!(
            DigestWriter(&mut self.digest),
            "{} {what} {} {outcome}",
            self.calls,
            expect.classes.join("+")
        );
        let fine = match got {
            Ok(()) => expect.ok(),
            Err(e) => expect.errnos.contains(&(e as i32)),
        };
        if !fine {
            self.mismatches += 1;
            if self.mismatches <= 30 {
                let want: Vec<String> = expect
                    .errnos
                    .iter()
                    .map(|e| format!("{:?}", Errno::from_raw(*e)))
                    .collect();
                println!(
                    "gdirect-fuzz: MISMATCH call {} {what} [{}]: expected {}, got {outcome}",
                    self.calls,
                    expect.classes.join("+"),
                    if want.is_empty() {
                        "success".to_string()
                    } else {
                        want.join("|")
                    }
                );
            }
        }
    }

    fn fail(&mut self, what: String) {
        self.mismatches += 1;
        if self.mismatches <= 30 {
            println!("gdirect-fuzz: MISMATCH call {}: {what}", self.calls);
        }
    }

    /// The fault classes of one call: none, or (with `percent` chance) one of `n`, and then
    /// (30%) a second, different one.
    fn faults(&mut self, percent: u64, n: u64) -> Vec<u64> {
        let k = if self.rng.chance(percent) {
            1 + u64::from(self.rng.chance(30))
        } else {
            0
        };
        self.distinct(k, n)
    }

    /// `k` (0 to 2) different fault classes of `n`: one class twice could undo itself (two
    /// half-page misalignments make an aligned address).
    fn distinct(&mut self, k: u64, n: u64) -> Vec<u64> {
        let first = self.rng.below(n);
        match k {
            0 => Vec::new(),
            1 => vec![first],
            _ => vec![first, (first + 1 + self.rng.below(n - 1)) % n],
        }
    }

    /// A registration by state, chosen by index: the base of a call on a handle.
    fn pick_reg(&mut self, state: State, host_only: bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.regs.len())
            .filter(|&i| {
                self.regs[i].state == state && (!host_only || self.regs[i].host_addr.is_some())
            })
            .collect();
        (!idx.is_empty()).then(|| idx[self.rng.below(idx.len() as u64) as usize])
    }

    /// A handle for UNREGISTER, READ, WRITE or a batch entry, with the errno its state gives.
    fn handle(&mut self, e: &mut Expect, host_only: bool) -> (u64, Option<usize>) {
        let roll = self.rng.below(100);
        if roll < 80 {
            if let Some(i) = self.pick_reg(State::Live, host_only) {
                return (self.regs[i].handle, Some(i));
            }
        }
        if roll < 86 {
            if let Some(i) = self.pick_reg(State::Revoked, false) {
                e.fault("revoked", &[Errno::EKEYREVOKED]);
                return (self.regs[i].handle, Some(i));
            }
        }
        if roll < 92 {
            if let Some(i) = self.pick_reg(State::Unregistered, false) {
                e.fault("unregistered", &[Errno::ESTALE]);
                return (self.regs[i].handle, Some(i));
            }
        }
        if roll < 96 {
            if let Some(f) = &self.foreign {
                let h = f.handles[self.rng.below(f.handles.len() as u64) as usize];
                e.fault("foreign_handle", &[Errno::EPERM]);
                return (h, None);
            }
        }
        // Made up. With this file's cookie (the high half of every handle it issued) and an
        // index it never used: ENOENT. With another cookie: EPERM, as for another file's.
        let index = 0x7fff_0000 + self.rng.below(0xffff);
        match self.regs.first().map(|r| r.handle >> 32) {
            Some(cookie) if self.rng.chance(60) => {
                e.fault("unknown_handle", &[Errno::ENOENT]);
                (cookie << 32 | index, None)
            }
            cookie => {
                e.fault("forged_handle", &[Errno::EPERM]);
                let mut other = self.rng.next() >> 32;
                if Some(other) == cookie {
                    other ^= 1;
                }
                (other << 32 | index, None)
            }
        }
    }

    fn register(&mut self) {
        let mut e = Expect::default();
        let mut a = raw::gdirect_register_args::default();
        let gpu_ok = self.egpu.is_some() && self.rng.chance(35);
        let mut gpu_index = None;
        if gpu_ok {
            let len = (1 + self.rng.below(4)) * GPU_PAGE;
            let Some(egpu) = &self.egpu else { return };
            match egpu.alloc(len) {
                Ok(alloc) => {
                    let va = alloc.va();
                    std::mem::forget(alloc);
                    self.gpu.push(Gpu {
                        va,
                        len,
                        freed: false,
                    });
                    gpu_index = Some(self.gpu.len() - 1);
                    a.provider = 1;
                    a.addr = va;
                    a.len = len;
                }
                Err(_) => return,
            }
        } else {
            let pages = 1 + self.rng.below(32);
            a.provider = 0;
            a.addr = ARENA_AT + self.rng.below(ARENA / PAGE - pages) * PAGE;
            a.len = pages * PAGE;
        }
        let align = if a.provider == 1 { GPU_PAGE } else { PAGE };
        for class in self.faults(45, 7) {
            match class {
                0 => {
                    // Bit 0 is PERSISTENT: defined for nvidia only.
                    let bit = if a.provider == 0 {
                        self.rng.below(32)
                    } else {
                        1 + self.rng.below(31)
                    };
                    a.flags |= 1 << bit;
                    e.fault("flags", &[Errno::EINVAL]);
                }
                1 => {
                    a.reserved[self.rng.below(2) as usize] = 1 + self.rng.below(1000);
                    e.fault("reserved", &[Errno::EINVAL]);
                }
                2 => {
                    a.len = 0;
                    e.fault("zero_len", &[Errno::EINVAL]);
                }
                3 => {
                    if self.rng.chance(50) {
                        a.addr += align / 2;
                    } else {
                        a.len += 512;
                    }
                    e.fault("misaligned", &[Errno::ERANGE]);
                }
                4 => {
                    a.addr = u64::MAX - GPU_PAGE + 1;
                    a.len = 2 * GPU_PAGE;
                    e.fault("overflow", &[Errno::EOVERFLOW]);
                }
                5 => {
                    a.provider = 7 + self.rng.below(100) as u32;
                    e.fault("provider", &[Errno::EPROTONOSUPPORT]);
                }
                _ => {
                    // Not memory of that provider: an unmapped host page, host memory as GPU
                    // memory, or host memory as P2PDMA memory.
                    match self.rng.below(3) {
                        0 if a.provider == 0 => a.addr = UNMAPPED_AT,
                        1 => {
                            a.provider = 1;
                            a.addr = ARENA_AT;
                            a.len = GPU_PAGE;
                        }
                        _ => {
                            a.provider = 2;
                            a.addr = ARENA_AT;
                            a.len = PAGE;
                        }
                    }
                    e.fault("not_provider_memory", &[Errno::ENXIO]);
                }
            }
        }
        let r = ioctl(self.dev, raw::GDIRECT_IOC_REGISTER, &mut a);
        self.judge("REGISTER", &e, r);
        if r.is_ok() {
            self.regs.push(Reg {
                handle: a.handle,
                host_addr: (a.provider == 0).then_some(a.addr),
                gpu: if a.provider == 1 { gpu_index } else { None },
                len: a.len,
                state: State::Live,
            });
        }
    }

    fn unregister(&mut self) {
        let mut e = Expect::default();
        let (handle, idx) = self.handle(&mut e, false);
        // Revoked registrations unregister fine: only UNREGISTER still works on them.
        if idx.is_some_and(|i| self.regs[i].state == State::Revoked) {
            e = Expect::default();
        }
        let mut a = raw::gdirect_unregister_args {
            handle,
            ..Default::default()
        };
        if self.rng.chance(15) {
            if self.rng.chance(50) {
                a.flags = 1 << self.rng.below(32);
            } else {
                a.pad = 1 + self.rng.below(100) as u32;
            }
            e.fault("flags_or_pad", &[Errno::EINVAL]);
        }
        let r = ioctl(self.dev, raw::GDIRECT_IOC_UNREGISTER, &mut a);
        self.judge("UNREGISTER", &e, r);
        if let (Ok(()), Some(i)) = (r, idx) {
            self.regs[i].state = State::Unregistered;
        }
    }

    /// A transfer (READ or WRITE) on a registration: fills the fields of `io`, returns the
    /// expectation and, when the transfer is well formed on host memory, where to check data.
    fn transfer(
        &mut self,
        write: bool,
        io: &mut raw::gdirect_io_args,
    ) -> (Expect, Option<(u64, u64)>) {
        let mut e = Expect::default();
        let (handle, idx) = self.handle(&mut e, false);
        let reg_len = idx.map_or(16 * PAGE, |i| self.regs[i].len);
        let from_rw = write || self.rng.chance(50);
        io.fd = if from_rw {
            self.rw.as_raw_fd()
        } else {
            self.rd.as_raw_fd()
        };
        let file_size = if from_rw { self.rw_size } else { self.rd_size };
        io.handle = handle;
        io.buf_offset = self.rng.below(reg_len / PAGE) * PAGE;
        io.len = (1 + self.rng.below((reg_len - io.buf_offset) / PAGE)) * PAGE;
        io.file_offset = self.rng.below((file_size - io.len) / PAGE) * PAGE;
        io.flags = u32::from(self.rng.chance(25));
        for class in self.faults(40, 8) {
            match class {
                0 => {
                    io.len = 0;
                    e.fault("zero_len", &[Errno::EINVAL]);
                }
                1 => {
                    io.flags |= 2 << self.rng.below(31);
                    e.fault("flags", &[Errno::EINVAL]);
                }
                2 => {
                    match self.rng.below(3) {
                        0 => io.file_offset += 100,
                        1 => io.buf_offset += 100,
                        _ => io.len += 100,
                    }
                    // Pushed past the registration's end, the range is also EOVERFLOW.
                    if io.buf_offset.saturating_add(io.len) > reg_len {
                        e.fault("misaligned", &[Errno::ERANGE, Errno::EOVERFLOW]);
                    } else {
                        e.fault("misaligned", &[Errno::ERANGE]);
                    }
                }
                3 => {
                    io.buf_offset = reg_len - PAGE;
                    io.len = 2 * PAGE;
                    e.fault("past_registration", &[Errno::EOVERFLOW]);
                }
                4 => {
                    io.fd = if self.rng.chance(50) { CLOSED_FD } else { -1 };
                    e.fault("fd_closed", &[Errno::EBADF]);
                }
                5 if write => {
                    io.fd = self.rd.as_raw_fd();
                    e.fault("fd_read_only", &[Errno::EBADF]);
                }
                6 => {
                    // Read-only as well: a write may be refused for that first.
                    io.fd = self.buffered.as_raw_fd();
                    e.fault(
                        "fd_not_direct",
                        if write {
                            &[Errno::EBADFD, Errno::EBADF]
                        } else {
                            &[Errno::EBADFD]
                        },
                    );
                }
                _ => {
                    io.fd = self.devnull.as_raw_fd();
                    e.fault("fd_not_block", &[Errno::EBADFD, Errno::ENOTBLK]);
                }
            }
        }
        let check = match (e.ok(), idx.and_then(|i| self.regs[i].host_addr)) {
            (true, Some(addr)) => Some((addr + io.buf_offset, io.len)),
            _ => None,
        };
        (e, check)
    }

    fn sync_io(&mut self) {
        let write = self.rng.chance(35);
        let mut io = raw::gdirect_io_args::default();
        let (e, check) = self.transfer(write, &mut io);
        let name = if write { "WRITE" } else { "READ" };
        if let (Some((at, len)), false) = (check, write) {
            // Poisoned, so that bytes the read did not deliver cannot pass.
            let seed = self.rng.next();
            for (i, b) in bytes(at, len).iter_mut().enumerate() {
                *b = (seed >> (8 * (i % 8))) as u8 ^ (i / 8) as u8;
            }
        }
        let code = if write {
            raw::GDIRECT_IOC_WRITE
        } else {
            raw::GDIRECT_IOC_READ
        };
        let r = ioctl(self.dev, code, &mut io);
        self.judge(name, &e, r);
        if r.is_ok() && e.ok() && io.bytes != io.len {
            self.fail(format!("{name} of {} bytes moved {}", io.len, io.bytes));
        }
        if let (Ok(()), Some((at, len))) = (r, check) {
            let file = if write || io.fd == self.rw.as_raw_fd() {
                &self.rw
            } else {
                &self.rd
            };
            if let Ok(f) = file.try_clone() {
                self.check_data(&f, io.file_offset, at, len, name);
            }
        }
    }

    /// The file's bytes at `offset` must equal memory at `at` (after a read into it or a write
    /// from it).
    fn check_data(&mut self, file: &std::fs::File, offset: u64, at: u64, len: u64, what: &str) {
        let mut want = vec![0u8; len as usize];
        if file.read_exact_at(&mut want, offset).is_err() {
            self.fail(format!("{what}: cannot read the file back at {offset}"));
            return;
        }
        self.bytes_checked += len;
        if bytes(at, len) != want.as_slice() {
            self.fail(format!(
                "{what}: memory and file differ over {len} bytes at file offset {offset}"
            ));
        }
    }

    fn batch(&mut self) {
        let count = 1 + self.rng.below(8) as usize;
        let sqes = bytes(RINGS_AT, RINGS / 2)
            .as_mut_ptr()
            .cast::<raw::gdirect_sqe>();
        let mut expects = Vec::with_capacity(count);
        for i in 0..count {
            let write = self.rng.chance(35);
            let mut io = raw::gdirect_io_args::default();
            let (e, check) = self.transfer(write, &mut io);
            let sqe = raw::gdirect_sqe {
                op: u32::from(write),
                flags: io.flags,
                handle: io.handle,
                buf_offset: io.buf_offset,
                file_offset: io.file_offset,
                len: io.len,
                fd: io.fd,
                user_data: i as u64,
                ..Default::default()
            };
            // SAFETY: `i < 8` entries of 64 bytes, inside the rings mapping.
            unsafe { sqes.add(i).write(sqe) };
            expects.push((e, check, write, io));
        }
        let mut s = raw::gdirect_submit_args {
            sqes: RINGS_AT,
            count: count as u32,
            ..Default::default()
        };
        let r = ioctl(self.dev, raw::GDIRECT_IOC_SUBMIT, &mut s);
        let queued = s.submitted as usize;
        // A failed SUBMIT names the malformed entry: its errno must be one it could get.
        let mut e = Expect::default();
        if let Err(errno) = r {
            if let Some((ee, ..)) = expects.get(queued) {
                if ee.errnos.contains(&(errno as i32)) {
                    e.classes = ee.classes.clone();
                    e.errnos = ee.errnos.clone();
                } else {
                    e.fault("entry", &[]);
                }
            }
        }
        self.judge("SUBMIT", &e, r.map(|_| ()));
        let queued = if r.is_ok() { count } else { queued.min(count) };
        if r.is_ok() && s.submitted as usize != count {
            self.fail(format!("SUBMIT of {count} queued {}", s.submitted));
        }
        // Reap every queued entry; each completes as its expectation says.
        let mut results: Vec<Option<i64>> = vec![None; count];
        for c in self.reap_all(queued, "batch") {
            if let Some(slot) = results.get_mut(c.user_data as usize) {
                *slot = Some(c.result);
            }
        }
        // Entries of one batch run concurrently: data is checked for an entry only when no
        // other entry writes its file range or its memory while it runs.
        let span = |x: &(Expect, Option<(u64, u64)>, bool, raw::gdirect_io_args)| {
            let rw = x.3.fd == self.rw.as_raw_fd();
            (rw, x.3.file_offset, x.3.file_offset + x.3.len, x.1, x.2)
        };
        let spans: Vec<_> = expects.iter().take(queued).map(span).collect();
        let overlap = |a: (u64, u64), b: (u64, u64)| a.0 < b.1 && b.0 < a.1;
        let alone: Vec<bool> = (0..spans.len())
            .map(|i| {
                let (rw_i, fs_i, fe_i, mem_i, w_i) = spans[i];
                spans
                    .iter()
                    .enumerate()
                    .all(|(j, &(rw_j, fs_j, fe_j, mem_j, w_j))| {
                        let file_clash =
                            rw_i && rw_j && overlap((fs_i, fe_i), (fs_j, fe_j)) && (w_i || w_j);
                        let mem_clash = match (mem_i, mem_j) {
                            (Some((a, la)), Some((b, lb))) => {
                                overlap((a, a + la), (b, b + lb)) && (!w_i || !w_j)
                            }
                            _ => false,
                        };
                        i == j || !(file_clash || mem_clash)
                    })
            })
            .collect();
        for (i, (e, check, write, io)) in expects.into_iter().enumerate().take(queued) {
            let got = match results[i] {
                Some(n) if n >= 0 => Ok(()),
                Some(n) => Err(Errno::from_raw(-n as i32)),
                None => {
                    self.fail(format!("batch entry {i} never completed"));
                    continue;
                }
            };
            let name = if write { "BATCH_WRITE" } else { "BATCH_READ" };
            self.judge(name, &e, got);
            if got.is_ok() && e.ok() && results[i] != Some(io.len as i64) {
                self.fail(format!("{name} of {} bytes moved {:?}", io.len, results[i]));
            }
            if let (Ok(()), Some((at, len)), true) = (got, check, alone[i]) {
                let file = if write || io.fd == self.rw.as_raw_fd() {
                    &self.rw
                } else {
                    &self.rd
                };
                if let Ok(f) = file.try_clone() {
                    self.check_data(&f, io.file_offset, at, len, name);
                }
            }
        }
    }

    /// Waits for `queued` completions (REAP with WAIT) and returns them.
    fn reap_all(&mut self, queued: usize, what: &str) -> Vec<raw::gdirect_cqe> {
        let cqes = (RINGS_AT + RINGS / 2) as *mut raw::gdirect_cqe;
        let mut out = Vec::with_capacity(queued);
        while out.len() < queued {
            let mut a = raw::gdirect_reap_args {
                cqes: cqes as u64,
                max: 16,
                flags: raw::GDIRECT_REAP_WAIT,
                ..Default::default()
            };
            let r = ioctl(self.dev, raw::GDIRECT_IOC_REAP, &mut a);
            if r.is_err() || a.reaped == 0 {
                self.fail(format!("{what}: REAP with completions due failed: {r:?}"));
                break;
            }
            for k in 0..a.reaped.min(16) as usize {
                // SAFETY: the module wrote `reaped` (at most `max`) completions into the rings
                // mapping, which holds 16 of them.
                out.push(unsafe { cqes.add(k).read() });
            }
        }
        out
    }

    /// Frees GPU memory, registered or not: its registrations are revoked.
    fn gpu_free(&mut self) {
        let live: Vec<usize> = (0..self.gpu.len())
            .filter(|&i| !self.gpu[i].freed)
            .collect();
        if live.is_empty() {
            return;
        }
        let i = live[self.rng.below(live.len() as u64) as usize];
        let Some(egpu) = &self.egpu else { return };
        let r = egpu
            .free_va(self.gpu[i].va)
            .map(|_| ())
            .map_err(|e| e.errno().unwrap_or(Errno::EIO));
        self.judge("GPU_FREE", &Expect::default(), r);
        self.gpu[i].freed = true;
        for reg in &mut self.regs {
            if reg.gpu == Some(i) && reg.state == State::Live {
                reg.state = State::Revoked;
            }
        }
    }

    /// Commands in general: undefined numbers, wrong sizes and directions, bad argument
    /// pointers, nonzero pad fields.
    fn malformed(&mut self) {
        let mut e = Expect::default();
        let codes = [
            raw::GDIRECT_IOC_GET_INFO,
            raw::GDIRECT_IOC_REGISTER,
            raw::GDIRECT_IOC_UNREGISTER,
            raw::GDIRECT_IOC_READ,
            raw::GDIRECT_IOC_SUBMIT,
            raw::GDIRECT_IOC_REAP,
        ];
        let mut code = codes[self.rng.below(codes.len() as u64) as usize];
        let mut buf = [0u8; 256];
        let mut bad_arg = None;
        match self.rng.below(6) {
            0 => {
                code = (code & !0xff) | (0x20 + self.rng.below(0xd0)) as u32;
                e.fault("unknown_number", &[Errno::ENOTTY]);
            }
            1 => {
                code ^= 0x1f << 8;
                e.fault("other_type", &[Errno::ENOTTY]);
            }
            2 => {
                code ^= 1 << (16 + self.rng.below(5));
                e.fault("wrong_size", &[Errno::EINVAL]);
            }
            3 => {
                code ^= 1 << 30;
                e.fault("wrong_direction", &[Errno::EINVAL]);
            }
            4 => {
                bad_arg = Some([0, UNMAPPED_AT, 0xffff_8880_0000_0000][self.rng.below(3) as usize]);
                e.fault("bad_pointer", &[Errno::EFAULT]);
            }
            _ => {
                // GET_INFO's pad and reserved fields.
                code = raw::GDIRECT_IOC_GET_INFO;
                let at = if self.rng.chance(50) {
                    4
                } else {
                    ioc_size(code) - 8
                };
                buf[at] = 1;
                e.fault("info_pad_or_reserved", &[Errno::EINVAL]);
            }
        }
        let arg = bad_arg.unwrap_or(buf.as_mut_ptr() as u64);
        let r = raw_ioctl(self.dev, u64::from(code), arg).map(|_| ());
        self.judge("MALFORMED", &e, r);
    }

    /// munmap, MADV_DONTNEED and fork of registered host memory with batched reads in flight.
    fn host_events(&mut self) {
        for event in ["munmap", "madv_dontneed", "fork"] {
            if !map_fixed(EVENT_AT, EVENT_LEN, libc::PROT_READ | libc::PROT_WRITE) {
                self.fail(format!("{event}: cannot map the event region"));
                return;
            }
            bytes(EVENT_AT, EVENT_LEN).fill(0x5a);
            let mut a = raw::gdirect_register_args {
                provider: 0,
                addr: EVENT_AT,
                len: EVENT_LEN,
                ..Default::default()
            };
            let r = ioctl(self.dev, raw::GDIRECT_IOC_REGISTER, &mut a);
            self.judge("EVENT_REGISTER", &Expect::default(), r);
            if r.is_err() {
                return;
            }
            let sqes = bytes(RINGS_AT, RINGS / 2)
                .as_mut_ptr()
                .cast::<raw::gdirect_sqe>();
            let n = 16u64;
            for i in 0..n {
                let sqe = raw::gdirect_sqe {
                    op: 0,
                    handle: a.handle,
                    buf_offset: i * (EVENT_LEN / n),
                    file_offset: (64 << 20) + i * (EVENT_LEN / n),
                    len: EVENT_LEN / n,
                    fd: self.rd.as_raw_fd(),
                    user_data: i,
                    ..Default::default()
                };
                // SAFETY: 16 entries of 64 bytes inside the rings mapping.
                unsafe { sqes.add(i as usize).write(sqe) };
            }
            let mut s = raw::gdirect_submit_args {
                sqes: RINGS_AT,
                count: n as u32,
                ..Default::default()
            };
            let r = ioctl(self.dev, raw::GDIRECT_IOC_SUBMIT, &mut s);
            self.judge("EVENT_SUBMIT", &Expect::default(), r);
            let mut child = 0;
            match event {
                "munmap" => {
                    // SAFETY: the event region, mapped above; nothing refers to it from here on.
                    unsafe { libc::munmap(EVENT_AT as *mut _, EVENT_LEN as usize) };
                }
                "madv_dontneed" => {
                    // SAFETY: as above; its contents may be dropped.
                    unsafe {
                        libc::madvise(EVENT_AT as *mut _, EVENT_LEN as usize, libc::MADV_DONTNEED)
                    };
                }
                _ => {
                    // SAFETY: the child only calls _exit.
                    child = unsafe { libc::fork() };
                    if child == 0 {
                        // SAFETY: async-signal-safe exit of the child.
                        unsafe { libc::_exit(0) };
                    }
                }
            }
            let queued = if r.is_ok() { s.submitted as usize } else { 0 };
            let ok = self
                .reap_all(queued, event)
                .iter()
                .filter(|c| c.result == (EVENT_LEN / n) as i64)
                .count() as u64;
            if child > 0 {
                let mut status = 0;
                // SAFETY: our child.
                unsafe { libc::waitpid(child, &mut status, 0) };
            }
            // Pinned pages stay the reads' destination whatever happened to the mapping: every
            // read completes. After fork the parent keeps the pinned pages, so it sees the data.
            if ok != n {
                self.fail(format!(
                    "{event}: {ok} of {n} reads in flight completed whole"
                ));
            }
            if event == "fork" {
                let rd = self.rd.try_clone().ok();
                if let Some(f) = rd {
                    self.check_data(
                        &f,
                        64 << 20,
                        EVENT_AT,
                        EVENT_LEN,
                        "read in flight across fork",
                    );
                }
            }
            let mut u = raw::gdirect_unregister_args {
                handle: a.handle,
                ..Default::default()
            };
            let r = ioctl(self.dev, raw::GDIRECT_IOC_UNREGISTER, &mut u);
            self.judge("EVENT_UNREGISTER", &Expect::default(), r);
            if event != "munmap" {
                // SAFETY: the event region, no longer registered.
                unsafe { libc::munmap(EVENT_AT as *mut _, EVENT_LEN as usize) };
            }
            println!("gdirect-fuzz: {event} with {n} reads in flight: {ok} completed whole");
        }
    }
}

use std::os::fd::AsRawFd;

/// One ioctl on `dev` with `arg` as its argument struct.
fn ioctl<T>(dev: i32, code: u32, arg: &mut T) -> Result<(), Errno> {
    raw_ioctl(dev, u64::from(code), std::ptr::from_mut(arg) as u64).map(|_| ())
}

/// Feeds `write!` into the digest.
struct DigestWriter<'a>(&'a mut Sha256);

impl std::fmt::Write for DigestWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

/// Runs `calls` checked calls from `seed`. Returns whether every expectation held.
pub(crate) fn run(
    seed: u64,
    calls: u64,
    device: &str,
    read_file: &str,
    rw_file: &str,
    foreign: Option<ForeignRefs>,
) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |p: &str, write: bool, direct: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(p)
    };
    let (Ok(rd), Ok(rw), Ok(buffered), Ok(devnull)) = (
        open(read_file, false, true),
        open(rw_file, true, true),
        open(read_file, false, false),
        open("/dev/null", true, false),
    ) else {
        println!("gdirect-fuzz: cannot open the files");
        return false;
    };
    let size = |f: &std::fs::File| {
        use std::io::Seek;
        f.try_clone()
            .ok()
            .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)).ok())
            .unwrap_or(0)
    };
    let (rd_size, rw_size) = (size(&rd), size(&rw));
    let rw_mem = libc::PROT_READ | libc::PROT_WRITE;
    if rd_size < (80 << 20)
        || rw_size < (16 << 20)
        || !map_fixed(ARENA_AT, ARENA, rw_mem)
        || !map_fixed(RINGS_AT, RINGS, rw_mem)
        || !map_fixed(RO_AT, PAGE, libc::PROT_READ)
    {
        println!(
            "gdirect-fuzz: cannot set up (files of {rd_size} and {rw_size} bytes, fixed mappings)"
        );
        return false;
    }
    let Ok(dev) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
    else {
        println!("gdirect-fuzz: cannot open {device}");
        return false;
    };
    let pinned_before = vm_pin_kb();
    let mut c = Checked {
        rng: Rng(seed),
        dev: dev.as_raw_fd(),
        rd,
        rw,
        buffered,
        devnull,
        rd_size,
        rw_size,
        egpu: Egpu::open().ok(),
        regs: Vec::new(),
        gpu: Vec::new(),
        foreign,
        calls: 0,
        mismatches: 0,
        digest: Sha256::new(),
        bytes_checked: 0,
    };
    let t0 = std::time::Instant::now();
    while c.calls < calls {
        // Revoked registrations hold their slot until unregistered: they count too.
        let live = c
            .regs
            .iter()
            .filter(|r| r.state != State::Unregistered)
            .count();
        match c.rng.below(100) {
            0..=19 if live < LIVE_MAX => c.register(),
            0..=29 => c.unregister(),
            30..=59 => c.sync_io(),
            60..=74 => c.batch(),
            75..=79 => c.gpu_free(),
            _ => c.malformed(),
        }
    }
    c.host_events();
    // Everything unregistered, then the GPU memory freed: nothing may stay pinned.
    for i in 0..c.regs.len() {
        if c.regs[i].state != State::Unregistered {
            let mut u = raw::gdirect_unregister_args {
                handle: c.regs[i].handle,
                ..Default::default()
            };
            let r = ioctl(c.dev, raw::GDIRECT_IOC_UNREGISTER, &mut u);
            c.judge("FINAL_UNREGISTER", &Expect::default(), r);
        }
    }
    if let Some(egpu) = &c.egpu {
        for g in c.gpu.iter().filter(|g| !g.freed) {
            let _ = (g.len, egpu.free_va(g.va));
        }
    }
    let pinned_after = vm_pin_kb();
    if pinned_after != pinned_before {
        c.fail(format!(
            "VmPin {pinned_before} kB before, {pinned_after} kB after everything was unregistered"
        ));
    }
    let digest: String = c
        .digest
        .clone()
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "gdirect-fuzz: checked seed={seed} calls={} mismatches={} bytes_checked={} vm_pin_kb={pinned_before}->{pinned_after} seconds={secs:.1} digest={digest}",
        c.calls, c.mismatches, c.bytes_checked
    );
    c.mismatches == 0
}
