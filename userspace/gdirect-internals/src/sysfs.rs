// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Reading sysfs (and procfs) attributes, for the topology and fabrics models.

use std::path::Path;

/// The text of the attribute file at `path`, without its surrounding white space; `None` when it
/// cannot be read (absent, or not readable by this user).
pub(crate) fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}
