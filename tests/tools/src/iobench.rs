// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-iobench`: one benchmark cell for `scripts/bench` (run in the rig, not a test).
//!
//! Usage: gdirect-iobench DEV MODE PATTERN OPS [QD]
//!   MODE     p2p (gdirect into emulated GPU memory, the module's path choice), bounce (the same,
//!            forced through host memory) or pread (plain O_DIRECT pread into host memory)
//!   PATTERN  rand4k (4 KiB at random aligned offsets) or seq1m (1 MiB sequential, wrapping)
//!   OPS      reads to time
//!   QD       reads in flight: 1 is one synchronous read at a time; more uses batches (gdirect)
//!            or threads (pread)
//! Prints one `key=value` line: ops, bytes, seconds, iops, mb_per_s, via_host (bytes that went
//! through host memory on their way to the destination), path.

use std::{os::fd::AsRawFd, process::ExitCode, time::Instant};

use gdirect::{Batch, Driver, File, HostBuffer, IoOptions, IoPath};
use gdirect_internals::egpu::Egpu;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 4 {
        eprintln!("usage: gdirect-iobench DEV p2p|bounce|pread rand4k|seq1m OPS [QD]");
        return ExitCode::from(2);
    }
    if a[1] == "overhead" {
        return match a[3]
            .parse()
            .map_err(|_| ())
            .and_then(|ops| overhead(&a[0], ops).map_err(|e| eprintln!("gdirect-iobench: {e}")))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(()) => ExitCode::FAILURE,
        };
    }
    let (Ok(ops), Ok(qd)) = (
        a[3].parse::<u64>(),
        a.get(4).map_or(Ok(1), |q| q.parse::<u64>()),
    ) else {
        return ExitCode::from(2);
    };
    match run(&a[0], &a[1], &a[2], ops, qd.max(1)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gdirect-iobench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The file offset of read `i`.
fn offset(pattern: &str, i: u64, size: u64, rng: &mut u64) -> u64 {
    match pattern {
        "rand4k" => {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % (size / 4096)) * 4096
        }
        _ => (i * (1 << 20)) % (size - (size % (1 << 20))),
    }
}

fn device_size(dev: &str) -> gdirect::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(dev).map_err(|e| gdirect::Error::OpenFile {
        path: dev.into(),
        errno: gdirect::Errno::from_raw(e.raw_os_error().unwrap_or(5)),
    })?;
    f.seek(SeekFrom::End(0))
        .map_err(|_| gdirect::Error::OpenFile {
            path: dev.into(),
            errno: gdirect::Errno::EIO,
        })
}

fn run(dev: &str, mode: &str, pattern: &str, ops: u64, qd: u64) -> gdirect::Result<()> {
    let len: u64 = if pattern == "rand4k" { 4096 } else { 1 << 20 };
    let size = device_size(dev)?;
    let slots = qd.max(1);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let file = File::open_direct(dev)?;
    let (seconds, via_host, path) = if mode == "pread" {
        let bufs: Vec<HostBuffer> = (0..slots)
            .map(|_| HostBuffer::new(len as usize))
            .collect::<gdirect::Result<_>>()?;
        let offsets: Vec<u64> = (0..ops)
            .map(|i| offset(pattern, i, size, &mut rng))
            .collect();
        let start = Instant::now();
        std::thread::scope(|s| {
            for (t, buf) in bufs.iter().enumerate() {
                let (file, offsets) = (&file, &offsets);
                s.spawn(move || {
                    for off in offsets.iter().skip(t).step_by(slots as usize) {
                        // SAFETY: `buf` is `len` writable bytes owned by this thread's slot.
                        unsafe {
                            nix::libc::pread(
                                file_fd(file),
                                buf.as_ptr().cast(),
                                len as usize,
                                *off as i64,
                            )
                        };
                    }
                });
            }
        });
        (start.elapsed().as_secs_f64(), ops * len, "host")
    } else {
        let driver = Driver::open()?;
        let gpu = Egpu::open()?;
        let alloc = gpu.alloc((slots * len).div_ceil(1 << 16) * (1 << 16))?;
        let reg = driver.register(&alloc)?;
        let options = IoOptions::new().force_bounce(mode == "bounce");
        let before = driver.stats()?;
        let start = Instant::now();
        let mut path = IoPath::Bounce;
        if qd == 1 {
            for i in 0..ops {
                path = file
                    .read_into_with(&reg, 0, offset(pattern, i, size, &mut rng), len, options)?
                    .path;
            }
        } else {
            let mut b = Batch::new();
            for i in 0..ops {
                b.read_with(
                    &file,
                    &reg,
                    (i % slots) * len,
                    offset(pattern, i, size, &mut rng),
                    len,
                    i,
                    options,
                );
            }
            // At most `qd` in flight: submit as many as have completed (the module alone would
            // take up to its max_in_flight, 128 by default).
            let (mut next, mut done) = (0usize, 0u64);
            while done < ops {
                let in_flight = next as u64 - done;
                if next < b.len() && in_flight < slots {
                    next += driver.submit_at_most(&b, next, (slots - in_flight) as usize)?;
                }
                for c in driver.reap(slots as usize, true)? {
                    if let Ok(t) = c.result {
                        path = t.path;
                    }
                    done += 1;
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let after = driver.stats()?;
        let bounced: u64 = IoPath::ALL
            .iter()
            .map(|p| after.get(*p, false).bounce_bytes - before.get(*p, false).bounce_bytes)
            .sum();
        (seconds, bounced, path.name())
    };
    let bytes = ops * len;
    println!(
        "mode={mode} pattern={pattern} qd={qd} ops={ops} bytes={bytes} seconds={seconds:.3} iops={:.0} mb_per_s={:.1} via_host={via_host} path={path}",
        ops as f64 / seconds,
        bytes as f64 / seconds / 1e6
    );
    Ok(())
}

/// `DEV overhead - OPS`: the time per call of the pieces of a synchronous 4 KiB read, for finding
/// where the per-request cost goes: an ioctl that does nothing much (`GET_INFO`), a `READ`
/// refused after its checks (misaligned length: lookup, file, target), a whole P2P `READ`, the
/// same into registered host memory and through the bounce pool, and a plain `pread`.
fn overhead(dev: &str, ops: u64) -> gdirect::Result<()> {
    let driver = Driver::open()?;
    let gpu = Egpu::open()?;
    let alloc = gpu.alloc(1 << 16)?;
    let reg = driver.register(&alloc)?;
    let file = File::open_direct(dev)?;
    let host = HostBuffer::new(4096)?;
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..ops {
            f();
        }
        start.elapsed().as_secs_f64() / ops as f64 * 1e6
    };
    let mut pread_once = || {
        // SAFETY: `host` is 4096 writable bytes that outlive the call.
        unsafe { nix::libc::pread(file_fd(&file), host.as_ptr().cast(), 4096, 0) };
    };
    // First and last: the guest's speed drifts during a run.
    let pread_first = time(&mut pread_once);
    let info = time(&mut || {
        let _ = driver.info();
    });
    let refused = time(&mut || {
        let _ = file.read_into(&reg, 0, 0, 4095);
    });
    let read = time(&mut || {
        let _ = file.read_into(&reg, 0, 0, 4096);
    });
    let hostreg = driver.register(&host)?;
    let host_read = time(&mut || {
        let _ = file.read_into(&hostreg, 0, 0, 4096);
    });
    let bounce = IoOptions::new().force_bounce(true);
    let bounce_read = time(&mut || {
        let _ = file.read_into_with(&reg, 0, 0, 4096, bounce);
    });
    drop(hostreg);
    let pread = time(&mut pread_once);
    println!(
        "overhead ops={ops} info_us={info:.1} refused_read_us={refused:.1} read_us={read:.1} host_read_us={host_read:.1} bounce_read_us={bounce_read:.1} pread_us={pread:.1} pread_first_us={pread_first:.1}"
    );
    Ok(())
}

fn file_fd(f: &File) -> i32 {
    use std::os::fd::AsFd;
    f.as_fd().as_raw_fd()
}
