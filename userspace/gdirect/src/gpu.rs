// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Reading files into CUDA memory: through the module where it can, the compat engine
//! everywhere else, and the [`Transfer`] says which and why.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use cudarc::driver::CudaSlice;

use crate::{
    compat::{CompatEngine, CudaBackend, Report, Source},
    io::{CompatReason, Engine},
    DeviceMemory, Driver, Errno, Error, File, IoPath, Provider, Reason, RegisterOptions,
    Registration, Result, Transfer, Transport,
};

/// What [`GpuReader::read`] did: the transfer, and the compat engine's report when it ran.
#[derive(Clone, Debug)]
pub struct GpuRead {
    /// The transfer (its `engine` says which engine and why).
    pub transfer: Transfer,
    /// The compat engine's report (how much went direct, through the page cache, ...).
    pub compat: Option<Report>,
}

/// Reads files into GPU memory allocated with cudarc: through the module where it serves, the
/// compat engine everywhere else. Open a file once and register memory once, then read as
/// often as needed (this is the README's example, which a test keeps equal to it):
///
/// ```no_run
/// use gdirect::{compat::{CompatEngine, CudaBackend}, gpu::GpuReader};
/// let backend = CudaBackend::new(0)?;
/// let ctx = backend.context().clone();
/// let reader = GpuReader::from_env(CompatEngine::builder().build(backend)?)?;
/// let mut mem = ctx.default_stream().alloc_zeros::<u8>(64 << 20).expect("GPU memory");
/// let file = reader.open("weights.bin")?; // opened once
/// let mut buf = reader.register(&mut mem); // registered once
/// for offset in [0, 64 << 20] {
///     let r = reader.read_into(&file, &mut buf, 0, offset, 64 << 20)?;
///     let t = r.transfer;
///     println!("{} bytes by {} ({})", t.bytes, t.engine, t.engine.explain());
/// }
/// # Ok::<(), gdirect::Error>(())
/// ```
pub struct GpuReader {
    engine: CompatEngine<CudaBackend>,
    module: std::result::Result<Driver, CompatReason>,
    mode: CompatMode,
}

/// Whether reads may go through the compat engine (`GDIRECT_COMPAT_MODE`, as KvikIO's
/// `KVIKIO_COMPAT_MODE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompatMode {
    /// The module where it can serve, the compat engine otherwise (the transfer says why).
    #[default]
    Auto,
    /// Always the compat engine.
    On,
    /// Only the module: a read it cannot serve is an error ([`Error::CompatModeOff`]), never
    /// a silent fallback through host memory.
    Off,
}

impl CompatMode {
    /// The mode `GDIRECT_COMPAT_MODE` asks for (`auto`, `on` or `off`; `auto` when unset).
    pub fn from_env() -> Result<Self> {
        match std::env::var("GDIRECT_COMPAT_MODE") {
            Err(_) => Ok(Self::Auto),
            Ok(v) => Self::parse(&v).ok_or(Error::BadSetting {
                name: "GDIRECT_COMPAT_MODE",
                value: v,
                expected: "auto, on or off",
            }),
        }
    }

    /// `auto`, `on` or `off` (also `true`/`false`, `yes`/`no`, `1`/`0`), any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Self::Auto),
            "on" | "true" | "yes" | "1" => Some(Self::On),
            "off" | "false" | "no" | "0" => Some(Self::Off),
            _ => None,
        }
    }

    /// Whether a read the module cannot serve, for `why`, goes to the compat engine (`Ok`) or
    /// fails.
    fn allow(self, why: CompatReason) -> Result<CompatReason> {
        match self {
            Self::Off => Err(Error::CompatModeOff { reason: why }),
            Self::Auto | Self::On => Ok(why),
        }
    }
}

/// Why the module cannot serve, from the error opening or asking it.
fn compat_reason_of(e: &Error) -> CompatReason {
    match e {
        Error::ModuleNotLoaded { .. } => CompatReason::NoModule,
        Error::PermissionDenied { .. } => CompatReason::NoAccess,
        Error::VersionMismatch { .. } | Error::NotGdirect { .. } => CompatReason::Incompatible,
        e => CompatReason::Unavailable(e.errno().unwrap_or(Errno::EIO)),
    }
}

impl GpuReader {
    /// A reader that uses the module when it is loaded with the `nvidia` provider, and
    /// `engine` otherwise.
    pub fn new(engine: CompatEngine<CudaBackend>) -> Self {
        Self::with_mode(engine, CompatMode::Auto)
    }

    /// A reader in the mode `GDIRECT_COMPAT_MODE` asks for ([`CompatMode::from_env`]).
    pub fn from_env(engine: CompatEngine<CudaBackend>) -> Result<Self> {
        Ok(Self::with_mode(engine, CompatMode::from_env()?))
    }

    /// A reader in `mode`: [`CompatMode::On`] never asks the module, [`CompatMode::Off`] never
    /// uses `engine`.
    pub fn with_mode(engine: CompatEngine<CudaBackend>, mode: CompatMode) -> Self {
        if mode == CompatMode::On {
            return Self::compat_only(engine);
        }
        let module = match Driver::open() {
            Err(e) => Err(compat_reason_of(&e)),
            Ok(d) => match d.info() {
                Ok(info) if info.has_provider(Provider::Nvidia) => Ok(d),
                Ok(_) => Err(CompatReason::NoProvider),
                Err(e) => Err(compat_reason_of(&e)),
            },
        };
        Self {
            engine,
            module,
            mode,
        }
    }

    /// A reader that always uses the compat engine.
    pub fn compat_only(engine: CompatEngine<CudaBackend>) -> Self {
        Self {
            engine,
            module: Err(CompatReason::Requested),
            mode: CompatMode::On,
        }
    }

    /// Its mode.
    pub fn mode(&self) -> CompatMode {
        self.mode
    }

    /// The compat engine.
    pub fn engine(&self) -> &CompatEngine<CudaBackend> {
        &self.engine
    }

    /// Why the compat engine will run, or `None` when the module will be tried first.
    pub fn compat_reason(&self) -> Option<CompatReason> {
        self.module.as_ref().err().copied()
    }

    /// Reads `len` bytes of the file at `path`, from `file_offset`, into `memory` at
    /// `mem_offset`. A read past the end of the file is short and says so.
    ///
    /// This opens the file and registers the memory for this one read; to read a file or
    /// into memory many times, open it once ([`GpuReader::open`]) and register the memory once
    /// ([`GpuReader::register`]).
    pub fn read(
        &self,
        path: impl AsRef<Path>,
        memory: &mut CudaSlice<u8>,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        let file = self.open(path)?;
        let mut buf = self.register(memory);
        self.read_into(&file, &mut buf, mem_offset, file_offset, len)
    }

    /// Opens `path` once for any number of reads ([`GpuReader::read_into`]): where the module
    /// may serve, an `O_DIRECT` descriptor for it; the compat engine's view of the file (its
    /// descriptors and mapping) when it is first needed, so that a file the module reads costs
    /// one open. Errors opening the file are reported here either way.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<GpuFile> {
        let path = path.as_ref().to_path_buf();
        // A file system without O_DIRECT (tmpfs) has no direct transfers to offer: such a
        // file is read by the compat engine, and the transfer says why.
        let direct = match &self.module {
            Ok(_) => File::open_direct(&path).ok(),
            Err(_) => None,
        };
        let src = OnceLock::new();
        if direct.is_none() {
            // The compat engine reads it: open its view now (and report a missing file).
            let _ = src.set(Source::open(&path)?);
        }
        Ok(GpuFile { path, src, direct })
    }

    /// Registers `memory` with the module once, for any number of reads into it
    /// ([`GpuReader::read_into`]): no pin and unpin per read. Where the module cannot
    /// register it (not loaded, compat mode on, memory it refuses) reads into it go through
    /// the compat engine, and each transfer says why. The buffer holds `memory` mutably for
    /// its life, so the allocation cannot be freed or touched meanwhile.
    pub fn register<'a>(&'a self, memory: &'a mut CudaSlice<u8>) -> GpuBuffer<'a> {
        let reg = match &self.module {
            Err(why) => Err(*why),
            Ok(driver) => {
                let (provider, addr, len) = (
                    memory.provider(),
                    memory.device_address(),
                    DeviceMemory::len(&*memory),
                );
                // SAFETY: the range is the CUDA allocation `memory` owns (its `DeviceMemory`
                // says so), and the `GpuBuffer` holds `memory` by `&mut` for the registration's
                // whole life: it stays allocated, and nothing else can reach it meanwhile. No
                // Rust reference ever points into device memory.
                match unsafe { driver.register_range(provider, addr, len, RegisterOptions::new()) }
                {
                    Ok(reg) => Ok(reg),
                    Err(Error::Misaligned { .. }) => Err(CompatReason::Unaligned),
                    Err(e) => Err(CompatReason::Refused(e.errno().unwrap_or(Errno::EIO))),
                }
            }
        };
        GpuBuffer { memory, reg }
    }

    /// Reads `len` bytes of `file` from `file_offset` into `buf` at `mem_offset`: through the
    /// module where the file and the memory allow it, the compat engine otherwise (as the mode
    /// permits). A read past the end of the file is short and says so.
    pub fn read_into(
        &self,
        file: &GpuFile,
        buf: &mut GpuBuffer<'_>,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        let why = match (&buf.reg, &file.direct) {
            (Ok(reg), Some(direct)) => match direct.read_into(reg, mem_offset, file_offset, len) {
                Ok(transfer) => {
                    return Ok(GpuRead {
                        transfer,
                        compat: None,
                    })
                }
                Err(Error::IoMisaligned { .. } | Error::NotBlockBacked { .. }) => {
                    self.mode.allow(CompatReason::Unaligned)?
                }
                Err(e) => return Err(e),
            },
            // The module serves but the file has no direct I/O.
            (Ok(_), None) => self.mode.allow(CompatReason::Unaligned)?,
            (Err(why), _) => self.mode.allow(*why)?,
        };
        let report = self
            .engine
            .read(file.source()?, buf.memory, mem_offset, file_offset, len)?;
        Ok(GpuRead {
            transfer: compat_transfer(&report, why),
            compat: Some(report),
        })
    }
}

/// A file opened once by [`GpuReader::open`] for any number of reads.
#[derive(Debug)]
pub struct GpuFile {
    path: PathBuf,
    /// The compat engine's view, opened when first needed.
    src: OnceLock<Source>,
    direct: Option<File>,
}

impl GpuFile {
    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compat engine's view of the file, opened on first use.
    fn source(&self) -> Result<&Source> {
        if let Some(src) = self.src.get() {
            return Ok(src);
        }
        let src = Source::open(&self.path)?;
        // Two threads may both open it; one view is kept, the other closed.
        Ok(self.src.get_or_init(|| src))
    }

    /// Whether the module can read it directly (it is open with `O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.direct.is_some()
    }
}

/// GPU memory registered once by [`GpuReader::register`]; unregistered when dropped.
#[derive(Debug)]
pub struct GpuBuffer<'a> {
    memory: &'a mut CudaSlice<u8>,
    reg: std::result::Result<Registration<'a>, CompatReason>,
}

impl GpuBuffer<'_> {
    /// Whether the module registered the memory; `Err` says why reads into it go through
    /// the compat engine.
    pub fn registered(&self) -> std::result::Result<(), CompatReason> {
        self.reg.as_ref().map(|_| ()).map_err(|why| *why)
    }

    /// The memory, for CUDA work between reads (copies, kernels that read it).
    pub fn memory(&self) -> &CudaSlice<u8> {
        self.memory
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.memory.num_bytes() as u64
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    fn memory_for_test(&mut self) -> &mut CudaSlice<u8> {
        self.memory
    }
}

/// The [`Transfer`] of a compat read: every byte went through host memory (the page cache or
/// a staging buffer).
pub(crate) fn compat_transfer(r: &Report, why: CompatReason) -> Transfer {
    Transfer {
        engine: Engine::Compat(why),
        bytes: r.bytes,
        path: IoPath::Bounce,
        reason: Reason::None,
        transport: Transport::Unknown,
        eof: r.eof,
        bounce_bytes: r.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_names_why_the_module_cannot_serve() {
        let gone = Driver::open_path("/nonexistent/gdirect").map(|_| ());
        assert_eq!(
            gone.as_ref().map_err(compat_reason_of),
            Err(CompatReason::NoModule)
        );
        // Another driver's device answers GET_INFO with ENOTTY: not gdirect.
        let other = Driver::open_path("/dev/null").map(|_| ());
        assert_eq!(
            other.as_ref().map_err(compat_reason_of),
            Err(CompatReason::Incompatible)
        );
        let denied = Error::PermissionDenied {
            path: "/dev/gdirect".into(),
        };
        assert_eq!(compat_reason_of(&denied), CompatReason::NoAccess);
        let newer = Error::VersionMismatch {
            path: "/dev/gdirect".into(),
            module: 2,
            library: 1,
        };
        assert_eq!(compat_reason_of(&newer), CompatReason::Incompatible);
        for r in [CompatReason::NoAccess, CompatReason::Incompatible] {
            assert!(!Engine::Compat(r).explain().contains("not loaded"), "{r:?}");
        }
    }

    /// Open once, register once, many reads: every range exact, short at the end of the file,
    /// and each transfer saying which engine served it and why (the GPU machines we have run
    /// no module, so the compat engine; a node with the module registers the buffer). Run on a
    /// GPU machine: `cargo test -p gdirect --features cuda -- --ignored handles`.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn handles_read_many_ranges_from_one_open_and_one_registration() {
        use cudarc::driver::CudaContext;
        let path = std::env::temp_dir().join(format!("gdirect-handles-{}", std::process::id()));
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..(8 << 20) / 8)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        std::fs::write(&path, &data).expect("test file");
        let ctx = CudaContext::new(0).expect("CUDA context");
        let stream = ctx.default_stream();
        let mut mem = stream.alloc_zeros::<u8>(4 << 20).expect("GPU memory");
        let engine = CompatEngine::builder()
            .threads(4)
            .build(CudaBackend::from_context(ctx.clone()))
            .expect("engine");
        let reader = GpuReader::new(engine);
        let missing = reader.open(path.with_extension("missing"));
        assert!(
            matches!(missing, Err(Error::OpenFile { .. })),
            "{missing:?}"
        );
        let file = reader.open(&path).expect("open");
        assert_eq!(file.path(), path);
        let mut buf = reader.register(&mut mem);
        assert_eq!(buf.len(), 4 << 20);
        match reader.compat_reason() {
            Some(why) => assert_eq!(buf.registered(), Err(why)),
            None => assert_eq!(buf.registered(), Ok(())),
        }
        let mib = 1u64 << 20;
        // (memory offset, file offset, length, bytes expected)
        for (mo, fo, len, want) in [
            (0, 0, 4 * mib, 4 * mib),
            (4096, mib, mib, mib),
            (mib, 7 * mib + 4096, 2 * mib, mib - 4096),
            (2 * mib, 3 * mib + 12288, 65536, 65536),
            (0, 8 * mib, mib, 0),
        ] {
            stream
                .memset_zeros(&mut *buf.memory_for_test())
                .expect("clear");
            let r = reader
                .read_into(&file, &mut buf, mo, fo, len)
                .expect("read");
            assert_eq!(r.transfer.bytes, want, "{len} bytes at {fo}");
            assert_eq!(r.transfer.eof, want < len);
            assert_eq!(
                r.transfer.engine.name(),
                if r.compat.is_some() {
                    "compat"
                } else {
                    "module"
                }
            );
            let back = stream.clone_dtoh(buf.memory()).expect("copy back");
            let (mo, fo, want) = (mo as usize, fo as usize, want as usize);
            assert!(
                back[mo..mo + want] == data[fo..fo + want],
                "{len} bytes at {fo}"
            );
            assert!(
                back[..mo].iter().chain(&back[mo + want..]).all(|&b| b == 0),
                "wrote outside the range"
            );
        }
        let r = reader.read_into(&file, &mut buf, 4 * mib - 4096, 0, 8192);
        assert!(
            matches!(
                r,
                Err(Error::OutOfMemoryRange { .. } | Error::OutOfRegistration { .. })
            ),
            "{r:?}"
        );
        drop(buf);
        let _ = std::fs::remove_file(&path);
    }

    /// The README shows the example of [`GpuReader`]'s documentation, which compiles as a
    /// doctest: the two stay the same code.
    #[test]
    fn the_readme_example_is_the_doctest() {
        let readme = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let Ok(readme) = std::fs::read_to_string(readme) else {
            return; // a packaged crate has no README of the repository
        };
        let src = include_str!("gpu.rs");
        let doc: String = src
            .lines()
            .skip_while(|l| *l != "/// ```no_run")
            .skip(1)
            .take_while(|l| *l != "/// ```")
            .filter(|l| !l.starts_with("/// #"))
            .map(|l| {
                format!(
                    "{}\n",
                    l.trim_start_matches("///").strip_prefix(' ').unwrap_or("")
                )
            })
            .collect();
        assert!(
            doc.contains("reader.register"),
            "the doc example was not found"
        );
        assert!(
            readme.contains(&format!("```rust\n{doc}```")),
            "README's GpuReader example differs from the doctest:\n{doc}"
        );
    }

    #[test]
    fn compat_mode_off_is_an_error_never_a_fallback() {
        assert_eq!(CompatMode::parse(" OFF "), Some(CompatMode::Off));
        assert_eq!(CompatMode::parse("1"), Some(CompatMode::On));
        assert_eq!(CompatMode::parse("Auto"), Some(CompatMode::Auto));
        assert_eq!(CompatMode::parse("sometimes"), None);
        assert_eq!(CompatMode::default(), CompatMode::Auto);
        assert_eq!(
            CompatMode::Auto.allow(CompatReason::NoModule).ok(),
            Some(CompatReason::NoModule)
        );
        let e = CompatMode::Off
            .allow(CompatReason::NoProvider)
            .expect_err("off never falls back");
        assert!(matches!(
            e,
            Error::CompatModeOff {
                reason: CompatReason::NoProvider
            }
        ));
        assert!(e.to_string().contains("GDIRECT_COMPAT_MODE=off"), "{e}");
        assert_eq!(e.errno(), Some(Errno::EOPNOTSUPP));
    }
}
