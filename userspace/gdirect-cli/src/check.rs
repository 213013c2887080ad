// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect check`: can the direct path work on this node, why not, and what to change.

use std::{path::Path, process::ExitCode};

use serde::Serialize;

use crate::print_json;
use gdirect::{Driver, MapType};
use gdirect_internals::topology::{self, Endpoint, Inputs, Report, Verdict};

#[derive(Serialize)]
struct EndpointJson {
    name: String,
    kind: &'static str,
    pci: Option<String>,
    host_bridge: Option<String>,
    numa_node: Option<u32>,
    driver: Option<String>,
    bar_bytes: Vec<u64>,
    p2pmem_bytes: Option<u64>,
}

#[derive(Serialize)]
struct PairJson {
    memory: String,
    storage: String,
    relation: &'static str,
    acs_redirect: Vec<String>,
    kernel: Option<&'static str>,
    distance: Option<u32>,
    expected: Option<&'static str>,
    possible: bool,
    disagreement: Option<String>,
}

#[derive(Serialize)]
struct CheckJson {
    name: &'static str,
    verdict: &'static str,
    evidence: String,
    fix: Option<String>,
}

#[derive(Serialize)]
struct ReportJson {
    direct_possible: bool,
    module_loaded: bool,
    memories: Vec<EndpointJson>,
    storage: Vec<EndpointJson>,
    pairs: Vec<PairJson>,
    checks: Vec<CheckJson>,
}

fn endpoint_json(e: &Endpoint) -> EndpointJson {
    let f = e.function.as_ref();
    EndpointJson {
        name: e.name.clone(),
        kind: e.kind.name(),
        pci: f.map(|f| f.addr.to_string()),
        host_bridge: f.map(|f| f.host_bridge.clone()),
        numa_node: f.and_then(|f| f.numa_node),
        driver: f.and_then(|f| f.driver.clone()),
        bar_bytes: f.map(|f| f.bars.clone()).unwrap_or_default(),
        p2pmem_bytes: f.and_then(|f| f.p2pmem),
    }
}

/// The kernel's verdict in one word for the matrix.
fn word(m: MapType) -> &'static str {
    match m {
        MapType::BusAddr => "direct",
        MapType::ThruHostBridge => "via-root",
        MapType::NotSupported | MapType::HostMemory => "refused",
    }
}

/// `gdirect check` (every section). Exit 0 when the direct path can work for at least one
/// pair, 1 when not, 2 when the node cannot be read.
pub(crate) fn run(device: &Path, sysfs: &Path, json: bool) -> ExitCode {
    if !sysfs.join("bus/pci/devices").is_dir() {
        eprintln!(
            "gdirect: cannot read {}: is sysfs mounted?",
            sysfs.join("bus/pci/devices").display()
        );
        return ExitCode::from(2);
    }
    let driver = Driver::open_path(device).ok();
    let mut inputs = Inputs::live(driver.as_ref());
    inputs.sysfs = sysfs.to_path_buf();
    #[allow(unused_mut, reason = "only CUDA builds add checks")]
    let mut report = topology::check(&inputs);
    #[cfg(feature = "cuda")]
    report.checks.extend(bar1_checks(sysfs));
    if json {
        print_report_json(&report, driver.is_some());
    } else {
        print_report(&report, driver.is_some());
    }
    if report.direct_possible() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// BAR1 against each CUDA GPU's memory: NVIDIA's P2PDMA mode (the only one in which storage
/// can DMA to GPU memory through the block layer) needs a static BAR1 that maps all of the
/// GPU's memory, so a BAR1 smaller than the memory rules it out.
#[cfg(feature = "cuda")]
fn bar1_checks(sysfs: &Path) -> Vec<topology::Check> {
    const GIB: f64 = (1u64 << 30) as f64;
    gdirect::compat::device_facts()
        .into_iter()
        .map(|d| {
            // BAR1, the framebuffer aperture: the function's largest memory BAR, from its
            // `resource` file (`start end flags` per BAR). Its index depends on BAR0's width:
            // resource 1 after a 32-bit BAR0, 2 after a 64-bit one (the H200 machine's).
            let bar1 = std::fs::read_to_string(sysfs.join(format!("bus/pci/devices/{}/resource", d.pci)))
                .ok()
                .and_then(|r| {
                    r.lines()
                        .take(6)
                        .filter_map(|l| {
                            let v: Vec<u64> = l
                                .split_whitespace()
                                .filter_map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
                                .collect();
                            // IORESOURCE_MEM
                            (v.len() == 3 && v[2] & 0x200 != 0 && v[1] > v[0]).then(|| v[1] - v[0] + 1)
                        })
                        .max()
                });
            let mem = d.total_memory as f64 / GIB;
            let (verdict, evidence, fix) = match bar1 {
                Some(b) if b >= d.total_memory => (
                    topology::Verdict::Ok,
                    format!(
                        "cuda:{} ({}): BAR1 {:.1} GiB over {mem:.1} GiB of memory: a static BAR1 mapping all of it is possible (NVIDIA's P2PDMA mode)",
                        d.ordinal, d.pci, b as f64 / GIB
                    ),
                    None,
                ),
                Some(b) => (
                    topology::Verdict::Warning,
                    format!(
                        "cuda:{} ({}): BAR1 {:.1} GiB, smaller than its {mem:.1} GiB of memory: no static BAR1, so no P2PDMA mode: gdirect refuses its memory (EMEDIUMTYPE) and reads through host memory",
                        d.ordinal, d.pci, b as f64 / GIB
                    ),
                    Some("enable Resizable BAR (Above 4G Decoding) in the firmware, so that BAR1 covers all GPU memory".to_string()),
                ),
                None => (
                    topology::Verdict::Warning,
                    format!("cuda:{} ({}): its BAR1 cannot be read from sysfs", d.ordinal, d.pci),
                    None,
                ),
            };
            topology::Check {
                name: "bar1",
                verdict,
                evidence,
                fix,
            }
        })
        .collect()
}

fn print_report_json(r: &Report, module_loaded: bool) {
    print_json(&ReportJson {
        direct_possible: r.direct_possible(),
        module_loaded,
        memories: r.memories.iter().map(endpoint_json).collect(),
        storage: r.storage.iter().map(endpoint_json).collect(),
        pairs: r
            .pairs
            .iter()
            .map(|p| PairJson {
                memory: r.memories[p.memory].name.clone(),
                storage: r.storage[p.storage].name.clone(),
                relation: p.relation.name(),
                acs_redirect: p.acs_redirect.iter().map(|a| a.to_string()).collect(),
                kernel: p.kernel.map(|k| k.map_type.name()),
                distance: p.kernel.and_then(|k| k.distance),
                expected: p.expected.map(MapType::name),
                possible: p.possible,
                disagreement: p.disagreement.clone(),
            })
            .collect(),
        checks: r
            .checks
            .iter()
            .map(|c| CheckJson {
                name: c.name,
                verdict: c.verdict.name(),
                evidence: c.evidence.clone(),
                fix: c.fix.clone(),
            })
            .collect(),
    });
}

fn print_report(r: &Report, module_loaded: bool) {
    println!("Topology: device memory (rows) against storage DMA devices (columns)");
    if r.memories.is_empty() || r.storage.is_empty() {
        println!(
            "  {} device-memory function(s), {} NVMe/RDMA device(s): no pair to check",
            r.memories.len(),
            r.storage.len()
        );
    } else {
        print!("  {:<22}", "");
        for s in &r.storage {
            print!(" {:<18}", s.name);
        }
        println!();
        for (mi, m) in r.memories.iter().enumerate() {
            print!("  {:<22}", format!("{} {}", m.name, m.kind.name()));
            for si in 0..r.storage.len() {
                let cell = match r.pairs.iter().find(|p| p.memory == mi && p.storage == si) {
                    None => "-".to_string(),
                    Some(p) => match p.kernel {
                        Some(k) => format!("{} {}", p.relation, word(k.map_type)),
                        None => format!(
                            "{} {}",
                            p.relation,
                            if p.possible { "direct?" } else { "?" }
                        ),
                    },
                };
                print!(" {cell:<18}");
            }
            println!();
        }
        println!(
            "  PIX one switch, PXB several, PHB through the host bridge, NODE across host bridges,\n  \
             SYS across NUMA nodes, VIRT no PCI device; then the kernel's P2PDMA verdict{}",
            if module_loaded { "" } else { " (module not loaded: ? is sysfs's guess)" }
        );
        for p in r.pairs.iter().filter(|p| p.disagreement.is_some()) {
            println!(
                "  note {} / {}: {}",
                r.memories[p.memory].name,
                r.storage[p.storage].name,
                p.disagreement.as_deref().unwrap_or_default()
            );
        }
    }
    println!();
    println!("Checks");
    for c in &r.checks {
        let v = match c.verdict {
            Verdict::Ok => "ok",
            Verdict::Warning => "WARNING",
            Verdict::Blocking => "BLOCKING",
        };
        println!("  {v:<9} {:<14} {}", c.name, c.evidence);
        if let Some(fix) = &c.fix {
            println!("  {:<9} {:<14} fix: {fix}", "", "");
        }
    }
    println!();
    let possible: Vec<String> = r
        .pairs
        .iter()
        .filter(|p| p.possible)
        .map(|p| {
            format!(
                "{} <- {}",
                r.memories[p.memory].name, r.storage[p.storage].name
            )
        })
        .collect();
    if possible.is_empty() {
        println!("Direct path: not possible on this node (see the checks above)");
    } else {
        println!("Direct path: possible for {}", possible.join(", "));
    }
}
