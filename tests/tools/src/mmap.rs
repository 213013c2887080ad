// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect-mmap`: maps a range of a file (a PCI BAR's sysfs `resourceN`, a `p2pmem/allocate`
//! file, a disk image) and reads or writes it with CPU loads and stores, so that selftests can
//! see device memory as a program using it would.
//!
//! Usage: gdirect-mmap FILE OFFSET LEN ACTION
//!   sha256        print the sha256 of the bytes
//!   hex           print the bytes in hex (for small ranges)
//!   fill SEED     write a pseudo-random pattern derived from SEED, then print its sha256
//!   pattern SEED  print the sha256 `fill SEED` would produce, without mapping anything
//!   flip POS      invert the byte at POS (from OFFSET) in place, print its old and new value
//! OFFSET and LEN accept decimal or 0x hex; OFFSET must be page-aligned.
//! Exit status: 0 on success, 1 on a mapping error, 2 on a usage error.

use std::{fs::OpenOptions, num::NonZeroUsize, os::fd::AsFd, process::ExitCode};

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use sha2::{Digest, Sha256};

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The deterministic test pattern: xorshift64* seeded with `seed`, little-endian words.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn usage() -> ExitCode {
    eprintln!("usage: gdirect-mmap FILE OFFSET LEN sha256|hex|fill SEED|pattern SEED|flip POS");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return usage();
    }
    let (Some(offset), Some(len)) = (parse_num(&args[1]), parse_num(&args[2])) else {
        return usage();
    };
    let Ok(len) = usize::try_from(len) else {
        return usage();
    };
    let seed = args.get(4).and_then(|s| parse_num(s));
    let action = args[3].as_str();
    if action == "pattern" {
        let Some(seed) = seed else { return usage() };
        println!("{}", hex(&Sha256::digest(pattern(seed, len))));
        return ExitCode::SUCCESS;
    }
    let write = matches!(action, "fill" | "flip");
    if !matches!(action, "sha256" | "hex" | "fill" | "flip") || (write && seed.is_none()) {
        return usage();
    }
    if action == "flip" && seed.is_none_or(|pos| pos >= len as u64) {
        return usage();
    }
    match map_and_run(&args[0], offset, len, write, seed.unwrap_or(0), action) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gdirect-mmap: {}: {e}", args[0]);
            ExitCode::FAILURE
        }
    }
}

fn map_and_run(
    path: &str,
    offset: u64,
    len: usize,
    write: bool,
    seed: u64,
    action: &str,
) -> Result<String, String> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| format!("open: {e}"))?;
    let size = NonZeroUsize::new(len).ok_or("LEN must not be 0")?;
    let offset = i64::try_from(offset).map_err(|_| "OFFSET too large")?;
    let prot = if write {
        ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
    } else {
        ProtFlags::PROT_READ
    };
    // SAFETY: a new shared mapping of a file range; nothing else in this program aliases it.
    let base = unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, file.as_fd(), offset) }
        .map_err(|e| format!("mmap: {e}"))?;
    let ptr = base.as_ptr().cast::<u8>();
    let out = if action == "flip" {
        // `seed` is the position here, checked against `len` by the caller.
        let at = seed as usize;
        // SAFETY: `at < len`, inside the writable mapping. Volatile: device memory.
        let old = unsafe { ptr.add(at).read_volatile() };
        // SAFETY: as above.
        unsafe { ptr.add(at).write_volatile(!old) };
        format!("{old:02x} -> {:02x}", !old)
    } else if write {
        let data = pattern(seed, len);
        for (i, b) in data.iter().enumerate() {
            // SAFETY: `i < len`, inside the writable mapping. Volatile: device memory.
            unsafe { ptr.add(i).write_volatile(*b) };
        }
        hex(&Sha256::digest(&data))
    } else {
        // SAFETY: `i < len`, inside the mapping. Volatile: device memory may change under us.
        let data: Vec<u8> = (0..len)
            .map(|i| unsafe { ptr.add(i).read_volatile() })
            .collect();
        if action == "hex" {
            hex(&data)
        } else {
            hex(&Sha256::digest(&data))
        }
    };
    // SAFETY: `base` and `size` are the mapping made above, no longer used.
    unsafe { munmap(base, len) }.map_err(|e| format!("munmap: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seeded() {
        assert_eq!(pattern(7, 100), pattern(7, 100));
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert_eq!(pattern(7, 13), pattern(7, 100)[..13]);
    }

    #[test]
    fn numbers_parse_in_both_bases() {
        assert_eq!(parse_num("4096"), Some(4096));
        assert_eq!(parse_num("0x1000"), Some(4096));
        assert_eq!(parse_num("x"), None);
    }
}
