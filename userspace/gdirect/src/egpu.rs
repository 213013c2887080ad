// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The emulated GPU of the gdirect test rig (`tests/egpu`): "GPU memory" without a GPU.
//!
//! Its allocations are registered with the `nvidia` provider, exactly as cudaMalloc memory is:
//! the module reaches them through the nv-p2p interface the emulated GPU exports. Freeing an
//! allocation that is registered revokes the registration, as `cudaFree` does.

use std::{
    fs::OpenOptions,
    num::NonZeroUsize,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::PathBuf,
    ptr::NonNull,
    sync::{Arc, OnceLock},
};

use nix::{
    fcntl::OFlag,
    sys::{
        mman::{mmap, munmap, MapFlags, ProtFlags},
        stat::Mode,
    },
};

use crate::{
    error::{Errno, Error, Result},
    memory::DeviceMemory,
    sys::egpu as sys,
    Provider,
};

/// The device node of the emulated GPU.
pub const DEVICE_PATH: &str = "/dev/gdirect_egpu";
/// Allocation granularity and alignment (the nv-p2p page size).
pub const PAGE_SIZE: u64 = sys::EGPU_PAGE_SIZE as u64;

/// An open handle to the emulated GPU: a "CUDA context". Its allocations are freed with it.
#[derive(Debug)]
pub struct Egpu {
    fd: OwnedFd,
    /// The memory BAR mapped for the CPU, made on first use.
    bar: OnceLock<Bar>,
}

/// The emulated GPU's memory BAR, mapped from its sysfs `resource2`.
#[derive(Debug)]
struct Bar {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is device memory shared by design; access goes through volatile copies.
unsafe impl Send for Bar {}
// SAFETY: as above.
unsafe impl Sync for Bar {}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `Egpu::bar`, no longer referenced.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// The sysfs directory of the PCI device the `gdirect_egpu` driver is bound to.
pub fn sysfs_device() -> Result<PathBuf> {
    let dir = PathBuf::from("/sys/bus/pci/drivers/gdirect_egpu");
    let missing = || Error::DeviceMissing {
        path: dir.clone(),
        what: "the emulated GPU (load gdirect_egpu.ko)",
    };
    let entries = std::fs::read_dir(&dir).map_err(|_| missing())?;
    entries
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().contains(':'))
        .map(|e| e.path())
        .ok_or_else(missing)
}

/// What the emulated GPU reports (`EGPU_IOC_INFO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgpuInfo {
    /// PCI bus address of the memory BAR.
    pub bar_bus_addr: u64,
    /// Size of the memory BAR.
    pub bar_len: u64,
    /// Bytes not allocated.
    pub free_bytes: u64,
    /// Live allocations, all processes.
    pub allocations: u32,
    /// nv-p2p page tables handed out and not yet put or revoked.
    pub mappings: u32,
    /// Free callbacks run since load.
    pub callbacks: u64,
    /// `nvidia_p2p_put_pages` calls that found their page table already unlinked by a free (its
    /// callback pending, running or done) and returned 0, as NVIDIA's driver does.
    pub puts_unlinked: u64,
    /// `nvidia_p2p_put_pages` calls from another process than the one that got the pages: as
    /// in NVIDIA's driver, they put nothing and return 0.
    pub puts_foreign: u64,
}

/// What freeing an allocation did to its registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeReport {
    /// Registrations revoked (free callbacks run).
    pub callbacks: u32,
    /// Persistent registrations that keep the memory until they end.
    pub deferred: u32,
}

fn ioctl_error(ioctl: &'static str, errno: Errno) -> Error {
    Error::Ioctl {
        ioctl,
        path: PathBuf::from(DEVICE_PATH),
        errno,
    }
}

impl Egpu {
    /// Opens `/dev/gdirect_egpu` (the `gdirect_egpu` test module).
    pub fn open() -> Result<Arc<Self>> {
        let fd = nix::fcntl::open(DEVICE_PATH, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|errno| match errno {
                Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => Error::DeviceMissing {
                    path: PathBuf::from(DEVICE_PATH),
                    what: "the emulated GPU (load gdirect_egpu.ko)",
                },
                errno => Error::Open {
                    path: PathBuf::from(DEVICE_PATH),
                    errno,
                },
            })?;
        Ok(Arc::new(Self {
            fd,
            bar: OnceLock::new(),
        }))
    }

    /// Allocates `len` bytes (a multiple of [`PAGE_SIZE`]) of GPU memory.
    pub fn alloc(self: &Arc<Self>, len: u64) -> Result<EgpuAllocation> {
        let mut args = sys::egpu_alloc_args {
            len,
            ..Default::default()
        };
        // SAFETY: `args` is a valid, writable struct for the call; the driver keeps no pointer.
        unsafe { sys::alloc(self.fd.as_raw_fd(), &mut args) }
            .map_err(|errno| ioctl_error("EGPU_IOC_ALLOC", errno))?;
        Ok(EgpuAllocation {
            egpu: self.clone(),
            va: args.va,
            bar_offset: args.bar_offset,
            len,
            freed: false,
        })
    }

    /// The device's state.
    pub fn info(&self) -> Result<EgpuInfo> {
        let mut args = sys::egpu_info_args::default();
        // SAFETY: as in `alloc`.
        unsafe { sys::info(self.fd.as_raw_fd(), &mut args) }
            .map_err(|errno| ioctl_error("EGPU_IOC_INFO", errno))?;
        Ok(EgpuInfo {
            bar_bus_addr: args.bar_bus_addr,
            bar_len: args.bar_len,
            free_bytes: args.free_bytes,
            allocations: args.allocations,
            mappings: args.mappings,
            callbacks: args.callbacks,
            puts_unlinked: args.puts_unlinked,
            puts_foreign: args.puts_foreign,
        })
    }

    fn bar(&self) -> Result<&Bar> {
        if let Some(bar) = self.bar.get() {
            return Ok(bar);
        }
        let path = sysfs_device()?.join("resource2");
        let fail = |errno| Error::Allocation {
            what: format!("a CPU mapping of {}", path.display()),
            errno,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| fail(Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO))))?;
        let len = usize::try_from(file.metadata().map_err(|_| fail(Errno::EIO))?.len())
            .map_err(|_| fail(Errno::EOVERFLOW))?;
        let size = NonZeroUsize::new(len).ok_or(fail(Errno::ENODEV))?;
        // SAFETY: a new shared mapping of the BAR; nothing else in this process aliases it.
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
        .map_err(fail)?;
        let _ = self.bar.set(Bar {
            ptr: ptr.cast(),
            len,
        });
        self.bar.get().ok_or(fail(Errno::EINVAL))
    }

    /// Frees the allocation at GPU virtual address `va` of this handle, as a `cudaFree` from
    /// elsewhere in the program would, even while an [`EgpuAllocation`] still names it (its drop
    /// then finds nothing to free).
    pub fn free_va(&self, va: u64) -> Result<FreeReport> {
        self.free_va_delayed(va, std::time::Duration::ZERO)
    }

    /// As [`Egpu::free_va`], with the debug knob: the driver holds its lock for `delay` (at most
    /// 1 s) between unlinking the allocation's mappings and running their free callbacks, the
    /// window in which `nvidia_p2p_put_pages` blocks and then returns 0.
    pub fn free_va_delayed(&self, va: u64, delay: std::time::Duration) -> Result<FreeReport> {
        self.free_va_with(va, delay, 0)
    }

    /// As [`Egpu::free_va_delayed`], with the free run by a kernel worker: the free callbacks
    /// run in a kworker, not in this thread, as when the last close of a GPU context is
    /// deferred or the GPU is removed.
    pub fn free_va_from_worker(&self, va: u64, delay: std::time::Duration) -> Result<FreeReport> {
        self.free_va_with(va, delay, sys::EGPU_FREE_FROM_WORKER)
    }

    fn free_va_with(&self, va: u64, delay: std::time::Duration, flags: u32) -> Result<FreeReport> {
        let mut args = sys::egpu_free_args {
            va,
            flags,
            delay_us: u32::try_from(delay.as_micros()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        // SAFETY: as in `alloc`.
        unsafe { sys::free(self.fd.as_raw_fd(), &mut args) }
            .map_err(|errno| ioctl_error("EGPU_IOC_FREE", errno))?;
        Ok(FreeReport {
            callbacks: args.callbacks,
            deferred: args.deferred,
        })
    }
}

/// An allocation of emulated GPU memory; freed when dropped.
#[derive(Debug)]
pub struct EgpuAllocation {
    egpu: Arc<Egpu>,
    va: u64,
    bar_offset: u64,
    len: u64,
    freed: bool,
}

impl EgpuAllocation {
    /// The fake GPU virtual address (what a CUDA program would hold).
    pub fn va(&self) -> u64 {
        self.va
    }

    /// Where the memory is in the device's BAR2 (and in the host's backing file).
    pub fn bar_offset(&self) -> u64 {
        self.bar_offset
    }

    /// Copies `out.len()` bytes at `offset` of the allocation to `out`, through a CPU mapping of
    /// the GPU's BAR (as `cudaMemcpy` device-to-host would).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let start = self.span(offset, out.len())?;
        let bar = self.egpu.bar()?;
        // 8-byte loads where aligned (a BAR mapping is uncached: fewer, wider accesses).
        let mut i = 0;
        while i < out.len() {
            let at = start + i;
            if at % 8 == 0 && out.len() - i >= 8 {
                // SAFETY: `at..at + 8` is inside the allocation, inside the BAR mapping
                // (checked by `span`), and 8-byte aligned.
                let w = unsafe { bar.ptr.as_ptr().add(at).cast::<u64>().read_volatile() };
                out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                i += 8;
            } else {
                // SAFETY: `at` is inside the allocation, inside the BAR mapping (checked).
                out[i] = unsafe { bar.ptr.as_ptr().add(at).read_volatile() };
                i += 1;
            }
        }
        Ok(())
    }

    /// Copies `data` into the allocation at `offset` through the CPU mapping of the BAR.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let start = self.span(offset, data.len())?;
        let bar = self.egpu.bar()?;
        let mut i = 0;
        while i < data.len() {
            let at = start + i;
            if at % 8 == 0 && data.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                // SAFETY: as in `read`; `&mut self` makes this the only writer through this
                // value.
                unsafe {
                    bar.ptr
                        .as_ptr()
                        .add(at)
                        .cast::<u64>()
                        .write_volatile(u64::from_ne_bytes(w))
                };
                i += 8;
            } else {
                // SAFETY: as above.
                unsafe { bar.ptr.as_ptr().add(at).write_volatile(data[i]) };
                i += 1;
            }
        }
        Ok(())
    }

    /// The BAR offset of `[offset, offset + len)` of the allocation, checked.
    fn span(&self, offset: u64, len: usize) -> Result<usize> {
        let end = offset.checked_add(len as u64).filter(|e| *e <= self.len);
        let bar_len = self.egpu.bar()?.len as u64;
        match end {
            Some(_) if self.bar_offset + self.len <= bar_len => {
                Ok((self.bar_offset + offset) as usize)
            }
            _ => Err(Error::OutOfMemoryRange {
                offset,
                len: len as u64,
                size: self.len,
            }),
        }
    }

    /// Frees the allocation now, like `cudaFree`: registrations of it are revoked, unless
    /// persistent.
    pub fn free(mut self) -> Result<FreeReport> {
        self.freed = true;
        self.egpu.free_va(self.va)
    }
}

// SAFETY: the allocation's GPU virtual range belongs to it and is freed only when it is dropped
// (or by `free_va`, which revokes the registrations of it first, as a GPU driver's free does).
unsafe impl DeviceMemory for EgpuAllocation {
    fn provider(&self) -> Provider {
        Provider::Nvidia
    }
    fn device_address(&self) -> u64 {
        self.va
    }
    fn len(&self) -> u64 {
        self.len
    }
}

impl Drop for EgpuAllocation {
    fn drop(&mut self) {
        if !self.freed {
            let _ = self.egpu.free_va(self.va);
        }
    }
}
