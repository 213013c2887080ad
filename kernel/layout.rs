// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The check, at load, that the kernel structures the module reads or builds field by field
//! have in its Rust bindings the layout C gives them.
//!
//! The bindings are bindgen's reading of the kernel's headers, and bindgen can get a layout
//! wrong without a warning: it drops an alignment attribute on a member. In the 7.2 test
//! kernel (no `CONFIG_SCHEDSTATS`), `task_struct`'s `struct sched_statistics stats
//! ____cacheline_aligned` is empty; C aligns it to 64 bytes, bindgen does not, and every later
//! field of `task_struct` is 48 bytes early in Rust (`self_exec_id` read 1648 where C has
//! 1696). So the module reads no `task_struct` field through the bindings (`shim.c` does), and
//! refuses to load (`ENOEXEC`, each difference named in the kernel log) when any field or size
//! it does rely on differs between C (`shim.c`'s table) and the bindings (`RUST` below). No
//! lock; called once, first thing in the module's init.

use core::ffi::{
    c_char,
    CStr, //
};
use kernel::{
    bindings,
    prelude::*, //
};

use crate::dio;

/// One of `shim.c`'s layout facts.
#[repr(C)]
struct Fact {
    name: *const c_char,
    value: usize,
}

unsafe extern "C" {
    fn gdirect_layouts(len: *mut usize) -> *const Fact;
}

/// `"type.field"` and its offset in the bindings.
macro_rules! off {
    ($ty:ident, $name:literal, $($field:tt)+) => {
        (
            concat!(stringify!($ty), ".", $name),
            core::mem::offset_of!(bindings::$ty, $($field)+),
        )
    };
}

/// `"sizeof type"` and its size in the bindings.
macro_rules! size {
    ($ty:ident) => {
        (
            concat!("sizeof ", stringify!($ty)),
            core::mem::size_of::<bindings::$ty>(),
        )
    };
}

/// What the Rust code relies on, by the names `shim.c` gives the same facts.
const RUST: &[(&str, usize)] = &[
    off!(file, "f_inode", f_inode),
    off!(file, "f_op", f_op),
    off!(file, "f_mode", f_mode),
    ("FMODE_READ", dio::FMODE_READ as usize),
    ("FMODE_WRITE", dio::FMODE_WRITE as usize),
    ("FMODE_CAN_READ", dio::FMODE_CAN_READ as usize),
    ("FMODE_CAN_WRITE", dio::FMODE_CAN_WRITE as usize),
    off!(file_operations, "read_iter", read_iter),
    off!(file_operations, "write_iter", write_iter),
    off!(file, "f_mapping", f_mapping),
    off!(address_space, "host", host),
    off!(inode, "i_sb", i_sb),
    off!(inode, "i_mode", i_mode),
    off!(inode, "i_flags", i_flags),
    off!(super_block, "s_bdev", s_bdev),
    off!(super_block, "s_type", s_type),
    off!(file_system_type, "name", name),
    off!(block_device, "bd_disk", bd_disk),
    off!(block_device, "bd_device", bd_device),
    off!(gendisk, "part0", part0),
    off!(gendisk, "queue", queue),
    off!(gendisk, "diskseq", diskseq),
    off!(gendisk, "flags", flags),
    off!(
        request_queue,
        "limits.logical_block_size",
        limits.logical_block_size
    ),
    off!(device, "parent", parent),
    off!(device, "class", class),
    off!(device, "kobj", kobj),
    off!(device, "type", type_),
    off!(device, "bus", bus),
    off!(device, "groups", groups),
    off!(device, "driver", driver),
    off!(kobject, "name", name),
    off!(kobject, "sd", sd),
    off!(class, "name", name),
    off!(attribute, "name", name),
    off!(device_attribute, "attr", attr),
    off!(device_attribute, "show", __bindgen_anon_1.show),
    off!(attribute_group, "is_visible", __bindgen_anon_1.is_visible),
    off!(attribute_group, "attrs", __bindgen_anon_2.attrs),
    off!(device_driver, "name", name),
    off!(pci_driver, "driver", driver),
    off!(pci_driver, "driver_managed_dma", driver_managed_dma),
    off!(pci_dev, "bus", bus),
    off!(pci_dev, "devfn", devfn),
    off!(pci_dev, "resource", resource),
    off!(pci_dev, "dev", dev),
    off!(pci_dev, "acs_cap", acs_cap),
    off!(pci_bus, "number", number),
    off!(resource, "start", start),
    off!(resource, "end", end),
    off!(resource, "flags", flags),
    size!(resource),
    off!(pci_bus_region, "start", start),
    size!(pci_bus_region),
    off!(bio_vec, "bv_page", bv_page),
    off!(bio_vec, "bv_len", bv_len),
    off!(bio_vec, "bv_offset", bv_offset),
    size!(bio_vec),
    off!(kiocb, "ki_pos", ki_pos),
    off!(kiocb, "ki_flags", ki_flags),
    size!(kiocb),
    size!(iov_iter),
    off!(notifier_block, "notifier_call", notifier_call),
    off!(notifier_block, "next", next),
    off!(notifier_block, "priority", priority),
    size!(notifier_block),
    off!(miscdevice, "fops", fops),
    off!(miscdevice, "mode", mode),
    off!(file_operations, "owner", owner),
];

/// Compares the bindings with C: `ENOEXEC` when a fact differs or is missing on either side.
pub(crate) fn check() -> Result {
    let mut len = 0;
    // SAFETY: `gdirect_layouts` writes the length of the static table it returns.
    let facts = unsafe { gdirect_layouts(&mut len) };
    // SAFETY: a static table of `len` facts.
    let facts = unsafe { core::slice::from_raw_parts(facts, len) };
    let mut same = facts.len() == RUST.len();
    for &(name, rust) in RUST {
        // SAFETY: every name in the table is a static C string.
        let c = facts
            .iter()
            .find(|f| unsafe { CStr::from_ptr(f.name) }.to_bytes() == name.as_bytes());
        match c {
            Some(f) if f.value == rust => {}
            Some(f) => {
                pr_err!("{name}: {} in C, {rust} in the Rust bindings\n", f.value);
                same = false;
            }
            None => {
                pr_err!("{name}: not in shim.c's table\n");
                same = false;
            }
        }
    }
    if !same {
        pr_err!(
            "the kernel's structures differ from the bindings this module was built with \
             (shim.c has {} facts, layout.rs {}): not loading\n",
            facts.len(),
            RUST.len()
        );
        return Err(ENOEXEC);
    }
    Ok(())
}
