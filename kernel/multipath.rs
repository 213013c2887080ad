// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! NVMe native multipath (`CONFIG_NVME_MULTIPATH`, `nvme_core.multipath=Y`: how distribution
//! kernels ship).
//!
//! A namespace that several controllers can reach (every NVMe-oF namespace: nvmet reports a
//! multi-controller subsystem) appears as one *head* disk, `nvme<S>n<H>`, a child of its
//! subsystem's device (class `nvme-subsystem`, `nvme_mpath_set_live()`). The NVMe core sends each
//! bio of the head down one *path*, the hidden disk `nvme<S>c<C>n<H>` of one controller, chosen
//! per I/O by the subsystem's I/O policy (`nvme_find_path()`), and links every live path into the
//! head's `multipath` sysfs group under the path disk's name (`nvme_mpath_add_sysfs_link()`).
//!
//! The head's queue takes P2P pages only when every path's queue does: `nvme_mpath_alloc_disk()`
//! starts it with `BLK_FEAT_PCI_P2PDMA` and `blk_stack_limits()` clears it for a path without. So
//! a transfer to a head goes peer to peer only when all paths can, and the reach is checked for
//! every path's controller, since any of them may carry the bios. A head that refuses P2P pages
//! although one of its paths would take them is reported with the reason `multipath`.
//!
//! Above `storage` and `fabric`, below `io`. The paths are found as sysfs shows them: a walk
//! of the block class (`class_for_each_device()`, which holds each device while it is visited)
//! for the hidden disks the head's `multipath` directory links. The only lock of the module's
//! taken is `storage`'s unload fence, around the reading of each path's attributes.

use core::ffi::{
    c_int,
    c_void, //
};
use kernel::{
    bindings,
    pci,
    prelude::*,
    sync::aref::ARef, //
};

use crate::{
    fabric::dma_device_of,
    path::Reach,
    storage::{
        queue_takes_p2p,
        UnloadFence, //
    },
    uapi, //
};

/// The live paths of a multipath head, as far as the data path cares.
pub(crate) struct Paths {
    /// Paths linked from the head (live ones).
    pub(crate) count: u32,
    /// Paths whose queue takes P2P pages.
    pub(crate) p2p: u32,
    /// The paths' transport when they all share one, else `GDIRECT_TRANSPORT_UNKNOWN`.
    pub(crate) transport: u32,
    /// The PCI device that DMAs for each path that has one (an NVMe-oF path has none).
    pub(crate) dma_devs: KVec<ARef<pci::Device>>,
}

impl Paths {
    /// How the storage reaches memory that `reach` judges per PCI device: the worst over the
    /// paths, since the I/O policy may send any bio down any of them; a path without a PCI
    /// device (or no path at all) leaves the judgement to the driver that maps the pages.
    pub(crate) fn reach(&self, reach: impl Fn(&ARef<pci::Device>) -> Reach) -> Reach {
        let mut worst = if self.count == 0 || self.dma_devs.len() < self.count as usize {
            Reach::Unknown
        } else {
            Reach::Supported
        };
        for dev in self.dma_devs.iter() {
            match reach(dev) {
                Reach::NotSupported => return Reach::NotSupported,
                Reach::Unknown => worst = Reach::Unknown,
                Reach::Supported => {}
            }
        }
        worst
    }
}

/// The paths of the disk whose device is `disk_dev` when it is a multipath head, `None` for any
/// other disk.
///
/// # Safety
///
/// `disk_dev` is the device of a disk that stays registered for the call (the disk of an open
/// file).
pub(crate) unsafe fn paths_of(disk_dev: *mut bindings::device) -> Result<Option<Paths>> {
    // SAFETY: a registered device's parent and class outlive it; a class name is a static
    // C string.
    let head = unsafe {
        let parent = (*disk_dev).parent;
        !parent.is_null()
            && !(*parent).class.is_null()
            && CStr::from_char_ptr((*(*parent).class).name) == c"nvme-subsystem"
    };
    if !head {
        return Ok(None);
    }
    let mut walk = Walk {
        head: disk_dev,
        // SAFETY: the kernfs node of a registered device is valid; the lookup takes a
        // reference to what it finds, put below.
        group: unsafe {
            bindings::kernfs_find_and_get_ns(
                (*disk_dev).kobj.sd,
                c"multipath".as_char_ptr(),
                core::ptr::null(),
            )
        },
        paths: Paths {
            count: 0,
            p2p: 0,
            transport: uapi::TRANSPORT_UNKNOWN,
            dma_devs: KVec::new(),
        },
        result: Ok(()),
    };
    if !walk.group.is_null() {
        // SAFETY: a disk's class is the block class, registered for as long as the kernel
        // runs; `visit` gets `walk` back as its data and nothing else holds it meanwhile.
        unsafe {
            bindings::class_for_each_device(
                (*disk_dev).class,
                core::ptr::null(),
                (&raw mut walk).cast(),
                Some(visit),
            );
            bindings::kernfs_put(walk.group);
        }
    }
    walk.result?;
    Ok(Some(walk.paths))
}

/// The state of a walk over the block class looking for one head's paths.
struct Walk {
    head: *mut bindings::device,
    /// The head's `multipath` sysfs directory (a reference).
    group: *mut bindings::kernfs_node,
    paths: Paths,
    result: Result,
}

/// `class_for_each_device()` callback: records `dev` when it is a path of `data`'s head.
///
/// # Safety
///
/// `dev` is a registered device of the block class (the iterator holds a reference) and `data`
/// the `Walk` [`paths_of`] passes.
unsafe extern "C" fn visit(dev: *mut bindings::device, data: *mut c_void) -> c_int {
    // SAFETY: see the function's safety section.
    let walk = unsafe { &mut *data.cast::<Walk>() };
    // A device of the disk type is a whole disk's (partitions have their own type), embedded in
    // its `block_device`, whose disk it keeps; the head's `multipath` group links a path under
    // the path's own name, and the lookup's reference is put at once.
    // SAFETY: `dev` is a registered block-class device, and so is the head (see above).
    let disk = unsafe {
        if (*dev).type_ != (*walk.head).type_ {
            return 0;
        }
        let disk = (*kernel::container_of!(dev, bindings::block_device, bd_device)).bd_disk;
        if (*disk).flags & bindings::GENHD_FL_HIDDEN as c_int == 0 {
            return 0;
        }
        let link =
            bindings::kernfs_find_and_get_ns(walk.group, (*dev).kobj.name, core::ptr::null());
        if link.is_null() {
            return 0;
        }
        bindings::kernfs_put(link);
        disk
    };
    // The path's attributes read with its transport's module held back from unloading: an
    // unopened disk does not hold it (`storage`). A path deleted meanwhile is left out.
    // SAFETY: the iterator holds `dev`.
    let Some(_fence) = (unsafe { UnloadFence::hold(dev) }) else {
        return 0;
    };
    // SAFETY: a registered path disk and its device are valid during the walk.
    let (dma_dev, transport) = unsafe { dma_device_of(disk, dev) };
    let paths = &mut walk.paths;
    paths.transport = match paths.count {
        0 => transport,
        _ if paths.transport == transport => transport,
        _ => uapi::TRANSPORT_UNKNOWN,
    };
    paths.count += 1;
    // SAFETY: a registered disk's queue lives as long as the disk.
    if unsafe { queue_takes_p2p((*disk).queue) } {
        paths.p2p += 1;
    }
    if let Some(d) = dma_dev {
        if let Err(e) = paths.dma_devs.push(d, GFP_KERNEL_ACCOUNT) {
            walk.result = Err(e.into());
            // Stops the walk.
            return 1;
        }
    }
    0
}
