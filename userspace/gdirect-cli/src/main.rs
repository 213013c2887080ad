// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect`: the command-line face of the gdirect library.

#![forbid(unsafe_code)]

use std::{io::IsTerminal, path::PathBuf, process::ExitCode, time::Instant};

use clap::{Parser, Subcommand};
use gdirect::{
    DeviceMemory, Driver, Errno, Error, File, HostBuffer, Info, IoOptions, IoPath, P2pMem,
    PciAddress, PeerMap, Provider, Reason, RegisterOptions, Transfer, Transport,
};
use gdirect_internals::egpu::Egpu;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

mod check;
mod gpu;

/// GPU-direct storage: read file data straight into GPU memory.
#[derive(Parser)]
#[command(
    name = "gdirect",
    version,
    about,
    long_about = None,
    after_help = "New here? `gdirect check` says whether this node is set up for GPU-direct \
                  storage (the module, the kernel, the PCIe topology) and what to change."
)]
struct Cli {
    /// The gdirect device node.
    #[arg(long, global = true, env = "GDIRECT_DEVICE", default_value = gdirect::DEFAULT_DEVICE_PATH)]
    device: PathBuf,

    /// Print one JSON object instead of text (schemas: see README).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

/// The memory of a command that does not read into a CUDA device (`--mem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemKind {
    /// A buffer of this process.
    Host,
    /// The test rig's emulated GPU (tests/egpu), through the nvidia provider.
    Egpu,
    /// P2P memory published by a PCI device: the first that has some, or this one.
    P2pmem(Option<PciAddress>),
}

/// Parses `--mem`: `host`, `egpu`, `p2pmem` or `p2pmem:BDF`.
fn parse_mem(s: &str) -> Result<MemKind, String> {
    match s.split_once(':') {
        None if s == "host" => Ok(MemKind::Host),
        None if s == "egpu" => Ok(MemKind::Egpu),
        None if s == "p2pmem" => Ok(MemKind::P2pmem(None)),
        Some(("p2pmem", bdf)) => bdf
            .parse()
            .map(|a| MemKind::P2pmem(Some(a)))
            .map_err(|_| format!("'{bdf}' is not a PCI address (like 0000:03:00.0)")),
        _ if s == "gpu" || s.starts_with("cuda") => Err(
            "a CUDA device's memory is chosen with --gpu N (read's default where a GPU is \
             present); `egpu` is the test rig's emulated GPU"
                .into(),
        ),
        _ => Err(format!(
            "'{s}' is not a memory: host, egpu, p2pmem or p2pmem:BDF"
        )),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Show the loaded module's version, ABI, the memory providers it can use now, its counters
    /// and limits.
    ///
    /// Exit status: 0 when the module answered, 1 when it is not loaded or cannot be used.
    Info,
    /// Register memory and show how PCI devices reach it: the map type and the address each
    /// device would use for every page.
    ///
    /// The addresses need CAP_SYS_ADMIN; without it the map types are shown and the addresses
    /// are not (JSON: "addresses_hidden": true). A peer that no driver of the kernel drives (no
    /// driver bound, or vfio) is refused.
    ///
    /// Exit status: 0 on success, 1 on any error.
    Query {
        /// The memory: `host` (a buffer of this process), `egpu` (the test rig's emulated GPU,
        /// through the nvidia provider) or `p2pmem` (P2P memory published by the first device
        /// that has some; `p2pmem:BDF` for that device).
        #[arg(long, default_value = "host", value_parser = parse_mem, value_name = "MEM")]
        mem: MemKind,
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
    },
    /// Read a file (a raw block device, or a file on a file system with direct I/O) into device
    /// memory, and show the path the bytes took and why.
    ///
    /// Where a CUDA GPU is present the memory is CUDA device 0's (--gpu N for another): the
    /// module moves the bytes where it is loaded with the nvidia provider, the library's compat
    /// engine everywhere else (parallel O_DIRECT reads into pinned buffers, or DMA from the page
    /// cache for cached data), and the report says which and why. A read larger than half the
    /// GPU's free memory goes through a window of that size, piece by piece. --mem reads into other memory
    /// instead (host, the test rig's emulated GPU, P2P memory) through the module only.
    ///
    /// Exit status: 0 on success, 3 when --verify found a byte that differs, 1 on any other
    /// error, 2 for a command line error.
    Read {
        /// The file, opened with O_DIRECT.
        file: PathBuf,
        /// Read into the memory of CUDA device N [default: 0, where a CUDA GPU is present].
        #[arg(long, value_name = "N", conflicts_with_all = ["mem", "chunk", "force_bounce", "poison"])]
        gpu: Option<usize>,
        /// Read into this memory, through the module, instead of a CUDA device's: `host` (a
        /// buffer of this process), `egpu` (the test rig's emulated GPU; with
        /// GDIRECT_EGPU_KEEP=1 in the environment its memory outlives the command, until
        /// `gdirect-reg egpu-free-kept VA` or the rig's module unload), or `p2pmem` (P2P memory
        /// of the first device that publishes some; `p2pmem:BDF` of that one). Needed where no
        /// CUDA GPU is present.
        #[arg(long, value_parser = parse_mem, value_name = "MEM")]
        mem: Option<MemKind>,
        /// Where in the file to start (a multiple of its logical block size; K, M, G suffixes).
        #[arg(long, default_value = "0", value_parser = parse_offset)]
        offset: u64,
        /// Bytes to read [default: to the end of the file; with --mem rounded up to 4 KiB].
        #[arg(long, value_parser = parse_size)]
        len: Option<u64>,
        /// With --mem: bytes per transfer (progress is shown between transfers) [default: 16M].
        #[arg(long, value_parser = parse_size)]
        chunk: Option<u64>,
        /// With --mem: take the bounce path whatever the hardware allows.
        #[arg(long)]
        force_bounce: bool,
        /// With --mem: fill the memory with a pattern made from SEED before reading, so that
        /// bytes the read did not deliver cannot pass for data [default: a seed from the clock,
        /// shown in the report; 0 leaves the memory as it was allocated].
        #[arg(long, value_name = "SEED")]
        poison: Option<u64>,
        /// With a CUDA device: the bytes of GPU memory to read through, reused for each piece
        /// of the file [default: the whole read, or half the device's free memory when the read
        /// is larger].
        #[arg(long, value_parser = parse_size, conflicts_with = "mem")]
        window: Option<u64>,
        /// Compare the bytes in device memory with this file (default: FILE), at the same
        /// offset.
        #[arg(long, value_name = "REFERENCE", num_args = 0..=1)]
        verify: Option<Option<PathBuf>>,
        /// With a CUDA device: the compat engine's settings.
        #[command(flatten)]
        engine: gpu::EngineArgs,
    },
    /// Measure reads of a file into CUDA device memory: GB/s, IOPS and per-I/O latency
    /// (p50/p99). Every read is verified against the file before its time counts.
    ///
    /// By default each read is the whole file (or --len), warm (one unmeasured read first);
    /// --cold drops the file's pages before each read; --first measures one read that includes
    /// making the engine, as a fresh process's first read does. With --io-size, I/Os of that
    /// size, sequential or random (--pattern), from --jobs threads at once, for --repeat passes'
    /// worth of bytes or --duration seconds, as gdsio measures.
    ///
    /// Exit status: 0 when every read was verified, 3 when a read's bytes were wrong, 1 on any
    /// other error.
    Bench(gpu::BenchArgs),
    /// Fill device memory from a source file, then write it to a file with direct I/O, and show
    /// the path the bytes took and why.
    ///
    /// Exit status: 0 on success, 1 otherwise.
    Write {
        /// The file to write, opened with O_DIRECT for reading and writing.
        file: PathBuf,
        /// Where the bytes come from (copied into device memory by the CPU first).
        #[arg(long)]
        from: PathBuf,
        /// The memory the bytes are written from, through the module: `host` (a buffer of this
        /// process), `egpu` (the test rig's emulated GPU), or `p2pmem` (P2P memory of the first
        /// device that publishes some; `p2pmem:BDF` of that one).
        #[arg(long, required = true, value_parser = parse_mem, value_name = "MEM")]
        mem: MemKind,
        /// Where in the file to write (a multiple of its logical block size).
        #[arg(long, default_value = "0", value_parser = parse_offset)]
        offset: u64,
        /// Bytes to write (default: the size of the source, and never more than it; a multiple of
        /// the block size).
        #[arg(long, value_parser = parse_size)]
        len: Option<u64>,
        /// Take the bounce path whatever the hardware allows.
        #[arg(long)]
        force_bounce: bool,
    },
    /// Check whether this node is set up for GPU-direct storage, and say what to change.
    ///
    /// `all` (the default): a matrix of every GPU or P2P-memory PCI function against every NVMe
    /// controller and RDMA device, with their PCI relation from sysfs (PIX one switch, PXB
    /// several, PHB the host bridge, NODE across host bridges, SYS across NUMA nodes) and,
    /// where the module is loaded, the kernel's P2PDMA verdict; then the checks — module and
    /// providers, IOMMU, ACS redirect, BAR sizes, NUMA, P2PDMA, fabrics queues — each with a
    /// verdict, the evidence and the fix. `nvmeof` lists only the fabrics controllers and the
    /// NVMe native multipath heads with their paths.
    ///
    /// Exit status (all): 0 when the direct path can work for at least one pair, 1 when not,
    /// 2 when sysfs cannot be read. (nvmeof): 0 when the check ran.
    Check {
        /// The section to check.
        #[arg(value_enum, default_value_t = Section::All)]
        section: Section,
        /// Read sysfs from this directory instead of /sys (for captured trees).
        #[arg(long, default_value = "/sys", hide = true)]
        sysfs: PathBuf,
    },
    /// Show the module's I/O counters: transfers, bytes, errors and latency per path and
    /// direction, and why transfers bounced.
    Stats,
}

/// The sections of `gdirect check`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    /// Every memory against every storage device, then the checks.
    All,
    /// The fabrics controllers and multipath heads.
    Nvmeof,
}

/// The exit status of a read whose bytes differ from the reference (--verify, bench).
const EXIT_MISMATCH: u8 = 3;

fn main() -> ExitCode {
    gdirect_internals::pipe::end_on_closed_pipe();
    let cli = Cli::parse();
    let json = cli.json;
    let result = match cli.command {
        Command::Info => info(&cli.device, json),
        Command::Query {
            mem,
            size,
            peers,
            persistent,
            all,
        } => query(&cli.device, mem, size, &peers, persistent, all, json),
        Command::Read {
            file,
            gpu,
            mem,
            offset,
            len,
            chunk,
            force_bounce,
            poison,
            window,
            verify,
            engine,
        } => {
            let verify = verify.map(|v| v.unwrap_or_else(|| file.clone()));
            match (gpu, mem) {
                (_, Some(mem)) => {
                    if engine.is_set() {
                        usage_error(
                            "--threads, --block-size, --staging-size, --page-cache, \
                             --keep-mapped, --direct-threshold and --compat set the compat \
                             engine, which reads into CUDA memory only (--gpu), not --mem",
                        );
                    }
                    read(
                        &cli.device,
                        &ReadJob {
                            file,
                            mem,
                            offset,
                            len,
                            chunk: chunk.unwrap_or(DEFAULT_CHUNK),
                            force_bounce,
                            poison: poison.unwrap_or_else(clock_seed),
                            verify,
                            json,
                        },
                    )
                }
                (gpu, None) => {
                    if chunk.is_some() || force_bounce || poison.is_some() {
                        usage_error(
                            "--chunk, --force-bounce and --poison apply to --mem reads; \
                             without --mem a read goes into a CUDA device's memory",
                        );
                    }
                    match gpu.map_or_else(gpu::default_device, Ok) {
                        Ok(gpu) => gpu::read(&gpu::GpuReadJob {
                            device: cli.device.clone(),
                            file,
                            gpu,
                            offset,
                            len,
                            window,
                            verify,
                            engine,
                            json,
                        }),
                        Err(error) => Err(Failure::new(error, json)),
                    }
                }
            }
        }
        Command::Bench(args) => gpu::bench(&args, &cli.device, json),
        Command::Write {
            file,
            from,
            mem,
            offset,
            len,
            force_bounce,
        } => write(
            &cli.device,
            &file,
            &from,
            mem,
            offset,
            len,
            force_bounce,
            json,
        ),
        Command::Stats => stats(&cli.device, json),
        Command::Check { section, sysfs } => {
            if section == Section::Nvmeof {
                check_nvmeof(&sysfs, json);
                return ExitCode::SUCCESS;
            }
            return check::run(&cli.device, &sysfs, json);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if failure.json {
                print_json(&ErrorJson {
                    device: cli.device.display().to_string(),
                    error: &failure.error,
                });
            }
            eprintln!("gdirect: {}", failure.error);
            ExitCode::from(failure.exit)
        }
    }
}

/// Bytes per transfer of a `--mem` read.
const DEFAULT_CHUNK: u64 = 16 << 20;

/// Ends the program with a command line error (exit status 2), as clap reports its own.
fn usage_error(message: &str) -> ! {
    use clap::CommandFactory;
    Cli::command()
        .error(clap::error::ErrorKind::ArgumentConflict, message)
        .exit()
}

/// An error, whether to report it as JSON too, and the exit status.
struct Failure {
    error: Error,
    json: bool,
    exit: u8,
}

impl Failure {
    /// An error that ends the command with status 1.
    fn new(error: Error, json: bool) -> Self {
        Self {
            error,
            json,
            exit: 1,
        }
    }

    /// Bytes that differ from the reference: status [`EXIT_MISMATCH`]; the report that says
    /// so was printed already.
    fn mismatch(error: Error) -> Self {
        Self {
            error,
            json: false,
            exit: EXIT_MISMATCH,
        }
    }
}

trait JsonContext<T> {
    fn json(self, json: bool) -> Result<T, Failure>;
}

impl<T> JsonContext<T> for gdirect::Result<T> {
    fn json(self, json: bool) -> Result<T, Failure> {
        self.map_err(|error| Failure::new(error, json))
    }
}

/// Parses an offset: a byte count that may be zero.
fn parse_offset(s: &str) -> Result<u64, String> {
    if s == "0" {
        return Ok(0);
    }
    parse_size(s)
}

/// Parses a byte count with an optional K, M or G suffix (powers of 1024): the library's
/// parser, which the compat engine's settings use too, and a count that must not be zero.
fn parse_size(s: &str) -> Result<u64, String> {
    gdirect::compat::parse_size(s)
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            format!("'{s}' is not a positive size that fits in 64 bits (like 4096, 64K, 1M, 2G)")
        })
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
    user_pinned_bytes: u64,
}

#[derive(Serialize)]
struct LimitsJson {
    max_pinned_bytes: u64,
    max_pinned_bytes_per_user: u64,
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

/// A failure: the library's error (its kind, message and errno) and the device asked.
#[derive(Serialize)]
struct ErrorJson<'a> {
    device: String,
    error: &'a Error,
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
                user_pinned_bytes: info.user_pinned_bytes,
            },
            limits: LimitsJson {
                max_pinned_bytes: info.max_pinned_bytes,
                max_pinned_bytes_per_user: info.max_pinned_bytes_per_user,
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
    if info.max_pinned_bytes_per_user == 0 {
        println!(
            "this user  {} bytes pinned (no limit of its own)",
            info.user_pinned_bytes
        );
    } else {
        println!(
            "this user  {} bytes pinned (limit {} bytes)",
            info.user_pinned_bytes, info.max_pinned_bytes_per_user
        );
    }
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
    /// The addresses need CAP_SYS_ADMIN: `addrs` are empty, the map types are real.
    addresses_hidden: bool,
    address: u64,
    len: u64,
    page_size: u64,
    page_count: u64,
    owner: Option<String>,
    peers: Vec<PeerJson>,
}

/// With this set to 1, `--mem egpu` memory outlives the command (an emulated GPU allocation
/// of no file), for the rig's host checks: freed with `gdirect-reg egpu-free-kept VA` or when the
/// emulated GPU's module is unloaded.
const EGPU_KEEP_ENV: &str = "GDIRECT_EGPU_KEEP";

/// An emulated GPU allocation's BAR pages as runs of adjacent pages, `OFFSET+LEN` (hex).
fn bar_runs(pages: &[u64]) -> Vec<String> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == p => *len += gdirect_internals::egpu::PAGE_SIZE,
            _ => runs.push((p, gdirect_internals::egpu::PAGE_SIZE)),
        }
    }
    runs.iter()
        .map(|(start, len)| format!("{start:#x}+{len:#x}"))
        .collect()
}

/// The memory a command registers, kept alive while it runs.
enum Mem {
    Host(HostBuffer),
    Egpu(gdirect_internals::egpu::EgpuAllocation),
    P2p(P2pMem),
}

impl Mem {
    fn allocate(kind: MemKind, size: u64) -> gdirect::Result<Self> {
        let len = usize::try_from(size).map_err(|_| Error::Allocation {
            what: format!("{size} bytes"),
            errno: gdirect::Errno::EOVERFLOW,
        })?;
        match kind {
            MemKind::Host => Ok(Self::Host(HostBuffer::new(len)?)),
            MemKind::P2pmem(None) => Ok(Self::P2p(P2pMem::allocate_any(len)?)),
            MemKind::P2pmem(Some(dev)) => Ok(Self::P2p(P2pMem::allocate(dev, len)?)),
            MemKind::Egpu => {
                let len = size.div_ceil(gdirect_internals::egpu::PAGE_SIZE)
                    * gdirect_internals::egpu::PAGE_SIZE;
                let gpu = Egpu::open()?;
                // The rig's host checks compare the memory after the command has ended.
                if std::env::var_os(EGPU_KEEP_ENV).is_some_and(|v| v == "1") {
                    Ok(Self::Egpu(gpu.alloc_kept(len)?))
                } else {
                    Ok(Self::Egpu(gpu.alloc(len)?))
                }
            }
        }
    }

    /// Copies the memory's bytes at `offset` into `out`.
    fn read_back(&self, offset: u64, out: &mut [u8]) -> gdirect::Result<()> {
        let at = offset as usize;
        match self {
            Self::Host(m) => m.read(at, out),
            Self::Egpu(m) => m.read(offset, out)?,
            Self::P2p(m) => m.read(at, out),
        }
        Ok(())
    }

    /// Copies `data` into the memory at `offset`.
    fn fill(&mut self, offset: u64, data: &[u8]) -> gdirect::Result<()> {
        let at = offset as usize;
        match self {
            Self::Host(m) => m.write(at, data),
            Self::Egpu(m) => m.write(offset, data)?,
            Self::P2p(m) => m.write(at, data),
        }
        Ok(())
    }

    /// Fills the first `len` bytes with the xorshift64 stream of `seed`, 1 MiB at a time.
    fn poison(&mut self, seed: u64, len: u64) -> gdirect::Result<()> {
        let mut state = seed | 1;
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            for word in buf[..n].chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
            }
            self.fill(at, &buf[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    /// What the memory is, for reports.
    fn describe(&self) -> MemJson {
        match self {
            Self::Host(m) => MemJson {
                kind: "host",
                address: m.device_address(),
                bar_runs: None,
                device: None,
                poison_seed: None,
            },
            Self::Egpu(m) => MemJson {
                kind: "egpu",
                address: m.va(),
                bar_runs: m.bar_pages().ok().map(|p| bar_runs(&p)),
                device: gdirect_internals::egpu::sysfs_device()
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
                poison_seed: None,
            },
            Self::P2p(m) => MemJson {
                kind: "p2pmem",
                address: m.device_address(),
                bar_runs: None,
                device: Some(m.device().to_string()),
                poison_seed: None,
            },
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
    spec: MemKind,
    size: u64,
    peers: &[PciAddress],
    persistent: bool,
    all: bool,
    json: bool,
) -> Result<(), Failure> {
    let driver = Driver::open_path(device).json(json)?;
    let mem = Mem::allocate(spec, size).json(json)?;
    let mem = mem.memory();
    let reg = driver
        .register_with(mem, RegisterOptions::new().persistent(persistent))
        .json(json)?;
    let mut results = Vec::new();
    let mut owner = None;
    // Without CAP_SYS_ADMIN the module tells the map type but not the addresses.
    let mut hidden = false;
    for peer in peers {
        let map = match reg.query(*peer) {
            Err(Error::AddressesNeedAdmin { .. }) => {
                hidden = true;
                let (map_type, owner) = reg.map_type(*peer).json(json)?;
                PeerMap {
                    map_type,
                    page_size: reg.page_size(),
                    addrs: Vec::new(),
                    owner,
                }
            }
            other => other.json(json)?,
        };
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
            addresses_hidden: hidden,
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
    if hidden {
        println!("addresses not shown: they need CAP_SYS_ADMIN (the map types do not)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_size, quantile_us, Cli, Command, MemKind, Section};
    use clap::{error::ErrorKind, CommandFactory, Parser};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("gdirect").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn memory_kinds_parse_and_gpu_is_not_one() {
        let mem = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Read { mem, gpu, .. }) => Ok((mem, gpu)),
            Ok(_) => panic!("not a read"),
            Err(e) => Err(e),
        };
        assert_eq!(mem(&["read", "f"]).ok(), Some((None, None)));
        assert_eq!(
            mem(&["read", "f", "--gpu", "1"]).ok(),
            Some((None, Some(1)))
        );
        assert_eq!(
            mem(&["read", "f", "--mem", "egpu"]).ok(),
            Some((Some(MemKind::Egpu), None))
        );
        assert_eq!(
            mem(&["read", "f", "--mem", "host"]).ok(),
            Some((Some(MemKind::Host), None))
        );
        assert_eq!(
            mem(&["read", "f", "--mem", "p2pmem"]).ok(),
            Some((Some(MemKind::P2pmem(None)), None))
        );
        let bdf = "0000:03:00.0".parse().ok();
        assert!(bdf.is_some());
        assert_eq!(
            mem(&["read", "f", "--mem", "p2pmem:0000:03:00.0"]).ok(),
            Some((Some(MemKind::P2pmem(bdf)), None))
        );
        for bad in ["gpu", "cuda:0", "p2pmem:nope", "vram"] {
            let e = mem(&["read", "f", "--mem", bad]).err();
            assert_eq!(
                e.map(|e| e.kind()),
                Some(ErrorKind::ValueValidation),
                "{bad}"
            );
        }
        let e = mem(&["read", "f", "--mem", "gpu"])
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("--gpu N") && e.contains("egpu")));
    }

    #[test]
    fn flags_of_the_other_memory_are_refused() {
        for args in [
            &["read", "f", "--gpu", "0", "--mem", "host"][..],
            &["read", "f", "--gpu", "0", "--chunk", "1M"],
            &["read", "f", "--gpu", "0", "--force-bounce"],
            &["read", "f", "--gpu", "0", "--poison", "7"],
            &["read", "f", "--mem", "egpu", "--window", "1M"],
        ] {
            let kind = parse(args).err().map(|e| e.kind());
            assert_eq!(kind, Some(ErrorKind::ArgumentConflict), "{args:?}");
        }
    }

    #[test]
    fn json_is_global_and_values_are_enums() {
        for args in [&["--json", "stats"][..], &["stats", "--json"]] {
            assert!(parse(args).is_ok_and(|c| c.json), "{args:?}");
        }
        assert!(parse(&["info"]).is_ok_and(|c| !c.json));
        assert!(matches!(
            parse(&["check", "nvmeof"]).map(|c| c.command),
            Ok(Command::Check {
                section: Section::Nvmeof,
                ..
            })
        ));
        assert!(parse(&["check", "bogus"]).is_err());
        assert!(parse(&["bench", "f", "--method", "bogus"]).is_err());
        assert!(parse(&["bench", "f", "--page-cache", "bogus"]).is_err());
        assert!(parse(&["bench", "f", "--page-cache", "mapped"]).is_ok());
        assert!(parse(&[
            "bench",
            "f",
            "--io-size",
            "4K",
            "--pattern",
            "rand",
            "--jobs",
            "4"
        ])
        .is_ok());
        assert!(parse(&["bench", "f", "--io-size", "4K", "--duration", "2.5"]).is_ok());
        for args in [
            &["bench", "f", "--pattern", "rand"][..],
            &["bench", "f", "--duration", "3"],
            &["bench", "f", "--io-size", "4K", "--first"],
            &[
                "bench",
                "f",
                "--io-size",
                "4K",
                "--duration",
                "3",
                "--repeat",
                "2",
            ],
            &["bench", "f", "--io-size", "4K", "--pattern", "backwards"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn engine_help_shows_the_library_defaults() {
        let d = gdirect::compat::Settings::default();
        let cmd = Cli::command();
        let read = cmd.find_subcommand("read");
        let help = |id: &str| {
            read.and_then(|r| r.get_arguments().find(|a| a.get_id() == id))
                .and_then(|a| a.get_help())
                .map(ToString::to_string)
                .unwrap_or_default()
        };
        let mib = |n: u64| format!("default: {}M]", n >> 20);
        assert!(
            help("block_size").contains(&mib(d.task_size)),
            "{}",
            help("block_size")
        );
        assert!(help("staging_size").contains(&mib(d.staging_size)));
        assert!(help("keep_mapped").contains(&format!("default: {}]", d.keep_mapped)));
        assert!(help("direct_threshold").contains(&format!("default: {}]", d.direct_threshold)));
        assert!(help("page_cache").contains(&format!("default: {}]", d.page_cache.name())));
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        assert_eq!(d.threads, threads.clamp(1, 16), "threads: CPUs, at most 16");
        assert!(help("threads").contains("default: CPUs, at most 16]"));
    }

    #[test]
    fn write_names_its_memory() {
        let kind = parse(&["write", "f", "--from", "g"])
            .err()
            .map(|e| e.kind());
        assert_eq!(kind, Some(ErrorKind::MissingRequiredArgument));
        assert!(parse(&["write", "f", "--from", "g", "--mem", "egpu"]).is_ok());
    }

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

    #[test]
    fn quantiles_come_from_bucket_bounds() {
        let mut hist = [0u64; 20];
        assert_eq!(quantile_us(&hist, 0.5), None);
        hist[3] = 90; // 8..16 us
        hist[10] = 10; // 1024..2048 us
        assert_eq!(quantile_us(&hist, 0.5), Some(16));
        assert_eq!(quantile_us(&hist, 0.99), Some(2048));
    }
}

#[derive(Serialize)]
struct MemJson {
    kind: &'static str,
    address: u64,
    /// Where an emulated GPU allocation's scattered pages are in its BAR: `OFFSET+LEN` runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    bar_runs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    /// The seed of the pattern the memory was filled with before a read.
    #[serde(skip_serializing_if = "Option::is_none")]
    poison_seed: Option<u64>,
}

#[derive(Serialize)]
struct IoJson {
    op: &'static str,
    file: String,
    offset: u64,
    len: u64,
    bytes: u64,
    eof: bool,
    path: &'static str,
    reason: &'static str,
    transport: &'static str,
    /// [`Reason::explain`]; absent when the transfers took different paths.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
    bounce_bytes: u64,
    transfers: u64,
    seconds: f64,
    mb_per_s: f64,
    memory: MemJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
}

/// The path and reason of a run of transfers: the common one, or "mixed".
struct Summary {
    bytes: u64,
    bounce_bytes: u64,
    eof: bool,
    path: Option<(IoPath, Reason)>,
    mixed: bool,
    transfers: u64,
    transport: Option<Transport>,
}

impl Summary {
    fn new() -> Self {
        Self {
            bytes: 0,
            bounce_bytes: 0,
            eof: false,
            path: None,
            mixed: false,
            transfers: 0,
            transport: None,
        }
    }

    fn add(&mut self, t: &Transfer) {
        self.bytes += t.bytes;
        self.bounce_bytes += t.bounce_bytes;
        self.eof |= t.eof;
        self.transfers += 1;
        self.transport = Some(t.transport);
        match self.path {
            None => self.path = Some((t.path, t.reason)),
            Some(p) if p != (t.path, t.reason) => self.mixed = true,
            Some(_) => {}
        }
    }

    /// The common reason, explained; `None` when the transfers took different paths.
    fn why(&self) -> Option<String> {
        match (self.mixed, self.path) {
            (false, Some((_, r))) => Some(r.explain(self.transport.unwrap_or(Transport::Unknown))),
            _ => None,
        }
    }

    fn names(&self) -> (&'static str, &'static str) {
        match (self.mixed, self.path) {
            (true, _) => ("mixed", "mixed"),
            (false, Some((p, r))) => (p.name(), r.name()),
            (false, None) => ("none", "none"),
        }
    }
}

/// A progress bar on stderr for transfers of more than one chunk, when it is a terminal.
fn progress(total: u64, chunk: u64, json: bool) -> Option<ProgressBar> {
    if json || total <= chunk || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
    {
        bar.set_style(style);
    }
    Some(bar)
}

/// The size of a file or block device.
fn file_size(path: &std::path::Path) -> gdirect::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let err = |e: std::io::Error| Error::OpenFile {
        path: path.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix_eio())),
    };
    let mut f = std::fs::File::open(path).map_err(err)?;
    f.seek(SeekFrom::End(0)).map_err(err)
}

fn nix_eio() -> i32 {
    5
}

struct ReadJob {
    file: PathBuf,
    mem: MemKind,
    offset: u64,
    len: Option<u64>,
    chunk: u64,
    force_bounce: bool,
    /// The seed of the pattern the memory is filled with before the read (0: none).
    poison: u64,
    verify: Option<PathBuf>,
    json: bool,
}

/// A poison seed that differs from run to run.
fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

fn read(device: &PathBuf, job: &ReadJob) -> Result<(), Failure> {
    let json = job.json;
    let driver = Driver::open_path(device).json(json)?;
    let file = File::open_direct(&job.file).json(json)?;
    let len = match job.len {
        Some(l) => l,
        None => file_size(&job.file).json(json)?.saturating_sub(job.offset),
    }
    .div_ceil(4096)
        * 4096;
    if len == 0 {
        return Err(Failure::new(
            Error::OutOfRegistration {
                handle: 0,
                buf_offset: 0,
                len: 0,
            },
            json,
        ));
    }
    let mut mem = Mem::allocate(job.mem, len).json(json)?;
    if job.poison != 0 {
        mem.poison(job.poison, len).json(json)?;
    }
    let reg = driver.register(mem.memory()).json(json)?;
    let options = IoOptions::new().force_bounce(job.force_bounce);
    let chunk = job.chunk.div_ceil(4096) * 4096;
    let bar = progress(len, chunk, json);
    let mut sum = Summary::new();
    let start = Instant::now();
    let mut done = 0;
    while done < len {
        let n = chunk.min(len - done);
        let t = file
            .read_into_with(&reg, done, job.offset + done, n, options)
            .json(json)?;
        sum.add(&t);
        done += n;
        if let Some(b) = &bar {
            b.set_position(done);
        }
        if t.eof {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let verified = match &job.verify {
        Some(reference) => Some(verify(&mem, reference, job.offset, sum.bytes).json(json)?),
        None => None,
    };
    let mut described = mem.describe();
    described.poison_seed = (job.poison != 0).then_some(job.poison);
    report(
        "read", &job.file, job.offset, len, &sum, seconds, described, verified, json,
    );
    match verified {
        Some(false) => Err(Failure::mismatch(Error::Io {
            ioctl: "verify",
            path: job.file.clone(),
            errno: Errno::EIO,
            driver: device.clone(),
        })),
        _ => Ok(()),
    }
}

/// Compares `len` bytes of `mem` with `reference` at `offset`; prints the first difference.
fn verify(mem: &Mem, reference: &std::path::Path, offset: u64, len: u64) -> gdirect::Result<bool> {
    use std::os::unix::fs::FileExt;
    let err = |e: std::io::Error| Error::OpenFile {
        path: reference.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix_eio())),
    };
    // Positioned reads: a block device refuses a seek past its end, which is a mismatch here.
    let f = std::fs::File::open(reference).map_err(err)?;
    let mut want = vec![0u8; 1 << 20];
    let mut got = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(want.len() as u64) as usize;
        let mut filled = 0;
        while filled < n {
            match f
                .read_at(&mut want[filled..n], offset + at + filled as u64)
                .map_err(err)?
            {
                0 => break,
                k => filled += k,
            }
        }
        if filled == 0 {
            // The read delivered bytes the reference does not have.
            eprintln!(
                "gdirect: verify: {} ends at byte {}, before the {len} bytes read from offset {offset}",
                reference.display(),
                offset + at
            );
            return Ok(false);
        }
        mem.read_back(at, &mut got[..filled])?;
        if let Some(i) = (0..filled).find(|&i| got[i] != want[i]) {
            eprintln!(
                "gdirect: verify: byte {} differs: {:#04x} in memory, {:#04x} in {}",
                offset + at + i as u64,
                got[i],
                want[i],
                reference.display()
            );
            return Ok(false);
        }
        at += filled as u64;
    }
    Ok(true)
}

#[allow(clippy::too_many_arguments, reason = "the facts of one report")]
fn report(
    op: &'static str,
    file: &std::path::Path,
    offset: u64,
    len: u64,
    sum: &Summary,
    seconds: f64,
    memory: MemJson,
    verified: Option<bool>,
    json: bool,
) {
    let (path, reason) = sum.names();
    let mb_per_s = if seconds > 0.0 {
        sum.bytes as f64 / seconds / 1e6
    } else {
        0.0
    };
    if json {
        print_json(&IoJson {
            op,
            file: file.display().to_string(),
            offset,
            len,
            bytes: sum.bytes,
            eof: sum.eof,
            path,
            reason,
            transport: sum.transport.map_or("unknown", Transport::name),
            why: sum.why(),
            bounce_bytes: sum.bounce_bytes,
            transfers: sum.transfers,
            seconds,
            mb_per_s,
            memory,
            verified,
        });
        return;
    }
    let dir = if op == "read" { "into" } else { "from" };
    let at = memory
        .device
        .as_deref()
        .map(|d| format!(" of {d}"))
        .unwrap_or_default();
    println!(
        "{op} {} bytes at offset {offset} of {} {dir} {} memory{at}",
        sum.bytes,
        file.display(),
        memory.kind
    );
    println!(
        "path       {path} (reason: {reason}, transport: {}); {} bytes through host memory",
        sum.transport.map_or("unknown", Transport::name),
        sum.bounce_bytes
    );
    if let (Some(why), false) = (sum.why(), reason == Reason::None.name()) {
        println!("why        {why}");
    }
    println!(
        "time       {seconds:.3} s, {mb_per_s:.1} MB/s, {} transfer(s)",
        sum.transfers
    );
    if sum.eof {
        println!(
            "end        the file ended {} bytes into the {len} asked for",
            sum.bytes
        );
    }
    match verified {
        Some(true) => println!("verify     every byte matches the reference"),
        Some(false) => println!("verify     MISMATCH (see above)"),
        None => {}
    }
}

#[allow(clippy::too_many_arguments, reason = "the options of one command")]
fn write(
    device: &PathBuf,
    target: &PathBuf,
    from: &PathBuf,
    spec: MemKind,
    offset: u64,
    len: Option<u64>,
    force_bounce: bool,
    json: bool,
) -> Result<(), Failure> {
    let driver = Driver::open_path(device).json(json)?;
    let len = match len {
        Some(l) => l,
        None => file_size(from).json(json)?,
    };
    let data = std::fs::read(from).map_err(|e| {
        Failure::new(
            Error::OpenFile {
                path: from.clone(),
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix_eio())),
            },
            json,
        )
    })?;
    let len = len.min(data.len() as u64);
    if len == 0 {
        return Err(Failure::new(
            Error::OutOfRegistration {
                handle: 0,
                buf_offset: 0,
                len: 0,
            },
            json,
        ));
    }
    let mut mem = Mem::allocate(spec, len.div_ceil(4096) * 4096).json(json)?;
    mem.fill(0, &data[..len as usize]).json(json)?;
    let file = File::open_direct_rw(target).json(json)?;
    let reg = driver.register(mem.memory()).json(json)?;
    let start = Instant::now();
    let t = file
        .write_from_with(
            &reg,
            0,
            offset,
            len,
            IoOptions::new().force_bounce(force_bounce),
        )
        .json(json)?;
    let seconds = start.elapsed().as_secs_f64();
    let mut sum = Summary::new();
    sum.add(&t);
    let described = mem.describe();
    drop(reg);
    report(
        "write", target, offset, len, &sum, seconds, described, None, json,
    );
    Ok(())
}

#[derive(Serialize)]
struct PathStatsJson {
    path: &'static str,
    direction: &'static str,
    ops: u64,
    bytes: u64,
    errors: u64,
    bounce_bytes: u64,
    latency_us_log2: Vec<u64>,
}

#[derive(Serialize)]
struct StatsJson {
    io: Vec<PathStatsJson>,
    reasons: serde_json::Map<String, serde_json::Value>,
}

/// The upper bound in microseconds of the bucket where the `q` quantile of `hist` falls.
fn quantile_us(hist: &[u64], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let target = (total as f64 * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= target {
            return Some(1u64 << (i + 1));
        }
    }
    None
}

fn stats(device: &PathBuf, json: bool) -> Result<(), Failure> {
    let driver = Driver::open_path(device).json(json)?;
    let s = driver.stats().json(json)?;
    if json {
        let mut io = Vec::new();
        for p in IoPath::ALL {
            for (d, dir) in ["read", "write"].iter().enumerate() {
                let c = s.get(p, d == 1);
                io.push(PathStatsJson {
                    path: p.name(),
                    direction: dir,
                    ops: c.ops,
                    bytes: c.bytes,
                    errors: c.errors,
                    bounce_bytes: c.bounce_bytes,
                    latency_us_log2: c.latency_us_log2.to_vec(),
                });
            }
        }
        let reasons = Reason::ALL
            .iter()
            .take(s.reasons_counted)
            .map(|r| {
                (
                    r.name().to_string(),
                    serde_json::Value::from(s.by_reason(*r)),
                )
            })
            .collect();
        print_json(&StatsJson { io, reasons });
        return Ok(());
    }
    println!(
        "{:<7} {:<6} {:>10} {:>14} {:>7} {:>14} {:>9} {:>9}",
        "path", "dir", "ops", "bytes", "errors", "via host", "p50 us<", "p99 us<"
    );
    for p in IoPath::ALL {
        for (d, dir) in ["read", "write"].iter().enumerate() {
            let c = s.get(p, d == 1);
            let q =
                |x| quantile_us(&c.latency_us_log2, x).map_or("-".to_string(), |v| v.to_string());
            println!(
                "{:<7} {:<6} {:>10} {:>14} {:>7} {:>14} {:>9} {:>9}",
                p.name(),
                dir,
                c.ops,
                c.bytes,
                c.errors,
                c.bounce_bytes,
                q(0.5),
                q(0.99)
            );
        }
    }
    let reasons: Vec<String> = Reason::ALL
        .iter()
        .take(s.reasons_counted)
        .map(|r| format!("{} {}", r.name(), s.by_reason(*r)))
        .collect();
    println!("reasons: {}", reasons.join(", "));
    Ok(())
}

#[derive(Serialize)]
struct ControllerJson {
    name: String,
    transport: String,
    address: String,
    subsysnqn: String,
    state: String,
    io_queues: u32,
    queue_size: u32,
    verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    advice: Option<String>,
}

#[derive(Serialize)]
struct HeadJson {
    name: String,
    subsysnqn: String,
    iopolicy: String,
    paths: Vec<HeadPathJson>,
    verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    advice: Option<String>,
}

#[derive(Serialize)]
struct HeadPathJson {
    name: String,
    controller: String,
    transport: String,
    ana_state: String,
}

/// `gdirect check nvmeof`.
fn check_nvmeof(sysfs: &std::path::Path, json: bool) {
    let controllers = gdirect_internals::nvmeof::fabric_controllers(sysfs);
    let native = gdirect_internals::nvmeof::native_multipath(sysfs);
    let heads = gdirect_internals::nvmeof::multipath_heads(sysfs);
    if json {
        let heads: Vec<HeadJson> = heads
            .iter()
            .map(|h| {
                let advice = h.advice();
                HeadJson {
                    name: h.name.clone(),
                    subsysnqn: h.subsysnqn.clone(),
                    iopolicy: h.iopolicy.clone(),
                    paths: h
                        .paths
                        .iter()
                        .map(|p| HeadPathJson {
                            name: p.name.clone(),
                            controller: p.controller.clone(),
                            transport: p.transport.clone(),
                            ana_state: p.ana_state.clone(),
                        })
                        .collect(),
                    verdict: if advice.is_some() { "warning" } else { "ok" },
                    advice,
                }
            })
            .collect();
        let list: Vec<ControllerJson> = controllers
            .iter()
            .map(|c| {
                let advice = c.queue_size_advice();
                ControllerJson {
                    name: c.name.clone(),
                    transport: c.transport.clone(),
                    address: c.address.clone(),
                    subsysnqn: c.subsysnqn.clone(),
                    state: c.state.clone(),
                    io_queues: c.io_queues,
                    queue_size: c.queue_size,
                    verdict: if advice.is_some() { "warning" } else { "ok" },
                    advice,
                }
            })
            .collect();
        print_json(&serde_json::json!({ "nvmeof": {
            "controllers": list,
            "multipath": { "native": native, "heads": heads },
        } }));
        return;
    }
    println!("NVMe over Fabrics controllers");
    if controllers.is_empty() {
        println!("  none connected");
    }
    for c in &controllers {
        let verdict = if c.queue_size_advice().is_some() {
            "WARNING"
        } else {
            "ok"
        };
        println!(
            "  {:<7} {:<4} {:<40} {} I/O queue(s) of {} entries, {}: {verdict}",
            c.name, c.transport, c.address, c.io_queues, c.queue_size, c.state
        );
        println!("          {}", c.subsysnqn);
        if let Some(advice) = c.queue_size_advice() {
            println!("          warning: {advice}");
        }
    }
    println!(
        "NVMe native multipath: {}",
        match native {
            Some(true) =>
                "on (nvme_core.multipath=Y): a namespace several controllers reach is \
                           one head device; GPU reads through it go peer to peer only when every \
                           path takes P2P pages",
            Some(false) => "off (nvme_core.multipath=N): each controller has its own namespace",
            None => "not available (no nvme_core, or built without CONFIG_NVME_MULTIPATH)",
        }
    );
    for h in &heads {
        let verdict = if h.advice().is_some() {
            "WARNING"
        } else {
            "ok"
        };
        println!(
            "  {:<7} {} path(s), I/O policy {}: {verdict}",
            h.name,
            h.paths.len(),
            h.iopolicy
        );
        println!("          {}", h.subsysnqn);
        for p in &h.paths {
            println!(
                "          {:<11} {:<7} {:<4} {}",
                p.name, p.controller, p.transport, p.ana_state
            );
        }
        if let Some(advice) = h.advice() {
            println!("          warning: {advice}");
        }
    }
}
