// SPDX-License-Identifier: GPL-2.0

// Copyright (C) 2026 The gdirect authors.

//! Per-open-file state of `/dev/gdirect` and the ioctl dispatcher.
//!
//! There is one [`GdirectFile`] for each open file of the device; it is created by `open()` and
//! dropped by the last `close()`. Everything a file registers belongs to it and is released with
//! it.
//!
//! The dispatcher checks the ioctl type, then the command number, then that the size and
//! direction encoded in the command are exactly the ones of `include/uapi/linux/gdirect.h`, and
//! only then touches user memory.

use kernel::{
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
    prelude::*,
    sync::atomic::{
        Atomic,
        Relaxed, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
};

use crate::uapi::{
    self,
    InfoArgs, //
};

/// Number of open files of the device, for `GET_INFO`.
static OPEN_FILES: Atomic<u32> = Atomic::new(0);

/// The state of one open file of `/dev/gdirect`.
pub(crate) struct GdirectFile {
    _private: (),
}

/// The commands of the ABI, by `_IOC_NR`.
#[derive(Clone, Copy)]
enum Command {
    GetInfo,
}

impl Command {
    /// Looks a command up by its number; `ENOTTY` for numbers the ABI does not define.
    fn from_nr(nr: u32) -> Result<Self> {
        match nr {
            0x00 => Ok(Self::GetInfo),
            _ => Err(ENOTTY),
        }
    }

    /// The full command code, with the direction and size of this module's ABI.
    fn code(self) -> u32 {
        match self {
            Self::GetInfo => uapi::IOC_GET_INFO,
        }
    }
}

#[vtable]
impl MiscDevice for GdirectFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        let file = KBox::new(Self { _private: () }, GFP_KERNEL)?;
        OPEN_FILES.add(1, Relaxed);
        Ok(file)
    }

    fn ioctl(me: &GdirectFile, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        if _IOC_TYPE(cmd) != uapi::IOC_MAGIC {
            return Err(ENOTTY);
        }
        let command = Command::from_nr(_IOC_NR(cmd))?;
        // A known command with another size or direction: an older or newer struct layout.
        if cmd != command.code() {
            return Err(EINVAL);
        }
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match command {
            Command::GetInfo => me.get_info(user),
        }
    }
}

impl Drop for GdirectFile {
    fn drop(&mut self) {
        OPEN_FILES.fetch_sub(1, Relaxed);
    }
}

impl GdirectFile {
    /// `GDIRECT_IOC_GET_INFO`.
    fn get_info(&self, user: UserSlice) -> Result<isize> {
        let (mut reader, mut writer) = user.reader_writer();
        let args: InfoArgs = reader.read()?;
        if args.flags != 0 || args.pad != 0 || args.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        let (major, minor, patch) = crate::VERSION;
        let out = InfoArgs {
            abi_version: uapi::ABI_VERSION,
            // No provider is implemented yet: report none rather than claim one.
            providers: 0,
            version_major: major,
            version_minor: minor,
            version_patch: patch,
            open_files: OPEN_FILES.load(Relaxed),
            ..InfoArgs::default()
        };
        writer.write(&out)?;
        Ok(0)
    }
}
