// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect`: the command-line face of the gdirect library.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use gdirect::{
    egpu::Egpu, DeviceMemory, Driver, Error, HostBuffer, Info, P2pMem, PciAddress, Provider,
    RegisterOptions,
};
use serde::Serialize;

/// GPU-direct storage: read file data straight into GPU memory.
#[derive(Parser)]
#[command(name = "gdirect", version, about, long_about = None)]
struct Cli {
    /// The gdirect device node.
    #[arg(long, global = true, env = "GDIRECT_DEVICE", default_value = gdirect::DEFAULT_DEVICE_PATH)]
    device: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the loaded module's version, ABI, the memory providers it can use now, its counters
    /// and limits.
    ///
    /// Exit status: 0 when the module answered, 1 when it is not loaded or cannot be used.
    Info {
        /// Print one JSON object instead of text (schema: see README).
        #[arg(long)]
        json: bool,
    },
    /// Register memory and show how PCI devices reach it: the map type and the address each
    /// device would use for every page.
    ///
    /// Exit status: 0 on success, 1 on any error.
    Query {
        /// The memory: `host` (a buffer of this process), `egpu` (the test rig's emulated GPU,
        /// through the nvidia provider) or `p2pmem:BDF` (P2P memory published by that PCI device).
        #[arg(long, default_value = "host")]
        mem: String,
        /// Bytes to allocate and register (suffixes K, M, G).
        #[arg(long, default_value = "1M", value_parser = parse_size)]
        size: u64,
        /// The peer devices to query, as PCI addresses (0000:03:00.0).
        #[arg(long = "peer", required = true)]
        peers: Vec<PciAddress>,
        /// nvidia memory: register with the persistent interface (never revoked).
        #[arg(long)]
        persistent: bool,
        /// Print every address, not the first few.
        #[arg(long)]
        all: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { json } => info(&cli.device, json),
        Command::Query {
            mem,
            size,
            peers,
            persistent,
            all,
            json,
        } => query(&cli.device, &mem, size, &peers, persistent, all, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if failure.json {
                print_json(&ErrorJson {
                    device: cli.device.display().to_string(),
                    error: ErrorDetail {
                        kind: error_kind(&failure.error),
                        message: failure.error.to_string(),
                        errno: failure.error.errno().map(|e| format!("{e:?}")),
                    },
                });
            }
            eprintln!("gdirect: {}", failure.error);
            ExitCode::FAILURE
        }
    }
}

/// An error, and whether to report it as JSON too.
struct Failure {
    error: Error,
    json: bool,
}

trait JsonContext<T> {
    fn json(self, json: bool) -> Result<T, Failure>;
}

impl<T> JsonContext<T> for gdirect::Result<T> {
    fn json(self, json: bool) -> Result<T, Failure> {
        self.map_err(|error| Failure { error, json })
    }
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 10),
        Some((i, 'M' | 'm')) => (&s[..i], 20),
        Some((i, 'G' | 'g')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (like 4096, 64K, 1M, 2G)"))?;
    n.checked_mul(1 << shift)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{s}' is not a positive size that fits in 64 bits"))
}

#[derive(Serialize)]
struct VersionJson {
    version: String,
    abi_version: u32,
}

#[derive(Serialize)]
struct CountersJson {
    file_registrations: u32,
    file_pinned_bytes: u64,
    registrations: u64,
    pinned_bytes: u64,
    revocations: u64,
}

#[derive(Serialize)]
struct LimitsJson {
    max_pinned_bytes: u64,
    max_registrations: u32,
}

#[derive(Serialize)]
struct InfoJson {
    device: String,
    module: VersionJson,
    library: VersionJson,
    /// Every provider the ABI defines, with whether the module can use it now.
    providers: serde_json::Map<String, serde_json::Value>,
    open_files: u32,
    counters: CountersJson,
    limits: LimitsJson,
}

#[derive(Serialize)]
struct ErrorJson {
    device: String,
    error: ErrorDetail,
}

#[derive(Serialize)]
struct ErrorDetail {
    kind: &'static str,
    message: String,
    errno: Option<String>,
}

fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::ModuleNotLoaded { .. } => "module_not_loaded",
        Error::PermissionDenied { .. } => "permission_denied",
        Error::NotGdirect { .. } => "not_gdirect",
        Error::VersionMismatch { .. } => "version_mismatch",
        Error::Open { .. } => "open",
        Error::DeviceMissing { .. } => "device_missing",
        Error::Allocation { .. } => "allocation",
        Error::Misaligned { .. } => "misaligned",
        Error::NotProviderMemory { .. } => "not_provider_memory",
        Error::PinLimit { .. } => "pin_limit",
        Error::TooManyRegistrations => "too_many_registrations",
        Error::ProviderUnavailable { .. } => "provider_unavailable",
        Error::Revoked { .. } => "revoked",
        Error::NoSuchPeer { .. } => "no_such_peer",
        Error::Ioctl { .. } => "ioctl",
        _ => "other",
    }
}

fn print_json(value: &impl Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("gdirect: cannot encode JSON: {e}"),
    }
}

fn info(device: &PathBuf, json: bool) -> Result<(), Failure> {
    let info = Driver::open_path(device)
        .and_then(|driver| driver.info())
        .json(json)?;
    if json {
        let providers = Provider::ALL
            .into_iter()
            .map(|p| {
                (
                    p.name().to_string(),
                    serde_json::Value::Bool(info.has_provider(p)),
                )
            })
            .collect();
        print_json(&InfoJson {
            device: device.display().to_string(),
            module: VersionJson {
                version: info.version.to_string(),
                abi_version: info.abi_version,
            },
            library: VersionJson {
                version: env!("CARGO_PKG_VERSION").to_string(),
                abi_version: gdirect::ABI_VERSION,
            },
            providers,
            open_files: info.open_files,
            counters: CountersJson {
                file_registrations: info.file_registrations,
                file_pinned_bytes: info.file_pinned_bytes,
                registrations: info.registrations,
                pinned_bytes: info.pinned_bytes,
                revocations: info.revocations,
            },
            limits: LimitsJson {
                max_pinned_bytes: info.max_pinned_bytes,
                max_registrations: info.max_registrations,
            },
        });
    } else {
        print_info(device, &info);
    }
    Ok(())
}

fn print_info(device: &std::path::Path, info: &Info) {
    println!(
        "module     gdirect {} (ABI {}) at {}",
        info.version,
        info.abi_version,
        device.display()
    );
    println!(
        "library    gdirect {} (ABI {})",
        env!("CARGO_PKG_VERSION"),
        gdirect::ABI_VERSION
    );
    let available: Vec<&str> = info.providers().map(Provider::name).collect();
    let missing: Vec<&str> = Provider::ALL
        .into_iter()
        .filter(|p| !info.has_provider(*p))
        .map(Provider::name)
        .collect();
    if available.is_empty() {
        println!(
            "providers  none available (not available: {})",
            missing.join(", ")
        );
    } else if missing.is_empty() {
        println!("providers  {}", available.join(", "));
    } else {
        println!(
            "providers  {} (not available: {})",
            available.join(", "),
            missing.join(", ")
        );
    }
    println!("open files {}", info.open_files);
    println!(
        "pinned     {} registrations, {} bytes (limit {} bytes); {} revoked since load",
        info.registrations, info.pinned_bytes, info.max_pinned_bytes, info.revocations
    );
    println!(
        "per file   at most {} registrations",
        info.max_registrations
    );
}

#[derive(Serialize)]
struct PeerJson {
    peer: String,
    map_type: &'static str,
    addrs: Vec<u64>,
}

#[derive(Serialize)]
struct QueryJson {
    provider: &'static str,
    address: u64,
    len: u64,
    page_size: u64,
    page_count: u64,
    owner: Option<String>,
    peers: Vec<PeerJson>,
}

/// The memory `gdirect query` registers, kept alive while it runs.
enum QueryMem {
    Host(HostBuffer),
    Egpu(gdirect::egpu::EgpuAllocation),
    P2p(P2pMem),
}

impl QueryMem {
    fn allocate(spec: &str, size: u64) -> gdirect::Result<Self> {
        let len = usize::try_from(size).map_err(|_| Error::Allocation {
            what: format!("{size} bytes"),
            errno: gdirect::Errno::EOVERFLOW,
        })?;
        match spec.split_once(':') {
            None if spec == "host" => Ok(Self::Host(HostBuffer::new(len)?)),
            None if spec == "egpu" => Ok(Self::Egpu(
                Egpu::open()?
                    .alloc(size.div_ceil(gdirect::egpu::PAGE_SIZE) * gdirect::egpu::PAGE_SIZE)?,
            )),
            Some(("p2pmem", bdf)) => {
                let dev: PciAddress = bdf.parse().map_err(|_| Error::Allocation {
                    what: format!("P2P memory of '{bdf}'"),
                    errno: gdirect::Errno::EINVAL,
                })?;
                Ok(Self::P2p(P2pMem::allocate(dev, len)?))
            }
            _ => Err(Error::Allocation {
                what: format!("memory of kind '{spec}' (use host, egpu or p2pmem:BDF)"),
                errno: gdirect::Errno::EINVAL,
            }),
        }
    }

    fn memory(&self) -> &dyn DeviceMemory {
        match self {
            Self::Host(m) => m,
            Self::Egpu(m) => m,
            Self::P2p(m) => m,
        }
    }
}

fn query(
    device: &PathBuf,
    spec: &str,
    size: u64,
    peers: &[PciAddress],
    persistent: bool,
    all: bool,
    json: bool,
) -> Result<(), Failure> {
    let driver = Driver::open_path(device).json(json)?;
    let mem = QueryMem::allocate(spec, size).json(json)?;
    let mem = mem.memory();
    let reg = driver
        .register_with(mem, RegisterOptions::new().persistent(persistent))
        .json(json)?;
    let mut results = Vec::new();
    let mut owner = None;
    for peer in peers {
        let map = reg.query(*peer).json(json)?;
        owner = map.owner;
        results.push((*peer, map));
    }
    if json {
        print_json(&QueryJson {
            provider: reg.provider().name(),
            address: reg.addr(),
            len: reg.len(),
            page_size: reg.page_size(),
            page_count: reg.page_count(),
            owner: owner.map(|o| o.to_string()),
            peers: results
                .into_iter()
                .map(|(peer, map)| PeerJson {
                    peer: peer.to_string(),
                    map_type: map.map_type.name(),
                    addrs: map.addrs,
                })
                .collect(),
        });
        return Ok(());
    }
    println!(
        "registered {} bytes of {} memory at {:#x}: {} pages of {} bytes{}",
        reg.len(),
        reg.provider(),
        reg.addr(),
        reg.page_count(),
        reg.page_size(),
        owner.map(|o| format!(", owned by {o}")).unwrap_or_default()
    );
    for (peer, map) in results {
        let shown = if all {
            map.addrs.len()
        } else {
            map.addrs.len().min(4)
        };
        let list: Vec<String> = map.addrs[..shown]
            .iter()
            .map(|a| format!("{a:#x}"))
            .collect();
        let more = if shown < map.addrs.len() {
            format!(" ... ({} in all; --all shows every one)", map.addrs.len())
        } else {
            String::new()
        };
        println!(
            "peer {peer}: {}{}{}",
            map.map_type,
            if list.is_empty() {
                String::new()
            } else {
                format!(": {}", list.join(" "))
            },
            more
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
