// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The `host` provider: ordinary user memory of the calling process.

use kernel::prelude::*;

use super::{
    PinResult,
    Pinned,
    UserPages,
    PAGE,
    PAGE_SIZE, //
};

/// Pins `[addr, addr + len)`. P2PDMA pages are refused (`ENXIO`): they belong to `p2pdma`.
pub(crate) fn pin(addr: u64, len: u64) -> Result<PinResult> {
    let pages = UserPages::pin(addr, len, false)?;
    Ok(PinResult {
        pinned: Pinned::User(pages),
        owner: None,
        page_size: PAGE,
        page_count: len / PAGE_SIZE,
    })
}
