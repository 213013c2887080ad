// SPDX-License-Identifier: GPL-2.0 OR MIT
//! GPU memory the module may register: [`DeviceBuffer`], from `cuMemAlloc`, and the check that
//! refuses memory of a stream-ordered pool.

use std::sync::Arc;

use cudarc::driver::{
    sys::{self, CUdeviceptr},
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};

use crate::{
    compat::{cuda_err, Entered},
    DeviceMemory, Error, Provider, Result,
};

/// The nv-p2p page: registrations of GPU memory start and end on it.
const GPU_PAGE: usize = 64 << 10;

/// What the CUDA driver says of device memory that decides whether the module may pin it
/// (`cuPointerGetAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaFacts {
    /// Allocated from a stream-ordered pool (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE` is not
    /// null): `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`.
    pub pool: bool,
    /// `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE`: whether the driver lets a third-party
    /// device (nv-p2p's clients: RDMA NICs, this module) reach the memory; `None` where the
    /// driver does not answer.
    pub rdma_capable: Option<bool>,
}

impl RdmaFacts {
    /// The facts of the memory at `ptr` (any address inside an allocation).
    pub fn of(ptr: u64) -> Result<Self> {
        cudarc::driver::result::init().map_err(|e| cuda_err("initialisation", e))?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the attribute is a `CUmemoryPool` handle, which `pool` receives.
        let asked = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut pool).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                ptr,
            )
        };
        // A driver that does not know the attribute (before CUDA 11.3) has no pools, and says
        // CUDA_ERROR_INVALID_VALUE; any other failure leaves the question open, and the
        // memory is not taken for plain memory (a pool's could outlive its registration).
        match asked {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {}
            e => {
                return Err(cuda_err(
                    "asking whether the memory is a pool's",
                    cudarc::driver::DriverError(e),
                ))
            }
        }
        let mut capable: i32 = 0;
        // SAFETY: the attribute is an int (a boolean), which `capable` receives.
        let rdma_capable = unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut capable).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
                ptr,
            )
        }
        .result()
        .ok()
        .map(|()| capable != 0);
        Ok(Self {
            pool: !pool.is_null(),
            rdma_capable,
        })
    }
}

/// Refuses memory of a stream-ordered pool for [`Driver::register`](crate::Driver::register):
/// freeing it hands it back to the pool, not to the NVIDIA driver, which therefore never runs
/// the module's free callback, so a batched transfer still queued on a dropped registration
/// could write into the pool's next allocation.
pub(crate) fn not_pool_memory(ptr: u64) -> Result<()> {
    if RdmaFacts::of(ptr)?.pool {
        return Err(Error::PoolMemory { addr: ptr });
    }
    Ok(())
}

/// GPU memory from `cuMemAlloc`, which the module may register: the NVIDIA driver runs the
/// module's free callback when it is freed (the callback waits for the storage I/O on it), so
/// no transfer outlives it, as none can outlive memory of a stream-ordered pool
/// (`cuMemAllocAsync`, where cudarc allocates from when the device has pools: the H200's
/// `CudaSlice`s; [`Driver::register`](crate::Driver::register) refuses those with
/// [`Error::PoolMemory`]).
///
/// Its length is a multiple of 64 KiB and its address 64 KiB aligned (nv-p2p's page); it
/// starts zeroed. It belongs to a stream, as a `CudaSlice` does: cudarc's copies and kernels
/// take it (`DevicePtr`, `DevicePtrMut`); work on another stream is ordered after the work on
/// its own (the host waits for that first) and the host waits for it to end.
///
/// ```no_run
/// use gdirect::{gpu::DeviceBuffer, Driver};
/// let stream = cudarc::driver::CudaContext::new(0).expect("a GPU").default_stream();
/// let buf = DeviceBuffer::new(&stream, 64 << 20)?;
/// let driver = Driver::open()?;
/// let reg = driver.register(&buf)?; // a CudaSlice from cudarc's pool: Error::PoolMemory
/// // ... transfers into `reg` ...
/// drop(reg);
/// let bytes: Vec<u8> = stream.clone_dtoh(&buf).expect("a copy");
/// # Ok::<(), gdirect::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    len: usize,
    /// The allocation `cuMemFree` takes (`ptr` is inside it, 64 KiB aligned).
    base: CUdeviceptr,
    stream: Arc<CudaStream>,
}

// SAFETY: the value owns its allocation; its address and length are plain numbers, and the
// stream is `Send + Sync`.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// At least `len` bytes (rounded up to 64 KiB) of zeroed device memory on `stream`'s
    /// device, by `cuMemAlloc`.
    pub fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Self> {
        let len = len
            .max(1)
            .checked_next_multiple_of(GPU_PAGE)
            .ok_or(Error::Cuda {
                what: "cuMemAlloc",
                error: format!("{len} bytes cannot be rounded up to 64 KiB"),
            })?;
        let _ctx = Entered::push(stream.context())?;
        // SAFETY: the stream's context is current; the allocation is owned by the value
        // returned, which frees it.
        let mut base = unsafe { cudarc::driver::result::malloc_sync(len) }
            .map_err(|e| cuda_err("cuMemAlloc", e))?;
        let mut ptr = base;
        if ptr % GPU_PAGE as u64 != 0 {
            // cuMemAlloc aligns large allocations to 2 MiB in practice, not by contract: take
            // a page more and start on the first boundary inside.
            // SAFETY: `base` was allocated just above and is not used again.
            unsafe { cudarc::driver::result::free_sync(base) }
                .map_err(|e| cuda_err("cuMemFree", e))?;
            // SAFETY: as above.
            base = unsafe { cudarc::driver::result::malloc_sync(len + GPU_PAGE) }
                .map_err(|e| cuda_err("cuMemAlloc", e))?;
            ptr = base.next_multiple_of(GPU_PAGE as u64);
        }
        let buf = Self {
            ptr,
            len,
            base,
            stream: stream.clone(),
        };
        // SAFETY: `len` bytes at `ptr` are this allocation's; the context is current.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0, len) }
            .map_err(|e| cuda_err("cuMemsetD8", e))?;
        Ok(buf)
    }

    /// Its device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The CUDA device it is on.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// Waits until the work queued on it (on its stream) has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the buffer's stream", e))
    }

    /// Copies `dst.len()` bytes from byte `offset` into host memory, after the work queued
    /// on it.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        self.synchronize()?;
        let _ctx = Entered::push(self.stream.context())?;
        // SAFETY: `offset..offset + dst.len()` lies in the allocation (checked) and nothing is
        // queued on it; `dst` is writable host memory of that length; the context is current.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, self.ptr + offset as u64) }
            .map_err(|e| cuda_err("cuMemcpyDtoH", e))
    }

    /// Copies `src` to byte `offset`, after the work queued on it.
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        self.synchronize()?;
        let _ctx = Entered::push(self.stream.context())?;
        // SAFETY: as in `copy_to_host`; `&mut self` makes this the only use of the memory.
        unsafe { cudarc::driver::result::memcpy_htod_sync(self.ptr + offset as u64, src) }
            .map_err(|e| cuda_err("cuMemcpyHtoD", e))
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfMemoryRange {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Its pointer for work on `stream`: the work already on its own stream comes first.
    fn on<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        if std::ptr::eq(stream, Arc::as_ptr(&self.stream)) {
            return (self.ptr, SyncOnDrop::Sync(None));
        }
        // Another stream: its own work ends first, and the host waits for the new work when
        // the caller has queued it, so whatever comes next on any stream comes after.
        stream.context().record_err(self.stream.synchronize());
        (self.ptr, SyncOnDrop::Sync(Some(stream)))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // The free waits for no queued work: the stream's work on it ends first.
        let _ = self.stream.synchronize();
        if let Ok(_ctx) = Entered::push(self.stream.context()) {
            // SAFETY: the allocation is this value's, nothing is queued on it, and it is not
            // used again. The NVIDIA driver revokes every registration of it first (the
            // module's free callback waits for the storage I/O on it).
            let _ = unsafe { cudarc::driver::result::free_sync(self.base) };
        }
    }
}

impl DeviceSlice<u8> for DeviceBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<u8> for DeviceBuffer {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.on(stream)
    }
}

impl DevicePtrMut<u8> for DeviceBuffer {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        self.on(stream)
    }
}

// SAFETY: the `cuMemAlloc` allocation of `len` bytes at `ptr` belongs to the value and is freed
// only when it is dropped, through the NVIDIA driver, which revokes registrations of it first;
// its bytes are reached only by the GPU (cudarc's copies and kernels), never by a Rust reference.
unsafe impl DeviceMemory for DeviceBuffer {
    fn provider(&self) -> Provider {
        Provider::Nvidia
    }
    fn device_address(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
}
