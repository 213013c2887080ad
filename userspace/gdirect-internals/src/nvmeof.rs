// SPDX-License-Identifier: GPL-2.0 OR MIT
//! NVMe over Fabrics controllers as sysfs shows them, and the tuning advice operators follow.

use std::path::{Path, PathBuf};

use crate::sysfs::read;

/// The queue sizes (entries per I/O queue) NVMe-oF tuning guides recommend.
pub const RECOMMENDED_QUEUE_SIZE: std::ops::RangeInclusive<u32> = 128..=256;

/// One NVMe controller connected over a fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricController {
    /// `nvme2`.
    pub name: String,
    /// `rdma`, `tcp`, `fc`, `loop`.
    pub transport: String,
    /// `traddr=...,trsvcid=...`.
    pub address: String,
    /// The subsystem's NQN.
    pub subsysnqn: String,
    /// `live`, `connecting`, `resetting`, ...
    pub state: String,
    /// I/O queues (the admin queue not counted).
    pub io_queues: u32,
    /// Entries per I/O queue (`sqsize` + 1).
    pub queue_size: u32,
}

impl FabricController {
    /// Advice when the queue size is outside [`RECOMMENDED_QUEUE_SIZE`].
    pub fn queue_size_advice(&self) -> Option<String> {
        if RECOMMENDED_QUEUE_SIZE.contains(&self.queue_size) {
            return None;
        }
        Some(format!(
            "queue size {} is outside {}-{}: too small a queue starves the link of requests in flight, too large wastes \
             target memory; reconnect with `nvme connect ... -Q 128` (or 256)",
            self.queue_size,
            RECOMMENDED_QUEUE_SIZE.start(),
            RECOMMENDED_QUEUE_SIZE.end()
        ))
    }
}

/// The fabrics controllers under `sysfs` (normally `/sys`), sorted by name. PCIe controllers
/// are not listed.
pub fn fabric_controllers(sysfs: &Path) -> Vec<FabricController> {
    let dir: PathBuf = sysfs.join("class/nvme");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<FabricController> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let c = e.path();
            let transport = read(&c.join("transport"))?;
            if transport == "pcie" {
                return None;
            }
            Some(FabricController {
                name: e.file_name().to_string_lossy().into_owned(),
                transport,
                address: read(&c.join("address")).unwrap_or_default(),
                subsysnqn: read(&c.join("subsysnqn")).unwrap_or_default(),
                state: read(&c.join("state")).unwrap_or_default(),
                io_queues: read(&c.join("queue_count"))
                    .and_then(|q| q.parse::<u32>().ok())
                    .map_or(0, |q| q.saturating_sub(1)),
                queue_size: read(&c.join("sqsize"))
                    .and_then(|q| q.parse::<u32>().ok())
                    .map_or(0, |q| q + 1),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// NVMe native multipath as the NVMe core reports it (`nvme_core.multipath`): `None` when the
/// NVMe core is not loaded or was built without multipath.
pub fn native_multipath(sysfs: &Path) -> Option<bool> {
    read(&sysfs.join("module/nvme_core/parameters/multipath")).map(|v| v == "Y")
}

/// One path of a multipath head: a controller's view of the namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadPath {
    /// The hidden path disk, `nvme0c1n1`.
    pub name: String,
    /// Its controller, `nvme1`.
    pub controller: String,
    /// The controller's transport: `pcie`, `rdma`, `tcp`, ...
    pub transport: String,
    /// The path's ANA state: `optimized`, `non-optimized`, `inaccessible`, ...
    pub ana_state: String,
}

/// A namespace that NVMe native multipath presents as one head disk over several paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipathHead {
    /// The head disk, `nvme0n1`: the block device users open.
    pub name: String,
    /// The subsystem's NQN.
    pub subsysnqn: String,
    /// The subsystem's I/O policy: `numa`, `round-robin`, `queue-depth`.
    pub iopolicy: String,
    /// The paths linked from the head, sorted by name.
    pub paths: Vec<HeadPath>,
}

impl MultipathHead {
    /// Advice when the paths keep the head from taking P2P pages although some could: a head
    /// takes them only when every path does, and a path over TCP never does, so a TCP path
    /// beside a path of another transport makes every read bounce (reason `multipath`).
    pub fn advice(&self) -> Option<String> {
        let tcp: Vec<&str> = self
            .paths
            .iter()
            .filter(|p| p.transport == "tcp")
            .map(|p| p.name.as_str())
            .collect();
        if tcp.is_empty() || tcp.len() == self.paths.len() {
            return None;
        }
        Some(format!(
            "the head takes P2P pages only when every path does, and the TCP path(s) {} never do: \
             GPU reads of {} bounce through host memory (reason multipath); disconnect the TCP \
             path(s), or boot with nvme_core.multipath=N so that each controller has its own \
             namespace",
            tcp.join(", "),
            self.name
        ))
    }
}

/// The NVMe multipath heads under `sysfs` (normally `/sys`), sorted by name: the block devices
/// of `class/nvme-subsystem/*/` that have a `multipath` directory of paths.
pub fn multipath_heads(sysfs: &Path) -> Vec<MultipathHead> {
    let Ok(subsystems) = std::fs::read_dir(sysfs.join("class/nvme-subsystem")) else {
        return Vec::new();
    };
    let mut heads = Vec::new();
    for subsys in subsystems.filter_map(|e| e.ok()).map(|e| e.path()) {
        let Ok(children) = std::fs::read_dir(&subsys) else {
            continue;
        };
        for head in children.filter_map(|e| e.ok()).map(|e| e.path()) {
            let Ok(links) = std::fs::read_dir(head.join("multipath")) else {
                continue;
            };
            let mut paths: Vec<HeadPath> = links
                .filter_map(|e| e.ok())
                .map(|link| {
                    // A path disk is a child of its controller's device.
                    let ctrl = std::fs::canonicalize(link.path())
                        .ok()
                        .and_then(|p| p.parent().map(Path::to_path_buf));
                    HeadPath {
                        name: link.file_name().to_string_lossy().into_owned(),
                        controller: ctrl
                            .as_ref()
                            .and_then(|c| c.file_name())
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        transport: ctrl
                            .and_then(|c| read(&c.join("transport")))
                            .unwrap_or_default(),
                        ana_state: read(&link.path().join("ana_state")).unwrap_or_default(),
                    }
                })
                .collect();
            paths.sort_by(|a, b| a.name.cmp(&b.name));
            heads.push(MultipathHead {
                name: head
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                subsysnqn: read(&subsys.join("subsysnqn")).unwrap_or_default(),
                iopolicy: read(&subsys.join("iopolicy")).unwrap_or_default(),
                paths,
            });
        }
    }
    heads.sort_by(|a, b| a.name.cmp(&b.name));
    heads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(root: &Path, name: &str, attrs: &[(&str, &str)]) {
        let c = root.join("class/nvme").join(name);
        std::fs::create_dir_all(&c).unwrap();
        for (k, v) in attrs {
            std::fs::write(c.join(k), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn lists_fabrics_controllers_with_queue_advice() {
        let root = std::env::temp_dir().join(format!("gdirect-nvmeof-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        controller(
            &root,
            "nvme0",
            &[
                ("transport", "pcie"),
                ("sqsize", "1023"),
                ("queue_count", "3"),
            ],
        );
        let fabric = [
            ("address", "traddr=169.254.77.1,trsvcid=4420"),
            ("subsysnqn", "nqn.x"),
            ("state", "live"),
            ("queue_count", "5"),
        ];
        controller(
            &root,
            "nvme2",
            &[
                fabric.as_slice(),
                &[("transport", "rdma"), ("sqsize", "31")],
            ]
            .concat(),
        );
        controller(
            &root,
            "nvme3",
            &[
                fabric.as_slice(),
                &[("transport", "tcp"), ("sqsize", "127")],
            ]
            .concat(),
        );
        let list = fabric_controllers(&root);
        assert_eq!(
            list.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["nvme2", "nvme3"]
        );
        assert_eq!((list[0].queue_size, list[0].io_queues), (32, 4));
        assert!(list[0]
            .queue_size_advice()
            .is_some_and(|a| a.contains("-Q 128")));
        assert_eq!(list[1].queue_size_advice(), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn no_sysfs_means_no_controllers() {
        assert!(fabric_controllers(Path::new("/nonexistent")).is_empty());
        assert!(multipath_heads(Path::new("/nonexistent")).is_empty());
        assert_eq!(native_multipath(Path::new("/nonexistent")), None);
    }

    /// A subsystem with a head over paths of the given transports, laid out as the kernel
    /// does: path disks under their controllers, linked from the head's `multipath`.
    fn head(root: &Path, transports: &[&str]) {
        let subsys = root.join("devices/virtual/nvme-subsystem/nvme-subsys0");
        std::fs::create_dir_all(subsys.join("nvme0n1/multipath")).unwrap();
        std::fs::write(subsys.join("subsysnqn"), "nqn.x\n").unwrap();
        std::fs::write(subsys.join("iopolicy"), "round-robin\n").unwrap();
        std::fs::create_dir_all(root.join("class/nvme-subsystem")).unwrap();
        std::os::unix::fs::symlink(&subsys, root.join("class/nvme-subsystem/nvme-subsys0"))
            .unwrap();
        for (i, t) in transports.iter().enumerate() {
            let ctrl = root.join(format!("devices/virtual/nvme-fabrics/ctl/nvme{i}"));
            let path = ctrl.join(format!("nvme0c{i}n1"));
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(ctrl.join("transport"), format!("{t}\n")).unwrap();
            std::fs::write(path.join("ana_state"), "optimized\n").unwrap();
            std::os::unix::fs::symlink(
                &path,
                subsys.join(format!("nvme0n1/multipath/nvme0c{i}n1")),
            )
            .unwrap();
        }
        std::fs::create_dir_all(root.join("module/nvme_core/parameters")).unwrap();
        std::fs::write(root.join("module/nvme_core/parameters/multipath"), "Y\n").unwrap();
    }

    #[test]
    fn lists_multipath_heads_with_their_paths() {
        let root = std::env::temp_dir().join(format!("gdirect-mpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        head(&root, &["tcp", "tcp"]);
        assert_eq!(native_multipath(&root), Some(true));
        let heads = multipath_heads(&root);
        assert_eq!(heads.len(), 1);
        let h = &heads[0];
        assert_eq!(
            (h.name.as_str(), h.subsysnqn.as_str(), h.iopolicy.as_str()),
            ("nvme0n1", "nqn.x", "round-robin")
        );
        assert_eq!(
            h.paths,
            [
                HeadPath {
                    name: "nvme0c0n1".into(),
                    controller: "nvme0".into(),
                    transport: "tcp".into(),
                    ana_state: "optimized".into()
                },
                HeadPath {
                    name: "nvme0c1n1".into(),
                    controller: "nvme1".into(),
                    transport: "tcp".into(),
                    ana_state: "optimized".into()
                },
            ]
        );
        // Paths that all cannot take P2P pages: nothing a remedy would change.
        assert_eq!(h.advice(), None);
        let _ = std::fs::remove_dir_all(&root);

        head(&root, &["rdma", "tcp"]);
        let heads = multipath_heads(&root);
        let advice = heads[0].advice().unwrap_or_default();
        assert!(
            advice.contains("nvme0c1n1") && advice.contains("nvme_core.multipath=N"),
            "{advice}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
