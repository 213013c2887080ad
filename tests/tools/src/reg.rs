// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-reg`: registration scenarios for the selftests. Each prints `key=value` lines (and
//! `FAIL: ...` lines for failed checks) that the scripts assert, and exits 1 when a check failed.
//!
//! Usage: gdirect-reg SCENARIO ARGS...
//!   host SIZE PEER                 register a host buffer; addresses vs /proc/self/pagemap
//!   egpu SIZE PEER [persistent]    register emulated GPU memory; addresses vs its BAR
//!   p2pmem BDF SIZE PEER           register BDF's published P2P memory; addresses in its BAR
//!   errors PEER P2PMEM_BDF         every bad REGISTER/UNREGISTER/QUERY, one `case=ERRNO` line each
//!   limits                         EDQUOT and EMFILE under small limits (module loaded with them)
//!   revoke PEER [persistent]       free registered emulated GPU memory underneath
//!   hold P2PMEM_BDF                register host, egpu and p2pmem memory, print ready, sleep
//!   stress THREADS CYCLES PEER     register/query/unregister loops on host and egpu memory
//!   egpu-info                      the emulated GPU's allocations, mappings and callbacks
//!   revoke-race ROUNDS PEER        free GPU memory while another thread queries and unregisters it
//! Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or setup error.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::fd::{AsRawFd, OwnedFd},
    process::ExitCode,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use gdirect::{
    egpu::{Egpu, PAGE_SIZE as EGPU_PAGE},
    raw, DeviceMemory, Driver, Errno, Error, HostBuffer, MapType, P2pMem, PciAddress, Provider,
    RegisterOptions,
};

/// Failed checks so far.
static FAILURES: AtomicU64 = AtomicU64::new(0);

fn check(what: &str, ok: bool, detail: impl FnOnce() -> String) {
    if !ok {
        FAILURES.fetch_add(1, Ordering::Relaxed);
        println!("FAIL: {what}: {}", detail());
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: gdirect-reg host|egpu|p2pmem|errors|limits|revoke|hold|stress|egpu-info ARGS (see the source's header)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let peer = |i: usize| arg(i).and_then(|s| s.parse::<PciAddress>().ok());
    let num = |i: usize| arg(i).and_then(|s| s.parse::<u64>().ok());
    let result = match (
        arg(0),
        arg(3) == Some("persistent") || arg(2) == Some("persistent"),
    ) {
        (Some("host"), _) => match (num(1), peer(2)) {
            (Some(size), Some(p)) => host(size, p),
            _ => return usage(),
        },
        (Some("egpu"), persistent) => match (num(1), peer(2)) {
            (Some(size), Some(p)) => egpu(size, p, persistent),
            _ => return usage(),
        },
        (Some("p2pmem"), _) => match (peer(1), num(2), peer(3)) {
            (Some(dev), Some(size), Some(p)) => p2pmem(dev, size, p),
            _ => return usage(),
        },
        (Some("errors"), _) => match (peer(1), peer(2)) {
            (Some(p), Some(dev)) => errors(p, dev),
            _ => return usage(),
        },
        (Some("limits"), _) => limits(),
        (Some("egpu-info"), _) => egpu_info(),
        (Some("revoke-race"), _) => match (num(1), peer(2)) {
            (Some(rounds), Some(p)) => revoke_race(rounds, p),
            _ => return usage(),
        },
        (Some("revoke"), persistent) => match peer(1) {
            Some(p) => revoke(p, persistent),
            _ => return usage(),
        },
        (Some("hold"), _) => match peer(1) {
            Some(dev) => hold(dev),
            _ => return usage(),
        },
        (Some("stress"), _) => match (num(1), num(2), peer(3)) {
            (Some(t), Some(c), Some(p)) => stress(t, c, p),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Err(e) => {
            println!("FAIL: {e}");
            ExitCode::from(2)
        }
        Ok(()) if FAILURES.load(Ordering::Relaxed) > 0 => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
    }
}

/// The physical address of the page holding `addr` in this process, from `/proc/self/pagemap`.
fn pagemap_phys(addr: u64) -> std::io::Result<u64> {
    let mut f = File::open("/proc/self/pagemap")?;
    f.seek(SeekFrom::Start(addr / 4096 * 8))?;
    let mut entry = [0u8; 8];
    f.read_exact(&mut entry)?;
    let entry = u64::from_le_bytes(entry);
    Ok((entry & ((1 << 55) - 1)) * 4096)
}

fn host(size: u64, peer: PciAddress) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let mut buf = HostBuffer::new(size as usize)?;
    buf.as_mut_slice().fill(0x5a);
    let reg = driver.register(&buf)?;
    println!(
        "page_size={} page_count={}",
        reg.page_size(),
        reg.page_count()
    );
    let info = driver.info()?;
    println!(
        "file_registrations={} file_pinned_bytes={}",
        info.file_registrations, info.file_pinned_bytes
    );
    let map = reg.query(peer)?;
    println!(
        "map_type={} addrs={} owner={:?}",
        map.map_type,
        map.addrs.len(),
        map.owner
    );
    let mut matched = 0;
    for (i, a) in map.addrs.iter().enumerate() {
        match pagemap_phys(buf.device_address() + i as u64 * 4096) {
            Ok(phys) if phys == *a => matched += 1,
            Ok(phys) => check("address equals the page's physical address", false, || {
                format!("page {i}: {a:#x} vs pagemap {phys:#x}")
            }),
            Err(e) => check("pagemap readable", false, || e.to_string()),
        }
    }
    println!("pagemap_match={matched}/{}", map.addrs.len());
    reg.unregister()?;
    let info = driver.info()?;
    println!(
        "after_unregister file_registrations={} file_pinned_bytes={}",
        info.file_registrations, info.file_pinned_bytes
    );
    Ok(())
}

fn egpu(size: u64, peer: PciAddress, persistent: bool) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(size)?;
    let bar = gpu.info()?.bar_bus_addr;
    let reg = driver.register_with(&alloc, RegisterOptions::new().persistent(persistent))?;
    println!(
        "va={:#x} bar_offset={:#x} bar_bus_addr={bar:#x}",
        alloc.va(),
        alloc.bar_offset()
    );
    println!(
        "page_size={} page_count={}",
        reg.page_size(),
        reg.page_count()
    );
    println!("egpu_mappings={}", gpu.info()?.mappings);
    let map = reg.query(peer)?;
    println!(
        "map_type={} addrs={} owner={}",
        map.map_type,
        map.addrs.len(),
        map.owner.map_or("none".into(), |o| o.to_string())
    );
    if map.map_type == MapType::BusAddr {
        let expected: Vec<u64> = (0..reg.page_count())
            .map(|i| bar + alloc.bar_offset() + i * EGPU_PAGE)
            .collect();
        let matched = map
            .addrs
            .iter()
            .zip(&expected)
            .filter(|(a, e)| a == e)
            .count();
        check(
            "bus addresses are BAR2 + offset + i * 64 KiB",
            matched == expected.len() && map.addrs.len() == expected.len(),
            || {
                format!(
                    "{matched} of {} match; first {:#x?} vs {:#x?}",
                    expected.len(),
                    map.addrs.first(),
                    expected.first()
                )
            },
        );
        println!("bus_match={matched}/{}", expected.len());
    }
    // A second query of the same peer answers from the mapping made the first time.
    check(
        "a second query gives the same addresses",
        reg.query(peer)?.addrs == map.addrs,
        String::new,
    );
    reg.unregister()?;
    println!("after_unregister egpu_mappings={}", gpu.info()?.mappings);
    Ok(())
}

/// The start and end of each memory BAR of a device, from sysfs.
fn bars(dev: PciAddress) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(dev.sysfs_path().join("resource")).unwrap_or_default();
    text.lines()
        .take(6)
        .filter_map(|l| {
            let mut f = l
                .split_whitespace()
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok());
            Some((f.next()??, f.next()??))
        })
        .filter(|(s, e)| *e > *s)
        .collect()
}

fn p2pmem(dev: PciAddress, size: u64, peer: PciAddress) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let mut mem = P2pMem::allocate(dev, size as usize)?;
    mem.write(0, b"gdirect");
    let reg = driver.register(&mem)?;
    println!(
        "page_size={} page_count={}",
        reg.page_size(),
        reg.page_count()
    );
    let map = reg.query(peer)?;
    println!(
        "map_type={} addrs={} owner={}",
        map.map_type,
        map.addrs.len(),
        map.owner.map_or("none".into(), |o| o.to_string())
    );
    check(
        "the owner is the device the memory came from",
        map.owner == Some(dev),
        || format!("{:?}", map.owner),
    );
    if !map.addrs.is_empty() {
        let in_bar = map
            .addrs
            .iter()
            .all(|a| bars(dev).iter().any(|(s, e)| a >= s && a + 4095 <= *e));
        let contiguous = map.addrs.windows(2).all(|w| w[1] == w[0] + 4096);
        println!("in_bar={in_bar} contiguous={contiguous}");
    }
    Ok(())
}

/// One raw ioctl on `fd`, answered with the errno name or `OK`.
fn raw_ioctl<T>(fd: &impl AsRawFd, cmd: u32, args: &mut T) -> String {
    // SAFETY: `args` is the command's argument struct, valid and writable for the call.
    let ret = unsafe { nix::libc::ioctl(fd.as_raw_fd(), cmd as _, std::ptr::from_mut(args)) };
    match Errno::result(ret) {
        Ok(_) => "OK".into(),
        Err(e) => format!("{e:?}"),
    }
}

fn register_raw(
    fd: &impl AsRawFd,
    provider: u32,
    addr: u64,
    len: u64,
    flags: u32,
) -> (String, u64) {
    let mut a = raw::gdirect_register_args {
        provider,
        addr,
        len,
        flags,
        ..Default::default()
    };
    let r = raw_ioctl(fd, raw::GDIRECT_IOC_REGISTER, &mut a);
    (r, a.handle)
}

fn unregister_raw(fd: &impl AsRawFd, handle: u64) -> String {
    let mut a = raw::gdirect_unregister_args {
        handle,
        ..Default::default()
    };
    raw_ioctl(fd, raw::GDIRECT_IOC_UNREGISTER, &mut a)
}

fn open_dev() -> gdirect::Result<OwnedFd> {
    nix::fcntl::open(
        gdirect::DEFAULT_DEVICE_PATH,
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|errno| Error::Open {
        path: gdirect::DEFAULT_DEVICE_PATH.into(),
        errno,
    })
}

fn errors(peer: PciAddress, p2p_dev: PciAddress) -> gdirect::Result<()> {
    let a = open_dev()?;
    let b = open_dev()?;
    let buf = HostBuffer::new(64 << 10)?;
    let addr = buf.device_address();
    let host = Provider::Host.id();
    let nvidia = Provider::Nvidia.id();
    let p2pdma = Provider::P2pdma.id();
    let gpu = Egpu::open()?;
    let galloc = gpu.alloc(EGPU_PAGE)?;
    let p2p = P2pMem::allocate(p2p_dev, 4096)?;
    let out = |case: &str, r: String| println!("{case}={r}");

    out("zero_length", register_raw(&a, host, addr, 0, 0).0);
    out(
        "unaligned_address",
        register_raw(&a, host, addr + 1, 4096, 0).0,
    );
    out("unaligned_length", register_raw(&a, host, addr, 4095, 0).0);
    out(
        "nvidia_unaligned_address",
        register_raw(&a, nvidia, galloc.va() + 4096, EGPU_PAGE, 0).0,
    );
    out(
        "overflow",
        register_raw(&a, host, u64::MAX - 4095, 8192, 0).0,
    );
    out("unknown_provider", register_raw(&a, 7, addr, 4096, 0).0);
    out(
        "unknown_flags",
        register_raw(&a, host, addr, 4096, 1 << 7).0,
    );
    out(
        "persistent_not_nvidia",
        register_raw(&a, host, addr, 4096, raw::GDIRECT_REGISTER_PERSISTENT).0,
    );
    let mut r = raw::gdirect_register_args {
        provider: host,
        addr,
        len: 4096,
        reserved: [1, 0],
        ..Default::default()
    };
    out("reserved", raw_ioctl(&a, raw::GDIRECT_IOC_REGISTER, &mut r));
    // Memory the provider does not own.
    let gone = HostBuffer::new(8192)?;
    let gone_addr = gone.device_address();
    drop(gone);
    out(
        "host_unmapped",
        register_raw(&a, host, gone_addr, 8192, 0).0,
    );
    out(
        "host_on_p2pmem",
        register_raw(&a, host, p2p.device_address(), 4096, 0).0,
    );
    out("p2pdma_on_host", register_raw(&a, p2pdma, addr, 4096, 0).0);
    out(
        "nvidia_unallocated",
        register_raw(&a, nvidia, galloc.va() + 128 * EGPU_PAGE, EGPU_PAGE, 0).0,
    );
    // Handles.
    let (ok, handle) = register_raw(&a, host, addr, 4096, 0);
    out("register_ok", ok);
    out("other_file_handle", unregister_raw(&b, handle));
    out(
        "never_made_handle",
        unregister_raw(&a, (handle & !0xffff_ffff) | 0xffff_fff0),
    );
    out("unregister_ok", unregister_raw(&a, handle));
    out("double_unregister", unregister_raw(&a, handle));
    // QUERY.
    let (_, handle) = register_raw(&a, host, addr, 4096, 0);
    let mut dest = [0u64; 1];
    let query = |peer_domain: u32, peer_bdf: u32, flags: u32, addrs: u64| {
        let mut q = raw::gdirect_query_args {
            handle,
            peer_domain,
            peer_bdf,
            addrs,
            max_entries: 1,
            flags,
            ..Default::default()
        };
        raw_ioctl(&a, raw::GDIRECT_IOC_QUERY, &mut q)
    };
    out(
        "query_ok",
        query(peer.domain, peer.bdf(), 0, dest.as_mut_ptr() as u64),
    );
    out(
        "query_no_such_peer",
        query(0, 0xff << 8, 0, dest.as_mut_ptr() as u64),
    );
    out(
        "query_flags",
        query(peer.domain, peer.bdf(), 1, dest.as_mut_ptr() as u64),
    );
    out("query_bad_pointer", query(peer.domain, peer.bdf(), 0, 8));
    out("unregister_ok2", unregister_raw(&a, handle));
    Ok(())
}

/// Each round: one thread frees a registered allocation (the GPU driver's free, with its
/// callback) while another queries and then unregisters it, with the two started a varying few
/// microseconds apart so that the free lands before, during and after the unregister.
fn revoke_race(rounds: u64, peer: PciAddress) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let (mut revoked, mut unregistered_first) = (0, 0);
    for round in 0..rounds {
        let alloc = gpu.alloc(2 * EGPU_PAGE)?;
        let va = alloc.va();
        let reg = driver.register(&alloc)?;
        // The two sides start a varying time apart, either one first.
        let step = round % 50;
        let (free_delay, use_delay) = (
            Duration::from_micros(step * 40),
            Duration::from_micros((49 - step) * 40),
        );
        let report = std::thread::scope(|s| {
            let freer = s.spawn(|| {
                std::thread::sleep(free_delay);
                gpu.free_va(va)
            });
            std::thread::sleep(use_delay);
            match reg.query(peer) {
                Ok(_) => {}
                Err(Error::Revoked { .. }) => {}
                Err(e) => check("query during the race", false, || e.to_string()),
            }
            if let Err(e) = reg.unregister() {
                check("unregister during the race", false, || e.to_string());
            }
            freer.join()
        });
        match report {
            Ok(Ok(r)) if r.callbacks == 1 => revoked += 1,
            Ok(Ok(_)) => unregistered_first += 1,
            Ok(Err(e)) => check("free during the race", false, || e.to_string()),
            Err(_) => check("free thread", false, || "panicked".into()),
        }
        drop(alloc);
    }
    println!("rounds={rounds} revoked={revoked} unregistered_first={unregistered_first}");
    let info = driver.info()?;
    println!(
        "registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    Ok(())
}

fn egpu_info() -> gdirect::Result<()> {
    let info = Egpu::open()?.info()?;
    println!(
        "allocations={} mappings={} callbacks={} bar_bus_addr={:#x} bar_len={} free_bytes={}",
        info.allocations,
        info.mappings,
        info.callbacks,
        info.bar_bus_addr,
        info.bar_len,
        info.free_bytes
    );
    Ok(())
}

fn limits() -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let info = driver.info()?;
    println!(
        "max_pinned_bytes={} max_registrations={}",
        info.max_pinned_bytes, info.max_registrations
    );
    let big = HostBuffer::new(info.max_pinned_bytes as usize + 4096)?;
    let r = driver.register(&big);
    println!(
        "over_pin_limit={}",
        r.err()
            .and_then(|e| e.errno())
            .map_or("OK".into(), |e| format!("{e:?}"))
    );
    let bufs: Vec<HostBuffer> = (0..=info.max_registrations)
        .map(|_| HostBuffer::new(4096))
        .collect::<gdirect::Result<_>>()?;
    let mut regs = Vec::new();
    let mut last = "OK".to_string();
    for b in &bufs {
        match driver.register(b) {
            Ok(r) => regs.push(r),
            Err(e) => {
                last = e.errno().map_or("?".into(), |e| format!("{e:?}"));
                break;
            }
        }
    }
    println!("registered={} over_registration_limit={last}", regs.len());
    Ok(())
}

fn revoke(peer: PciAddress, persistent: bool) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let before = driver.info()?.revocations;
    let alloc = gpu.alloc(4 * EGPU_PAGE)?;
    let reg = driver.register_with(&alloc, RegisterOptions::new().persistent(persistent))?;
    let map = reg.query(peer)?;
    println!(
        "before_free map_type={} addrs={}",
        map.map_type,
        map.addrs.len()
    );
    // `alloc` is borrowed by `reg`; free the same allocation through its address, as another
    // thread's cudaFree would.
    let report = gpu.free_va(alloc.va())?;
    println!(
        "free_callbacks={} free_deferred={}",
        report.callbacks, report.deferred
    );
    let after = reg.query(peer);
    println!(
        "query_after_free={}",
        after
            .as_ref()
            .err()
            .and_then(Error::errno)
            .map_or("OK".into(), |e| format!("{e:?}"))
    );
    println!("revocations_delta={}", driver.info()?.revocations - before);
    println!(
        "egpu_allocations_before_unregister={}",
        gpu.info()?.allocations
    );
    reg.unregister()?;
    let info = driver.info()?;
    println!(
        "after_unregister registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    println!(
        "egpu_allocations_after_unregister={} egpu_mappings={}",
        gpu.info()?.allocations,
        gpu.info()?.mappings
    );
    Ok(())
}

fn hold(p2p_dev: PciAddress) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let buf = HostBuffer::new(1 << 20)?;
    let gpu = Egpu::open()?;
    let galloc = gpu.alloc(4 * EGPU_PAGE)?;
    let p2p = P2pMem::allocate(p2p_dev, 64 << 10)?;
    let _regs = [
        driver.register(&buf)?,
        driver.register(&galloc)?,
        driver.register(&p2p)?,
    ];
    let info = driver.info()?;
    println!(
        "ready registrations={} pinned_bytes={}",
        info.file_registrations, info.file_pinned_bytes
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn stress(threads: u64, cycles: u64, peer: PciAddress) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (driver, gpu, done) = (&driver, &gpu, &done);
            s.spawn(move || {
                for c in 0..cycles {
                    let r = (|| -> gdirect::Result<()> {
                        if (t + c) % 2 == 0 {
                            let buf = HostBuffer::new(((c % 8 + 1) * 4096) as usize)?;
                            let reg = driver.register(&buf)?;
                            if c % 16 == 0 {
                                reg.query(peer)?;
                            }
                            reg.unregister()
                        } else {
                            let alloc = gpu.alloc((c % 4 + 1) * EGPU_PAGE)?;
                            let reg = driver.register(&alloc)?;
                            if c % 16 == 1 {
                                reg.query(peer)?;
                            }
                            reg.unregister()
                        }
                    })();
                    match r {
                        Ok(()) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => check("register/unregister cycle", false, || {
                            format!("thread {t} cycle {c}: {e}")
                        }),
                    }
                }
            });
        }
    });
    println!("cycles={}", done.load(Ordering::Relaxed));
    let info = driver.info()?;
    println!(
        "file_registrations={} file_pinned_bytes={}",
        info.file_registrations, info.file_pinned_bytes
    );
    Ok(())
}
