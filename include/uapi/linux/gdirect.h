/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR MIT */
/*
 * gdirect: GPU-direct storage. The ioctl ABI of /dev/gdirect.
 *
 * This header is the single source of truth for both sides: the kernel module
 * mirrors it with compile-time size and offset checks (kernel/uapi.rs), and the
 * userspace library generates its bindings from it with bindgen.
 *
 * Rules every command follows:
 *  - One struct gdirect_<verb>_args per command, fields grouped as in / out.
 *    Only __u32 and __u64 fields; explicit padding; size a multiple of 8.
 *    Addresses and lengths are __u64.
 *  - The command number encodes the struct size (_IOC_SIZE). A command whose
 *    type and number are known but whose size or direction differs from this
 *    header is rejected with EINVAL, which leaves room to grow a struct later
 *    and to accept both sizes then.
 *  - `flags` and every `reserved`/`pad` field are inputs that must be zero;
 *    a set bit the module does not know gives EINVAL. Output-only fields are
 *    ignored on input.
 *  - Handles are per open file; closing the file releases what it holds.
 *  - New behaviour is a new command (or a new flag bit), never a change of the
 *    meaning of an existing field. GDIRECT_ABI_VERSION changes only when an
 *    existing command changes incompatibly.
 *
 * Errors common to every command (errno values, returned as -1/errno):
 *  ENOTTY   the command is not a gdirect command (wrong type or unknown number).
 *  EINVAL   known command with a wrong size or direction, unknown flag bits,
 *           or a nonzero reserved/pad field.
 *  EFAULT   the argument pointer is not readable/writable user memory.
 *
 * open(2) of the device fails with ENODEV while the module is being unloaded.
 * Every open file holds a reference on the module: rmmod fails with EBUSY
 * (EAGAIN from delete_module(2)) until the last one is closed.
 */
#ifndef _UAPI_LINUX_GDIRECT_H
#define _UAPI_LINUX_GDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* The character device, a misc device created with mode 0660. */
#define GDIRECT_DEVICE_PATH "/dev/gdirect"

/* Version of this ABI. Userspace refuses to talk to a module with another one. */
#define GDIRECT_ABI_VERSION 1

/* The ioctl type byte. 0xD6 is unused in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define GDIRECT_IOC_MAGIC 0xD6

/*
 * Providers: where registered device memory comes from. GET_INFO reports the
 * set of providers the running module can use now as a bit mask of
 * (1 << GDIRECT_PROVIDER_*). A provider whose backing driver is absent is not
 * reported.
 */
enum gdirect_provider {
	/* Ordinary user memory, pinned. */
	GDIRECT_PROVIDER_HOST = 0,
	/* NVIDIA GPU memory through the nv-p2p kernel interface (nvidia.ko). */
	GDIRECT_PROVIDER_NVIDIA = 1,
	/* Memory already registered with PCI P2PDMA, through a user mapping. */
	GDIRECT_PROVIDER_P2PDMA = 2,
	GDIRECT_PROVIDER_COUNT = 3,
};

/*
 * GDIRECT_IOC_GET_INFO: what the module is and what it can do.
 *
 * The first command a library issues: it checks abi_version before anything
 * else. Its number and its first fields will not change.
 *
 * Errors: only the common ones.
 */
struct gdirect_info_args {
	/* in */
	__u32 flags; /* must be 0 */
	__u32 pad; /* must be 0 */
	/* out */
	__u32 abi_version; /* GDIRECT_ABI_VERSION of the module */
	__u32 providers; /* mask of (1 << GDIRECT_PROVIDER_*) available now */
	__u32 version_major; /* module version, major.minor.patch */
	__u32 version_minor;
	__u32 version_patch;
	__u32 open_files; /* files currently open on /dev/gdirect, this one included */
	/* in, must be 0: room for later outputs */
	__u64 reserved[4];
};

#define GDIRECT_IOC_GET_INFO _IOWR(GDIRECT_IOC_MAGIC, 0x00, struct gdirect_info_args)

#endif /* _UAPI_LINUX_GDIRECT_H */
