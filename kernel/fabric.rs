// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The RDMA adapter of an NVMe-oF RDMA controller: the PCI function that DMAs for it, so that
//! the path decision can apply the same PCI distance rule to an RNIC as to a local NVMe drive.
//!
//! nvme-rdma keeps its `ib_device` private. The adapter is found the way the RDMA connection
//! manager chose it (`rdma_resolve_addr()` → `rdma_translate_ip()` or a route lookup): the
//! netdev holding the controller's `host_traddr`; without one, the netdev holding `traddr` when
//! the target is on this host, else the route's output device towards `traddr` (nvme-rdma takes
//! no `host_iface`; the route lookup here ignores `tos` and policy rules). It is looked up for
//! every transfer, so a connection re-established through another netdev is seen at once. The
//! adapter is the nearest PCI function above that netdev: a RoCE RNIC's netdev sits on its PCI
//! function (mlx5, bnxt_re, irdma), an IPoIB netdev on its HCA's, and the rig's soft-RoCE
//! "RNIC" on its virtio NIC's (`tests/rxe`). A netdev with no PCI function above it (a veth, a
//! VLAN or bond device) gives none, and so does an IPv6 address (not looked up yet): the
//! decision then falls back to the queue's own verdict (`path::Reach::Unknown`).
//!
//! [`dma_device_of`] answers for any disk: its controller's PCI function, or that adapter. This
//! sits above `storage` and below `multipath` and `io`; it takes no lock of the module's (a
//! route lookup holds the RCU read lock).

use core::ffi::c_void;
use kernel::{
    bindings, pci,
    sync::{
        aref::ARef,
        rcu, //
    },
};

use crate::{
    storage::{
        ancestor_attr,
        pci_ancestor,
        transport_of, //
    },
    uapi,
};

// `struct net` and `struct net_device` cross as `void *` (see `topology.rs` on the lint).
unsafe extern "C" {
    fn __ip_dev_find(net: *mut c_void, addr: u32, devref: bool) -> *mut c_void;
    // `shim.c`: wrappers of inline functions, and a field of the opaque `net_device`.
    fn gdirect_ip_route_output(daddr: u32) -> *mut c_void;
    fn gdirect_rt_dev_rcu(rt: *mut c_void) -> *mut c_void;
    fn gdirect_ip_rt_put(rt: *mut c_void);
    fn gdirect_dev_hold(dev: *mut c_void);
    fn gdirect_dev_put(dev: *mut c_void);
    fn gdirect_netdev_parent(dev: *mut c_void) -> *mut c_void;
}

/// A referenced `struct net_device`.
struct NetDev(*mut c_void);

impl NetDev {
    /// Takes over the reference of a netdev the kernel returned held, if any.
    fn held(dev: *mut c_void) -> Option<Self> {
        (!dev.is_null()).then_some(Self(dev))
    }

    /// The nearest PCI function above the netdev, with a reference of its own.
    fn pci_function(&self) -> Option<ARef<pci::Device>> {
        // SAFETY: a referenced netdev is valid, and so are the devices above its own: a driver
        // removing the netdev waits for its last reference (`netdev_run_todo()`) before its
        // parent goes.
        pci_ancestor(unsafe { gdirect_netdev_parent(self.0) }.cast())
    }
}

impl Drop for NetDev {
    fn drop(&mut self) {
        // SAFETY: the reference is ours to drop.
        unsafe { gdirect_dev_put(self.0) }
    }
}

/// The initial network namespace (it lives forever), where nvme-rdma's connections are made.
fn init_net() -> *mut c_void {
    (&raw mut bindings::init_net).cast()
}

/// The RNIC of the NVMe-oF RDMA controller at or above the disk device `dev`, if one is found.
///
/// # Safety
///
/// `dev` and its ancestors are valid for the call.
pub(crate) unsafe fn rnic_of(dev: *mut bindings::device) -> Option<ARef<pci::Device>> {
    // SAFETY: see the function's safety section.
    unsafe { ancestor_attr(dev, c"address", |text| netdev_of(&Address::parse(text))) }
        .ok()
        .flatten()
        .flatten()?
        .pci_function()
}

/// The parts of an NVMe-oF controller's `address` attribute (`nvmf_get_address()`:
/// `traddr=A,trsvcid=S,host_traddr=H`) that say where the connection goes from.
#[derive(Default, Debug, PartialEq, Eq)]
pub(crate) struct Address<'a> {
    pub(crate) traddr: Option<&'a [u8]>,
    pub(crate) host_traddr: Option<&'a [u8]>,
}

impl<'a> Address<'a> {
    pub(crate) fn parse(text: &'a [u8]) -> Self {
        let mut a = Self::default();
        let line = text.split(|b| *b == b'\n').next().unwrap_or(&[]);
        for field in line.split(|b| *b == b',') {
            let mut kv = field.splitn(2, |b| *b == b'=');
            let (Some(key), Some(value)) = (kv.next(), kv.next()) else {
                continue;
            };
            match key {
                b"traddr" => a.traddr = Some(value),
                b"host_traddr" => a.host_traddr = Some(value),
                _ => {}
            }
        }
        a
    }
}

/// An IPv4 address in dotted-quad form, in network byte order as the kernel keeps `__be32`.
pub(crate) fn parse_ipv4(text: &[u8]) -> Option<u32> {
    let mut octets = [0u8; 4];
    let mut parts = text.split(|b| *b == b'.');
    for octet in octets.iter_mut() {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let value = part.iter().fold(0u32, |v, d| v * 10 + u32::from(d - b'0'));
        *octet = u8::try_from(value).ok()?;
    }
    parts.next().is_none().then(|| u32::from_ne_bytes(octets))
}

/// The netdev the connection manager would have bound for `a` (see the module's comment).
fn netdev_of(a: &Address<'_>) -> Option<NetDev> {
    if let Some(host) = a.host_traddr {
        // SAFETY: with `devref`, the result is held or NULL.
        return NetDev::held(unsafe { __ip_dev_find(init_net(), parse_ipv4(host)?, true) });
    }
    let daddr = parse_ipv4(a.traddr?)?;
    // A target on this host: the netdev that holds its address (a route would say `lo`).
    // SAFETY: as above.
    if let Some(local) = NetDev::held(unsafe { __ip_dev_find(init_net(), daddr, true) }) {
        return Some(local);
    }
    // SAFETY: the result is a route or an error pointer.
    let rt = unsafe { gdirect_ip_route_output(daddr) };
    if rt.is_null() || kernel::error::from_err_ptr(rt).is_err() {
        return None;
    }
    // A route does not pin its device (`dst_dev_put()` swaps in the blackhole device when it
    // goes away): the device is read and held under RCU, which keeps it from being freed.
    let guard = rcu::Guard::new();
    // SAFETY: `rt` is a route we hold; under RCU its device is valid until the guard drops,
    // and held past that.
    let dev = unsafe {
        let dev = gdirect_rt_dev_rcu(rt);
        if !dev.is_null() {
            gdirect_dev_hold(dev);
        }
        dev
    };
    drop(guard);
    // SAFETY: the route is ours to put.
    unsafe { gdirect_ip_rt_put(rt) };
    NetDev::held(dev)
}

/// The PCI device that DMAs for `disk` (whose device is `disk_dev`) and its transport: the NVMe
/// controller's PCI function, or for NVMe-oF over RDMA the adapter the connection goes through
/// ([`rnic_of`]); none for other fabrics (TCP: the CPU copies).
///
/// # Safety
///
/// `disk` and `disk_dev` (with its ancestors) are valid for the call.
pub(crate) unsafe fn dma_device_of(
    disk: *mut bindings::gendisk,
    disk_dev: *mut bindings::device,
) -> (Option<ARef<pci::Device>>, u32) {
    let dma_dev = pci_ancestor(disk_dev);
    let transport = transport_of(disk, disk_dev, dma_dev.is_some());
    if dma_dev.is_some() || transport != uapi::TRANSPORT_RDMA {
        return (dma_dev, transport);
    }
    // SAFETY: as above.
    (unsafe { rnic_of(disk_dev) }, transport)
}
