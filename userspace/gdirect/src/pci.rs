// SPDX-License-Identifier: GPL-2.0 OR MIT
//! [`PciAddress`]: a PCI function's address, as sysfs and lspci spell it.

use std::{fmt, str::FromStr};

/// `domain:bus:device.function`, for example `0000:03:00.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0 to 31.
    pub device: u8,
    /// Function number, 0 to 7.
    pub function: u8,
}

impl PciAddress {
    /// `bus << 8 | device << 3 | function`, as the ioctls take it.
    pub fn bdf(&self) -> u32 {
        (u32::from(self.bus) << 8) | (u32::from(self.device) << 3) | u32::from(self.function)
    }

    /// From the `domain << 16 | bdf` form the module reports.
    pub fn from_id(id: u64) -> Self {
        Self {
            domain: (id >> 16) as u32,
            bus: (id >> 8) as u8,
            device: ((id >> 3) & 0x1f) as u8,
            function: (id & 7) as u8,
        }
    }

    /// The device's sysfs directory.
    pub fn sysfs_path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/sys/bus/pci/devices/{self}"))
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// The error of parsing a [`PciAddress`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a PCI address (expected [DOMAIN:]BUS:DEVICE.FUNCTION, like 0000:03:00.0)")]
pub struct ParsePciAddressError(String);

impl FromStr for PciAddress {
    type Err = ParsePciAddressError;

    /// Parses `DDDD:BB:DD.F` or `BB:DD.F` (domain 0), in hex.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParsePciAddressError(s.to_string());
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let mut parts: Vec<&str> = rest.split(':').collect();
        if parts.len() == 2 {
            parts.insert(0, "0");
        }
        let [domain, bus, device] = parts.as_slice() else {
            return Err(bad());
        };
        let domain = u32::from_str_radix(domain, 16).map_err(|_| bad())?;
        let bus = u8::from_str_radix(bus, 16).map_err(|_| bad())?;
        let device = u8::from_str_radix(device, 16).map_err(|_| bad())?;
        let function = u8::from_str_radix(function, 16).map_err(|_| bad())?;
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print_round_trip() {
        let a: PciAddress = "0000:03:00.0".parse().unwrap();
        assert_eq!(
            a,
            PciAddress {
                domain: 0,
                bus: 3,
                device: 0,
                function: 0
            }
        );
        assert_eq!(a.to_string(), "0000:03:00.0");
        let b: PciAddress = "1f:1c.7".parse().unwrap();
        assert_eq!(b.bdf(), (0x1f << 8) | (0x1c << 3) | 7);
        assert_eq!(
            PciAddress::from_id((0x10000 << 16) | u64::from(b.bdf())).domain,
            0x10000
        );
    }

    #[test]
    fn rejects_bad_addresses() {
        for bad in [
            "",
            "03:00",
            "0000:03:20.0",
            "0000:03:00.8",
            "zz:00.0",
            "0:1:2:3.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }
}
