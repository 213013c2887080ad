// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The direct-I/O call: one synchronous `vfs_iocb_iter_read`/`_write` of a file over a bvec
//! iterator, so that raw namespaces and file systems alike work, holes read as zeros, and every
//! permission check is the file system's. A floor under the data path (`io`) and the
//! statistics (`stats`, which count by [`Dir`]): it imports only `error`, and takes no lock
//! (the file system takes its own).

use core::ffi::c_void;
use kernel::{
    bindings,
    fs::File,
    prelude::*, //
};

use crate::error;

unsafe extern "C" {
    // `shim.c`: `init_sync_kiocb()`; `kiocb` and `file` cross as `void *`.
    fn gdirect_init_sync_kiocb(kiocb: *mut c_void, file: *mut c_void);
}

/// `IOCB_APPEND` (`include/linux/fs.h`), which is `RWF_APPEND` of the uapi (`linux/fs.h`, an ABI
/// value): bindgen cannot evaluate the macro's cast.
const IOCB_APPEND: i32 = 0x10;

/// The direction of a transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

impl Dir {
    /// Index in the statistics: 0 read, 1 write.
    pub(crate) fn index(self) -> usize {
        match self {
            Self::Read => 0,
            Self::Write => 1,
        }
    }
}

/// One synchronous direct I/O of `len` bytes at `pos` over `bvecs`.
pub(crate) fn direct_io(
    file: &File,
    dir: Dir,
    pos: u64,
    bvecs: &[bindings::bio_vec],
    len: u64,
) -> Result<u64> {
    let pos = i64::try_from(pos).map_err(|_| EOVERFLOW)?;
    // SAFETY: `kiocb` and `iov_iter` are plain C structs for which all zeros is a valid start;
    // both are then initialized by the kernel's own functions.
    let mut kiocb: bindings::kiocb = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut iter: bindings::iov_iter = unsafe { core::mem::zeroed() };
    // SAFETY: `kiocb` is writable; `file` is a valid, referenced file.
    unsafe { gdirect_init_sync_kiocb((&raw mut kiocb).cast(), file.as_ptr().cast()) };
    // The flags are the file's now: `fcntl(F_SETFL)` may have cleared `O_DIRECT` since the
    // request was checked, and this must never become a buffered I/O through the page cache
    // over device memory. (The access mode cannot change after `open`.)
    if kiocb.ki_flags & bindings::IOCB_DIRECT as i32 == 0 {
        return Err(error::not_direct());
    }
    // Transfers are positional: a file open with O_APPEND is written at `pos`, as
    // `pwritev2(RWF_NOAPPEND)` writes, not at its end (where the file size limit, checked
    // against `pos` for a batch's write, would not apply).
    kiocb.ki_flags &= !IOCB_APPEND;
    kiocb.ki_pos = pos;
    let direction = match dir {
        Dir::Read => bindings::ITER_DEST,
        Dir::Write => bindings::ITER_SOURCE,
    };
    // SAFETY: `bvecs` lives until the synchronous I/O below returns; `len` is their total.
    unsafe {
        bindings::iov_iter_bvec(
            &mut iter,
            direction as _,
            bvecs.as_ptr(),
            bvecs.len(),
            len as usize,
        )
    };
    // SAFETY: `kiocb` was initialized for `file` without a completion callback, so the call
    // returns only when the I/O is done; `iter` describes `bvecs`.
    let ret = unsafe {
        match dir {
            Dir::Read => bindings::vfs_iocb_iter_read(file.as_ptr(), &mut kiocb, &mut iter),
            Dir::Write => bindings::vfs_iocb_iter_write(file.as_ptr(), &mut kiocb, &mut iter),
        }
    };
    if ret < 0 {
        return Err(Error::from_errno(ret as i32));
    }
    Ok(ret as u64)
}
