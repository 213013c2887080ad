// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Facts about a storage device, read from the kernel's driver model: the PCI function above a
//! disk, an NVMe controller's transport (and any device attribute of an ancestor), and whether
//! a disk's queue takes P2PDMA pages. This is a floor under the data path (`io`), the fabric
//! lookups (`fabric`) and multipath heads (`multipath`): it imports nothing of the module's
//! but the ABI's constants. It takes no lock; the transports it has read are cached in atomics.
//!
//! A device attribute is read by calling its `show` function, as sysfs does, but without the
//! kernfs active reference sysfs holds across it (which only keeps the attribute from being
//! removed meanwhile; the functions are not exported). What the show functions read stays
//! valid by other references: for a disk the transfer's file has open, the namespace's open
//! (`nvme_ns_open()`) holds the namespace, so its controller, and the transport's module (whose
//! `ops` a controller's attributes read), and a device's attribute groups are static data of
//! nvme-core. For the paths of a multipath head (`multipath`), which are not opened,
//! `class_for_each_device()` holds each path's device and so its controller's memory, but not
//! the transport's module, whose `ops` the attributes read (and, for `address`, call): a path's
//! attributes are read under [`UnloadFence::hold`], which an `rmmod` of any module waits for
//! between the module's exit and the freeing of its memory, and only while the path's device is
//! still registered (a transport's exit deletes its controllers' disks first).
//!
//! Lock order: [`UnloadFence`]'s mutex is a leaf but for what the show functions take (an
//! nvme-tcp queue's lock); an unload takes it after the module's exit, holding nothing but the
//! notifier chain.

use core::ffi::{
    c_int,
    c_void, //
};
use kernel::{
    bindings, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
    },
    types::Opaque,
};

use crate::uapi;

unsafe extern "C" {
    // `shim.c`; a `request_queue` crosses as `void *` (see `topology.rs` on the lint).
    fn gdirect_blk_queue_pci_p2pdma(q: *mut c_void) -> bool;
    fn gdirect_page_address(page: *mut c_void) -> *mut c_void;
    fn gdirect_device_is_registered(dev: *mut c_void) -> c_int;
}

kernel::sync::global_lock! {
    // SAFETY: `UnloadFence::register`, at the module's init, initializes it before the device
    // exists.
    unsafe(uninit) static SHOWING: Mutex<()> = ();
}

/// A module notifier that makes the unload of any module wait, after the module's exit and
/// before its memory is freed (`delete_module()` notifies `MODULE_STATE_GOING` between the
/// two), for the attributes of unopened disks being read ([`UnloadFence::hold`]). Unregistered
/// when dropped.
pub(crate) struct UnloadFence(KBox<Opaque<bindings::notifier_block>>);

impl UnloadFence {
    /// Registers the notifier.
    ///
    /// # Safety
    ///
    /// Called once, at the module's init, before anything can call [`UnloadFence::hold`].
    pub(crate) unsafe fn register() -> Result<Self> {
        // SAFETY: the caller's promise: nothing uses the lock yet.
        unsafe { SHOWING.init() };
        let nb = KBox::new(
            Opaque::new(bindings::notifier_block {
                notifier_call: Some(module_going),
                next: core::ptr::null_mut(),
                priority: 0,
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: the block lives on the heap until `drop` has unregistered it.
        kernel::error::to_result(unsafe { bindings::register_module_notifier(nb.get()) })?;
        Ok(Self(nb))
    }

    /// Holds back the end of every module's unload while the result lives, if `dev` is still
    /// registered; `None` if it is not (its driver may be past its exit).
    ///
    /// # Safety
    ///
    /// `dev` is a device the caller holds a reference to.
    pub(crate) unsafe fn hold(dev: *mut bindings::device) -> Option<impl Sized> {
        let fence = SHOWING.lock();
        // SAFETY: the caller's reference keeps `dev` valid. `device_del()` clears the flag, and
        // a transport's exit deletes its disks before the unload's notifier takes the lock, so
        // a flag read set under the lock means the notifier has yet to take it.
        let registered = unsafe { gdirect_device_is_registered(dev.cast()) } != 0;
        registered.then_some(fence)
    }
}

// SAFETY: the notifier block is only handed to the notifier chain, which serializes its use.
unsafe impl Send for UnloadFence {}
// SAFETY: shared references do nothing with the block.
unsafe impl Sync for UnloadFence {}

impl Drop for UnloadFence {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; this waits for a notification in progress.
        unsafe { bindings::unregister_module_notifier(self.0.get()) };
    }
}

/// The notifier's callback: on `MODULE_STATE_GOING`, waits for the attribute reads under way.
///
/// # Safety
///
/// Called by the module notifier chain.
unsafe extern "C" fn module_going(
    _nb: *mut bindings::notifier_block,
    action: kernel::ffi::c_ulong,
    _module: *mut c_void,
) -> c_int {
    if action == bindings::module_state_MODULE_STATE_GOING as kernel::ffi::c_ulong {
        drop(SHOWING.lock());
    }
    bindings::NOTIFY_DONE as c_int
}

/// Transports of the disks used lately, by `diskseq` (unique per disk and per media change,
/// never reused): `diskseq << 8 | transport`, 0 for none, direct-mapped by `diskseq % 8`. Reading
/// the controller's `transport` attribute costs a page and a scan of attribute groups, which a
/// 4 KiB read should not pay each time.
static TRANSPORTS: [Atomic<u64>; 8] = [const { Atomic::new(0) }; 8];

/// The transport of `disk`, whose device is `disk_dev` (see [`TRANSPORTS`]). An answer made
/// without the attribute because a page could not be allocated is reported, not cached.
pub(crate) fn transport_of(
    disk: *mut bindings::gendisk,
    disk_dev: *mut bindings::device,
    pci: bool,
) -> u32 {
    // SAFETY: the disk of an open file's block device outlives the file; `diskseq` is set
    // before the disk is added and changes only with its media.
    let seq = unsafe { (*disk).diskseq };
    let slot = &TRANSPORTS[(seq % TRANSPORTS.len() as u64) as usize];
    let cached = slot.load(Relaxed);
    if cached != 0 && cached >> 8 == seq {
        return (cached & 0xff) as u32;
    }
    let found = nvme_transport(disk_dev);
    let transport = match found {
        Ok(Some(t)) => t,
        _ if pci => uapi::TRANSPORT_PCIE,
        _ => uapi::TRANSPORT_UNKNOWN,
    };
    if found.is_ok() {
        slot.store(seq << 8 | u64::from(transport & 0xff), Relaxed);
    }
    transport
}

/// The transport of the NVMe controller at or above `dev`, from the controller's own
/// `transport` attribute (`nvme_sysfs_show_transport`): the driver-model way to ask it, since
/// `struct nvme_ctrl` is private to the NVMe core.
fn nvme_transport(dev: *mut bindings::device) -> Result<Option<u32>> {
    // SAFETY: `dev` and its ancestors are valid while the disk below them is.
    unsafe {
        ancestor_attr(dev, c"transport", |text| {
            match text.split(|b| *b == b'\n').next().unwrap_or(&[]) {
                b"pcie" => uapi::TRANSPORT_PCIE,
                b"rdma" => uapi::TRANSPORT_RDMA,
                b"tcp" => uapi::TRANSPORT_TCP,
                b"loop" => uapi::TRANSPORT_LOOP,
                b"fc" => uapi::TRANSPORT_FC,
                _ => uapi::TRANSPORT_UNKNOWN,
            }
        })
    }
}

/// `parse` applied to the text of the device attribute `name` of the nearest device at or above
/// `dev` that has one (an NVMe controller's `transport` or `address`, for a disk below it).
/// `None` when no device on the way has it, or its show function gives nothing.
///
/// # Safety
///
/// `dev` and its ancestors are valid for the call.
pub(crate) unsafe fn ancestor_attr<R>(
    mut dev: *mut bindings::device,
    name: &CStr,
    parse: impl FnOnce(&[u8]) -> R,
) -> Result<Option<R>> {
    let page = kernel::page::Page::alloc_page(GFP_KERNEL)?;
    while !dev.is_null() {
        // SAFETY: `dev` is valid (see the safety section).
        if let Some(attr) = unsafe { device_attr(dev, name) } {
            // SAFETY: `attr` is an attribute of `dev`, which lives as long.
            let Some(show) = (unsafe { (*attr).__bindgen_anon_1.show }) else {
                return Ok(None);
            };
            // SAFETY: the page is ours, mapped, and a page long.
            let buf = unsafe { gdirect_page_address(page.as_ptr().cast()) }.cast::<u8>();
            // SAFETY: a show function writes at most a page into `buf`.
            let n = unsafe { show(dev, attr, buf.cast()) };
            if n <= 0 {
                return Ok(None);
            }
            // SAFETY: the show function wrote `n` bytes (at most a page) into `buf`.
            let text = unsafe {
                core::slice::from_raw_parts(buf, (n as usize).min(kernel::page::PAGE_SIZE))
            };
            return Ok(Some(parse(text)));
        }
        // SAFETY: as above.
        dev = unsafe { (*dev).parent };
    }
    Ok(None)
}

/// The device attribute `name` among `dev`'s attribute groups, if it has one that sysfs shows:
/// an attribute its group's `is_visible` hides (an NVMe controller's `address` when its
/// transport has no `get_address`, as nvme-loop) may have a show function that cannot run.
///
/// # Safety
///
/// `dev` is a valid device.
unsafe fn device_attr(
    dev: *mut bindings::device,
    name: &CStr,
) -> Option<*mut bindings::device_attribute> {
    // SAFETY: the groups of a registered device are NULL-terminated arrays of valid groups,
    // whose attribute arrays are NULL-terminated too, and live as long as the device; a
    // group's `is_visible` takes the device's kobject, an attribute of the group and its index.
    unsafe {
        let mut groups = (*dev).groups;
        while !groups.is_null() && !(*groups).is_null() {
            let group = *groups;
            let mut attrs = (*group).__bindgen_anon_2.attrs;
            let mut n = 0;
            while !attrs.is_null() && !(*attrs).is_null() {
                let attr = *attrs;
                if !(*attr).name.is_null() && CStr::from_char_ptr((*attr).name) == name {
                    // As sysfs decides it (`create_files()`): a mode of 0, past the group flag, hides.
                    let shown = match (*group).__bindgen_anon_1.is_visible {
                        Some(is_visible) => {
                            is_visible(&raw mut (*dev).kobj, attr, n)
                                & !(bindings::SYSFS_GROUP_INVISIBLE as u16)
                                != 0
                        }
                        None => true,
                    };
                    return shown
                        .then(|| kernel::container_of!(attr, bindings::device_attribute, attr));
                }
                attrs = attrs.add(1);
                n += 1;
            }
            groups = groups.add(1);
        }
    }
    None
}

/// Whether `queue` takes P2PDMA pages (`BLK_FEAT_PCI_P2PDMA`).
///
/// # Safety
///
/// `queue` is the queue of a disk that stays registered for the call.
pub(crate) unsafe fn queue_takes_p2p(queue: *mut bindings::request_queue) -> bool {
    // SAFETY: see the function's safety section.
    unsafe { gdirect_blk_queue_pci_p2pdma(queue.cast()) }
}

/// The nearest PCI device at or above `dev` in the device tree, with a reference.
pub(crate) fn pci_ancestor(mut dev: *mut bindings::device) -> Option<ARef<pci::Device>> {
    while !dev.is_null() {
        // SAFETY: `dev` and its ancestors are valid while the disk below them is.
        if unsafe { (*dev).bus } == (&raw const bindings::pci_bus_type).cast_mut() {
            // SAFETY: a device on the PCI bus is embedded in a `pci_dev`.
            let pdev = unsafe { kernel::container_of!(dev, bindings::pci_dev, dev) };
            // SAFETY: `pci::Device` is a transparent wrapper of `pci_dev`, valid (see above).
            let pdev: &pci::Device = unsafe { &*pdev.cast::<pci::Device>() };
            return Some(ARef::from(pdev));
        }
        // SAFETY: as above.
        dev = unsafe { (*dev).parent };
    }
    None
}
