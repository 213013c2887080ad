// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! PCI topology: can a device reach another's memory peer-to-peer, and how.
//!
//! The kernel decides this in `calc_map_type_and_dist()` (`drivers/pci/p2pdma.c`), which modules
//! can only reach through `pci_p2pdma_distance_many()`: it says whether P2P is possible at all,
//! but not whether the traffic stays below a switch (PCI bus addresses) or crosses the host
//! bridge (DMA addresses). [`map_type`] takes the verdict from the kernel and the route from the
//! same walk of upstream bridges the kernel makes, with the same ACS redirect rule.
//!
//! And which function's BAR holds some device memory ([`Owner`]), with that BAR's bus
//! addresses. This is a floor of PCI facts: it imports nothing of the module's. It takes no
//! lock.

use core::ffi::c_void;
use kernel::{
    bindings,
    pci,
    sync::aref::ARef, //
};

// Pointers to `struct pci_dev` and `struct device` cross as `void *`: bindgen's versions of
// them hold a zero-sized array that the `improper_ctypes` lint rejects.
unsafe extern "C" {
    /// `pci_upstream_bridge()` (inline in C; `shim.c`).
    fn gdirect_pci_upstream_bridge(dev: *mut c_void) -> *mut c_void;
    /// `pci_p2pdma_distance_many()`: `provider` is a `pci_dev`, `clients` an array of `device`.
    fn pci_p2pdma_distance_many(
        provider: *mut c_void,
        clients: *mut *mut c_void,
        num_clients: i32,
        verbose: bool,
    ) -> i32;
    /// `pci_domain_nr()` (inline in C; `shim.c`); `bus` is a `struct pci_bus *`.
    fn gdirect_pci_domain_nr(bus: *mut c_void) -> i32;
}

/// How a client device reaches a provider's memory (`enum pci_p2pdma_map_type`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MapType {
    /// It cannot: the path crosses a host bridge the kernel does not allow P2P through.
    NotSupported,
    /// Directly below a common switch: the client uses PCI bus addresses.
    BusAddr,
    /// Through the host bridge (or an ACS redirect): the client uses DMA-mapped addresses.
    ThruHostBridge,
}

/// The raw `pci_dev` of a device.
pub(crate) fn raw_pci(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is a transparent wrapper of `Opaque<bindings::pci_dev>`.
    core::ptr::from_ref(dev).cast_mut().cast()
}

fn upstream(dev: *mut bindings::pci_dev) -> *mut bindings::pci_dev {
    // SAFETY: `dev` is a valid device; the returned bridge is kept alive by its child's
    // reference, which the callers hold for as long as they walk.
    unsafe { gdirect_pci_upstream_bridge(dev.cast()) }.cast()
}

/// Whether `bridge` redirects peer-to-peer requests upstream (ACS RR, CR or EC set).
fn acs_redirects(bridge: *mut bindings::pci_dev) -> bool {
    // SAFETY: `bridge` is a valid device (see `upstream`).
    let pos = unsafe { (*bridge).acs_cap };
    if pos == 0 {
        return false;
    }
    let mut ctrl: u16 = 0;
    // SAFETY: as above; `ctrl` is a valid location.
    unsafe {
        bindings::pci_read_config_word(
            bridge,
            i32::from(pos) + bindings::PCI_ACS_CTRL as i32,
            &mut ctrl,
        )
    };
    let redirect = (bindings::PCI_ACS_RR | bindings::PCI_ACS_CR | bindings::PCI_ACS_EC) as u16;
    ctrl & redirect != 0
}

/// The lowest bridge (or device) above both `a` and `b`, and whether any bridge on the way from
/// either of them to it redirects P2P traffic.
fn common_upstream(
    a: *mut bindings::pci_dev,
    b: *mut bindings::pci_dev,
) -> Option<(*mut bindings::pci_dev, bool)> {
    let mut redirect = false;
    let mut x = a;
    while !x.is_null() {
        redirect |= acs_redirects(x);
        let mut y = b;
        while !y.is_null() {
            if x == y {
                let mut z = b;
                while z != x {
                    redirect |= acs_redirects(z);
                    z = upstream(z);
                }
                return Some((x, redirect));
            }
            y = upstream(y);
        }
        x = upstream(x);
    }
    None
}

/// How `client` reaches memory in a BAR of `provider`. Logs nothing.
pub(crate) fn map_type(provider: &pci::Device, client: &pci::Device) -> MapType {
    verdict(provider, client).0
}

/// [`map_type`], with the P2PDMA distance (-1 when not supported).
pub(crate) fn verdict(provider: &pci::Device, client: &pci::Device) -> (MapType, i32) {
    let (p, c) = (raw_pci(provider), raw_pci(client));
    // SAFETY: `c` is a valid device.
    let mut clients = [unsafe { (&raw mut (*c).dev).cast::<c_void>() }];
    // SAFETY: both devices are valid and referenced by the caller; `clients` holds one device.
    let distance = unsafe { pci_p2pdma_distance_many(p.cast(), clients.as_mut_ptr(), 1, false) };
    if distance < 0 {
        return (MapType::NotSupported, -1);
    }
    match common_upstream(p, c) {
        Some((_, false)) => (MapType::BusAddr, distance),
        _ => (MapType::ThruHostBridge, distance),
    }
}

/// The PCI function whose BAR holds some device memory.
pub(crate) struct Owner {
    pub(crate) dev: ARef<pci::Device>,
    pub(crate) bar: usize,
}

impl Owner {
    /// The function and BAR holding physical address `phys`, if any.
    pub(crate) fn of_phys(phys: u64) -> Option<Self> {
        let mut dev: *mut bindings::pci_dev = core::ptr::null_mut();
        loop {
            // SAFETY: `pci_get_device` drops the reference on `dev` (or NULL) and returns the
            // next device with a reference, or NULL at the end.
            dev = unsafe {
                bindings::pci_get_device(
                    bindings::PCI_ANY_ID as u32,
                    bindings::PCI_ANY_ID as u32,
                    dev,
                )
            };
            let Some(nn) = core::ptr::NonNull::new(dev) else {
                return None;
            };
            // 7.2's `pci::Device` has neither an iterator over every device nor a BAR's flags:
            // the C ones.
            for bar in 0..bindings::PCI_STD_NUM_BARS as usize {
                // SAFETY: `dev` is a valid, referenced device.
                let res = unsafe { &(*dev).resource[bar] };
                let mem = res.flags & bindings::IORESOURCE_MEM as usize != 0;
                if mem && res.start <= phys && phys <= res.end {
                    // SAFETY: we own the reference `pci_get_device` took; `pci::Device` is a
                    // transparent wrapper of `pci_dev`.
                    let dev = unsafe { ARef::from_raw(nn.cast::<pci::Device>()) };
                    return Some(Self { dev, bar });
                }
            }
        }
    }

    fn resource(&self) -> &bindings::resource {
        // SAFETY: `dev` is a valid device and `bar` a standard BAR index.
        unsafe { &(*raw_pci(&self.dev)).resource[self.bar] }
    }

    /// Whether `[phys, phys + len)` lies in this BAR.
    pub(crate) fn contains(&self, phys: u64, len: u64) -> bool {
        let bar = self.bar as u32;
        let (Ok(start), Ok(size)) = (self.dev.resource_start(bar), self.dev.resource_len(bar))
        else {
            return false;
        };
        len > 0
            && phys >= start
            && phys
                .checked_add(len)
                .is_some_and(|end| end <= start.saturating_add(size))
    }

    /// PCI bus address minus CPU physical address, for this BAR.
    pub(crate) fn bus_offset(&self) -> u64 {
        let pdev = raw_pci(&self.dev);
        let mut region = bindings::pci_bus_region::default();
        // SAFETY: `pdev` is valid; its bus and resource outlive the call.
        unsafe {
            bindings::pcibios_resource_to_bus(
                (*pdev).bus,
                &mut region,
                &raw mut (*pdev).resource[self.bar],
            )
        };
        region.start.wrapping_sub(self.resource().start)
    }

    /// `domain << 16 | bus << 8 | devfn`, as `QUERY` reports it.
    pub(crate) fn id(&self) -> u64 {
        pci_id(&self.dev)
    }
}

/// `domain << 16 | bus << 8 | devfn` of a device.
pub(crate) fn pci_id(dev: &pci::Device) -> u64 {
    let pdev = raw_pci(dev);
    // SAFETY: `pdev` and its bus are valid while `dev` is referenced.
    let (domain, bus, devfn) = unsafe {
        (
            gdirect_pci_domain_nr((*pdev).bus.cast()),
            (*(*pdev).bus).number,
            (*pdev).devfn,
        )
    };
    (u64::from(domain as u32) << 16) | (u64::from(bus) << 8) | u64::from(devfn)
}
