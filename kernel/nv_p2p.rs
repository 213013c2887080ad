// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The NVIDIA nv-p2p kernel interface, as `nvidia.ko` exports it (`nv-p2p.h`).
//!
//! Only the facts of the public header are here: the struct layouts, version numbers, the page
//! size enum and the function signatures. gdirect's `nvidia` provider calls these functions; the
//! rig's emulated GPU (`tests/egpu`) implements them, and includes this file so that both sides
//! share one definition.

use core::{ffi::c_void, num::NonZeroU64};
use kernel::{
    bindings,
    prelude::*, //
};

/// `NVIDIA_P2P_PAGE_TABLE_VERSION`.
pub(crate) const PAGE_TABLE_VERSION: u32 = 0x0001_0002;
/// `NVIDIA_P2P_DMA_MAPPING_VERSION`.
pub(crate) const DMA_MAPPING_VERSION: u32 = 0x0002_0003;
/// `NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING`, the one flag of the persistent calls.
pub(crate) const FLAGS_FORCE_BAR1_MAPPING: u32 = 1;
/// The `-ENOTSUPP` the nv-p2p functions return for unsupported requests (a kernel-internal errno).
pub(crate) const ENOTSUPP: i32 = 524;

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

/// Whether a structure `version` is compatible with the `expected` one: same major, at least
/// the same minor (`NVIDIA_P2P_VERSION_COMPATIBLE`).
pub(crate) fn version_compatible(version: u32, expected: u32) -> bool {
    version >> 16 == expected >> 16 && (version & 0xffff) >= (expected & 0xffff)
}

/// `struct nvidia_p2p_page`.
#[repr(C)]
pub(crate) struct Page {
    /// The page's CPU physical address (in the GPU's BAR).
    pub(crate) physical_address: u64,
    /// `union nvidia_p2p_request_registers`: unused since Fermi.
    pub(crate) registers: [u32; 6],
}

/// `struct nvidia_p2p_page_table`.
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

/// `struct nvidia_p2p_dma_mapping`.
#[repr(C)]
pub(crate) struct DmaMapping {
    /// `NVIDIA_P2P_DMA_MAPPING_VERSION` of the driver that made it.
    pub(crate) version: u32,
    /// `enum nvidia_p2p_page_size_type`.
    pub(crate) page_size_type: u32,
    /// Number of addresses.
    pub(crate) entries: u32,
    /// `entries` addresses for the peer device to use.
    pub(crate) dma_addresses: *mut u64,
    /// The driver's private data.
    pub(crate) private: *mut c_void,
    /// The peer device.
    pub(crate) pci_dev: *mut bindings::pci_dev,
}

kernel::static_assert!(core::mem::size_of::<Page>() == 32);
kernel::static_assert!(core::mem::size_of::<PageTable>() == 32);
kernel::static_assert!(core::mem::offset_of!(PageTable, entries) == 16);
kernel::static_assert!(core::mem::size_of::<DmaMapping>() == 40);
kernel::static_assert!(core::mem::offset_of!(DmaMapping, dma_addresses) == 16);

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
/// `nvidia_p2p_dma_map_pages`.
pub(crate) type DmaMapPagesFn = unsafe extern "C" fn(
    peer: *mut bindings::pci_dev,
    page_table: *mut PageTable,
    dma_mapping: *mut *mut DmaMapping,
) -> i32;
/// `nvidia_p2p_dma_unmap_pages`.
pub(crate) type DmaUnmapPagesFn = unsafe extern "C" fn(
    peer: *mut bindings::pci_dev,
    page_table: *mut PageTable,
    dma_mapping: *mut DmaMapping,
) -> i32;
/// `nvidia_p2p_free_page_table`.
pub(crate) type FreePageTableFn = unsafe extern "C" fn(page_table: *mut PageTable) -> i32;
/// `nvidia_p2p_free_dma_mapping`.
pub(crate) type FreeDmaMappingFn = unsafe extern "C" fn(dma_mapping: *mut DmaMapping) -> i32;

/// Turns the return value of an nv-p2p function into a `Result`.
pub(crate) fn to_result(ret: i32) -> Result {
    kernel::error::to_result(ret)
}
