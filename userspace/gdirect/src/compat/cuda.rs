// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The CUDA backend: pinned staging buffers and a stream per worker, and page-cache mappings
//! registered read-only with the driver so the GPU copies straight out of the page cache.
//! CUDA is loaded at run time (cudarc's dynamic loading): nothing here is needed to build.

use std::{ffi::c_void, ops::Range, ptr::NonNull, sync::Arc};

use cudarc::driver::{
    sys::{self, CUdeviceptr, CUevent, CUresult, CUstream},
    CudaContext, CudaSlice, DevicePtrMut, DriverError,
};

use super::{Backend, Lane};
use crate::error::{Error, Result};

pub(super) fn cuda(what: &'static str, r: CUresult) -> Result<()> {
    r.result().map_err(|e| cuda_err(what, e))
}

pub(crate) fn cuda_err(what: &'static str, e: DriverError) -> Error {
    Error::Cuda {
        what,
        error: e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0)),
    }
}

/// How the engine waits for work it queued on the GPU, in the current context.
///
/// The driver's own waits (`cuEventSynchronize`, `cuStreamSynchronize`) spin without yielding
/// when the process has fewer contexts than CPUs (`CU_CTX_SCHED_AUTO`, the flags of a context
/// that PyTorch or CuPy made): each engine thread waiting for its copy then holds a CPU that
/// another thread needs for its own copy out of the page cache. Asking the driver and yielding
/// the CPU between asks (`sched_yield`), as `CU_CTX_SCHED_YIELD` does, lets a busy machine's
/// threads run (BENCHMARKS.md, "How the engine's threads wait"); every other context (`AUTO`,
/// `SPIN`, `YIELD`) is waited for so. A context made with `CU_CTX_SCHED_BLOCKING_SYNC` is
/// waited for as its owner chose: asleep, by the driver. These are the waits for the engine's
/// own copies (its lanes, its device-to-host copies) and for a caller's stream
/// ([`CudaBackend::wait_stream`]); a wait for a whole context (`cuCtxSynchronize`) or for a
/// cudarc stream is the driver's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waits {
    Yield,
    Block,
}

impl Waits {
    /// The current context's way (`Yield` when the driver cannot say).
    pub(super) fn of_current() -> Self {
        let mut flags = 0;
        // SAFETY: `flags` receives the current context's flags.
        let r = unsafe { sys::cuCtxGetFlags(&mut flags) };
        let sched = flags & sys::CUctx_flags::CU_CTX_SCHED_MASK as u32;
        if r == CUresult::CUDA_SUCCESS
            && sched == sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32
        {
            Self::Block
        } else {
            Self::Yield
        }
    }

    /// Waits for the work queued on `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context, or `CU_STREAM_LEGACY` (1) or
    /// `CU_STREAM_PER_THREAD` (2).
    pub(super) unsafe fn stream(self, stream: CUstream) -> Result<()> {
        cuda(
            "stream synchronize",
            match self {
                // SAFETY: the caller's promise.
                Self::Yield => ask_until_ready(|| unsafe { sys::cuStreamQuery(stream) }),
                // SAFETY: the caller's promise.
                Self::Block => unsafe { sys::cuStreamSynchronize(stream) },
            },
        )
    }

    /// Waits for the work before `event`'s last record.
    ///
    /// # Safety
    ///
    /// `event` is a live event of the current context.
    pub(super) unsafe fn event(self, event: CUevent) -> Result<()> {
        cuda(
            "waiting for a copy",
            match self {
                // SAFETY: the caller's promise.
                Self::Yield => ask_until_ready(|| unsafe { sys::cuEventQuery(event) }),
                // SAFETY: the caller's promise.
                Self::Block => unsafe { sys::cuEventSynchronize(event) },
            },
        )
    }
}

/// Asks `query` until it answers other than "not ready", yielding between asks: its answer.
fn ask_until_ready(mut query: impl FnMut() -> CUresult) -> CUresult {
    loop {
        match query() {
            CUresult::CUDA_ERROR_NOT_READY => std::thread::yield_now(),
            r => return r,
        }
    }
}

/// A CUDA context made current on this thread by pushing it (`cuCtxPushCurrent`), popped when
/// dropped: the thread's own current context, if it had one, is current again. The engine works
/// on its caller's thread too, and a library must not leave that thread bound to its context.
/// (When the context is current already nothing is pushed, so nothing is popped.)
pub struct Entered {
    pushed: bool,
    /// Popped on the thread that pushed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Entered {
    pub(crate) fn push(ctx: &CudaContext) -> Result<Self> {
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `current` receives the calling thread's current context, or null.
        cuda("reading the current context", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current == ctx.cu_ctx() {
            return Ok(Self {
                pushed: false,
                _thread: std::marker::PhantomData,
            });
        }
        // SAFETY: the context is alive (`ctx` holds it) and owned by cudarc, which is not told:
        // a push makes it current without taking it, and the pop in `drop` undoes it.
        cuda("pushing the context", unsafe {
            sys::cuCtxPushCurrent_v2(ctx.cu_ctx())
        })?;
        Ok(Self {
            pushed: true,
            _thread: std::marker::PhantomData,
        })
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: this thread pushed the context (`Entered` is not `Send`) and pops it
            // once; `popped` receives it.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// Where a CUDA device pointer points: the device, and the allocation holding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAllocation {
    /// The CUDA device ordinal.
    pub ordinal: usize,
    /// The allocation's first address.
    pub start: u64,
    /// Its size in bytes.
    pub size: u64,
}

impl DeviceAllocation {
    /// The allocation of device memory that holds `ptr`, as the driver knows it
    /// (`cuPointerGetAttributes`, one call): an error for host memory, or an address no
    /// allocation holds.
    pub fn of(ptr: u64) -> Result<Self> {
        if !driver_present() {
            return Err(Error::Cuda {
                what: "loading the driver library",
                error: "libcuda.so was not found: is the NVIDIA driver installed?".into(),
            });
        }
        // Once: every request asks this (cuInit takes the driver's lock each time).
        static INIT: std::sync::OnceLock<std::result::Result<(), DriverError>> =
            std::sync::OnceLock::new();
        (*INIT.get_or_init(cudarc::driver::result::init))
            .map_err(|e| cuda_err("initialisation", e))?;
        let mut mem_type: u32 = 0;
        let mut ordinal: i32 = -1;
        let mut start: CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut attrs = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data: [*mut c_void; 4] = [
            (&raw mut mem_type).cast(),
            (&raw mut ordinal).cast(),
            (&raw mut start).cast(),
            (&raw mut size).cast(),
        ];
        // SAFETY: one call for the four attributes: each `data` entry points to a value of its
        // attribute's type (an unsigned int for the memory type, an int for the ordinal, a
        // device pointer for the start, a size_t). A pointer the driver does not know leaves
        // them at their defaults (memory type 0), refused below.
        cuda("pointer query", unsafe {
            sys::cuPointerGetAttributes(
                attrs.len() as u32,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr,
            )
        })?;
        if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(Error::Cuda {
                what: "pointer query",
                error: format!("{ptr:#x} is not device memory (memory type {mem_type})"),
            });
        }
        Ok(Self {
            ordinal: usize::try_from(ordinal).map_err(|_| Error::Cuda {
                what: "pointer query",
                error: format!("{ptr:#x} has no device ordinal"),
            })?,
            start,
            size: size as u64,
        })
    }
}

/// Whether the CUDA driver library can be loaded (cudarc panics on first use when it cannot).
pub fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: loads the driver library by its usual names, running its initialisers, as any
    // CUDA program does at start.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The number of CUDA devices this process can use: 0 where the driver library is missing or
/// cannot be initialised (no GPU, a driver without devices, `CUDA_VISIBLE_DEVICES` empty).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// A CUDA device as the driver describes it, without making a context: its PCI function and
/// its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Its CUDA ordinal.
    pub ordinal: usize,
    /// Its PCI function (`CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`, `_BUS_ID`, `_DEVICE_ID`; function 0).
    pub pci: crate::PciAddress,
    /// Its memory in bytes (`cuDeviceTotalMem`).
    pub total_memory: u64,
}

/// Every CUDA device this process can use (none where the driver library is missing).
pub fn device_facts() -> Vec<DeviceFacts> {
    use cudarc::driver::result::device;
    use sys::CUdevice_attribute as A;
    (0..device_count())
        .filter_map(|ordinal| {
            let dev = device::get(i32::try_from(ordinal).ok()?).ok()?;
            // SAFETY: `dev` came from `cuDeviceGet` (the driver is initialised: `device_count`
            // succeeded).
            let attr = |a| unsafe { device::get_attribute(dev, a) }.ok();
            let (domain, bus, slot) = (
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
            );
            // SAFETY: as above.
            let total_memory = unsafe { device::total_mem(dev) }.ok()? as u64;
            let pci = format!("{domain:04x}:{bus:02x}:{slot:02x}.0")
                .parse()
                .ok()?;
            Some(DeviceFacts {
                ordinal,
                pci,
                total_memory,
            })
        })
        .collect()
}

/// GPU memory as the destination, on one CUDA context.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    prefer_mapped: bool,
    hugepages: bool,
    /// The gather kernel of [`CudaBackend::copy_device_many`], loaded into the context at its
    /// first use (`None` inside: the driver refused it, or it is not wanted: [`gather_wanted`]).
    gather: Arc<std::sync::OnceLock<Option<Gather>>>,
}

impl CudaBackend {
    /// The backend of GPU `ordinal` (its primary context). Fails with [`Error::Cuda`], not a
    /// panic, where the CUDA driver library is missing.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::Cuda {
                what: "loading the driver library",
                error: "libcuda.so was not found: is the NVIDIA driver installed?".into(),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err("context creation", e))?;
        Ok(Self::from_context(ctx))
    }

    /// The backend of an existing context.
    pub fn from_context(ctx: Arc<CudaContext>) -> Self {
        Self {
            ctx,
            gather: Arc::default(),
            prefer_mapped: false,
            hugepages: std::env::var_os("GDIRECT_HUGEPAGES").is_none_or(|v| v != "0"),
        }
    }

    /// Whether cached data goes by registered mapping (`true`) or buffered reads (`false`, the
    /// default: registration costs more than it saves unless kept for later reads) under
    /// `PageCache::Auto`.
    pub fn prefer_mapped(mut self, on: bool) -> Self {
        self.prefer_mapped = on;
        self
    }

    /// Staging buffers in transparent huge pages, registered with the driver (`true`, unless
    /// `GDIRECT_HUGEPAGES=0`), or from `cuMemHostAlloc`.
    pub fn hugepages(mut self, on: bool) -> Self {
        self.hugepages = on;
        self
    }

    /// Waits for all work queued on the context, on any stream, from any thread (the context
    /// is made current for the wait and the thread left as it was): `cuCtxSynchronize`.
    pub fn synchronize_all(&self) -> Result<()> {
        let _entered = super::Backend::enter_thread(self)?;
        self.synchronize()
    }

    /// Waits for all work queued on the context (its current thread must have it current).
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; the caller made the context current.
        cuda("context synchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Whether the work queued on `stream` has finished (`cuStreamQuery`), asked in this
    /// backend's context: the cheap first half of [`CudaBackend::wait_stream`].
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of this backend's context, or `CU_STREAM_LEGACY` (1) or
    /// `CU_STREAM_PER_THREAD` (2), which name the calling thread's default streams.
    pub unsafe fn stream_done(&self, stream: u64) -> Result<bool> {
        let _entered = Entered::push(&self.ctx)?;
        // SAFETY: the caller's promise for the handle; the context is current.
        match unsafe { sys::cuStreamQuery(stream as sys::CUstream) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => cuda("stream query", r).map(|()| true),
        }
    }

    /// Waits for the work queued on `stream` (asking the driver and yielding the CPU, unless
    /// the context was made to sleep while waiting), in this backend's context: how a read into
    /// memory that a stream's work uses is ordered after that work, without waiting for the
    /// whole context (every other stream, the engine's own copies).
    ///
    /// # Safety
    ///
    /// As [`CudaBackend::stream_done`].
    pub unsafe fn wait_stream(&self, stream: u64) -> Result<()> {
        let _entered = Entered::push(&self.ctx)?;
        // SAFETY: the caller's promise for the handle; the context is current.
        unsafe { Waits::of_current().stream(stream as sys::CUstream) }
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies within the GPU's memory: each `(dst, src, len)` of `copies`, device to device,
    /// on a stream of its own, and waits for them. All of them by one launch of a gather
    /// kernel (PTX, compiled by the driver when first used in the context) unless
    /// `GDIRECT_GATHER_KERNEL=0` says not to, where the driver takes it;
    /// otherwise by one call of the driver for up to 4096 copies where it has
    /// `cuMemcpyBatchAsync` (CUDA 12.8 and later), one call each where it has not. (The
    /// driver's copies cost about 4 µs each on an H200, batched or not: a checkpoint's
    /// 20,000 small tensors, 80 ms; the kernel moves them in one launch.)
    ///
    /// # Safety
    ///
    /// Every range is device memory of this context, alive until the call returns, and no
    /// other work touches the destinations meanwhile, nor writes the sources; no destination
    /// overlaps a source or another destination.
    pub unsafe fn copy_device_many(&self, copies: &[(u64, u64, u64)]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let _entered = Entered::push(&self.ctx)?;
        let stream = OwnStream::new()?;
        if let Some(gather) = self.gather() {
            // SAFETY: the ranges are this function's caller's promise; the stream is ours
            // and the context current.
            unsafe { gather.run(copies, &stream) }?;
            return stream.synchronize();
        }
        for chunk in copies.chunks(BATCH) {
            match memcpy_batch() {
                Some(f) => {
                    let mut dsts: Vec<CUdeviceptr> = chunk.iter().map(|c| c.0).collect();
                    let mut srcs: Vec<CUdeviceptr> = chunk.iter().map(|c| c.1).collect();
                    let mut sizes: Vec<usize> = chunk.iter().map(|c| c.2 as usize).collect();
                    let device = MemLocation {
                        kind: 1, // CU_MEM_LOCATION_TYPE_DEVICE
                        id: self.ctx.ordinal() as i32,
                    };
                    let mut attrs = MemcpyAttributes {
                        src_access_order: 1, // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
                        src_loc_hint: device,
                        dst_loc_hint: device,
                        flags: 0,
                    };
                    let mut attr_idx: usize = 0;
                    let mut fail_idx: usize = usize::MAX;
                    // SAFETY: the arrays hold `chunk.len()` entries each, one attribute set
                    // applies from copy 0; the ranges are the caller's promise; the stream is
                    // ours and the context current.
                    let r = unsafe {
                        f(
                            dsts.as_mut_ptr(),
                            srcs.as_mut_ptr(),
                            sizes.as_mut_ptr(),
                            chunk.len(),
                            &mut attrs,
                            &mut attr_idx,
                            1,
                            &mut fail_idx,
                            stream.0,
                        )
                    };
                    if r.result().is_err() {
                        // A driver that refuses the batch (its arguments checked before any
                        // copy is queued) gets one call per copy from now on: the copies are
                        // made again from sources nothing writes.
                        BATCH_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
                        stream.synchronize()?;
                        Self::copy_each(chunk, &stream)?;
                    }
                }
                None => Self::copy_each(chunk, &stream)?,
            }
        }
        stream.synchronize()
    }

    /// How [`CudaBackend::copy_device_many`] copies: `"kernel"` (the gather kernel: loaded
    /// into this context, or not tried yet and not switched off), `"batch"`
    /// (`cuMemcpyBatchAsync`: the driver has it, has not refused it, and
    /// `GDIRECT_NO_BATCH_COPY` is not set) or `"each"` (a call per copy); `None` without
    /// the driver library.
    pub fn copy_method(&self) -> Option<&'static str> {
        // (Without the driver library, no lookup: cudarc would panic.)
        if !driver_present() {
            return None;
        }
        let kernel = match self.gather.get() {
            Some(loaded) => loaded.is_some(),
            None => gather_wanted(),
        };
        Some(if kernel {
            "kernel"
        } else if memcpy_batch().is_some() {
            "batch"
        } else {
            "each"
        })
    }

    /// The gather kernel, loaded into the context at the first call (which must have it
    /// current); `None` where it is not wanted ([`gather_wanted`]) or the driver refused it.
    fn gather(&self) -> Option<&Gather> {
        self.gather
            .get_or_init(|| {
                if !gather_wanted() {
                    return None;
                }
                Gather::load(&self.ctx).ok()
            })
            .as_ref()
    }

    /// One `cuMemcpyDtoDAsync` per copy, on `stream` (see [`CudaBackend::copy_device_many`]).
    fn copy_each(copies: &[(u64, u64, u64)], stream: &OwnStream) -> Result<()> {
        for &(dst, src, len) in copies {
            // SAFETY: the ranges are `copy_device_many`'s caller's promise; the stream is ours
            // and the context current.
            cuda("device copy", unsafe {
                sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, stream.0)
            })?;
        }
        Ok(())
    }
}

/// The most copies [`CudaBackend::copy_device_many`] hands the driver in one batch.
const BATCH: usize = 4096;

/// Whether [`CudaBackend::copy_device_many`] uses the gather kernel: `GDIRECT_GATHER_KERNEL`
/// `1` (yes) or `0` (no), else [`GATHER_BY_DEFAULT`].
fn gather_wanted() -> bool {
    match std::env::var("GDIRECT_GATHER_KERNEL") {
        Ok(v) => v.trim() == "1",
        Err(_) => GATHER_BY_DEFAULT,
    }
}

/// Yes: besides its PTX's interpreter and `ptxas` (tests/gpu/gather_ptx_test.py), the kernel
/// has moved every range of `tests_gpu`'s copies exactly on a GPU (an H100, driver 580, with
/// `GDIRECT_GATHER_KERNEL=1`: tests/bench/results/tests-gpu-gather-h100.txt), and loaded the
/// 20,000-tensor checkpoint of tests/bench/many_tensors.py with the same tensors as
/// safetensors' in 0.186 s against the driver's copies' 0.211 (median of 5).
const GATHER_BY_DEFAULT: bool = true;

/// The gather kernel, in PTX: the driver compiles it for its GPU when the module is loaded
/// (no CUDA toolkit is needed to build or to run). Block `b` takes descriptors `b`,
/// `b + gridDim.x`, ... of `descs` (`count` of them, each `{u64 dst, u64 src, u64 len}`, the
/// addresses global ones) and its threads copy the bytes: 16-byte words where `dst`, `src`
/// and `len` are all multiples of 16, single bytes otherwise (the small tensors of a
/// checkpoint start where their dtype's size divides the offset at best). What one block
/// copies at a time is at most [`GATHER_PIECE`] bytes (longer copies are cut), so that no
/// long copy keeps one block busy while the others are done.
const GATHER_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64

.visible .entry gdirect_gather(
	.param .u64 gdirect_gather_descs,
	.param .u32 gdirect_gather_count
)
{
	.reg .pred %p<4>;
	.reg .b16 %rs<2>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<13>;

	ld.param.u64 %rd1, [gdirect_gather_descs];
	ld.param.u32 %r1, [gdirect_gather_count];
	cvta.to.global.u64 %rd1, %rd1;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %nctaid.x;
	mov.u32 %r4, %tid.x;
	mov.u32 %r5, %ntid.x;
	cvt.u64.u32 %rd2, %r4;
	cvt.u64.u32 %rd3, %r5;
$L_desc:
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra $L_done;
	mul.wide.u32 %rd4, %r2, 24;
	add.s64 %rd4, %rd1, %rd4;
	ld.global.u64 %rd5, [%rd4];
	ld.global.u64 %rd6, [%rd4+8];
	ld.global.u64 %rd7, [%rd4+16];
	cvta.to.global.u64 %rd5, %rd5;
	cvta.to.global.u64 %rd6, %rd6;
	or.b64 %rd8, %rd5, %rd6;
	or.b64 %rd8, %rd8, %rd7;
	and.b64 %rd8, %rd8, 15;
	setp.ne.s64 %p2, %rd8, 0;
	@%p2 bra $L_bytes;
	shl.b64 %rd9, %rd2, 4;
	shl.b64 %rd10, %rd3, 4;
$L_words:
	setp.ge.u64 %p3, %rd9, %rd7;
	@%p3 bra $L_next;
	add.s64 %rd11, %rd6, %rd9;
	add.s64 %rd12, %rd5, %rd9;
	ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd11];
	st.global.v4.u32 [%rd12], {%r6, %r7, %r8, %r9};
	add.s64 %rd9, %rd9, %rd10;
	bra $L_words;
$L_bytes:
	mov.u64 %rd9, %rd2;
$L_byte:
	setp.ge.u64 %p3, %rd9, %rd7;
	@%p3 bra $L_next;
	add.s64 %rd11, %rd6, %rd9;
	add.s64 %rd12, %rd5, %rd9;
	ld.global.u8 %rs1, [%rd11];
	st.global.u8 [%rd12], %rs1;
	add.s64 %rd9, %rd9, %rd3;
	bra $L_byte;
$L_next:
	add.s32 %r2, %r2, %r3;
	bra $L_desc;
$L_done:
	ret;
}
\0";

/// The most bytes one descriptor of the gather kernel copies (a multiple of 16, so that the
/// pieces of an aligned copy stay aligned).
const GATHER_PIECE: u64 = 64 << 10;

/// The gather kernel's threads per block, and its most blocks (each takes descriptors in
/// turn past that).
const GATHER_THREADS: u32 = 256;
const GATHER_BLOCKS: u32 = 1 << 16;

/// The gather kernel loaded into a context: its module (unloaded when dropped) and function.
struct Gather {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
}

// SAFETY: a module and its function are handles of the context, usable from any thread that
// makes the context current (every use pushes it).
unsafe impl Send for Gather {}
// SAFETY: as for `Send`; launching the function does not change it.
unsafe impl Sync for Gather {}

impl std::fmt::Debug for Gather {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gather")
            .field("module", &self.module)
            .finish()
    }
}

impl Gather {
    /// Compiles and loads the kernel into `ctx`, which the caller made current.
    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut module = std::ptr::null_mut();
        // SAFETY: `GATHER_PTX` is a NUL-terminated PTX text; `module` receives the handle.
        cuda("loading the gather kernel", unsafe {
            sys::cuModuleLoadData(&mut module, GATHER_PTX.as_ptr().cast())
        })?;
        let mut function = std::ptr::null_mut();
        // SAFETY: our loaded module; the name is NUL-terminated.
        let found = cuda("finding the gather kernel", unsafe {
            sys::cuModuleGetFunction(&mut function, module, c"gdirect_gather".as_ptr())
        });
        let gather = Self {
            ctx: ctx.clone(),
            module,
            function,
        };
        found.map(|()| gather)
    }

    /// Queues the copies on `stream`: descriptors of at most [`GATHER_PIECE`] bytes each,
    /// put in device memory (freed before this returns, after the kernel is done with them),
    /// and one launch. The caller waits for the stream.
    ///
    /// # Safety
    ///
    /// As [`CudaBackend::copy_device_many`]'s; `stream` is a live stream of the context,
    /// which is current.
    unsafe fn run(&self, copies: &[(u64, u64, u64)], stream: &OwnStream) -> Result<()> {
        let descs = gather_table(copies);
        if descs.is_empty() {
            return Ok(());
        }
        let count = u32::try_from(descs.len()).map_err(|_| Error::Cuda {
            what: "the gather kernel",
            error: format!("{} copies: more than one launch takes", descs.len()),
        })?;
        let bytes = std::mem::size_of_val(descs.as_slice());
        let table = DeviceAlloc::new(bytes)?;
        // SAFETY: `bytes` bytes of our host vector into our allocation of `bytes`; the
        // copy from pageable memory has read the vector when the call returns.
        cuda("copying the gather kernel's table", unsafe {
            sys::cuMemcpyHtoDAsync_v2(table.0, descs.as_ptr().cast(), bytes, stream.0)
        })?;
        let mut table_arg = table.0;
        let mut count_arg = count;
        let mut params = [
            (&raw mut table_arg).cast::<c_void>(),
            (&raw mut count_arg).cast::<c_void>(),
        ];
        // SAFETY: the function takes (u64, u32), whose addresses `params` holds; the
        // descriptors name ranges the caller vouches for, and the table lives until the
        // stream is done (below).
        let launched = cuda("launching the gather kernel", unsafe {
            sys::cuLaunchKernel(
                self.function,
                count.min(GATHER_BLOCKS),
                1,
                1,
                GATHER_THREADS,
                1,
                1,
                0,
                stream.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
        // The table is freed only after the work that reads it (an error included).
        let done = stream.synchronize();
        drop(table);
        launched.and(done)
    }
}

/// The gather kernel's descriptors of `copies`: each `(dst, src, len)` cut into pieces of at
/// most [`GATHER_PIECE`] bytes, in order; empty copies none.
fn gather_table(copies: &[(u64, u64, u64)]) -> Vec<[u64; 3]> {
    let mut descs = Vec::with_capacity(copies.len());
    for &(dst, src, len) in copies {
        let mut at = 0;
        while at < len {
            let n = (len - at).min(GATHER_PIECE);
            descs.push([dst + at, src + at, n]);
            at += n;
        }
    }
    descs
}

impl Drop for Gather {
    fn drop(&mut self) {
        // (A context that cannot be made current is gone, and its modules with it.)
        if let Ok(_entered) = Entered::push(&self.ctx) {
            // SAFETY: our module, unloaded once, in its context; nothing runs it any more
            // (every launch was waited for).
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// Device memory of the current context, freed when dropped (by a thread with the context
/// current, after the work that uses it).
struct DeviceAlloc(CUdeviceptr);

impl DeviceAlloc {
    fn new(bytes: usize) -> Result<Self> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: the caller made a context current; `p` receives the allocation.
        cuda("device allocation", unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes)
        })?;
        Ok(Self(p))
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: our allocation, freed once, its users done (the type's contract).
        let _ = unsafe { sys::cuMemFree_v2(self.0) };
    }
}

/// `CUmemLocation` (CUDA 12.8's layout: a type and an id, 8 bytes; later releases make the id
/// a union of the same size).
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: u32,
    id: i32,
}

/// `CUmemcpyAttributes`, as CUDA 12.8 defines it.
#[repr(C)]
struct MemcpyAttributes {
    src_access_order: u32,
    src_loc_hint: MemLocation,
    dst_loc_hint: MemLocation,
    flags: u32,
}

/// `cuMemcpyBatchAsync` as CUDA 12.8 declares it (the symbol without `_v2`, which later
/// drivers keep for programs built then).
type MemcpyBatch = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    CUstream,
) -> CUresult;

/// Set when the driver refused a batch: every later copy goes one call each.
static BATCH_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The driver's `cuMemcpyBatchAsync`, if it has one (looked up once) and has not refused it.
fn memcpy_batch() -> Option<MemcpyBatch> {
    static F: std::sync::OnceLock<Option<MemcpyBatch>> = std::sync::OnceLock::new();
    if BATCH_REFUSED.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    *F.get_or_init(|| {
        if std::env::var_os("GDIRECT_NO_BATCH_COPY").is_some() {
            return None;
        }
        // SAFETY: the driver library is loaded (a context exists); the symbol, where present,
        // has the type CUDA 12.8's header gives it.
        unsafe {
            sys::culib()
                .get::<MemcpyBatch>(b"cuMemcpyBatchAsync")
                .ok()
                .map(|s| *s)
        }
    })
}

/// A non-blocking stream of the current context, destroyed when dropped (after its work).
struct OwnStream(CUstream);

impl OwnStream {
    fn new() -> Result<Self> {
        let mut s = std::ptr::null_mut();
        // SAFETY: the caller made a context current; `s` receives the handle.
        cuda("stream creation", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Self(s))
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: our live stream, of the current context.
        unsafe { Waits::of_current().stream(self.0) }
    }
}

impl Drop for OwnStream {
    fn drop(&mut self) {
        // SAFETY: our stream, destroyed once; its work is waited for first (an error path
        // leaves copies queued), with the context current (it outlives the stream's user).
        unsafe {
            let _ = sys::cuStreamSynchronize(self.0);
            let _ = sys::cuStreamDestroy_v2(self.0);
        }
    }
}

/// Destination GPU memory, for the length of one read.
#[derive(Clone, Copy, Debug)]
pub struct CudaDest {
    ptr: CUdeviceptr,
    len: u64,
}

impl CudaDest {
    /// `len` bytes at device pointer `ptr` (whose validity the caller of the read vouches for).
    pub(crate) fn from_raw(ptr: u64, len: u64) -> Self {
        Self { ptr, len }
    }
}

/// A pinned host buffer: `cuMemHostAlloc`, or an anonymous mapping in huge pages registered
/// with the driver (pinning 2 MiB pages costs far less than 4 KiB ones).
struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
    mapped: bool,
}

const HUGE: usize = 2 << 20;

impl Pinned {
    /// Pins `len` bytes in huge pages; `None` where that fails (the caller falls back).
    fn huge(len: usize) -> Option<Self> {
        let len = len.div_ceil(HUGE) * HUGE;
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            nix::libc::mmap(
                std::ptr::null_mut(),
                len + HUGE,
                nix::libc::PROT_READ | nix::libc::PROT_WRITE,
                nix::libc::MAP_PRIVATE | nix::libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == nix::libc::MAP_FAILED {
            return None;
        }
        // Align to a huge page inside the mapping, and give back the slack.
        let base = p as usize;
        let start = base.div_ceil(HUGE) * HUGE;
        // SAFETY: the head and tail trimmed lie inside our new mapping.
        unsafe {
            if start > base {
                nix::libc::munmap(p, start - base);
            }
            let tail = base + len + HUGE - (start + len);
            if tail > 0 {
                nix::libc::munmap((start + len) as *mut c_void, tail);
            }
            nix::libc::madvise(start as *mut c_void, len, nix::libc::MADV_HUGEPAGE);
        }
        // SAFETY: `start..start+len` is our mapping; registering pins it for DMA.
        let r = unsafe { sys::cuMemHostRegister_v2(start as *mut c_void, len, 0) };
        if r.result().is_err() {
            // SAFETY: our mapping, not registered.
            unsafe { nix::libc::munmap(start as *mut c_void, len) };
            return None;
        }
        Some(Self {
            ptr: NonNull::new(start as *mut u8)?,
            len,
            mapped: true,
        })
    }

    /// Frees it. The context is current and no copy from it is in flight.
    fn free(self) {
        // SAFETY: allocated by `huge` or `cuMemHostAlloc` as `mapped` says, freed once.
        unsafe {
            if self.mapped {
                let _ = sys::cuMemHostUnregister(self.ptr.as_ptr().cast());
                nix::libc::munmap(self.ptr.as_ptr().cast(), self.len);
            } else {
                let _ = sys::cuMemFreeHost(self.ptr.as_ptr().cast());
            }
        }
    }
}

/// A worker's stream, staging buffers and their events.
pub struct CudaLane {
    ctx: Arc<CudaContext>,
    hugepages: bool,
    stream: CUstream,
    capacity: usize,
    buffers: Vec<Option<Pinned>>,
    events: Vec<CUevent>,
    pending: Vec<Copying>,
    /// How it waits for its copies: its context's way when the lane was made (a lane is kept
    /// for the engine's life; flags changed later are not seen).
    waits: Waits,
}

/// Where the copy out of a staging buffer stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Copying {
    /// None in flight: the buffer may be written.
    Idle,
    /// Queued on the stream, its event not recorded yet. It is recorded when the lane is next
    /// asked for a buffer, before any later copy is queued, so it marks this copy's end: a read
    /// of one piece, whose `finish` waits for the whole stream, never records it (one driver
    /// call less per small request).
    Queued,
    /// Queued, and its event recorded after it.
    Recorded,
}

// SAFETY: CUDA stream, event and pinned-memory handles may be used from any thread that has
// the context current; every use makes it current first (`enter_thread`, `Drop`).
unsafe impl Send for CudaLane {}

// SAFETY: a destination views exactly the device slice it was made from; each lane owns its
// pinned buffers and stream, copies within bounds checked by `send`, and `finish` synchronizes
// the stream.
unsafe impl Backend for CudaBackend {
    type Memory = CudaSlice<u8>;
    type Dest = CudaDest;
    type Lane = CudaLane;
    type Entered = Entered;

    fn dest(memory: &mut CudaSlice<u8>) -> CudaDest {
        let len = memory.num_bytes() as u64;
        let stream = memory.stream().clone();
        let (ptr, _written) = memory.device_ptr_mut(&stream);
        CudaDest { ptr, len }
    }

    fn dest_len(dest: &CudaDest) -> u64 {
        dest.len
    }

    fn lane(&self, buffers: usize, capacity: usize) -> Result<CudaLane> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: the context is current (`enter_thread`); `stream` receives the handle.
        cuda("stream creation", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        let mut lane = CudaLane {
            ctx: self.ctx.clone(),
            hugepages: self.hugepages,
            stream,
            capacity,
            buffers: Vec::new(),
            events: Vec::new(),
            pending: Vec::new(),
            waits: Waits::of_current(),
        };
        // In a context that sleeps while waiting, the lane's events do too (an event made
        // without `CU_EVENT_BLOCKING_SYNC` is waited for by spinning, whatever the context's
        // flags).
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
            | match lane.waits {
                Waits::Block => sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32,
                Waits::Yield => 0,
            };
        for _ in 0..buffers {
            let mut ev = std::ptr::null_mut();
            // SAFETY: as above; `ev` receives the handle.
            cuda("event creation", unsafe {
                sys::cuEventCreate(&mut ev, flags)
            })?;
            lane.events.push(ev);
            lane.buffers.push(None);
            lane.pending.push(Copying::Idle);
        }
        Ok(lane)
    }

    fn enter_thread(&self) -> Result<Entered> {
        Entered::push(&self.ctx)
    }

    fn before_read(&self, memory: &CudaSlice<u8>) -> Result<()> {
        // Work queued on the allocation's stream (an asynchronous allocation, a kernel still
        // reading the old contents), and on other streams that used it (`dest`, called first,
        // made this stream wait for theirs), finishes before the workers' streams write it.
        memory
            .stream()
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the destination's stream", e))
    }

    unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<()> {
        let _entered = self.enter_thread()?;
        // SAFETY: `ptr..ptr+len` is a page-aligned range of a live read-only file mapping the
        // engine holds until it unregisters it; READ_ONLY matches its protection.
        cuda("page-cache registration", unsafe {
            sys::cuMemHostRegister_v2(
                ptr.cast_mut().cast(),
                len,
                sys::CU_MEMHOSTREGISTER_READ_ONLY,
            )
        })
    }

    unsafe fn unregister(&self, ptr: *const u8) {
        if let Ok(_entered) = self.enter_thread() {
            // SAFETY: `ptr` was registered by `register` and not yet unregistered; no copy
            // from it is in flight (the engine releases only between reads).
            let _ = unsafe { sys::cuMemHostUnregister(ptr.cast_mut().cast()) };
        }
    }

    fn prefers_mapped(&self) -> bool {
        self.prefer_mapped
    }
}

impl CudaLane {
    /// Records the event of each buffer whose copy is queued but not yet marked: called before
    /// anything else is queued on the stream, so each event marks the end of its buffer's copy
    /// (and of what was queued before it), not of later copies.
    fn record_queued(&mut self) -> Result<()> {
        for i in 0..self.pending.len() {
            if self.pending[i] == Copying::Queued {
                // SAFETY: a live event and stream of this lane.
                cuda("event record", unsafe {
                    sys::cuEventRecord(self.events[i], self.stream)
                })?;
                self.pending[i] = Copying::Recorded;
            }
        }
        Ok(())
    }

    fn wait(&mut self, i: usize) -> Result<()> {
        self.record_queued()?;
        if self.pending[i] == Copying::Recorded {
            // SAFETY: a live event of this lane, whose context is current.
            unsafe { self.waits.event(self.events[i]) }?;
            self.pending[i] = Copying::Idle;
        }
        Ok(())
    }

    /// Queues the copy of `len` bytes at `src` into `dest` at `off` on the lane's stream.
    ///
    /// # Safety
    ///
    /// `src..src + len` is pinned or registered host memory that stays valid until the copy
    /// completes; `dest`'s memory is alive and not otherwise written until then.
    unsafe fn copy(&mut self, src: *const u8, len: usize, dest: CudaDest, off: u64) -> Result<()> {
        assert!(
            off.checked_add(len as u64)
                .is_some_and(|end| end <= dest.len),
            "the engine checks ranges before sending"
        );
        // SAFETY: `src..src+len` is pinned or registered host memory that stays valid until the
        // copy completes (the lane waits on it before reusing a buffer, the engine releases
        // registrations only between reads); the device range is inside the destination.
        cuda("host-to-device copy", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dest.ptr + off, src.cast::<c_void>(), len, self.stream)
        })
    }
}

// SAFETY: see the `Backend` implementation.
unsafe impl Lane for CudaLane {
    type Dest = CudaDest;

    fn buffer(&mut self, i: usize, len: usize) -> Result<&mut [u8]> {
        self.wait(i)?;
        if self.buffers[i].as_ref().is_none_or(|b| b.len < len) {
            if let Some(old) = self.buffers[i].take() {
                old.free();
            }
            let cap = len.max(self.capacity);
            let pinned = match self.hugepages.then(|| Pinned::huge(cap)).flatten() {
                Some(p) => p,
                None => {
                    let mut p = std::ptr::null_mut();
                    // SAFETY: the context is current; `p` receives the allocation.
                    cuda("pinned staging allocation", unsafe {
                        sys::cuMemHostAlloc(&mut p, cap, 0)
                    })?;
                    let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::Cuda {
                        what: "pinned staging allocation",
                        error: "null pointer".into(),
                    })?;
                    // CUDA does not say that its pinned memory comes zeroed: written once here,
                    // so that the slices `buffer` hands out are initialised bytes.
                    // SAFETY: `cap` bytes just allocated, which nothing else uses yet.
                    unsafe { ptr.as_ptr().write_bytes(0, cap) };
                    Pinned {
                        ptr,
                        len: cap,
                        mapped: false,
                    }
                }
            };
            self.buffers[i] = Some(pinned);
        }
        let b = self.buffers[i].as_ref().map(|b| (b.ptr, b.len));
        Ok(match b {
            // SAFETY: `len` bytes of our pinned buffer (zeroed when allocated, or fresh pages of
            // an anonymous mapping, so initialised), no copy out of it pending (waited above),
            // borrowed mutably through `&mut self`.
            Some((ptr, cap)) => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), len.min(cap))
            },
            None => &mut [],
        })
    }

    unsafe fn send(
        &mut self,
        i: usize,
        range: Range<usize>,
        dest: CudaDest,
        off: u64,
    ) -> Result<()> {
        let Some((ptr, cap)) = self.buffers[i].as_ref().map(|b| (b.ptr, b.len)) else {
            return Ok(());
        };
        assert!(range.end <= cap);
        // SAFETY: inside our buffer.
        let src = unsafe { ptr.as_ptr().add(range.start) };
        // SAFETY: our pinned buffer, waited on before reuse; the caller vouches for `dest`.
        unsafe { self.copy(src, range.len(), dest, off) }?;
        // (Its event is recorded at the next `buffer`, or never if `finish` comes first.)
        self.pending[i] = Copying::Queued;
        Ok(())
    }

    unsafe fn send_mapped(
        &mut self,
        src: *const u8,
        len: usize,
        dest: CudaDest,
        off: u64,
    ) -> Result<()> {
        self.record_queued()?;
        // SAFETY: the caller vouches for `src` and `dest` (see the trait).
        unsafe { self.copy(src, len, dest, off) }
    }

    fn finish(&mut self) -> Result<()> {
        // SAFETY: our stream, whose context is current.
        unsafe { self.waits.stream(self.stream) }?;
        self.pending.iter_mut().for_each(|p| *p = Copying::Idle);
        Ok(())
    }
}

impl Drop for CudaLane {
    fn drop(&mut self) {
        let Ok(_entered) = Entered::push(&self.ctx) else {
            return;
        };
        // SAFETY: our handles, each destroyed once, after the stream has drained.
        unsafe {
            let _ = sys::cuStreamSynchronize(self.stream);
            for b in self.buffers.drain(..).flatten() {
                b.free();
            }
            for &e in &self.events {
                let _ = sys::cuEventDestroy_v2(e);
            }
            let _ = sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

#[cfg(test)]
mod gather_tests {
    use super::{gather_table, GATHER_PIECE};

    /// Long copies are cut into pieces of at most 64 KiB that cover them exactly, in order;
    /// an aligned copy's pieces stay aligned (16 divides the piece size); empty copies vanish.
    #[test]
    fn the_gather_table_cuts_long_copies_and_covers_every_byte() {
        let copies = [
            (0x1000, 0x9_0000, 3 * GATHER_PIECE + 5),
            (0x20_0001, 0x7, 0),
            (0x30_0010, 0x40_0020, GATHER_PIECE),
            (0x50_0003, 0x60_0005, 17),
        ];
        let t = gather_table(&copies);
        assert_eq!(t.len(), 4 + 1 + 1);
        assert!(t.iter().all(|d| d[2] > 0 && d[2] <= GATHER_PIECE));
        let mut i = 0;
        for &(dst, src, len) in copies.iter().filter(|c| c.2 > 0) {
            let mut at = 0;
            while at < len {
                let [d, s, n] = t[i];
                assert_eq!((d, s), (dst + at, src + at), "piece {i}");
                at += n;
                i += 1;
            }
            assert_eq!(at, len);
        }
        assert_eq!(i, t.len());
        assert!(t[4..5].iter().all(|d| (d[0] | d[1] | d[2]) % 16 == 0));
        assert_eq!(GATHER_PIECE % 16, 0);
    }
}

#[cfg(test)]
mod wait_tests {
    use super::{ask_until_ready, CUresult};

    /// A wait asks until the driver stops answering "not ready", and gives its answer: done,
    /// or the error (a failed copy is an error, never a finished wait).
    #[test]
    fn a_wait_asks_until_ready_and_gives_the_driver_s_answer() {
        for (last, after) in [
            (CUresult::CUDA_SUCCESS, 5),
            (CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, 3),
            (CUresult::CUDA_ERROR_INVALID_HANDLE, 1),
        ] {
            let mut asked = 0;
            let r = ask_until_ready(|| {
                asked += 1;
                if asked < after {
                    CUresult::CUDA_ERROR_NOT_READY
                } else {
                    last
                }
            });
            assert_eq!((r, asked), (last, after));
        }
    }
}
