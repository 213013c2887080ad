// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Module-wide counters, reported by `GET_INFO` and in debugfs (`gdirect/counters`).
//!
//! Counters are plain atomics updated where the event happens; per-file counters live in
//! [`crate::region::FileCounters`].

use core::fmt;
use kernel::{
    debugfs,
    prelude::*,
    sync::atomic::{
        Atomic,
        Relaxed, //
    },
};

use crate::uapi;

/// Live registrations, all files.
pub(crate) static REGISTRATIONS: Atomic<u64> = Atomic::new(0);
/// Bytes pinned by live registrations; also the reservation counter for `max_pinned_bytes`.
pub(crate) static PINNED_BYTES: Atomic<u64> = Atomic::new(0);
/// Registrations revoked by their provider since load.
pub(crate) static REVOCATIONS: Atomic<u64> = Atomic::new(0);
/// Live registrations per provider.
pub(crate) static BY_PROVIDER: [Atomic<u64>; uapi::PROVIDER_COUNT as usize] =
    [Atomic::new(0), Atomic::new(0), Atomic::new(0)];

/// The provider names, as the CLI spells them.
pub(crate) const PROVIDER_NAMES: [&str; uapi::PROVIDER_COUNT as usize] =
    ["host", "nvidia", "p2pdma"];

fn write_counters(_: &(), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(f, "registrations {}", REGISTRATIONS.load(Relaxed))?;
    writeln!(f, "pinned_bytes {}", PINNED_BYTES.load(Relaxed))?;
    writeln!(f, "revocations {}", REVOCATIONS.load(Relaxed))?;
    for (name, count) in PROVIDER_NAMES.iter().zip(BY_PROVIDER.iter()) {
        writeln!(f, "registrations_{name} {}", count.load(Relaxed))?;
    }
    let (max_pinned, max_regs) = crate::limits();
    writeln!(f, "max_pinned_bytes {max_pinned}")?;
    writeln!(f, "max_registrations {max_regs}")
}

/// The debugfs directory `gdirect/` and its files; removed when dropped.
#[pin_data]
pub(crate) struct Debugfs {
    #[pin]
    counters: debugfs::File<()>,
    dir: debugfs::Dir,
}

impl Debugfs {
    pub(crate) fn new() -> impl PinInit<Self> {
        let dir = debugfs::Dir::new(c"gdirect");
        pin_init!(Self {
            counters <- dir.read_callback_file(c"counters", (), &write_counters),
            dir,
        })
    }
}
