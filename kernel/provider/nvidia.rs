// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The `nvidia` provider: GPU memory through the nv-p2p interface of `nvidia.ko`.
//!
//! The nv-p2p functions are looked up when a registration needs them (`__symbol_get`), so gdirect
//! loads and works without any NVIDIA module, and holds a reference on the module that exports
//! them only while a registration uses them. The rig's emulated GPU exports the same functions.
//!
//! Revocation follows the nv-p2p rules, and what the open driver does (`kernel-open/nvidia/
//! nv-p2p.c` and the RM code it calls, 595.45.04): `nvidia_p2p_get_pages` takes a free callback,
//! which the GPU driver runs when the memory is freed (`cudaFree`) while registered, holding its
//! API lock, the lock that get_pages, put_pages and dma_map_pages also take. The page table stays
//! valid until the callback returns, and is freed right after. `nvidia_p2p_put_pages` returns 0
//! both when it put the pages (no callback will run) and when a free had already unlinked them
//! (`NV_ERR_OBJECT_NOT_FOUND`, turned into success): its return value cannot say whether the
//! callback ran, runs, or never will.
//!
//! So ownership is decided by the registration's [`Callback`] state, under its lock: the callback
//! is given a reference on the [`RegShared`] (`Armed`); the callback moves it to `Running`, then
//! `Done`, and never drops that reference; the registration's end moves `Armed` to `Putting`
//! before put_pages. After put_pages returns, `Putting` means the callback did not start (and,
//! put_pages having taken the API lock, will not), `Running` means wait for `Done`. Only then,
//! with the callback certainly finished or never to run, the registration drops the callback's
//! reference. The callback keeps its own reference while it runs, so the lock it releases last
//! is not freed under it, and [`CallbacksRunning`] lets the module's exit wait until no callback
//! is inside the module's code.
//!
//! nvidia.ko finds the pages to put by the calling process (`RmP2PGetInfoWithoutToken` looks
//! only at `osGetCurrentProcess()`'s records), and returns 0 when it finds none: from another
//! process or a kernel worker (the last reference of a registration may go in either),
//! put_pages would silently leave the pages and their callback registered. So the registration
//! puts only from the process that pinned, known by its `struct pid` ([`ThreadGroup`]), as the
//! driver knows it by its global tgid: a pid number relative to the caller's pid namespace could
//! name a stranger in another namespace, whose put_pages would put nothing while gdirect took the
//! callback's data back. Elsewhere it leaves the pages to the driver
//! (`Orphaned`): the callback, run when the memory is freed, then drops the last references
//! (and the module reference that keeps gdirect loaded until then). [`GET_PUT`] serializes
//! get_pages and put_pages, so that a put never meets a new page table that the driver made at
//! the address of one it freed after our callback.
//!
//! No nv-p2p function is called while holding a use or `RegShared::inner` (the callback waits
//! for the uses under the API lock): peer addresses of GPU memory are made by gdirect
//! (`region.rs`), not with `nvidia_p2p_dma_map_pages`.

use core::{
    ffi::c_void,
    ptr::NonNull, //
};
use kernel::{
    bindings,
    prelude::*,
    sync::{
        atomic::{
            Acquire,
            Atomic,
            Relaxed,
            Release, //
        },
        Arc,
        ArcBorrow, //
    },
};

use super::{
    PinResult,
    Pinned, //
};
use crate::{
    error,
    modref::ModuleRef,
    nv_p2p,
    revocation::{
        Callback,
        NvidiaRevoke,
        RegShared, //
    },
    stats,
    topology::Owner,
};

kernel::sync::global_lock! {
    // SAFETY: `GdirectModule::init` initializes it before the device can be opened.
    pub(crate) unsafe(uninit) static GET_PUT: Mutex<()> = ();
}

/// A thread group, by its `struct pid` (a counted reference): the identity nvidia.ko's
/// put_pages goes by (`current->tgid`, global), which no pid number relative to a pid
/// namespace can stand for (two processes in two namespaces may share a number).
struct ThreadGroup(NonNull<bindings::pid>);

// SAFETY: a counted `struct pid` reference may be held and dropped from any thread.
unsafe impl Send for ThreadGroup {}
// SAFETY: it is only compared by address.
unsafe impl Sync for ThreadGroup {}

impl ThreadGroup {
    /// The calling task's thread group.
    fn current() -> Option<Self> {
        // SAFETY: `current` is a live task; a non-NULL result holds a reference on the pid.
        NonNull::new(unsafe {
            bindings::get_task_pid(kernel::current!().as_ptr(), bindings::pid_type_PIDTYPE_TGID)
        })
        .map(Self)
    }

    /// Whether the calling task belongs to this thread group.
    fn is_current(&self) -> bool {
        Self::current().is_some_and(|now| now.0 == self.0)
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        // SAFETY: the reference taken by `get_task_pid`, dropped once.
        unsafe { bindings::put_pid(self.0.as_ptr()) };
    }
}

/// nv-p2p requires 64 KiB aligned GPU virtual addresses and lengths.
pub(crate) const ALIGNMENT: u64 = 64 << 10;

/// The nv-p2p functions gdirect calls, each with a reference on the module exporting it.
pub(crate) struct NvP2p {
    get_pages: nv_p2p::GetPagesFn,
    get_pages_persistent: nv_p2p::GetPagesPersistentFn,
    put_pages: nv_p2p::PutPagesFn,
    put_pages_persistent: nv_p2p::PutPagesPersistentFn,
    free_page_table: nv_p2p::FreePageTableFn,
}

/// The symbols, in the order of [`NvP2p`]'s fields.
const SYMBOLS: [&CStr; 5] = [
    c"nvidia_p2p_get_pages",
    c"nvidia_p2p_get_pages_persistent",
    c"nvidia_p2p_put_pages",
    c"nvidia_p2p_put_pages_persistent",
    c"nvidia_p2p_free_page_table",
];

fn symbol_get(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: `name` is a NUL-terminated string; a non-NULL result holds a module reference.
    NonNull::new(unsafe { bindings::__symbol_get(name.as_char_ptr()) })
}

fn symbol_put(name: &CStr) {
    // SAFETY: called once for each successful `symbol_get` of `name`.
    unsafe { bindings::__symbol_put(name.as_char_ptr()) };
}

impl NvP2p {
    /// Whether the GPU driver's nv-p2p interface is loaded now.
    pub(crate) fn present() -> bool {
        Self::get().is_ok()
    }

    /// Looks the functions up; `EOPNOTSUPP` unless all are exported.
    pub(crate) fn get() -> Result<Self> {
        let mut found = [None; SYMBOLS.len()];
        for (slot, name) in found.iter_mut().zip(SYMBOLS) {
            *slot = symbol_get(name);
        }
        let [Some(a), Some(b), Some(c), Some(d), Some(e)] = found else {
            for (sym, name) in found.iter().zip(SYMBOLS) {
                if sym.is_some() {
                    symbol_put(name);
                }
            }
            return Err(error::provider_unavailable());
        };
        // SAFETY: each symbol is the nv-p2p function of that name, with the signature of
        // `nv-p2p.h` that the types spell out; the module stays loaded while we hold them.
        unsafe {
            Ok(Self {
                get_pages: core::mem::transmute::<*mut c_void, nv_p2p::GetPagesFn>(a.as_ptr()),
                get_pages_persistent: core::mem::transmute::<
                    *mut c_void,
                    nv_p2p::GetPagesPersistentFn,
                >(b.as_ptr()),
                put_pages: core::mem::transmute::<*mut c_void, nv_p2p::PutPagesFn>(c.as_ptr()),
                put_pages_persistent: core::mem::transmute::<
                    *mut c_void,
                    nv_p2p::PutPagesPersistentFn,
                >(d.as_ptr()),
                free_page_table: core::mem::transmute::<*mut c_void, nv_p2p::FreePageTableFn>(
                    e.as_ptr(),
                ),
            })
        }
    }
}

impl Drop for NvP2p {
    fn drop(&mut self) {
        for name in SYMBOLS {
            symbol_put(name);
        }
    }
}

/// GPU memory pinned through nv-p2p.
pub(crate) struct NvidiaPages {
    nv: NvP2p,
    va: u64,
    table: NonNull<nv_p2p::PageTable>,
    persistent: bool,
    shared: Arc<RegShared>,
    /// The callback's reference on `shared` (from `Arc::into_raw`), dropped by `drop` once the
    /// callback has finished or can no longer run, or by the callback itself when orphaned
    /// (see the module docs).
    callback_ref: Option<NonNull<RegShared>>,
    /// The thread group that pinned the pages: the only one whose put_pages finds them.
    pinner: ThreadGroup,
}

// SAFETY: the page table belongs to the GPU driver and is only read; the callback reference is
// an `Arc` in raw form.
unsafe impl Send for NvidiaPages {}
// SAFETY: as above.
unsafe impl Sync for NvidiaPages {}

/// Free callbacks inside the module's code now; the module's exit waits for none.
pub(crate) struct CallbacksRunning;

static CALLBACKS_RUNNING: Atomic<u32> = Atomic::new(0);

impl CallbacksRunning {
    /// Waits until no free callback runs the module's code. By then every registration has
    /// ended, so none can start.
    pub(crate) fn wait_none() {
        while CALLBACKS_RUNNING.load(Acquire) != 0 {
            // The module's exit may sleep.
            kernel::time::delay::fsleep(kernel::time::Delta::from_millis(1));
        }
    }
}

/// The free callback: the GPU driver takes the memory back (`cudaFree`), holding its API lock.
///
/// # Safety
///
/// `data` is the callback's reference given to `nvidia_p2p_get_pages` in raw form, which the
/// registration keeps until this callback is `Done` or can no longer run.
unsafe extern "C" fn free_callback(data: *mut c_void) {
    CALLBACKS_RUNNING.fetch_add(1, Relaxed);
    // SAFETY: see above: the reference is valid for the whole call. The callback takes its own
    // reference, so that what it unlocks last stays valid even once its waiter has gone.
    let shared: Arc<RegShared> = unsafe { ArcBorrow::from_raw(data.cast::<RegShared>()) }.into();
    // It waits for the uses of the pages to end.
    kernel::task::might_sleep();
    let found = shared.callback_transition(
        &[Callback::Armed, Callback::Putting, Callback::Orphaned],
        Callback::Running,
    );
    if !matches!(
        found,
        Callback::Armed | Callback::Putting | Callback::Orphaned
    ) {
        // A second call for the same pages: nothing is left to take back.
        drop(shared);
        CALLBACKS_RUNNING.fetch_sub(1, Release);
        return;
    }
    // No use of the pages can start from here on, and the current ones have ended.
    let (peers, nvidia) = shared.revoke();
    // Undo the DMA mappings of the BAR pages for peers, before the driver reuses them.
    drop(peers);
    // The nv-p2p rules: from the callback, hand the page table back with the free function
    // (never put it); the driver frees it once this returns.
    if let Some(nv) = nvidia {
        // SAFETY: `table` is the page table this callback is about, valid until it returns.
        unsafe { (nv.free_page_table)(nv.table) };
    }
    stats::REVOCATIONS.fetch_add(1, Relaxed);
    shared.callback_transition(&[Callback::Running], Callback::Done);
    drop(shared);
    if found == Callback::Orphaned {
        // The registration is gone: its reference and the module reference it took are ours.
        // SAFETY: an orphaned registration left its callback's reference to this callback.
        drop(unsafe { Arc::from_raw(data.cast::<RegShared>()) });
        // SAFETY: the reference the registration leaked when it was orphaned, for this
        // callback only; `CALLBACKS_RUNNING` still keeps the module's exit waiting.
        drop(unsafe { ModuleRef::adopt() });
    }
    // The last access to the module's data: from here only the return remains.
    CALLBACKS_RUNNING.fetch_sub(1, Release);
}

/// Maps an nv-p2p error to gdirect's meaning.
fn get_pages_error(ret: i32) -> Error {
    match ret {
        // The GPU driver does not know the range: not GPU memory of this process.
        r if r == EINVAL.to_errno() => ENXIO,
        r if r == ENOMEM.to_errno() => ENOMEM,
        _ => error::provider_unavailable(),
    }
}

/// Pins the GPU memory at GPU virtual address `va`, with `reserve`'s share of the limits taken
/// once `GET_PUT` is ours (a put that holds it may wait for a free's callback, which waits for
/// every transfer on the freed memory: nothing is reserved while this one waits behind it).
pub(crate) fn pin<R>(
    va: u64,
    len: u64,
    persistent: bool,
    shared: &Arc<RegShared>,
    reserve: impl FnOnce() -> Result<R>,
) -> Result<(PinResult, R)> {
    let nv = NvP2p::get()?;
    // Taken before the pages: a task that is exiting may have no thread group left.
    let pinner = ThreadGroup::current().ok_or(ESRCH)?;
    let mut table: *mut nv_p2p::PageTable = core::ptr::null_mut();
    let mut callback_ref = None;
    let get_put = GET_PUT.lock();
    // Given back by its drop on every failure below, after the pages.
    let reserved = reserve()?;
    let ret = if persistent {
        // SAFETY: `table` is a valid location for the result.
        unsafe { (nv.get_pages_persistent)(va, len, &mut table, 0) }
    } else {
        let data = Arc::into_raw(shared.clone()).cast_mut();
        callback_ref = NonNull::new(data);
        // Armed before the driver has it: the callback may run before `get_pages` returns.
        shared.callback_transition(&[Callback::None], Callback::Armed);
        // SAFETY: as above; `data` stays valid until `NvidiaPages::drop` (see the module docs).
        unsafe { (nv.get_pages)(0, 0, va, len, &mut table, Some(free_callback), data.cast()) }
    };
    drop(get_put);
    let Some(table) = NonNull::new(table).filter(|_| ret == 0) else {
        if let Some(data) = callback_ref {
            // A failed `get_pages` registers no callback (`nv_p2p_get_pages` registers it last,
            // and only on success).
            shared.callback_transition(&[Callback::Armed], Callback::None);
            // SAFETY: the callback will never run: take its reference back.
            drop(unsafe { Arc::from_raw(data.as_ptr()) });
        }
        return Err(get_pages_error(ret));
    };
    shared.set_nvidia(NvidiaRevoke {
        free_page_table: nv.free_page_table,
        table: table.as_ptr(),
    });
    let pages = NvidiaPages {
        nv,
        va,
        table,
        persistent,
        shared: shared.clone(),
        callback_ref,
        pinner,
    };
    // Check what the GPU driver returned before trusting it.
    let _use = shared.begin_use()?;
    // SAFETY: the page table is valid while the pages are in use.
    let t = match unsafe { nv_p2p::read_page_table(table.as_ptr()) } {
        Ok(t) => t,
        Err(version) => {
            if printk_ratelimit() {
                pr_warn!(
                    "nvidia.ko returned an nv-p2p page table of version {:#010x}, which this \
                     gdirect does not know (it reads 0x00010002, drivers before 580.65.06, and \
                     0x0002xxxx, 580.65.06 to 595): update gdirect for this NVIDIA driver\n",
                    version
                );
            }
            return Err(error::unknown_page_table());
        }
    };
    let page_size = nv_p2p::PageSize::from_raw(t.page_size).ok_or(error::provider_unavailable())?;
    if t.pages.is_null() || u64::from(t.entries) * page_size.get() != len {
        return Err(error::provider_unavailable());
    }
    // A GPU page smaller than the CPU's (4 KiB GPU pages on a kernel of 16 or 64 KiB pages)
    // cannot be described by whole CPU pages: the pages of a transfer are CPU pages.
    if page_size.get() % super::PAGE_SIZE as u64 != 0 {
        return Err(error::provider_unavailable());
    }
    // Coherent GPU memory, addressed outside any BAR (see the flag's docs): no P2PDMA pages.
    if t.flags & nv_p2p::PAGE_TABLE_FLAGS_CPU_CACHEABLE != 0 {
        return Err(error::no_struct_pages());
    }
    let owner = pages.phys(0).and_then(Owner::of_phys).ok_or(ENXIO)?;
    if (0..t.entries as usize).any(|i| {
        !pages
            .phys(i)
            .is_some_and(|p| owner.contains(p, page_size.get()))
    }) {
        return Err(ENXIO);
    }
    // Only P2PDMA pages can be handed to the block layer (and the bounce path's CPU copy needs
    // them too): BAR memory without `struct page` is refused here, with its own errno, rather
    // than failing or faulting at the first transfer. Every page of every GPU page is checked.
    let cpu_pages = page_size.get() / super::PAGE_SIZE;
    let all_p2pdma = (0..t.entries as usize).all(|i| {
        (0..cpu_pages).all(|k| {
            pages
                .phys(i)
                .and_then(|p| super::p2pdma_page(p + k * super::PAGE_SIZE))
                .is_some()
        })
    });
    if !all_p2pdma {
        return Err(error::no_struct_pages());
    }
    let page_count = u64::from(t.entries);
    drop(_use);
    let pinned = PinResult {
        pinned: Pinned::Nvidia(pages),
        owner: Some(owner),
        page_size,
        page_count,
    };
    Ok((pinned, reserved))
}

impl NvidiaPages {
    /// The physical address of page `i`; the caller holds a use of the pages.
    pub(crate) fn phys(&self, i: usize) -> Option<u64> {
        // SAFETY: the table is valid while the pages are in use, and has `entries` pages; `pin`
        // read its version, so it is of a generation whose `pages` and `entries` are these.
        unsafe {
            let t = self.table.as_ref();
            (i < t.entries as usize).then(|| (**t.pages.add(i)).physical_address)
        }
    }
}

/// Whether a warning a user can trigger (by what it registers and frees) may be printed now:
/// the kernel's shared printk rate limit (`printk_ratelimit()`, 10 per 5 s), so that no user
/// floods the log.
fn printk_ratelimit() -> bool {
    // SAFETY: `__printk_ratelimit` only reads the name, a NUL-terminated string.
    unsafe { bindings::__printk_ratelimit(c"gdirect".as_char_ptr()) != 0 }
}

/// The registration's share of the pin limits goes back where its pages do: when they are put
/// here, or (pages left to the driver, or a callback under way) at the free's revocation, which
/// takes it itself. Pages left to the driver stay pinned, and in BAR1, until the memory is
/// freed, so their share stays charged until then.
impl Drop for NvidiaPages {
    fn drop(&mut self) {
        if self.persistent {
            // SAFETY: the table came from `get_pages_persistent` and is put once.
            let ret = unsafe { (self.nv.put_pages_persistent)(self.va, self.table.as_ptr(), 0) };
            if ret != 0 && printk_ratelimit() {
                pr_warn!("nvidia_p2p_put_pages_persistent failed: {ret}\n");
            }
            drop(self.shared.take_account());
            return;
        }
        let Some(data) = self.callback_ref.take() else {
            drop(self.shared.take_account());
            return;
        };
        let shared = &self.shared;
        let get_put = GET_PUT.lock();
        if !self.pinner.is_current() {
            // put_pages would find nothing from here: leave the pages to the driver.
            if self.orphan(&[Callback::Armed]) {
                return;
            }
        } else if shared.callback_transition(&[Callback::Armed], Callback::Putting)
            == Callback::Armed
        {
            // The callback has not started, so the driver has not freed the table; should a
            // free start now, it runs the callback before put_pages returns (both take its API
            // lock), and `GET_PUT` keeps a new table from taking this one's address meanwhile.
            // SAFETY: the table came from `get_pages`, is put at most once, and is live.
            let ret = unsafe { (self.nv.put_pages)(0, 0, self.va, self.table.as_ptr()) };
            if ret != 0 {
                if printk_ratelimit() {
                    pr_warn!(
                        "nvidia_p2p_put_pages failed: {ret}; leaving the pages to the driver\n"
                    );
                }
                if self.orphan(&[Callback::Putting]) {
                    return;
                }
            } else if shared.callback_transition(&[Callback::Putting], Callback::None)
                == Callback::Putting
            {
                drop(get_put);
                drop(shared.take_account());
                // SAFETY: put and never called back: the callback's reference is ours.
                drop(unsafe { Arc::from_raw(data.as_ptr()) });
                return;
            }
        }
        drop(get_put);
        // The callback started (`Running`, `Done`): it owns the pages until it is done.
        shared.wait_callback();
        // SAFETY: the callback has finished (see the module docs): its reference is ours.
        drop(unsafe { Arc::from_raw(data.as_ptr()) });
    }
}

impl NvidiaPages {
    /// Leaves the pages, from one of the states `from`, to the driver and the callback
    /// (`Orphaned`), with a module reference for the callback to drop. `false` when the
    /// callback started first (then it owns the pages until it is done).
    fn orphan(&self, from: &[Callback]) -> bool {
        // Taken first: the callback may run and put it as soon as the state is `Orphaned`.
        // SAFETY: the registration ends in an operation of an open file or in a batched
        // transfer, each of which holds a module reference (see `modref`).
        let module_ref = unsafe { ModuleRef::get() };
        if from.contains(&self.shared.callback_transition(from, Callback::Orphaned)) {
            module_ref.leak();
            stats::ORPHANED.fetch_add(1, Relaxed);
            return true;
        }
        false
    }
}
