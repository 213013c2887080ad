// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Per-open-file state of `/dev/gdirect` and the ioctl dispatcher.
//!
//! There is one [`GdirectFile`] for each open file of the device; it is created by `open()` and
//! dropped by the last `close()` (or the death of the process). Its registrations live in an
//! xarray indexed by handle number and are released with it.
//!
//! Handles: `cookie << 32 | index`. The cookie is random per file, so a handle of another file
//! is recognised (`EPERM`); indexes are never reused within a file, so a handle that was
//! unregistered (`ESTALE`) is told from one that never existed (`ENOENT`).
//!
//! The dispatcher checks the ioctl type, then the command number, then that the size and
//! direction encoded in the command are exactly the ones of `include/uapi/linux/gdirect.h`, then
//! that the caller runs in the address space that opened the file (`EXDEV` otherwise), and only
//! then touches user memory.
//!
//! A file belongs to the address space (`mm`) that opened it, as a KVM VM does: its
//! registrations pin that address space's memory, and a process that has the file by `fork`,
//! `exec` or `SCM_RIGHTS` would otherwise read into memory it does not see (after `fork` the
//! child's copies of pinned host pages are its own, not the pinned ones) or into another
//! process's GPU memory. Such a process opens the device itself.
//!
//! Lock order: `next_index`, then the xarray's lock, only to store or remove a registration;
//! a registration's last reference is dropped (which may sleep) with neither held. Nothing
//! else here takes a lock: limits are atomics (`stats`, `users`, `memlock`) and the I/O runs in
//! `io` and `batch` with their own.

use kernel::{
    bindings,
    fs::File,
    ioctl::{
        _IOC_NR,
        _IOC_SIZE,
        _IOC_TYPE, //
    },
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    mm::Mm,
    new_mutex, pci,
    prelude::*,
    seq_file::SeqFile,
    seq_print,
    sync::{
        aref::ARef,
        atomic::{
            Atomic,
            Relaxed, //
        },
        Arc,
        Mutex, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
    xarray::{
        AllocKind,
        XArray, //
    },
};

use crate::{
    batch::Batches,
    dio::Dir,
    error,
    io::Transfer,
    memlock::{
        self,
        LockedVmUser,
        MemlockCharge, //
    },
    provider,
    region::{
        self,
        FileCounters,
        PinCharge,
        Registration, //
    },
    revocation::RegShared,
    stats,
    submitter::Submitter,
    topology,
    uapi::{
        self,
        Cqe,
        EventfdArgs,
        InfoArgs,
        IoArgs,
        QueryArgs,
        ReapArgs,
        RegisterArgs,
        Sqe,
        StatsArgs,
        StatsArgsV1,
        SubmitArgs,
        UnregisterArgs, //
    },
    users::{
        self,
        UserCharge, //
    },
};

/// Number of open files of the device, for `GET_INFO`.
static OPEN_FILES: Atomic<u32> = Atomic::new(0);

/// The state of one open file of `/dev/gdirect`.
#[pin_data(PinnedDrop)]
pub(crate) struct GdirectFile {
    /// Registrations by handle index.
    #[pin]
    regs: XArray<Arc<Registration>>,
    /// The next handle index; indexes are never reused.
    #[pin]
    next_index: Mutex<u32>,
    cookie: u32,
    /// The user that opened the file (and the owners of its user namespaces), whose per-user
    /// limit its registrations count against.
    opener: users::Opener,
    /// The address space that opened the file, the only one its commands are taken from; held
    /// (`mmgrab`) so that no other address space can be allocated at its address meanwhile.
    /// `None` for a file opened without one (by the kernel itself): no command is taken.
    mm: Option<ARef<Mm>>,
    /// The opener's user, whose `locked_vm` host registrations are charged to; `None` for an
    /// opener with `CAP_IPC_LOCK`.
    locked_vm_user: Option<Arc<LockedVmUser>>,
    counters: Arc<FileCounters>,
    batches: Arc<Batches>,
}

/// The commands of the ABI, by `_IOC_NR`.
#[derive(Clone, Copy)]
enum Command {
    GetInfo,
    Register,
    Unregister,
    Query,
    Read,
    Write,
    Submit,
    Reap,
    SetEventfd,
    GetStats,
    /// `GET_STATS` with its first struct (`_V1`): the same number, another size.
    GetStatsV1,
    PeerCheck,
}

impl Command {
    /// Looks a command up by its code's number (and, for a number with more than one struct,
    /// its size); `ENOTTY` for numbers the ABI does not define.
    fn from_code(cmd: u32) -> Result<Self> {
        match _IOC_NR(cmd) {
            0x09 if cmd == uapi::IOC_GET_STATS_V1 => Ok(Self::GetStatsV1),
            0x00 => Ok(Self::GetInfo),
            0x01 => Ok(Self::Register),
            0x02 => Ok(Self::Unregister),
            0x03 => Ok(Self::Query),
            0x04 => Ok(Self::Read),
            0x05 => Ok(Self::Write),
            0x06 => Ok(Self::Submit),
            0x07 => Ok(Self::Reap),
            0x08 => Ok(Self::SetEventfd),
            0x09 => Ok(Self::GetStats),
            0x0a => Ok(Self::PeerCheck),
            _ => Err(ENOTTY),
        }
    }

    /// The full command code, with the direction and size of this module's ABI.
    fn code(self) -> u32 {
        match self {
            Self::GetInfo => uapi::IOC_GET_INFO,
            Self::Register => uapi::IOC_REGISTER,
            Self::Unregister => uapi::IOC_UNREGISTER,
            Self::Query => uapi::IOC_QUERY,
            Self::Read => uapi::IOC_READ,
            Self::Write => uapi::IOC_WRITE,
            Self::Submit => uapi::IOC_SUBMIT,
            Self::Reap => uapi::IOC_REAP,
            Self::SetEventfd => uapi::IOC_SET_EVENTFD,
            Self::GetStats => uapi::IOC_GET_STATS,
            Self::GetStatsV1 => uapi::IOC_GET_STATS_V1,
            Self::PeerCheck => uapi::IOC_PEER_CHECK,
        }
    }
}

#[vtable]
impl MiscDevice for GdirectFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        // SAFETY: no preconditions.
        let cookie = unsafe { bindings::get_random_u32() }.max(1);
        let file = KBox::pin_init(
            try_pin_init!(Self {
                regs <- XArray::new(AllocKind::Alloc1),
                next_index <- new_mutex!(1, "GdirectFile::next_index"),
                cookie,
                opener: users::opener()?,
                mm: memlock::current_mm(),
                locked_vm_user: LockedVmUser::opener()?,
                counters: FileCounters::new()?,
                batches: Batches::new()?,
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        OPEN_FILES.fetch_add(1, Relaxed);
        Ok(file)
    }

    fn ioctl(me: Pin<&GdirectFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        if _IOC_TYPE(cmd) != uapi::IOC_MAGIC {
            return Err(ENOTTY);
        }
        let command = Command::from_code(cmd)?;
        // A known command with another size or direction: an older or newer struct layout.
        if cmd != command.code() {
            return Err(EINVAL);
        }
        if !me.in_opener_mm() {
            return Err(EXDEV);
        }
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match command {
            Command::GetInfo => me.get_info(user),
            Command::Register => me.register(user),
            Command::Unregister => me.unregister(user),
            Command::Query => me.query(user),
            Command::Read => me.transfer(user, Dir::Read),
            Command::Write => me.transfer(user, Dir::Write),
            Command::Submit => me.submit(user),
            Command::Reap => me.reap(user),
            Command::SetEventfd => me.set_eventfd(user),
            Command::GetStats => get_stats(user),
            Command::GetStatsV1 => get_stats_v1(user),
            Command::PeerCheck => peer_check(user),
        }
    }

    fn show_fdinfo(me: Pin<&GdirectFile>, m: &SeqFile, _file: &File) {
        seq_print!(
            m,
            "gdirect-registrations:\t{}\n",
            me.counters.registrations.load(Relaxed)
        );
        seq_print!(
            m,
            "gdirect-pinned-bytes:\t{}\n",
            me.counters.pinned_bytes.load(Relaxed)
        );
    }
}

#[pinned_drop]
impl PinnedDrop for GdirectFile {
    fn drop(self: Pin<&mut Self>) {
        // The xarray drops the registrations (unpinning their memory) when it is dropped.
        OPEN_FILES.fetch_sub(1, Relaxed);
    }
}

/// A reservation of the module's and the file's limits, undone unless committed.
struct Reservation<'a> {
    counters: &'a FileCounters,
    len: u64,
}

impl<'a> Reservation<'a> {
    /// Reserves `len` pinned bytes (`EDQUOT`) and one registration of this file (`EMFILE`).
    fn new(counters: &'a FileCounters, len: u64) -> Result<Self> {
        let (max_pinned, max_regs) = crate::limits();
        if !stats::reserve_within(&stats::PINNED_BYTES, len, max_pinned) {
            return Err(error::over_pin_limit());
        }
        if counters.registrations.fetch_add(1, Relaxed) >= max_regs {
            counters.registrations.fetch_sub(1, Relaxed);
            stats::PINNED_BYTES.fetch_sub(len, Relaxed);
            return Err(EMFILE);
        }
        Ok(Self { counters, len })
    }

    /// The registration exists: its `Drop` gives the reservation back.
    fn commit(self, provider: u32) {
        stats::REGISTRATIONS.fetch_add(1, Relaxed);
        stats::BY_PROVIDER[provider as usize].fetch_add(1, Relaxed);
        self.counters.pinned_bytes.fetch_add(self.len, Relaxed);
        core::mem::forget(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        stats::PINNED_BYTES.fetch_sub(self.len, Relaxed);
        self.counters.registrations.fetch_sub(1, Relaxed);
    }
}

impl GdirectFile {
    /// Whether the calling task runs in the address space that opened the file.
    fn in_opener_mm(&self) -> bool {
        // Not `CurrentTask::mm()`, which reads the wrong field on this kernel (see `shim.c`).
        self.mm.as_deref().is_some_and(memlock::is_current_mm)
    }

    /// `GDIRECT_IOC_GET_INFO`.
    fn get_info(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let args: InfoArgs = reader.read()?;
        if args.flags != 0
            || args.pad != 0
            || args.pad2 != 0
            || args.pad3 != 0
            || args.reserved.iter().any(|&r| r != 0)
        {
            return Err(EINVAL);
        }
        let (major, minor, patch) = crate::VERSION;
        let (max_pinned_bytes, max_registrations) = crate::limits();
        let providers = (0..uapi::PROVIDER_COUNT)
            .filter(|p| provider::available(*p))
            .fold(0, |mask, p| mask | (1 << p));
        let out = InfoArgs {
            abi_version: uapi::ABI_VERSION,
            providers,
            version_major: major,
            version_minor: minor,
            version_patch: patch,
            open_files: OPEN_FILES.load(Relaxed),
            file_registrations: self.counters.registrations.load(Relaxed),
            file_pinned_bytes: self.counters.pinned_bytes.load(Relaxed),
            registrations: stats::REGISTRATIONS.load(Relaxed),
            pinned_bytes: stats::PINNED_BYTES.load(Relaxed),
            revocations: stats::REVOCATIONS.load(Relaxed),
            max_pinned_bytes,
            max_registrations,
            user_pinned_bytes: users::bytes_of(&self.opener),
            max_pinned_bytes_per_user: crate::max_pinned_bytes_per_user(),
            ..InfoArgs::default()
        };
        writer.write(&out)?;
        Ok(0)
    }

    /// `GDIRECT_IOC_REGISTER`.
    fn register(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: RegisterArgs = reader.read()?;
        if args.flags & !uapi::REGISTER_FLAGS != 0
            || args.reserved.iter().any(|&r| r != 0)
            || args.len == 0
        {
            return Err(EINVAL);
        }
        // A persistent registration is never revoked: it keeps GPU memory past `cudaFree` and
        // past the process, until the file closes. Only an administrator may make one.
        // SAFETY: `capable` only reads the current task's credentials.
        if args.flags & uapi::REGISTER_PERSISTENT != 0
            && !unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as i32) }
        {
            return Err(EACCES);
        }
        let align = provider::alignment(args.provider)?;
        if args.addr.checked_add(args.len).is_none() {
            return Err(EOVERFLOW);
        }
        if args.addr % align != 0 || args.len % align != 0 {
            return Err(ERANGE);
        }
        let shared = RegShared::new()?;
        // Room for the registration's share of the pin limits, made now: nothing can fail
        // between the pin and the registration that holds the pages.
        let account_slot = KBox::<PinCharge>::new_uninit(GFP_KERNEL_ACCOUNT)?;
        // Taken right before the pin, after any wait of the provider's (see `provider::pin`).
        let reserve = || {
            // The user's own limit first: a user at it is refused without touching the
            // module's total, which other users' registrations are checked against meanwhile.
            let mut user = UserCharge::new(&self.opener, args.len)?;
            let user_bytes = user.take_bytes()?;
            let reservation = Reservation::new(&self.counters, args.len)?;
            let memlock = match args.provider {
                uapi::PROVIDER_HOST => {
                    // The dispatcher let only the opener's address space in.
                    let mm = self.mm.as_ref().ok_or(EXDEV)?;
                    let pages = args.len / provider::PAGE_SIZE;
                    Some(MemlockCharge::new(self.locked_vm_user.as_ref(), mm, pages)?)
                }
                _ => None,
            };
            Ok((user, user_bytes, reservation, memlock))
        };
        let (pinned, (user, user_bytes, reservation, memlock)) = provider::pin(
            args.provider,
            args.addr,
            args.len,
            args.flags,
            &shared,
            reserve,
        )?;
        let page_size = pinned.page_size;
        let page_count = pinned.page_count;
        let reg = Registration {
            provider: args.provider,
            len: args.len,
            page_size,
            page_count,
            owner: pinned.owner,
            shared,
            pinned: pinned.pinned,
            counters: self.counters.clone(),
            _memlock: memlock,
            user,
        };
        // From here the registration's `Drop` gives the reservation back, through its share
        // of the pin limits unless a revocation did (which may have come already: then at once).
        reservation.commit(args.provider);
        let account = KBox::write(
            account_slot,
            PinCharge {
                len: args.len,
                counters: self.counters.clone(),
                _user: user_bytes,
            },
        );
        reg.shared.hold_account(account);
        let reg = Arc::new(reg, GFP_KERNEL_ACCOUNT)?;

        let mut next = self.next_index.lock();
        let index = *next;
        *next = next.checked_add(1).ok_or(EMFILE)?;
        let stored = self
            .regs
            .lock()
            .store(index as usize, reg, GFP_KERNEL_ACCOUNT);
        drop(next);
        // On failure the registration comes back in the error: drop it (it may sleep) only now,
        // with no lock held.
        if let Err(e) = stored {
            return Err(e.into());
        }

        args.handle = (u64::from(self.cookie) << 32) | u64::from(index);
        args.page_size = page_size.get();
        args.page_count = page_count;
        if let Err(e) = writer.write(&args) {
            // The caller cannot learn the handle: do not leave the memory pinned.
            let reg = self.regs.lock().remove(index as usize);
            drop(reg);
            return Err(e);
        }
        Ok(0)
    }

    /// The index of `handle` on this file: `EPERM` for another file's, `ENOENT` for one never
    /// made here.
    fn index_of(&self, handle: u64) -> Result<usize> {
        if (handle >> 32) as u32 != self.cookie {
            return Err(EPERM);
        }
        let index = handle as u32;
        if index == 0 || index >= *self.next_index.lock() {
            return Err(ENOENT);
        }
        Ok(index as usize)
    }

    /// The registration of `handle` (see [`Self::index_of`]; `ESTALE` once unregistered).
    fn lookup(&self, handle: u64) -> Result<Arc<Registration>> {
        let index = self.index_of(handle)?;
        let regs = self.regs.lock();
        let reg = regs.get(index).ok_or_else(error::stale_handle)?;
        Ok(reg.into())
    }

    /// `GDIRECT_IOC_UNREGISTER`.
    fn unregister(&self, user: UserSlice) -> Result<isize> {
        let args: UnregisterArgs = user.reader().read()?;
        if args.flags != 0 || args.pad != 0 {
            return Err(EINVAL);
        }
        let index = self.index_of(args.handle)?;
        let reg = self
            .regs
            .lock()
            .remove(index)
            .ok_or_else(error::stale_handle)?;
        // Unpinned here, or when the last operation using it ends.
        drop(reg);
        Ok(0)
    }

    /// `GDIRECT_IOC_QUERY`.
    fn query(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: QueryArgs = reader.read()?;
        if args.flags != 0 || args.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        // The registration's own errors come first: a revoked one says so, whatever the peer.
        // Holding a reference (not a use) while the peer's device lock is taken below blocks
        // nothing a revocation or a removal waits for.
        let reg = self.lookup(args.handle)?;
        reg.shared.check_revoked()?;
        let peer = peer_device(args.peer_domain, args.peer_bdf)?;
        require_kernel_driver(&peer)?;
        // Addresses (bus addresses, or physical ones where the IOMMU passes DMA through) are
        // for the administrator, as /proc/self/pagemap's are; anyone may ask for the map type.
        // SAFETY: `capable` only reads the current task's credentials.
        if args.max_entries != 0 && !unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as i32) } {
            return Err(EACCES);
        }
        // Copied out of the registration first: nothing that a revocation waits for is held
        // while the user's buffer is written (it may fault, or be served by userfaultfd).
        let (map_type, addrs) = reg.peer_addrs(&peer, args.first_page, args.max_entries)?;
        let out = UserSlice::new(
            UserPtr::from_addr(args.addrs as usize),
            addrs.len() * core::mem::size_of::<u64>(),
        );
        let mut out = out.writer();
        for a in addrs.iter() {
            out.write(a)?;
        }
        let entries = addrs.len() as u32;
        args.map_type = map_type;
        args.entries = entries;
        args.page_size = reg.page_size.get();
        args.page_count = reg.page_count;
        args.owner = reg.owner.as_ref().map_or(u64::MAX, |o| o.id());
        writer.write(&args)?;
        Ok(0)
    }
}

impl GdirectFile {
    /// `GDIRECT_IOC_READ` and `GDIRECT_IOC_WRITE`.
    fn transfer(&self, user: UserSlice, dir: Dir) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: IoArgs = reader.read()?;
        if args.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        let reg = self.lookup(args.handle)?;
        let t = Transfer::new(
            dir,
            reg,
            args.fd,
            args.buf_offset,
            args.file_offset,
            args.len,
            args.flags,
            None,
        )?;
        let outcome = t.run().1?;
        args.bytes = outcome.bytes;
        args.path = outcome.path;
        args.reason = outcome.reason;
        args.result_flags = if outcome.eof { uapi::RESULT_EOF } else { 0 };
        args.transport = outcome.transport;
        args.bounce_bytes = outcome.bounce_bytes;
        writer.write(&args)?;
        Ok(0)
    }

    /// The transfer an entry of a batch describes, to run as `submitter`.
    fn sqe_transfer(&self, sqe: &Sqe, submitter: &Arc<Submitter>) -> Result<Transfer> {
        if sqe.pad != 0 || sqe.reserved != 0 {
            return Err(EINVAL);
        }
        let dir = match sqe.op {
            uapi::OP_READ => Dir::Read,
            uapi::OP_WRITE => Dir::Write,
            _ => return Err(EINVAL),
        };
        let reg = self.lookup(sqe.handle)?;
        Transfer::new(
            dir,
            reg,
            sqe.fd,
            sqe.buf_offset,
            sqe.file_offset,
            sqe.len,
            sqe.flags,
            Some(submitter.clone()),
        )
    }

    /// `GDIRECT_IOC_SUBMIT`.
    fn submit(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: SubmitArgs = reader.read()?;
        if args.flags != 0 || args.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        if args.count == 0 || args.count > uapi::BATCH_MAX {
            return Err(EINVAL);
        }
        let size = args.count as usize * core::mem::size_of::<Sqe>();
        let mut sqes = UserSlice::new(UserPtr::from_addr(args.sqes as usize), size).reader();
        let max = crate::max_in_flight();
        // The batch runs on kernel workers, under this task's identity (see `submitter.rs`).
        let submitter = Arc::new(Submitter::current(), GFP_KERNEL_ACCOUNT)?;
        let mut submitted = 0;
        let mut failure = None;
        while submitted < args.count {
            // An entry that cannot be read fails like a malformed one: the caller learns how
            // many were queued before it (they run, and complete, either way).
            let entry = sqes.read::<Sqe>().and_then(|sqe| {
                let t = self.sqe_transfer(&sqe, &submitter)?;
                Ok((t, sqe.user_data))
            });
            let (t, user_data) = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            // The user's cap, like the file's, queues no more: `EDQUOT` only if none was. Any
            // other error (`ENOMEM`) fails the call at this entry, as a malformed one does.
            let charge = match t.charge_user() {
                Ok(charge) => charge,
                Err(e) => {
                    if submitted == 0 || e != error::over_user_transfer_limit() {
                        failure = Some(e);
                    }
                    break;
                }
            };
            match self.batches.submit(t, charge, user_data, max) {
                Ok(true) => submitted += 1,
                Ok(false) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        args.submitted = submitted;
        args.in_flight = self.batches.in_flight();
        writer.write(&args)?;
        match failure {
            Some(e) => Err(e),
            None if submitted == 0 => Err(EAGAIN),
            None => Ok(0),
        }
    }

    /// `GDIRECT_IOC_REAP`.
    fn reap(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let mut args: ReapArgs = reader.read()?;
        if args.flags & !uapi::REAP_WAIT != 0 || args.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        let size = args.max as usize * core::mem::size_of::<Cqe>();
        let mut out = UserSlice::new(UserPtr::from_addr(args.cqes as usize), size).writer();
        args.reaped = self
            .batches
            .reap(args.max, args.flags & uapi::REAP_WAIT != 0, |cqe| {
                out.write(cqe)
            })?;
        args.in_flight = self.batches.in_flight();
        writer.write(&args)?;
        Ok(0)
    }

    /// `GDIRECT_IOC_SET_EVENTFD`.
    fn set_eventfd(&self, user: UserSlice) -> Result<isize> {
        let args: EventfdArgs = user.reader().read()?;
        if args.flags != 0 {
            return Err(EINVAL);
        }
        self.batches.set_eventfd(args.fd)?;
        Ok(0)
    }
}

/// `GDIRECT_IOC_GET_STATS`.
fn get_stats(user: UserSlice) -> Result<isize> {
    let (mut reader, mut writer) = user.reader_writer();
    let args: StatsArgs = reader.read()?;
    if args.flags != 0 || args.pad != 0 {
        return Err(EINVAL);
    }
    writer.write(&stats_now())?;
    Ok(0)
}

/// `GDIRECT_IOC_GET_STATS_V1`: the counts of `GET_STATS` that its first struct has room for.
fn get_stats_v1(user: UserSlice) -> Result<isize> {
    let (mut reader, mut writer) = user.reader_writer();
    let args: StatsArgsV1 = reader.read()?;
    if args.flags != 0 || args.pad != 0 {
        return Err(EINVAL);
    }
    let now = stats_now();
    let mut out = StatsArgsV1 {
        io: now.io,
        ..Default::default()
    };
    for (o, n) in out.reasons.iter_mut().zip(now.reasons.iter()) {
        *o = *n;
    }
    writer.write(&out)?;
    Ok(0)
}

/// The module's counters now, as `GET_STATS` reports them.
fn stats_now() -> StatsArgs {
    let mut out = StatsArgs::default();
    for (p, row) in stats::IO.iter().enumerate() {
        for (d, c) in row.iter().enumerate() {
            out.io[p][d] = c.snapshot();
        }
    }
    for (o, c) in out.reasons.iter_mut().zip(stats::REASONS.iter()) {
        *o = c.load(Relaxed);
    }
    out
}

/// `GDIRECT_IOC_PEER_CHECK`.
fn peer_check(user: UserSlice) -> Result<isize> {
    let (mut reader, mut writer) = user.reader_writer();
    let mut args: uapi::PeerArgs = reader.read()?;
    if args.flags != 0 || args.reserved != 0 {
        return Err(EINVAL);
    }
    let provider = peer_device(args.provider_domain, args.provider_bdf)?;
    let client = peer_device(args.client_domain, args.client_bdf)?;
    let (map_type, distance) = topology::verdict(&provider, &client);
    args.map_type = region::uapi_map_type(map_type);
    args.distance = distance;
    writer.write(&args)?;
    Ok(0)
}

/// The PCI device `domain:bus:devfn`, with a reference; `ENODEV` if there is none.
fn peer_device(domain: u32, bdf: u32) -> Result<ARef<pci::Device>> {
    if bdf > 0xffff {
        return Err(ENODEV);
    }
    // SAFETY: a lookup; a non-NULL result carries a reference that the `ARef` takes over.
    let dev = unsafe { bindings::pci_get_domain_bus_and_slot(domain as i32, bdf >> 8, bdf & 0xff) };
    let dev = core::ptr::NonNull::new(dev).ok_or(ENODEV)?;
    // SAFETY: `pci::Device` is a transparent wrapper of `pci_dev`; we own the reference.
    Ok(unsafe { ARef::from_raw(dev.cast()) })
}

// `struct device` crosses as `void *` (see `topology.rs`).
unsafe extern "C" {
    /// `device_lock_interruptible()` and `device_unlock()` (inline in C; `shim.c`).
    fn gdirect_device_lock_interruptible(dev: *mut core::ffi::c_void) -> i32;
    fn gdirect_device_unlock(dev: *mut core::ffi::c_void);
}

/// Refuses (`EUNATCH`) a peer that no driver of this kernel drives: none is bound, or one that
/// hands the device's DMA to a userspace program is: a driver that manages DMA ownership itself
/// (`driver_managed_dma`: vfio-pci and its variants, pci-stub) or by name a VFIO or UIO one
/// (uio_pci_generic, out-of-tree igb_uio). Addresses of the caller's memory are made only for
/// a device whose DMA the kernel controls: a vfio-owned device lives in a userspace program's
/// IOMMU domain, and a device with no driver has no use for them. Checked when the QUERY is
/// made: a mapping made earlier stays until the registration ends, whatever the device is
/// bound to later. `ERESTARTSYS` when a signal interrupts the wait for the device's lock.
///
/// The device lock (which lockdep does not track) is held only for the check, never across a
/// registration's use or a user copy.
fn require_kernel_driver(peer: &pci::Device) -> Result {
    // SAFETY: `raw_pci` gives a valid `pci_dev`, whose `dev` is its `struct device`.
    let dev = unsafe { core::ptr::addr_of_mut!((*topology::raw_pci(peer)).dev) };
    // SAFETY: `dev` is a valid device, kept alive by the caller's reference.
    if unsafe { gdirect_device_lock_interruptible(dev.cast()) } != 0 {
        return Err(ERESTARTSYS);
    }
    // SAFETY: under the device lock the bound driver cannot change, and a bound driver (with
    // its name) stays registered while it is bound. A PCI device's driver is the `driver` of a
    // `pci_driver`.
    let driven = unsafe {
        let drv = (*dev).driver;
        !drv.is_null() && !(*drv).name.is_null() && {
            let pdrv = kernel::container_of!(drv, bindings::pci_driver, driver);
            let name = kernel::str::CStr::from_char_ptr((*drv).name).to_bytes();
            let has = |w: &[u8]| name.windows(w.len()).any(|x| x == w);
            !(*pdrv).driver_managed_dma && !has(b"vfio") && !has(b"uio") && name != b"pci-stub"
        }
    };
    // SAFETY: locked just above, by this thread.
    unsafe { gdirect_device_unlock(dev.cast()) };
    if driven {
        Ok(())
    } else {
        Err(error::peer_not_kernel_driven())
    }
}
