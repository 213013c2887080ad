// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Device memory: what can be registered, and the kinds the library can allocate.

use std::{fs::OpenOptions, num::NonZeroUsize, os::fd::AsFd, ptr::NonNull};

use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

use crate::{
    error::{Error, Result},
    pci::PciAddress,
    Provider,
};

/// Memory that can be registered with the module (`Driver::register`).
///
/// Implemented by [`HostBuffer`], [`P2pMem`] and, with the `cuda` feature, cudarc's
/// `CudaSlice` (the test rig's emulated GPU memory implements it in the repository's own
/// `gdirect-internals`). Implement it for other memory by naming its provider and address.
///
/// Only `unsafe impl` implements it (this claim on memory the value does not own does not
/// compile):
///
/// ```compile_fail,E0200
/// struct Borrowed(u64);
/// impl gdirect::DeviceMemory for Borrowed {
///     fn provider(&self) -> gdirect::Provider {
///         gdirect::Provider::Host
///     }
///     fn device_address(&self) -> u64 {
///         self.0
///     }
///     fn len(&self) -> u64 {
///         4096
///     }
/// }
/// ```
///
/// # Safety
///
/// An implementation promises that `device_address()..device_address() + len()` is memory of
/// `provider()` that the value owns and keeps allocated for as long as it lives (or frees only
/// through its provider, which revokes registrations of it first): the module
/// pins that range and devices write it, so a wrong address or length would let a transfer
/// overwrite memory the program uses for something else. And safe code never gets a Rust
/// reference (`&[u8]`, `&mut [u8]`) into the range from the value: devices write it behind the
/// compiler's back, while the value is registered and, for a batched transfer, possibly after
/// (a registration can be leaked with `mem::forget`), so the memory is read and written only
/// through volatile copies (as [`HostBuffer::read`] and [`HostBuffer::write`] do) or by the
/// device that owns it.
pub unsafe trait DeviceMemory {
    /// Which provider owns the memory.
    fn provider(&self) -> Provider;
    /// The address the provider knows it by: a user virtual address for host and p2pdma memory,
    /// a GPU virtual address for nvidia memory.
    fn device_address(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> u64;
    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether the module may register it now, asked of its allocator before each
    /// registration (cudarc's slices: not memory of a stream-ordered pool, which
    /// [`Error::PoolMemory`] explains).
    #[doc(hidden)]
    fn registrable(&self) -> Result<()> {
        Ok(())
    }
}

fn page_size() -> usize {
    usize::try_from(crate::sys::page_size()).unwrap_or(4096)
}

/// Copies `out.len()` bytes from `src` with volatile reads.
///
/// # Safety
///
/// `src..src + out.len()` is mapped and readable.
unsafe fn copy_out_volatile(src: *const u8, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        // SAFETY: in bounds, see the function's safety section.
        *b = unsafe { src.add(i).read_volatile() };
    }
}

/// Copies `data` to `dst` with volatile writes.
///
/// # Safety
///
/// `dst..dst + data.len()` is mapped, writable, and no Rust reference points into it.
unsafe fn copy_in_volatile(dst: *mut u8, data: &[u8]) {
    for (i, b) in data.iter().enumerate() {
        // SAFETY: in bounds, see the function's safety section.
        unsafe { dst.add(i).write_volatile(*b) };
    }
}

/// Page-aligned host memory of the calling process (an anonymous mapping), for registering.
///
/// Its bytes are reached only by copies ([`HostBuffer::read`], [`HostBuffer::write`]), never
/// through a Rust reference: a device may write them whenever a transfer into a registration of
/// them runs, so a `&[u8]` into them would be undefined behaviour. So this, which would hold a
/// view of the bytes while a read writes them, does not compile:
///
/// ```compile_fail,E0599
/// use gdirect::{Driver, File, HostBuffer};
/// let driver = Driver::open()?;
/// let buf = HostBuffer::new(4096)?;
/// let reg = driver.register(&buf)?;
/// let view: &[u8] = buf.as_slice();
/// File::open_direct("/dev/nvme0n1")?.read_into(&reg, 0, 0, 4096)?;
/// println!("{}", view[0]);
/// # Ok::<(), gdirect::Error>(())
/// ```
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value.
unsafe impl Send for HostBuffer {}
// SAFETY: no reference into the memory is handed out; shared access only copies out of it,
// with volatile reads, and writing needs `&mut`.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Maps `len` bytes (rounded up to the page size) of zeroed memory.
    pub fn new(len: usize) -> Result<Self> {
        let page = page_size();
        let len = len.div_ceil(page).max(1) * page;
        let size = NonZeroUsize::new(len).ok_or(Error::Allocation {
            what: "host buffer".into(),
            errno: nix::errno::Errno::EINVAL,
        })?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|errno| Error::Allocation {
            what: format!("{len}-byte host buffer"),
            errno,
        })?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The start of the mapping, for system calls that fill it (`pread`): writing through it
    /// is the caller's `unsafe` to justify.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer.
    ///
    /// # Panics
    ///
    /// When the range is past the end.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset <= self.len && out.len() <= self.len - offset,
            "HostBuffer::read past the end"
        );
        // SAFETY: in bounds (checked above) of the mapping, which lives as long as `self`.
        unsafe { copy_out_volatile(self.ptr.as_ptr().add(offset), out) };
    }

    /// Copies `data` into the buffer at `offset`.
    ///
    /// # Panics
    ///
    /// When the range is past the end.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset <= self.len && data.len() <= self.len - offset,
            "HostBuffer::write past the end"
        );
        // SAFETY: as in `read`; no reference into the mapping exists.
        unsafe { copy_in_volatile(self.ptr.as_ptr().add(offset), data) };
    }

    /// Sets every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        for i in 0..self.len {
            // SAFETY: in bounds of the mapping; no reference into it exists.
            unsafe { self.ptr.as_ptr().add(i).write_volatile(byte) };
        }
    }
}

// SAFETY: the anonymous mapping of `len` bytes at `ptr` is owned by the buffer and unmapped only
// when it is dropped.
unsafe impl DeviceMemory for HostBuffer {
    fn provider(&self) -> Provider {
        Provider::Host
    }
    fn device_address(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// P2P memory of a PCI device (an NVMe CMB, a published GPU BAR), mapped from its
/// `p2pmem/allocate` file: the kernel allocates `len` bytes of the device's P2PDMA pool for the
/// mapping and frees them when it is unmapped.
#[derive(Debug)]
pub struct P2pMem {
    ptr: NonNull<u8>,
    len: usize,
    device: PciAddress,
}

// SAFETY: the mapping is owned by this value; access goes through volatile copies.
unsafe impl Send for P2pMem {}
// SAFETY: as above.
unsafe impl Sync for P2pMem {}

impl P2pMem {
    /// Allocates `len` bytes (rounded up to the page size) of `device`'s published P2P memory.
    pub fn allocate(device: PciAddress, len: usize) -> Result<Self> {
        let path = device.sysfs_path().join("p2pmem/allocate");
        let what = || format!("{len} bytes of P2P memory from {}", path.display());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::Allocation {
                what: what(),
                errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
            })?;
        let page = page_size();
        let len = len.div_ceil(page).max(1) * page;
        let size = NonZeroUsize::new(len).ok_or(Error::Allocation {
            what: what(),
            errno: nix::errno::Errno::EINVAL,
        })?;
        // SAFETY: a new shared mapping of the allocate file; nothing else aliases it.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file.as_fd(),
                0,
            )
        }
        .map_err(|errno| Error::Allocation {
            what: what(),
            errno,
        })?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            device,
        })
    }

    /// Allocates from the first PCI device that publishes P2P memory (`p2pmem/published`).
    pub fn allocate_any(len: usize) -> Result<Self> {
        let published = |d: &std::fs::DirEntry| {
            crate::sysfs::read(&d.path().join("p2pmem/published")).is_some_and(|v| v == "1")
        };
        let mut devices: Vec<PciAddress> = std::fs::read_dir("/sys/bus/pci/devices")
            .map_err(|e| Error::Allocation {
                what: "a list of PCI devices".into(),
                errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
            })?
            .filter_map(|d| d.ok())
            .filter(published)
            .filter_map(|d| d.file_name().to_string_lossy().parse().ok())
            .collect();
        devices.sort();
        let device = devices.first().copied().ok_or(Error::Allocation {
            what: format!("{len} bytes of P2P memory: no PCI device publishes any"),
            errno: nix::errno::Errno::ENODEV,
        })?;
        Self::allocate(device, len)
    }

    /// The device the memory belongs to.
    pub fn device(&self) -> PciAddress {
        self.device
    }

    /// Copies `out.len()` bytes at `offset` out of the device memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset <= self.len && out.len() <= self.len - offset,
            "P2pMem::read past the end"
        );
        // SAFETY: in bounds (checked above) of the mapping. Volatile: device memory.
        unsafe { copy_out_volatile(self.ptr.as_ptr().add(offset), out) };
    }

    /// Copies `data` into the device memory at `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset <= self.len && data.len() <= self.len - offset,
            "P2pMem::write past the end"
        );
        // SAFETY: as in `read`, and `&mut self` makes this the only writer.
        unsafe { copy_in_volatile(self.ptr.as_ptr().add(offset), data) };
    }
}

// SAFETY: the mapping of `len` bytes of the device's P2P memory at `ptr` is owned by the value
// and unmapped only when it is dropped.
unsafe impl DeviceMemory for P2pMem {
    fn provider(&self) -> Provider {
        Provider::P2pdma
    }
    fn device_address(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for P2pMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `allocate`, no longer referenced.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// GPU memory allocated through cudarc: registered with the `nvidia` provider by its device
/// address. The nv-p2p interface needs 64 KiB aligned addresses and lengths: allocate with
/// room to spare and register an aligned view if the allocation is not.
///
/// Only slices of [`Plain`](crate::gpu::Plain) elements (integers and floats): a transfer
/// fills the memory with a file's bytes, which cudarc's safe copies then hand back as values,
/// so an element type with invalid bit patterns could not be one (this does not compile):
///
/// ```compile_fail,E0277
/// fn fill(driver: &gdirect::Driver, flags: &cudarc::driver::CudaSlice<bool>) {
///     let _ = driver.register(flags);
/// }
/// ```
/// Memory of a stream-ordered pool, which cudarc allocates wherever the device has pools
/// (`cuMemAllocAsync`: the H200's slices, for one), is refused with [`Error::PoolMemory`]:
/// allocate what the module registers with [`DeviceBuffer`](crate::gpu::DeviceBuffer).
// SAFETY: the device allocation belongs to the slice and is freed only when it is dropped,
// through the NVIDIA driver, which revokes registrations of it first (`registrable` refuses
// pool memory, whose free does not reach the driver); its address and byte length are
// cudarc's; every bit pattern is a valid `T` (`Plain`).
#[cfg(feature = "cuda")]
unsafe impl<T: crate::gpu::Plain> DeviceMemory for cudarc::driver::CudaSlice<T> {
    fn provider(&self) -> Provider {
        Provider::Nvidia
    }
    fn device_address(&self) -> u64 {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = self.device_ptr(self.stream());
        ptr
    }
    fn len(&self) -> u64 {
        self.num_bytes() as u64
    }
    fn registrable(&self) -> Result<()> {
        crate::gpu::not_pool_memory(self.device_address())
    }
}
