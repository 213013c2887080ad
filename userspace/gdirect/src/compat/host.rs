// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The host-memory backend: the engine's sink when the destination is ordinary memory (and
//! what the tests without a GPU run the engine against).

use std::{alloc::Layout, ops::Range, ptr::NonNull};

use super::{Backend, Lane};
use crate::error::{Errno, Error, Result};

/// Staging alignment: what `O_DIRECT` asks of buffers on any block size up to 4 KiB.
pub(crate) const STAGING_ALIGN: usize = 4096;

/// A heap buffer aligned for direct I/O.
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an owned heap allocation.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> Result<Self> {
        let layout =
            Layout::from_size_align(len.max(1), STAGING_ALIGN).map_err(|_| Error::Allocation {
                what: format!("a {len}-byte staging buffer"),
                errno: Errno::EINVAL,
            })?;
        // SAFETY: the layout has a non-zero size. Zeroed, so the bytes are initialised.
        let ptr =
            NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(Error::Allocation {
                what: format!("a {len}-byte staging buffer"),
                errno: Errno::ENOMEM,
            })?;
        Ok(Self { ptr, len })
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes we own, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout (which was valid then).
        unsafe {
            std::alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len.max(1), STAGING_ALIGN),
            )
        };
    }
}

/// Destination memory of the host backend, for the length of one read.
#[derive(Clone, Copy, Debug)]
pub struct HostDest {
    ptr: NonNull<u8>,
    len: u64,
}

impl HostDest {
    /// `len` bytes at `ptr`, for a read to write.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is writable memory of this process that stays allocated, and that no
    /// Rust reference covers, for as long as a read may write through the value.
    pub(crate) unsafe fn from_raw(ptr: *mut u8, len: u64) -> Self {
        Self {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
        }
    }
}

// SAFETY: the engine writes disjoint ranges of the destination from its workers while the
// caller's `&mut [u8]` is borrowed by the read, so no other access exists.
unsafe impl Send for HostDest {}
// SAFETY: as above.
unsafe impl Sync for HostDest {}

/// Host memory as the destination: the engine's I/O path with a CPU copy at the end.
#[derive(Debug, Default)]
pub struct HostBackend;

/// A worker's staging buffers.
#[derive(Debug)]
pub struct HostLane {
    buffers: Vec<Option<AlignedBuf>>,
    capacity: usize,
}

// SAFETY: a destination views exactly the slice it was made from; each lane owns its aligned
// buffers and copies synchronously, within bounds checked by `send`.
unsafe impl Backend for HostBackend {
    type Memory = [u8];
    type Dest = HostDest;
    type Lane = HostLane;
    type Entered = ();

    fn dest(memory: &mut [u8]) -> HostDest {
        HostDest {
            ptr: NonNull::new(memory.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: memory.len() as u64,
        }
    }

    fn dest_len(dest: &HostDest) -> u64 {
        dest.len
    }

    fn enter_thread(&self) -> Result<()> {
        Ok(())
    }

    fn lane(&self, buffers: usize, capacity: usize) -> Result<HostLane> {
        Ok(HostLane {
            buffers: (0..buffers).map(|_| None).collect(),
            capacity,
        })
    }
}

// SAFETY: see the `Backend` implementation.
unsafe impl Lane for HostLane {
    type Dest = HostDest;

    fn buffer(&mut self, i: usize, len: usize) -> Result<&mut [u8]> {
        let slot = &mut self.buffers[i];
        if slot.as_ref().is_none_or(|b| b.len < len) {
            *slot = Some(AlignedBuf::new(len.max(self.capacity))?);
        }
        Ok(slot
            .as_mut()
            .map(|b| &mut b.as_mut_slice()[..len])
            .unwrap_or_default())
    }

    unsafe fn send(
        &mut self,
        i: usize,
        range: Range<usize>,
        dest: HostDest,
        off: u64,
    ) -> Result<()> {
        let Some(buf) = self.buffers[i].as_mut() else {
            return Ok(());
        };
        let src = &buf.as_mut_slice()[range];
        // SAFETY: `src` is our staging buffer; the caller vouches for `dest` (see the trait).
        unsafe { send_host(src.as_ptr(), src.len(), dest, off) };
        Ok(())
    }

    unsafe fn send_mapped(
        &mut self,
        src: *const u8,
        len: usize,
        dest: HostDest,
        off: u64,
    ) -> Result<()> {
        // SAFETY: the caller vouches for `src` and `dest` (see the trait).
        unsafe { send_host(src, len, dest, off) };
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Copies `len` bytes at `src` into `dest` at `off`.
///
/// # Safety
///
/// `src..src + len` is readable; `dest`'s memory is alive and nothing else accesses
/// `off..off + len` of it during the copy.
unsafe fn send_host(src: *const u8, len: usize, dest: HostDest, off: u64) {
    assert!(
        off.checked_add(len as u64)
            .is_some_and(|end| end <= dest.len),
        "the engine checks ranges before sending"
    );
    // SAFETY: `src..src+len` is readable and the destination alive and not otherwise accessed
    // (the caller's contract); the range is inside it (asserted).
    unsafe { std::ptr::copy_nonoverlapping(src, dest.ptr.as_ptr().add(off as usize), len) };
}
