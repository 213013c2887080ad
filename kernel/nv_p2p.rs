// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The NVIDIA nv-p2p kernel interface, as `nvidia.ko` exports it (`kernel-open/nvidia/nv-p2p.h`).
//!
//! Only the facts of the public header that the `nvidia` provider uses are here: the page table
//! in each generation a supported driver produces, the page size enum and the signatures of the
//! functions it calls. The rig's emulated GPU (`tests/egpu`) has its own definitions, written
//! from the same header, and shares nothing with this file.
//!
//! # Page-table generations
//!
//! `nvidia_p2p_get_pages` stamps the table with the driver's `NVIDIA_P2P_PAGE_TABLE_VERSION`
//! (`nv_p2p_get_pages` in `nv-p2p.c`): `0x00010002` up to the 575 series, `0x00020000` from
//! 580.65.06 on (590 and 595 keep it), when the struct gained `flags` after `gpu_uuid`. The
//! header's own check, `NVIDIA_P2P_VERSION_COMPATIBLE`, accepts one major version only, so a
//! client built against either header alone refuses the other generation's tables. gdirect reads
//! both, and of each only the fields it has: [`read_page_table`] decides by the major version
//! before it reads anything else. An unknown major version (a driver newer than this module) is
//! refused with its own errno (`EPROTO`), and the kernel log names the version.
//!
//! gdirect never calls `nvidia_p2p_dma_map_pages`: peer addresses of GPU pages are made by gdirect
//! (`region.rs`), so it reads no `struct nvidia_p2p_dma_mapping` and does not depend on
//! `NVIDIA_P2P_DMA_MAPPING_VERSION` (`0x00020003` in every series from 535 to 595).

use core::{
    ffi::c_void,
    num::NonZeroU64, //
};

/// `NVIDIA_P2P_PAGE_TABLE_VERSION` of drivers before 580.65.06: the oldest table gdirect reads
/// (major 1, minor 2: `gpu_uuid` present).
pub(crate) const PAGE_TABLE_VERSION_1: u32 = 0x0001_0002;
/// `NVIDIA_P2P_PAGE_TABLE_VERSION` from 580.65.06 on: major 2, with `flags`.
pub(crate) const PAGE_TABLE_VERSION_2: u32 = 0x0002_0000;
/// `NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE` (major 2). nvidia.ko sets it where the GPU is
/// coherent with the CPU (NVLink-C2C systems such as Grace Hopper: `rm_p2p_get_pages` copies
/// `nv->coherent`; the persistent path sets it for mappings over NVLink/C2C), and then each
/// page's `physical_address` is the GPU memory's coherent CPU address
/// (`coherentCpuFbBase + ...`), not an address in BAR1; BAR1 mappings never carry it. For
/// gdirect's data path that decides everything: its transfers go only to P2PDMA pages of a PCI
/// device's BAR, so a flagged table is refused at REGISTER (`EMEDIUMTYPE`, as GPU memory without
/// P2PDMA pages is), without looking for its addresses in any BAR, and the library's compat
/// engine serves that memory.
pub(crate) const PAGE_TABLE_FLAGS_CPU_CACHEABLE: u32 = 1;

/// `enum nvidia_p2p_page_size_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub(crate) enum PageSize {
    /// `NVIDIA_P2P_PAGE_SIZE_4KB`
    Size4K = 0,
    /// `NVIDIA_P2P_PAGE_SIZE_64KB`
    Size64K = 1,
    /// `NVIDIA_P2P_PAGE_SIZE_128KB`
    Size128K = 2,
}

impl PageSize {
    /// The page size the enum value names, in bytes.
    pub(crate) fn from_raw(raw: u32) -> Option<NonZeroU64> {
        match raw {
            0 => NonZeroU64::new(4 << 10),
            1 => NonZeroU64::new(64 << 10),
            2 => NonZeroU64::new(128 << 10),
            _ => None,
        }
    }
}

/// `struct nvidia_p2p_page`.
#[repr(C)]
pub(crate) struct Page {
    /// The page's CPU physical address (in the GPU's BAR).
    pub(crate) physical_address: u64,
    /// `union nvidia_p2p_request_registers`: unused since Fermi.
    pub(crate) registers: [u32; 6],
}

/// `struct nvidia_p2p_page_table` of major version 1 (minor 2): what both generations begin
/// with. A pointer to a table of either generation is a `*mut PageTable`; only
/// [`read_page_table`] looks past `version`.
#[repr(C)]
pub(crate) struct PageTable {
    /// `NVIDIA_P2P_PAGE_TABLE_VERSION` of the driver that made it.
    pub(crate) version: u32,
    /// `enum nvidia_p2p_page_size_type`.
    pub(crate) page_size: u32,
    /// `entries` pointers to the pages.
    pub(crate) pages: *mut *mut Page,
    /// Number of pages.
    pub(crate) entries: u32,
    /// The GPU's UUID, `NVIDIA_P2P_GPU_UUID_LEN` bytes.
    pub(crate) gpu_uuid: *mut u8,
}

/// `struct nvidia_p2p_page_table` of major version 2: version 1's fields, then `flags`.
#[repr(C)]
pub(crate) struct PageTableV2 {
    /// The fields of version 1, at the same offsets.
    pub(crate) v1: PageTable,
    /// `NVIDIA_P2P_PAGE_TABLE_FLAGS_*`.
    pub(crate) flags: u32,
}

// The x86-64 layouts of `nv-p2p.h`: 32 and 40 bytes, `entries` at 16, `flags` at 32.
kernel::static_assert!(core::mem::size_of::<Page>() == 32);
kernel::static_assert!(core::mem::size_of::<PageTable>() == 32);
kernel::static_assert!(core::mem::offset_of!(PageTable, version) == 0);
kernel::static_assert!(core::mem::offset_of!(PageTable, page_size) == 4);
kernel::static_assert!(core::mem::offset_of!(PageTable, pages) == 8);
kernel::static_assert!(core::mem::offset_of!(PageTable, entries) == 16);
kernel::static_assert!(core::mem::offset_of!(PageTable, gpu_uuid) == 24);
kernel::static_assert!(core::mem::size_of::<PageTableV2>() == 40);
kernel::static_assert!(core::mem::offset_of!(PageTableV2, flags) == 32);

/// A page table's generation, by its major version.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Generation {
    /// Major 1, minor ≥ 2: drivers before 580.65.06.
    V1,
    /// Major 2: 580.65.06 and later.
    V2,
}

/// What gdirect reads of a page table, from the fields its generation has.
pub(crate) struct TableInfo {
    /// Its generation.
    pub(crate) generation: Generation,
    /// `enum nvidia_p2p_page_size_type`.
    pub(crate) page_size: u32,
    /// `entries` pointers to the pages.
    pub(crate) pages: *mut *mut Page,
    /// Number of pages.
    pub(crate) entries: u32,
    /// `NVIDIA_P2P_PAGE_TABLE_FLAGS_*` (0 for major 1, which has none).
    pub(crate) flags: u32,
}

/// Reads a page table of either generation: its `version` first, then only the fields that
/// version has. `Err(version)` for a version gdirect does not know (another major version, or
/// major 1 before minor 2).
///
/// # Safety
///
/// `t` points to a live page table that `nvidia.ko` made.
pub(crate) unsafe fn read_page_table(t: *const PageTable) -> core::result::Result<TableInfo, u32> {
    // SAFETY: every generation begins with `version` (the caller's promise for the rest).
    let version = unsafe { (*t).version };
    let generation = match (version >> 16, version & 0xffff) {
        (1, minor) if minor >= PAGE_TABLE_VERSION_1 & 0xffff => Generation::V1,
        (2, _) => Generation::V2,
        _ => return Err(version),
    };
    // SAFETY: both known generations have version 1's fields at these offsets.
    let v1 = unsafe { &*t };
    let flags = match generation {
        Generation::V1 => 0,
        // SAFETY: a major-2 table is a `struct nvidia_p2p_page_table` with `flags`.
        Generation::V2 => unsafe { (*t.cast::<PageTableV2>()).flags },
    };
    Ok(TableInfo {
        generation,
        page_size: v1.page_size,
        pages: v1.pages,
        entries: v1.entries,
        flags,
    })
}

/// The free callback given to `nvidia_p2p_get_pages`.
pub(crate) type FreeCallback = unsafe extern "C" fn(data: *mut c_void);

/// `nvidia_p2p_get_pages`.
pub(crate) type GetPagesFn = unsafe extern "C" fn(
    p2p_token: u64,
    va_space: u32,
    virtual_address: u64,
    length: u64,
    page_table: *mut *mut PageTable,
    free_callback: Option<FreeCallback>,
    data: *mut c_void,
) -> i32;
/// `nvidia_p2p_get_pages_persistent`.
pub(crate) type GetPagesPersistentFn = unsafe extern "C" fn(
    virtual_address: u64,
    length: u64,
    page_table: *mut *mut PageTable,
    flags: u32,
) -> i32;
/// `nvidia_p2p_put_pages`.
pub(crate) type PutPagesFn = unsafe extern "C" fn(
    p2p_token: u64,
    va_space: u32,
    virtual_address: u64,
    page_table: *mut PageTable,
) -> i32;
/// `nvidia_p2p_put_pages_persistent`.
pub(crate) type PutPagesPersistentFn =
    unsafe extern "C" fn(virtual_address: u64, page_table: *mut PageTable, flags: u32) -> i32;
/// `nvidia_p2p_free_page_table`.
pub(crate) type FreePageTableFn = unsafe extern "C" fn(page_table: *mut PageTable) -> i32;
