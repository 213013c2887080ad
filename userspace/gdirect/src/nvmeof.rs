// SPDX-License-Identifier: GPL-2.0 OR MIT
//! NVMe over Fabrics controllers as sysfs shows them, and the tuning advice operators follow.

use std::path::{Path, PathBuf};

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

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
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
    }
}
