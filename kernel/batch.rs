// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Batches: transfers submitted together, run concurrently on the module's workqueue, and
//! completed into a per-file queue that `REAP` empties.
//!
//! Each open file has one [`Batches`], shared with its transfers in flight, so that a transfer
//! can complete after the file is closed (its completion is then simply dropped). Transfers run
//! synchronously, each on a worker of the module's own per-CPU workqueue ([`IoQueue`]). Each
//! holds a module reference until it is done ([`ModuleRef`]), so the module cannot be unloaded
//! with transfers queued; the exit destroys the workqueue, which waits for the last work item
//! to return after it put its reference.
//!
//! Notification: an eventfd the caller registers is signalled once per completion; see the
//! uapi header for why an eventfd rather than `poll()`.
//!
//! Lock order: `Batches::inner` (a file's queue of completions) is a leaf, taken for counting
//! and queueing only, and waited on interruptibly by `REAP`; a transfer runs with no lock held
//! (see `io`), and the workqueue's own `QUEUE` lock is held only to queue work or at exit.

use core::{
    ffi::c_void,
    ptr::NonNull, //
};
use kernel::{
    bindings, impl_has_work, new_condvar, new_mutex, new_work,
    prelude::*,
    sync::{
        Arc,
        CondVar,
        Mutex, //
    },
    workqueue::{
        Queue,
        Work,
        WorkItem, //
    },
};

use crate::{
    io::Transfer,
    modref::ModuleRef,
    uapi::Cqe,
    users::TransferCharge, //
};

unsafe extern "C" {
    /// `alloc_workqueue()` (a macro in C; `shim.c`).
    fn gdirect_alloc_workqueue(
        name: *const u8,
        flags: u32,
        max_active: i32,
    ) -> *mut bindings::workqueue_struct;
}

kernel::sync::global_lock! {
    // SAFETY: `IoQueue::new` initializes it from the module's init before any file is opened.
    unsafe(uninit) static QUEUE: Mutex<Option<IoQueuePtr>> = None;
}

/// The workqueue pointer, shared with the transfers.
struct IoQueuePtr(NonNull<bindings::workqueue_struct>);
// SAFETY: a workqueue may be used from any thread.
unsafe impl Send for IoQueuePtr {}

/// The module's workqueue for batched transfers; destroying it drains them.
///
/// # Invariants
///
/// `QUEUE` holds the workqueue this value created, until this value is dropped.
pub(crate) struct IoQueue(());

impl IoQueue {
    /// Creates the workqueue, with room for `max_active` transfers at once.
    pub(crate) fn new(max_active: u32) -> Result<Self> {
        // SAFETY: called once, from the module's init, before anything uses `QUEUE`.
        unsafe { QUEUE.init() };
        // Per CPU: a transfer runs on a worker of the CPU that submitted it, from that CPU's
        // concurrency-managed pool, which starts another worker whenever one sleeps on its
        // I/O. Transfers mostly wait for the device, so this keeps as many in flight as an
        // unbound queue would, without waking a worker on another CPU for each one (measured
        // in the rig against an unbound queue: BENCHMARKS.md, and the commit that made it).
        let flags = bindings::wq_flags_WQ_PERCPU;
        // SAFETY: a static, NUL-terminated name; the flags and limit are valid.
        let wq = unsafe {
            gdirect_alloc_workqueue(
                c"gdirect_io".as_ptr().cast(),
                flags,
                max_active.clamp(1, 512) as i32,
            )
        };
        let wq = NonNull::new(wq).ok_or(ENOMEM)?;
        // INVARIANT: stored here, taken out only in `Drop`.
        *QUEUE.lock() = Some(IoQueuePtr(wq));
        Ok(Self(()))
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        if let Some(wq) = QUEUE.lock().take() {
            // SAFETY: the workqueue made in `new`; no file is open and no transfer is queued
            // (each holds a module reference), so nothing queues work any more. This waits for
            // the last transfers' work items, which put their references, to return.
            unsafe { bindings::destroy_workqueue(wq.0.as_ptr()) };
        }
    }
}

/// A job on the module's workqueue: a work item type of the module's own, so that its lockdep
/// class (key and name) is the module's. The kernel crate's `Queue::try_spawn` gives every
/// module that calls it one key, with each module's own copy of the class name: once two
/// modules have used it in one boot, lockdep warns ("a different class with the same key"),
/// and a kernel with `panic_on_warn` stops (the rig's debug kernel did, with the emulated GPU).
#[pin_data]
struct Job<F> {
    #[pin]
    work: Work<Job<F>>,
    func: Option<F>,
}

impl_has_work! {
    impl{F} HasWork<Self> for Job<F> { self.work }
}

impl<F: FnOnce() + Send + 'static> WorkItem for Job<F> {
    type Pointer = Pin<KBox<Self>>;

    fn run(mut this: Pin<KBox<Self>>) {
        if let Some(func) = this.as_mut().project().func.take() {
            func()
        }
    }
}

/// Queues `f` on the module's workqueue. The job is made before the queue's lock is taken, and
/// where it cannot be made or queued, `f` (a transfer: its file, its registration, whose drop
/// may end a registration) is dropped with that lock not held.
fn spawn<F: FnOnce() + Send + 'static>(f: F) -> Result {
    let job = KBox::pin_init(
        pin_init!(Job {
            work <- new_work!("gdirect::batch"),
            func: Some(f),
        }),
        GFP_KERNEL_ACCOUNT,
    )
    .map_err(|_| ENOMEM)?;
    let queue = QUEUE.lock();
    if let Some(wq) = queue.as_ref() {
        // SAFETY: the workqueue is valid while `QUEUE` holds it, and we hold `QUEUE`'s lock.
        let q = unsafe { Queue::from_raw(wq.0.as_ptr()) };
        q.enqueue(job);
        return Ok(());
    }
    drop(queue);
    drop(job);
    Err(ENODEV)
}

/// A registered eventfd, released when dropped.
struct EventFd(NonNull<c_void>);
// SAFETY: an eventfd context may be signalled and released from any thread.
unsafe impl Send for EventFd {}

impl EventFd {
    fn get(fd: i32) -> Result<Self> {
        // SAFETY: any fd value is checked by the kernel.
        let ctx = unsafe { bindings::eventfd_ctx_fdget(fd) };
        let addr = ctx as isize;
        if (-4095..0).contains(&addr) {
            return Err(Error::from_errno(addr as i32));
        }
        Ok(Self(NonNull::new(ctx.cast()).ok_or(EBADF)?))
    }

    fn signal(&self) {
        // SAFETY: the context is referenced by `self`.
        unsafe { bindings::eventfd_signal_mask(self.0.as_ptr().cast(), 0) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: the reference `eventfd_ctx_fdget` took.
        unsafe { bindings::eventfd_ctx_put(self.0.as_ptr().cast()) };
    }
}

struct BatchInner {
    /// Completions not yet reaped; room for one per transfer in flight is reserved at submit.
    done: KVec<Cqe>,
    /// Transfers submitted and not yet reaped.
    in_flight: u32,
    eventfd: Option<EventFd>,
}

/// The batch state of one open file.
#[pin_data]
pub(crate) struct Batches {
    #[pin]
    inner: Mutex<BatchInner>,
    #[pin]
    completed: CondVar,
}

impl Batches {
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                inner <- new_mutex!(BatchInner { done: KVec::new(), in_flight: 0, eventfd: None }, "Batches::inner"),
                completed <- new_condvar!("Batches::completed"),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// Transfers in flight.
    pub(crate) fn in_flight(&self) -> u32 {
        self.inner.lock().in_flight
    }

    /// Queues `transfer`, unless `max_in_flight` are in flight already (`Ok(false)`); `charge`
    /// (its count against its user) is held until its work item is done.
    pub(crate) fn submit(
        self: &Arc<Self>,
        transfer: Transfer,
        charge: TransferCharge,
        user_data: u64,
        max_in_flight: u32,
    ) -> Result<bool> {
        {
            let mut inner = self.inner.lock();
            if inner.in_flight >= max_in_flight {
                return Ok(false);
            }
            let want = inner.in_flight as usize + 1;
            if inner.done.capacity() < want {
                let more = want - inner.done.len();
                inner.done.reserve(more, GFP_KERNEL_ACCOUNT)?;
            }
            inner.in_flight += 1;
        }
        let me = self.clone();
        // The transfer may outlive its file: it holds the module itself, so that `rmmod` is
        // refused until it is done (a registration it ends may be orphaned, and take a
        // reference of its own, only while the module is live).
        // SAFETY: called from `SUBMIT`, an operation of an open file, which holds a reference.
        let module_ref = unsafe { ModuleRef::get() };
        if let Err(e) = spawn(move || {
            // Put last, once nothing else of the transfer is left; the module's exit destroys
            // the workqueue, which waits for this work item to return.
            let _module_ref = module_ref;
            let (path, result) = transfer.run();
            // What the transfer holds (its registration, file, submitter, its user's count)
            // goes before its completion can be reaped: a caller that reaps, unregisters and
            // registers again, submits again, or unmounts, finds nothing of it still held.
            drop(charge);
            drop(transfer);
            me.complete(user_data, path, result);
            drop(me);
        }) {
            self.inner.lock().in_flight -= 1;
            return Err(e);
        }
        Ok(true)
    }

    fn complete(&self, user_data: u64, path: u32, result: Result<crate::io::Outcome>) {
        let cqe = match result {
            Ok(o) => Cqe {
                user_data,
                result: o.bytes as i64,
                path: o.path,
                reason: o.reason,
                result_flags: if o.eof { crate::uapi::RESULT_EOF } else { 0 },
                transport: o.transport,
                bounce_bytes: o.bounce_bytes,
            },
            Err(e) => Cqe {
                user_data,
                result: i64::from(e.to_errno()),
                path,
                ..Cqe::default()
            },
        };
        let mut inner = self.inner.lock();
        // Cannot fail: room was reserved at submit.
        let _ = inner.done.push_within_capacity(cqe);
        if let Some(efd) = &inner.eventfd {
            efd.signal();
        }
        drop(inner);
        self.completed.notify_all();
    }

    /// Moves up to `max` completions to `write` (in completion order); with `wait`, first
    /// waits for one. Returns how many were reaped. The completions are taken out of the queue
    /// and written with no lock held, so completing transfers never wait for a user's page
    /// fault and concurrent reapers get distinct completions; a fault puts them back at the
    /// front for the next `REAP` (their transfers stay counted in flight until written).
    pub(crate) fn reap(
        &self,
        max: u32,
        wait: bool,
        mut write: impl FnMut(&Cqe) -> Result,
    ) -> Result<u32> {
        let batch = {
            let mut inner = self.inner.lock();
            while wait && inner.done.is_empty() && inner.in_flight > 0 {
                if self.completed.wait_interruptible(&mut inner) {
                    return Err(ERESTARTSYS);
                }
            }
            let n = inner.done.len().min(max as usize);
            let mut batch = KVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
            batch.extend_from_slice(&inner.done[..n], GFP_KERNEL_ACCOUNT)?;
            let rest = inner.done.len() - n;
            for i in 0..rest {
                inner.done[i] = inner.done[n + i];
            }
            inner.done.truncate(rest);
            batch
        };
        let written = batch.iter().try_for_each(&mut write);
        let mut inner = self.inner.lock();
        match written {
            Ok(()) => inner.in_flight -= batch.len() as u32,
            Err(_) => {
                // Room is there: `done` had them, and its capacity covers every transfer
                // counted in flight, these included.
                for cqe in batch.iter() {
                    let _ = inner.done.push_within_capacity(*cqe);
                }
                inner.done.rotate_right(batch.len());
            }
        }
        drop(inner);
        // Reapers waiting for completions that were in this one's hands look again.
        self.completed.notify_all();
        written.map(|()| batch.len() as u32)
    }

    /// Signals `fd` (an eventfd) on every completion from now on; `-1` stops.
    pub(crate) fn set_eventfd(&self, fd: i32) -> Result {
        let efd = if fd == -1 {
            None
        } else {
            Some(EventFd::get(fd)?)
        };
        let old = core::mem::replace(&mut self.inner.lock().eventfd, efd);
        drop(old);
        Ok(())
    }
}
