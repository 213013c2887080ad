// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The bounce pool: a bounded set of host-memory chunks that transfers go through when the
//! direct path is not possible.
//!
//! One pool exists while the module is loaded (created at load, reachable through [`pool`]); it
//! holds at most `bounce_buffers` chunks of [`CHUNK_BYTES`], allocated on first use and kept. A
//! transfer takes one chunk at a time and waits (interruptibly) when all are in use, so host
//! memory used for bouncing never exceeds the module parameter, whatever the load. One user
//! (the accounts of its pins, see `users`) holds at most `max_bounce_per_user` chunks at a time
//! and waits for its own beyond that, so that one user's bounced transfers never hold every
//! other user's waiting.
//!
//! Lock order: `Pool::inner` is a leaf, held to take or give back a chunk (and to read the
//! users' counts, which change under it); a transfer holds a chunk, never the lock, across its
//! I/O and copies. `POOL` (the module's pool) is held only to clone or drop it.

use kernel::{
    bindings, new_condvar, new_mutex,
    page::Page,
    prelude::*,
    sync::{
        Arc,
        CondVar,
        Mutex, //
    },
};

use crate::{
    memory::Bvecs,
    provider::PAGE_SIZE,
    users::{
        BounceCharge,
        UserCharge, //
    },
};

/// Bytes in a chunk: 1 MiB.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;
const CHUNK_PAGES: usize = (CHUNK_BYTES / PAGE_SIZE) as usize;

kernel::sync::global_lock! {
    // SAFETY: `init` is called from the module's init before any file can be opened.
    unsafe(uninit) static POOL: Mutex<Option<Arc<Pool>>> = None;
}

/// Makes the module's pool; called once at load.
pub(crate) fn init(max_chunks: u32) -> Result {
    // SAFETY: called once, from the module's init, before anything uses `POOL`.
    unsafe { POOL.init() };
    let pool = Arc::pin_init(
        pin_init!(Pool {
            inner <- new_mutex!(PoolInner { free: KVec::new(), allocated: 0 }, "bounce::Pool::inner"),
            returned <- new_condvar!("bounce::Pool::returned"),
            max_chunks: max_chunks.max(1),
        }),
        GFP_KERNEL,
    )?;
    *POOL.lock() = Some(pool);
    Ok(())
}

/// Drops the module's pool (its chunks go when the last transfer using it ends).
pub(crate) fn exit() {
    let pool = POOL.lock().take();
    drop(pool);
}

/// The module's pool.
pub(crate) fn pool() -> Result<Arc<Pool>> {
    POOL.lock().clone().ok_or(ENODEV)
}

/// One chunk of host pages.
pub(crate) struct Chunk {
    pages: KVec<Page>,
}

struct PoolInner {
    free: KVec<Chunk>,
    /// Chunks that exist, free or in use.
    allocated: u32,
}

/// The bounce pool.
#[pin_data]
pub(crate) struct Pool {
    #[pin]
    inner: Mutex<PoolInner>,
    #[pin]
    returned: CondVar,
    max_chunks: u32,
}

impl Pool {
    /// Takes a chunk for `user`, making one if the pool may grow, or waiting for one to come
    /// back, or for one of the user's own when it holds `max_bounce_per_user` already.
    /// `ERESTARTSYS` if a signal interrupts the wait.
    pub(crate) fn acquire(self: &Arc<Self>, user: &UserCharge) -> Result<ChunkGuard> {
        let cap = match crate::max_bounce_per_user() {
            0 => u64::MAX,
            cap => u64::from(cap),
        };
        let mut inner = self.inner.lock();
        loop {
            // The users' counts change only under this lock (see `ChunkGuard::drop`), so what
            // is seen here holds until the wait, which lets the lock go only once queued.
            if user.bounce_below(cap)
                && (!inner.free.is_empty() || inner.allocated < self.max_chunks)
            {
                let charge = user.start_bounce()?;
                if let Some(chunk) = inner.free.pop() {
                    return Ok(ChunkGuard {
                        pool: self.clone(),
                        chunk: Some(chunk),
                        user: Some(charge),
                    });
                }
                inner.allocated += 1;
                drop(inner);
                return match Self::new_chunk() {
                    Ok(chunk) => Ok(ChunkGuard {
                        pool: self.clone(),
                        chunk: Some(chunk),
                        user: Some(charge),
                    }),
                    Err(e) => {
                        let mut inner = self.inner.lock();
                        inner.allocated -= 1;
                        drop(charge);
                        drop(inner);
                        self.returned.notify_all();
                        Err(e)
                    }
                };
            }
            if self.returned.wait_interruptible(&mut inner) {
                return Err(ERESTARTSYS);
            }
        }
    }

    fn new_chunk() -> Result<Chunk> {
        let mut pages = KVec::with_capacity(CHUNK_PAGES, GFP_KERNEL)?;
        for _ in 0..CHUNK_PAGES {
            pages.push(Page::alloc_page(GFP_KERNEL)?, GFP_KERNEL)?;
        }
        Ok(Chunk { pages })
    }
}

/// A chunk taken from the pool for a user; both go back when dropped.
pub(crate) struct ChunkGuard {
    pool: Arc<Pool>,
    chunk: Option<Chunk>,
    user: Option<BounceCharge>,
}

impl ChunkGuard {
    fn pages(&self) -> &[Page] {
        self.chunk.as_ref().map_or(&[], |c| &c.pages)
    }

    /// Bytes the chunk holds.
    pub(crate) fn capacity(&self) -> u64 {
        self.pages().len() as u64 * PAGE_SIZE
    }

    /// Bvecs over the first `len` bytes.
    pub(crate) fn bvecs(&self, len: u64) -> Result<Bvecs> {
        let mut left = len.min(self.capacity());
        let mut pages = self.pages().iter();
        Bvecs::build(left.div_ceil(PAGE_SIZE) as usize, || {
            let page = pages.next().ok_or(EINVAL)?;
            let n = left.min(PAGE_SIZE);
            left -= n;
            Ok(bindings::bio_vec {
                bv_page: page.as_ptr(),
                bv_len: n as u32,
                bv_offset: 0,
            })
        })
    }

    /// Copies the chunk's bytes `[off, off + len)` to `out` (memory that a device or another
    /// task may also write: no reference to it is made).
    ///
    /// # Safety
    ///
    /// `out` is valid for writes of `len` bytes.
    pub(crate) unsafe fn copy_out(&self, off: u64, out: *mut u8, len: usize) {
        self.each_span(off, len, |page, in_page, at, n| {
            // SAFETY: `n` bytes of the page from `in_page` exist; `out + at` has `n` of the
            // caller's `len` bytes left.
            let _ = unsafe { page.read_raw(out.add(at), in_page, n) };
        });
    }

    /// Copies `len` bytes from `data` into the chunk at `off` (as `copy_out`, the other way).
    ///
    /// # Safety
    ///
    /// `data` is valid for reads of `len` bytes.
    pub(crate) unsafe fn copy_in(&self, off: u64, data: *const u8, len: usize) {
        self.each_span(off, len, |page, in_page, at, n| {
            // SAFETY: as in `copy_out`, the other way.
            let _ = unsafe { page.write_raw(data.add(at), in_page, n) };
        });
    }

    /// Calls `f(page, offset_in_page, offset_in_span, len)` for the pieces of `[off, off + len)`.
    fn each_span(&self, off: u64, len: usize, mut f: impl FnMut(&Page, usize, usize, usize)) {
        let mut at = 0;
        while at < len {
            let pos = off + at as u64;
            let Some(page) = self.pages().get((pos / PAGE_SIZE) as usize) else {
                return;
            };
            let in_page = (pos % PAGE_SIZE) as usize;
            let n = (PAGE_SIZE as usize - in_page).min(len - at);
            f(page, in_page, at, n);
            at += n;
        }
    }
}

impl Drop for ChunkGuard {
    fn drop(&mut self) {
        let Some(chunk) = self.chunk.take() else {
            return;
        };
        let mut inner = self.pool.inner.lock();
        // The pool had room for every chunk it made; should the push fail, the chunk is freed
        // and may be made again.
        if inner.free.push(chunk, GFP_KERNEL).is_err() {
            inner.allocated -= 1;
        }
        // The user's count goes down under the lock, as `acquire` reads it.
        drop(self.user.take());
        drop(inner);
        // Every waiter: the one a chunk could go to may be another than the next in line (that
        // one's user may be at its cap).
        self.pool.returned.notify_all();
    }
}
