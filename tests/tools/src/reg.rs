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
//!   revoke-quota SIZE              with max_pinned_bytes = SIZE: a registration of SIZE bytes of
//!                                  GPU memory, a second refused; the first's memory freed,
//!                                  the second (its unregister still to come) let in
//!   hold P2PMEM_BDF                register host, egpu and p2pmem memory, print ready, sleep
//!   memcg SIZE COUNT               COUNT registrations of one host buffer of SIZE bytes: the
//!                                  `kernel` bytes of the caller's memory cgroup before and after
//!                                  (the page arrays, 8 bytes a page, are charged to it)
//!   pin host|egpu SIZE [hold]      one registration of SIZE bytes as the caller (egpu ...
//!                                  persistent: a persistent one): prints
//!                                  `register=OK` (with the user's pinned bytes) or
//!                                  `register=ERRNO [egpu_mappings=N] kind=KIND error=MESSAGE`
//!                                  (N: page tables the emulated GPU still holds then, its
//!                                  memory still allocated) and `vmpin_kb=N` (VmPin of
//!                                  /proc/self/status); with hold, then `ready pid=PID`, and
//!                                  sleep until killed; with hold-exec, the same after an exec
//!                                  of `sleep` that keeps the device file open; with hold-exit,
//!                                  a forked child keeps the file open and sleeps (PID: its) while
//!                                  the registering process exits
//!   stress THREADS CYCLES PEER     register/query/unregister loops on host and egpu memory
//!   egpu-info                      the emulated GPU's allocations, mappings and callbacks
//!   opener-charge UID GID SIZE     the device opened as root, then the process becomes UID
//!                                  (group GID) and registers SIZE bytes of GPU memory through
//!                                  that file: the user pinned bytes that file reports (the
//!                                  opener's), and a file it opens as UID
//!   other-mm DEV                   a device file used by a forked child and by an exec'd
//!                                  program: every command from each (`fork_*=`, `exec_*=`
//!                                  lines), and the opener's reads of DEV before and after
//!   pin-race SECONDS               REGISTERs racing for max_pinned_bytes: a competitor that
//!                                  must be refused while a holder keeps half of it, and lengths
//!                                  that wrap the module's total (see the function)
//!   pin-wait                       a REGISTER of GPU memory waiting behind a put that
//!                                  waits in a free's window, and meanwhile a host REGISTER
//!                                  that fits only if the waiting one holds no share of
//!                                  max_pinned_bytes (see the function)
//!   userns-share OWNER BASE SIZE   a user namespace that OWNER makes (uids 0-65535 mapped to
//!                                  BASE.., as newuidmap maps subordinate uids): its uid 0 holds
//!                                  SIZE bytes of GPU memory registered while its uid 1 asks for
//!                                  SIZE (`ns_uid1=`), OWNER for SIZE/2 (`owner=`) and root for
//!                                  SIZE (`root=`); then OWNER for SIZE (`owner_after=`)
//!   egpu-free-kept VA              free a kept allocation (GDIRECT_EGPU_KEEP=1 gdirect read)
//!   bar1-share SIZE                two registrations of one allocation of SIZE bytes: both
//!                                  outcomes and the emulated GPU's BAR1 use with both held
//!   pidns-put                      a registration whose last descriptor is closed by a process
//!                                  with the pinner's pid number (both pid 1, in two pid
//!                                  namespaces): the emulated GPU's foreign puts, tables, callbacks
//!   revoke-race ROUNDS PEER        free GPU memory while another thread queries and unregisters it
//!   put-race ROUNDS PEER DEV       each interleaving of the registration's end (put_pages) with
//!                                  the free callback, forced with the emulated GPU's delay knob
//!   put-reuse ROUNDS               (the emulated GPU loaded with reuse_tables=1) a registration
//!                                  ended while a free holds the driver's lock, and meanwhile a
//!                                  REGISTER of other memory of the same process, whose new page
//!                                  table is the freed one's struct: the new table must outlive
//!                                  the old registration's end (see the function)
//!   callback-locked ROUNDS PEER DEV  queries, reads of DEV, unregisters and closes while a free
//!                                  holds the GPU driver's lock and runs the free callback
//!   nopages                        REGISTER of GPU memory without struct pages (egpu nopages=1)
//!   query-stall PEER               a QUERY whose output buffer faults (userfaultfd, not served)
//!   lock-stall read|write FILE [keep]
//!                                  a transfer between FILE (ext4 or XFS) and GPU memory meeting
//!                                  the inode's lock held by a buffered write stalled in a
//!                                  userfaultfd (`transfer_blocked=`: its thread asleep in the
//!                                  kernel), and the memory freed meanwhile: the free must not
//!                                  wait for it; with keep, not freed: the transfer must end
//!                                  once the lock goes, every byte right (see the function)
//!   lock-kill read|write FILE      a transfer as lock-stall's, by a child process, at the lock;
//!                                  the child is then killed (SIGKILL): it must end while the
//!                                  lock is still held (see the function)
//!   lock-kill-child read|write FILE  (lock-kill's child)
//!   bounce-stall lock|perm read|write FILE OTHER
//!                                  (the module loaded with bounce_buffers=1) a bounced transfer
//!                                  of FILE (ext4 or XFS) meeting its inode's lock held by a
//!                                  stalled buffered write (lock) or a fanotify permission event
//!                                  nobody answers yet (perm), and meanwhile a bounced read of
//!                                  OTHER, which must get the pool's one chunk (see the function)
//!   perm-stall read|write FILE     a transfer between FILE (ext4 or XFS) and GPU memory meeting
//!                                  a fanotify permission event nobody answers yet (read: an
//!                                  on-access scanner's FAN_ACCESS_PERM; write: a storage
//!                                  manager's FAN_PRE_ACCESS), and the memory freed meanwhile:
//!                                  the free must not wait for the listener (see the function)
//!   pin-stall SIZE                 REGISTER of host memory whose last page faults into a
//!                                  userfaultfd that is never served: `faulted pid=PID` once
//!                                  the pin waits there (the test then kills the process)
//!   query-privilege PEER UNDRIVEN  QUERY of a host registration as the caller is: addresses,
//!                                  the map type alone, and a peer no driver drives
//! Exit status: 0 when every check passed, 1 when one failed, 2 on a usage or setup error.

mod commands;
mod debugfs;

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::fd::{AsRawFd, OwnedFd},
    process::ExitCode,
    sync::atomic::{AtomicI32, AtomicU64, Ordering},
    time::Duration,
};

use gdirect::{
    raw, Batch, DeviceMemory, Driver, Errno, Error, HostBuffer, MapType, P2pMem, PciAddress,
    Provider, RegisterOptions,
};
use gdirect_internals::egpu::{Egpu, PAGE_SIZE as EGPU_PAGE};

/// A GPU virtual address, decimal or 0x-hex.
fn parse_va(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

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
        (Some("opener-charge"), _) => match (num(1), num(2), num(3)) {
            (Some(uid), Some(gid), Some(size)) => opener_charge(uid as u32, gid as u32, size),
            _ => return usage(),
        },
        (Some("other-mm"), _) => match arg(1) {
            Some(dev) => other_mm(dev),
            _ => return usage(),
        },
        (Some("other-mm-exec"), _) => match (num(1), num(2), num(3), num(4)) {
            (Some(fd), Some(handle), Some(data_fd), Some(len)) => {
                every_command("exec", fd as i32, handle, data_fd as i32, len);
                Ok(())
            }
            _ => return usage(),
        },
        (Some("pin-wait"), _) => pin_wait(),
        (Some("userns-share"), _) => match (num(1), num(2), num(3)) {
            (Some(owner), Some(base), Some(size)) => userns_share(owner as u32, base as u32, size),
            _ => return usage(),
        },
        (Some("pin-race"), _) => match num(1) {
            Some(seconds @ 1..=60) => pin_race(seconds),
            _ => return usage(),
        },
        (Some("egpu-info"), _) => egpu_info(),
        (Some("pidns-put"), _) => pidns_put(),
        (Some("bar1-share"), _) => match num(1) {
            Some(size) => bar1_share(size),
            _ => return usage(),
        },
        (Some("pidns-pinner"), _) => pidns_pinner(),
        (Some("pidns-stranger"), _) => pidns_stranger(),
        (Some("egpu-free-kept"), _) => match arg(1).and_then(parse_va) {
            Some(va) => egpu_free_kept(va),
            _ => return usage(),
        },
        (Some("revoke-race"), _) => match (num(1), peer(2)) {
            (Some(rounds), Some(p)) => revoke_race(rounds, p),
            _ => return usage(),
        },
        (Some("put-race"), _) => match (num(1), peer(2), arg(3)) {
            (Some(rounds), Some(p), Some(dev)) => put_race(rounds, p, dev),
            _ => return usage(),
        },
        (Some("put-reuse"), _) => match num(1) {
            Some(rounds) => put_reuse(rounds),
            _ => return usage(),
        },
        (Some("perm-stall"), _) => match (arg(1), arg(2)) {
            (Some("read"), Some(path)) => perm_stall(path, false),
            (Some("write"), Some(path)) => perm_stall(path, true),
            _ => return usage(),
        },
        (Some("lock-stall"), _) => {
            let keep = match arg(3) {
                None => false,
                Some("keep") => true,
                Some(_) => return usage(),
            };
            match (arg(1), arg(2)) {
                (Some("read"), Some(path)) => lock_stall(path, false, keep),
                (Some("write"), Some(path)) => lock_stall(path, true, keep),
                _ => return usage(),
            }
        }
        (Some("lock-kill"), _) => match (arg(1), arg(2)) {
            (Some("read"), Some(path)) => lock_kill(path, false),
            (Some("write"), Some(path)) => lock_kill(path, true),
            _ => return usage(),
        },
        (Some("lock-kill-child"), _) => match (arg(1), arg(2)) {
            (Some("read"), Some(path)) => lock_kill_child(path, false),
            (Some("write"), Some(path)) => lock_kill_child(path, true),
            _ => return usage(),
        },
        (Some("bounce-stall"), _) => {
            let stall = match arg(1) {
                Some("lock") => Stall::Lock,
                Some("perm") => Stall::Perm,
                _ => return usage(),
            };
            match (arg(2), arg(3), arg(4)) {
                (Some("read"), Some(path), Some(other)) => bounce_stall(stall, path, other, false),
                (Some("write"), Some(path), Some(other)) => bounce_stall(stall, path, other, true),
                _ => return usage(),
            }
        }
        (Some("callback-locked"), _) => match (num(1), peer(2), arg(3)) {
            (Some(rounds), Some(p), Some(dev)) => callback_locked(rounds, p, dev),
            _ => return usage(),
        },
        (Some("nopages"), _) => nopages(),
        (Some("query-stall"), _) => match peer(1) {
            Some(p) => query_stall(p),
            _ => return usage(),
        },
        (Some("pin-stall"), _) => match num(1) {
            Some(size) => pin_stall(size),
            _ => return usage(),
        },
        (Some("query-privilege"), _) => match (peer(1), peer(2)) {
            (Some(p), Some(u)) => query_privilege(p, u),
            _ => return usage(),
        },
        (Some("revoke-quota"), _) => match num(1) {
            Some(size) => revoke_quota(size),
            _ => return usage(),
        },
        (Some("revoke"), persistent) => match peer(1) {
            Some(p) => revoke(p, persistent),
            _ => return usage(),
        },
        (Some("pin"), _) => match (arg(1), num(2), arg(3)) {
            (Some(kind @ ("host" | "egpu")), Some(size), how) => match how {
                None => pin(kind, size, Hold::No, false),
                Some("hold") => pin(kind, size, Hold::Sleep, false),
                Some("hold-exec") => pin(kind, size, Hold::Exec, false),
                Some("hold-exit") => pin(kind, size, Hold::Exit, false),
                Some("persistent") if kind == "egpu" => pin(kind, size, Hold::No, true),
                _ => return usage(),
            },
            _ => return usage(),
        },
        (Some("memcg"), _) => match (num(1), num(2)) {
            (Some(size), Some(count @ 1..=64)) => memcg(size, count),
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
    buf.fill(0x5a);
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
    // Where an IOMMU translates for the peer, each address is an IOVA: the kernel's page table
    // of the peer's domain gives the physical address it reaches; without one, the address is.
    let table = iommu_translations(peer);
    let mut matched = 0;
    for (i, a) in map.addrs.iter().enumerate() {
        let reaches = match &table {
            None => Some(*a),
            Some(t) => t.get(&(a >> 12)).map(|p| p | (a & 0xfff)),
        };
        match pagemap_phys(buf.device_address() + i as u64 * 4096) {
            Ok(phys) if Some(phys) == reaches => matched += 1,
            Ok(phys) => check("address reaches the page's physical address", false, || {
                format!("page {i}: {a:#x} reaches {reaches:#x?} vs pagemap {phys:#x}")
            }),
            Err(e) => check("pagemap readable", false, || e.to_string()),
        }
    }
    println!(
        "pagemap_match={matched}/{} translated_by_iommu={}",
        map.addrs.len(),
        table.is_some()
    );
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
    // A new allocation holds the emulated GPU's poison byte (0xe9) everywhere.
    let mut fresh = vec![0u8; size as usize];
    alloc.read(0, &mut fresh)?;
    let poisoned = fresh.iter().all(|&b| b == 0xe9);
    let bar = gpu.info()?.bar_bus_addr;
    let pages = alloc.bar_pages()?;
    // The emulated GPU scatters an allocation's pages: no two in a row adjacent in the BAR.
    let adjacent = pages
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) == EGPU_PAGE)
        .count();
    let reg = driver.register_with(&alloc, RegisterOptions::new().persistent(persistent))?;
    println!(
        "va={:#x} first_bar_page={:#x} bar_bus_addr={bar:#x} poisoned={poisoned} pages={} adjacent_pages={adjacent}",
        alloc.va(),
        pages.first().copied().unwrap_or(0),
        pages.len()
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
        // Each page where the emulated GPU put it, read from its page directory.
        let expected: Vec<u64> = pages.iter().map(|p| bar + p).collect();
        let matched = map
            .addrs
            .iter()
            .zip(&expected)
            .filter(|(a, e)| a == e)
            .count();
        check(
            "bus addresses are BAR2 + each page's offset",
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
    if map.map_type == MapType::ThruHostBridge {
        // Through the host bridge the addresses are the peer's DMA addresses: with an IOMMU,
        // IOVAs of its domain. The kernel's own page table of that domain (intel-iommu's debugfs,
        // not the module) must translate every 4 KiB of each to the page's place in the BAR (x86:
        // bus address = CPU physical address, as register_nvidia.sh checks against sysfs).
        match iommu_translations(peer) {
            None => println!("iommu_match=none"),
            Some(table) => {
                let matched = map
                    .addrs
                    .iter()
                    .zip(&pages)
                    .filter(|(iova, page)| {
                        (0..EGPU_PAGE / 4096).all(|k| {
                            table.get(&((**iova >> 12) + k)) == Some(&(bar + **page + k * 4096))
                        })
                    })
                    .count();
                check(
                    "the IOMMU translates each address to its page in the BAR",
                    matched == pages.len() && map.addrs.len() == pages.len(),
                    || {
                        format!(
                            "{matched} of {} match; first {:#x?} -> {:#x?}, expected {:#x?}",
                            pages.len(),
                            map.addrs.first(),
                            map.addrs.first().and_then(|a| table.get(&(a >> 12))),
                            pages.first().map(|p| bar + p)
                        )
                    },
                );
                println!("iommu_match={matched}/{}", pages.len());
            }
        }
    }
    // A second query of the same peer answers from the mapping made the first time.
    check(
        "a second query gives the same addresses",
        reg.query(peer)?.addrs == map.addrs,
        String::new,
    );
    reg.unregister()?;
    println!("after_unregister egpu_mappings={}", gpu.info()?.mappings);
    if map.map_type == MapType::ThruHostBridge {
        // Nothing of the BAR stays mapped for the peer once the registration is gone: the
        // kernel's page table of the peer's domain, after the module's dma_unmap_resource.
        if let Some(table) = iommu_translations(peer) {
            let size = gpu.info()?.bar_len;
            let left = table
                .values()
                .filter(|phys| (bar..bar + size).contains(phys))
                .count();
            check(
                "no IOVA of the peer maps the BAR after unregister",
                left == 0,
                || format!("{left} pages of the BAR still mapped"),
            );
            println!("after_unregister iommu_bar_pages={left}");
        }
    }
    Ok(())
}

/// The 4 KiB translations (IOVA page number to physical address) of `dev`'s IOMMU domain, from
/// intel-iommu's debugfs (`domain_translation_struct`: one line per leaf, the IOVA's page number
/// then the entry of each level, the last one the leaf's), or `None` without one.
fn iommu_translations(dev: PciAddress) -> Option<std::collections::HashMap<u64, u64>> {
    let path = format!("/sys/kernel/debug/iommu/intel/{dev}/domain_translation_struct");
    let text = std::fs::read_to_string(path).ok()?;
    let mut table = std::collections::HashMap::new();
    for line in text.lines() {
        let Some((pfn, entries)) = line.split_once('|') else {
            continue;
        };
        let Ok(pfn) = u64::from_str_radix(pfn.trim().trim_start_matches("0x"), 16) else {
            continue;
        };
        let Some(Ok(leaf)) = entries
            .split_whitespace()
            .last()
            .map(|e| u64::from_str_radix(e.trim_start_matches("0x"), 16))
        else {
            continue;
        };
        // Bits 12 to 51 of a VT-d second-level entry: the page's address.
        table.insert(pfn, leaf & 0x000f_ffff_ffff_f000);
    }
    Some(table)
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

/// How long a free holds the GPU driver's lock between taking its mappings and running the
/// callbacks. The other side acts as soon as it sees them taken ([`wait_for_unlink`]).
const WINDOW: Duration = Duration::from_millis(60);

/// A registration's end meeting a free in its window while a REGISTER of other memory of the
/// same process waits for the driver's lock too, the emulated GPU loaded with `reuse_tables=1`
/// (the next page table is the struct of the one freed last, at its address, as a slab's free
/// list hands it back). nvidia.ko's put_pages finds a table by its address among the process's
/// records: a put of the freed table made after the new get_pages would put the new
/// registration's pages. gdirect serializes get_pages and put_pages (`GET_PUT`), so the end
/// waits for the get and then finds its callback run: no put. Each round checks, from the
/// emulated GPU's records, that the new table was the old one's struct (the hazard was there),
/// that the GPU still holds it once the old registration has ended, and that the new
/// registration's own end puts it.
fn put_reuse(rounds: u64) -> gdirect::Result<()> {
    // The free holds the driver's lock this long; the REGISTER is sent first, then the end.
    const HOLD: Duration = Duration::from_millis(400);
    const GET_FIRST: Duration = Duration::from_millis(100);
    let gpu = Egpu::open()?;
    let before = gpu.info()?;
    let mut reused = 0;
    for round in 0..rounds {
        let driver = Driver::open()?;
        let old = gpu.alloc(16 * EGPU_PAGE)?;
        let new = gpu.alloc(16 * EGPU_PAGE)?;
        let reg = driver.register(&old)?;
        let start = gpu.info()?;
        let va = old.va();
        let g = gpu.clone();
        let freer = std::thread::spawn(move || g.free_va_delayed(va, HOLD));
        wait_for_unlink(&gpu, start.mappings)?;
        let new_reg = std::thread::scope(|s| {
            let getter = s.spawn(|| driver.register(&new));
            std::thread::sleep(GET_FIRST);
            let u = reg.unregister();
            check(
                "the old registration's end in the free's window",
                u.is_ok(),
                || format!("round {round}: {u:?}"),
            );
            getter
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        let freed = freer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        check(
            "the free ran the old registration's callback",
            matches!(freed, Ok(ref r) if r.callbacks == 1),
            || format!("round {round}: {freed:?}"),
        );
        let mid = gpu.info()?;
        let new_reg = match new_reg {
            Ok(r) => r,
            Err(e) => {
                check("the new registration", false, || {
                    format!("round {round}: {e}")
                });
                continue;
            }
        };
        reused += mid.tables_reused - start.tables_reused;
        check(
            "the new page table is the freed one's struct (tables_reused)",
            mid.tables_reused - start.tables_reused == 1,
            || format!("round {round}: {}", mid.tables_reused - start.tables_reused),
        );
        check(
            "the GPU still holds the new registration's table after the old one's end",
            mid.mappings == start.mappings,
            || {
                format!(
                    "round {round}: {} page tables, {} before",
                    mid.mappings, start.mappings
                )
            },
        );
        let u = new_reg.unregister();
        check("the new registration's end", u.is_ok(), || {
            format!("round {round}: {u:?}")
        });
        let end = gpu.info()?;
        check(
            "its end put its table, found linked",
            end.mappings + 1 == start.mappings && end.puts_unlinked == start.puts_unlinked,
            || {
                format!(
                    "round {round}: {} page tables ({} before), {} unlinked puts",
                    end.mappings,
                    start.mappings,
                    end.puts_unlinked - start.puts_unlinked
                )
            },
        );
    }
    let after = gpu.info()?;
    let info = Driver::open()?.info()?;
    println!(
        "rounds={rounds} tables_reused={reused} puts_unlinked={} callbacks={}",
        after.puts_unlinked - before.puts_unlinked,
        after.callbacks - before.callbacks
    );
    println!(
        "registrations={} pinned_bytes={} egpu_mappings={}",
        info.registrations, info.pinned_bytes, after.mappings
    );
    Ok(())
}

/// Waits until a free has taken the mappings of the allocation it frees (the emulated GPU's
/// count of page tables held fell below `mapped`; the tables stay linked until each callback
/// has run, as in nvidia.ko): from there the free holds the driver's lock until its callback
/// is done, so what the caller does next meets the free in its window or after it, never
/// before. Polled rather than slept: a slow machine (the debug kernel under TCG, with
/// other work on the host) can take longer than any fixed delay to get the freeing thread there.
fn wait_for_unlink(gpu: &Egpu, mapped: u32) -> gdirect::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gpu.info()?.mappings >= mapped {
        if std::time::Instant::now() > deadline {
            check("the free unlinks the mapping within 10 s", false, || {
                format!("{mapped} mappings still")
            });
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// A query or a read racing a free: it worked, or the memory was revoked first.
fn allowed(what: &str, r: gdirect::Result<()>) {
    match r {
        Ok(()) | Err(Error::Revoked { .. }) => {}
        Err(e) => check(what, false, || e.to_string()),
    }
}

/// Each way the end of a registration (which puts the pages back) can meet the free callback:
/// mode 0 puts first; 1 unregisters while a free holds the driver's lock before the callback
/// (put_pages blocks, then finds the table unlinked and returns 0); 2 unregisters after the
/// callback; 3 closes the file in the window of 1; 4 frees while a read holds a use of the pages;
/// 5 unregisters while a batched read holds the last reference, which then ends on a kernel
/// worker, where nvidia.ko's put_pages finds nothing (so the pages stay with the driver until
/// the free, whose callback must clean up).
/// Every round checks the callback count the free reports; the totals check that the window was
/// hit and that nothing stays registered or mapped.
fn put_race(rounds: u64, peer: PciAddress, dev: &str) -> gdirect::Result<()> {
    let gpu = Egpu::open()?;
    let file = gdirect::File::open_direct(dev)?;
    let before = gpu.info()?;
    let mut by_mode = [0u64; 6];
    let mut orphans_charged = 0u64;
    let orphaned_before = debugfs::counter("orphaned")?;
    for round in 0..rounds {
        let mode = (round % 6) as usize;
        let driver = Driver::open()?;
        let alloc = gpu.alloc(16 * EGPU_PAGE)?;
        let va = alloc.va();
        let reg = driver.register(&alloc)?;
        allowed("query before the free", reg.query(peer).map(|_| ()));
        let mapped = gpu.info()?.mappings;
        let mut expect_callbacks = if mode == 0 { 0 } else { 1 };
        let report = match mode {
            0 => {
                let r = reg.unregister();
                check("unregister before the free", r.is_ok(), || format!("{r:?}"));
                gpu.free_va(va)
            }
            1 | 3 => {
                let g = gpu.clone();
                let freer = std::thread::spawn(move || g.free_va_delayed(va, WINDOW));
                wait_for_unlink(&gpu, mapped)?;
                if mode == 1 {
                    let r = reg.unregister();
                    check("unregister in the window", r.is_ok(), || format!("{r:?}"));
                } else {
                    // Left to the close of the file, which ends it.
                    std::mem::forget(reg);
                    drop(driver);
                }
                freer
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            2 => {
                let r = gpu.free_va(va);
                let u = reg.unregister();
                check("unregister after the callback", u.is_ok(), || {
                    format!("{u:?}")
                });
                r
            }
            5 => {
                let mut b = Batch::new();
                b.read(&file, &reg, 0, 0, 16 * EGPU_PAGE, round);
                let queued = driver.submit(&b, 0)?;
                check("the batched read is queued", queued == 1, || {
                    format!("{queued}")
                });
                let u = reg.unregister();
                check("unregister under a batched read", u.is_ok(), || {
                    format!("{u:?}")
                });
                let done = driver.reap(1, true)?;
                check("the batched read completes", done.len() == 1, || {
                    format!("{done:?}")
                });
                // The worker drops the last reference right after it posts the completion.
                std::thread::sleep(Duration::from_millis(20));
                // If the read was over before the UNREGISTER (the throttle lets bursts through),
                // the registration ended here and put its pages: then no callback is due.
                expect_callbacks = gpu.info()?.mappings;
                // Left to the driver, the pages stay pinned until the free: their share of
                // max_pinned_bytes stays charged until then, then goes.
                let held = driver.info()?.pinned_bytes;
                if expect_callbacks == 1 {
                    orphans_charged += u64::from(held == 16 * EGPU_PAGE);
                    check(
                        "an orphan's pages are charged until the free",
                        held == 16 * EGPU_PAGE,
                        || format!("round {round}: {held} bytes pinned"),
                    );
                }
                let r = gpu.free_va(va);
                let after = driver.info()?.pinned_bytes;
                check("the free gives the charge back", after == 0, || {
                    format!("round {round}: {after} bytes pinned after the free")
                });
                r
            }
            _ => {
                let r = std::thread::scope(|s| {
                    let reader = s.spawn(|| {
                        allowed(
                            "read racing the free",
                            file.read_into(&reg, 0, 0, 16 * EGPU_PAGE).map(|_| ()),
                        )
                    });
                    std::thread::sleep(Duration::from_millis(1));
                    let r = gpu.free_va(va);
                    let _ = reader.join();
                    r
                });
                let u = reg.unregister();
                check("unregister after a revoked read", u.is_ok(), || {
                    format!("{u:?}")
                });
                r
            }
        };
        match report {
            Ok(r) => check(
                "callbacks the free ran",
                r.callbacks == expect_callbacks,
                || {
                    format!(
                        "round {round} mode {mode}: {} (expected {expect_callbacks})",
                        r.callbacks
                    )
                },
            ),
            Err(e) => check("free", false, || format!("round {round} mode {mode}: {e}")),
        }
        by_mode[mode] += 1;
        drop(alloc);
    }
    let after = gpu.info()?;
    let unlinked = after.puts_unlinked - before.puts_unlinked;
    let window_rounds = by_mode[1] + by_mode[3];
    let orphaned = debugfs::counter("orphaned")? - orphaned_before;
    let foreign = after.puts_foreign - before.puts_foreign;
    println!(
        "rounds={rounds} put_first={} put_in_window={} put_after={} close_in_window={} free_under_read={} ended_on_worker={}",
        by_mode[0], by_mode[1], by_mode[2], by_mode[3], by_mode[4], by_mode[5]
    );
    println!(
        "puts_unlinked={unlinked} puts_foreign={foreign} orphaned={orphaned} orphans_charged={orphans_charged} callbacks={}",
        after.callbacks - before.callbacks
    );
    check(
        "no put_pages from a process that cannot put",
        foreign == 0,
        || format!("{foreign} put_pages calls that put nothing"),
    );
    check(
        "registrations ended on a worker were left to the driver",
        orphaned * 2 >= by_mode[5],
        || format!("{orphaned} of {} rounds", by_mode[5]),
    );
    // Each round of the window should have put its pages while the free held the lock; a very
    // slow machine may miss a few.
    check(
        "put_pages met an unlinked table in the window",
        unlinked * 2 >= window_rounds,
        || format!("{unlinked} of {window_rounds} rounds"),
    );
    let driver = Driver::open()?;
    let info = driver.info()?;
    println!(
        "registrations={} pinned_bytes={} egpu_mappings={}",
        info.registrations, info.pinned_bytes, after.mappings
    );
    Ok(())
}

/// A free holds the GPU driver's lock and runs the free callback under it (as `cudaFree` does
/// in nvidia.ko) while other threads query the registration for the first time, read into it,
/// and unregister or close it. Any nv-p2p call made while holding what the callback waits for
/// deadlocks here (the test's time limit catches it), and lockdep reports the inversion.
fn callback_locked(rounds: u64, peer: PciAddress, dev: &str) -> gdirect::Result<()> {
    let gpu = Egpu::open()?;
    let file = gdirect::File::open_direct(dev)?;
    let before = gpu.info()?;
    for round in 0..rounds {
        let driver = Driver::open()?;
        let alloc = gpu.alloc(16 * EGPU_PAGE)?;
        let va = alloc.va();
        let reg = driver.register(&alloc)?;
        let mapped = gpu.info()?.mappings;
        let g = gpu.clone();
        // Every other free runs on a kernel worker: the callback runs in a kworker.
        let freer = std::thread::spawn(move || {
            if round % 4 < 2 {
                g.free_va_delayed(va, WINDOW)
            } else {
                g.free_va_from_worker(va, WINDOW)
            }
        });
        wait_for_unlink(&gpu, mapped)?;
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                allowed(
                    "read under the driver's lock",
                    file.read_into(&reg, 0, 0, 16 * EGPU_PAGE).map(|_| ()),
                )
            });
            // The first query of this peer makes its addresses while the free holds the lock.
            allowed("query under the driver's lock", reg.query(peer).map(|_| ()));
            let _ = reader.join();
        });
        if round % 2 == 0 {
            let r = reg.unregister();
            check("unregister", r.is_ok(), || format!("{r:?}"));
        } else {
            // Left to the close of the file, which ends it.
            std::mem::forget(reg);
            drop(driver);
        }
        let report = freer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        match report {
            Ok(r) => check("the free ran one callback", r.callbacks == 1, || {
                format!("round {round}: {}", r.callbacks)
            }),
            Err(e) => check("free", false, || format!("round {round}: {e}")),
        }
        drop(alloc);
    }
    let after = gpu.info()?;
    let info = Driver::open()?.info()?;
    println!(
        "rounds={rounds} callbacks={} registrations={} pinned_bytes={} egpu_mappings={}",
        after.callbacks - before.callbacks,
        info.registrations,
        info.pinned_bytes,
        after.mappings
    );
    Ok(())
}

/// GPU memory without `struct page`s (the emulated GPU loaded with `nopages=1`, as BAR1 outside
/// NVIDIA's P2PDMA mode): REGISTER refuses it with its own errno, plain and persistent alike,
/// and puts the pages back at once.
fn nopages() -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(16 * EGPU_PAGE)?;
    for persistent in [false, true] {
        let r = driver.register_with(&alloc, RegisterOptions::new().persistent(persistent));
        let got = match &r {
            Ok(_) => "OK".to_string(),
            Err(e) => e
                .errno()
                .map_or_else(|| e.to_string(), |e| format!("{e:?}")),
        };
        println!("register_persistent_{persistent}={got}");
        if let Err(e) = &r {
            println!("message: {e}");
        }
        check(
            "REGISTER refused with no_struct_pages",
            matches!(r, Err(Error::NoStructPages { .. })),
            || got.clone(),
        );
        let info = gpu.info()?;
        check(
            "the GPU driver holds no page table after the refusal",
            info.mappings == 0,
            || format!("{} mappings", info.mappings),
        );
    }
    // The memory itself is fine: the CPU reaches it through the BAR.
    let info = driver.info()?;
    println!(
        "registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    Ok(())
}

/// `struct uffdio_api` (`linux/userfaultfd.h`).
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
/// `struct uffdio_range`.
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}
/// `struct uffdio_register`.
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
/// `struct uffdio_zeropage`.
#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
nix::ioctl_readwrite!(uffdio_api, 0xAA, 0x3F, UffdioApi);
nix::ioctl_readwrite!(uffdio_register, 0xAA, 0x00, UffdioRegister);
nix::ioctl_readwrite!(uffdio_zeropage, 0xAA, 0x04, UffdioZeropage);

/// A fresh private anonymous mapping of `len` bytes, readable and writable, never unmapped (the
/// scenarios run once per process).
fn anonymous(len: std::num::NonZeroUsize) -> gdirect::Result<std::ptr::NonNull<std::ffi::c_void>> {
    use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
    // SAFETY: a new mapping at an address the kernel picks overlaps no memory in use.
    unsafe {
        mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }
    .map_err(|errno| Error::Allocation {
        what: "an anonymous mapping".into(),
        errno,
    })
}

/// A userfaultfd of this process with `[addr, addr + len)` (its own anonymous memory, not yet
/// touched) registered for missing-page faults: a fault there waits until someone serves it.
fn uffd_missing(addr: u64, len: u64) -> gdirect::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let fail = |what: &'static str| {
        move |errno: Errno| Error::Allocation {
            what: what.into(),
            errno,
        }
    };
    // SAFETY: plain system call; a valid fd on success.
    let raw = unsafe { nix::libc::syscall(nix::libc::SYS_userfaultfd, nix::libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(fail("a userfaultfd")(Errno::last()));
    }
    // SAFETY: the fd was just created and is owned by nothing else.
    let uffd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let mut api = UffdioApi {
        api: 0xAA,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: valid fd and struct.
    unsafe { uffdio_api(uffd.as_raw_fd(), &mut api) }.map_err(fail("UFFDIO_API"))?;
    let mut r = UffdioRegister {
        range: UffdioRange { start: addr, len },
        mode: 1, // UFFDIO_REGISTER_MODE_MISSING
        ioctls: 0,
    };
    // SAFETY: valid fd and struct; the range is the caller's own mapping.
    unsafe { uffdio_register(uffd.as_raw_fd(), &mut r) }.map_err(fail("UFFDIO_REGISTER"))?;
    Ok(uffd)
}

/// An `Error::Allocation` of `what`, from an errno.
fn alloc_error(what: &'static str) -> impl Fn(Errno) -> Error {
    move |errno| Error::Allocation {
        what: what.into(),
        errno,
    }
}

/// A page of fresh anonymous memory whose first touch faults into a userfaultfd that nobody
/// serves until [`StalledPage::serve`]: a kernel copy to or from it waits meanwhile, as one
/// from a page of a stalled FUSE file or of a stalled process's userfaultfd would.
struct StalledPage {
    page: std::ptr::NonNull<std::ffi::c_void>,
    uffd: OwnedFd,
}

impl StalledPage {
    fn new() -> gdirect::Result<Self> {
        let len = std::num::NonZeroUsize::new(4096).ok_or(alloc_error("a page")(Errno::EINVAL))?;
        let page = anonymous(len)?;
        let uffd = uffd_missing(page.as_ptr() as u64, 4096)?;
        Ok(Self { page, uffd })
    }

    /// Waits for the page's fault, up to 10 s: true once a copy is stalled on it.
    fn faulted(&self) -> bool {
        use std::os::fd::AsFd;
        let mut pfd = [nix::poll::PollFd::new(
            self.uffd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if !matches!(
            nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(10_000u16)),
            Ok(1..)
        ) {
            return false;
        }
        let mut msg = [0u8; 32];
        nix::unistd::read(&self.uffd, &mut msg).is_ok_and(|n| n == 32)
    }

    /// Serves the fault with a zero page: the stalled copy goes on.
    fn serve(&self) -> nix::Result<()> {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: self.page.as_ptr() as u64,
                len: 4096,
            },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: a valid userfaultfd and struct; the range is the registered page.
        unsafe { uffdio_zeropage(self.uffd.as_raw_fd(), &mut z) }.map(|_| ())
    }
}

/// FILE opened `O_DIRECT` for a transfer: for writes too when `write`.
fn open_direct_for(path: &str, write: bool) -> gdirect::Result<gdirect::File> {
    if write {
        gdirect::File::open_direct_rw(path)
    } else {
        gdirect::File::open_direct(path)
    }
}

/// A buffered writer of a file that holds its inode lock for as long as the test likes: its
/// `write` copies from a [`StalledPage`], so it waits inside the file system's write, lock
/// taken, until the page is served (as a writer whose source is a stalled FUSE file's page does).
struct LockHolder {
    file: std::fs::File,
    stalled: StalledPage,
}

impl LockHolder {
    fn new(path: &str) -> gdirect::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| {
                alloc_error("the file, for buffered writes")(Errno::from_raw(
                    e.raw_os_error().unwrap_or(5),
                ))
            })?;
        Ok(Self {
            file,
            stalled: StalledPage::new()?,
        })
    }

    /// The buffered write of the page at offset 0, for a thread of its own: it returns once
    /// the page is served.
    fn writer(&self) -> impl FnOnce() -> nix::Result<usize> + Send + '_ {
        // SAFETY: the page is mapped and readable; the kernel's copy out of it faults into the
        // userfaultfd first.
        let page: &[u8] =
            unsafe { std::slice::from_raw_parts(self.stalled.page.as_ptr().cast(), 4096) };
        let file = &self.file;
        move || nix::sys::uio::pwrite(file, page, 0)
    }
}

/// Joins a [`LockHolder`]'s stalled writer (served first) and prints `write=`: the bytes it
/// wrote, or its error.
fn report_write(writer: std::thread::ScopedJoinHandle<'_, nix::Result<usize>>) {
    let w = writer
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    println!(
        "write={}",
        w.map_or_else(|e| e.to_string(), |n| n.to_string())
    );
}

/// A REGISTER of SIZE bytes of host memory whose last page faults into a userfaultfd that is
/// never served: the pin waits there, as a pin of memory backed by a stalled FUSE file or
/// userfaultfd handler would. Prints `faulted pid=PID` once the pin is waiting, then waits for
/// the test to kill the process; the REGISTER never returns on its own (if it does, its result
/// is printed).
fn pin_stall(size: u64) -> gdirect::Result<()> {
    use std::io::Write;
    let page = 4096u64;
    let len =
        std::num::NonZeroUsize::new(size as usize).filter(|_| size >= 2 * page && size % page == 0);
    let len = len.ok_or(Error::Allocation {
        what: "SIZE: a multiple of 4096 of at least two pages".into(),
        errno: Errno::EINVAL,
    })?;
    let fd = open_dev()?;
    let region = anonymous(len)?;
    let base = region.as_ptr() as u64;
    let last = base + size - page;
    let uffd = uffd_missing(last, page)?;
    // Every page but the last is populated: the pin goes through them at once.
    for a in (base..last).step_by(page as usize) {
        // SAFETY: `a` is inside the mapping made above, which nothing else uses.
        unsafe { std::ptr::write_volatile(a as *mut u8, 0x5a) };
    }
    std::thread::spawn(move || {
        let mut msg = [0u8; 32];
        if nix::unistd::read(&uffd, &mut msg).is_ok_and(|n| n == 32) {
            println!("faulted pid={}", std::process::id());
        } else {
            println!("FAIL: reading the userfaultfd");
        }
        let _ = std::io::stdout().flush();
        // The fault is never served; the userfaultfd stays open with this thread.
        loop {
            std::thread::park();
        }
    });
    let (r, _) = register_raw(&fd, Provider::Host.id(), base, size, 0);
    println!("register={r}");
    check(
        "the REGISTER waits until the process is killed",
        false,
        || format!("it returned {r}"),
    );
    Ok(())
}

/// A QUERY writes its addresses into a buffer whose page faults into a userfaultfd that nobody
/// serves yet, as a FUSE- or userfaultfd-backed buffer of a stalled process would; meanwhile the
/// GPU memory is freed. The free (whose callback waits for what the QUERY holds) must finish while
/// the QUERY is still stuck in its copy; then the fault is served and the QUERY ends.
fn query_stall(peer: PciAddress) -> gdirect::Result<()> {
    use std::sync::mpsc;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(16 * EGPU_PAGE)?;
    let va = alloc.va();
    let reg = driver.register(&alloc)?;
    let stalled = StalledPage::new()?;
    // SAFETY: the page is mapped, readable and writable, and only written through this slice
    // (by the kernel's copy, which faults into the userfaultfd first).
    let out: &mut [u64] =
        unsafe { std::slice::from_raw_parts_mut(stalled.page.as_ptr().cast(), 16) };
    let (free_tx, free_rx) = mpsc::channel();
    let outcome = std::thread::scope(|s| {
        let query = s.spawn(|| reg.query_pages(peer, 0, out).map(|(_, n, _)| n));
        // The QUERY is now in its copy to the page, waiting for the fault to be served.
        let faulted = stalled.faulted();
        check(
            "the QUERY's copy faults into the userfaultfd",
            faulted,
            String::new,
        );
        let g = gpu.clone();
        std::thread::spawn(move || {
            let _ = free_tx.send(g.free_va(va));
        });
        let freed = free_rx.recv_timeout(Duration::from_secs(30));
        println!("free_done_while_query_stalled={}", freed.is_ok());
        check(
            "the free finished while the QUERY was stalled",
            freed.is_ok(),
            || "the free waited 30 s for the QUERY's page fault".into(),
        );
        match &freed {
            Ok(Ok(r)) => check("the free ran the callback", r.callbacks == 1, || {
                format!("{} callbacks", r.callbacks)
            }),
            Ok(Err(e)) => check("free", false, || e.to_string()),
            Err(_) => {}
        }
        let served = stalled.serve();
        check("the fault is served", served.is_ok(), || {
            format!("{served:?}")
        });
        if freed.is_err() {
            let _ = free_rx.recv();
        }
        query
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    match outcome {
        Ok(n) => println!("query_entries={n}"),
        Err(Error::Revoked { .. }) => println!("query_entries=revoked"),
        Err(e) => check("the stalled QUERY ends", false, || e.to_string()),
    }
    let u = reg.unregister();
    check("unregister", u.is_ok(), || format!("{u:?}"));
    Ok(())
}

/// A direct transfer of 1 MiB between FILE (ext4 or XFS; read into GPU memory, or written
/// from it, extending the file) while a buffered write to FILE holds the inode's lock, stalled
/// on its source page, which faults into a userfaultfd nobody serves yet (as a page of a stalled
/// FUSE file would); meanwhile the GPU memory is freed. Prints `write_faulted=` (the stall is
/// in place), `free_done_while_write_stalled=` (the free returned within 5 s: it waited for no
/// use of the pages that the stalled lock holds), `free_ms=` (once the fault is served, if not
/// before), `write=` (the buffered write's result) and `io=` (the transfer's bytes, or the
/// errno it failed with: `EKEYREVOKED` when the memory was gone before the data moved).
/// With `keep`, the memory is not freed: once the fault is served and the lock goes, the
/// transfer must move every byte (`io=`), and `bytes_right=` compares them (a read's memory,
/// poisoned first, with the file as it is then; a write's bytes read back from the file), with
/// `bounce_bytes=`, what the module says went through host memory (the selftest judges that by
/// QEMU's trace).
fn lock_stall(path: &str, write: bool, keep: bool) -> gdirect::Result<()> {
    const LEN: u64 = 16 * EGPU_PAGE;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let mut alloc = gpu.alloc(LEN)?;
    let va = alloc.va();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 + 5) as u8).collect();
    if write {
        alloc.write(0, &pattern)?;
    } else {
        alloc.write(0, &vec![0xa5u8; LEN as usize])?;
    }
    let reg = driver.register(&alloc)?;
    let direct = open_direct_for(path, write)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let holder = LockHolder::new(path)?;
    let stalled = &holder.stalled;
    std::thread::scope(|s| {
        let writer = s.spawn(holder.writer());
        println!("write_faulted={}", stalled.faulted());
        // A write extends the file: its blocks must be allocated first.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (reg, direct) = (&reg, &direct);
        let transfer = s.spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid());
            if write {
                direct.write_from(reg, 0, size, LEN)
            } else {
                direct.read_into(reg, 0, 0, LEN)
            }
        });
        // The transfer at the lock before the free: its thread asleep in the kernel,
        // uninterruptibly (an inode lock's wait), in three looks 50 ms apart.
        let blocked = tid_rx
            .recv_timeout(Duration::from_secs(5))
            .ok()
            .is_some_and(|tid| blocked_in_kernel(tid, Duration::from_secs(5)));
        println!("transfer_blocked={blocked}");
        if keep {
            println!("served={}", stalled.serve().is_ok());
        } else {
            let freed = free_apart(gpu.clone(), va);
            let early = freed.recv_timeout(Duration::from_secs(5));
            println!("free_done_while_write_stalled={}", early.is_ok());
            println!("served={}", stalled.serve().is_ok());
            report_free(early, &freed)?;
        }
        report_write(writer);
        let r = transfer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        if let Ok(t) = &r {
            println!("bounce_bytes={}", t.bounce_bytes);
        }
        let moved = r.as_ref().is_ok_and(|t| t.bytes == LEN);
        report_io(r.map(|t| t.bytes));
        if keep {
            let mut back = vec![0u8; LEN as usize];
            let file_right = File::open(path).is_ok_and(|mut f| {
                f.seek(SeekFrom::Start(if write { size } else { 0 }))
                    .is_ok()
                    && f.read_exact(&mut back).is_ok()
            });
            let right = moved
                && file_right
                && if write {
                    back == pattern
                } else {
                    let mut got = vec![0u8; LEN as usize];
                    alloc.read(0, &mut got).is_ok() && got == back
                };
            println!("bytes_right={right}");
        }
        Ok::<(), Error>(())
    })?;
    drop(reg);
    Ok(())
}

/// A direct transfer of 1 MiB between FILE (as in [`lock_stall`]) by a child process
/// (`lock-kill-child`), at the inode lock a stalled buffered write holds; then the child is sent
/// `SIGKILL`. A task waiting for a lock another task may hold for ever must be killable: a job
/// on a shared node whose file is stuck behind a neighbour's stalled writer can still be ended.
/// Prints `write_faulted=`, `child_blocked=` (the child's thread asleep in the kernel),
/// `killed_while_stalled=` (the child was gone within 5 s of the signal, the stall still in
/// place), `served=`, `write=` (the buffered write) and `child=` (how the child ended).
fn lock_kill(path: &str, write: bool) -> gdirect::Result<()> {
    use std::io::BufRead;
    let fail = alloc_error;
    let holder = LockHolder::new(path)?;
    let stalled = &holder.stalled;
    let exe = std::env::current_exe().map_err(|_| fail("no executable path")(Errno::ENOENT))?;
    std::thread::scope(|s| {
        let writer = s.spawn(holder.writer());
        println!("write_faulted={}", stalled.faulted());
        let mut child = std::process::Command::new(&exe)
            .args([
                "lock-kill-child",
                if write { "write" } else { "read" },
                path,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| fail("the child")(Errno::from_raw(e.raw_os_error().unwrap_or(5))))?;
        let pid = child.id();
        // Its transfer starts once it says so (registration first, which may sleep briefly).
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let started = rx
            .recv_timeout(Duration::from_secs(10))
            .is_ok_and(|l| l == "started");
        let blocked =
            started && task_blocked_in_kernel(&format!("/proc/{pid}"), Duration::from_secs(5));
        println!("child_blocked={blocked}");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let t0 = std::time::Instant::now();
        let mut ended = None;
        while ended.is_none() && t0.elapsed() < Duration::from_secs(5) {
            ended = child.try_wait().ok().flatten();
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("killed_while_stalled={}", ended.is_some());
        println!("served={}", stalled.serve().is_ok());
        report_write(writer);
        let status = match ended {
            Some(st) => Ok(st),
            None => child.wait(),
        };
        match status {
            Ok(st) => println!("child={st}"),
            Err(e) => println!("child=unknown ({e})"),
        }
        for line in rx.try_iter() {
            println!("child_said={line}");
        }
        Ok::<(), Error>(())
    })?;
    Ok(())
}

/// `lock-kill`'s child: registers 1 MiB of the emulated GPU's memory, says `started`, and reads
/// it from FILE at 0 or writes it to FILE's end (the transfer its parent kills); then prints
/// `io=` (only if it was not killed first).
fn lock_kill_child(path: &str, write: bool) -> gdirect::Result<()> {
    use std::io::Write;
    const LEN: u64 = 16 * EGPU_PAGE;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(LEN)?;
    let reg = driver.register(&alloc)?;
    let direct = open_direct_for(path, write)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    println!("started");
    let _ = std::io::stdout().flush();
    let r = if write {
        direct.write_from(&reg, 0, size, LEN)
    } else {
        direct.read_into(&reg, 0, 0, LEN)
    };
    report_io(r.map(|t| t.bytes));
    Ok(())
}

/// What keeps a transfer waiting in [`bounce_stall`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stall {
    /// The file's inode lock, held by a buffered write stalled on its source page, which faults
    /// into a userfaultfd nobody serves yet (as in [`lock_stall`]).
    Lock,
    /// A fanotify permission event nobody answers yet (as in [`perm_stall`]).
    Perm,
}

/// A bounced transfer of 64 KiB between FILE (ext4 or XFS; read into GPU memory, or written
/// from it at 1 MiB) is kept waiting by `stall`; the module is loaded with `bounce_buffers=1`, so the pool has one chunk.
/// Meanwhile a bounced read of 64 KiB of OTHER, another file, must get that chunk: the stalled
/// transfer waits without it. Prints `stalled=` (the transfer is at the stall: its thread asleep
/// in the kernel, or its permission event read by the listener), `other_done_while_stalled=`
/// (the other read ended within 5 s, the stall still in place), `other=` (its bytes, or its
/// errno) and `other_bytes_right=` (its slot, poisoned first, against OTHER's bytes); then, the
/// stall ended, `io=` (the stalled transfer's bytes) and `stalled_bytes_right=` (a read's slot
/// against FILE as it is then, after the buffered write; a write's bytes read back from FILE).
/// At the lock, a second fanotify listener answers every permission event at once and counts
/// the transfer thread's: `checks=`, how many times the range was checked (once, however many
/// times the transfer waited for the lock).
fn bounce_stall(stall: Stall, path: &str, other: &str, write: bool) -> gdirect::Result<()> {
    use std::sync::atomic::AtomicBool;
    const LEN: u64 = 64 << 10;
    const WRITE_AT: u64 = 1 << 20;
    let (slot, other_slot) = (0, 2 << 20);
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let mut alloc = gpu.alloc(64 * EGPU_PAGE)?;
    alloc.write(0, &vec![0xa5u8; (64 * EGPU_PAGE) as usize])?;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    if write {
        alloc.write(slot, &pattern)?;
    }
    let reg = driver.register(&alloc)?;
    let bounced = gdirect::IoOptions::new().force_bounce(true);
    // Marked before the file is opened for the transfer (see `PermListener::new`).
    let listener = match stall {
        Stall::Perm => Some(PermListener::new(path, write, false)?),
        Stall::Lock => None,
    };
    // At the lock, a listener that answers every event at once and names its thread: how many
    // times the transfer's range is checked (one event each).
    let answering = match stall {
        Stall::Lock => Some(PermListener::new(path, write, true)?),
        Stall::Perm => None,
    };
    let direct = open_direct_for(path, write)?;
    let other_file = gdirect::File::open_direct(other)?;
    let holder = match stall {
        Stall::Lock => Some(LockHolder::new(path)?),
        Stall::Perm => None,
    };
    let done = AtomicBool::new(false);
    let (stalled_io, other_io, checks) = std::thread::scope(|s| {
        let done = &done;
        let answerer = answering.as_ref().map(|l| {
            s.spawn(move || {
                let mut asked = Vec::new();
                while !done.load(Ordering::Acquire) {
                    let events = l.wait(Duration::from_millis(20));
                    asked.extend(events.iter().map(|e| e.1));
                    l.allow(events);
                }
                asked
            })
        });
        let holder = holder.as_ref().map(|h| {
            let w = s.spawn(h.writer());
            println!("holder_faulted={}", h.stalled.faulted());
            (w, &h.stalled)
        });
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (reg, direct) = (&reg, &direct);
        let transfer = s.spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid());
            let r = if write {
                direct.write_from_with(reg, slot, WRITE_AT, LEN, bounced)
            } else {
                direct.read_into_with(reg, slot, 0, LEN, bounced)
            }
            .map(|t| t.bytes);
            done.store(true, Ordering::Release);
            r
        });
        let tid = tid_rx.recv_timeout(Duration::from_secs(5)).ok();
        let first = listener.as_ref().map(|l| l.wait(Duration::from_secs(10)));
        let at_stall = match &first {
            Some(events) => !events.is_empty(),
            None => tid.is_some_and(|tid| blocked_in_kernel(tid, Duration::from_secs(5))),
        };
        println!("stalled={at_stall}");
        // The other read, on a thread of its own: it must end while the stall is in place.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let other_file = &other_file;
        let reader = s.spawn(move || {
            let r = other_file
                .read_into_with(reg, other_slot, 0, LEN, bounced)
                .map(|t| t.bytes);
            let _ = done_tx.send(());
            r
        });
        let early = done_rx.recv_timeout(Duration::from_secs(5)).is_ok();
        println!("other_done_while_stalled={early}");
        if let Some((w, stalled)) = holder {
            println!("served={}", stalled.serve().is_ok());
            let w = w.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            println!(
                "holder={}",
                w.map_or_else(|e| e.to_string(), |n| n.to_string())
            );
        }
        if let (Some(l), Some(first)) = (&listener, first) {
            l.allow(first);
            // Every later event answered at once, until the transfer ends.
            while !done.load(Ordering::Acquire) {
                l.allow(l.wait(Duration::from_millis(50)));
            }
        }
        let join = |h: std::thread::ScopedJoinHandle<'_, gdirect::Result<u64>>| {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        };
        let (transfer, reader) = (join(transfer), join(reader));
        let checks = answerer.map(|a| {
            let asked = a.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            asked
                .iter()
                .filter(|&&t| tid.is_some_and(|tid| tid.as_raw() == t))
                .count()
        });
        (transfer, reader, checks)
    });
    let slot_right = |at: u64, want: &[u8]| {
        let mut got = vec![0u8; want.len()];
        alloc.read(at, &mut got).is_ok() && got == want
    };
    let file_bytes = |p: &str, at: u64| {
        let mut f = File::open(p).ok()?;
        let mut b = vec![0u8; LEN as usize];
        f.seek(SeekFrom::Start(at)).ok()?;
        f.read_exact(&mut b).ok()?;
        Some(b)
    };
    // Its events answered (a read-back of the file would wait for one): the listeners closed.
    drop(listener);
    drop(answering);
    if let Some(n) = checks {
        println!("checks={n}");
    }
    match &other_io {
        Ok(n) => println!("other={n}"),
        Err(e) => println!("other={:?}", e.errno()),
    }
    let other_right = other_io.as_ref().is_ok_and(|&n| n == LEN)
        && file_bytes(other, 0).is_some_and(|want| slot_right(other_slot, &want));
    println!("other_bytes_right={other_right}");
    let stalled_right = stalled_io.as_ref().is_ok_and(|&n| n == LEN)
        && if write {
            file_bytes(path, WRITE_AT).is_some_and(|got| got == pattern)
        } else {
            file_bytes(path, 0).is_some_and(|want| slot_right(slot, &want))
        };
    report_io(stalled_io);
    println!("stalled_bytes_right={stalled_right}");
    drop(reg);
    Ok(())
}

/// Whether the thread `tid` of this process sleeps uninterruptibly in the kernel (state `D` in
/// its `/proc` stat) in three looks 50 ms apart, waiting up to `wait` for that; its `wchan` is
/// printed (`wchan=`, where the kernel says).
fn blocked_in_kernel(tid: nix::unistd::Pid, wait: Duration) -> bool {
    task_blocked_in_kernel(&format!("/proc/self/task/{tid}"), wait)
}

/// [`blocked_in_kernel`] for the task whose `/proc` directory is `task` (of any process).
fn task_blocked_in_kernel(task: &str, wait: Duration) -> bool {
    let stat = format!("{task}/stat");
    // The state is the field after the command's closing parenthesis.
    let state = || {
        std::fs::read_to_string(&stat).ok().and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        })
    };
    let start = std::time::Instant::now();
    let mut seen = 0;
    while seen < 3 && start.elapsed() < wait {
        seen = if state().as_deref() == Some("D") {
            seen + 1
        } else {
            0
        };
        std::thread::sleep(Duration::from_millis(50));
    }
    let wchan = std::fs::read_to_string(format!("{task}/wchan")).unwrap_or_default();
    println!(
        "wchan={}",
        if wchan.is_empty() { "-" } else { wchan.trim() }
    );
    seen >= 3
}

/// What a free made apart ([`free_apart`]) reports, and how long it took.
type FreeDone = (
    gdirect::Result<gdirect_internals::egpu::FreeReport>,
    Duration,
);

/// Frees `va` of the emulated GPU on a thread of its own: the receiver gets the report.
fn free_apart(gpu: std::sync::Arc<Egpu>, va: u64) -> std::sync::mpsc::Receiver<FreeDone> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let r = gpu.free_va(va);
        let _ = tx.send((r, t0.elapsed()));
    });
    rx
}

/// Prints `free_ms=` and `free=` (the callbacks it ran) of a free made apart: what came within
/// the wait (`early`), or what comes later.
fn report_free(
    early: Result<FreeDone, std::sync::mpsc::RecvTimeoutError>,
    rx: &std::sync::mpsc::Receiver<FreeDone>,
) -> gdirect::Result<()> {
    let (freed, took) = match early {
        Ok(x) => x,
        Err(_) => rx
            .recv()
            .map_err(|_| alloc_error("the free's report")(Errno::EIO))?,
    };
    println!(
        "free_ms={} free={:?}",
        took.as_millis(),
        freed.map(|r| r.callbacks)
    );
    Ok(())
}

/// Prints `io=`: a transfer's byte count, or its errno and error.
fn report_io(r: gdirect::Result<u64>) {
    match r {
        Ok(n) => println!("io={n}"),
        Err(e) => match e.errno() {
            Some(errno) => println!("io={errno:?} error={e}"),
            None => println!("io=none error={e}"),
        },
    }
}

/// A fanotify listener of one file that holds the permission events it reads until told to
/// answer them (`FAN_ALLOW`), then answers every later one at once.
struct PermListener {
    fd: OwnedFd,
}

impl PermListener {
    /// `FAN_CLASS_CONTENT` and `FAN_ACCESS_PERM` (an on-access scanner: every read), or, with
    /// `pre`, `FAN_CLASS_PRE_CONTENT` and `FAN_PRE_ACCESS` (a hierarchical storage manager that
    /// fills a range before it is read or written: every read and write). Marked before the file
    /// is opened for the transfer: a file opened while its file system had no permission
    /// watcher is never asked about (`file_set_fsnotify_mode()`). With `tids`, an event names
    /// the thread that asks (`FAN_REPORT_TID`), not its process.
    fn new(path: &str, pre: bool, tids: bool) -> gdirect::Result<Self> {
        const FAN_CLASS_CONTENT: u32 = 0x4;
        const FAN_CLASS_PRE_CONTENT: u32 = 0x8;
        const FAN_REPORT_TID: u32 = 0x100;
        const FAN_ACCESS_PERM: u64 = 0x0002_0000;
        const FAN_PRE_ACCESS: u64 = 0x0010_0000;
        const FAN_MARK_ADD: u32 = 0x1;
        let fail = alloc_error("a fanotify listener");
        let (class, mask) = match pre {
            false => (FAN_CLASS_CONTENT, FAN_ACCESS_PERM),
            true => (FAN_CLASS_PRE_CONTENT, FAN_PRE_ACCESS),
        };
        // SAFETY: fanotify_init(2) with valid flags; the new descriptor is owned below.
        let raw = unsafe {
            nix::libc::fanotify_init(
                class | nix::libc::FAN_CLOEXEC | if tids { FAN_REPORT_TID } else { 0 },
                (nix::libc::O_RDONLY | nix::libc::O_LARGEFILE) as u32,
            )
        };
        if raw < 0 {
            return Err(fail(Errno::last()));
        }
        // SAFETY: `raw` is a new descriptor nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let cpath = std::ffi::CString::new(path).map_err(|_| fail(Errno::EINVAL))?;
        // SAFETY: fanotify_mark(2) of a NUL-terminated path the call only reads.
        let r = unsafe {
            nix::libc::fanotify_mark(
                fd.as_raw_fd(),
                FAN_MARK_ADD,
                mask,
                nix::libc::AT_FDCWD,
                cpath.as_ptr(),
            )
        };
        if r < 0 {
            return Err(fail(Errno::last()));
        }
        Ok(Self { fd })
    }

    /// Waits (at most `timeout`) for events, and returns the descriptors of those read, each with
    /// the task that asks (its process, or its thread: `new`'s `tids`).
    fn wait(&self, timeout: Duration) -> Vec<(OwnedFd, i32)> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut events = Vec::new();
        let mut pfd = [PollFd::new(
            std::os::fd::AsFd::as_fd(&self.fd),
            PollFlags::POLLIN,
        )];
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        if !matches!(poll(&mut pfd, ms), Ok(n) if n > 0) {
            return events;
        }
        let mut buf = [0u8; 4096];
        let Ok(n) = nix::unistd::read(&self.fd, &mut buf) else {
            return events;
        };
        let meta = std::mem::size_of::<nix::libc::fanotify_event_metadata>();
        let mut at = 0;
        while at + meta <= n {
            // SAFETY: `buf[at..at + meta]` holds an event's metadata, as the kernel wrote it
            // (read unaligned: a byte buffer).
            let m: nix::libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            if m.fd >= 0 {
                // SAFETY: the event's descriptor is new, and this is its only owner.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(m.fd) };
                events.push((fd, m.pid));
            }
            at += (m.event_len as usize).max(meta);
        }
        events
    }

    /// `FAN_ALLOW` for each event.
    fn allow(&self, events: Vec<(OwnedFd, i32)>) {
        for (fd, _) in events {
            let response = nix::libc::fanotify_response {
                fd: fd.as_raw_fd(),
                response: nix::libc::FAN_ALLOW,
            };
            // SAFETY: the response is a plain struct; write(2) reads its bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&raw const response).cast::<u8>(),
                    std::mem::size_of_val(&response),
                )
            };
            let _ = nix::unistd::write(&self.fd, bytes);
        }
    }
}

/// A transfer between `path` and GPU memory meeting a fanotify permission event that its
/// listener answers only later (an on-access scanner at work, or a storage manager fetching
/// the range from tape), and a free of the memory meanwhile (after the event arrived: the
/// transfer is then provably at the check). The free waits for the transfer's use of the
/// memory, so the use must not be held while the listener is awaited: `event=`, the listener
/// got the transfer's event; `free_done_while_unanswered=true`, the free returned within 5 s
/// while it was unanswered; then the events are answered (and every later one at once), and
/// `io=` is the transfer's end (EKEYREVOKED: the memory went while it waited).
fn perm_stall(path: &str, write: bool) -> gdirect::Result<()> {
    use std::sync::atomic::AtomicBool;
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(16 * EGPU_PAGE)?;
    let va = alloc.va();
    let reg = driver.register(&alloc)?;
    let listener = PermListener::new(path, write, false)?;
    let direct = open_direct_for(path, write)?;
    let me = std::process::id() as i32;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let transfer = s.spawn(|| {
            let r = if write {
                direct.write_from(&reg, 0, 0, 16 * EGPU_PAGE)
            } else {
                direct.read_into(&reg, 0, 0, 16 * EGPU_PAGE)
            }
            .map(|t| t.bytes);
            done.store(true, Ordering::Release);
            r
        });
        let first = listener.wait(Duration::from_secs(10));
        println!(
            "event={} from_this_process={}",
            !first.is_empty(),
            first.iter().any(|&(_, pid)| pid == me)
        );
        let freed = free_apart(gpu.clone(), va);
        let early = freed.recv_timeout(Duration::from_secs(5));
        println!("free_done_while_unanswered={}", early.is_ok());
        listener.allow(first);
        // Every later event answered at once, until the transfer ends.
        while !done.load(Ordering::Acquire) {
            listener.allow(listener.wait(Duration::from_millis(50)));
        }
        report_free(early, &freed)?;
        report_io(
            transfer
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        );
        Ok::<(), Error>(())
    })?;
    drop(reg);
    Ok(())
}

/// QUERY of a 16 KiB host registration, as the caller is (root or not): `addrs=` the addresses
/// for PEER (`max_entries` > 0), `map_type_only=` the map type alone (`max_entries` = 0),
/// `undriven=` the addresses for a peer that no kernel driver drives; each `OK` or the errno.
/// `map_type=` and `pagemap_matches=` say what the caller saw: the script compares them between
/// root and a user.
fn query_privilege(peer: PciAddress, undriven: PciAddress) -> gdirect::Result<()> {
    let fd = open_dev()?;
    let mut buf = HostBuffer::new(16 << 10)?;
    buf.fill(0x5a);
    let (r, handle) = register_raw(&fd, Provider::Host.id(), buf.device_address(), 16 << 10, 0);
    if r != "OK" {
        println!("register={r}");
        return Ok(());
    }
    let mut addrs = [0u64; 4];
    let mut query = |p: PciAddress, max_entries: u32| {
        let mut q = raw::gdirect_query_args {
            handle,
            peer_domain: p.domain,
            peer_bdf: p.bdf(),
            addrs: addrs.as_mut_ptr() as u64,
            max_entries,
            ..Default::default()
        };
        (raw_ioctl(&fd, raw::GDIRECT_IOC_QUERY, &mut q), q)
    };
    let (r, q) = query(peer, 4);
    println!("addrs={r} entries={}", q.entries);
    let (r, q) = query(peer, 0);
    println!(
        "map_type_only={r} map_type={} entries={}",
        q.map_type, q.entries
    );
    let (r, _) = query(undriven, 4);
    println!("undriven={r}");
    let (r, _) = query(undriven, 0);
    println!("undriven_map_type_only={r}");
    // What the addresses were, where the caller got any: the pages' physical addresses
    // (the rig has no IOMMU), as /proc/self/pagemap tells root.
    let matches = (0..4)
        .filter(|&i| {
            addrs[i] != 0
                && pagemap_phys(buf.device_address() + i as u64 * 4096).is_ok_and(|p| p == addrs[i])
        })
        .count();
    println!("pagemap_matches={matches}");
    Ok(())
}

fn egpu_info() -> gdirect::Result<()> {
    let info = Egpu::open()?.info()?;
    println!(
        "allocations={} mappings={} callbacks={} bar_bus_addr={:#x} bar_len={} free_bytes={} kept={} bar1_size={} bar1_used={} callback_frees={} stray_frees={}",
        info.allocations,
        info.mappings,
        info.callbacks,
        info.bar_bus_addr,
        info.bar_len,
        info.free_bytes,
        info.kept,
        info.bar1_size,
        info.bar1_used,
        info.callback_frees,
        info.stray_frees
    );
    Ok(())
}

/// Frees a kept emulated GPU allocation (`gdirect read --mem egpu` with GDIRECT_EGPU_KEEP=1).
fn egpu_free_kept(va: u64) -> gdirect::Result<()> {
    let report = Egpu::open()?.free_kept(va)?;
    println!("freed={va:#x} callbacks={}", report.callbacks);
    Ok(())
}

/// A registration through a file the process opened as root before it became `uid` (group
/// `gid`): whose account it is charged to, by the `GET_INFO` of that file and of one it opens
/// as the user.
fn opener_charge(uid: u32, gid: u32, size: u64) -> gdirect::Result<()> {
    let opened_as_root = Driver::open()?;
    let groups = [gid];
    // SAFETY: plain syscalls; `groups` outlives the call; this program has no other thread.
    let dropped = unsafe {
        nix::libc::setgroups(1, groups.as_ptr()) == 0
            && nix::libc::setgid(gid) == 0
            && nix::libc::setuid(uid) == 0
    };
    if !dropped {
        return Err(Error::Worker {
            what: "cannot drop privileges",
        });
    }
    let alloc = Egpu::open()?.alloc(size)?;
    let reg = opened_as_root.register(&alloc)?;
    let own = Driver::open()?;
    println!(
        "uid={} register=OK opener_file_user_pinned_bytes={} own_file_user_pinned_bytes={}",
        nix::unistd::getuid(),
        opened_as_root.info()?.user_pinned_bytes,
        own.info()?.user_pinned_bytes
    );
    drop(reg);
    Ok(())
}

/// A REGISTER of GPU memory that waits for nvidia's `GET_PUT` (held by an UNREGISTER whose
/// put_pages waits in a free's window, the emulated driver holding its lock for 1 s) holds
/// no share of `max_pinned_bytes` while it waits: a host REGISTER of just over half the limit,
/// which fits only then, is accepted meanwhile (`host_during_wait=OK`, with
/// `waiting_then=yes`: the GPU one slept uninterruptibly, unanswered, as it began, and so did
/// the put), and the GPU one, of as much, then gets
/// `EDQUOT` (`gpu_after_wait=`).
fn pin_wait() -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let max = driver.info()?.max_pinned_bytes;
    let over_half = (max / 2 / EGPU_PAGE + 1) * EGPU_PAGE;
    let small = gpu.alloc(16 * EGPU_PAGE)?;
    let va = small.va();
    let reg = driver.register(&small)?;
    let big = gpu.alloc(over_half)?;
    let host = HostBuffer::new(over_half as usize)?;
    let mapped = gpu.info()?.mappings;
    let g = gpu.clone();
    let freer = std::thread::spawn(move || g.free_va_delayed(va, Duration::from_secs(1)));
    wait_for_unlink(&gpu, mapped)?;
    let returned = std::sync::atomic::AtomicBool::new(false);
    let outcome = |r: &gdirect::Result<gdirect::Registration<'_>>| {
        r.as_ref()
            .err()
            .and_then(|e| e.errno())
            .map_or("OK".to_string(), |e| format!("{e:?}"))
    };
    let (putter_tid, waiter_tid) = (AtomicI32::new(0), AtomicI32::new(0));
    std::thread::scope(|s| {
        // Takes GET_PUT, then blocks in put_pages until the free's callback has run.
        let putter = s.spawn(|| {
            putter_tid.store(nix::unistd::gettid().as_raw(), Ordering::SeqCst);
            reg.unregister()
        });
        let putter_sleep = sleeps_in_mutex(&putter_tid);
        let waiter = s.spawn(|| {
            waiter_tid.store(nix::unistd::gettid().as_raw(), Ordering::SeqCst);
            let r = outcome(&driver.register(&big));
            returned.store(true, Ordering::SeqCst);
            r
        });
        let waiter_sleep = sleeps_in_mutex(&waiter_tid);
        // The GPU REGISTER sleeps behind the put, not yet answered, as the host one starts.
        let waiting = !returned.load(Ordering::SeqCst) && waiter_sleep != "none";
        // Kept until the waiting one has its answer.
        let host_reg = driver.register(&host);
        let host_r = outcome(&host_reg);
        let gpu_r = waiter
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        let put = putter
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        check("the unregister in the window", put.is_ok(), || {
            format!("{put:?}")
        });
        drop(host_reg);
        println!("putter_sleeps_in={putter_sleep} waiter_sleeps_in={waiter_sleep}");
        println!(
            "host_during_wait={host_r} waiting_then={} gpu_after_wait={gpu_r}",
            if waiting { "yes" } else { "no" }
        );
    });
    let freed = freer
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    check("the free", freed.is_ok(), || format!("{freed:?}"));
    drop(small);
    Ok(())
}

/// Waits (up to 5 s) until the thread whose id `tid` holds (once set) sleeps uninterruptibly,
/// as a task waiting for a mutex does (state `D` in `/proc/self/task/TID/stat`, the kernel's
/// word): where it sleeps (its `wchan`, the first function outside the scheduler's and the
/// mutex's own), or `none`.
fn sleeps_in_mutex(tid: &AtomicI32) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let t = tid.load(Ordering::SeqCst);
        let stat = std::fs::read_to_string(format!("/proc/self/task/{t}/stat"));
        // The state follows the command name's closing parenthesis.
        let state = stat.ok().and_then(|s| {
            let (_, rest) = s.rsplit_once(')')?;
            rest.split_whitespace().next().map(str::to_string)
        });
        if t != 0 && state.as_deref() == Some("D") {
            let wchan =
                std::fs::read_to_string(format!("/proc/self/task/{t}/wchan")).unwrap_or_default();
            // One word, whatever the kernel names (a Rust symbol is long but has no space).
            return match wchan.trim() {
                "" => "unnamed".into(),
                w => w.to_string(),
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    "none".into()
}

/// Registers `size` bytes of emulated GPU memory as the caller is, and calls `then` with the
/// outcome (`OK` or the errno's name) while the registration, if made, is held.
fn pin_then(size: u64, then: impl FnOnce(&str)) {
    let name = |e: Error| e.errno().map_or("error".to_string(), |n| format!("{n:?}"));
    let (driver, gpu) = match Driver::open().and_then(|d| Ok((d, Egpu::open()?))) {
        Ok(both) => both,
        Err(e) => return then(&format!("open_{}", name(e))),
    };
    let alloc = match gpu.alloc(size) {
        Ok(a) => a,
        Err(e) => return then(&format!("alloc_{}", name(e))),
    };
    match driver.register(&alloc) {
        Ok(reg) => {
            then("OK");
            drop(reg);
        }
        Err(e) => then(&name(e)),
    };
}

/// Runs `f` in a forked child as `uid` (and gid `uid`), and waits for it.
///
/// # Safety
///
/// The caller has no other thread.
unsafe fn as_uid_in_child(uid: u32, f: impl FnOnce()) -> gdirect::Result<()> {
    use nix::unistd::{setresgid, setresuid, Gid, Uid};
    // SAFETY: the caller's contract: the child is a copy of this process's only thread.
    match unsafe { nix::unistd::fork() } {
        Err(_) => Err(Error::Worker { what: "fork" }),
        Ok(nix::unistd::ForkResult::Child) => {
            let (g, u) = (Gid::from_raw(uid), Uid::from_raw(uid));
            if setresgid(g, g, g).is_ok() && setresuid(u, u, u).is_ok() {
                f();
            }
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { nix::libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
            Ok(())
        }
    }
}

/// The subordinate uids of one user share its per-user limit (the module loaded with
/// `max_pinned_bytes_per_user` below 2 × SIZE and above 1.5 × SIZE): a user namespace made by
/// OWNER, its uids mapped to BASE.. by this process as root (as newuidmap maps them from
/// /etc/subuid), registers SIZE bytes as its uid 0 (`ns_uid0=`) and holds them while its uid 1
/// asks for SIZE (`ns_uid1=`), OWNER itself for SIZE / 2 (`owner=`) and root for SIZE
/// (`root=`); once the namespace's processes are gone, OWNER asks for SIZE (`owner_after=`).
fn userns_share(owner: u32, base: u32, size: u64) -> gdirect::Result<()> {
    use nix::unistd::{setresgid, setresuid, Gid, Uid};
    use std::io::{Read as _, Write as _};
    let fail = |what: &'static str| Error::Worker { what };
    let (mut parent_end, mut child_end) =
        std::os::unix::net::UnixStream::pair().map_err(|_| fail("socketpair"))?;
    let step = |s: &mut std::os::unix::net::UnixStream| -> bool {
        let mut b = [0u8; 1];
        s.write_all(&[1]).is_ok() && s.read_exact(&mut b).is_ok()
    };
    let _ = std::io::stdout().flush();
    // SAFETY: this program has no other thread; the child makes syscalls, registers and prints.
    let maker = match unsafe { nix::unistd::fork() } {
        Err(_) => return Err(fail("fork")),
        Ok(nix::unistd::ForkResult::Child) => {
            drop(parent_end);
            let (g, u) = (Gid::from_raw(owner), Uid::from_raw(owner));
            let ok = setresgid(g, g, g).is_ok()
                && setresuid(u, u, u).is_ok()
                && nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok()
                // The parent writes the maps between the two halves of this step.
                && step(&mut child_end)
                && setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)).is_ok()
                && setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).is_ok();
            if !ok {
                println!("ns_uid0=setup_failed");
            } else {
                pin_then(size, |r| {
                    println!("ns_uid0={r}");
                    // SAFETY: this child has no other thread.
                    let _ = unsafe {
                        as_uid_in_child(1, || pin_then(size, |r| println!("ns_uid1={r}")))
                    };
                    // Held until the parent has asked as OWNER and root.
                    step(&mut child_end);
                });
            }
            let _ = std::io::stdout().flush();
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { nix::libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
    };
    drop(child_end);
    let mut b = [0u8; 1];
    // The namespace exists: map its uids and gids 0-65535 to BASE.., then let it go on.
    let mapped = parent_end.read_exact(&mut b).is_ok()
        && ["uid_map", "gid_map"].iter().all(|m| {
            std::fs::write(format!("/proc/{maker}/{m}"), format!("0 {base} 65536\n")).is_ok()
        })
        && parent_end.write_all(&[1]).is_ok();
    // The namespace's uid 0 holds its registration, and its uid 1 has asked.
    if mapped && parent_end.read_exact(&mut b).is_ok() {
        // SAFETY: this program has no other thread.
        unsafe { as_uid_in_child(owner, || pin_then(size / 2, |r| println!("owner={r}")))? };
        pin_then(size, |r| println!("root={r}"));
        let _ = parent_end.write_all(&[1]);
    } else {
        println!("maps_written=no");
    }
    drop(parent_end);
    let _ = nix::sys::wait::waitpid(maker, None);
    // SAFETY: this program has no other thread.
    unsafe { as_uid_in_child(owner, || pin_then(size, |r| println!("owner_after={r}")))? };
    Ok(())
}

/// REGISTERs racing for `max_pinned_bytes`, for `seconds`: a holder keeps just over half of it
/// registered the whole time, so that a competitor registering the same size must get
/// `EDQUOT` every time, while two threads send REGISTERs of lengths that wrap the module's total
/// past 2^64 back to 0 (each must be refused too). A reservation that added before it checked
/// would, for an instant, show the competitor a total of 0. Then the holder lets go and the
/// competitor's next try succeeds (it could succeed; the limit was what stopped it).
fn pin_race(seconds: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let max = driver.info()?.max_pinned_bytes;
    let half = (max / 2 / 4096 + 1) * 4096;
    // 4096 + wrap does not overflow (the module's EOVERFLOW check), and wrap + half == 2^64.
    let wrap = half.wrapping_neg();
    let holder = HostBuffer::new(half as usize)?;
    let held = driver.register(&holder)?;
    let competitor = HostBuffer::new(half as usize)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    let (tries, passed, other) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let (wraps, wraps_refused) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| -> gdirect::Result<()> {
        for _ in 0..2 {
            s.spawn(|| -> gdirect::Result<()> {
                let fd = open_dev()?;
                while std::time::Instant::now() < deadline {
                    let (r, handle) = register_raw(&fd, Provider::Host.id(), 4096, wrap, 0);
                    wraps.fetch_add(1, Ordering::Relaxed);
                    if r == "EDQUOT" {
                        wraps_refused.fetch_add(1, Ordering::Relaxed);
                    } else if r == "OK" {
                        unregister_raw(&fd, handle);
                    }
                }
                Ok(())
            });
        }
        let d = Driver::open()?;
        while std::time::Instant::now() < deadline {
            tries.fetch_add(1, Ordering::Relaxed);
            match d.register(&competitor) {
                Ok(reg) => {
                    passed.fetch_add(1, Ordering::Relaxed);
                    drop(reg);
                }
                Err(e) if e.errno() == Some(Errno::EDQUOT) => {}
                Err(e) => {
                    other.fetch_add(1, Ordering::Relaxed);
                    println!("competitor: {e}");
                }
            }
        }
        Ok(())
    })?;
    drop(held);
    let after = match driver.register(&competitor) {
        Ok(_) => "OK".to_string(),
        Err(e) => e.errno().map_or("?".into(), |e| format!("{e:?}")),
    };
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "max_pinned_bytes={max} half={half} competitor_tries={} competitor_passed={} competitor_other={} wraps={} wraps_refused={} competitor_after_release={after}",
        l(&tries),
        l(&passed),
        l(&other),
        l(&wraps),
        l(&wraps_refused)
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
    // Exactly the limit fits; a page more does not.
    let exact = HostBuffer::new(info.max_pinned_bytes as usize)?;
    // "OK", or the errno of the refusal (the registration, if any, ends at once).
    fn outcome<T>(r: gdirect::Result<T>) -> String {
        r.err()
            .and_then(|e| e.errno())
            .map_or("OK".into(), |e| format!("{e:?}"))
    }
    println!("at_pin_limit={}", outcome(driver.register(&exact)));
    drop(exact);
    let big = HostBuffer::new(info.max_pinned_bytes as usize + 4096)?;
    println!("over_pin_limit={}", outcome(driver.register(&big)));
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

/// Under `max_pinned_bytes` = `size`: memory freed under a registration its owner has not
/// unregistered yet (the process does not know of the free) holds no share of the limit.
fn revoke_quota(size: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let verdict = |r: &gdirect::Result<_>| match r {
        Ok(_) => "OK".to_string(),
        Err(e) => e
            .errno()
            .map_or_else(|| e.to_string(), |e| format!("{e:?}")),
    };
    let first_alloc = gpu.alloc(size)?;
    let second_alloc = gpu.alloc(size)?;
    let first = driver.register(&first_alloc)?;
    let refused = driver.register(&second_alloc);
    println!("second_before_free={}", verdict(&refused));
    drop(refused);
    gpu.free_va(first_alloc.va())?;
    let info = driver.info()?;
    println!(
        "after_free registrations={} pinned_bytes={} file_pinned_bytes={} user_pinned_bytes={}",
        info.registrations, info.pinned_bytes, info.file_pinned_bytes, info.user_pinned_bytes
    );
    let second = driver.register(&second_alloc);
    println!("second_after_free={}", verdict(&second));
    let info = driver.info()?;
    println!(
        "both registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
    drop(second);
    first.unregister()?;
    let info = driver.info()?;
    println!(
        "after_unregister registrations={} pinned_bytes={}",
        info.registrations, info.pinned_bytes
    );
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
    let info = driver.info()?;
    println!(
        "after_free registrations={} pinned_bytes={} file_pinned_bytes={} user_pinned_bytes={}",
        info.registrations, info.pinned_bytes, info.file_pinned_bytes, info.user_pinned_bytes
    );
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

/// What `pin` does with its registration once made.
enum Hold {
    /// Ends it.
    No,
    /// Keeps it, sleeping until killed.
    Sleep,
    /// Keeps the device file open across an exec of `sleep`.
    Exec,
    /// Leaves the device file to a forked child that sleeps, and exits.
    Exit,
}

/// `VmPin` of /proc/self/status, in KiB: the kernel's count of this address space's pins.
fn vmpin_kb() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmPin:"))
                .map(|v| v.trim().trim_end_matches(" kB").to_string())
        })
        .unwrap_or_else(|| "none".into())
}

fn pin(kind: &str, size: u64, hold: Hold, persistent: bool) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = (kind != "host").then(Egpu::open).transpose()?;
    let mem: Box<dyn DeviceMemory> = match &gpu {
        None => Box::new(HostBuffer::new(size as usize)?),
        Some(gpu) => Box::new(gpu.alloc(size)?),
    };
    let options = RegisterOptions::new().persistent(persistent);
    let reg = match driver.register_with(&*mem, options) {
        Ok(reg) => reg,
        Err(e) => {
            let errno = e.errno().map_or("none".into(), |n| format!("{n:?}"));
            // The emulated GPU's own count of page tables held, while the memory is still
            // allocated: 0 when the refused REGISTER put its pages back itself.
            let held = match &gpu {
                Some(gpu) => format!(" egpu_mappings={}", gpu.info()?.mappings),
                None => String::new(),
            };
            println!(
                "register={errno}{held} kind={:?} error={}",
                e.kind(),
                e.to_string().replace(' ', "_")
            );
            return Ok(());
        }
    };
    let info = driver.info()?;
    println!(
        "register=OK user_pinned_bytes={} max_pinned_bytes_per_user={} vmpin_kb={}",
        info.user_pinned_bytes,
        info.max_pinned_bytes_per_user,
        vmpin_kb()
    );
    let sleep = || loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    };
    match hold {
        Hold::No => drop(reg),
        Hold::Sleep => {
            println!("ready pid={}", std::process::id());
            sleep()
        }
        Hold::Exec => {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: F_SETFD on the descriptor `driver` holds open; no memory is passed.
            if unsafe { nix::libc::fcntl(driver.as_raw_fd(), nix::libc::F_SETFD, 0) } != 0 {
                return Err(Error::Worker { what: "fcntl" });
            }
            println!("ready pid={}", std::process::id());
            let e = std::process::Command::new("sleep").arg("3600").exec();
            println!("exec: {e}");
            return Err(Error::Worker { what: "exec sleep" });
        }
        Hold::Exit => {
            // SAFETY: this program has no other thread; the child only sleeps.
            match unsafe { nix::unistd::fork() } {
                Err(_) => return Err(Error::Worker { what: "fork" }),
                Ok(nix::unistd::ForkResult::Child) => sleep(),
                Ok(nix::unistd::ForkResult::Parent { child }) => {
                    println!("ready pid={child}");
                    // Nothing ended here: the registration lives on in the child's file.
                    std::mem::forget(reg);
                    std::mem::forget(driver);
                }
            }
        }
    }
    Ok(())
}

/// The `kernel` bytes in the memory cgroup of this process (cgroup v2).
fn memcg_kernel() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let stat = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.stat")).ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("kernel "))
        .and_then(|v| v.trim().parse().ok())
}

fn memcg(size: u64, count: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let mut buf = HostBuffer::new(size as usize)?;
    buf.fill(1);
    let before = memcg_kernel();
    let regs = (0..count)
        .map(|_| driver.register(&buf))
        .collect::<gdirect::Result<Vec<_>>>()?;
    let after = memcg_kernel();
    println!(
        "registrations={} kernel_before={} kernel_after={} page_arrays={}",
        regs.len(),
        before.map_or("none".into(), |b| b.to_string()),
        after.map_or("none".into(), |a| a.to_string()),
        count * size / 4096 * 8
    );
    drop(regs);
    Ok(())
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

/// Starts this program again as `gdirect-reg ROLE` in a new pid namespace, where it is pid 1,
/// with `sock` as its standard input.
fn spawn_in_new_pidns(
    role: &str,
    sock: std::os::unix::net::UnixStream,
) -> gdirect::Result<nix::unistd::Pid> {
    use std::{ffi::CString, os::fd::AsRawFd};
    let fail = |what: &'static str| Error::Worker { what };
    let exe = std::env::current_exe().map_err(|_| fail("no executable path"))?;
    let exe =
        CString::new(exe.as_os_str().as_encoded_bytes()).map_err(|_| fail("executable path"))?;
    let argv = [
        CString::new("gdirect-reg").map_err(|_| fail("argv"))?,
        CString::new(role).map_err(|_| fail("argv"))?,
    ];
    let fd = sock.as_raw_fd();
    let mut stack = vec![0u8; 256 * 1024];
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // SAFETY: the child is a copy of this process's memory (no CLONE_VM) and of its one thread
    // (callers start no thread before this), so it may allocate, as nix's `execv` does; it only
    // moves the socket to fd 0 and executes this program, with values prepared before.
    let pid = unsafe {
        nix::sched::clone(
            Box::new(|| {
                // dup2 onto itself would keep close-on-exec: move it only when elsewhere.
                if fd != 0 && nix::libc::dup2(fd, 0) < 0 {
                    return 127;
                }
                if fd == 0 && nix::libc::fcntl(0, nix::libc::F_SETFD, 0) < 0 {
                    return 127;
                }
                let _ = nix::unistd::execv(&exe, &argv);
                127
            }),
            &mut stack,
            nix::sched::CloneFlags::CLONE_NEWPID,
            Some(nix::libc::SIGCHLD),
        )
    }
    .map_err(|_| fail("clone(CLONE_NEWPID)"))?;
    drop(sock);
    Ok(pid)
}

/// A registration whose last reference goes in a stranger with the pinner's pid number: the
/// pinner and the stranger are both pid 1, each of its own pid namespace. The pinner registers
/// GPU memory, passes its `/dev/gdirect` descriptor to the stranger (SCM_RIGHTS) and closes its
/// own; the stranger closes the last. nvidia.ko would answer a put_pages from the stranger
/// with 0 and put nothing (`RmP2PGetInfoWithoutToken`: the calling process's records), while
/// the callback's data were gone: gdirect must orphan the pages instead. The emulated GPU's
/// records tell: its foreign puts, the page table it still holds, the callback at the free.
fn pidns_put() -> gdirect::Result<()> {
    let gpu = Egpu::open()?;
    let before = gpu.info()?;
    let (p, s) =
        std::os::unix::net::UnixStream::pair().map_err(|_| Error::Worker { what: "socketpair" })?;
    let stranger = spawn_in_new_pidns("pidns-stranger", s)?;
    let pinner = spawn_in_new_pidns("pidns-pinner", p).inspect_err(|_| {
        // The stranger sees its socket's other end gone (EOF) and ends.
        let _ = nix::sys::wait::waitpid(stranger, None);
    })?;
    let mut ok = true;
    for child in [pinner, stranger] {
        let status = nix::sys::wait::waitpid(child, None);
        ok &= matches!(status, Ok(nix::sys::wait::WaitStatus::Exited(_, 0)));
    }
    let after = gpu.info()?;
    println!(
        "children_ok={ok} puts_foreign_delta={} callbacks_delta={} mappings_end={}",
        after.puts_foreign - before.puts_foreign,
        after.callbacks - before.callbacks,
        after.mappings
    );
    Ok(())
}

/// The pinner of `pidns-put` (pid 1 of its namespace; the socket on standard input).
fn pidns_pinner() -> gdirect::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fail = |what: &'static str| Error::Worker { what };
    // SAFETY: fd 0 is the socket `spawn_in_new_pidns` put there, owned by this process.
    let mut sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(0) };
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(1 << 20)?;
    let reg = driver.register(&alloc)?;
    println!(
        "pinner_pid={} registered_mappings={}",
        nix::unistd::getpid(),
        gpu.info()?.mappings
    );
    let fds = [driver.as_raw_fd()];
    nix::sys::socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[std::io::IoSlice::new(b"f")],
        &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .map_err(|_| fail("sendmsg"))?;
    // This process's descriptor goes without ending the registration: the stranger's is the last.
    std::mem::forget(reg);
    drop(driver);
    use std::io::{Read, Write};
    sock.write_all(b"c").map_err(|_| fail("socket write"))?;
    let mut b = [0u8; 1];
    sock.read_exact(&mut b).map_err(|_| fail("socket read"))?;
    let info = gpu.info()?;
    println!(
        "after_stranger_close mappings={} puts_foreign={}",
        info.mappings, info.puts_foreign
    );
    // cudaFree: the orphaned pages' callback runs now, in the pinner.
    let report = alloc.free()?;
    println!(
        "free callbacks={} mappings_after_free={}",
        report.callbacks,
        gpu.info()?.mappings
    );
    Ok(())
}

/// The stranger of `pidns-put` (pid 1 of another namespace): receives the descriptor, then
/// closes it, the last reference, once the pinner has closed its own.
fn pidns_stranger() -> gdirect::Result<()> {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let fail = |what: &'static str| Error::Worker { what };
    // SAFETY: as in `pidns_pinner`.
    let mut sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(0) };
    println!("stranger_pid={}", nix::unistd::getpid());
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let msg = nix::sys::socket::recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::empty(),
    )
    .map_err(|_| fail("recvmsg"))?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(|_| fail("cmsgs"))? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(v) = c {
            fds.extend(v);
        }
    }
    let [fd] = fds[..] else {
        return Err(fail("expected one descriptor"));
    };
    // SAFETY: just received, owned by this process from now on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    sock.read_exact(&mut byte)
        .map_err(|_| fail("socket read"))?;
    drop(fd);
    println!("stranger_closed=1");
    sock.write_all(b"d").map_err(|_| fail("socket write"))?;
    Ok(())
}

/// Two registrations of the same GPU memory: nvidia.ko maps a range into BAR1 once and shares
/// it between the page tables that cover it, so the second needs no BAR1 space of its own.
fn bar1_share(size: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(size)?;
    let outcome = |r: &gdirect::Result<gdirect::Registration<'_>>| match r {
        Ok(_) => "OK".to_string(),
        Err(e) => e.errno().map_or("error".into(), |n| format!("{n:?}")),
    };
    let first = driver.register(&alloc);
    let second = driver.register(&alloc);
    let info = gpu.info()?;
    println!(
        "first={} second={} bar1_used={} mappings={}",
        outcome(&first),
        outcome(&second),
        info.bar1_used,
        info.mappings
    );
    drop(second);
    println!("after_one_put bar1_used={}", gpu.info()?.bar1_used);
    drop(first);
    println!("after_both bar1_used={}", gpu.info()?.bar1_used);
    Ok(())
}

/// Sends every command on `fd` from this process, then a READ of `len` bytes of `data_fd` into
/// the registration `handle` and an UNREGISTER of it: prints `WHO_COMMAND=ERRNO` for each (OK where one succeeded) and
/// `WHO_all=ERRNO` when they all gave the same answer.
fn every_command(who: &str, fd: i32, handle: u64, data_fd: i32, len: u64) {
    let mut outcomes = Vec::new();
    for (name, code) in commands::ALL {
        // Zeroed and larger than any argument struct of the ABI (GET_STATS's is the largest).
        let mut zeroed = [0u64; 256];
        const _: () = assert!(std::mem::size_of::<raw::gdirect_stats_args>() <= 256 * 8);
        // SAFETY: the command reads and writes at most its struct's size (checked above to fit
        // in 2048 bytes) at the pointer, which `zeroed` covers; the module keeps no pointer.
        let r = unsafe { nix::libc::ioctl(fd, code as _, zeroed.as_mut_ptr()) };
        outcomes.push((name.to_string(), errno_of(r)));
    }
    let mut read = raw::gdirect_io_args {
        handle,
        len,
        fd: data_fd,
        ..Default::default()
    };
    // SAFETY: a valid argument struct for the command; the module keeps no pointer.
    let r = unsafe { nix::libc::ioctl(fd, raw::GDIRECT_IOC_READ as _, &mut read) };
    outcomes.push(("READ_handle".into(), errno_of(r)));
    let mut unregister = raw::gdirect_unregister_args {
        handle,
        ..Default::default()
    };
    // SAFETY: as above.
    let r = unsafe { nix::libc::ioctl(fd, raw::GDIRECT_IOC_UNREGISTER as _, &mut unregister) };
    outcomes.push(("UNREGISTER_handle".into(), errno_of(r)));
    let first = outcomes[0].1.clone();
    let same = outcomes.iter().all(|(_, e)| *e == first);
    let list: Vec<String> = outcomes
        .iter()
        .map(|(n, e)| format!("{who}_{n}={e}"))
        .collect();
    println!("{}", list.join(" "));
    println!("{who}_all={}", if same { first } else { "mixed".into() });
}

fn errno_of(r: i32) -> String {
    if r == 0 {
        "OK".into()
    } else {
        format!("{:?}", Errno::last())
    }
}

/// A device file used from other address spaces than the one that opened it: a child after
/// `fork` and a program after `exec` send every command on it (each must get `EXDEV`), while
/// the opener's registration of host memory reads DEV right before and after (compared with a
/// buffered read of DEV) and stays the opener's alone.
fn other_mm(dev: &str) -> gdirect::Result<()> {
    const LEN: usize = 1 << 16;
    let driver = Driver::open()?;
    let buf = HostBuffer::new(LEN)?;
    let reg = driver.register(&buf)?;
    let data = gdirect::File::open_direct(dev)?;
    let mut want = vec![0u8; LEN];
    File::open(dev)
        .and_then(|mut f| f.read_exact(&mut want))
        .map_err(|_| Error::Worker {
            what: "cannot read DEV",
        })?;
    let opener_reads = |buf: &HostBuffer, when: &str| -> gdirect::Result<()> {
        // SAFETY: `buf` is LEN bytes and no transfer into it is running (each is synchronous).
        unsafe { std::ptr::write_bytes(buf.as_ptr(), 0xa5, LEN) };
        let t = data.read_into(&reg, 0, 0, LEN as u64)?;
        let mut got = vec![0u8; LEN];
        buf.read(0, &mut got);
        check(
            &format!("the opener's read {when}"),
            got == want && t.bytes == LEN as u64,
            || {
                format!(
                    "{} bytes, {} differ",
                    t.bytes,
                    got.iter().zip(&want).filter(|(a, b)| a != b).count()
                )
            },
        );
        println!("opener_read_{when}=OK");
        Ok(())
    };
    opener_reads(&buf, "before")?;
    let (fd, handle) = (driver.as_raw_fd(), reg.handle());
    let data_fd = std::os::fd::AsFd::as_fd(&data).as_raw_fd();

    // SAFETY: this program has no other thread; the child only makes syscalls and prints.
    match unsafe { nix::unistd::fork() } {
        Err(_) => return Err(Error::Worker { what: "fork" }),
        Ok(nix::unistd::ForkResult::Child) => {
            every_command("fork", fd, handle, data_fd, LEN as u64);
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            // SAFETY: leaves the forked child without running the parent's destructors.
            unsafe { nix::libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
        }
    }

    // The same descriptors across exec (O_CLOEXEC cleared for the spawn).
    let inherit = |fd: i32, on: bool| {
        let flags = if on { 0 } else { nix::libc::FD_CLOEXEC };
        // SAFETY: F_SETFD on a descriptor this function holds open; no memory is passed.
        match unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, flags) } {
            0 => Ok(()),
            _ => Err(()),
        }
    };
    let exe = std::env::current_exe().map_err(|_| Error::Worker {
        what: "no executable path",
    })?;
    if inherit(fd, true).is_err() || inherit(data_fd, true).is_err() {
        return Err(Error::Worker { what: "fcntl" });
    }
    let status = std::process::Command::new(exe)
        .args([
            "other-mm-exec",
            &fd.to_string(),
            &handle.to_string(),
            &data_fd.to_string(),
            &LEN.to_string(),
        ])
        .status();
    let _ = (inherit(fd, false), inherit(data_fd, false));
    if !status.is_ok_and(|s| s.success()) {
        return Err(Error::Worker {
            what: "the exec'd program failed",
        });
    }

    opener_reads(&buf, "after")?;
    let info = driver.info()?;
    println!("opener_file_registrations={}", info.file_registrations);
    drop(reg);
    Ok(())
}
