// SPDX-License-Identifier: GPL-2.0 OR MIT
//! [`Registration`]: device memory pinned by the module, and how peer devices reach it.

use std::{fmt, os::fd::AsRawFd};

use crate::{
    driver::Driver,
    error::{Errno, Error, Result},
    memory::DeviceMemory,
    pci::PciAddress,
    sys, Provider,
};

/// Options of [`Driver::register_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterOptions {
    persistent: bool,
}

impl RegisterOptions {
    /// The defaults: revocable registrations.
    pub const fn new() -> Self {
        Self { persistent: false }
    }

    /// nvidia memory only: pin with the GPU driver's persistent interface, so that the memory is
    /// never revoked (a `cudaFree` is deferred until the registration ends). Needs
    /// CAP_SYS_ADMIN ([`Error::PersistentNeedsAdmin`] otherwise).
    pub const fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    fn flags(self) -> u32 {
        if self.persistent {
            sys::GDIRECT_REGISTER_PERSISTENT
        } else {
            0
        }
    }
}

/// How a peer device reaches registered memory (`enum gdirect_map_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapType {
    /// It cannot: the path crosses a host bridge that does not allow peer-to-peer traffic.
    NotSupported,
    /// Directly, below a shared PCIe switch: the addresses are PCI bus addresses.
    BusAddr,
    /// Through the host bridge: the addresses are DMA addresses.
    ThruHostBridge,
    /// It is system memory: the addresses are DMA addresses of its pages.
    HostMemory,
}

impl MapType {
    fn from_raw(raw: u32) -> Self {
        match raw {
            sys::GDIRECT_MAP_BUS_ADDR => Self::BusAddr,
            sys::GDIRECT_MAP_THRU_HOST_BRIDGE => Self::ThruHostBridge,
            sys::GDIRECT_MAP_HOST_MEMORY => Self::HostMemory,
            _ => Self::NotSupported,
        }
    }

    /// The name the CLI and JSON use.
    pub fn name(self) -> &'static str {
        match self {
            Self::NotSupported => "not_supported",
            Self::BusAddr => "bus_addr",
            Self::ThruHostBridge => "thru_host_bridge",
            Self::HostMemory => "host_memory",
        }
    }
}

impl fmt::Display for MapType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`Registration::query`] reports for one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerMap {
    /// How the peer reaches the memory.
    pub map_type: MapType,
    /// Bytes per address.
    pub page_size: u64,
    /// The address the peer uses for each page; empty when it cannot reach the memory.
    pub addrs: Vec<u64>,
    /// The PCI function whose memory this is; `None` for host memory.
    pub owner: Option<PciAddress>,
}

/// Memory registered with the module; unregistered when dropped.
///
/// It borrows the [`Driver`] and the memory, so neither can go away first.
#[derive(Debug)]
pub struct Registration<'a> {
    driver: &'a Driver,
    handle: u64,
    provider: Provider,
    addr: u64,
    len: u64,
    page_size: u64,
    page_count: u64,
}

impl Driver {
    /// Registers `mem` (`GDIRECT_IOC_REGISTER`): the module pins it and translates its pages.
    ///
    /// Transfers through a registration ([`File::read_into`](crate::File::read_into),
    /// [`File::write_from`](crate::File::write_from), [`Batch`](crate::Batch)) are the
    /// module's DMA, ordered after nothing queued on a GPU: before one, the caller waits for
    /// the work that writes GPU memory a write sends or uses memory a read fills (its stream
    /// synchronized), as cuFile leaves to its caller. `gpu::GpuReader` (feature `cuda`) does
    /// that wait for each call.
    ///
    /// ```no_run
    /// use gdirect::{Driver, HostBuffer};
    /// let driver = Driver::open()?;
    /// let buf = HostBuffer::new(1 << 20)?;
    /// let reg = driver.register(&buf)?;
    /// println!("{} pages of {} bytes", reg.page_count(), reg.page_size());
    /// # Ok::<(), gdirect::Error>(())
    /// ```
    pub fn register<'a, M: DeviceMemory + ?Sized>(
        &'a self,
        mem: &'a M,
    ) -> Result<Registration<'a>> {
        self.register_with(mem, RegisterOptions::new())
    }

    /// [`Driver::register`] with options.
    pub fn register_with<'a, M: DeviceMemory + ?Sized>(
        &'a self,
        mem: &'a M,
        options: RegisterOptions,
    ) -> Result<Registration<'a>> {
        mem.registrable()?;
        // SAFETY: `DeviceMemory` promises that the range is the provider's memory owned by
        // `mem`, which the registration borrows for its whole life, and that safe code reaches
        // it only through volatile copies, never a Rust reference, so a device writing it while
        // `mem` is shared (or after a batched transfer outlived a leaked registration) races
        // with no reference.
        unsafe { self.register_range(mem.provider(), mem.device_address(), mem.len(), options) }
    }

    /// Registers a raw range of a provider's memory.
    ///
    /// Safe code cannot register part of a live Rust object (this does not compile):
    ///
    /// ```compile_fail,E0133
    /// use gdirect::{Driver, Provider, RegisterOptions};
    /// let driver = Driver::open()?;
    /// let v = vec![0u8; 8192];
    /// let reg = driver.register_range(Provider::Host, v.as_ptr() as u64, 4096, RegisterOptions::new())?;
    /// # Ok::<(), gdirect::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// Whatever part of `addr..addr + len` is memory of this process, the caller owns it and
    /// keeps it allocated while the registration lives (or frees it through its provider,
    /// which revokes the registration first, as a GPU driver's free does), and no Rust reference
    /// reads or writes it while a transfer into or out of it may run: transfers write and read
    /// it behind the compiler's back. (A range that is not the provider's memory in this
    /// process, another process's address for one, is refused by the module with an error.)
    pub unsafe fn register_range(
        &self,
        provider: Provider,
        addr: u64,
        len: u64,
        options: RegisterOptions,
    ) -> Result<Registration<'_>> {
        let mut args = sys::gdirect_register_args {
            provider: provider.id(),
            flags: options.flags(),
            addr,
            len,
            ..Default::default()
        };
        // SAFETY: `args` is a valid, writable struct for the call; the module keeps no pointer.
        unsafe { sys::register(self.as_raw_fd(), &mut args) }
            .map_err(|errno| self.register_error(provider, addr, len, errno))?;
        Ok(Registration {
            driver: self,
            handle: args.handle,
            provider,
            addr,
            len,
            page_size: args.page_size,
            page_count: args.page_count,
        })
    }

    fn register_error(&self, provider: Provider, addr: u64, len: u64, errno: Errno) -> Error {
        match errno {
            Errno::ERANGE => Error::Misaligned {
                provider,
                addr,
                len,
            },
            Errno::ENXIO => Error::NotProviderMemory {
                provider,
                addr,
                len,
            },
            Errno::EMEDIUMTYPE => Error::NoStructPages { addr, len },
            Errno::EPROTO => Error::UnknownPageTable { addr, len },
            Errno::EACCES => Error::PersistentNeedsAdmin { addr, len },
            // Which limit: the user's, when it is set and this registration goes past the
            // opener's own account, or past that of a user whose namespace it runs in (which
            // GET_INFO does not show) while the module's total has room.
            Errno::EDQUOT => match self.info() {
                Ok(i)
                    if i.max_pinned_bytes_per_user != 0
                        && (i.user_pinned_bytes.saturating_add(len)
                            > i.max_pinned_bytes_per_user
                            || i.pinned_bytes.saturating_add(len) <= i.max_pinned_bytes) =>
                {
                    Error::UserPinLimit {
                        len,
                        pinned: i.user_pinned_bytes,
                        limit: i.max_pinned_bytes_per_user,
                    }
                }
                _ => Error::PinLimit { len },
            },
            Errno::EMFILE => Error::TooManyRegistrations,
            Errno::EOPNOTSUPP => Error::ProviderUnavailable { provider },
            errno => self.ioctl_error("GDIRECT_IOC_REGISTER", errno),
        }
    }
}

impl<'a> Registration<'a> {
    /// The driver handle the registration belongs to.
    pub fn driver(&self) -> &'a Driver {
        self.driver
    }

    /// The handle naming the registration on its file.
    pub fn handle(&self) -> u64 {
        self.handle
    }
    /// The provider of the memory.
    pub fn provider(&self) -> Provider {
        self.provider
    }
    /// The registered address, as the provider knows it.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Registered bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the registration is empty (never: the module refuses zero lengths).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes per page, the provider's granularity.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }
    /// Number of pages.
    pub fn page_count(&self) -> u64 {
        self.page_count
    }

    /// How `peer` reaches the memory, and the address of every page for it
    /// (`GDIRECT_IOC_QUERY`, paged).
    pub fn query(&self, peer: PciAddress) -> Result<PeerMap> {
        let mut addrs = vec![
            0u64;
            usize::try_from(self.page_count)
                .unwrap_or(usize::MAX)
                .min(1 << 16)
        ];
        let (map_type, mut n, owner) = self.query_pages(peer, 0, &mut addrs)?;
        addrs.truncate(n);
        while map_type != MapType::NotSupported && (addrs.len() as u64) < self.page_count {
            let mut more = vec![
                0u64;
                usize::try_from(self.page_count - addrs.len() as u64)
                    .unwrap_or(usize::MAX)
                    .min(1 << 16)
            ];
            (_, n, _) = self.query_pages(peer, addrs.len() as u64, &mut more)?;
            if n == 0 {
                break;
            }
            addrs.extend_from_slice(&more[..n]);
        }
        Ok(PeerMap {
            map_type,
            page_size: self.page_size,
            addrs,
            owner,
        })
    }

    /// How `peer` reaches the memory, and the device that owns it, without the addresses:
    /// what a caller without `CAP_SYS_ADMIN` may know (`GDIRECT_IOC_QUERY` with no entries).
    pub fn map_type(&self, peer: PciAddress) -> Result<(MapType, Option<PciAddress>)> {
        let (map_type, _, owner) = self.query_pages(peer, 0, &mut [])?;
        Ok((map_type, owner))
    }

    /// One page of [`Registration::query`]: the addresses of pages `first..` into `out`;
    /// returns the map type, how many were written and the owner device.
    pub fn query_pages(
        &self,
        peer: PciAddress,
        first: u64,
        out: &mut [u64],
    ) -> Result<(MapType, usize, Option<PciAddress>)> {
        let mut args = sys::gdirect_query_args {
            handle: self.handle,
            peer_domain: peer.domain,
            peer_bdf: peer.bdf(),
            first_page: first,
            addrs: out.as_mut_ptr() as u64,
            max_entries: u32::try_from(out.len()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        // SAFETY: `args.addrs` points to `max_entries` writable u64s that outlive the call; the
        // module writes at most that many and keeps no pointer.
        unsafe { sys::query(self.driver.as_raw_fd(), &mut args) }.map_err(|errno| match errno {
            Errno::ENODEV => Error::NoSuchPeer { peer },
            Errno::EUNATCH => Error::PeerNotKernelDriven { peer },
            Errno::EACCES => Error::AddressesNeedAdmin { peer },
            Errno::EKEYREVOKED => Error::Revoked {
                handle: self.handle,
            },
            errno => self.driver.ioctl_error("GDIRECT_IOC_QUERY", errno),
        })?;
        let owner = (args.owner != u64::MAX).then(|| PciAddress::from_id(args.owner));
        Ok((
            MapType::from_raw(args.map_type),
            args.entries as usize,
            owner,
        ))
    }

    /// Ends the registration now (`GDIRECT_IOC_UNREGISTER`), reporting errors that drop hides.
    pub fn unregister(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        me.driver.unregister_handle(me.handle)
    }
}

/// The kernel's P2PDMA verdict for a pair of PCI functions ([`Driver::peer_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerVerdict {
    /// How the client reaches the provider's memory.
    pub map_type: MapType,
    /// `pci_p2pdma_distance()`, `None` when not supported.
    pub distance: Option<u32>,
}

impl Driver {
    /// How `client` (an NVMe controller, an RDMA NIC) would reach memory in a BAR of
    /// `provider` (a GPU, a device with P2P memory), by the kernel's own rules
    /// (`GDIRECT_IOC_PEER_CHECK`): nothing is registered.
    pub fn peer_check(&self, provider: PciAddress, client: PciAddress) -> Result<PeerVerdict> {
        let mut args = sys::gdirect_peer_args {
            provider_domain: provider.domain,
            provider_bdf: provider.bdf(),
            client_domain: client.domain,
            client_bdf: client.bdf(),
            ..Default::default()
        };
        // SAFETY: `args` is a valid, writable struct for the call; the module keeps no pointer.
        unsafe { sys::peer_check(self.as_raw_fd(), &mut args) }.map_err(|errno| match errno {
            Errno::ENODEV => Error::NoSuchPeer {
                peer: if provider.sysfs_path().exists() {
                    client
                } else {
                    provider
                },
            },
            errno => self.ioctl_error("GDIRECT_IOC_PEER_CHECK", errno),
        })?;
        Ok(PeerVerdict {
            map_type: MapType::from_raw(args.map_type),
            distance: u32::try_from(args.distance).ok(),
        })
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let _ = self.driver.unregister_handle(self.handle);
    }
}

impl Driver {
    fn unregister_handle(&self, handle: u64) -> Result<()> {
        let args = sys::gdirect_unregister_args {
            handle,
            ..Default::default()
        };
        // SAFETY: `args` is a valid struct for the call; the module keeps no pointer.
        unsafe { sys::unregister(self.as_raw_fd(), &args) }
            .map_err(|errno| self.ioctl_error("GDIRECT_IOC_UNREGISTER", errno))?;
        Ok(())
    }
}
