// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The `p2pdma` provider: a user mapping of memory registered with PCI P2PDMA, such as an mmap
//! of an NVMe CMB's `p2pmem/allocate`.

use kernel::prelude::*;

use super::{
    PinResult,
    Pinned,
    UserPages,
    PAGE,
    PAGE_SIZE, //
};
use crate::topology::Owner;

unsafe extern "C" {
    /// `is_pci_p2pdma_page()` (inline in C; `shim.c`); `page` is a `struct page *`.
    fn gdirect_is_pci_p2pdma_page(page: *const core::ffi::c_void) -> bool;
}

/// Pins `[addr, addr + len)`: every page must be P2PDMA memory of one BAR of one device, or
/// `ENXIO`.
pub(crate) fn pin(addr: u64, len: u64) -> Result<PinResult> {
    let pages = UserPages::pin(addr, len, true)?;
    for i in 0..pages.len() {
        let page = pages.page(i).ok_or(ENXIO)?;
        // SAFETY: `page` is pinned.
        if !unsafe { gdirect_is_pci_p2pdma_page(page.cast()) } {
            return Err(ENXIO);
        }
    }
    let owner = pages.phys(0).and_then(Owner::of_phys).ok_or(ENXIO)?;
    if (0..pages.len()).any(|i| !pages.phys(i).is_some_and(|p| owner.contains(p, PAGE_SIZE))) {
        return Err(ENXIO);
    }
    Ok(PinResult {
        pinned: Pinned::User(pages),
        owner: Some(owner),
        page_size: PAGE,
        page_count: len / PAGE_SIZE,
    })
}
