// SPDX-License-Identifier: GPL-2.0 OR MIT
//! A position-keyed checksum for verifying reads: the bytes as little-endian 64-bit words
//! (the last one zero-padded), each mixed with its index and summed modulo 2^64. The sum does
//! not depend on the order of the parts, so parts are checksummed in parallel; a word moved to
//! another index changes it. `tests/bench/kvikio_bench.py` computes the same on the GPU.

use std::{os::unix::fs::FileExt, path::Path, thread};

use gdirect::{Errno, Error, Result};

/// The mix of word `w` at index `i` (SplitMix64's finaliser of `w ^ i * golden`).
#[inline]
fn mix(i: u64, w: u64) -> u64 {
    let mut z = w ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The checksum of `bytes`, whose first byte is byte `at` (a multiple of 8) of the whole.
pub fn part(bytes: &[u8], at: u64) -> u64 {
    debug_assert_eq!(at % 8, 0);
    let first = at / 8;
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    let mut i = first;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        sum = sum.wrapping_add(mix(i, u64::from_le_bytes(b)));
        i += 1;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut b = [0u8; 8];
        b[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(mix(i, u64::from_le_bytes(b)));
    }
    sum
}

/// The checksum of `bytes`, in parallel on `threads` threads.
pub fn of(bytes: &[u8], threads: usize) -> u64 {
    let piece = (bytes.len() / threads.max(1))
        .next_multiple_of(8)
        .max(1 << 20);
    thread::scope(|s| {
        let parts: Vec<_> = bytes
            .chunks(piece)
            .enumerate()
            .map(|(k, c)| s.spawn(move || part(c, (k * piece) as u64)))
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0u64, u64::wrapping_add)
    })
}

/// The checksum of `len` bytes of the file at `path` from `offset` (fewer at its end), read
/// through the page cache on `threads` threads.
pub fn of_file(path: &Path, offset: u64, len: u64, threads: usize) -> Result<u64> {
    let f = std::fs::File::open(path).map_err(|e| Error::OpenFile {
        path: path.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)),
    })?;
    let size = {
        let mut r = &f;
        std::io::Seek::seek(&mut r, std::io::SeekFrom::End(0)).unwrap_or(0)
    };
    let len = len.min(size.saturating_sub(offset));
    const PIECE: u64 = 16 << 20;
    let pieces = len.div_ceil(PIECE);
    let next = std::sync::atomic::AtomicU64::new(0);
    thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<u64> {
                    let mut buf = vec![0u8; PIECE as usize];
                    let mut sum = 0u64;
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= pieces {
                            return Ok(sum);
                        }
                        let n = PIECE.min(len - k * PIECE) as usize;
                        let off = offset + k * PIECE;
                        let mut got = 0;
                        while got < n {
                            match f.read_at(&mut buf[got..n], off + got as u64) {
                                Ok(0) => break,
                                Ok(m) => got += m,
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(e) => {
                                    return Err(Error::FileIo {
                                        path: path.to_path_buf(),
                                        offset: off + got as u64,
                                        errno: Errno::from_raw(e.raw_os_error().unwrap_or(5)),
                                    })
                                }
                            }
                        }
                        sum = sum.wrapping_add(part(&buf[..got], k * PIECE));
                    }
                })
            })
            .collect();
        workers.into_iter().try_fold(0u64, |acc, h| {
            let r = h.join().unwrap_or(Err(Error::Worker {
                what: "a checksum thread panicked",
            }))?;
            Ok(acc.wrapping_add(r))
        })
    })
}

/// The checksum of the first `len` bytes of GPU memory, copied back to the host in pieces.
#[cfg(feature = "cuda")]
pub fn of_device(memory: &cudarc::driver::CudaSlice<u8>, len: u64, threads: usize) -> Result<u64> {
    let stream = memory.stream().clone();
    let len = (len as usize).min(memory.len());
    of_copies(len, threads, |at, host| {
        let view = memory.slice(at..at + host.len());
        stream
            .memcpy_dtoh(&view, host)
            .and_then(|()| stream.synchronize())
            .map_err(|e| Error::Cuda {
                what: "device-to-host copy for verification",
                error: format!("{e:?}"),
            })
    })
}

/// [`of_device`] of a [`DeviceBuffer`](gdirect::gpu::DeviceBuffer).
#[cfg(feature = "cuda")]
pub fn of_buffer(memory: &gdirect::gpu::DeviceBuffer, len: u64, threads: usize) -> Result<u64> {
    use cudarc::driver::DeviceSlice;
    let len = (len as usize).min(DeviceSlice::len(memory));
    of_copies(len, threads, |at, host| memory.copy_to_host(at, host))
}

/// The checksum of `len` bytes that `copy(at, host)` copies into `host` a piece at a time.
#[cfg(feature = "cuda")]
fn of_copies(
    len: usize,
    threads: usize,
    mut copy: impl FnMut(usize, &mut [u8]) -> Result<()>,
) -> Result<u64> {
    const PIECE: usize = 256 << 20;
    let mut host = vec![0u8; PIECE.min(len)];
    let mut sum = 0u64;
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        copy(at, &mut host[..n])?;
        let chunk = &host[..n];
        let piece = (n / threads.max(1)).next_multiple_of(8).max(1 << 20);
        sum = sum.wrapping_add(thread::scope(|s| {
            chunk
                .chunks(piece)
                .enumerate()
                .map(|(k, c)| s.spawn(move || part(c, (at + k * piece) as u64)))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        }));
        at += n;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_to_the_whole_and_positions_matter() {
        let data: Vec<u8> = (0..(3 << 20) + 5)
            .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let whole = part(&data, 0);
        assert_eq!(of(&data, 7), whole);
        let (a, b) = data.split_at(1 << 20);
        assert_eq!(part(a, 0).wrapping_add(part(b, 1 << 20)), whole);
        let mut swapped = data.clone();
        swapped.swap(0, 8);
        assert_ne!(
            part(&swapped, 0),
            whole,
            "a byte moved by one word changes the sum"
        );
        let mut flipped = data.clone();
        flipped[12345] ^= 1;
        assert_ne!(part(&flipped, 0), whole);
        // Zero padding: a trailing zero byte is the padding's business, not a new word.
        assert_eq!(part(&[1, 2, 3], 0), part(&[1, 2, 3, 0], 0));
    }

    #[test]
    fn the_file_checksum_matches_the_bytes() {
        let path = std::env::temp_dir().join(format!("gdirect-checksum-{}", std::process::id()));
        let data: Vec<u8> = (0..(40 << 20) + 3)
            .map(|i: u32| (i.wrapping_mul(40503) >> 7) as u8)
            .collect();
        std::fs::write(&path, &data).expect("write");
        assert_eq!(
            of_file(&path, 0, data.len() as u64, 3).expect("sum"),
            part(&data, 0)
        );
        let off = 17 << 20;
        assert_eq!(
            of_file(&path, off, 1 << 30, 4).expect("sum"),
            part(&data[off as usize..], 0)
        );
        std::fs::remove_file(&path).ok();
    }
}
