// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! gdirect: GPU-direct storage.
//!
//! A peer-memory client: it pins device memory, translates its pages into bus addresses for the
//! storage drivers, and reads and writes file data straight into it. Userspace drives it through
//! the ioctls of `/dev/gdirect`, defined in `include/uapi/linux/gdirect.h`.
//!
//! This file holds the module object (one per load), the list of the module's parts and the misc
//! device registration; each concept lives in its own file.

use kernel::prelude::*;

// Fields of kernel structs are read through bindgen's types in a few places (a file's inode
// and block device, a queue's limits, a PCI function's BARs, a device's attribute groups).
// The types are generated from this kernel's own headers and configuration, with no
// randomized layouts (`init/Kconfig`: `RUST` depends on `!RANDSTRUCT`), but bindgen can still
// place a field where C does not (it drops member alignment attributes: `task_struct`, whose
// fields are therefore read in C): `layout` checks each field and size the module relies on
// against C's at load, and the module refuses to load when one differs.
//
// Lengths, offsets and page counts cross between `u64` (the ABI) and `usize` (the kernel's
// sizes) with `as usize` in places where a 64-bit `usize` holds every value the ABI allows;
// on a 32-bit kernel they would truncate. GPU nodes are 64-bit: the module does not build
// elsewhere.
#[cfg(not(CONFIG_64BIT))]
compile_error!("gdirect needs a 64-bit kernel (CONFIG_64BIT)");

mod batch;
mod bounce;
mod dio;
mod error;
mod fabric;
mod file;
mod io;
mod layout;
mod memlock;
mod memory;
mod misc;
mod modref;
mod multipath;
#[allow(
    dead_code,
    reason = "the nv-p2p header is mirrored whole; the module reads only some of its definitions"
)]
mod nv_p2p;
mod path;
mod provider;
mod region;
mod revocation;
mod stats;
mod storage;
mod submitter;
mod topology;
mod uapi;
mod users;

use file::GdirectFile;
use misc::OwnedMiscDevice;

module! {
    type: GdirectModule,
    name: "gdirect",
    authors: ["The gdirect authors"],
    description: "GPU-direct storage: peer-memory client for NVMe and NVMe over Fabrics",
    license: "GPL",
    params: {
        max_pinned_bytes: u64 {
            default: 64 << 30,
            description: "Most bytes all registrations together may pin (default 64 GiB)",
        },
        max_pinned_bytes_per_user: u64 {
            default: 32 << 30,
            description: "Most bytes the registrations of one user (the real uid that opened the device) may pin, half the default max_pinned_bytes by default (set both when changing one); 0: only max_pinned_bytes applies (default 32 GiB)",
        },
        max_registrations: u32 {
            default: 65536,
            description: "Most registrations one open file may hold (default 65536)",
        },
        max_in_flight: u32 {
            default: 128,
            description: "Most batched transfers one open file may have in flight; 0 counts as 1 (default 128)",
        },
        max_in_flight_per_user: u32 {
            default: 256,
            description: "Most batched transfers the files of one user (and of the users whose namespaces it runs in) may have running, over all its files and processes: at most half of the 512 that the module's workqueue runs at once on a CPU (the submitting one), so that no user takes every worker; 0: only max_in_flight per file applies (default 256)",
        },
        max_in_flight_bytes: u64 {
            default: 64 << 20,
            description: "Most bytes of storage I/O one registration may have running on its memory, which bounds what a free of the memory (cudaFree) waits for (README: A free's wait is bounded); one transfer's 8 MiB chunk always runs, so a cap below 8 MiB bounds no tighter; 0: no cap (default 64 MiB)",
        },
        max_in_flight_bytes_per_user: u64 {
            default: 256 << 20,
            description: "Most bytes of storage I/O the transfers of one user (and of the users whose namespaces it runs in) may have running, its share of a drive's queue (one 8 MiB chunk always runs); 0: no cap (default 256 MiB)",
        },
        bounce_buffers: u32 {
            default: 32,
            description: "1 MiB chunks of host memory the bounce path may use; 0 counts as 1 (default 32)",
        },
        max_bounce_per_user: u32 {
            default: 16,
            description: "Most bounce chunks one user (and the users whose namespaces it runs in) may hold at a time, waiting for its own beyond; 0: only bounce_buffers applies (default 16)",
        },
    },
}

/// The limits set at load: `(max_pinned_bytes, max_registrations)`.
pub(crate) fn limits() -> (u64, u32) {
    (
        *module_parameters::max_pinned_bytes.value(),
        *module_parameters::max_registrations.value(),
    )
}

/// The per-user limit on pinned bytes, 0 for none (module parameter).
pub(crate) fn max_pinned_bytes_per_user() -> u64 {
    *module_parameters::max_pinned_bytes_per_user.value()
}

/// The per-file limit on batched transfers in flight (module parameter).
pub(crate) fn max_in_flight() -> u32 {
    (*module_parameters::max_in_flight.value()).max(1)
}

/// The per-user limit on batched transfers running, 0 for none (module parameter).
pub(crate) fn max_in_flight_per_user() -> u32 {
    *module_parameters::max_in_flight_per_user.value()
}

/// The per-registration cap on bytes of storage I/O running, 0 for none (module parameter).
pub(crate) fn max_in_flight_bytes() -> u64 {
    *module_parameters::max_in_flight_bytes.value()
}

/// The per-user cap on bytes of storage I/O running, 0 for none (module parameter).
pub(crate) fn max_in_flight_bytes_per_user() -> u64 {
    *module_parameters::max_in_flight_bytes_per_user.value()
}

/// The per-user limit on bounce chunks held at a time, 0 for none (module parameter).
pub(crate) fn max_bounce_per_user() -> u32 {
    *module_parameters::max_bounce_per_user.value()
}

/// The module version, `major.minor.patch`, reported by `GET_INFO`.
pub(crate) const VERSION: (u32, u32, u32) = (0, 1, 0);

/// The mode of `/dev/gdirect`: the owner and its group may use the device.
const DEVICE_MODE: u16 = 0o660;

/// Teardown runs in field order: no new file can be opened, then the batched transfers are
/// drained, then the counters and the bounce pool go, then the module waits until no GPU
/// driver's free callback is still inside its code, then its module notifier is unregistered
/// (no transfer can be reading a path's attributes any more), and last the list of users is
/// freed.
#[pin_data]
struct GdirectModule {
    #[pin]
    _device: OwnedMiscDevice<GdirectFile>,
    _io_queue: batch::IoQueue,
    #[pin]
    _debugfs: stats::Debugfs,
    _bounce: BouncePool,
    _callbacks: CallbackFence,
    _unload_fence: storage::UnloadFence,
    _users: users::Users,
}

/// Waits, at the module's exit, for free callbacks still running the module's code.
struct CallbackFence;

impl Drop for CallbackFence {
    fn drop(&mut self) {
        provider::nvidia::CallbacksRunning::wait_none();
    }
}

/// Owns the bounce pool for the module's lifetime.
struct BouncePool;

impl Drop for BouncePool {
    fn drop(&mut self) {
        bounce::exit();
    }
}

impl kernel::InPlaceModule for GdirectModule {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: called once, before the device exists, so before anything can use it.
        unsafe { provider::nvidia::GET_PUT.init() };
        try_pin_init!(Self {
            // First: registrations look users up from the first open on. Before it, the
            // check that the bindings' structures are C's, before anything reads one.
            _users: {
                layout::check()?;
                // SAFETY: this is the module's init, before the device exists.
                unsafe { users::Users::init()? }
            },
            _bounce: {
                bounce::init(*module_parameters::bounce_buffers.value())?;
                BouncePool
            },
            _io_queue: batch::IoQueue::new(512)?,
            // SAFETY: this is the module's init, before the device exists.
            _unload_fence: unsafe { storage::UnloadFence::register()? },
            _debugfs <- stats::Debugfs::new(),
            _device <- OwnedMiscDevice::register(c"gdirect", DEVICE_MODE, module),
            _callbacks: CallbackFence,
        })
        .pin_chain(|_| {
            let (major, minor, patch) = VERSION;
            pr_info!(
                "version {major}.{minor}.{patch} loaded, ABI version {}, /dev/gdirect\n",
                uapi::ABI_VERSION
            );
            Ok(())
        })
    }
}
