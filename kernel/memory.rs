// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! A registration's memory as the block layer and the CPU address it: the page holding a byte
//! ([`page_at`]), the bvecs over a range (built on the stack when few), CPU copies to and from
//! the memory through raw pointers, and what kind of memory it is for the path decision. Every
//! function here is called under a use of the pages (`revocation::UseGuard`), which the caller
//! holds; none takes a lock. Above `region` and `provider`, below the data path (`io`) and the
//! bounce pool (`bounce`, which builds its own chunks' bvecs with [`Bvecs`]).

use core::ffi::c_void;
use kernel::{
    bindings,
    prelude::*, //
};

use crate::{
    path::Memory,
    provider::{
        p2pdma_page,
        Pinned,
        PAGE_SIZE, //
    },
    region::Registration,
};

unsafe extern "C" {
    // `shim.c`: `page_address()`.
    fn gdirect_page_address(page: *mut c_void) -> *mut c_void;
}

/// What the decision needs to know of the registered memory. The caller holds a use.
pub(crate) fn memory_kind(reg: &Registration) -> Memory {
    match &reg.pinned {
        Pinned::User(_) if reg.owner.is_none() => Memory::Host,
        // The p2pdma provider only accepts P2PDMA pages.
        Pinned::User(_) => Memory::DevicePages,
        // `REGISTER` accepts only GPU memory whose every page is a P2PDMA page.
        Pinned::Nvidia(nv) => match nv.phys(0).and_then(p2pdma_page) {
            Some(_) => Memory::DevicePages,
            None => Memory::DeviceNoPages,
        },
    }
}

/// The CPU page holding byte `off` of a registration, and the offset in it. The caller holds a
/// use of the pages.
fn page_at(reg: &Registration, off: u64) -> Result<(*mut bindings::page, u32)> {
    let in_page = (off % PAGE_SIZE) as u32;
    let page = match &reg.pinned {
        Pinned::User(u) => u.page((off / PAGE_SIZE) as usize),
        Pinned::Nvidia(nv) => {
            let within = off % reg.page_size - u64::from(in_page);
            nv.phys((off / reg.page_size) as usize)
                .and_then(|p| p2pdma_page(p + within))
        }
    };
    Ok((page.ok_or(EFAULT)?, in_page))
}

/// Bvecs that fit on the stack: a transfer of up to 16 KiB builds its bvecs without an
/// allocation (measured in the rig: allocating them took a tenth of a 4 KiB read's time).
const INLINE_BVECS: usize = 4;

/// The bvecs of one chunk of a transfer: on the stack when few, else allocated.
pub(crate) enum Bvecs {
    Inline([bindings::bio_vec; INLINE_BVECS], usize),
    Heap(KVVec<bindings::bio_vec>),
}

impl Bvecs {
    /// `count` bvecs, each from `next`.
    pub(crate) fn build(
        count: usize,
        mut next: impl FnMut() -> Result<bindings::bio_vec>,
    ) -> Result<Self> {
        if count <= INLINE_BVECS {
            let mut v = [bindings::bio_vec {
                bv_page: core::ptr::null_mut(),
                bv_len: 0,
                bv_offset: 0,
            }; INLINE_BVECS];
            for slot in v.iter_mut().take(count) {
                *slot = next()?;
            }
            return Ok(Self::Inline(v, count));
        }
        let mut v = KVVec::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
        for _ in 0..count {
            v.push(next()?, GFP_KERNEL_ACCOUNT)?;
        }
        Ok(Self::Heap(v))
    }

    pub(crate) fn as_slice(&self) -> &[bindings::bio_vec] {
        match self {
            // `n <= INLINE_BVECS` by construction; `get` keeps that from being a panic path.
            Self::Inline(v, n) => v.get(..*n).unwrap_or(&[]),
            Self::Heap(v) => v,
        }
    }
}

/// Bvecs over `[off, off + len)` of a registration, one per CPU page it spans. The caller holds
/// a use of the pages.
pub(crate) fn bvecs(reg: &Registration, off: u64, len: u64) -> Result<Bvecs> {
    let end = off + len;
    let pages = (end.div_ceil(PAGE_SIZE) - off / PAGE_SIZE) as usize;
    let mut at = off;
    Bvecs::build(pages, || {
        let (page, in_page) = page_at(reg, at)?;
        let n = (PAGE_SIZE - u64::from(in_page)).min(end - at);
        at += n;
        Ok(bindings::bio_vec {
            bv_page: page,
            bv_len: n as u32,
            bv_offset: in_page,
        })
    })
}

/// Runs `f(offset_in_chunk, device, n)` over `[off, off + len)` of a registration, one CPU page
/// at a time: `device` addresses `n` bytes of the memory, mapped for the CPU. The caller holds a
/// use of the pages. A raw pointer, never a slice: the memory (a GPU's BAR, P2PDMA memory, host
/// pages that user space maps too) may be written by a device or a task meanwhile, which a
/// `&mut [u8]` over it would promise cannot happen.
pub(crate) fn copy_device(
    reg: &Registration,
    off: u64,
    len: u64,
    mut f: impl FnMut(u64, *mut u8, usize),
) -> Result {
    let mut done = 0;
    while done < len {
        let (page, in_page) = page_at(reg, off + done)?;
        let n = (PAGE_SIZE - u64::from(in_page)).min(len - done);
        // SAFETY: `page` is pinned (or P2PDMA memory held by its provider) and mapped in the
        // kernel's direct map.
        let base = unsafe { gdirect_page_address(page.cast()) }.cast::<u8>();
        if base.is_null() {
            return Err(EFAULT);
        }
        // `in_page + n` stays within the page.
        f(done, base.wrapping_add(in_page as usize), n as usize);
        done += n;
    }
    Ok(())
}
