// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect._native`: the Rust half of the Python package. The Python half (`python/gdirect`)
//! turns destinations (CUDA arrays, tensors, host buffers) into an address and a length, checks
//! them, and keeps them alive for the call; this half checks device addresses against the CUDA
//! driver's allocations, reads with the library's compat engine with the GIL released, and maps
//! the library's errors onto Python's exceptions.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard, OnceLock,
    },
    time::{Duration, Instant},
};

use gdirect::{
    compat::{
        Builder, CompatEngine, CudaBackend, DeviceAllocation, HostBackend, PageCache, Segment,
        SegmentRead, Sink, Source,
    },
    gpu::{CompatMode, RdmaFacts},
    CompatReason, CudaError, DirectCache, Error, IoPath, Provider, Transfer,
};
use pyo3::{
    exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError},
    prelude::*,
    types::PyDict,
};

/// A library error as the Python exception a caller would catch: `OSError` (with its errno, so
/// that Python picks `FileNotFoundError`, `PermissionError`, ...) for failures of the system,
/// `ValueError` for arguments, `MemoryError` when the CUDA driver is out of memory,
/// `RuntimeError` for the driver's other failures and the engine itself.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::OutOfMemoryRange { .. }
        | Error::BadSetting { .. }
        | Error::WrongDevice { .. }
        | Error::StaleBuffer { .. } => PyValueError::new_err(msg),
        Error::Cuda { .. } if e.cuda_error() == Some(CudaError::OutOfMemory) => {
            PyMemoryError::new_err(msg)
        }
        Error::Cuda { .. } | Error::Worker { .. } => PyRuntimeError::new_err(msg),
        e => match e.errno() {
            Some(errno) => PyOSError::new_err((errno as i32, msg)),
            None => PyRuntimeError::new_err(msg),
        },
    }
}

mod safetensors;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Settings given from Python (`gdirect.settings(...)`), over the environment's.
#[derive(Clone, Debug, Default)]
struct Overrides {
    threads: Option<usize>,
    task_size: Option<u64>,
    page_cache: Option<PageCache>,
    staging_size: Option<u64>,
    keep_mapped: Option<u64>,
    max_piece: Option<u64>,
}

impl Overrides {
    fn builder(&self) -> Builder {
        let mut b = CompatEngine::builder();
        if let Some(t) = self.threads {
            b = b.threads(t);
        }
        if let Some(t) = self.task_size {
            b = b.task_size(t).staging_size(t * 2);
        }
        if let Some(p) = self.page_cache {
            b = b.page_cache(p);
        }
        if let Some(n) = self.staging_size {
            b = b.staging_size(n);
        }
        if let Some(n) = self.keep_mapped {
            b = b.keep_mapped(n);
        }
        if let Some(n) = self.max_piece {
            b = b.max_piece(n);
        }
        b
    }
}

/// The engines: one for host memory, one per CUDA device, made on first use with the settings
/// of that moment (a change of settings drops them).
#[derive(Default)]
struct Engines {
    overrides: Overrides,
    host: Option<Arc<CompatEngine<HostBackend>>>,
    cuda: HashMap<usize, Arc<CompatEngine<CudaBackend>>>,
}

fn engines() -> &'static Mutex<Engines> {
    static ENGINES: OnceLock<Mutex<Engines>> = OnceLock::new();
    ENGINES.get_or_init(Default::default)
}

/// Whether this process has made threads of the package's (an engine's workers, a `Starter`
/// thread): a child that `fork()` makes after has none of them.
static THREADS_MADE: AtomicBool = AtomicBool::new(false);

/// This process is such a child: every call that moves data raises, first thing, where it would
/// wait forever for threads that are not here, call a CUDA driver that does not survive fork, or
/// take a lock one of those threads held.
static FORKED: AtomicBool = AtomicBool::new(false);

/// The forks this process has been the child of since the package made threads: a call started
/// before one is not waited for after it (`Pending::orphaned`).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Run in the child of every `fork()` (from Python or from any library) once threads are made:
/// atomics only, as a handler there must be.
extern "C" fn forked_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    FORKED.store(true, Ordering::Relaxed);
}

/// Notes that the package makes threads (before it makes them): the first time, a child of any
/// later `fork()` is marked (`forked_child`).
fn threads_made() {
    if !THREADS_MADE.swap(true, Ordering::Relaxed) {
        // SAFETY: registers a child handler that only touches atomics (async-signal-safe, as a
        // handler that runs in a child after fork() must be); no prepare or parent handler. The
        // handler's code stays mapped for the process's life: CPython never unloads an
        // extension module.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    }
}

/// The error of a call in a child forked after the package made its threads.
fn fork_error() -> PyErr {
    PyRuntimeError::new_err(
        "gdirect cannot move data in a process forked after gdirect made its I/O threads: the \
         child has none of them (nor, for GPU memory, a CUDA context that survives fork()), and \
         requests started before the fork are not finished in it. Start worker processes with \
         the 'spawn' or 'forkserver' method (multiprocessing.set_start_method('spawn'); \
         PyTorch's DataLoader(multiprocessing_context='spawn'))",
    )
}

/// An error if this process was forked after the package made threads.
fn not_forked() -> PyResult<()> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(fork_error());
    }
    Ok(())
}

fn host_engine() -> PyResult<Arc<CompatEngine<HostBackend>>> {
    not_forked()?;
    let mut e = lock(engines());
    if let Some(h) = &e.host {
        return Ok(h.clone());
    }
    threads_made();
    let h = Arc::new(e.overrides.builder().build_host().map_err(py_err)?);
    e.host = Some(h.clone());
    Ok(h)
}

fn cuda_engine(ordinal: usize) -> PyResult<Arc<CompatEngine<CudaBackend>>> {
    not_forked()?;
    let mut e = lock(engines());
    if let Some(c) = e.cuda.get(&ordinal) {
        return Ok(c.clone());
    }
    threads_made();
    let backend = CudaBackend::new(ordinal).map_err(py_err)?;
    let c = Arc::new(e.overrides.builder().build(backend).map_err(py_err)?);
    e.cuda.insert(ordinal, c.clone());
    Ok(c)
}

/// The module's side of this process's CUDA transfers: the registrations it keeps (one per
/// CUDA allocation, made at its first transfer, as cuFile's buffer registration), or why the
/// module cannot serve (`GDIRECT_COMPAT_MODE=on`, no module, no nvidia provider...). Found once
/// per process: a child forked after finds its own, since the device file belongs to the
/// address space that opened it.
fn module() -> Result<&'static DirectCache, CompatReason> {
    type Route = (u32, Result<&'static DirectCache, CompatReason>);
    static FIRST: OnceLock<Route> = OnceLock::new();
    static LATER: Mutex<Option<Route>> = Mutex::new(None);
    let open = || -> Route {
        let route = match compat_mode() {
            CompatMode::On => Err(CompatReason::Requested),
            _ => DirectCache::open(None, Provider::Nvidia).map(|c| &*Box::leak(Box::new(c))),
        };
        (std::process::id(), route)
    };
    let first = FIRST.get_or_init(open);
    // Where the first answer was no module, a child's is too (and a request costs no
    // getpid): only an open device belongs to one process.
    if first.1.is_err() {
        return first.1;
    }
    let pid = std::process::id();
    if first.0 == pid {
        return first.1;
    }
    let mut later = lock(&LATER);
    match &*later {
        Some((p, route)) if *p == pid => *route,
        _ => later.insert(open()).1,
    }
}

/// `GDIRECT_COMPAT_MODE` (auto, on, off), read once; a value it cannot be is kept as `None`,
/// which every transfer of GPU memory reports (`compat_mode_checked`).
fn compat_mode() -> CompatMode {
    compat_mode_read().unwrap_or(CompatMode::Auto)
}

fn compat_mode_read() -> Option<CompatMode> {
    static MODE: OnceLock<Option<CompatMode>> = OnceLock::new();
    *MODE.get_or_init(|| CompatMode::from_env().ok())
}

/// [`compat_mode`], or the error of a value it cannot be (as the Rust library's).
fn compat_mode_checked() -> gdirect::Result<CompatMode> {
    match compat_mode_read() {
        Some(mode) => Ok(mode),
        None => CompatMode::from_env(),
    }
}

/// Why the compat engine moves host memory's bytes: it reads and writes it with `O_DIRECT`
/// itself where the file allows (the module would add a pin and an unpin per request, and
/// miss the page cache), so the module is not asked; where the module is missing, that is why.
fn host_reason() -> &'static str {
    match module() {
        Ok(_) => "host_memory",
        Err(why) => why.name(),
    }
}

/// Module transfers of this process, and their bytes (`stats()`).
static MODULE_TRANSFERS: AtomicU64 = AtomicU64::new(0);
static MODULE_BYTES: AtomicU64 = AtomicU64::new(0);

/// One CUDA request: `len` bytes of the file (through its `O_DIRECT` descriptor) at
/// `file_offset`, to or from the memory at `ptr`, inside the CUDA allocation `alloc`.
#[derive(Clone, Copy)]
struct CudaIo<'a> {
    direct: &'a Direct,
    alloc: DeviceAllocation,
    ptr: u64,
    len: u64,
    file_offset: u64,
}

/// How a CUDA request went: the module's transfer, or why the compat engine is to move it.
type Route = Result<Transfer, CompatReason>;

/// The module's transfer of one CUDA request, or why
/// the compat engine is to move it (an error instead under `GDIRECT_COMPAT_MODE=off`): the
/// path the library's `GpuReader` takes, with the same reasons. Memory of a stream-ordered
/// pool, or that the driver calls unreachable by peers, is never registered.
///
/// # Safety
///
/// `io.ptr..io.ptr + io.len` lies in `io.alloc`, a live allocation of its GPU, which the
/// caller keeps alive until this returns and which is freed only by the CUDA driver (whose
/// free revokes the registration the module keeps); no Rust reference points into it; a
/// read's destination is not used by work queued meanwhile, nor a write's source written.
/// `settled`: the work queued on the memory was waited for (else the context's is, here).
unsafe fn via_module(
    io: &CudaIo<'_>,
    read: bool,
    settled: bool,
    engine: &CompatEngine<CudaBackend>,
) -> gdirect::Result<Route> {
    let CudaIo {
        direct: file,
        alloc,
        ptr,
        len,
        file_offset,
    } = *io;
    compat_mode_checked()?;
    let allow = |why: CompatReason| match compat_mode() {
        CompatMode::Off => Err(Error::CompatModeOff { reason: why }),
        _ => Ok(Err(why)),
    };
    let cache = match module() {
        Ok(c) => c,
        Err(why) => return allow(why),
    };
    if compat_mode() == CompatMode::Auto && len < engine.settings().direct_threshold {
        return Ok(Err(CompatReason::BelowThreshold));
    }
    // No drive's logical block is smaller than 512 bytes: a request not on that boundary is
    // the compat engine's without asking the module (a checkpoint's tensors mostly are).
    if (file_offset | len) % 512 != 0 {
        return allow(CompatReason::Unaligned);
    }
    let Some(direct) = file.get() else {
        return allow(CompatReason::Unaligned);
    };
    if !read || !settled {
        // The module's DMA is ordered after the work queued on the memory: for a write, the
        // context's, as the compat engine's write waits for it; for a read, where its stream
        // was not waited for.
        engine.backend().synchronize_all()?;
    }
    let vet = || match RdmaFacts::of(alloc.start) {
        Ok(f) if f.pool => Err(CompatReason::PoolMemory),
        Ok(f) if f.rdma_capable == Some(false) => Err(CompatReason::NotRdmaCapable),
        _ => Ok(()),
    };
    let range = alloc.start..alloc.start + alloc.size;
    // SAFETY: the function's contract: the allocation is the CUDA driver's (not a pool's:
    // `vet`), freed only through it, and the request lies inside it.
    let r = unsafe {
        if read {
            cache.read(direct, range, ptr, len, file_offset, vet)
        } else {
            cache.write(direct, range, ptr, len, file_offset, vet)
        }
    }?;
    match r {
        Ok(t) => {
            MODULE_TRANSFERS.fetch_add(1, Ordering::Relaxed);
            MODULE_BYTES.fetch_add(t.bytes, Ordering::Relaxed);
            Ok(Ok(t))
        }
        Err(why) => allow(why),
    }
}

/// The report of one read, as a dict (the Python half makes it a `Report`): the compat
/// engine's, which moved the bytes because of `reason`.
fn report<'py>(
    py: Python<'py>,
    r: &gdirect::compat::Report,
    memory: &str,
    reason: &str,
    seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("eof", r.eof)?;
    d.set_item("engine", "compat")?;
    d.set_item("reason", reason)?;
    d.set_item("memory", memory)?;
    d.set_item("direct_bytes", r.direct_bytes)?;
    d.set_item("buffered_bytes", r.buffered_bytes)?;
    d.set_item("mapped_bytes", r.mapped_bytes)?;
    d.set_item("threads", r.threads)?;
    d.set_item("seconds", seconds)?;
    d.set_item("path", "bounce")?;
    d.set_item("module_bytes", 0u64)?;
    Ok(d)
}

/// The report of a transfer the module made.
fn module_report<'py>(
    py: Python<'py>,
    t: &Transfer,
    memory: &str,
    seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = report(py, &Default::default(), memory, t.reason.name(), seconds)?;
    d.set_item("bytes", t.bytes)?;
    d.set_item("eof", t.eof)?;
    d.set_item("engine", "module")?;
    d.set_item("threads", 1)?;
    d.set_item("path", t.path.name())?;
    d.set_item("module_bytes", t.bytes)?;
    Ok(d)
}

/// Runs one compat engine call with the GIL released, timed, and makes its report (`memory`
/// names where the bytes were: `host` or `cuda:N`).
fn run_reported<'py>(
    py: Python<'py>,
    memory: &str,
    reason: &str,
    call: impl FnOnce() -> gdirect::Result<gdirect::compat::Report> + Send,
) -> PyResult<Bound<'py, PyDict>> {
    let t0 = Instant::now();
    let r = py.allow_threads(call).map_err(py_err)?;
    report(py, &r, memory, reason, t0.elapsed().as_secs_f64())
}

/// One CUDA request, timed with the GIL released: the module where it serves, else `compat`
/// (the compat engine's call), and its report.
///
/// # Safety
///
/// As for `via_module`.
unsafe fn run_cuda<'py>(
    py: Python<'py>,
    io: CudaIo<'_>,
    read: bool,
    settled: bool,
    engine: &CompatEngine<CudaBackend>,
    compat: impl FnOnce() -> gdirect::Result<gdirect::compat::Report> + Send,
) -> PyResult<Bound<'py, PyDict>> {
    let memory = format!("cuda:{}", io.alloc.ordinal);
    let t0 = Instant::now();
    let routed = py.allow_threads(|| -> gdirect::Result<_> {
        // SAFETY: the function's contract, which is `via_module`'s.
        match unsafe { via_module(&io, read, settled, engine) }? {
            Ok(t) => Ok(Ok(t)),
            Err(why) => Ok(Err((why, compat()?))),
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    match routed.map_err(py_err)? {
        Ok(t) => module_report(py, &t, &memory, seconds),
        Err((why, r)) => report(py, &r, &memory, why.name(), seconds),
    }
}

/// The CUDA allocation that holds all of `len` bytes at `ptr`, checked to lie in it: a range
/// past the allocation's end is refused, not written.
fn device_allocation(ptr: u64, len: u64) -> PyResult<DeviceAllocation> {
    let alloc = DeviceAllocation::of(ptr).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if ptr
        .checked_add(len)
        .is_none_or(|end| end > alloc.start + alloc.size)
    {
        return Err(PyValueError::new_err(format!(
            "{len} bytes at {ptr:#x} run past the end of their CUDA allocation ({:#x}, {} bytes)",
            alloc.start, alloc.size
        )));
    }
    Ok(alloc)
}

/// A file opened for reading, and for writing in mode `r+` or `w` (kept open: open once, read
/// and write many times).
#[pyclass(module = "gdirect._native", frozen)]
struct File {
    // Shared with the requests still running, which outlive the call that started them.
    src: Arc<Source>,
    sink: Option<Arc<Sink>>,
    direct: Arc<Direct>,
}

/// A file's `O_DIRECT` descriptor for the module's transfers, opened at the first one (none
/// where the file system has no `O_DIRECT`, as tmpfs, or where the path now names another
/// file than the one opened, renamed over it since: then the compat engine moves the bytes,
/// from the file the caller opened).
struct Direct {
    src: Arc<Source>,
    writable: bool,
    fd: OnceLock<Option<gdirect::File>>,
}

impl Direct {
    fn get(&self) -> Option<&gdirect::File> {
        self.fd
            .get_or_init(|| {
                let path = self.src.path();
                let f = if self.writable {
                    gdirect::File::open_direct_rw(path).ok()
                } else {
                    gdirect::File::open_direct(path).ok()
                };
                f.filter(|f| self.src.same_file(f))
            })
            .as_ref()
    }
}

#[pymethods]
impl File {
    #[new]
    #[pyo3(signature = (path, mode = "r"))]
    fn new(path: PathBuf, mode: &str) -> PyResult<Self> {
        // Opened for writing first: `w` makes the file the reading side then opens.
        let sink = match mode {
            "r" => None,
            "r+" => Some(Arc::new(Sink::open(&path, false, false).map_err(py_err)?)),
            "w" => Some(Arc::new(Sink::open(&path, true, true).map_err(py_err)?)),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "mode '{mode}': expected 'r', 'r+' or 'w'"
                )))
            }
        };
        let src = Arc::new(Source::open(&path).map_err(py_err)?);
        Ok(Self {
            direct: Arc::new(Direct {
                src: src.clone(),
                writable: sink.is_some(),
                fd: OnceLock::new(),
            }),
            src,
            sink,
        })
    }

    /// The path it was opened from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.src.path().to_path_buf()
    }

    /// The file's size now (a block device's capacity).
    #[getter]
    fn size(&self) -> PyResult<u64> {
        std::fs::metadata(self.src.path())
            .map(|m| m.len())
            .map(|len| if len == 0 { self.src.len() } else { len })
            .map_err(|e| PyOSError::new_err((e.raw_os_error().unwrap_or(5), e.to_string())))
    }

    /// Reads `len` bytes at `file_offset` into host memory at address `ptr`. The caller (the
    /// Python half) holds a writable, contiguous buffer of at least `len` bytes at `ptr` for the
    /// whole call.
    fn read_host<'py>(
        &self,
        py: Python<'py>,
        ptr: usize,
        len: u64,
        file_offset: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        not_forked()?;
        if ptr == 0 && len > 0 {
            return Err(PyValueError::new_err("a null destination address"));
        }
        let engine = host_engine()?;
        run_reported(py, "host", host_reason(), || {
            // SAFETY: the Python half passes the address of a writable buffer of `len` bytes
            // that it keeps alive (a held memoryview) until this returns; no Rust reference
            // covers it (the engine writes it by raw copies), so Python threads touching it
            // meanwhile race with no reference.
            unsafe { engine.read_host_ptr(&self.src, ptr as *mut u8, len, 0, file_offset, len) }
        })
    }

    /// Reads `len` bytes at `file_offset` into CUDA device memory at `ptr`, which must lie in
    /// one allocation the CUDA driver knows (checked: an address range past the allocation's
    /// end is refused, not written). The read is ordered after the work queued on `stream`
    /// (0: none), or on the whole context when no stream is given.
    #[pyo3(signature = (ptr, len, file_offset, stream = None))]
    fn read_cuda<'py>(
        &self,
        py: Python<'py>,
        ptr: u64,
        len: u64,
        file_offset: u64,
        stream: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        not_forked()?;
        if len == 0 {
            // An empty array (its pointer may be 0, in no allocation): nothing to read.
            return run_reported(py, "cuda", "empty", || Ok(Default::default()));
        }
        let alloc = device_allocation(ptr, len)?;
        let engine = cuda_engine(alloc.ordinal)?;
        let settled = settle(Some(py), Place::Cuda(alloc.ordinal), stream)?;
        let seg = Segment {
            src: &self.src,
            file_offset,
            len,
            mem_offset: 0,
        };
        let io = CudaIo {
            direct: &self.direct,
            alloc,
            ptr,
            len,
            file_offset,
        };
        let compat = || {
            // SAFETY: `ptr..ptr + len` lies in a live device allocation of GPU `alloc.ordinal`
            // (checked above) that the Python half keeps alive until this returns; the engine
            // uses that GPU's primary context (the one CUDA runtimes such as PyTorch's and
            // CuPy's allocate in); when `settled`, the work queued on the memory was waited for.
            let (r, _) = unsafe {
                if settled {
                    engine.read_device_ptrs_settled(&[seg], &[(ptr, len)])
                } else {
                    engine.read_device_ptrs(&[seg], &[(ptr, len)])
                }
            }?;
            Ok(r)
        };
        // SAFETY: as for `compat`, and a CUDA runtime's free of the allocation (PyTorch's,
        // CuPy's) gives it back to the driver, which revokes the module's registration.
        unsafe { run_cuda(py, io, true, settled, &engine, compat) }
    }

    /// Writes `len` bytes of host memory at address `ptr` to the file at `file_offset`. The
    /// caller (the Python half) holds a readable, contiguous buffer of at least `len` bytes at
    /// `ptr` for the whole call.
    fn write_host<'py>(
        &self,
        py: Python<'py>,
        ptr: usize,
        len: u64,
        file_offset: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        not_forked()?;
        let sink = self.sink()?;
        if ptr == 0 && len > 0 {
            return Err(PyValueError::new_err("a null source address"));
        }
        let engine = host_engine()?;
        run_reported(py, "host", host_reason(), || {
            // SAFETY: the Python half passes the address of a buffer of `len` readable bytes
            // that it keeps alive (a held buffer export) until this returns.
            unsafe { engine.write_host_ptr(sink, ptr as *const u8, len, file_offset) }
        })
    }

    /// Writes `len` bytes of CUDA device memory at `ptr` to the file at `file_offset`; the range
    /// must lie in one allocation the CUDA driver knows (checked).
    fn write_cuda<'py>(
        &self,
        py: Python<'py>,
        ptr: u64,
        len: u64,
        file_offset: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        not_forked()?;
        let sink = self.sink()?;
        if len == 0 {
            return run_reported(py, "cuda", "empty", || Ok(Default::default()));
        }
        let alloc = device_allocation(ptr, len)?;
        let engine = cuda_engine(alloc.ordinal)?;
        let io = CudaIo {
            direct: &self.direct,
            alloc,
            ptr,
            len,
            file_offset,
        };
        let compat = || {
            // SAFETY: `ptr..ptr + len` lies in a live device allocation of GPU `alloc.ordinal`
            // (checked above), whose engine uses that GPU's primary context; the Python half
            // keeps the array alive until this returns.
            unsafe { engine.write_device_ptr(sink, ptr, len, file_offset) }
        };
        // SAFETY: as for `compat`, and the allocation's free is the driver's (`read_cuda`).
        unsafe { run_cuda(py, io, false, false, &engine, compat) }
    }

    /// Starts reading `len` bytes at `file_offset` into memory at `ptr` (device memory of a
    /// CUDA allocation when `cuda`, else host memory) and returns its `Future`; `keep` keeps
    /// the memory alive until the read ends.
    /// `may_run_here`: the caller allows a small request to run before this returns (not from
    /// a thread running an event loop).
    #[pyo3(signature = (cuda, ptr, len, file_offset, keep, stream = None, may_run_here = true))]
    #[allow(clippy::too_many_arguments)]
    fn pread(
        &self,
        py: Python<'_>,
        cuda: bool,
        ptr: u64,
        len: u64,
        file_offset: u64,
        keep: Py<PyAny>,
        stream: Option<u64>,
        may_run_here: bool,
    ) -> PyResult<Future> {
        self.one(
            py,
            true,
            cuda,
            ptr,
            len,
            file_offset,
            keep,
            stream,
            may_run_here,
        )
    }

    /// Starts writing `len` bytes of memory at `ptr` (as `pread`'s) to the file at
    /// `file_offset` and returns its `Future`.
    #[pyo3(signature = (cuda, ptr, len, file_offset, keep, may_run_here = true))]
    #[allow(clippy::too_many_arguments)]
    fn pwrite(
        &self,
        py: Python<'_>,
        cuda: bool,
        ptr: u64,
        len: u64,
        file_offset: u64,
        keep: Py<PyAny>,
        may_run_here: bool,
    ) -> PyResult<Future> {
        self.sink()?;
        self.one(
            py,
            false,
            cuda,
            ptr,
            len,
            file_offset,
            keep,
            None,
            may_run_here,
        )
    }

    /// Starts writing back `[offset, offset + len)` of a file open for writing (its pages
    /// written so far) without waiting for it (`Sink::start_writeback`, the GIL released: the
    /// call may wait for room in the device's queue).
    fn start_writeback(&self, py: Python<'_>, offset: u64, len: u64) -> PyResult<()> {
        let sink = self.sink()?.clone();
        py.allow_threads(move || sink.start_writeback(offset, len))
            .map_err(py_err)
    }
}

impl File {
    /// One request started: see `pread`.
    #[allow(clippy::too_many_arguments)]
    fn one(
        &self,
        py: Python<'_>,
        read: bool,
        cuda: bool,
        ptr: u64,
        len: u64,
        file_offset: u64,
        keep: Py<PyAny>,
        stream: Option<u64>,
        may_run_here: bool,
    ) -> PyResult<Future> {
        not_forked()?;
        // A small request that this thread will wait for at once, as far as can be told (it
        // holds no other future whose result it has not taken): run here, the GIL released,
        // as a synchronous call would be, not handed to a `Starter` thread and back. A thread
        // that starts many before taking their results has the first run here, the rest by
        // the `Starter` threads, side by side. Not here: a request that would first wait for
        // the GPU's work (a write out of device memory, a read into memory of no known stream:
        // the whole context's work), nor one from an event loop's thread (`may_run_here`).
        let untaken = UNTAKEN.with(Arc::clone);
        let waits_for_gpu = cuda && len > 0 && !(read && stream.is_some());
        let inline = may_run_here
            && !waits_for_gpu
            && len <= inline_limit()?
            && untaken.load(Ordering::Relaxed) == 0;
        let mut fut = if inline {
            // The GIL released from the driver's first query on (the memory's allocation, its
            // stream's work): the driver takes its locks for them, which the engine's threads
            // moving other requests also take, and every other Python thread would wait while
            // this one waited for them holding the GIL.
            py.allow_threads(|| -> PyResult<Future> {
                let request = self.request(None, read, cuda, ptr, len, file_offset, stream)?;
                let fut = start(read, vec![request], keep, true, false)?;
                fut.pending.help_and_wait();
                Ok(fut)
            })?
        } else {
            let request = self.request(Some(py), read, cuda, ptr, len, file_offset, stream)?;
            start(read, vec![request], keep, true, true)?
        };
        untaken.fetch_add(1, Ordering::Relaxed);
        fut.untaken = Some((untaken, AtomicBool::new(false)));
        Ok(fut)
    }

    /// The request of `one`, its memory looked up (`Place::of`) and, for a read, ordered after
    /// the work queued on `stream` (`settle`; with `py`, the GIL released if it must wait).
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        py: Option<Python<'_>>,
        read: bool,
        cuda: bool,
        ptr: u64,
        len: u64,
        file_offset: u64,
        stream: Option<u64>,
    ) -> PyResult<Request> {
        let (place, alloc) = if len == 0 {
            (Place::Host, None)
        } else {
            Place::of(cuda, ptr, len)?
        };
        Ok(Request {
            src: self.src.clone(),
            sink: if read { None } else { self.sink.clone() },
            direct: self.direct.clone(),
            alloc,
            file_offset,
            ptr,
            len,
            place,
            settled: read && settle(py, place, stream)?,
        })
    }

    fn sink(&self) -> PyResult<&Arc<Sink>> {
        self.sink.as_ref().ok_or_else(|| {
            PyOSError::new_err((
                gdirect::Errno::EBADF as i32,
                format!(
                    "{} is not open for writing (open it with mode 'r+' or 'w')",
                    self.src.path().display()
                ),
            ))
        })
    }
}

/// What `read_cuda_many` did: the compat engine's report and why it read (when it did), each
/// read's result, and the bytes the module moved peer to peer (the rest of its bytes it
/// bounced).
type ManyCuda = (
    Option<(gdirect::compat::Report, CompatReason)>,
    Vec<SegmentRead>,
    u64,
);

/// One read into CUDA memory of a batch (`read_many`, futures, `submit`).
struct CudaRead<'a> {
    src: &'a Source,
    io: CudaIo<'a>,
}

/// Reads `reads`, all into memory of `engine`'s GPU: each through the module where it serves
/// (the path and reasons of `via_module`), the others in one read of the compat engine, whose
/// workers take their pieces in turn. Returns that read's report (`None` when the module
/// served every one, with the first compat reason otherwise) and each read's result.
///
/// # Safety
///
/// Each read's memory is as `via_module` requires; the destinations do not overlap.
/// `settled`: the work queued on every destination was waited for (else the context's is).
unsafe fn read_cuda_many(
    engine: &CompatEngine<CudaBackend>,
    reads: &[CudaRead<'_>],
    settled: bool,
) -> gdirect::Result<ManyCuda> {
    if !settled {
        // Once for all of them: each is then ordered after the work queued before the call.
        engine.backend().synchronize_all()?;
    }
    let mut each = vec![SegmentRead::default(); reads.len()];
    let mut compat: Vec<(usize, CompatReason)> = Vec::new();
    let mut p2p_bytes = 0;
    for (i, r) in reads.iter().enumerate() {
        // SAFETY: the function's contract; the context's work was waited for above.
        let routed = unsafe { via_module(&r.io, true, true, engine) }?;
        match routed {
            Ok(t) => {
                if t.path == IoPath::P2p {
                    p2p_bytes += t.bytes;
                }
                each[i] = SegmentRead {
                    bytes: t.bytes,
                    eof: t.eof,
                }
            }
            Err(why) => compat.push((i, why)),
        }
    }
    let Some(&(_, why)) = compat.first() else {
        return Ok((None, each, p2p_bytes));
    };
    let segs: Vec<Segment<'_>> = compat
        .iter()
        .map(|&(i, _)| Segment {
            src: reads[i].src,
            file_offset: reads[i].io.file_offset,
            len: reads[i].io.len,
            mem_offset: 0,
        })
        .collect();
    let ptrs: Vec<(u64, u64)> = compat
        .iter()
        .map(|&(i, _)| (reads[i].io.ptr, reads[i].io.len))
        .collect();
    // SAFETY: the function's contract; the work queued on the memory was waited for.
    let (report, got) = unsafe { engine.read_device_ptrs_settled(&segs, &ptrs) }?;
    for (&(i, _), g) in compat.iter().zip(got) {
        each[i] = g;
    }
    Ok((Some((report, why)), each, p2p_bytes))
}

/// The report of a `read_many`, and each range's `(bytes, eof)`.
type ManyRead<'py> = (Bound<'py, PyDict>, Vec<(u64, bool)>);

/// Reads many ranges at once, with one set of workers taking their pieces in turn (a sharded
/// checkpoint): `reads` is a list of `(file, address, length, file_offset)`, all into host
/// memory (`cuda=False`) or all into device memory of one GPU (`cuda=True`, each range checked
/// against its CUDA allocation). Returns the report of the whole, and each range's `(bytes,
/// eof)`.
#[pyfunction]
#[pyo3(signature = (reads, cuda))]
fn read_many<'py>(
    py: Python<'py>,
    reads: Vec<(Py<File>, u64, u64, u64)>,
    cuda: bool,
) -> PyResult<ManyRead<'py>> {
    not_forked()?;
    let mut ranges: Vec<(u64, u64)> = reads.iter().map(|r| (r.1, r.2)).collect();
    ranges.sort_unstable();
    if ranges
        .windows(2)
        .any(|w| w[0].1 > 0 && w[1].1 > 0 && w[0].0.saturating_add(w[0].1) > w[1].0)
    {
        return Err(PyValueError::new_err(
            "two destinations of read_many overlap",
        ));
    }
    if reads.iter().any(|r| r.1 == 0 && r.2 > 0) {
        return Err(PyValueError::new_err("a null destination address"));
    }
    let mut ordinal = None;
    let mut allocs = Vec::new();
    if cuda {
        for &(_, ptr, len, _) in &reads {
            if len == 0 {
                allocs.push(None);
                continue;
            }
            let a = device_allocation(ptr, len)?;
            if ordinal.is_some_and(|prev| prev != a.ordinal) {
                return Err(PyValueError::new_err(
                    "read_many's destinations are on more than one GPU: one call per GPU",
                ));
            }
            ordinal = Some(a.ordinal);
            allocs.push(Some(a));
        }
    }
    let t0 = Instant::now();
    let mut reason = host_reason();
    let mut many_module_bytes = 0;
    let mut many_p2p_bytes = 0;
    let segs: Vec<Segment<'_>> = reads
        .iter()
        .map(|r| Segment {
            src: &r.0.get().src,
            file_offset: r.3,
            len: r.2,
            mem_offset: 0,
        })
        .collect();
    let (all, each) = match (cuda, ordinal) {
        (false, _) => {
            let engine = host_engine()?;
            let ptrs: Vec<(usize, u64)> = reads.iter().map(|r| (r.1 as usize, r.2)).collect();
            py.allow_threads(|| {
                let ptrs: Vec<(*mut u8, u64)> =
                    ptrs.iter().map(|&(p, l)| (p as *mut u8, l)).collect();
                // SAFETY: as in `File::read_host`, for each range; they do not overlap
                // (checked above).
                unsafe { engine.read_host_ptrs(&segs, &ptrs) }
            })
            .map_err(py_err)?
        }
        // Only empty ranges: nothing to read.
        (true, None) => (Default::default(), vec![Default::default(); segs.len()]),
        (true, Some(o)) => {
            let engine = cuda_engine(o)?;
            let items: Vec<CudaRead<'_>> = reads
                .iter()
                .zip(&allocs)
                .filter_map(|(r, a)| {
                    a.map(|alloc| CudaRead {
                        src: &r.0.get().src,
                        io: CudaIo {
                            direct: &r.0.get().direct,
                            alloc,
                            ptr: r.1,
                            len: r.2,
                            file_offset: r.3,
                        },
                    })
                })
                .collect();
            let (compat, got, p2p_bytes) = py
                .allow_threads(|| {
                    // SAFETY: as in `File::read_cuda`, for each range (checked above against
                    // its allocation on this GPU); they do not overlap (checked above).
                    unsafe { read_cuda_many(&engine, &items, false) }
                })
                .map_err(py_err)?;
            let mut got = got.into_iter();
            let each: Vec<SegmentRead> = allocs
                .iter()
                .map(|a| match a {
                    Some(_) => got.next().unwrap_or_default(),
                    None => SegmentRead::default(),
                })
                .collect();
            let module_bytes: u64 = each.iter().map(|r| r.bytes).sum::<u64>()
                - compat.as_ref().map_or(0, |(r, _)| r.bytes);
            reason = compat.as_ref().map_or("none", |(_, why)| why.name());
            let mut all = compat.map(|(r, _)| r).unwrap_or_default();
            all.bytes += module_bytes;
            many_module_bytes = module_bytes;
            many_p2p_bytes = p2p_bytes;
            (all, each)
        }
    };
    let memory = match ordinal {
        Some(o) => format!("cuda:{o}"),
        None if cuda => "cuda".to_string(),
        None => "host".to_string(),
    };
    let report = report(py, &all, &memory, reason, t0.elapsed().as_secs_f64())?;
    if many_module_bytes > 0 {
        report.set_item("module_bytes", many_module_bytes)?;
        if many_module_bytes == all.bytes {
            // The module served every range: peer to peer only if it moved every byte so.
            report.set_item("engine", "module")?;
            let path = if many_p2p_bytes == all.bytes {
                "p2p"
            } else {
                "bounce"
            };
            report.set_item("path", path)?;
        }
    }
    Ok((report, each.iter().map(|r| (r.bytes, r.eof)).collect()))
}

/// Copies within one GPU's memory, from the `src_len` bytes at `src` to the `dst_len` bytes at
/// `dst` (each inside one CUDA allocation, the two on one GPU, not overlapping): each `(dst
/// offset, src offset, length)` of `copies`, device to device, in one batch of the driver where
/// it allows (`CudaBackend::copy_device_many`). The destinations may not overlap. Work queued
/// on the GPU before the call is finished first; the copies are finished when it returns.
#[pyfunction]
fn cuda_copy_many(
    py: Python<'_>,
    dst: u64,
    dst_len: u64,
    src: u64,
    src_len: u64,
    copies: Vec<(u64, u64, u64)>,
) -> PyResult<()> {
    not_forked()?;
    let d = device_allocation(dst, dst_len)?;
    let s = device_allocation(src, src_len)?;
    if d.ordinal != s.ordinal {
        return Err(PyValueError::new_err(format!(
            "cuda_copy_many's source is on GPU {} and its destination on GPU {}: one GPU",
            s.ordinal, d.ordinal
        )));
    }
    if dst < src + src_len && src < dst + dst_len {
        return Err(PyValueError::new_err(
            "cuda_copy_many's source and destination overlap",
        ));
    }
    let mut spans = Vec::with_capacity(copies.len());
    let mut abs = Vec::with_capacity(copies.len());
    for &(doff, soff, n) in &copies {
        let inside = |off: u64, size: u64| off.checked_add(n).is_some_and(|end| end <= size);
        if !inside(doff, dst_len) || !inside(soff, src_len) {
            return Err(PyValueError::new_err(format!(
                "the copy of {n} bytes from {soff} to {doff} runs past its buffer \
                 ({src_len} bytes of source, {dst_len} of destination)"
            )));
        }
        if n > 0 {
            spans.push((doff, n));
            abs.push((dst + doff, src + soff, n));
        }
    }
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(PyValueError::new_err(
            "two destinations of cuda_copy_many overlap",
        ));
    }
    let engine = cuda_engine(d.ordinal)?;
    py.allow_threads(|| {
        engine.backend().synchronize_all()?;
        // SAFETY: every range lies in one of two live CUDA allocations of this GPU (checked
        // above; the caller holds them), which do not overlap, and the destinations are
        // disjoint; the work queued before was waited for.
        unsafe { engine.backend().copy_device_many(&abs) }
    })
    .map_err(py_err)
}

/// How `cuda_copy_many` copies on GPU `device`: `"kernel"` (one launch of the gather
/// kernel), `"batch"` (`cuMemcpyBatchAsync`) or `"each"` (a driver call per copy); `None`
/// without the CUDA driver library.
#[pyfunction]
fn cuda_copy_method(device: usize) -> PyResult<Option<&'static str>> {
    not_forked()?;
    if !gdirect::compat::driver_present() {
        return Ok(None);
    }
    Ok(cuda_engine(device)?.backend().copy_method())
}

/// Where a request's memory is: host memory, or device memory of a GPU (its ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    Host,
    Cuda(usize),
}

impl Place {
    /// The place of `len` bytes at `ptr`: host memory, or device memory checked to lie in one
    /// CUDA allocation.
    /// And the allocation it lies in, for device memory.
    fn of(cuda: bool, ptr: u64, len: u64) -> PyResult<(Self, Option<DeviceAllocation>)> {
        if !cuda {
            if ptr == 0 && len > 0 {
                return Err(PyValueError::new_err("a null memory address"));
            }
            return Ok((Self::Host, None));
        }
        let a = device_allocation(ptr, len)?;
        Ok((Self::Cuda(a.ordinal), Some(a)))
    }
}

/// One request of an asynchronous call: `len` bytes of `file` at `file_offset`, to or from the
/// memory at `ptr` (an address in the place it names).
struct Request {
    src: Arc<Source>,
    sink: Option<Arc<Sink>>,
    direct: Arc<Direct>,
    /// The CUDA allocation the memory lies in (device memory only).
    alloc: Option<DeviceAllocation>,
    file_offset: u64,
    ptr: u64,
    len: u64,
    place: Place,
    /// A read's memory needs no wait for the context's work: the work queued on it (its
    /// stream's) was waited for at the call (`settle`).
    settled: bool,
}

impl Request {
    /// The request as the module's path takes it (device memory only).
    fn cuda_io(&self) -> gdirect::Result<CudaIo<'_>> {
        Ok(CudaIo {
            direct: &self.direct,
            alloc: self.alloc.ok_or(Error::Worker {
                what: "a request on device memory without its allocation",
            })?,
            ptr: self.ptr,
            len: self.len,
            file_offset: self.file_offset,
        })
    }
}

/// Orders a read into the memory at `place` after the work queued on it: `stream` is the
/// stream its producer names (PyTorch's current stream, `__cuda_array_interface__`'s
/// `stream`; 0: none needed), waited for here, on the caller's thread (with `py`, the GIL
/// released only if it is busy; without, the caller released it). Returns whether that was
/// done; if not (host memory, or no stream known), the read waits for the whole context
/// instead.
fn settle(py: Option<Python<'_>>, place: Place, stream: Option<u64>) -> PyResult<bool> {
    let (Place::Cuda(o), Some(s)) = (place, stream) else {
        return Ok(false);
    };
    if s == 0 {
        return Ok(true);
    }
    let engine = cuda_engine(o)?;
    // SAFETY: `s` is the stream that the memory's producer (PyTorch, or the object's
    // `__cuda_array_interface__`) names for work on it, a stream of GPU `o`'s primary context
    // (the one CUDA runtimes use) or a default stream's handle; the producer keeps it alive.
    if !unsafe { engine.backend().stream_done(s) }.map_err(py_err)? {
        // SAFETY: as above.
        let wait = || unsafe { engine.backend().wait_stream(s) };
        match py {
            Some(py) => py.allow_threads(wait),
            None => wait(),
        }
        .map_err(py_err)?;
    }
    Ok(true)
}

/// The shared state of an asynchronous call: its requests' results as the threads running it
/// finish their parts, and who waits.
struct Pending {
    state: Mutex<PendingState>,
    ready: Condvar,
    /// Parts not started yet. Each has a turn on a `Starter` thread (unless the call is run
    /// where it was made: `start`'s `hand_off`), which runs one if any is left then; a thread
    /// that waits for the call runs them itself first, so a request waited for at once is not
    /// handed to another thread and back.
    queued: Mutex<Vec<Part>>,
    /// Every part has ended (`left` is 0), for a look without the lock.
    done: std::sync::atomic::AtomicBool,
    /// `FORKS` when the call was made.
    born: u64,
}

/// A part of an asynchronous call, ready to run: it reports to its `Pending` itself.
type Part = Box<dyn FnOnce() + Send>;

struct PendingState {
    /// Parts still running (a part is one engine call: a group of reads, or one write).
    left: usize,
    /// Bytes moved by each request, in the call's order.
    bytes: Vec<u64>,
    /// The first error a part met.
    error: Option<Error>,
    /// Called (with the GIL) when the last part ends: `add_done_callback`'s.
    callbacks: Vec<(Py<PyAny>, Py<Future>)>,
    /// Threads asleep in `wait` (no wake-up, a system call, is sent when there are none).
    waiters: usize,
}

impl Pending {
    fn new(requests: usize, parts: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(PendingState {
                left: parts,
                bytes: vec![0; requests],
                error: None,
                callbacks: Vec::new(),
                waiters: 0,
            }),
            ready: Condvar::new(),
            queued: Mutex::new(Vec::new()),
            done: std::sync::atomic::AtomicBool::new(parts == 0),
            born: FORKS.load(Ordering::Relaxed),
        })
    }

    /// Not ended, and made before a fork of which this process is the child: the threads that
    /// would end it are not here, and its locks may be held by them.
    fn orphaned(&self) -> bool {
        !self.is_done() && self.made_before_fork()
    }

    /// Made before a fork of which this process is the child (done or not).
    fn made_before_fork(&self) -> bool {
        self.born != FORKS.load(Ordering::Relaxed)
    }

    /// Locks `m`, one of this call's locks (or its future's): in a child forked after the call
    /// was made, only if it is free, as a thread that held it at the fork (ending the call just
    /// then) is not in the child to let it go; held, the call's end is not known here.
    fn lock_here<'a, T>(&self, m: &'a Mutex<T>) -> PyResult<MutexGuard<'a, T>> {
        if !self.made_before_fork() {
            return Ok(lock(m));
        }
        match m.try_lock() {
            Ok(g) => Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(fork_error()),
        }
    }

    /// Runs a part not started yet, if one is left: whether one was.
    fn run_one(&self) -> bool {
        let part = lock(&self.queued).pop();
        part.map(|p| p()).is_some()
    }

    /// Runs the parts nobody has started, then waits for the rest (no GIL held): for a short
    /// while by looking (a small block's I/O, which a `Starter` thread may have begun, ends in
    /// microseconds: sleeping and being woken would cost more), then asleep.
    fn help_and_wait(&self) {
        while self.run_one() {}
        let t0 = Instant::now();
        while !self.done.load(std::sync::atomic::Ordering::Acquire) {
            if t0.elapsed() > Duration::from_micros(50) {
                self.wait(None);
                return;
            }
            // (Yielding, not spinning: with many Python threads waiting, a spinning waiter
            // holds a CPU that the engine's threads need; see `gdirect::compat`'s `Waits`.)
            std::thread::yield_now();
        }
    }

    /// Part of the call has ended, with `bytes` for the requests it served (by index) or an
    /// error.
    fn part_done(&self, result: gdirect::Result<Vec<(usize, u64)>>) {
        let callbacks = {
            let mut st = lock(&self.state);
            match result {
                Ok(each) => {
                    for (i, n) in each {
                        st.bytes[i] = n;
                    }
                }
                Err(e) => {
                    st.error.get_or_insert(e);
                }
            }
            st.left -= 1;
            if st.left > 0 {
                return;
            }
            self.done.store(true, std::sync::atomic::Ordering::Release);
            if st.waiters > 0 {
                self.ready.notify_all();
            }
            std::mem::take(&mut st.callbacks)
        };
        if !callbacks.is_empty() {
            Python::with_gil(|py| {
                for (cb, fut) in callbacks {
                    if let Err(e) = cb.call1(py, (fut,)) {
                        e.write_unraisable(py, Some(cb.bind(py)));
                    }
                }
            });
        }
    }

    fn is_done(&self) -> bool {
        self.done.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until every part has ended, or `timeout` has passed: whether they have.
    fn wait(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = lock(&self.state);
        st.waiters += 1;
        while st.left > 0 {
            st = match deadline {
                None => self.ready.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    self.ready
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        st.waiters -= 1;
        st.left == 0
    }
}

/// An asynchronous read or write (`File.pread`, `File.pwrite`) or batch of them
/// (`read_batch`, `write_batch`), started by a `Starter` thread (or, a small request, run
/// before `pread`/`pwrite` returned: see `File::one`): `get()` waits for it (the
/// GIL released) and returns the bytes moved (a list of them, one per request, for a batch),
/// or raises what the first failed request met. It holds the memory of its requests until
/// they end; dropped before then, it waits for them.
#[pyclass(module = "gdirect._native", frozen)]
struct Future {
    pending: Arc<Pending>,
    /// What keeps the requests' memory alive (the Python half's handles): held, never read.
    #[allow(dead_code)]
    keep: Py<PyAny>,
    /// One request (`get` returns an int), not a batch (a list).
    single: bool,
    /// The error `get` raised, raised again by a later `get`.
    raised: Mutex<Option<PyErr>>,
    /// A single request's place in its issuing thread's count of futures whose result is not
    /// taken (`UNTAKEN`), and whether it has left it (at its first `get` that gets past the
    /// wait, whether it returns the bytes or raises the I/O's error, or when dropped).
    untaken: Option<(Arc<AtomicUsize>, AtomicBool)>,
}

impl Future {
    /// Leaves the issuing thread's count of futures whose result is not taken, once.
    fn taken(&self) {
        if let Some((count, left)) = &self.untaken {
            if !left.swap(true, Ordering::Relaxed) {
                count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

#[pymethods]
impl Future {
    /// Whether every request has ended (`get` will not wait).
    fn done(&self) -> bool {
        self.pending.is_done()
    }

    /// Waits for the requests to end (at most `timeout` seconds: `TimeoutError` after) and
    /// returns the bytes moved: an int, or a list of them for a batch.
    #[pyo3(signature = (timeout = None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyObject> {
        let timeout = timeout
            .map(|t| {
                // (NaN is refused; a negative timeout is 0, as concurrent.futures takes it.)
                Duration::try_from_secs_f64(if t < 0.0 { 0.0 } else { t })
                    .map_err(|_| PyValueError::new_err(format!("timeout {t}: not a duration")))
            })
            .transpose()?;
        if self.pending.orphaned() {
            return Err(fork_error());
        }
        if timeout.is_none() {
            if !self.pending.is_done() {
                py.allow_threads(|| self.pending.help_and_wait());
            }
        } else if !self.pending.is_done() && !py.allow_threads(|| self.pending.wait(timeout)) {
            return Err(PyTimeoutError::new_err(
                "the requests did not end within the timeout",
            ));
        }
        self.taken();
        let mut raised = self.pending.lock_here(&self.raised)?;
        if let Some(e) = &*raised {
            return Err(e.clone_ref(py));
        }
        let mut st = self.pending.lock_here(&self.pending.state)?;
        if let Some(e) = st.error.take() {
            let e = py_err(e);
            *raised = Some(e.clone_ref(py));
            return Err(e);
        }
        Ok(if self.single {
            st.bytes[0].into_pyobject(py)?.into_any().unbind()
        } else {
            st.bytes.clone().into_pyobject(py)?.into_any().unbind()
        })
    }

    /// Calls `fn(future)` when every request has ended: at once (in this thread) if they have,
    /// else from the engine's thread that ends the last one.
    fn add_done_callback(slf: &Bound<'_, Self>, callback: Py<PyAny>) -> PyResult<()> {
        let me = slf.get();
        if me.pending.orphaned() {
            return Err(fork_error());
        }
        {
            let mut st = me.pending.lock_here(&me.pending.state)?;
            if st.left > 0 {
                st.callbacks.push((callback, slf.clone().unbind()));
                return Ok(());
            }
        }
        callback.call1(slf.py(), (slf,))?;
        Ok(())
    }

    /// `await future`: the bytes moved, without blocking the event loop.
    fn __await__(slf: &Bound<'_, Self>) -> PyResult<PyObject> {
        let py = slf.py();
        let coro = py
            .import("gdirect")?
            .getattr("_await_future")?
            .call1((slf,))?;
        Ok(coro.call_method0("__await__")?.unbind())
    }

    fn __repr__(&self) -> String {
        let what = if self.single { "request" } else { "batch" };
        let (Ok(raised), Ok(st)) = (
            self.pending.lock_here(&self.raised),
            self.pending.lock_here(&self.pending.state),
        ) else {
            return format!("<gdirect.Future {what} of the parent process>");
        };
        let state = match st.left {
            0 if raised.is_some() || st.error.is_some() => "failed",
            0 => "done",
            _ => "running",
        };
        format!("<gdirect.Future {what} {state}>")
    }
}

impl Drop for Future {
    fn drop(&mut self) {
        self.taken();
        // The memory (`keep`) must outlive every DMA into or out of it. (In a child forked
        // while it ran, none runs: the threads doing it are not here.)
        if !self.pending.is_done() && !self.pending.orphaned() {
            Python::with_gil(|py| py.allow_threads(|| self.pending.help_and_wait()));
        }
    }
}

/// Starts `requests` (reads into memory, or writes out of it) on the engines' threads: reads
/// into the same place go to its engine as one vectored read, whose workers take their pieces
/// in turn; each write is its own part. `hand_off`: the parts are offered to the `Starter`
/// threads; if not, the caller must run them (`Pending::help_and_wait`) before it returns the
/// future (a `get` with a timeout, or `wait`, never runs parts).
fn start(
    read: bool,
    requests: Vec<Request>,
    keep: Py<PyAny>,
    single: bool,
    hand_off: bool,
) -> PyResult<Future> {
    if read {
        let mut ranges: Vec<(u64, u64)> = requests
            .iter()
            .filter(|r| r.len > 0)
            .map(|r| (r.ptr, r.len))
            .collect();
        ranges.sort_unstable();
        if ranges
            .windows(2)
            .any(|w| w[0].0.saturating_add(w[0].1) > w[1].0)
        {
            return Err(PyValueError::new_err(
                "two destinations of one batch of reads overlap",
            ));
        }
    }
    // The parts: groups of request indices, each with its engine.
    let mut groups: Vec<(Place, Vec<usize>)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if r.len == 0 {
            continue;
        }
        match groups.iter_mut().find(|g| read && g.0 == r.place) {
            Some(g) => g.1.push(i),
            None => groups.push((r.place, vec![i])),
        }
    }
    let mut engines = Vec::with_capacity(groups.len());
    for (place, _) in &groups {
        engines.push(match place {
            Place::Host => Engine::Host(host_engine()?),
            Place::Cuda(o) => Engine::Cuda(cuda_engine(*o)?),
        });
    }
    let pending = Pending::new(requests.len(), groups.len().max(1));
    if groups.is_empty() {
        pending.part_done(Ok(Vec::new()));
    }
    let requests = Arc::new(requests);
    let spawners = groups.len();
    {
        let mut queued = lock(&pending.queued);
        for ((_, idx), engine) in groups.into_iter().zip(engines) {
            let (me, requests) = (pending.clone(), requests.clone());
            queued.push(Box::new(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // SAFETY: every request's memory is as `File::read_host`/`read_cuda`
                    // (reads) or `write_host`/`write_cuda` (writes) require: checked by the
                    // Python half and `Place::of`, kept alive by the `Future`'s `keep` until
                    // this part ends (dropping the future runs or waits for it); reads'
                    // destinations do not overlap.
                    unsafe { engine.run(read, &requests, &idx) }
                }))
                .unwrap_or(Err(Error::Worker {
                    what: "an asynchronous request panicked",
                }));
                me.part_done(r);
            }));
        }
    }
    for _ in 0..if hand_off { spawners } else { 0 } {
        Starter::get().push(pending.clone());
    }
    Ok(Future {
        pending,
        keep,
        single,
        raised: Mutex::new(None),
        untaken: None,
    })
}

/// The threads that start asynchronous calls: each takes a call with a part not started yet
/// and runs that part (a thread that waits for the call may have run it first: then there is
/// nothing left to do). Made as needed, up to the engines' number of threads when the first call
/// started, and kept. They sleep on a condition variable when there is nothing to start, and a
/// call wakes one only if one sleeps and none is looking (a thread that has run a call looks
/// for the next for `STARTER_LOOKS` before it sleeps, on machines of `STARTER_LOOK_CPUS` CPUs
/// or more), else it makes one, or waits for a busy one.
struct Starter {
    queue: Mutex<StarterQueue>,
    wake: Condvar,
    /// Calls in `queue` (for a look without its lock).
    queued: AtomicUsize,
    /// Whether a thread that has run a call looks for the next (`STARTER_LOOKS`): only where
    /// the machine has `STARTER_LOOK_CPUS` CPUs for this process or more. A looking thread takes
    /// a CPU; on 2 (this project's CI machine) it took the caller's, and 1 in 100 of its
    /// 4 KiB `pread(...).get()` calls took 60 µs, not 6.
    looks: bool,
}

/// The largest request that `File.pread`/`pwrite` run in the calling thread before they return
/// (when it holds no other future whose result it has not taken), by default: a 4 KiB request
/// handed to a `Starter` thread cost a wake-up and a hand-off back, more than its I/O (as
/// KvikIO's `pread` into device memory runs a request below `gds_threshold` before returning).
const INLINE_SIZE: u64 = 64 << 10;

/// The largest request run in the calling thread: `configure(inline_size=...)`, else
/// `GDIRECT_INLINE_SIZE`, else `INLINE_SIZE`; `u64::MAX` until the first request reads it.
static INLINE: AtomicU64 = AtomicU64::new(u64::MAX);

fn inline_limit() -> PyResult<u64> {
    match INLINE.load(Ordering::Relaxed) {
        u64::MAX => {
            let n = inline_from_env()?;
            // (A `configure` meanwhile wins.)
            Ok(
                match INLINE.compare_exchange(u64::MAX, n, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => n,
                    Err(set) => set,
                },
            )
        }
        n => Ok(n),
    }
}

/// `GDIRECT_INLINE_SIZE`, or `INLINE_SIZE` when it is not set.
fn inline_from_env() -> PyResult<u64> {
    let bad = |v: &dyn std::fmt::Debug| {
        PyValueError::new_err(format!(
            "GDIRECT_INLINE_SIZE={v:?}: expected a size in bytes, with an optional K, M or G"
        ))
    };
    match std::env::var("GDIRECT_INLINE_SIZE") {
        Ok(v) => gdirect::compat::parse_size(&v)
            .map(|n| n.min(u64::MAX - 1))
            .ok_or_else(|| bad(&v)),
        Err(std::env::VarError::NotPresent) => Ok(INLINE_SIZE),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(&v)),
    }
}

/// This thread's count of `pread`/`pwrite` futures whose result it has not taken (for tests).
#[pyfunction]
fn _untaken() -> usize {
    UNTAKEN.with(|u| u.load(Ordering::Relaxed))
}

/// Holds `future`'s state lock on a thread of its own for `seconds` (at most 60), as the
/// engine's thread that ends a call holds it for an instant (for tests: a fork made meanwhile).
/// Returns once the lock is held (waiting for it with the GIL released).
#[pyfunction]
fn _hold_state(py: Python<'_>, future: &Bound<'_, Future>, seconds: f64) -> PyResult<()> {
    let hold = Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| *d <= Duration::from_secs(60))
        .ok_or_else(|| PyValueError::new_err(format!("{seconds}: not a duration of 0 to 60 s")))?;
    let pending = Arc::clone(&future.get().pending);
    let (held, is_held) = std::sync::mpsc::channel();
    // A thread of the package's: a child forked while it holds the lock is marked.
    threads_made();
    std::thread::spawn(move || {
        let _st = lock(&pending.state);
        let _ = held.send(());
        std::thread::sleep(hold);
    });
    py.allow_threads(move || is_held.recv())
        .map_err(|_| PyRuntimeError::new_err("the holding thread ended first"))
}

thread_local! {
    /// This thread's single-request futures whose result has not been taken (`get`) and that
    /// are not dropped: while it holds one, its next small request is not run at once.
    static UNTAKEN: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

/// How long a `Starter` thread that has run a call looks for the next before it sleeps.
const STARTER_LOOKS: Duration = Duration::from_micros(50);

/// The fewest CPUs on which a `Starter` thread looks for work before it sleeps.
const STARTER_LOOK_CPUS: usize = 4;

struct StarterQueue {
    calls: std::collections::VecDeque<Arc<Pending>>,
    /// Threads made; those asleep and not yet woken; wake-ups sent and not yet taken.
    threads: usize,
    idle: usize,
    wakes: usize,
    /// Threads that look for a call without sleeping (`STARTER_LOOKS`).
    looking: usize,
    /// The most threads to make: the engine's count when the first call was started.
    most: Option<usize>,
}

impl Starter {
    fn get() -> &'static Self {
        static STARTER: OnceLock<Starter> = OnceLock::new();
        STARTER.get_or_init(|| Starter {
            queue: Mutex::new(StarterQueue {
                calls: Default::default(),
                threads: 0,
                idle: 0,
                wakes: 0,
                looking: 0,
                most: None,
            }),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            looks: std::thread::available_parallelism().is_ok_and(|n| n.get() >= STARTER_LOOK_CPUS),
        })
    }

    /// Has a thread run one of `call`'s parts that nobody has started.
    fn push(&'static self, call: Arc<Pending>) {
        let mut q = lock(&self.queue);
        q.calls.push_back(call);
        self.queued.fetch_add(1, Ordering::Release);
        if q.looking > 0 {
            // A thread that has just finished looks for work before it sleeps: it takes this
            // without a wake-up (a system call here, and a scheduling delay there).
            return;
        }
        if q.idle > 0 {
            q.idle -= 1;
            q.wakes += 1;
            self.wake.notify_one();
            return;
        }
        // The engine's thread count, read once (the settings read the environment: not on
        // every request that finds every thread busy).
        let most = *q.most.get_or_insert_with(|| {
            lock(engines())
                .overrides
                .builder()
                .settings()
                .map_or(1, |s| s.threads)
        });
        threads_made();
        if q.threads < most
            && std::thread::Builder::new()
                .name("gdirect-start".into())
                .spawn(move || self.serve())
                .is_ok()
        {
            q.threads += 1;
        }
        // Else the busy threads take it when they are done, or a `get` runs it.
    }

    fn serve(&self) {
        let mut q = lock(&self.queue);
        loop {
            match q.calls.pop_front() {
                Some(call) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    drop(q);
                    call.run_one();
                    q = lock(&self.queue);
                    if !self.looks {
                        continue;
                    }
                    // Requests come in runs (a loop of `pread`s, a batch after a batch): look
                    // for the next one for a while before sleeping.
                    q.looking += 1;
                    drop(q);
                    let t0 = Instant::now();
                    while self.queued.load(Ordering::Acquire) == 0 && t0.elapsed() < STARTER_LOOKS {
                        for _ in 0..64 {
                            std::hint::spin_loop();
                        }
                    }
                    q = lock(&self.queue);
                    q.looking -= 1;
                }
                None => {
                    q.idle += 1;
                    while q.wakes == 0 {
                        q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                    }
                    q.wakes -= 1;
                }
            }
        }
    }
}

/// An engine of either kind.
enum Engine {
    Host(Arc<CompatEngine<HostBackend>>),
    Cuda(Arc<CompatEngine<CudaBackend>>),
}

impl Engine {
    /// Runs requests `idx` of `requests` (all in this engine's place): one vectored read, or
    /// each write in turn. Returns each request's bytes.
    ///
    /// # Safety
    ///
    /// Each request's memory is `len` bytes at `ptr` in this engine's place, valid (writable
    /// for reads) until this returns, and no Rust reference points into it; reads'
    /// destinations do not overlap.
    unsafe fn run(
        &self,
        read: bool,
        requests: &[Request],
        idx: &[usize],
    ) -> gdirect::Result<Vec<(usize, u64)>> {
        if read {
            let segs: Vec<Segment<'_>> = idx
                .iter()
                .map(|&i| Segment {
                    src: &requests[i].src,
                    file_offset: requests[i].file_offset,
                    len: requests[i].len,
                    mem_offset: 0,
                })
                .collect();
            let each = match self {
                Self::Host(e) => {
                    let ptrs: Vec<(*mut u8, u64)> = idx
                        .iter()
                        .map(|&i| (requests[i].ptr as usize as *mut u8, requests[i].len))
                        .collect();
                    // SAFETY: this function's contract.
                    unsafe { e.read_host_ptrs(&segs, &ptrs) }?.1
                }
                Self::Cuda(e) => {
                    let reads = idx
                        .iter()
                        .map(|&i| {
                            let r = &requests[i];
                            Ok(CudaRead {
                                src: &r.src,
                                io: r.cuda_io()?,
                            })
                        })
                        .collect::<gdirect::Result<Vec<_>>>()?;
                    let settled = idx.iter().all(|&i| requests[i].settled);
                    // SAFETY: this function's contract; when `settled`, the work queued on each
                    // destination was waited for (`settle`).
                    unsafe { read_cuda_many(e, &reads, settled) }?.1
                }
            };
            return Ok(idx.iter().zip(each).map(|(&i, r)| (i, r.bytes)).collect());
        }
        let mut out = Vec::with_capacity(idx.len());
        for &i in idx {
            let r = &requests[i];
            let sink = r.sink.as_deref().ok_or(Error::Worker {
                what: "a write request without a file open for writing",
            })?;
            let report = match self {
                // SAFETY: this function's contract.
                Self::Host(e) => unsafe {
                    e.write_host_ptr(sink, r.ptr as usize as *const u8, r.len, r.file_offset)
                },
                Self::Cuda(e) => {
                    // SAFETY: this function's contract.
                    match unsafe { via_module(&r.cuda_io()?, false, false, e) }? {
                        Ok(t) => {
                            out.push((i, t.bytes));
                            continue;
                        }
                        // SAFETY: this function's contract.
                        Err(_) => unsafe { e.write_device_ptr(sink, r.ptr, r.len, r.file_offset) },
                    }
                }
            }?;
            out.push((i, report.bytes));
        }
        Ok(out)
    }
}

/// A request of `submit`: `(file, file_offset, cuda, address, size, stream)`.
type PyRequest = (Py<File>, u64, bool, u64, u64, Option<u64>);

/// Starts a batch of requests, each `(file, file_offset, cuda, address, size, stream)`: reads into
/// memory (`read=True`) or writes out of it, on host memory or on any GPU's; returns its
/// `Future`. `keep` keeps the memory alive until the batch ends.
#[pyfunction]
#[pyo3(signature = (read, requests, keep))]
fn submit(
    py: Python<'_>,
    read: bool,
    requests: Vec<PyRequest>,
    keep: Py<PyAny>,
) -> PyResult<Future> {
    not_forked()?;
    let mut reqs = Vec::with_capacity(requests.len());
    let mut waited = Vec::new();
    // The CUDA allocations found so far: slots of one buffer ask the driver once. (They stay
    // allocated for the call: `keep` holds their owners.)
    let mut allocs: Vec<DeviceAllocation> = Vec::new();
    for (file, file_offset, cuda, ptr, len, stream) in requests {
        let f = file.get();
        let sink = if read { None } else { Some(f.sink()?.clone()) };
        let known = allocs.iter().find(|a| {
            ptr >= a.start
                && ptr
                    .checked_add(len)
                    .is_some_and(|end| end <= a.start + a.size)
        });
        let (place, alloc) = match known {
            _ if len == 0 => (Place::Host, None),
            Some(a) if cuda => (Place::Cuda(a.ordinal), Some(*a)),
            _ if cuda => {
                let a = device_allocation(ptr, len)?;
                allocs.push(a);
                (Place::Cuda(a.ordinal), Some(a))
            }
            _ => Place::of(false, ptr, len)?,
        };
        // Each stream waited for once.
        let settled = match stream {
            Some(s) if read && waited.contains(&(place, s)) => true,
            _ if read => {
                let done = settle(Some(py), place, stream)?;
                waited.extend(stream.filter(|_| done).map(|s| (place, s)));
                done
            }
            _ => false,
        };
        reqs.push(Request {
            src: f.src.clone(),
            sink,
            direct: f.direct.clone(),
            alloc,
            file_offset,
            ptr,
            len,
            place,
            settled,
        });
    }
    start(read, reqs, keep, false, true)
}

/// Sets the engines' settings (`None` keeps the environment's or the default); engines made
/// before are dropped, the next read makes new ones.
#[pyfunction]
#[pyo3(signature = (
    threads=None, task_size=None, page_cache=None, staging_size=None, keep_mapped=None,
    max_piece=None, inline_size=None
))]
#[allow(clippy::too_many_arguments)]
fn configure(
    threads: Option<usize>,
    task_size: Option<u64>,
    page_cache: Option<&str>,
    staging_size: Option<u64>,
    keep_mapped: Option<u64>,
    max_piece: Option<u64>,
    inline_size: Option<u64>,
) -> PyResult<()> {
    let page_cache = page_cache
        .map(|p| {
            PageCache::parse(p).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "page_cache={p:?}: expected auto, direct, buffered or mapped"
                ))
            })
        })
        .transpose()?;
    let overrides = Overrides {
        threads,
        task_size,
        page_cache,
        staging_size,
        keep_mapped,
        max_piece,
    };
    // Checked now, so that a bad value is an error of this call, not of a later read.
    overrides.builder().settings().map_err(py_err)?;
    // (`None`: the environment's again, read and checked now.)
    let inline = match inline_size {
        Some(n) => n.min(u64::MAX - 1),
        None => inline_from_env()?,
    };
    INLINE.store(inline, Ordering::Relaxed);
    let mut e = lock(engines());
    e.overrides = overrides;
    if FORKED.load(Ordering::Relaxed) {
        // (Engines made before the fork are not dropped here: their threads, which a drop
        // would wait for, and their CUDA contexts are the parent's.)
        std::mem::forget(e.host.take());
        std::mem::forget(std::mem::take(&mut e.cuda));
    }
    e.host = None;
    e.cuda.clear();
    Ok(())
}

/// The settings the next read uses (environment, then `configure`).
#[pyfunction]
fn settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = lock(engines())
        .overrides
        .builder()
        .settings()
        .map_err(py_err)?;
    let d = PyDict::new(py);
    d.set_item("threads", s.threads)?;
    d.set_item("task_size", s.task_size)?;
    d.set_item("page_cache", s.page_cache.name())?;
    d.set_item("staging_size", s.staging_size)?;
    d.set_item("keep_mapped", s.keep_mapped)?;
    d.set_item("max_piece", s.max_piece)?;
    d.set_item("inline_size", inline_limit()?)?;
    Ok(d)
}

/// What this process's engines have read so far (every engine, host and GPU).
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = gdirect::compat::stats();
    let d = PyDict::new(py);
    d.set_item("reads", s.reads)?;
    d.set_item("errors", s.errors)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("direct_bytes", s.direct_bytes)?;
    d.set_item("buffered_bytes", s.buffered_bytes)?;
    d.set_item("mapped_bytes", s.mapped_bytes)?;
    d.set_item("module_transfers", MODULE_TRANSFERS.load(Ordering::Relaxed))?;
    d.set_item("module_bytes", MODULE_BYTES.load(Ordering::Relaxed))?;
    d.set_item(
        "module",
        match module() {
            Ok(_) => "available",
            Err(why) => why.name(),
        },
    )?;
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<File>()?;
    m.add_class::<Future>()?;
    m.add_function(wrap_pyfunction!(submit, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(_untaken, m)?)?;
    m.add_function(wrap_pyfunction!(_hold_state, m)?)?;
    m.add_function(wrap_pyfunction!(read_many, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_json_error, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_layout, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_views, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_copy_many, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_copy_method, m)?)?;
    m.add_function(wrap_pyfunction!(settings, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
