// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The NVIDIA driver of this node: its version (`/proc/driver/nvidia/version`), whether it is
//! the open kernel modules, the nv-p2p page-table generation that version makes, and whether
//! this gdirect reads it.
//!
//! The generations, from `kernel-open/nvidia/nv-p2p.h` of NVIDIA's open kernel modules:
//! `NVIDIA_P2P_PAGE_TABLE_VERSION` is `0x00010002` (1.2) from 515 through 575, `0x00020000`
//! (2.0, with a `flags` field) from 580.65.06 through 595 (the newest checked). The module
//! reads both; a table of another major version is refused at REGISTER with `EPROTO`.

use super::{Check, Verdict};

/// What `/proc/driver/nvidia/version` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaDriver {
    /// The version, as printed (`580.159.04`).
    pub version: String,
    /// Its numbers: series, minor, patch (0 where absent).
    pub numbers: (u32, u32, u32),
    /// The open kernel modules (`NVIDIA UNIX Open Kernel Module`), not the proprietary ones.
    pub open: bool,
}

/// The nv-p2p page table a driver makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageTableGeneration {
    /// Version 1.2: 515 to 575 (and 580 before 580.65.06).
    V1_2,
    /// Version 2.0, with `flags`: 580.65.06 to 595.
    V2_0,
    /// Older than the open modules' first release (515): not checked against a header.
    Older,
    /// Newer than the newest series checked (595).
    Newer,
}

impl PageTableGeneration {
    /// The version as `nv-p2p.h` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1_2 => "1.2 (0x00010002)",
            Self::V2_0 => "2.0 (0x00020000)",
            Self::Older => "unknown (a driver older than 515)",
            Self::Newer => "unknown (a driver newer than 595)",
        }
    }

    /// Whether gdirect's module reads tables of this generation.
    pub fn supported(self) -> bool {
        matches!(self, Self::V1_2 | Self::V2_0)
    }
}

impl NvidiaDriver {
    /// Parses the first line of `/proc/driver/nvidia/version`: `NVRM version: NVIDIA UNIX Open
    /// Kernel Module for x86_64  580.159.04  Release Build  (...)` (open modules) or `NVRM
    /// version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 ...` (proprietary).
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
        let version = line.split_whitespace().find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })?;
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        let series = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self {
            version: version.to_string(),
            numbers: (series, minor, patch),
            open: line.contains("Open Kernel Module"),
        })
    }

    /// The page-table generation this version makes.
    pub fn page_table(&self) -> PageTableGeneration {
        match self.numbers {
            (s, ..) if s < 515 => PageTableGeneration::Older,
            n if n < (580, 65, 6) => PageTableGeneration::V1_2,
            (s, ..) if s <= 595 => PageTableGeneration::V2_0,
            _ => PageTableGeneration::Newer,
        }
    }
}

/// The `nvidia_driver` check: `version` is the text of `/proc/driver/nvidia/version` (`None`
/// where the file is missing), `nvidia_gpus` whether the node has NVIDIA GPUs.
pub(super) fn check(version: Option<&str>, nvidia_gpus: bool) -> Option<Check> {
    let ck = |verdict, evidence: String, fix: Option<&str>| Check {
        name: "nvidia_driver",
        verdict,
        evidence,
        fix: fix.map(str::to_string),
    };
    let Some(text) = version else {
        return nvidia_gpus.then(|| {
            ck(
                Verdict::Warning,
                "NVIDIA GPUs, but no NVIDIA driver loaded (no /proc/driver/nvidia/version)".into(),
                Some("load the NVIDIA driver (modprobe nvidia) before registering GPU memory"),
            )
        });
    };
    let Some(d) = NvidiaDriver::parse(text) else {
        return Some(ck(
            Verdict::Warning,
            format!(
                "cannot read the NVIDIA driver's version from /proc/driver/nvidia/version: {:?}",
                text.lines().next().unwrap_or("")
            ),
            None,
        ));
    };
    let generation = d.page_table();
    let kind = if d.open {
        "open kernel modules"
    } else {
        "proprietary kernel modules"
    };
    let evidence = format!(
        "NVIDIA driver {} ({kind}): nv-p2p page table {}, {}",
        d.version,
        generation.name(),
        if generation.supported() {
            "which gdirect reads"
        } else {
            "which gdirect has not been checked against: REGISTER of GPU memory answers EPROTO if its page table is of another major version"
        }
    );
    Some(if generation.supported() {
        ck(Verdict::Ok, evidence, None)
    } else {
        ck(
            Verdict::Warning,
            evidence,
            Some("use a gdirect release that names this driver series (README, \"On a real GPU node\")"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN_580: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Oct 30 21:43:15 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n";
    const PROPRIETARY_535: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version:  gcc version 12.3.0\n";

    #[test]
    fn versions_and_generations() {
        let d = NvidiaDriver::parse(OPEN_580).unwrap();
        assert_eq!(
            (d.version.as_str(), d.numbers, d.open),
            ("580.159.04", (580, 159, 4), true)
        );
        assert_eq!(d.page_table(), PageTableGeneration::V2_0);
        let d = NvidiaDriver::parse(PROPRIETARY_535).unwrap();
        assert_eq!((d.numbers, d.open), ((535, 183, 1), false));
        assert_eq!(d.page_table(), PageTableGeneration::V1_2);
        let gen = |v: &str| {
            NvidiaDriver::parse(&format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build"
            ))
            .unwrap()
            .page_table()
        };
        assert_eq!(gen("575.64.05"), PageTableGeneration::V1_2);
        assert_eq!(gen("580.65.05"), PageTableGeneration::V1_2);
        assert_eq!(gen("580.65.06"), PageTableGeneration::V2_0);
        assert_eq!(gen("595.45.04"), PageTableGeneration::V2_0);
        assert_eq!(gen("600.10"), PageTableGeneration::Newer);
        assert_eq!(gen("470.256.02"), PageTableGeneration::Older);
        assert_eq!(NvidiaDriver::parse("NVRM version: something else"), None);
        assert_eq!(NvidiaDriver::parse(""), None);
    }

    #[test]
    fn the_check_says_what_the_module_reads() {
        let c = check(Some(OPEN_580), true).unwrap();
        assert_eq!(c.verdict, Verdict::Ok);
        assert!(
            c.evidence.contains("580.159.04") && c.evidence.contains("2.0 (0x00020000)"),
            "{}",
            c.evidence
        );
        let c = check(
            Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  610.1.1  Release Build"),
            true,
        )
        .unwrap();
        assert_eq!(c.verdict, Verdict::Warning);
        assert!(c.evidence.contains("EPROTO"), "{}", c.evidence);
        assert_eq!(check(None, true).unwrap().verdict, Verdict::Warning);
        assert!(check(None, false).is_none());
        assert_eq!(
            check(Some("garbage"), true).unwrap().verdict,
            Verdict::Warning
        );
    }
}
