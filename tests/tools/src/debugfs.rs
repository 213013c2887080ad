// SPDX-License-Identifier: GPL-2.0
//! The module's debugfs counters (`/sys/kernel/debug/gdirect/counters`, one `NAME VALUE` per
//! line), shared by the test programs that assert on them. A counter that cannot be read is an
//! error, never a silent 0 that would let a check pass.

use std::path::PathBuf;

use gdirect::{Errno, Error};

const COUNTERS: &str = "/sys/kernel/debug/gdirect/counters";

/// The value of counter `name`.
pub fn counter(name: &str) -> gdirect::Result<u64> {
    let text = std::fs::read_to_string(COUNTERS).map_err(|e| Error::OpenFile {
        path: PathBuf::from(COUNTERS),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EIO as i32)),
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| Error::OpenFile {
            path: PathBuf::from(format!("{COUNTERS} (counter {name})")),
            errno: Errno::ENOENT,
        })
}
