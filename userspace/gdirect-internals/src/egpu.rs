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

use gdirect::{DeviceMemory, Errno, Error, Provider, Result};

use crate::sys;

/// The device node of the emulated GPU.
pub const DEVICE_PATH: &str = "/dev/gdirect_egpu";
/// Allocation granularity and alignment (the nv-p2p page size).
pub const PAGE_SIZE: u64 = sys::EGPU_PAGE_SIZE as u64;
/// The byte a new allocation is filled with.
pub const POISON: u8 = sys::EGPU_POISON as u8;
/// The byte the emulated GPU fills freed memory with.
pub const FREED_POISON: u8 = sys::EGPU_FREED_POISON as u8;

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
    /// Live kept allocations ([`Egpu::alloc_kept`]), not counted in `allocations`.
    pub kept: u32,
    /// The emulated BAR1 aperture, which limits the nv-p2p page tables handed out.
    pub bar1_size: u64,
    /// The part of BAR1 the handed-out page tables map.
    pub bar1_used: u64,
    /// `nvidia_p2p_free_page_table` calls from a client's free callback on its own page
    /// table, while the free path still had it linked (nv-p2p's rule for a callback).
    pub callback_frees: u64,
    /// `nvidia_p2p_free_page_table` calls anywhere else.
    pub stray_frees: u64,
    /// `get_pages` calls that handed out the struct of the page table freed last again (the
    /// module loaded with `reuse_tables=1`).
    pub tables_reused: u64,
}

/// What freeing an allocation did to its registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeReport {
    /// Registrations revoked (free callbacks run).
    pub callbacks: u32,
    /// Persistent registrations that keep the memory until they end.
    pub deferred: u32,
    /// How long the free callbacks ran, all together, as the emulated driver timed them: the
    /// time its lock was held for them, which every other user of the driver waits.
    pub callback_time: std::time::Duration,
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

    /// Allocates `len` bytes (a multiple of [`PAGE_SIZE`]) of GPU memory, freed with this handle.
    pub fn alloc(self: &Arc<Self>, len: u64) -> Result<EgpuAllocation> {
        self.alloc_with(len, 0)
    }

    /// Allocates `len` bytes of GPU memory that outlive this handle and the process: the rig's
    /// host checks read them after the program ends. Freed by [`Egpu::free_kept`], or when the
    /// emulated GPU's driver is unbound (unloaded).
    pub fn alloc_kept(self: &Arc<Self>, len: u64) -> Result<EgpuAllocation> {
        self.alloc_with(len, sys::EGPU_ALLOC_KEPT)
    }

    fn alloc_with(self: &Arc<Self>, len: u64, flags: u32) -> Result<EgpuAllocation> {
        let mut args = sys::egpu_alloc_args {
            len,
            flags,
            ..Default::default()
        };
        // SAFETY: `args` is a valid, writable struct for the call; the driver keeps no pointer.
        unsafe { sys::alloc(self.fd.as_raw_fd(), &mut args) }
            .map_err(|errno| ioctl_error("EGPU_IOC_ALLOC", errno))?;
        Ok(EgpuAllocation {
            egpu: self.clone(),
            va: args.va,
            len,
            freed: false,
            kept: flags & sys::EGPU_ALLOC_KEPT != 0,
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
            kept: args.kept,
            bar1_size: args.bar1_size,
            bar1_used: args.bar1_used,
            callback_frees: args.callback_frees,
            stray_frees: args.stray_frees,
            tables_reused: args.tables_reused,
        })
    }

    /// Frees the kept allocation (see [`Egpu::alloc_kept`]) at GPU virtual address `va`.
    pub fn free_kept(&self, va: u64) -> Result<FreeReport> {
        self.free_va_with(va, std::time::Duration::ZERO, sys::EGPU_FREE_KEPT)
    }

    /// The BAR offset of each 64 KiB page of the GPU virtual range `[va, va + len)`, from the
    /// emulated GPU's page directory (BAR2's last page): its pages are scattered over the BAR.
    pub fn bar_pages(&self, va: u64, len: u64) -> Result<Vec<u64>> {
        let bar = self.bar()?;
        let dir = bar
            .len
            .checked_sub(PAGE_SIZE as usize)
            .ok_or(Error::Allocation {
                what: "the emulated GPU's page directory".into(),
                errno: Errno::ENODEV,
            })?;
        let corrupt = |what: String| Error::Allocation {
            what: format!("the emulated GPU's page directory: {what}"),
            errno: Errno::EIO,
        };
        let word = |at: usize| -> u64 {
            // SAFETY: `at + 8 <= bar.len` (callers stay inside the directory page, the BAR's
            // last), 8-byte aligned (the page is, and so are the offsets used).
            unsafe { bar.ptr.as_ptr().add(at).cast::<u64>().read_volatile() }
        };
        if word(dir) != sys::EGPU_PAGEDIR_MAGIC {
            return Err(corrupt(format!("magic {:#x}", word(dir))));
        }
        let entries = word(dir + 8) & 0xffff_ffff;
        // One u32 per entry after the header, inside the directory's page.
        let room = (PAGE_SIZE - u64::from(sys::EGPU_PAGEDIR_HEADER)) / 4;
        if entries > room {
            return Err(corrupt(format!("{entries} entries, room for {room}")));
        }
        let out_of_range = || Error::OutOfMemoryRange {
            offset: va,
            len,
            size: entries * PAGE_SIZE,
        };
        let first = va
            .checked_sub(sys::EGPU_VA_BASE)
            .filter(|o| o % PAGE_SIZE == 0 && len % PAGE_SIZE == 0)
            .ok_or_else(out_of_range)?
            / PAGE_SIZE;
        let count = len / PAGE_SIZE;
        if first.checked_add(count).is_none_or(|end| end > entries) {
            return Err(out_of_range());
        }
        (first..first + count)
            .map(|v| {
                let at = dir + sys::EGPU_PAGEDIR_HEADER as usize + v as usize * 4;
                // SAFETY: `v < entries`, so the entry lies in the directory page (the header
                // and one u32 per entry fit it: the driver checks at probe); 4-byte aligned.
                let e = unsafe { bar.ptr.as_ptr().add(at).cast::<u32>().read_volatile() };
                let e = u32::from_le(e);
                match e.checked_sub(1) {
                    Some(page) if u64::from(page) * PAGE_SIZE < dir as u64 => {
                        Ok(u64::from(page) * PAGE_SIZE)
                    }
                    _ => Err(corrupt(format!("GPU page {v:#x} maps to entry {e}"))),
                }
            })
            .collect()
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
            callback_time: std::time::Duration::from_nanos(args.callback_ns),
        })
    }
}

/// An allocation of emulated GPU memory; freed when dropped, unless kept
/// ([`Egpu::alloc_kept`]).
#[derive(Debug)]
pub struct EgpuAllocation {
    egpu: Arc<Egpu>,
    va: u64,
    len: u64,
    /// Freed already: not freed on drop.
    freed: bool,
    /// Kept ([`Egpu::alloc_kept`]): not freed on drop either.
    kept: bool,
}

impl EgpuAllocation {
    /// The fake GPU virtual address (what a CUDA program would hold).
    pub fn va(&self) -> u64 {
        self.va
    }

    /// Where each of its 64 KiB pages is in the device's BAR2 (and the host's backing file).
    pub fn bar_pages(&self) -> Result<Vec<u64>> {
        self.egpu.bar_pages(self.va, self.len)
    }

    /// Copies `out.len()` bytes at `offset` of the allocation to `out`, through a CPU mapping of
    /// the GPU's BAR (as `cudaMemcpy` device-to-host would), page by page.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let bar = self.egpu.bar()?;
        for (at, range) in self.spans(offset, out.len())? {
            let out = &mut out[range];
            // 8-byte loads where aligned (a BAR mapping is uncached: fewer, wider accesses).
            let mut i = 0;
            while i < out.len() {
                let p = at + i;
                if p % 8 == 0 && out.len() - i >= 8 {
                    // SAFETY: `p..p + 8` is inside one page of the allocation, inside the BAR
                    // mapping (checked by `spans`), and 8-byte aligned.
                    let w = unsafe { bar.ptr.as_ptr().add(p).cast::<u64>().read_volatile() };
                    out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                    i += 8;
                } else {
                    // SAFETY: `p` is inside a page of the allocation, inside the BAR mapping.
                    out[i] = unsafe { bar.ptr.as_ptr().add(p).read_volatile() };
                    i += 1;
                }
            }
        }
        Ok(())
    }

    /// Copies `data` into the allocation at `offset` through the CPU mapping of the BAR.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let bar = self.egpu.bar()?;
        for (at, range) in self.spans(offset, data.len())? {
            let data = &data[range];
            let mut i = 0;
            while i < data.len() {
                let p = at + i;
                if p % 8 == 0 && data.len() - i >= 8 {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&data[i..i + 8]);
                    // SAFETY: as in `read`; `&mut self` makes this the only writer through
                    // this value.
                    unsafe {
                        bar.ptr
                            .as_ptr()
                            .add(p)
                            .cast::<u64>()
                            .write_volatile(u64::from_ne_bytes(w))
                    };
                    i += 8;
                } else {
                    // SAFETY: as above.
                    unsafe { bar.ptr.as_ptr().add(p).write_volatile(data[i]) };
                    i += 1;
                }
            }
        }
        Ok(())
    }

    /// `[offset, offset + len)` of the allocation as pieces of its pages: each piece's BAR
    /// offset and its range of the caller's buffer, checked to lie in the allocation and the BAR.
    fn spans(&self, offset: u64, len: usize) -> Result<Vec<(usize, std::ops::Range<usize>)>> {
        let end = offset.checked_add(len as u64).filter(|e| *e <= self.len);
        let Some(end) = end else {
            return Err(Error::OutOfMemoryRange {
                offset,
                len: len as u64,
                size: self.len,
            });
        };
        let pages = self.bar_pages()?;
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let page = (at / PAGE_SIZE) as usize;
            let within = at % PAGE_SIZE;
            let n = (PAGE_SIZE - within).min(end - at);
            let done = (at - offset) as usize;
            out.push(((pages[page] + within) as usize, done..done + n as usize));
            at += n;
        }
        Ok(out)
    }

    /// Frees the allocation now, like `cudaFree`: registrations of it are revoked, unless
    /// persistent.
    pub fn free(mut self) -> Result<FreeReport> {
        self.freed = true;
        if self.kept {
            self.egpu.free_kept(self.va)
        } else {
            self.egpu.free_va(self.va)
        }
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
        if !self.freed && !self.kept {
            let _ = self.egpu.free_va(self.va);
        }
    }
}
