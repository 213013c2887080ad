// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! NVIDIA's nv-p2p kernel interface, as the emulated GPU implements it: the emulator's own
//! definitions, written from the public header of the open driver
//! (`NVIDIA/open-gpu-kernel-modules`, `kernel-open/nvidia/nv-p2p.h`, read at the tags
//! 535.43.02, 550.40.07, 565.57.01, 570.86.15, 575.51.02, 580.65.06 and 595.45.04). Nothing here
//! comes from gdirect's module, and the module's build shares nothing with this file
//! (`tests/egpu/independent.sh` checks it at build time): an emulator that took the module's
//! definitions could only show that the module agrees with itself.
//!
//! The page table changed once in those releases: 580.65.06 raised
//! `NVIDIA_P2P_PAGE_TABLE_VERSION` from `0x00010002` to `0x00020000` and appended `uint32_t
//! flags` (`NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE`). `NVIDIA_P2P_DMA_MAPPING_VERSION` is
//! `0x00020003` in every one of them.

use core::ffi::c_void;
use kernel::bindings;

/// `NVIDIA_P2P_PAGE_TABLE_VERSION` of 515 to 575 (`nv-p2p.h` at 535.43.02 ... 575.51.02).
pub(crate) const PAGE_TABLE_VERSION_R535: u32 = 0x0001_0002;
/// `NVIDIA_P2P_PAGE_TABLE_VERSION` from 580.65.06 on (and at 590.44.01, 595.45.04).
pub(crate) const PAGE_TABLE_VERSION_R580: u32 = 0x0002_0000;
/// `NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE` (580.65.06 on).
pub(crate) const PAGE_TABLE_FLAGS_CPU_CACHEABLE: u32 = 0x1;
/// `NVIDIA_P2P_DMA_MAPPING_VERSION` (535.43.02 ... 595.45.04).
pub(crate) const DMA_MAPPING_VERSION: u32 = 0x0002_0003;
/// `NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING`, the one flag of `nvidia_p2p_get_pages_persistent`.
pub(crate) const FLAGS_FORCE_BAR1_MAPPING: u32 = 1;
/// `NVIDIA_P2P_PAGE_SIZE_64KB` of `enum nvidia_p2p_page_size_type` (4KB = 0, 64KB, 128KB).
pub(crate) const PAGE_SIZE_64KB: u32 = 1;
/// `NVIDIA_P2P_GPU_UUID_LEN`.
pub(crate) const GPU_UUID_LEN: usize = 16;
/// The kernel's internal `ENOTSUPP` (`include/linux/errno.h`), which the nv-p2p functions
/// return as `-ENOTSUPP`.
pub(crate) const ENOTSUPP: i32 = 524;

/// `struct nvidia_p2p_page`: `physical_address`, then `union nvidia_p2p_request_registers`
/// (`fermi`: `wreqmb_h`, `rreqmb_h`, `rreqmb_0`, `reserved[3]`).
#[repr(C)]
pub(crate) struct NvidiaP2pPage {
    pub(crate) physical_address: u64,
    pub(crate) wreqmb_h: u32,
    pub(crate) rreqmb_h: u32,
    pub(crate) rreqmb_0: u32,
    pub(crate) reserved: [u32; 3],
}

/// `struct nvidia_p2p_page_table` up to 575: `version`, `page_size`, `pages`, `entries`,
/// `gpu_uuid`.
#[repr(C)]
pub(crate) struct NvidiaP2pPageTableR535 {
    pub(crate) version: u32,
    pub(crate) page_size: u32,
    pub(crate) pages: *mut *mut NvidiaP2pPage,
    pub(crate) entries: u32,
    pub(crate) gpu_uuid: *mut u8,
}

/// `struct nvidia_p2p_page_table` from 580.65.06 on: the same fields, then `flags`.
#[repr(C)]
pub(crate) struct NvidiaP2pPageTableR580 {
    pub(crate) version: u32,
    pub(crate) page_size: u32,
    pub(crate) pages: *mut *mut NvidiaP2pPage,
    pub(crate) entries: u32,
    pub(crate) gpu_uuid: *mut u8,
    pub(crate) flags: u32,
}

/// What crosses the exported functions: a page table of either generation, never dereferenced
/// through this type (the emulator finds its own record of a table by its address).
pub(crate) type PageTablePtr = *mut c_void;

/// `struct nvidia_p2p_dma_mapping`.
#[repr(C)]
pub(crate) struct NvidiaP2pDmaMapping {
    pub(crate) version: u32,
    pub(crate) page_size_type: u32,
    pub(crate) entries: u32,
    pub(crate) dma_addresses: *mut u64,
    pub(crate) private: *mut c_void,
    pub(crate) pci_dev: *mut bindings::pci_dev,
}

// The x86-64 layouts the header gives (natural alignment): 32, 32, 40 and 40 bytes.
kernel::static_assert!(core::mem::size_of::<NvidiaP2pPage>() == 32);
kernel::static_assert!(core::mem::size_of::<NvidiaP2pPageTableR535>() == 32);
kernel::static_assert!(core::mem::size_of::<NvidiaP2pPageTableR580>() == 40);
kernel::static_assert!(core::mem::offset_of!(NvidiaP2pPageTableR580, flags) == 32);
kernel::static_assert!(core::mem::size_of::<NvidiaP2pDmaMapping>() == 40);
kernel::static_assert!(core::mem::offset_of!(NvidiaP2pDmaMapping, dma_addresses) == 16);

/// The free callback a client gives `nvidia_p2p_get_pages`: `void (*free_callback)(void *data)`.
pub(crate) type FreeCallback = unsafe extern "C" fn(data: *mut c_void);

/// A driver generation the emulator can be: the page table it makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Generation {
    /// 515 ... 575: page table 1.2, no `flags`.
    R535,
    /// 580.65.06 ... 595: page table 2.0 with `flags`.
    R580,
}

impl Generation {
    /// The generation of driver series `series` (`535`, `580`, ...); `None` for one outside
    /// the open driver's releases that export nv-p2p (515 to 595).
    pub(crate) fn of_series(series: u32) -> Option<Self> {
        match series {
            515..=579 => Some(Self::R535),
            580..=599 => Some(Self::R580),
            _ => None,
        }
    }

    /// Its `NVIDIA_P2P_PAGE_TABLE_VERSION`.
    pub(crate) fn page_table_version(self) -> u32 {
        match self {
            Self::R535 => PAGE_TABLE_VERSION_R535,
            Self::R580 => PAGE_TABLE_VERSION_R580,
        }
    }
}
