// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect check` against sysfs trees built as the kernel lays them out: one switch, two
//! switches, across host bridges, across NUMA nodes, ACS redirect on, an IOMMU, a software
//! RDMA device, a non-root reader.

use std::{os::unix::fs::symlink, path::PathBuf};

use super::*;

const BRIDGE: u32 = 0x06_04_00;
const GPU: u32 = 0x03_02_00;

/// A sysfs tree in a temporary directory, removed on drop.
struct Tree {
    root: PathBuf,
}

impl Tree {
    fn new(name: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("gdirect-sysfs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bus/pci/devices")).expect("tree");
        Self { root }
    }

    fn write(&self, rel: impl AsRef<Path>, text: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    /// A function at the end of `chain` (bus addresses from the root port down) under host
    /// bridge `host`, with the bridges above it created as needed.
    fn func(&self, host: &str, chain: &[&str], class: u32, vendor: u16, numa: i32) -> PathBuf {
        let mut rel = PathBuf::from("devices").join(host);
        for (i, bdf) in chain.iter().enumerate() {
            rel.push(bdf);
            let dir = self.root.join(&rel);
            if dir.join("class").exists() && i + 1 < chain.len() {
                continue;
            }
            let c = if i + 1 == chain.len() { class } else { BRIDGE };
            self.write(rel.join("class"), &format!("{c:#08x}\n"));
            self.write(
                rel.join("vendor"),
                &format!(
                    "{:#06x}\n",
                    if i + 1 == chain.len() { vendor } else { 0x8086 }
                ),
            );
            self.write(rel.join("numa_node"), &format!("{numa}\n"));
            self.write(
                rel.join("resource"),
                "0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
            );
            std::fs::write(dir.join("config"), vec![0u8; 4096]).expect("config");
            let link = self.root.join("bus/pci/devices").join(bdf);
            if !link.exists() {
                symlink(PathBuf::from("../../..").join(&rel), link).expect("symlink");
            }
        }
        self.root.join(rel)
    }

    fn bar(&self, dev: &Path, size: u64) {
        let start = 0x8000_0000u64;
        std::fs::write(
            dev.join("resource"),
            format!(
                "{start:#018x} {:#018x} 0x0000000000040200\n",
                start + size - 1
            ),
        )
        .expect("resource");
    }

    fn acs(&self, dev: &Path, ctrl: u16) {
        let mut cfg = vec![0u8; 4096];
        cfg[0x100..0x104].copy_from_slice(&(ACS_CAP_ID | 1 << 16).to_le_bytes());
        cfg[0x106..0x108].copy_from_slice(&ctrl.to_le_bytes());
        std::fs::write(dev.join("config"), cfg).expect("config");
    }

    fn class_dev(&self, class: &str, name: &str, dev: Option<&Path>) {
        let dir = self.root.join("class").join(class).join(name);
        std::fs::create_dir_all(&dir).expect("class dir");
        if let Some(dev) = dev {
            symlink(dev, dir.join("device")).expect("device link");
        }
    }

    fn inputs(&self) -> Inputs<'static> {
        Inputs {
            sysfs: self.root.clone(),
            driver: None,
            cpus: vec![0, 1, 2, 3],
            modules: String::new(),
            kconfig: Some("CONFIG_PCI_P2PDMA=y\nCONFIG_RUST=y\n".into()),
            procfs: self.root.join("proc"),
            device: self.root.join("dev/gdirect"),
            module_files: Vec::new(),
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn pair<'r>(r: &'r Report, memory: &str, storage: &str) -> &'r Pair {
    r.pairs
        .iter()
        .find(|p| r.memories[p.memory].name == memory && r.storage[p.storage].name == storage)
        .unwrap_or_else(|| panic!("no pair {memory} / {storage} in {:?}", r.pairs))
}

fn check<'r>(r: &'r Report, name: &str) -> &'r Check {
    r.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check"))
}

/// The rig's shape: an NVMe and a GPU under one switch, another NVMe on another root port.
fn one_switch(t: &Tree) {
    let nvme = t.func(
        "pci0000:00",
        &[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
        ],
        CLASS_NVME,
        0x1b36,
        0,
    );
    let gpu = t.func(
        "pci0000:00",
        &[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:01.0",
            "0000:04:00.0",
        ],
        GPU,
        0x10de,
        0,
    );
    t.bar(&gpu, 64 << 30);
    let far = t.func(
        "pci0000:00",
        &["0000:00:02.0", "0000:05:00.0"],
        CLASS_NVME,
        0x1b36,
        0,
    );
    t.class_dev("nvme", "nvme0", Some(&nvme));
    t.class_dev("nvme", "nvme1", Some(&far));
}

#[test]
fn one_switch_is_pix_and_direct_the_other_root_port_phb() {
    let t = Tree::new("one-switch");
    one_switch(&t);
    let r = super::check(&t.inputs());
    assert_eq!(r.memories.len(), 1);
    assert_eq!(r.memories[0].kind, Kind::Gpu);
    let near = pair(&r, "0000:04:00.0", "nvme0");
    assert_eq!(near.relation, Relation::Pix);
    assert_eq!(near.expected, Some(MapType::BusAddr));
    assert!(near.possible && near.acs_redirect.is_empty());
    let far = pair(&r, "0000:04:00.0", "nvme1");
    assert_eq!(far.relation, Relation::Phb);
    assert!(
        !far.possible,
        "without the module, through the host bridge is not known to work"
    );
    assert!(r.hardware_allows());
    assert!(!r.direct_possible(), "not without the module");
    assert_eq!(check(&r, "acs").verdict, Verdict::Ok);
    assert_eq!(check(&r, "iommu").verdict, Verdict::Ok);
    assert_eq!(check(&r, "bar").verdict, Verdict::Ok, "64 GiB BAR");
    let module = check(&r, "module");
    assert_eq!(module.verdict, Verdict::Blocking);
    assert!(module
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("modprobe gdirect"));
    assert_eq!(check(&r, "p2pdma").verdict, Verdict::Ok);
}

#[test]
fn nvidia_gpu_pages_only_in_p2pdma_mode() {
    let t = Tree::new("gpu-pages");
    one_switch(&t);
    let r = super::check(&t.inputs());
    let c = check(&r, "gpu_pages");
    assert_eq!(
        c.verdict,
        Verdict::Warning,
        "BAR1 without p2pmem: {}",
        c.evidence
    );
    assert!(c.evidence.contains("no struct pages") && c.evidence.contains("EMEDIUMTYPE"));
    assert!(c
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("RmForceDisableIomapWC=1"));
    // NVIDIA's P2PDMA mode publishes the static BAR1 as P2P memory.
    t.write(
        "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/p2pmem/size",
        &format!("{}\n", 64u64 << 30),
    );
    let r = super::check(&t.inputs());
    let c = check(&r, "gpu_pages");
    assert_eq!(c.verdict, Verdict::Ok, "{}", c.evidence);
    assert!(c.evidence.contains("65536 MiB") && c.fix.is_none());
}

#[test]
fn two_switches_are_pxb() {
    let t = Tree::new("two-switches");
    let gpu = t.func(
        "pci0000:00",
        &[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:05:00.0",
        ],
        GPU,
        0x10de,
        0,
    );
    t.bar(&gpu, 32 << 30);
    let nvme = t.func(
        "pci0000:00",
        &[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:01.0",
            "0000:06:00.0",
        ],
        CLASS_NVME,
        0x144d,
        0,
    );
    t.class_dev("nvme", "nvme0", Some(&nvme));
    let r = super::check(&t.inputs());
    let p = pair(&r, "0000:05:00.0", "nvme0");
    assert_eq!(p.relation, Relation::Pxb);
    assert!(p.possible);
}

#[test]
fn across_host_bridges_is_node_or_sys_and_numa_is_flagged() {
    let t = Tree::new("hosts");
    let gpu = t.func(
        "pci0000:00",
        &["0000:00:01.0", "0000:01:00.0"],
        GPU,
        0x10de,
        0,
    );
    t.bar(&gpu, 32 << 30);
    let same_node = t.func(
        "pci0000:40",
        &["0000:40:01.0", "0000:41:00.0"],
        CLASS_NVME,
        0x144d,
        0,
    );
    let other_node = t.func(
        "pci0000:80",
        &["0000:80:01.0", "0000:81:00.0"],
        CLASS_NVME,
        0x144d,
        1,
    );
    t.class_dev("nvme", "nvme0", Some(&same_node));
    t.class_dev("nvme", "nvme1", Some(&other_node));
    t.write("devices/system/node/node0/cpulist", "0-3\n");
    t.write("devices/system/node/node1/cpulist", "4-7\n");
    let r = super::check(&t.inputs());
    assert_eq!(pair(&r, "0000:01:00.0", "nvme0").relation, Relation::Node);
    assert_eq!(pair(&r, "0000:01:00.0", "nvme1").relation, Relation::Sys);
    assert!(!r.hardware_allows());
    let numa = check(&r, "numa");
    assert_eq!(numa.verdict, Verdict::Warning);
    assert!(
        numa.evidence.contains("nvme1 (node 1)"),
        "{}",
        numa.evidence
    );

    // Running only on node 1's CPUs, away from the GPU on node 0.
    let mut inputs = t.inputs();
    inputs.cpus = vec![4, 5];
    let r = super::check(&inputs);
    let numa = check(&r, "numa");
    assert_eq!(numa.verdict, Verdict::Warning);
}

#[test]
fn acs_redirect_on_a_switch_port_is_found_and_blocks_bus_addresses() {
    let t = Tree::new("acs");
    one_switch(&t);
    let port = t
        .root
        .join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0");
    t.acs(&port, ACS_RR | ACS_CR | 1);
    let r = super::check(&t.inputs());
    let p = pair(&r, "0000:04:00.0", "nvme0");
    assert_eq!(p.relation, Relation::Pix);
    assert_eq!(
        p.acs_redirect,
        vec!["0000:02:01.0".parse::<PciAddress>().expect("addr")]
    );
    assert_eq!(p.expected, None);
    assert!(!p.possible);
    assert!(!r.hardware_allows());
    let acs = check(&r, "acs");
    assert_eq!(acs.verdict, Verdict::Warning);
    assert!(acs.evidence.contains("0000:02:01.0"), "{}", acs.evidence);
    // Source validation alone (bit 0) is not a redirect.
    t.acs(&port, 1);
    assert!(super::check(&t.inputs()).hardware_allows());
}

#[test]
fn an_unreadable_config_space_says_acs_is_unknown() {
    let t = Tree::new("noroot");
    one_switch(&t);
    for bdf in [
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:02:01.0",
        "0000:03:00.0",
        "0000:04:00.0",
    ] {
        let dir = t.root.join("bus/pci/devices").join(bdf);
        std::fs::write(dir.join("config"), vec![0u8; 64]).expect("config");
    }
    let r = super::check(&t.inputs());
    let acs = check(&r, "acs");
    assert_eq!(acs.verdict, Verdict::Warning);
    assert!(acs.fix.as_deref().unwrap_or("").contains("root"));
}

#[test]
fn an_iommu_a_small_bar_and_a_software_rdma_device_are_flagged() {
    let t = Tree::new("iommu");
    one_switch(&t);
    let gpu = t.root.join("bus/pci/devices/0000:04:00.0");
    t.bar(&gpu, 256 << 20);
    t.write("class/iommu/dmar0/name", "dmar0\n");
    t.write("kernel/iommu_groups/0/type", "DMA-FQ\n");
    t.class_dev("infiniband", "rxe0", None);
    let r = super::check(&t.inputs());
    assert_eq!(check(&r, "iommu").verdict, Verdict::Warning);
    assert!(check(&r, "iommu")
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("iommu=pt"));
    let bar = check(&r, "bar");
    assert_eq!(bar.verdict, Verdict::Warning);
    assert!(bar.evidence.contains("256 MiB"));
    let rxe = pair(&r, "0000:04:00.0", "rxe0");
    assert_eq!(rxe.relation, Relation::Virtual);
    assert!(!rxe.possible);
    assert!(r.checks.iter().any(|c| c.name == "p2pdma"
        && c.verdict == Verdict::Warning
        && c.evidence.contains("rxe0")));
    // Identity domains are fine.
    t.write("kernel/iommu_groups/0/type", "identity\n");
    assert_eq!(
        check(&super::check(&t.inputs()), "iommu").verdict,
        Verdict::Ok
    );
}

#[test]
fn p2p_memory_functions_are_rows_and_fabrics_queues_are_checked() {
    let t = Tree::new("p2pmem");
    one_switch(&t);
    // The rig's emulated GPU: RAM-class ivshmem publishing its BAR as P2P memory.
    let egpu = t.func(
        "pci0000:00",
        &[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:02.0",
            "0000:07:00.0",
        ],
        0x05_00_00,
        0x1af4,
        -1,
    );
    t.write(egpu.join("p2pmem/size"), &(256u64 << 20).to_string());
    t.write("class/nvme/nvme2/transport", "rdma\n");
    t.write("class/nvme/nvme2/sqsize", "31\n");
    t.write("class/nvme/nvme2/queue_count", "2\n");
    t.write("class/nvme/nvme2/address", "traddr=10.0.0.1,trsvcid=4420\n");
    let r = super::check(&t.inputs());
    assert!(r
        .memories
        .iter()
        .any(|m| m.name == "0000:07:00.0" && m.kind == Kind::P2pMem));
    assert_eq!(pair(&r, "0000:07:00.0", "nvme0").relation, Relation::Pix);
    assert!(
        r.storage.iter().all(|s| s.name != "nvme2"),
        "a fabrics controller is no PCI DMA device"
    );
    let q = check(&r, "nvmeof");
    assert_eq!(q.verdict, Verdict::Warning);
    assert!(q.evidence.contains("32 entries"), "{}", q.evidence);
}

#[test]
fn cpu_lists_parse() {
    assert_eq!(cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(cpu_list(""), Vec::<usize>::new());
    assert_eq!(cpu_list("3-1"), Vec::<usize>::new());
}

/// A module file as `make` leaves it, as far as the check reads it: its `.modinfo` strings.
fn module_file(t: &Tree, name: &str, release: &str) -> PathBuf {
    let p = t.root.join(name);
    let mut bytes = b"\x7fELF....license=GPL\0".to_vec();
    bytes.extend_from_slice(
        format!("vermagic={release} SMP preempt mod_unload \0name=gdirect\0").as_bytes(),
    );
    std::fs::write(&p, bytes).expect("module file");
    p
}

#[test]
fn a_node_that_loads_no_modules_gets_no_insmod_advice() {
    let t = Tree::new("modules-disabled");
    t.write("proc/sys/kernel/osrelease", "7.2.13\n");
    t.write("proc/sys/kernel/modules_disabled", "1\n");
    let r = super::check(&t.inputs());
    let loading = check(&r, "module_loading");
    assert_eq!(loading.verdict, Verdict::Blocking);
    assert!(
        loading.evidence.contains("modules_disabled is 1"),
        "{}",
        loading.evidence
    );
    assert!(
        loading.evidence.contains("unsigned modules would load"),
        "{}",
        loading.evidence
    );
    let module = check(&r, "module");
    assert_eq!(module.verdict, Verdict::Blocking);
    let fix = module.fix.as_deref().unwrap_or("");
    assert!(
        !fix.contains("insmod")
            && !fix.contains("modprobe")
            && fix.contains("module loading is disabled"),
        "{fix}"
    );
}

#[test]
fn signatures_required_by_sig_enforce_lockdown_and_secure_boot_are_named() {
    let t = Tree::new("signatures");
    t.write("proc/sys/kernel/osrelease", "7.2.13\n");
    t.write("proc/sys/kernel/modules_disabled", "0\n");
    t.write("module/module/parameters/sig_enforce", "Y\n");
    t.write(
        "kernel/security/lockdown",
        "none [integrity] confidentiality\n",
    );
    let sb = t.root.join(super::loading::SECURE_BOOT_VAR);
    std::fs::create_dir_all(sb.parent().expect("parent")).expect("efivars");
    std::fs::write(&sb, [6u8, 0, 0, 0, 1]).expect("SecureBoot");
    let r = super::check(&t.inputs());
    let loading = check(&r, "module_loading");
    assert_eq!(loading.verdict, Verdict::Warning);
    for what in [
        "module.sig_enforce=1",
        "lockdown=integrity",
        "Secure Boot on",
    ] {
        assert!(
            loading.evidence.contains(what),
            "{what}: {}",
            loading.evidence
        );
    }
    assert!(loading
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("mokutil --import"));
    // Without any of them: unsigned modules load.
    let t = Tree::new("unsigned-ok");
    t.write(
        "kernel/security/lockdown",
        "[none] integrity confidentiality\n",
    );
    t.write("module/module/parameters/sig_enforce", "N\n");
    assert_eq!(
        check(&super::check(&t.inputs()), "module_loading").verdict,
        Verdict::Ok
    );
}

#[test]
fn the_kernels_rust_support_and_a_built_modules_vermagic_are_checked() {
    let t = Tree::new("vermagic");
    t.write("proc/sys/kernel/osrelease", "7.2.13\n");
    let mut inputs = t.inputs();
    // No Rust in the config: blocking, and no module to load; no config at all: unknown.
    inputs.kconfig = Some("CONFIG_PCI_P2PDMA=y\n".into());
    let r = super::check(&inputs);
    assert_eq!(check(&r, "rust").verdict, Verdict::Blocking);
    assert!(check(&r, "module")
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("no Rust support"));
    // Nor advice to build a module that no kernel of this node can load.
    let fix = check(&r, "module_file").fix.clone().unwrap_or_default();
    assert!(
        fix.contains("no Rust support") && !fix.contains("build-for-running-kernel"),
        "{fix}"
    );
    inputs.kconfig = None;
    assert_eq!(
        check(&super::check(&inputs), "rust").verdict,
        Verdict::Warning
    );
    // Without a configuration file, the kernel's symbols tell.
    t.write("proc/kallsyms", "0000000000000000 T _printk\n");
    assert_eq!(
        check(&super::check(&inputs), "rust").verdict,
        Verdict::Blocking
    );
    t.write(
        "proc/kallsyms",
        "0000000000000000 T _printk\n0000000000000000 T _RNvCs1234_7___rustc17rust_begin_unwind\n",
    );
    assert_eq!(check(&super::check(&inputs), "rust").verdict, Verdict::Ok);
    // ... and whether P2PDMA is built in.
    assert_eq!(
        check(&super::check(&inputs), "p2pdma").verdict,
        Verdict::Blocking
    );
    t.write(
        "proc/kallsyms",
        "0000000000000000 T rust_helper_BUG\n0000000000000000 T pci_p2pdma_add_resource\n",
    );
    assert_eq!(check(&super::check(&inputs), "p2pdma").verdict, Verdict::Ok);
    inputs.kconfig = Some("CONFIG_RUST=y\nCONFIG_PCI_P2PDMA=y\n".into());
    assert_eq!(check(&super::check(&inputs), "rust").verdict, Verdict::Ok);
    // No module built: say how to build one.
    let r = super::check(&inputs);
    assert_eq!(check(&r, "module_file").verdict, Verdict::Warning);
    assert!(check(&r, "module_file")
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("scripts/build-for-running-kernel (it checks /lib/modules/7.2.13/build"));
    // One built for another kernel: blocking, with both releases named.
    inputs.module_files = vec![module_file(&t, "old.ko", "7.1.0")];
    let r = super::check(&inputs);
    let f = check(&r, "module_file");
    assert_eq!(f.verdict, Verdict::Blocking);
    assert!(
        f.evidence.contains("built for 7.1.0, not 7.2.13"),
        "{}",
        f.evidence
    );
    // One built for this kernel: loading it is the fix.
    let good = module_file(&t, "good.ko", "7.2.13");
    inputs.module_files.push(good.clone());
    let r = super::check(&inputs);
    assert_eq!(check(&r, "module_file").verdict, Verdict::Ok);
    assert_eq!(
        check(&r, "module").fix.as_deref(),
        Some(format!("sudo insmod {}", good.display()).as_str())
    );
}

#[test]
fn with_signatures_enforced_an_unsigned_module_blocks_and_a_signed_one_is_advised() {
    let t = Tree::new("sig-enforce");
    t.write("module/module/parameters/sig_enforce", "Y\n");
    t.write("proc/sys/kernel/osrelease", "7.2.13\n");
    let mut inputs = t.inputs();
    inputs.kconfig = Some("CONFIG_RUST=y\n".into());
    let unsigned = module_file(&t, "unsigned.ko", "7.2.13");
    inputs.module_files = vec![unsigned.clone()];
    let r = super::check(&inputs);
    let l = check(&r, "module_loading");
    assert_eq!(l.verdict, Verdict::Warning);
    assert!(
        l.evidence.contains("module.sig_enforce=1"),
        "{}",
        l.evidence
    );
    let f = check(&r, "module_file");
    assert_eq!(f.verdict, Verdict::Blocking, "{}", f.evidence);
    assert!(f.evidence.contains("unsigned"), "{}", f.evidence);
    assert!(
        f.fix.as_deref().unwrap_or("").contains("--sign-key"),
        "{:?}",
        f.fix
    );
    assert!(
        !check(&r, "module")
            .fix
            .as_deref()
            .unwrap_or("")
            .contains("insmod"),
        "no advice to load a module the kernel refuses"
    );
    // The same module with a signature appended: found, signed, loading it is the fix.
    let mut bytes = std::fs::read(&unsigned).expect("module");
    bytes.extend_from_slice(b"PKCS7...\0\0\x02\0\0\0\0\0\0\0\0\x08~Module signature appended~\n");
    let signed = t.root.join("signed.ko");
    std::fs::write(&signed, bytes).expect("signed module");
    inputs.module_files = vec![signed.clone()];
    let r = super::check(&inputs);
    let f = check(&r, "module_file");
    assert_eq!(f.verdict, Verdict::Ok, "{}", f.evidence);
    assert!(f.evidence.ends_with(", signed"), "{}", f.evidence);
    assert_eq!(
        check(&r, "module").fix.as_deref(),
        Some(format!("sudo insmod {}", signed.display()).as_str())
    );
}

#[test]
fn a_loaded_module_whose_node_cannot_be_opened_is_a_device_problem() {
    let t = Tree::new("device");
    std::fs::create_dir_all(t.root.join("module/gdirect")).expect("module dir");
    let r = super::check(&t.inputs());
    assert_eq!(check(&r, "module").verdict, Verdict::Ok);
    let d = check(&r, "device");
    assert_eq!(d.verdict, Verdict::Blocking);
    assert!(d.evidence.contains("missing"), "{}", d.evidence);
    t.write("dev/gdirect", "");
    let r = super::check(&t.inputs());
    let d = check(&r, "device");
    assert!(d.evidence.contains("mode"), "{}", d.evidence);
}

#[test]
fn node_permissions_are_decided_as_the_kernel_does() {
    use super::loading::may_open;
    // root:gdirect 0660
    assert!(may_open(0o660, 0, 1234, 1000, &[1000, 1234]));
    assert!(!may_open(0o660, 0, 1234, 1000, &[1000]));
    assert!(may_open(0o660, 0, 1234, 0, &[0]));
    // owner bits for the owner only, even when the group would allow more
    assert!(!may_open(0o460, 1000, 1234, 1000, &[1234]));
    assert!(may_open(0o666, 0, 0, 1000, &[1000]));
    assert!(!may_open(0o664, 0, 0, 1000, &[1000]));
}

#[test]
fn vermagic_is_read_from_modinfo() {
    use super::loading::vermagic_release;
    assert_eq!(
        vermagic_release(b"x\0vermagic=7.2.13 SMP preempt mod_unload \0y").as_deref(),
        Some("7.2.13")
    );
    assert_eq!(vermagic_release(b"no modinfo here"), None);
}
