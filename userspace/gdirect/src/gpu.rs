// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Reading files into CUDA memory: through the module where it can, the compat engine
//! everywhere else, and the [`Transfer`] says which and why.

use std::path::Path;

use cudarc::driver::CudaSlice;

use crate::{
    compat::{CompatEngine, CudaBackend, Report, Source},
    io::{CompatReason, Engine},
    Driver, Errno, Error, File, IoPath, Provider, Reason, Result, Transfer, Transport,
};

/// What [`GpuReader::read`] did: the transfer, and the compat engine's report when it ran.
#[derive(Clone, Debug)]
pub struct GpuRead {
    /// The transfer (its `engine` says which engine and why).
    pub transfer: Transfer,
    /// The compat engine's report (how much went direct, through the page cache, ...).
    pub compat: Option<Report>,
}

/// Reads files into GPU memory allocated with cudarc.
///
/// ```no_run
/// use gdirect::{compat::{CompatEngine, CudaBackend}, gpu::GpuReader};
/// let backend = CudaBackend::new(0)?;
/// let ctx = backend.context().clone();
/// let reader = GpuReader::new(CompatEngine::builder().build(backend)?);
/// let mut buf = ctx.default_stream().alloc_zeros::<u8>(1 << 20).expect("GPU memory");
/// let r = reader.read("data.bin", &mut buf, 0, 0, 1 << 20)?;
/// println!("{} bytes by {} ({})", r.transfer.bytes, r.transfer.engine, r.transfer.engine.explain());
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
    pub fn read(
        &self,
        path: impl AsRef<Path>,
        memory: &mut CudaSlice<u8>,
        mem_offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<GpuRead> {
        let path = path.as_ref();
        let why = match &self.module {
            Ok(driver) => match read_module(driver, path, memory, mem_offset, file_offset, len)? {
                Ok(transfer) => {
                    return Ok(GpuRead {
                        transfer,
                        compat: None,
                    })
                }
                Err(Fallback(why)) => self.mode.allow(why)?,
            },
            Err(why) => self.mode.allow(*why)?,
        };
        let src = Source::open(path)?;
        let report = self
            .engine
            .read(&src, memory, mem_offset, file_offset, len)?;
        Ok(GpuRead {
            transfer: compat_transfer(&report, why),
            compat: Some(report),
        })
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

/// Why the module could not serve a read that the compat engine can.
struct Fallback(CompatReason);

/// The module's read; `Ok(Err(_))` when the compat engine should serve it instead (the memory
/// or the range does not suit direct transfers), `Err` for a failure of the read itself.
fn read_module(
    driver: &Driver,
    path: &Path,
    memory: &mut CudaSlice<u8>,
    mem_offset: u64,
    file_offset: u64,
    len: u64,
) -> Result<std::result::Result<Transfer, Fallback>> {
    // A file system without O_DIRECT (tmpfs) has no direct transfers to offer.
    let Ok(file) = File::open_direct(path) else {
        return Ok(Err(Fallback(CompatReason::Unaligned)));
    };
    let reg = match driver.register(&*memory) {
        Ok(reg) => reg,
        Err(Error::Misaligned { .. }) => return Ok(Err(Fallback(CompatReason::Unaligned))),
        Err(e) => {
            let errno = e.errno().unwrap_or(Errno::EIO);
            return Ok(Err(Fallback(CompatReason::Refused(errno))));
        }
    };
    match file.read_into(&reg, mem_offset, file_offset, len) {
        Ok(t) => Ok(Ok(t)),
        Err(Error::IoMisaligned { .. } | Error::NotBlockBacked { .. }) => {
            Ok(Err(Fallback(CompatReason::Unaligned)))
        }
        Err(e) => Err(e),
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
