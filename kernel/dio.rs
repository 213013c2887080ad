// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! The direct-I/O call: one synchronous `->read_iter`/`->write_iter` of a file over a bvec
//! iterator, as `vfs_iocb_iter_read`/`_write` make it, so that raw namespaces and file systems
//! alike work, holes read as zeros, and every permission check is the kernel's, made apart
//! ([`verify`], before the memory is held); tried without waiting ([`Wait::NoWait`]), and what
//! the file system would have waited for done apart ([`settle`], [`touch`]), so that the data
//! path holds device memory only while data moves. A floor under the data path (`io`), the
//! statistics (`stats`, which count by [`Dir`]) and the submitter (the file size limit): it
//! imports only `error`, and takes no lock of its own (the file system takes its own; the
//! inode's lock and the freeze protection are taken and given back at once, only to wait for
//! them: [`wait_elsewhere`]).

use core::ffi::{
    c_int,
    c_void, //
};
use kernel::{
    bindings,
    error::to_result,
    fs::File,
    prelude::*, //
};

use crate::error;

unsafe extern "C" {
    // `shim.c`: `init_sync_kiocb()`; `kiocb` and `file` cross as `void *`.
    fn gdirect_init_sync_kiocb(kiocb: *mut c_void, file: *mut c_void);
    fn gdirect_fsize_limit() -> u64;
    // `file_start_write()`, `file_end_write()`, `file_start_write_trylock()`.
    fn gdirect_file_start_write(file: *mut c_void);
    fn gdirect_file_end_write(file: *mut c_void);
    fn gdirect_file_start_write_trylock(file: *mut c_void) -> bool;
    // `fsnotify_access()`, `fsnotify_modify()`.
    fn gdirect_fsnotify_access(file: *mut c_void);
    fn gdirect_fsnotify_modify(file: *mut c_void);
    // `inode_get_mtime()`, `inode_get_ctime()` of the file's inode.
    fn gdirect_file_mtime(file: *mut c_void) -> bindings::timespec64;
    fn gdirect_file_ctime(file: *mut c_void) -> bindings::timespec64;
    fn gdirect_file_nocmtime(file: *mut c_void) -> bool;
    fn gdirect_file_iversion_need_inc(file: *mut c_void) -> bool;
    // `inode_trylock_shared()`, `inode_lock_shared_killable()`, `inode_unlock_shared()` of the
    // file's inode.
    fn gdirect_file_inode_trylock_shared(file: *mut c_void) -> bool;
    fn gdirect_file_inode_lock_shared_killable(file: *mut c_void) -> c_int;
    fn gdirect_file_inode_unlock_shared(file: *mut c_void);
    // `FMODE_NOWAIT` of the file's mode.
    fn gdirect_file_nowait(file: *mut c_void) -> bool;
}

/// The calling task's `RLIMIT_FSIZE` (`u64::MAX` for none).
pub(crate) fn fsize_limit() -> u64 {
    // SAFETY: no preconditions.
    unsafe { gdirect_fsize_limit() }
}

/// The bytes of a write of `len` at `pos` to the regular file `file` that its limits let through,
/// as the write's own checks cut it (`generic_write_check_limits()`): the calling task's
/// `RLIMIT_FSIZE` (at or past it `EFBIG`, and `SIGXFSZ` to the task, as `write()` gets), the file
/// system's largest file, 2 GiB for a file opened without `O_LARGEFILE` (`EFBIG` at or past
/// those). A position no `loff_t` holds fails as the write would, `EOVERFLOW`.
pub(crate) fn write_limits(file: &File, pos: u64, len: u64) -> Result<u64> {
    let pos = i64::try_from(pos).map_err(|_| EOVERFLOW)?;
    let mut count = i64::try_from(len).unwrap_or(i64::MAX);
    // SAFETY: `file` is a valid, referenced regular file; `count` is a valid `loff_t`.
    to_result(unsafe { bindings::generic_write_check_limits(file.as_ptr(), pos, &mut count) })?;
    // (Cut only down: a count it leaves is between 0 and `len`.)
    Ok(u64::try_from(count).map_or(0, |c| c.min(len)))
}

/// `IOCB_APPEND` (`include/linux/fs.h`), which is `RWF_APPEND` of the uapi (`linux/fs.h`, an ABI
/// value): bindgen cannot evaluate the macro's cast.
const IOCB_APPEND: i32 = 0x10;

/// `IOCB_NOWAIT`, likewise `RWF_NOWAIT` of the uapi.
const IOCB_NOWAIT: i32 = 0x8;

/// `FMODE_READ`, `FMODE_WRITE`, `FMODE_CAN_READ` and `FMODE_CAN_WRITE` (`include/linux/fs.h`):
/// bindgen cannot evaluate their casts; `layout.rs` checks them against C's at load.
pub(crate) const FMODE_READ: u32 = 1 << 0;
/// See [`FMODE_READ`].
pub(crate) const FMODE_WRITE: u32 = 1 << 1;
/// See [`FMODE_READ`].
pub(crate) const FMODE_CAN_READ: u32 = 1 << 17;
/// See [`FMODE_READ`].
pub(crate) const FMODE_CAN_WRITE: u32 = 1 << 18;

/// Whether `file` was opened for I/O of `dir`, as `vfs_iocb_iter_read()`/`_write()` answer it:
/// `EBADF` without `FMODE_READ`/`FMODE_WRITE` (opened `O_WRONLY` or `O_RDONLY`, or with the
/// access mode 3, which opens for `ioctl`s alone and has neither: no write access taken, so no
/// `ETXTBSY`, no hold on a read-only remount, no `BLK_OPEN_WRITE` on a block device), `EINVAL`
/// without the operation (`FMODE_CAN_READ`/`FMODE_CAN_WRITE`).
pub(crate) fn open_for(file: &File, dir: Dir) -> Result {
    // SAFETY: a referenced file's mode is set at open; reading it races with nothing that
    // matters (the bits tested are not changed after open).
    let mode = unsafe { (*file.as_ptr()).f_mode };
    let (open, can) = match dir {
        Dir::Read => (FMODE_READ, FMODE_CAN_READ),
        Dir::Write => (FMODE_WRITE, FMODE_CAN_WRITE),
    };
    if mode & open == 0 {
        return Err(EBADF);
    }
    if mode & can == 0 {
        return Err(EINVAL);
    }
    Ok(())
}

/// Whether a direct I/O may wait in the file system before its data moves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It may (the block layer's own waits, for a free request, are always allowed).
    Block,
    /// `IOCB_NOWAIT`: `EAGAIN` where the file system would wait first, for its inode lock
    /// (`inode_trylock_shared()` in `ext4_dio_read_iter()`, `xfs_ilock_iocb()`), for dirty page
    /// cache in the range to be written back (`kiocb_write_and_wait()`), for extents to be read
    /// in (XFS), or for a write that allocates blocks or extends the file
    /// (`ext4_dio_write_checks()`, `xfs_direct_write_iomap_begin()`).
    NoWait,
}

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

/// A synchronous `kiocb` of `file` at `pos`, its flags the file's.
fn sync_kiocb(file: &File, pos: u64) -> Result<bindings::kiocb> {
    let pos = i64::try_from(pos).map_err(|_| EOVERFLOW)?;
    // SAFETY: `kiocb` is a plain C struct for which all zeros is a valid start; it is then
    // initialized by the kernel's own function.
    let mut kiocb: bindings::kiocb = unsafe { core::mem::zeroed() };
    // SAFETY: `kiocb` is writable; `file` is a valid, referenced file.
    unsafe { gdirect_init_sync_kiocb((&raw mut kiocb).cast(), file.as_ptr().cast()) };
    kiocb.ki_pos = pos;
    Ok(kiocb)
}

/// The permission checks of an I/O of `len` bytes at `pos`, passed: see [`verify`].
pub(crate) struct Verified {
    dir: Dir,
    pos: u64,
    end: u64,
}

/// The checks `vfs_iocb_iter_read()`/`_write()` make before the file system's I/O
/// (`rw_verify_area()`): the range, the security modules' `file_permission`, and fsnotify's
/// permission events, which wait for a listener's answer (fanotify `FAN_ACCESS_PERM` from an
/// on-access scanner, `FAN_PRE_ACCESS` from a hierarchical storage manager that first fills the
/// range from elsewhere) for as long as it takes. Made before a chunk takes its use of device
/// memory, which a free waits for: [`direct_io`] then does the I/O without them, as those
/// functions do after theirs. Its checks stand for an I/O of the same direction inside the
/// range. Never called inside the file system's freeze protection (a permission listener may
/// write to the file system: `fsnotify_file_area_perm()`).
pub(crate) fn verify(file: &File, dir: Dir, pos: u64, len: u64) -> Result<Verified> {
    open_for(file, dir)?;
    let (count, end) = (
        usize::try_from(len)?,
        pos.checked_add(len).ok_or(EOVERFLOW)?,
    );
    let ppos = i64::try_from(pos).map_err(|_| EOVERFLOW)?;
    let rw = match dir {
        Dir::Read => bindings::READ,
        Dir::Write => bindings::WRITE,
    };
    // SAFETY: `file` is a valid, referenced file; `ppos` lives across the call, which keeps no
    // pointer to it. It takes no lock the caller holds, and may sleep (the caller holds none).
    let ret = unsafe { bindings::rw_verify_area(rw as i32, file.as_ptr(), &ppos, count) };
    if ret < 0 {
        return Err(Error::from_errno(ret));
    }
    Ok(Verified { dir, pos, end })
}

/// One synchronous direct I/O of `len` bytes at `pos` over `bvecs`, inside a range `checked`
/// by [`verify`]: the file system's `->read_iter`/`->write_iter`, called as
/// `vfs_iocb_iter_read()`/`_write()` call it after their checks (a write inside the file
/// system's freeze protection, `file_start_write()`), so that no permission event is awaited
/// here. The caller tells fsnotify after ([`notify`]).
pub(crate) fn direct_io(
    file: &File,
    checked: &Verified,
    pos: u64,
    bvecs: &[bindings::bio_vec],
    len: u64,
    wait: Wait,
) -> Result<u64> {
    let dir = checked.dir;
    if pos < checked.pos || pos.checked_add(len).is_none_or(|end| end > checked.end) {
        return Err(EINVAL);
    }
    let mut kiocb = sync_kiocb(file, pos)?;
    // SAFETY: `iov_iter` is a plain C struct for which all zeros is a valid start; it is then
    // initialized by the kernel's own function.
    let mut iter: bindings::iov_iter = unsafe { core::mem::zeroed() };
    // The flags are the file's now: `fcntl(F_SETFL)` may have cleared `O_DIRECT` since the
    // request was checked, and this must never become a buffered I/O through the page cache
    // over device memory. (The access mode cannot change after `open`.)
    if kiocb.ki_flags & bindings::IOCB_DIRECT as i32 == 0 {
        return Err(error::not_direct());
    }
    // Transfers are positional: a file open with O_APPEND is written at `pos`, as
    // `pwritev2(RWF_NOAPPEND)` writes, not at its end (where the file size limit, checked
    // against `pos` for a batch's write, would not apply); and, as that call is, refused for an
    // append-only inode (`chattr +a`, whose every writable descriptor has O_APPEND): it is
    // written only at its end (`kiocb_set_rw_flags()`).
    if kiocb.ki_flags & IOCB_APPEND != 0 {
        // SAFETY: `file` is a valid, referenced file; its inode lives as long.
        let flags = unsafe { (*(*file.as_ptr()).f_inode).i_flags };
        if dir == Dir::Write && flags & bindings::S_APPEND != 0 {
            return Err(EPERM);
        }
        kiocb.ki_flags &= !IOCB_APPEND;
    }
    if wait == Wait::NoWait {
        kiocb.ki_flags |= IOCB_NOWAIT;
    }
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
    // SAFETY: a referenced file's operations live as long as the file.
    let op = unsafe {
        let fops = (*file.as_ptr()).f_op;
        match dir {
            Dir::Read => (*fops).read_iter,
            Dir::Write => (*fops).write_iter,
        }
    };
    // As `vfs_iocb_iter_read()`/`_write()` answer a file without the operation. (The open
    // mode was checked by `verify`, and with the request.)
    let op = op.ok_or(EINVAL)?;
    let f = file.as_ptr().cast();
    if dir == Dir::Write {
        match wait {
            // SAFETY: `f` is a valid, referenced file; ended below.
            Wait::Block => unsafe { gdirect_file_start_write(f) },
            // A freeze under way: no waiting for its end here (`touch()`, before the next try,
            // waits for it with no use held).
            // SAFETY: as above.
            Wait::NoWait => {
                if !unsafe { gdirect_file_start_write_trylock(f) } {
                    return Err(EAGAIN);
                }
            }
        }
    }
    // The VFS's checks before this call were made by `verify` (`open_for`, `rw_verify_area`).
    // SAFETY: `kiocb` was initialized for `file` without a completion callback, so the call
    // returns only when the I/O is done; `iter` describes `bvecs`; `op` is the file's own.
    let ret = unsafe { op(&mut kiocb, &mut iter) };
    if dir == Dir::Write {
        // SAFETY: `f` is a valid, referenced file whose freeze protection was taken above.
        unsafe { gdirect_file_end_write(f) };
    }
    if ret < 0 {
        return Err(Error::from_errno(ret as i32));
    }
    Ok(ret as u64)
}

/// Tells fsnotify of a [`direct_io`] that returned `got`, as `vfs_iocb_iter_read()`/`_write()`
/// tell it after theirs (an access for a read that did not fail, a change for a write that
/// moved bytes): after the chunk's use of the memory ended, since queueing an event allocates.
pub(crate) fn notify(file: &File, dir: Dir, got: &Result<u64>) {
    let f = file.as_ptr().cast();
    match (dir, got) {
        // SAFETY: `f` is a valid, referenced file; the events are queued, nothing is awaited.
        (Dir::Read, Ok(_)) => unsafe { gdirect_fsnotify_access(f) },
        // SAFETY: as above.
        (Dir::Write, Ok(n)) if *n > 0 => unsafe { gdirect_fsnotify_modify(f) },
        _ => {}
    }
}

/// Allocates `len` bytes of `file` at `pos` (`fallocate(2)` with mode 0: unwritten extents, the
/// file's size extended to `pos + len` where it was smaller), so that a write there is an
/// overwrite that [`Wait::NoWait`] lets through. Waits for the inode's lock like any
/// `fallocate`. Only below the caller's file size limit, where the write it prepares is cut
/// (`generic_write_check_limits()`): an allocation across it would send `SIGXFSZ`, which the
/// write sends only from the limit on. A failure is left for the write to meet (it is tried
/// again, then bounced).
fn allocate(file: &File, pos: u64, len: u64) {
    let limit = fsize_limit();
    if pos >= limit {
        return;
    }
    let len = len.min(limit - pos);
    let (Ok(pos), Ok(len)) = (i64::try_from(pos), i64::try_from(len)) else {
        return;
    };
    // SAFETY: `file` is a valid, referenced file; `vfs_fallocate()` makes the permission and
    // range checks of the system call.
    unsafe { bindings::vfs_fallocate(file.as_ptr(), 0, pos, len) };
}

/// Updates the file's modification and change times, as a write to it is about to
/// (`file_update_time()`, which writes do before their data: `file_modified()`), so that a
/// write that follows with [`Wait::NoWait`] has no timestamp to update: XFS refuses that
/// without waiting for a transaction (`kiocb_modified()`, `xfs_vn_update_time()`), and with
/// multigrain timestamps nearly every write needs one. Nothing to do where the times are new.
/// A failure is left for the write to meet, which updates them itself.
pub(crate) fn touch(file: &File) {
    // SAFETY: `file` is a valid, referenced file. Inside the file system's freeze protection,
    // as a write's own update is (`file_start_write()`, waiting for a frozen file system to
    // thaw: the caller holds no use); the calls take no lock the caller holds.
    unsafe {
        gdirect_file_start_write(file.as_ptr().cast());
        bindings::file_update_time(file.as_ptr());
        gdirect_file_end_write(file.as_ptr().cast());
    }
}

/// Whether a write tried with [`Wait::NoWait`] would be refused to update the file's times:
/// `file_update_time_flags()` and `need_cmtime_update()` (`fs/inode.c`). Never for a file whose
/// times a write does not update (`S_NOCMTIME`, `FMODE_NOCMTIME`); otherwise where the
/// modification or change time differs from the time a write would set now (`current_time()`),
/// or the change counter was looked at since its last increase (`inode_iversion_need_inc()`).
/// After a [`touch`], true once the file system's clock has ticked since (its coarse clock: a
/// jiffy), or something asked for the change counter (`statx()`'s change cookie, NFS).
pub(crate) fn times_stale(file: &File) -> bool {
    let f = file.as_ptr();
    // SAFETY: `f` is a valid, referenced file, whose inode lives as long as it; reading the
    // times, flags and change counter races only with their updates, as the kernel's own check
    // does.
    unsafe {
        if gdirect_file_nocmtime(f.cast()) {
            return false;
        }
        let now = bindings::current_time((*f).f_inode);
        let same = |t: bindings::timespec64| t.tv_sec == now.tv_sec && t.tv_nsec == now.tv_nsec;
        !same(gdirect_file_mtime(f.cast()))
            || !same(gdirect_file_ctime(f.cast()))
            || gdirect_file_iversion_need_inc(f.cast())
    }
}

/// Whether the file's file system tries an I/O without waiting where asked (`FMODE_NOWAIT`, as
/// `kiocb_set_rw_flags()` requires for `RWF_NOWAIT`): where it does not, `IOCB_NOWAIT` may be
/// refused or waited through.
pub(crate) fn file_nowait(file: &File) -> bool {
    // SAFETY: `file` is a valid, referenced file; its mode bit is set at open.
    unsafe { gdirect_file_nowait(file.as_ptr().cast()) }
}

/// Whether an I/O of `dir` tried with [`Wait::NoWait`] and refused (`EAGAIN`) may have met what
/// another task can hold for as long as it likes: the file's inode lock (`i_rwsem`, which ext4's
/// and XFS's reads and writes take) held exclusive, or awaited (a shared try fails behind any
/// waiter), as a buffered writer stalled in its copy from a page that faults into a userfaultfd
/// holds it; or, for a write, a freeze of its file system. Each is tried, and given back at once
/// where taken. (A write the file system takes the lock exclusive for, as ext4 does an extending
/// or unaligned one, also waits behind tasks that hold it shared; that is not looked at here:
/// XFS writes an aligned one, extending too, under the lock shared, and a wait for the lock
/// exclusive would hold up every reader of the file behind it.)
pub(crate) fn held_elsewhere(file: &File, dir: Dir) -> bool {
    let f = file.as_ptr().cast();
    // SAFETY: `f` is a valid, referenced file, whose inode lives as long as it; what a try takes
    // is given back at once, and the caller holds neither (nor any lock of its own).
    unsafe {
        if dir == Dir::Write {
            if !gdirect_file_start_write_trylock(f) {
                return true;
            }
            gdirect_file_end_write(f);
        }
        if gdirect_file_inode_trylock_shared(f) {
            gdirect_file_inode_unlock_shared(f);
            return false;
        }
        true
    }
}

/// Waits for what [`held_elsewhere`] looks at, in turn, and gives each back once taken: for a
/// write, a freeze of the file system to end (`file_start_write()`, as a write waits), then the
/// inode lock, shared. For a caller that holds nothing another task needs (a direct chunk lets
/// its use of the memory go first, a bounced chunk its chunk of the pool). The wait lasts as
/// long as another task holds the lock (one stalled on a page fault into a userfaultfd, for
/// ever) or the file system stays frozen; a fatal signal ends the lock's wait (`EINTR`).
pub(crate) fn wait_elsewhere(file: &File, dir: Dir) -> Result {
    let f = file.as_ptr().cast();
    // SAFETY: `f` is a valid, referenced file, whose inode lives as long as it; the caller holds
    // no lock (nor the inode's, nor the file system's freeze protection), so each wait makes no
    // lock order; what is taken is given back right after, by this task.
    unsafe {
        if dir == Dir::Write {
            gdirect_file_start_write(f);
            gdirect_file_end_write(f);
        }
        to_result(gdirect_file_inode_lock_shared_killable(f))?;
        gdirect_file_inode_unlock_shared(f);
    }
    Ok(())
}

/// Does, with no use of the memory held, what a direct I/O of `len` bytes at `pos` waits for
/// before its data moves, so that the chunk tried again with [`Wait::NoWait`] finds it done: a
/// read's range of dirty page cache written back (`kiocb_write_and_wait()`); a write's blocks
/// allocated ([`allocate`]) and its range of page cache written back and dropped
/// (`kiocb_invalidate_pages()`). Failures are left for the I/O to meet (tried again, then
/// through the bounce pool).
pub(crate) fn settle(file: &File, dir: Dir, pos: u64, len: u64) {
    let (Ok(mut kiocb), Ok(count)) = (sync_kiocb(file, pos), usize::try_from(len)) else {
        return;
    };
    match dir {
        // SAFETY: `kiocb` was initialized for `file`, at `pos`.
        Dir::Read => unsafe { bindings::kiocb_write_and_wait(&mut kiocb, count) },
        Dir::Write => {
            allocate(file, pos, len);
            // SAFETY: as above.
            unsafe { bindings::kiocb_invalidate_pages(&mut kiocb, count) }
        }
    };
}
