// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-ioctl`: sends one well-formed or deliberately malformed ioctl to the gdirect device
//! and prints the outcome as one word — `OK` or the errno name (`EINVAL`) — so that selftests
//! can assert the module's answer to each kind of bad input.
//!
//! Usage: gdirect-ioctl [--device PATH | --fd N | --wait] CASE
//! (`--fd N` uses an already open file descriptor of the device, inherited from the shell: the
//! module refuses every command on it with `EXDEV`, as the shell opened it; `--wait` opens the
//! device, prints `opened` and reads a line of standard input before sending CASE.)
//! Exit status: 0 when the call was made (whatever its result), 2 on a usage or setup error.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    process::ExitCode,
    ptr::NonNull,
};

use gdirect::raw::{
    gdirect_info_args, gdirect_peer_args, gdirect_stats_args, gdirect_stats_args_v1,
    GDIRECT_IOC_GET_INFO, GDIRECT_IOC_GET_STATS, GDIRECT_IOC_GET_STATS_V1, GDIRECT_IOC_MAGIC,
    GDIRECT_IOC_PEER_CHECK,
};
use nix::{
    errno::Errno,
    fcntl::{open, OFlag},
    sys::{
        mman::{mmap_anonymous, mprotect, munmap, MapFlags, ProtFlags},
        stat::Mode,
    },
};

const CASES: &str = "\
  get-info        a valid GET_INFO; prints the fields, then OK
  bad-type        a command with another ioctl type byte            (expect ENOTTY)
  bad-nr          the gdirect type with an undefined number         (expect ENOTTY)
  bad-size        GET_INFO's number with a smaller struct size      (expect EINVAL)
  big-size        GET_INFO's number with a larger struct size       (expect EINVAL)
  bad-dir         GET_INFO's number and size, read-only direction   (expect EINVAL)
  null-ptr        GET_INFO with a NULL argument                     (expect EFAULT)
  unmapped-ptr    GET_INFO with a pointer to an unmapped page       (expect EFAULT)
  straddle-ptr    GET_INFO whose struct runs into an unmapped page  (expect EFAULT)
  readonly-ptr    GET_INFO with a pointer to a read-only page       (expect EFAULT)
  kernel-ptr      GET_INFO with a kernel address                    (expect EFAULT)
  flags           GET_INFO with flags = 1                           (expect EINVAL)
  flags-high      GET_INFO with flags = 1 << 31                     (expect EINVAL)
  pad             GET_INFO with pad = 1                             (expect EINVAL)
  reserved-N      GET_INFO with reserved[N] = 1, N in 0..2          (expect EINVAL)
  peer-self       PEER_CHECK of the first PCI function with itself  (expect OK; prints map_type)
  peer-flags      PEER_CHECK with flags = 1                         (expect EINVAL)
  peer-reserved   PEER_CHECK with reserved = 1                      (expect EINVAL)
  peer-nodev      PEER_CHECK of a PCI address with no function      (expect ENODEV)
  peer-bdf-range  PEER_CHECK with a bdf above 0xffff                (expect ENODEV)
  stats           GET_STATS, then GET_STATS_V1 (the first struct): prints both structs' reason
                  counts, then OK if both answered and agree where both have room
  stats-v1-flags  GET_STATS_V1 with flags = 1                       (expect EINVAL)
  stats-mid-size  GET_STATS's number with a size between the two   (expect EINVAL)";

fn usage() -> ExitCode {
    eprintln!("usage: gdirect-ioctl [--device PATH | --fd N] CASE\ncases:\n{CASES}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut device = std::env::var("GDIRECT_DEVICE")
        .unwrap_or_else(|_| gdirect::DEFAULT_DEVICE_PATH.to_string());
    let mut inherited: Option<RawFd> = None;
    let mut wait = false;
    match args.first().map(String::as_str) {
        Some("--wait") => {
            wait = true;
            args.remove(0);
        }
        Some("--device") if args.len() >= 2 => {
            device = args.remove(1);
            args.remove(0);
        }
        Some("--fd") if args.len() >= 2 => {
            let Ok(n) = args[1].parse() else {
                return usage();
            };
            inherited = Some(n);
            args.drain(..2);
        }
        Some("--device" | "--fd") => return usage(),
        _ => {}
    }
    let [case] = args.as_slice() else {
        return usage();
    };
    let fd = match inherited {
        // SAFETY: the caller hands this descriptor to the program; nothing else in it owns it.
        Some(n) => unsafe { OwnedFd::from_raw_fd(n) },
        None => match open(
            device.as_str(),
            OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("gdirect-ioctl: cannot open {device}: {e}");
                return ExitCode::from(2);
            }
        },
    };
    if wait {
        use std::io::{BufRead as _, Write as _};
        println!("opened");
        let _ = std::io::stdout().flush();
        let _ = std::io::stdin().lock().read_line(&mut String::new());
    }
    match run(&fd, case) {
        Some(Ok(())) => println!("OK"),
        Some(Err(errno)) => println!("{errno:?}"),
        None => return usage(),
    }
    ExitCode::SUCCESS
}

/// An ioctl command code, as `_IOC(dir, type, nr, size)` builds it.
fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u64 {
    ((dir as u64) << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64
}
const IOC_READ: u32 = 2;
const IOC_RW: u32 = 3;
const INFO_SIZE: usize = std::mem::size_of::<gdirect_info_args>();
const STATS_V1_SIZE: usize = std::mem::size_of::<gdirect_stats_args_v1>();

fn raw_ioctl(fd: &OwnedFd, cmd: u64, arg: *mut CVoid) -> Result<(), Errno> {
    // SAFETY: ioctl(2) with an arbitrary pointer: the kernel validates it, and the only memory it
    // may write is the argument struct this program owns (or nothing, for bad pointers).
    let ret = unsafe { nix::libc::ioctl(fd.as_raw_fd(), cmd as _, arg) };
    Errno::result(ret).map(drop)
}
type CVoid = std::ffi::c_void;

/// Two anonymous pages; the second is unmapped or protected as the case needs.
struct Pages {
    base: NonNull<CVoid>,
    page: usize,
}

impl Pages {
    fn new() -> Result<Self, Errno> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) })
            .map_err(|_| Errno::EINVAL)?;
        let len = std::num::NonZeroUsize::new(2 * page).ok_or(Errno::EINVAL)?;
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let base = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        Ok(Self { base, page })
    }
    fn second(&self) -> NonNull<CVoid> {
        // SAFETY: the mapping is two pages long.
        unsafe { self.base.byte_add(self.page) }
    }
}

fn run(fd: &OwnedFd, case: &str) -> Option<Result<(), Errno>> {
    let get_info = GDIRECT_IOC_GET_INFO as u64;
    let mut args = gdirect_info_args::default();
    let ptr = |a: &mut gdirect_info_args| (a as *mut gdirect_info_args).cast::<CVoid>();
    let result = match case {
        "get-info" => {
            let r = raw_ioctl(fd, get_info, ptr(&mut args));
            if r.is_ok() {
                println!(
                    "abi_version={} providers={:#x} version={}.{}.{} open_files={}",
                    args.abi_version,
                    args.providers,
                    args.version_major,
                    args.version_minor,
                    args.version_patch,
                    args.open_files
                );
            }
            r
        }
        "bad-type" => raw_ioctl(
            fd,
            ioc(IOC_RW, GDIRECT_IOC_MAGIC + 1, 0, INFO_SIZE),
            ptr(&mut args),
        ),
        "bad-nr" => raw_ioctl(
            fd,
            ioc(IOC_RW, GDIRECT_IOC_MAGIC, 0xEE, INFO_SIZE),
            ptr(&mut args),
        ),
        "bad-size" => raw_ioctl(
            fd,
            ioc(IOC_RW, GDIRECT_IOC_MAGIC, 0, INFO_SIZE - 8),
            ptr(&mut args),
        ),
        "big-size" => {
            let mut big = [0u8; INFO_SIZE + 8];
            raw_ioctl(
                fd,
                ioc(IOC_RW, GDIRECT_IOC_MAGIC, 0, INFO_SIZE + 8),
                big.as_mut_ptr().cast(),
            )
        }
        "bad-dir" => raw_ioctl(
            fd,
            ioc(IOC_READ, GDIRECT_IOC_MAGIC, 0, INFO_SIZE),
            ptr(&mut args),
        ),
        "null-ptr" => raw_ioctl(fd, get_info, std::ptr::null_mut()),
        "unmapped-ptr" | "straddle-ptr" | "readonly-ptr" => {
            let pages = match Pages::new() {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            let setup = match case {
                // SAFETY: the second page belongs to this mapping and nothing references it.
                "readonly-ptr" => unsafe {
                    mprotect(pages.base, 2 * pages.page, ProtFlags::PROT_READ)
                },
                // SAFETY: as above.
                _ => unsafe { munmap(pages.second(), pages.page) },
            };
            if let Err(e) = setup {
                eprintln!("gdirect-ioctl: cannot prepare the pages: {e}");
                return Some(Err(e));
            }
            let ptr = match case {
                "unmapped-ptr" => pages.second(),
                // The struct's first half is mapped, its second half is not.
                // SAFETY: the offset stays inside the (original) two-page mapping.
                "straddle-ptr" => unsafe { pages.second().byte_sub(INFO_SIZE / 2) },
                _ => pages.base,
            };
            raw_ioctl(fd, get_info, ptr.as_ptr())
        }
        "kernel-ptr" => raw_ioctl(fd, get_info, 0xffff_8880_0000_0000_u64 as *mut CVoid),
        "peer-self" | "peer-flags" | "peer-reserved" | "peer-nodev" | "peer-bdf-range" => {
            // 0000:00:00.0, the host bridge of the rig's q35 machine, exists.
            let mut p = gdirect_peer_args::default();
            match case {
                "peer-flags" => p.flags = 1,
                "peer-reserved" => p.reserved = 1,
                "peer-nodev" => p.client_domain = 0xfffe,
                "peer-bdf-range" => p.provider_bdf = 0x1_0000,
                _ => {}
            }
            let r = raw_ioctl(
                fd,
                GDIRECT_IOC_PEER_CHECK as u64,
                (&mut p as *mut gdirect_peer_args).cast(),
            );
            if r.is_ok() {
                println!("map_type={} distance={}", p.map_type, p.distance);
            }
            r
        }
        "stats" => {
            let mut now = gdirect_stats_args::default();
            let mut v1 = gdirect_stats_args_v1::default();
            let r = raw_ioctl(
                fd,
                GDIRECT_IOC_GET_STATS as u64,
                (&mut now as *mut gdirect_stats_args).cast(),
            )
            .and_then(|()| {
                raw_ioctl(
                    fd,
                    GDIRECT_IOC_GET_STATS_V1 as u64,
                    (&mut v1 as *mut gdirect_stats_args_v1).cast(),
                )
            });
            if r.is_ok() {
                println!("reasons={:?} reasons_v1={:?}", now.reasons, v1.reasons);
                // Nothing else runs meanwhile: the counts the first struct has room for agree.
                let agree = now.io == v1.io && now.reasons[..v1.reasons.len()] == v1.reasons[..];
                if !agree {
                    println!("the two structs' counts differ");
                    return Some(Err(Errno::EBADMSG));
                }
            }
            r
        }
        "stats-v1-flags" => {
            let mut v1 = gdirect_stats_args_v1 {
                flags: 1,
                ..Default::default()
            };
            raw_ioctl(
                fd,
                GDIRECT_IOC_GET_STATS_V1 as u64,
                (&mut v1 as *mut gdirect_stats_args_v1).cast(),
            )
        }
        "stats-mid-size" => {
            let mut now = gdirect_stats_args::default();
            raw_ioctl(
                fd,
                ioc(IOC_RW, GDIRECT_IOC_MAGIC, 0x09, STATS_V1_SIZE + 4),
                (&mut now as *mut gdirect_stats_args).cast(),
            )
        }
        "flags" | "flags-high" | "pad" => {
            match case {
                "flags" => args.flags = 1,
                "flags-high" => args.flags = 1 << 31,
                _ => args.pad = 1,
            }
            raw_ioctl(fd, get_info, ptr(&mut args))
        }
        _ => {
            let n: usize = case.strip_prefix("reserved-")?.parse().ok()?;
            *args.reserved.get_mut(n)? = 1;
            raw_ioctl(fd, get_info, ptr(&mut args))
        }
    };
    Some(result)
}
