// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Whether the direct path can work on this node, from sysfs alone (and the module's own
//! verdict where it is loaded): the PCI relation of every device-memory function to every
//! NVMe controller and RDMA device, and the checks operators run by hand — module, IOMMU,
//! ACS, BAR sizes, NUMA, P2PDMA, fabrics queues — each with its evidence and its fix.

use std::{
    collections::BTreeSet,
    fmt,
    path::{Path, PathBuf},
};

use gdirect::{Driver, MapType, PciAddress, PeerVerdict, Provider};

use crate::{nvmeof, sysfs::read};

/// PCI class codes (`class` in sysfs: base << 16 | sub << 8 | prog-if).
const CLASS_NVME: u32 = 0x01_08_02;
const CLASS_BASE_DISPLAY: u32 = 0x03;
/// NVIDIA's PCI vendor ID.
const PCI_VENDOR_NVIDIA: u16 = 0x10de;
const CLASS_BASE_ACCEL: u32 = 0x12;

/// ACS: the extended capability ID, and the redirect bits of its control register.
const ACS_CAP_ID: u32 = 0x000d;
const ACS_RR: u16 = 1 << 2;
const ACS_CR: u16 = 1 << 3;

/// What a device-memory BAR should at least expose.
const SMALL_BAR: u64 = 1 << 30;

/// One PCI function as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address.
    pub addr: PciAddress,
    /// `class`.
    pub class: u32,
    /// `vendor`.
    pub vendor: u16,
    /// The host bridge it is under (`pci0000:00`).
    pub host_bridge: String,
    /// The bridges above it, the root port first.
    pub upstream: Vec<PciAddress>,
    /// `numa_node` (`None` for -1).
    pub numa_node: Option<u32>,
    /// The bound driver.
    pub driver: Option<String>,
    /// Sizes of its memory BARs, in BAR order.
    pub bars: Vec<u64>,
    /// Bytes of P2P memory it publishes (`p2pmem/size`).
    pub p2pmem: Option<u64>,
    /// The ACS control register, when its config space can be read that far (root).
    pub acs_ctrl: Option<u16>,
    /// Whether the config space past the first 64 bytes could be read.
    pub config_readable: bool,
}

impl PciFunction {
    /// Reads function `addr` under `sysfs`.
    fn read(sysfs: &Path, addr: PciAddress) -> Option<Self> {
        let dir = sysfs.join("bus/pci/devices").join(addr.to_string());
        let link = std::fs::read_link(&dir).ok()?;
        let mut host_bridge = String::new();
        let mut upstream = Vec::new();
        for c in link.components() {
            let c = c.as_os_str().to_string_lossy();
            if c.starts_with("pci") && c.contains(':') {
                host_bridge = c.into_owned();
                upstream.clear();
            } else if let Ok(a) = c.parse::<PciAddress>() {
                upstream.push(a);
            }
        }
        if upstream.last() == Some(&addr) {
            upstream.pop();
        }
        let hex = |name: &str| {
            read(&dir.join(name))
                .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        };
        let bars = read(&dir.join("resource"))
            .map(|r| {
                r.lines()
                    .take(6)
                    .filter_map(|l| {
                        let v: Vec<u64> = l
                            .split_whitespace()
                            .filter_map(|x| {
                                u64::from_str_radix(x.trim_start_matches("0x"), 16).ok()
                            })
                            .collect();
                        // IORESOURCE_MEM
                        (v.len() == 3 && v[2] & 0x200 != 0 && v[1] > v[0]).then(|| v[1] - v[0] + 1)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let config = std::fs::read(dir.join("config")).unwrap_or_default();
        Some(Self {
            addr,
            class: hex("class").unwrap_or(0),
            vendor: hex("vendor").unwrap_or(0) as u16,
            host_bridge,
            upstream,
            numa_node: read(&dir.join("numa_node")).and_then(|n| n.parse().ok()),
            driver: std::fs::read_link(dir.join("driver"))
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned())),
            bars,
            p2pmem: read(&dir.join("p2pmem/size")).and_then(|s| s.parse().ok()),
            acs_ctrl: acs_ctrl(&config),
            config_readable: config.len() > 64,
        })
    }

    fn is_gpu(&self) -> bool {
        matches!(self.class >> 16, CLASS_BASE_DISPLAY | CLASS_BASE_ACCEL)
    }
}

/// The ACS control register from a config space image, if it has the capability.
fn acs_ctrl(config: &[u8]) -> Option<u16> {
    let dword = |at: usize| -> Option<u32> {
        config
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut at = 0x100;
    for _ in 0..64 {
        let h = dword(at)?;
        if h == 0 || h == u32::MAX {
            return None;
        }
        if h & 0xffff == ACS_CAP_ID {
            let b = config.get(at + 6..at + 8)?;
            return Some(u16::from_le_bytes([b[0], b[1]]));
        }
        at = (h >> 20) as usize;
        if at < 0x100 {
            return None;
        }
    }
    None
}

/// The PCI relation between two functions, as `nvidia-smi topo -m` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// At most one PCIe switch (or bridge) between them.
    Pix,
    /// Several switches, but not the host bridge.
    Pxb,
    /// Through the host bridge (the root complex) they share.
    Phb,
    /// Across host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes (the SMP interconnect).
    Sys,
    /// One of them is not a PCI function (a software RDMA device).
    Virtual,
}

impl Relation {
    /// The name operators know.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pix => "PIX",
            Self::Pxb => "PXB",
            Self::Phb => "PHB",
            Self::Node => "NODE",
            Self::Sys => "SYS",
            Self::Virtual => "VIRT",
        }
    }

    /// The relation of `a` and `b`.
    pub fn of(a: &PciFunction, b: &PciFunction) -> Self {
        if a.host_bridge != b.host_bridge {
            return match (a.numa_node, b.numa_node) {
                (Some(x), Some(y)) if x != y => Self::Sys,
                _ => Self::Node,
            };
        }
        let common = a
            .upstream
            .iter()
            .zip(&b.upstream)
            .take_while(|(x, y)| x == y)
            .count();
        if common == 0 {
            return Self::Phb;
        }
        if a.upstream.len() - common <= 1 && b.upstream.len() - common <= 1 {
            Self::Pix
        } else {
            Self::Pxb
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an endpoint of the matrix is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A GPU or accelerator function.
    Gpu,
    /// A function that publishes P2P memory (an NVMe CMB, the rig's emulated GPU).
    P2pMem,
    /// An NVMe controller on PCIe.
    Nvme,
    /// An RDMA device.
    Rdma,
}

impl Kind {
    /// The name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::P2pMem => "p2pmem",
            Self::Nvme => "nvme",
            Self::Rdma => "rdma",
        }
    }
}

/// A row or column of the matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `0000:04:00.0` for memory, `nvme0` or `mlx5_0` for storage.
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// Its PCI function; `None` for a software device (soft-RoCE).
    pub function: Option<PciFunction>,
}

/// One cell of the matrix: a device-memory function and a storage DMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// Index into [`Report::memories`].
    pub memory: usize,
    /// Index into [`Report::storage`].
    pub storage: usize,
    /// The PCI relation.
    pub relation: Relation,
    /// Bridges between the two with ACS redirect bits set.
    pub acs_redirect: Vec<PciAddress>,
    /// The module's verdict, when it is loaded.
    pub kernel: Option<PeerVerdict>,
    /// What sysfs alone expects of the kernel's verdict, when it can tell.
    pub expected: Option<MapType>,
    /// Whether the direct path can work for the pair.
    pub possible: bool,
    /// Where sysfs and the kernel disagree, why.
    pub disagreement: Option<String>,
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Nothing in the way.
    Ok,
    /// It works, worse than it could.
    Warning,
    /// The direct path cannot work until this is fixed.
    Blocking,
}

impl Verdict {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::Blocking => "blocking",
        }
    }
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// `module`, `nvidia_driver`, `iommu`, `acs`, `bar`, `numa`, `p2pdma`, `nvmeof`,
    /// `peer_memory`.
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found.
    pub evidence: String,
    /// What to change, in one line.
    pub fix: Option<String>,
}

/// The whole answer.
#[derive(Clone, Debug)]
pub struct Report {
    /// Device-memory functions (rows).
    pub memories: Vec<Endpoint>,
    /// NVMe controllers and RDMA devices (columns).
    pub storage: Vec<Endpoint>,
    /// Every row × column.
    pub pairs: Vec<Pair>,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether the hardware allows the direct path for at least one pair.
    pub fn hardware_allows(&self) -> bool {
        self.pairs.iter().any(|p| p.possible)
    }

    /// Whether the direct path can work now: the hardware allows it for a pair and no check
    /// blocks it (the module loaded, P2PDMA in the kernel).
    pub fn direct_possible(&self) -> bool {
        self.hardware_allows() && self.checks.iter().all(|c| c.verdict != Verdict::Blocking)
    }
}

/// What [`check`] looks at: normally the live system.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The sysfs root (`/sys`).
    pub sysfs: PathBuf,
    /// The module, when it could be opened.
    pub driver: Option<&'a Driver>,
    /// The CPUs the caller may run on.
    pub cpus: Vec<usize>,
    /// `/proc/modules`' text.
    pub modules: String,
    /// The kernel's configuration text, when found (`/boot/config-$(uname -r)`).
    pub kconfig: Option<String>,
    /// The procfs root (`/proc`).
    pub procfs: PathBuf,
    /// The module's device node (`/dev/gdirect`).
    pub device: PathBuf,
    /// Built modules to hold against the running kernel (their vermagic): by default those
    /// installed under `/lib/modules/$(uname -r)`.
    pub module_files: Vec<PathBuf>,
}

impl<'a> Inputs<'a> {
    /// The live system, with `driver` if the module is loaded.
    pub fn live(driver: Option<&'a Driver>) -> Self {
        let release = read(Path::new("/proc/sys/kernel/osrelease")).unwrap_or_default();
        Self {
            sysfs: PathBuf::from("/sys"),
            driver,
            cpus: allowed_cpus(),
            modules: std::fs::read_to_string("/proc/modules").unwrap_or_default(),
            kconfig: std::fs::read_to_string(format!("/boot/config-{release}")).ok(),
            procfs: PathBuf::from("/proc"),
            device: PathBuf::from(gdirect::DEFAULT_DEVICE_PATH),
            module_files: loading::installed_modules(&release),
        }
    }
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default()
}

/// Parses a CPU list (`0-3,8,10-11`).
fn cpu_list(s: &str) -> Vec<usize> {
    s.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .flat_map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.parse::<usize>(), b.parse::<usize>()) {
                (Ok(a), Ok(b)) if a <= b => (a..=b).collect::<Vec<_>>(),
                _ => Vec::new(),
            },
            None => p.parse().ok().into_iter().collect(),
        })
        .collect()
}

/// Every PCI function under `sysfs`.
fn functions(sysfs: &Path) -> Vec<PciFunction> {
    let Ok(entries) = std::fs::read_dir(sysfs.join("bus/pci/devices")) else {
        return Vec::new();
    };
    let mut out: Vec<PciFunction> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<PciAddress>().ok())
        .filter_map(|a| PciFunction::read(sysfs, a))
        .collect();
    out.sort_by_key(|f| f.addr.to_string());
    out
}

/// The PCI function a class device (`class/nvme/nvme0`) sits on, if any.
fn class_device_function(dir: &Path) -> Option<PciAddress> {
    let link = std::fs::read_link(dir.join("device")).ok()?;
    link.file_name()?.to_string_lossy().parse().ok()
}

/// Looks at everything and answers.
pub fn check(inputs: &Inputs<'_>) -> Report {
    let all = functions(&inputs.sysfs);
    let by_addr = |a: PciAddress| all.iter().find(|f| f.addr == a).cloned();
    let memories: Vec<Endpoint> = all
        .iter()
        .filter(|f| f.is_gpu() || f.p2pmem.is_some())
        .map(|f| Endpoint {
            name: f.addr.to_string(),
            kind: if f.is_gpu() { Kind::Gpu } else { Kind::P2pMem },
            function: Some(f.clone()),
        })
        .collect();
    let mut storage = Vec::new();
    let class_dir = |c: &str| -> Vec<(String, PathBuf)> {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(inputs.sysfs.join("class").join(c))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    for (name, dir) in class_dir("nvme") {
        // Fabrics controllers have no PCI function: their DMA device is the RDMA device.
        if let Some(f) = class_device_function(&dir).and_then(by_addr) {
            if f.class == CLASS_NVME {
                storage.push(Endpoint {
                    name,
                    kind: Kind::Nvme,
                    function: Some(f),
                });
            }
        }
    }
    for (name, dir) in class_dir("infiniband") {
        storage.push(Endpoint {
            name,
            kind: Kind::Rdma,
            function: class_device_function(&dir).and_then(by_addr),
        });
    }
    let mut pairs = Vec::new();
    for (mi, m) in memories.iter().enumerate() {
        for (si, s) in storage.iter().enumerate() {
            let (Some(mf), Some(sf)) = (&m.function, &s.function) else {
                pairs.push(Pair {
                    memory: mi,
                    storage: si,
                    relation: Relation::Virtual,
                    acs_redirect: Vec::new(),
                    kernel: None,
                    expected: Some(MapType::NotSupported),
                    possible: false,
                    disagreement: None,
                });
                continue;
            };
            if mf.addr == sf.addr {
                continue;
            }
            pairs.push(pair(mi, si, mf, sf, &all, inputs.driver));
        }
    }
    let checks = checks(inputs, &all, &memories, &storage, &pairs);
    Report {
        memories,
        storage,
        pairs,
        checks,
    }
}

fn pair(
    memory: usize,
    storage: usize,
    m: &PciFunction,
    s: &PciFunction,
    all: &[PciFunction],
    driver: Option<&Driver>,
) -> Pair {
    let relation = Relation::of(m, s);
    // Bridges on the path below the common ancestor, and the ancestor's downstream ports.
    let common = m
        .upstream
        .iter()
        .zip(&s.upstream)
        .take_while(|(x, y)| x == y)
        .count();
    let path: BTreeSet<PciAddress> = m.upstream[common.saturating_sub(1)..]
        .iter()
        .chain(&s.upstream[common.saturating_sub(1)..])
        .copied()
        .collect();
    let acs_redirect: Vec<PciAddress> = path
        .into_iter()
        .filter(|a| {
            all.iter()
                .find(|f| f.addr == *a)
                .and_then(|f| f.acs_ctrl)
                .is_some_and(|c| c & (ACS_RR | ACS_CR) != 0)
        })
        .collect();
    let expected = match relation {
        Relation::Pix | Relation::Pxb if acs_redirect.is_empty() => Some(MapType::BusAddr),
        // Through the root complex: direct only if the kernel allows P2P through that host
        // bridge, which sysfs does not say.
        _ => None,
    };
    let kernel = driver.and_then(|d| d.peer_check(m.addr, s.addr).ok());
    let disagreement = match (kernel, expected) {
        (Some(k), Some(e)) if k.map_type != e => Some(format!(
            "sysfs shows {relation} with no ACS redirect, so bus addresses should work, but the kernel says {}",
            k.map_type
        )),
        (Some(k), None) if k.map_type == MapType::BusAddr => Some(format!(
            "sysfs shows {relation}{}, yet the kernel would use bus addresses",
            if acs_redirect.is_empty() { "" } else { " with ACS redirect" }
        )),
        _ => None,
    };
    let possible = match kernel {
        Some(k) => k.map_type != MapType::NotSupported,
        None => expected == Some(MapType::BusAddr),
    };
    Pair {
        memory,
        storage,
        relation,
        acs_redirect,
        kernel,
        expected,
        possible,
        disagreement,
    }
}

fn checks(
    inputs: &Inputs<'_>,
    all: &[PciFunction],
    memories: &[Endpoint],
    storage: &[Endpoint],
    pairs: &[Pair],
) -> Vec<Check> {
    let mut out = Vec::new();
    let ck = |name, verdict, evidence: String, fix: Option<&str>| Check {
        name,
        verdict,
        evidence,
        fix: fix.map(str::to_string),
    };

    // The module and its providers, or why it is not there.
    let nvidia_gpus = all.iter().any(|f| f.is_gpu() && f.vendor == 0x10de);
    out.extend(loading::checks(inputs, nvidia_gpus));
    let version = std::fs::read_to_string(inputs.procfs.join("driver/nvidia/version")).ok();
    out.extend(nvidia::check(version.as_deref(), nvidia_gpus));

    // IOMMU.
    let iommus = std::fs::read_dir(inputs.sysfs.join("class/iommu"))
        .map(|d| d.count())
        .unwrap_or(0);
    let group_types: BTreeSet<String> = std::fs::read_dir(inputs.sysfs.join("kernel/iommu_groups"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| read(&e.path().join("type")))
                .collect()
        })
        .unwrap_or_default();
    out.push(if iommus == 0 && group_types.is_empty() {
        ck("iommu", Verdict::Ok, "no IOMMU: devices DMA to physical addresses".into(), None)
    } else if group_types.iter().all(|t| t == "identity") {
        ck("iommu", Verdict::Ok, format!("{iommus} IOMMU(s), passthrough (identity) domains"), None)
    } else {
        ck(
            "iommu",
            Verdict::Warning,
            format!("{iommus} IOMMU(s) translating DMA (domain types: {})", group_types.into_iter().collect::<Vec<_>>().join(", ")),
            Some("boot with iommu=pt (or intel_iommu=on iommu=pt): translated DMA makes the kernel enable ACS and send P2P through the root complex"),
        )
    });

    // ACS on the bridges between each pair.
    let redirects: BTreeSet<PciAddress> = pairs
        .iter()
        .flat_map(|p| p.acs_redirect.iter().copied())
        .collect();
    let unreadable = all.iter().filter(|f| !f.config_readable).count();
    out.push(if !redirects.is_empty() {
        ck(
            "acs",
            Verdict::Warning,
            format!("ACS redirect (RR/CR) set on {}", redirects.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")),
            Some("P2P requests go up to the root complex: disable ACS redirect on those ports (iommu=pt, or setpci on the bridge) if your IOMMU policy allows"),
        )
    } else if unreadable > 0 && !all.is_empty() {
        ck(
            "acs",
            Verdict::Warning,
            format!("cannot read the extended config space of {unreadable} function(s): ACS unknown"),
            Some("run gdirect check as root to read ACS"),
        )
    } else {
        ck("acs", Verdict::Ok, "no ACS redirect on any bridge between device memory and storage".into(), None)
    });

    // BAR sizes of the device-memory functions.
    for m in memories {
        let Some(f) = &m.function else { continue };
        let largest = f.bars.iter().copied().max().unwrap_or(0);
        let mib = |b: u64| b >> 20;
        let evidence = match f.p2pmem {
            Some(p) => format!(
                "{}: largest BAR {} MiB, {} MiB published as P2P memory",
                m.name,
                mib(largest),
                mib(p)
            ),
            None => format!("{}: largest BAR {} MiB", m.name, mib(largest)),
        };
        out.push(if m.kind == Kind::Gpu && largest < SMALL_BAR {
            ck(
                "bar",
                Verdict::Warning,
                evidence + ": little GPU memory can be exposed to peers at once",
                Some("enable Resizable BAR / large BAR1 in the firmware"),
            )
        } else {
            ck("bar", Verdict::Ok, evidence, None)
        });
    }

    // Whether GPU memory has `struct page`s: only then can storage DMA reach it through the
    // block layer (NVIDIA's P2PDMA mode publishes the static BAR1 as P2P memory); the rig's
    // emulated GPU stands for an NVIDIA GPU here.
    for f in all.iter().filter(|f| {
        (f.is_gpu() && f.vendor == PCI_VENDOR_NVIDIA) || f.driver.as_deref() == Some("gdirect_egpu")
    }) {
        out.push(match f.p2pmem {
            Some(p) => ck(
                "gpu_pages",
                Verdict::Ok,
                format!(
                    "{}: {} MiB of its BAR have P2PDMA pages (NVIDIA's P2PDMA mode): storage can DMA to GPU memory",
                    f.addr,
                    p >> 20
                ),
                None,
            ),
            None => ck(
                "gpu_pages",
                Verdict::Warning,
                format!(
                    "{}: its BAR has no struct pages: gdirect refuses its memory (EMEDIUMTYPE) and reads into it through host memory",
                    f.addr
                ),
                Some("NVIDIA's P2PDMA mode: the open kernel modules on x86-64 with CONFIG_PCI_P2PDMA, a static BAR1 over all GPU memory (automatic when BAR1 is large enough; RMForceStaticBar1=1 forces it), mapped uncached (RmForceDisableIomapWC=1), both in NVreg_RegistryDwords; see the README, \"On a real GPU node\""),
            ),
        });
    }

    // NUMA: each pair, and where the caller runs.
    let node_cpus = |n: u32| -> Vec<usize> {
        read(
            &inputs
                .sysfs
                .join(format!("devices/system/node/node{n}/cpulist")),
        )
        .map(|s| cpu_list(&s))
        .unwrap_or_default()
    };
    let mut numa_split = Vec::new();
    for p in pairs {
        let (m, s) = (&memories[p.memory], &storage[p.storage]);
        if let (Some(a), Some(b)) = (
            m.function.as_ref().and_then(|f| f.numa_node),
            s.function.as_ref().and_then(|f| f.numa_node),
        ) {
            if a != b {
                numa_split.push(format!("{} (node {a}) / {} (node {b})", m.name, s.name));
            }
        }
    }
    let mem_nodes: BTreeSet<u32> = memories
        .iter()
        .filter_map(|m| m.function.as_ref()?.numa_node)
        .collect();
    let caller_nodes: BTreeSet<u32> = mem_nodes
        .iter()
        .copied()
        .filter(|&n| node_cpus(n).iter().any(|c| inputs.cpus.contains(c)))
        .collect();
    out.push(if !numa_split.is_empty() {
        ck(
            "numa",
            Verdict::Warning,
            format!("on different NUMA nodes: {}", numa_split.join(", ")),
            Some("pair each GPU with storage on its own node (30-50% of the bandwidth is lost across the interconnect)"),
        )
    } else if !mem_nodes.is_empty() && caller_nodes.is_empty() {
        ck(
            "numa",
            Verdict::Warning,
            format!("device memory is on node(s) {mem_nodes:?}, this process may run on none of their CPUs"),
            Some("numactl --cpunodebind=N (the GPU's node)"),
        )
    } else if mem_nodes.is_empty() {
        ck("numa", Verdict::Ok, "one NUMA node (or none reported)".into(), None)
    } else {
        ck("numa", Verdict::Ok, format!("devices and this process share node(s) {mem_nodes:?}"), None)
    });

    // P2PDMA: the kernel's support, and each storage queue's.
    let p2pdma = match (inputs.driver.and_then(|d| d.info().ok()), &inputs.kconfig) {
        (Some(info), _) => Some(info.has_provider(Provider::P2pdma)),
        (None, Some(k)) => Some(k.lines().any(|l| l == "CONFIG_PCI_P2PDMA=y")),
        (None, None) if all.iter().any(|f| f.p2pmem.is_some()) => Some(true),
        // No configuration file: the kernel's symbols tell (P2PDMA's own functions).
        (None, None) => std::fs::read_to_string(inputs.procfs.join("kallsyms"))
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| s.lines().any(|l| l.ends_with(" pci_p2pdma_add_resource"))),
    };
    out.push(match p2pdma {
        Some(true) => ck(
            "p2pdma",
            Verdict::Ok,
            "the kernel has CONFIG_PCI_P2PDMA".into(),
            None,
        ),
        Some(false) => ck(
            "p2pdma",
            Verdict::Blocking,
            "the kernel lacks CONFIG_PCI_P2PDMA".into(),
            Some("use a kernel built with CONFIG_PCI_P2PDMA=y (and CONFIG_ZONE_DEVICE)"),
        ),
        None => ck(
            "p2pdma",
            Verdict::Warning,
            "cannot tell whether the kernel has CONFIG_PCI_P2PDMA".into(),
            Some("load the module, or install /boot/config-$(uname -r)"),
        ),
    });
    for s in storage {
        let (verdict, evidence, fix) = match (&s.kind, &s.function) {
            (Kind::Nvme, Some(f)) => (Verdict::Ok, format!("{}: NVMe over PCIe ({}): its queues take P2P pages", s.name, f.driver.as_deref().unwrap_or("no driver")), None),
            (Kind::Rdma, None) => (Verdict::Warning, format!("{}: a software RDMA device (no PCI function): NVMe-oF over it always bounces", s.name), Some("use a hardware RNIC whose driver supports P2PDMA (mlx5)")),
            (Kind::Rdma, Some(f)) => (Verdict::Ok, format!("{}: RDMA on {} ({}): nvme-rdma queues take P2P pages when the RNIC driver supports it", s.name, f.addr, f.driver.as_deref().unwrap_or("no driver")), None),
            _ => continue,
        };
        out.push(Check {
            name: "p2pdma",
            verdict,
            evidence,
            fix: fix.map(str::to_string),
        });
    }

    // Fabrics controllers' queues.
    for c in nvmeof::fabric_controllers(&inputs.sysfs) {
        let evidence = format!(
            "{}: {} {}, {} I/O queue(s) of {} entries",
            c.name, c.transport, c.address, c.io_queues, c.queue_size
        );
        let tcp = c.transport == "tcp";
        out.push(match c.queue_size_advice() {
            Some(advice) => Check {
                name: "nvmeof",
                verdict: Verdict::Warning,
                evidence,
                fix: Some(advice),
            },
            None if tcp => ck(
                "nvmeof",
                Verdict::Warning,
                evidence + ": NVMe/TCP copies through the network stack, never P2P",
                Some("use RDMA with a P2P-capable RNIC for direct reads"),
            ),
            None => ck("nvmeof", Verdict::Ok, evidence, None),
        });
    }

    // Peer-memory modules of other stacks, for the record.
    let loaded: Vec<&str> = inputs
        .modules
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|m| ["nvidia", "nvidia_peermem", "nvidia_fs", "gdirect_egpu"].contains(m))
        .collect();
    out.push(ck(
        "peer_memory",
        Verdict::Ok,
        if loaded.is_empty() {
            "no nvidia, nvidia_peermem or nvidia_fs module loaded".into()
        } else {
            format!("loaded: {}", loaded.join(", "))
        },
        None,
    ));
    out
}

mod loading;
pub mod nvidia;

#[cfg(test)]
mod tests;
