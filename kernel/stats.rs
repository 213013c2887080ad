// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Module-wide counters: registrations (`GET_INFO`, debugfs `gdirect/counters`) and I/O by path
//! and direction with latency histograms (`GET_STATS`, debugfs `gdirect/stats`).
//!
//! Counters are plain atomics updated where the event happens; per-file counters live in
//! [`crate::region::FileCounters`].
//!
//! A floor under everything that counts: it imports only `dio::Dir` and the ABI, and takes no
//! lock (debugfs reads the atomics as they are).

use core::fmt;
use kernel::{
    debugfs,
    prelude::*,
    sync::atomic::{
        Atomic,
        Relaxed, //
    },
};

use crate::{
    dio::Dir,
    uapi, //
};

/// Live registrations, all files.
pub(crate) static REGISTRATIONS: Atomic<u64> = Atomic::new(0);
/// Bytes pinned by live registrations; also the reservation counter for `max_pinned_bytes`.
pub(crate) static PINNED_BYTES: Atomic<u64> = Atomic::new(0);
/// Adds `len` to `counter` only if the sum stays within `max`: the check comes before the
/// addition (a compare-exchange loop), so that no value past the limit, or wrapped past
/// `u64::MAX` by a huge `len`, is ever seen by a concurrent reservation. `false`: nothing added.
pub(crate) fn reserve_within(counter: &Atomic<u64>, len: u64, max: u64) -> bool {
    let mut current = counter.load(Relaxed);
    loop {
        let Some(total) = current.checked_add(len).filter(|&t| t <= max) else {
            return false;
        };
        match counter.cmpxchg(current, total, Relaxed) {
            Ok(_) => return true,
            Err(seen) => current = seen,
        }
    }
}

/// Registrations revoked by their provider since load.
pub(crate) static REVOCATIONS: Atomic<u64> = Atomic::new(0);
/// nvidia registrations that ended where put_pages could not reach their pages (another
/// process, a kernel worker), left to the GPU driver until the memory is freed, since load.
pub(crate) static ORPHANED: Atomic<u64> = Atomic::new(0);
/// Transfers running now, synchronous and batched.
pub(crate) static ACTIVE_TRANSFERS: Atomic<u64> = Atomic::new(0);

/// Counts a transfer as active while it lives.
pub(crate) struct ActiveTransfer(());

impl ActiveTransfer {
    pub(crate) fn new() -> Self {
        ACTIVE_TRANSFERS.fetch_add(1, Relaxed);
        Self(())
    }
}

impl Drop for ActiveTransfer {
    fn drop(&mut self) {
        ACTIVE_TRANSFERS.fetch_sub(1, Relaxed);
    }
}
/// Live registrations per provider.
pub(crate) static BY_PROVIDER: [Atomic<u64>; uapi::PROVIDER_COUNT as usize] =
    [Atomic::new(0), Atomic::new(0), Atomic::new(0)];

/// The counters of one path and direction (`struct gdirect_io_stats`).
pub(crate) struct IoCounters {
    ops: Atomic<u64>,
    bytes: Atomic<u64>,
    errors: Atomic<u64>,
    bounce_bytes: Atomic<u64>,
    latency_us_log2: [Atomic<u64>; uapi::LATENCY_BUCKETS as usize],
}

impl IoCounters {
    const fn new() -> Self {
        Self {
            ops: Atomic::new(0),
            bytes: Atomic::new(0),
            errors: Atomic::new(0),
            bounce_bytes: Atomic::new(0),
            latency_us_log2: [const { Atomic::new(0) }; uapi::LATENCY_BUCKETS as usize],
        }
    }

    /// A snapshot, as `GET_STATS` reports it.
    pub(crate) fn snapshot(&self) -> uapi::IoStats {
        let mut s = uapi::IoStats {
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            bounce_bytes: self.bounce_bytes.load(Relaxed),
            ..Default::default()
        };
        for (out, c) in s
            .latency_us_log2
            .iter_mut()
            .zip(self.latency_us_log2.iter())
        {
            *out = c.load(Relaxed);
        }
        s
    }
}

/// I/O counters by `[path][direction]`.
pub(crate) static IO: [[IoCounters; 2]; uapi::PATH_COUNT as usize] =
    [const { [IoCounters::new(), IoCounters::new()] }; 3];
/// Transfers by path reason.
pub(crate) static REASONS: [Atomic<u64>; uapi::REASON_COUNT as usize] =
    [const { Atomic::new(0) }; uapi::REASON_COUNT as usize];

/// The latency bucket of a transfer that took `ns` nanoseconds.
fn bucket(ns: i64) -> usize {
    let us = (ns.max(0) as u64) / 1000;
    if us == 0 {
        return 0;
    }
    ((63 - us.leading_zeros()) as usize).min(uapi::LATENCY_BUCKETS as usize - 1)
}

/// Records a finished transfer: `moved` is `(bytes, bounced bytes)`, `None` for a failure.
pub(crate) fn record_io(path: u32, dir: Dir, reason: u32, moved: Option<(u64, u64)>, ns: i64) {
    let c = &IO[path as usize % IO.len()][dir.index()];
    c.ops.fetch_add(1, Relaxed);
    match moved {
        Some((bytes, bounce_bytes)) => {
            c.bytes.fetch_add(bytes, Relaxed);
            c.bounce_bytes.fetch_add(bounce_bytes, Relaxed);
        }
        None => {
            c.errors.fetch_add(1, Relaxed);
        }
    }
    c.latency_us_log2[bucket(ns)].fetch_add(1, Relaxed);
    if let Some(r) = REASONS.get(reason as usize) {
        r.fetch_add(1, Relaxed);
    }
}

/// The path names, as the CLI spells them.
pub(crate) const PATH_NAMES: [&str; uapi::PATH_COUNT as usize] = ["p2p", "bounce", "host"];
/// The reason names, as the CLI spells them.
pub(crate) const REASON_NAMES: [&str; uapi::REASON_COUNT as usize] = [
    "none",
    "forced",
    "queue_no_p2p",
    "distance",
    "no_pages",
    "multipath",
    "data_device",
    "no_direct_io",
];

fn write_stats(_: &(), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(
        f,
        "path dir ops bytes errors bounce_bytes latency_us_log2[0..{}]",
        uapi::LATENCY_BUCKETS
    )?;
    for (p, name) in PATH_NAMES.iter().enumerate() {
        for (d, dir) in ["read", "write"].iter().enumerate() {
            let s = IO[p][d].snapshot();
            write!(
                f,
                "{name} {dir} {} {} {} {}",
                s.ops, s.bytes, s.errors, s.bounce_bytes
            )?;
            for b in s.latency_us_log2 {
                write!(f, " {b}")?;
            }
            writeln!(f)?;
        }
    }
    for (name, count) in REASON_NAMES.iter().zip(REASONS.iter()) {
        writeln!(f, "reason {name} {}", count.load(Relaxed))?;
    }
    Ok(())
}

/// The provider names, as the CLI spells them.
pub(crate) const PROVIDER_NAMES: [&str; uapi::PROVIDER_COUNT as usize] =
    ["host", "nvidia", "p2pdma"];

fn write_counters(_: &(), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(f, "registrations {}", REGISTRATIONS.load(Relaxed))?;
    writeln!(f, "pinned_bytes {}", PINNED_BYTES.load(Relaxed))?;
    writeln!(f, "revocations {}", REVOCATIONS.load(Relaxed))?;
    writeln!(f, "orphaned {}", ORPHANED.load(Relaxed))?;
    writeln!(f, "active_transfers {}", ACTIVE_TRANSFERS.load(Relaxed))?;
    for (name, count) in PROVIDER_NAMES.iter().zip(BY_PROVIDER.iter()) {
        writeln!(f, "registrations_{name} {}", count.load(Relaxed))?;
    }
    let (max_pinned, max_regs) = crate::limits();
    writeln!(f, "max_pinned_bytes {max_pinned}")?;
    writeln!(
        f,
        "max_pinned_bytes_per_user {}",
        crate::max_pinned_bytes_per_user()
    )?;
    writeln!(f, "max_registrations {max_regs}")
}

/// The debugfs directory `gdirect/` and its files; removed when dropped.
#[pin_data]
pub(crate) struct Debugfs {
    #[pin]
    counters: debugfs::File<()>,
    #[pin]
    stats: debugfs::File<()>,
    dir: debugfs::Dir,
}

impl Debugfs {
    pub(crate) fn new() -> impl PinInit<Self> {
        let dir = debugfs::Dir::new(c"gdirect");
        pin_init!(Self {
            counters <- dir.read_callback_file(c"counters", (), &write_counters),
            stats <- dir.read_callback_file(c"stats", (), &write_stats),
            dir,
        })
    }
}
