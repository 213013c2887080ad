// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect._native`: the Rust half of the Python package. The Python half (`python/gdirect`)
//! turns destinations (CUDA arrays, tensors, host buffers) into an address and a length, checks
//! them, and keeps them alive for the call; this half checks device addresses against the CUDA
//! driver's allocations, reads with the library's compat engine with the GIL released, and maps
//! the library's errors onto Python's exceptions.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    time::Instant,
};

use gdirect::{
    compat::{
        Builder, CompatEngine, CudaBackend, DeviceAllocation, HostBackend, PageCache, Segment,
        Sink, Source,
    },
    CompatReason, CudaError, Driver, Error, Provider,
};
use pyo3::{
    exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyValueError},
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Settings given from Python (`gdirect.settings(...)`), over the environment's.
#[derive(Clone, Debug, Default)]
struct Overrides {
    threads: Option<usize>,
    task_size: Option<u64>,
    page_cache: Option<PageCache>,
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

fn host_engine() -> PyResult<Arc<CompatEngine<HostBackend>>> {
    let mut e = lock(engines());
    if let Some(h) = &e.host {
        return Ok(h.clone());
    }
    let h = Arc::new(e.overrides.builder().build_host().map_err(py_err)?);
    e.host = Some(h.clone());
    Ok(h)
}

fn cuda_engine(ordinal: usize) -> PyResult<Arc<CompatEngine<CudaBackend>>> {
    let mut e = lock(engines());
    if let Some(c) = e.cuda.get(&ordinal) {
        return Ok(c.clone());
    }
    let backend = CudaBackend::new(ordinal).map_err(py_err)?;
    let c = Arc::new(e.overrides.builder().build(backend).map_err(py_err)?);
    e.cuda.insert(ordinal, c.clone());
    Ok(c)
}

/// Why the module does not move the bytes for this process: found once. (The Python package
/// reads through the library's compat engine; a module that could serve is reported as such.)
fn compat_reason() -> &'static str {
    static REASON: OnceLock<&'static str> = OnceLock::new();
    REASON.get_or_init(|| {
        let reason = match Driver::open() {
            Err(e) => CompatReason::from_error(&e),
            Ok(d) => match d.info() {
                Ok(i) if !i.has_provider(Provider::Nvidia) => CompatReason::NoProvider,
                _ => return "module_not_used_from_python",
            },
        };
        reason.name()
    })
}

/// The report of one read, as a dict (the Python half makes it a `Report`).
fn report<'py>(
    py: Python<'py>,
    r: &gdirect::compat::Report,
    memory: &str,
    seconds: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", r.bytes)?;
    d.set_item("eof", r.eof)?;
    d.set_item("engine", "compat")?;
    d.set_item("reason", compat_reason())?;
    d.set_item("memory", memory)?;
    d.set_item("direct_bytes", r.direct_bytes)?;
    d.set_item("buffered_bytes", r.buffered_bytes)?;
    d.set_item("mapped_bytes", r.mapped_bytes)?;
    d.set_item("threads", r.threads)?;
    d.set_item("seconds", seconds)?;
    Ok(d)
}

/// Runs one engine call with the GIL released, timed, and makes its report (`memory` names
/// where the bytes were: `host` or `cuda:N`).
fn run_reported<'py>(
    py: Python<'py>,
    memory: &str,
    call: impl FnOnce() -> gdirect::Result<gdirect::compat::Report> + Send,
) -> PyResult<Bound<'py, PyDict>> {
    let t0 = Instant::now();
    let r = py.allow_threads(call).map_err(py_err)?;
    report(py, &r, memory, t0.elapsed().as_secs_f64())
}

/// The GPU of `len` bytes of device memory at `ptr`, checked to lie in one allocation the
/// CUDA driver knows: a range past the allocation's end is refused, not written.
fn device_range(ptr: u64, len: u64) -> PyResult<usize> {
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
    Ok(alloc.ordinal)
}

/// A file opened for reading, and for writing in mode `r+` or `w` (kept open: open once, read
/// and write many times).
#[pyclass(module = "gdirect._native", frozen)]
struct File {
    src: Source,
    sink: Option<Sink>,
}

#[pymethods]
impl File {
    #[new]
    #[pyo3(signature = (path, mode = "r"))]
    fn new(path: PathBuf, mode: &str) -> PyResult<Self> {
        // Opened for writing first: `w` makes the file the reading side then opens.
        let sink = match mode {
            "r" => None,
            "r+" => Some(Sink::open(&path, false, false).map_err(py_err)?),
            "w" => Some(Sink::open(&path, true, true).map_err(py_err)?),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "mode '{mode}': expected 'r', 'r+' or 'w'"
                )))
            }
        };
        Ok(Self {
            src: Source::open(path).map_err(py_err)?,
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
        if ptr == 0 && len > 0 {
            return Err(PyValueError::new_err("a null destination address"));
        }
        let engine = host_engine()?;
        run_reported(py, "host", || {
            // SAFETY: the Python half passes the address of a writable buffer of `len` bytes
            // that it keeps alive (a held memoryview) until this returns; no Rust reference
            // covers it (the engine writes it by raw copies), so Python threads touching it
            // meanwhile race with no reference.
            unsafe { engine.read_host_ptr(&self.src, ptr as *mut u8, len, 0, file_offset, len) }
        })
    }

    /// Reads `len` bytes at `file_offset` into CUDA device memory at `ptr`, which must lie in
    /// one allocation the CUDA driver knows (checked: an address range past the allocation's
    /// end is refused, not written).
    fn read_cuda<'py>(
        &self,
        py: Python<'py>,
        ptr: u64,
        len: u64,
        file_offset: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        if len == 0 {
            // An empty array (its pointer may be 0, in no allocation): nothing to read.
            return run_reported(py, "cuda", || Ok(Default::default()));
        }
        let ordinal = device_range(ptr, len)?;
        let engine = cuda_engine(ordinal)?;
        run_reported(py, &format!("cuda:{ordinal}"), || {
            // SAFETY: `ptr..ptr + len` lies in a live device allocation of GPU `ordinal`
            // (checked above), whose engine uses that GPU's primary context (the one CUDA
            // runtimes such as PyTorch's and CuPy's allocate in); the Python half keeps the
            // array alive until this returns.
            unsafe { engine.read_device_ptr(&self.src, ptr, len, 0, file_offset, len) }
        })
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
        let sink = self.sink()?;
        if ptr == 0 && len > 0 {
            return Err(PyValueError::new_err("a null source address"));
        }
        let engine = host_engine()?;
        run_reported(py, "host", || {
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
        let sink = self.sink()?;
        if len == 0 {
            return run_reported(py, "cuda", || Ok(Default::default()));
        }
        let ordinal = device_range(ptr, len)?;
        let engine = cuda_engine(ordinal)?;
        run_reported(py, &format!("cuda:{ordinal}"), || {
            // SAFETY: `ptr..ptr + len` lies in a live device allocation of GPU `ordinal`
            // (checked above), whose engine uses that GPU's primary context; the Python half
            // keeps the array alive until this returns.
            unsafe { engine.write_device_ptr(sink, ptr, len, file_offset) }
        })
    }
}

impl File {
    fn sink(&self) -> PyResult<&Sink> {
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
    if cuda {
        for &(_, ptr, len, _) in &reads {
            if len == 0 {
                continue;
            }
            let o = device_range(ptr, len)?;
            if ordinal.is_some_and(|prev| prev != o) {
                return Err(PyValueError::new_err(
                    "read_many's destinations are on more than one GPU: one call per GPU",
                ));
            }
            ordinal = Some(o);
        }
    }
    let t0 = Instant::now();
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
            let ptrs: Vec<(u64, u64)> = reads.iter().map(|r| (r.1, r.2)).collect();
            py.allow_threads(|| {
                // SAFETY: as in `File::read_cuda`, for each range (checked above against its
                // allocation on this GPU); they do not overlap (checked above).
                unsafe { engine.read_device_ptrs(&segs, &ptrs) }
            })
            .map_err(py_err)?
        }
    };
    let memory = match ordinal {
        Some(o) => format!("cuda:{o}"),
        None if cuda => "cuda".to_string(),
        None => "host".to_string(),
    };
    Ok((
        report(py, &all, &memory, t0.elapsed().as_secs_f64())?,
        each.iter().map(|r| (r.bytes, r.eof)).collect(),
    ))
}

/// Sets the engines' settings (`None` keeps the environment's or the default); engines made
/// before are dropped, the next read makes new ones.
#[pyfunction]
#[pyo3(signature = (threads=None, task_size=None, page_cache=None))]
fn configure(
    threads: Option<usize>,
    task_size: Option<u64>,
    page_cache: Option<&str>,
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
    };
    // Checked now, so that a bad value is an error of this call, not of a later read.
    overrides.builder().settings().map_err(py_err)?;
    let mut e = lock(engines());
    e.overrides = overrides;
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
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<File>()?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(read_many, m)?)?;
    m.add_function(wrap_pyfunction!(settings, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
