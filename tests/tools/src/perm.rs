// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-perm`: the permission model's rules, each checked by doing what it forbids. Prints
//! one `rule=OUTCOME` line per check (`OK` or the errno name); `permissions.sh` asserts them.
//!
//! Usage: gdirect-perm CASE ARGS...
//!   write-ro FILE      FILE opened read-only (O_DIRECT): reading through it into registered
//!                      memory works, writing through it does not
//!   foreign-handle     a handle of one open file of the device used on another
//!   cross-gpu          GPU memory allocated by another process, registered by its address here
//!   cross-host         host memory of another process, registered by its address here
//!   pass-fd DEV UID GID  a process running as UID (supplementary group GID) receives, over a
//!                      Unix socket, an open file of the device holding a registration and a
//!                      read-only O_DIRECT file of DEV: it may use exactly those, and cannot
//!                      open DEV itself
//! Exit status: 0 when the case ran, 2 on a usage or setup error.

use std::{
    io::{BufRead, BufReader, IoSlice, IoSliceMut, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::{fs::OpenOptionsExt, net::UnixStream},
    },
    process::{Command, ExitCode, Stdio},
};

use gdirect::{DeviceMemory, Driver, Error, File, HostBuffer, Provider, RegisterOptions};
use gdirect_internals::egpu::Egpu;
use nix::{
    libc,
    sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags},
};

fn outcome<T>(r: &gdirect::Result<T>) -> String {
    match r {
        Ok(_) => "OK".into(),
        Err(e) => e
            .errno()
            .map_or_else(|| format!("error({e})"), |e| format!("{e:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["write-ro", file] => write_ro(file),
        ["foreign-handle"] => foreign_handle(),
        ["cross-gpu"] => cross(true),
        ["cross-host"] => cross(false),
        ["cross-child", kind] => cross_child(kind),
        ["pass-fd", dev, uid, gid] => match (uid.parse(), gid.parse()) {
            (Ok(uid), Ok(gid)) => pass_fd(dev, uid, gid),
            _ => return usage(),
        },
        ["pass-fd-child", dev, uid, gid] => match (uid.parse(), gid.parse()) {
            (Ok(uid), Ok(gid)) => pass_fd_child(dev, uid, gid),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("FAIL: {e}");
            ExitCode::from(2)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: gdirect-perm write-ro FILE | foreign-handle | cross-gpu | cross-host | pass-fd DEV UID GID");
    ExitCode::from(2)
}

fn write_ro(file: &str) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let buf = HostBuffer::new(1 << 16)?;
    let reg = driver.register(&buf)?;
    let f = File::open_direct(file)?;
    println!("read_readonly={}", outcome(&f.read_into(&reg, 0, 0, 4096)));
    println!(
        "write_readonly={}",
        outcome(&f.write_from(&reg, 0, 0, 4096))
    );
    Ok(())
}

fn foreign_handle() -> gdirect::Result<()> {
    let (a, b) = (Driver::open()?, Driver::open()?);
    let buf = HostBuffer::new(1 << 16)?;
    let reg = a.register(&buf)?;
    // The handle's number, on the other open file.
    let mut args = gdirect::raw::gdirect_unregister_args {
        handle: reg.handle(),
        ..Default::default()
    };
    // SAFETY: a valid argument struct for the command; the module keeps no pointer.
    let r = unsafe {
        libc::ioctl(
            b.as_raw_fd(),
            gdirect::raw::GDIRECT_IOC_UNREGISTER as _,
            &mut args,
        )
    };
    let errno = if r == 0 {
        "OK".to_string()
    } else {
        format!("{:?}", nix::errno::Errno::last())
    };
    println!("foreign_handle={errno}");
    println!("own_handle={}", outcome(&reg.unregister()));
    Ok(())
}

/// Another process allocates memory and prints its address; this one registers that address.
fn cross(gpu: bool) -> gdirect::Result<()> {
    let exe = std::env::current_exe().map_err(|_| Error::Worker {
        what: "no executable path",
    })?;
    let mut child = Command::new(exe)
        .args(["cross-child", if gpu { "gpu" } else { "host" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|_| Error::Worker {
            what: "cannot start the other process",
        })?;
    let mut lines = BufReader::new(
        child
            .stdout
            .take()
            .ok_or(Error::Worker { what: "no pipe" })?,
    )
    .lines();
    let line = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let addr = line
        .strip_prefix("addr=")
        .and_then(|a| a.parse::<u64>().ok())
        .unwrap_or(0);
    let own = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let driver = Driver::open()?;
    let (provider, len) = if gpu {
        (Provider::Nvidia, 1 << 16)
    } else {
        (Provider::Host, 4096)
    };
    // SAFETY: another process's address, on purpose: the module looks it up in this process
    // and refuses it (the test expects ENXIO); nothing is transferred.
    let r = unsafe { driver.register_range(provider, addr, len, RegisterOptions::new()) };
    let what = if gpu {
        "foreign_gpu_va"
    } else {
        "foreign_host_addr"
    };
    match &r {
        // Host memory at that address here is this process's own, if anything is mapped
        // there at all: never the other process's bytes.
        Ok(reg) if !gpu => {
            let mine = read_own_byte(addr);
            println!(
                "{what}=OK_OWN_MEMORY handle={:#x} byte={mine:?}",
                reg.handle()
            );
        }
        _ => println!("{what}={}", outcome(&r)),
    }
    println!("{own}");
    drop(r);
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"done\n");
    }
    let _ = child.wait();
    Ok(())
}

/// The byte at `addr` in this process, if it is mapped (through /proc/self/mem, which fails
/// cleanly where nothing is).
fn read_own_byte(addr: u64) -> Option<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/mem").ok()?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, addr).ok().map(|()| b[0])
}

fn cross_child(kind: &str) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    if kind == "gpu" {
        let egpu = Egpu::open()?;
        let alloc = egpu.alloc(1 << 16)?;
        println!("addr={}", alloc.device_address());
        println!("owner_gpu_va={}", outcome(&driver.register(&alloc)));
        wait_parent();
        drop(alloc);
    } else {
        let mut buf = HostBuffer::new(4096)?;
        buf.fill(0x5a);
        println!("addr={}", buf.device_address());
        println!("owner_host_addr={}", outcome(&driver.register(&buf)));
        wait_parent();
    }
    Ok(())
}

fn wait_parent() {
    let _ = std::io::stdout().flush();
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

fn pass_fd(dev: &str, uid: u32, gid: u32) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let buf = HostBuffer::new(1 << 16)?;
    let reg = driver.register(&buf)?;
    let ro = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(|_| Error::Worker {
            what: "cannot open DEV",
        })?;
    let (mine, theirs) = UnixStream::pair().map_err(|_| Error::Worker { what: "socketpair" })?;
    let exe = std::env::current_exe().map_err(|_| Error::Worker {
        what: "no executable path",
    })?;
    let mut child = Command::new(exe)
        .args(["pass-fd-child", dev, &uid.to_string(), &gid.to_string()])
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .map_err(|_| Error::Worker {
            what: "cannot start the receiver",
        })?;
    let fds = [driver.as_raw_fd(), ro.as_raw_fd()];
    let handle = reg.handle().to_le_bytes();
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        mine.as_raw_fd(),
        &[IoSlice::new(&handle)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(|_| Error::Worker { what: "sendmsg" })?;
    let _ = child.wait();
    drop(reg);
    Ok(())
}

fn pass_fd_child(dev: &str, uid: u32, gid: u32) -> gdirect::Result<()> {
    // Become the unprivileged user (in the device's group) before receiving anything.
    let groups = [gid];
    // SAFETY: plain syscalls; `groups` outlives the call; this process holds no state that
    // depends on its credentials.
    let ok = unsafe {
        libc::setgroups(1, groups.as_ptr()) == 0 && libc::setgid(uid) == 0 && libc::setuid(uid) == 0
    };
    if !ok {
        return Err(Error::Worker {
            what: "cannot drop privileges",
        });
    }
    println!("receiver_uid={}", nix::unistd::getuid());
    let sock: RawFd = 0;
    let mut handle = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(&mut handle)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::empty())
        .map_err(|_| Error::Worker { what: "recvmsg" })?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(|_| Error::Worker { what: "cmsgs" })? {
        if let ControlMessageOwned::ScmRights(v) = c {
            fds.extend(v);
        }
    }
    let handle = u64::from_le_bytes(handle);
    let [dev_fd, ro_fd] = fds[..] else {
        return Err(Error::Worker {
            what: "expected two descriptors",
        });
    };
    // SAFETY: descriptors just received, owned by this process from now on.
    let (dev_fd, ro_fd) = unsafe { (OwnedFd::from_raw_fd(dev_fd), OwnedFd::from_raw_fd(ro_fd)) };
    println!(
        "receiver_open_dev={}",
        std::fs::File::open(dev).map_or_else(
            |e| format!(
                "{:?}",
                nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))
            ),
            |_| "OK".into()
        )
    );
    let io = |code: u32, fd: RawFd, h: u64| {
        let mut a = gdirect::raw::gdirect_io_args {
            handle: h,
            len: 4096,
            fd: ro_fd.as_raw_fd(),
            ..Default::default()
        };
        // SAFETY: a valid argument struct for the command; the module keeps no pointer.
        let r = unsafe { libc::ioctl(fd, code as _, &mut a) };
        if r == 0 {
            "OK".to_string()
        } else {
            format!("{:?}", nix::errno::Errno::last())
        }
    };
    let dev_raw = dev_fd.as_raw_fd();
    println!(
        "receiver_read_passed={}",
        io(gdirect::raw::GDIRECT_IOC_READ, dev_raw, handle)
    );
    println!(
        "receiver_write_passed_ro={}",
        io(gdirect::raw::GDIRECT_IOC_WRITE, dev_raw, handle)
    );
    match Driver::open() {
        Ok(own) => {
            println!(
                "receiver_handle_on_own_open={}",
                io(gdirect::raw::GDIRECT_IOC_READ, own.as_raw_fd(), handle)
            );
        }
        Err(e) => println!(
            "receiver_handle_on_own_open=open:{}",
            e.errno().map_or("?".into(), |e| format!("{e:?}"))
        ),
    }
    Ok(())
}
