// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Whether this node can load gdirect, and whether this user can use it: module loading
//! disabled, signatures required (`sig_enforce`, lockdown, Secure Boot), the kernel's Rust
//! support, a built module's vermagic against the running kernel, and the device node's
//! permissions. Each check says what it found and, where something is in the way, the fix
//! that works on this node (no `insmod` advice where no module can be loaded).

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{read, Check, Inputs, Verdict};
use gdirect::Provider;

/// How to sign the module with a key the kernel trusts (a Machine Owner Key on Secure Boot).
const SIGN_FIX: &str =
    "sign gdirect.ko with your key: scripts/build-for-running-kernel --sign-key MOK.priv --sign-cert MOK.der";

/// EFI's global-variable GUID: `SecureBoot-<guid>` holds whether Secure Boot is on.
pub(crate) const SECURE_BOOT_VAR: &str =
    "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e39fb3f3f9e2";

fn ck(name: &'static str, verdict: Verdict, evidence: String, fix: Option<String>) -> Check {
    Check {
        name,
        verdict,
        evidence,
        fix,
    }
}

/// The module files `make` and `make install` (or DKMS) leave for kernel `release`.
pub(crate) fn installed_modules(release: &str) -> Vec<PathBuf> {
    ["extra", "updates/dkms", "updates"]
        .iter()
        .map(|d| PathBuf::from(format!("/lib/modules/{release}/{d}/gdirect.ko")))
        .filter(|p| p.is_file())
        .collect()
}

/// The kernel release a module was built for: the first word of its `vermagic=` string
/// (`.modinfo`), `None` when the file has none (not a kernel module).
pub(crate) fn vermagic_release(module: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"vermagic=";
    let at = module.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let value = &module[at..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    let text = std::str::from_utf8(&value[..end]).ok()?;
    text.split_whitespace().next().map(str::to_string)
}

/// Whether a module file ends in an appended signature (`include/linux/module_signature.h`:
/// the signature, then `struct module_signature`, then this marker).
pub(crate) fn module_signed(module: &[u8]) -> bool {
    module.ends_with(b"~Module signature appended~\n")
}

/// Whether a user (`uid`, in `groups`) may open a node of `mode` owned by `owner:group` for
/// reading and writing, as the kernel decides for a non-root caller.
pub(crate) fn may_open(mode: u32, owner: u32, group: u32, uid: u32, groups: &[u32]) -> bool {
    let rw = if uid == 0 {
        return true;
    } else if uid == owner {
        (mode >> 6) & 0o6
    } else if groups.contains(&group) {
        (mode >> 3) & 0o6
    } else {
        mode & 0o6
    };
    rw == 0o6
}

/// Whether a `/proc/kallsyms` line names a symbol only a kernel with Rust support has.
fn rust_symbol(line: &str) -> bool {
    let name = line.split_whitespace().nth(2).unwrap_or("");
    name.starts_with("rust_helper_") || name.ends_with("rust_begin_unwind")
}

/// The caller's uid and groups (primary and supplementary).
fn caller() -> (u32, Vec<u32>) {
    let uid = nix::unistd::getuid().as_raw();
    let mut groups: Vec<u32> = nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default();
    groups.push(nix::unistd::getgid().as_raw());
    (uid, groups)
}

/// The group's name, from `/etc/group`.
fn group_name(gid: u32) -> Option<String> {
    std::fs::read_to_string("/etc/group")
        .ok()?
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2].parse() == Ok(gid))
        .map(|f| f[0].to_string())
}

/// The checks of the module, the device node and the node's ability to load the module.
pub(super) fn checks(inputs: &Inputs<'_>, nvidia_gpus: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let release = read(&inputs.procfs.join("sys/kernel/osrelease")).unwrap_or_default();
    let loaded = inputs.sysfs.join("module/gdirect").is_dir() || inputs.driver.is_some();

    match inputs.driver.map(|d| d.info()) {
        Some(Ok(info)) => {
            let providers: Vec<&str> = info.providers().map(Provider::name).collect();
            let evidence = format!(
                "gdirect {} (ABI {}), providers: {}",
                info.version,
                info.abi_version,
                providers.join(", ")
            );
            out.push(if nvidia_gpus && !info.has_provider(Provider::Nvidia) {
                ck(
                    "module",
                    Verdict::Warning,
                    evidence + "; NVIDIA GPUs present but no nv-p2p provider",
                    Some("load the NVIDIA driver (nvidia.ko, open or proprietary) before using GPU memory".into()),
                )
            } else {
                ck("module", Verdict::Ok, evidence, None)
            });
            return out;
        }
        Some(Err(e)) => {
            out.push(ck(
                "module",
                Verdict::Blocking,
                format!("the module does not answer: {e}"),
                Some("reload gdirect.ko built for this kernel".into()),
            ));
            return out;
        }
        None => {}
    }

    // Loaded, but this user cannot open its node.
    if loaded {
        out.push(ck(
            "module",
            Verdict::Ok,
            "loaded (/sys/module/gdirect)".into(),
            None,
        ));
        out.push(device_check(&inputs.device));
        return out;
    }

    // Not loaded: can it be?
    let disabled = read(&inputs.procfs.join("sys/kernel/modules_disabled")).as_deref() == Some("1");
    let mut signed = Vec::new();
    if read(&inputs.sysfs.join("module/module/parameters/sig_enforce")).as_deref() == Some("Y") {
        signed.push("module.sig_enforce=1".to_string());
    }
    if let Some(l) = read(&inputs.sysfs.join("kernel/security/lockdown")) {
        if let Some(mode) = l.split_whitespace().find(|w| w.starts_with('[')) {
            let mode = mode.trim_matches(|c| c == '[' || c == ']');
            if mode != "none" {
                signed.push(format!("lockdown={mode}"));
            }
        }
    }
    let secure_boot = std::fs::read(inputs.sysfs.join(SECURE_BOOT_VAR))
        .ok()
        .and_then(|v| v.get(4).copied())
        == Some(1);
    if secure_boot {
        signed.push("Secure Boot on".to_string());
    }
    let signatures = match signed.is_empty() {
        true => "unsigned modules would load".to_string(),
        false => format!(
            "modules would need a trusted signature: {}",
            signed.join(", ")
        ),
    };
    out.push(if disabled {
        ck(
            "module_loading",
            Verdict::Blocking,
            format!("/proc/sys/kernel/modules_disabled is 1: this kernel loads no module until it reboots (then {signatures})"),
            Some("boot with module loading allowed (find what sets kernel.modules_disabled=1: a sysctl.d file, a hardening profile); until then gdirect reads through host memory (the compat engine)".into()),
        )
    } else if !signed.is_empty() {
        ck(
            "module_loading",
            Verdict::Warning,
            format!(
                "modules load only with a signature the kernel trusts ({})",
                signed.join(", ")
            ),
            Some(format!("{SIGN_FIX} and enroll the certificate once (mokutil --import MOK.der, then reboot; README: Installing on a GPU node)")),
        )
    } else {
        ck(
            "module_loading",
            Verdict::Ok,
            "modules can be loaded, unsigned ones too".into(),
            None,
        )
    });

    out.push(match &inputs.kconfig {
        Some(c) if c.lines().any(|l| l.trim() == "CONFIG_RUST=y") => {
            ck("rust", Verdict::Ok, format!("{release} is built with CONFIG_RUST=y"), None)
        }
        Some(_) => ck(
            "rust",
            Verdict::Blocking,
            format!("{release} is built without Rust support (no CONFIG_RUST=y in its config): gdirect, a Rust module, cannot be built or loaded for it"),
            Some("run a kernel built with CONFIG_RUST=y (and its Rust metadata for building modules)".into()),
        ),
        // No configuration file: the kernel's own symbols tell. A Rust kernel has its C helpers
        // for Rust (`rust_helper_*`) and its panic handler (`rust_begin_unwind`, mangled by
        // recent compilers as `..._7___rustc17rust_begin_unwind`).
        None => match std::fs::read_to_string(inputs.procfs.join("kallsyms")) {
            Ok(syms) if syms.lines().any(rust_symbol) => ck(
                "rust",
                Verdict::Ok,
                format!("{release} has Rust support (its Rust symbols are in /proc/kallsyms)"),
                None,
            ),
            Ok(syms) if !syms.is_empty() => ck(
                "rust",
                Verdict::Blocking,
                format!("{release} has no Rust support (no Rust symbol in /proc/kallsyms): gdirect, a Rust module, cannot be built or loaded for it"),
                Some("run a kernel built with CONFIG_RUST=y (and its Rust metadata for building modules)".into()),
            ),
            _ => ck(
                "rust",
                Verdict::Warning,
                format!("cannot tell whether {release} has Rust support: no /boot/config-{release}, no /proc/kallsyms"),
                Some("check the kernel's configuration for CONFIG_RUST=y".into()),
            ),
        },
    });

    let no_rust = out.last().is_some_and(|c| c.verdict == Verdict::Blocking);
    let build = format!(
        "scripts/build-for-running-kernel (it checks /lib/modules/{release}/build and the compilers), then sudo make install"
    );
    let mut built = None;
    out.push(if inputs.module_files.is_empty() {
        ck(
            "module_file",
            Verdict::Warning,
            format!("no gdirect.ko for {release} in /lib/modules/{release}/{{extra,updates/dkms,updates}}"),
            Some(if no_rust {
                "none for this kernel: it has no Rust support (see rust)".into()
            } else {
                format!("build it against this kernel's tree: {build}")
            }),
        )
    } else {
        let found: Vec<(PathBuf, Option<String>, bool)> = inputs
            .module_files
            .iter()
            .map(|p| match std::fs::read(p) {
                Ok(b) => (p.clone(), vermagic_release(&b), module_signed(&b)),
                Err(_) => (p.clone(), None, false),
            })
            .collect();
        match found.iter().find(|(_, r, _)| r.as_deref() == Some(release.as_str())) {
            // The kernel refuses an unsigned module when it enforces signatures (whether it
            // trusts a signed one's key shows only at load: EKEYREJECTED).
            Some((p, _, false)) if !signed.is_empty() => ck(
                "module_file",
                Verdict::Blocking,
                format!(
                    "{} is built for {release} but unsigned, and this kernel loads only signed modules ({})",
                    p.display(),
                    signed.join(", ")
                ),
                Some(format!("{SIGN_FIX}, then sudo make install")),
            ),
            Some((p, _, is_signed)) => {
                built = Some(p.clone());
                let sig = if *is_signed { ", signed" } else { "" };
                ck("module_file", Verdict::Ok, format!("{} is built for {release}{sig}", p.display()), None)
            }
            None => ck(
                "module_file",
                Verdict::Blocking,
                found
                    .iter()
                    .map(|(p, r, _)| match r {
                        Some(r) => format!("{} is built for {r}, not {release}", p.display()),
                        None => format!("{} has no vermagic: not a kernel module", p.display()),
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                Some(format!("rebuild against this kernel's tree: {build}")),
            ),
        }
    });

    out.push(ck(
        "module",
        Verdict::Blocking,
        "the gdirect module is not loaded (/dev/gdirect missing); meanwhile the library's compat engine reads through host memory".into(),
        Some(if disabled {
            "none on this boot: module loading is disabled (see module_loading)".into()
        } else if no_rust {
            "none for this kernel: it has no Rust support (see rust)".into()
        } else {
            match &built {
                // Installed (make install, DKMS): depmod indexed it, modprobe applies the
                // options of /etc/modprobe.d.
                Some(p) if p.starts_with("/lib/modules") => {
                    format!("sudo modprobe gdirect (installed: {})", p.display())
                }
                Some(p) => format!("sudo insmod {}", p.display()),
                None => format!("build and install gdirect.ko for {release} ({build}), then sudo modprobe gdirect"),
            }
        }),
    ));
    out
}

/// The device node of a loaded module that this user could not open.
fn device_check(device: &Path) -> Check {
    let Ok(meta) = std::fs::metadata(device) else {
        return ck(
            "device",
            Verdict::Blocking,
            format!("the module is loaded but {} is missing", device.display()),
            Some("check that devtmpfs is mounted on /dev, or that udev made the node".into()),
        );
    };
    let mode = meta.permissions().mode() & 0o777;
    let (uid, groups) = caller();
    let group = group_name(meta.gid()).unwrap_or_else(|| meta.gid().to_string());
    let evidence = format!(
        "{} is mode {mode:04o}, owner uid {}, group {group}",
        device.display(),
        meta.uid()
    );
    if may_open(mode, meta.uid(), meta.gid(), uid, &groups) {
        return ck(
            "device",
            Verdict::Blocking,
            evidence + "; this user may open it, yet opening it failed",
            Some("run gdirect info to see the error".into()),
        );
    }
    ck(
        "device",
        Verdict::Blocking,
        evidence + &format!("; this user (uid {uid}) may not open it"),
        Some(if meta.gid() != 0 {
            format!(
                "add the user to group {group} (sudo usermod -aG {group} $USER, then log in again)"
            )
        } else {
            "give the node a group for its users: a udev rule KERNEL==\"gdirect\", GROUP=\"gdirect\", MODE=\"0660\"".into()
        }),
    )
}
