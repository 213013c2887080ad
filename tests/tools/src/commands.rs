// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Every command of the gdirect ABI, with its name (for the tools that send each one).

use gdirect::raw;

/// `(name, ioctl code)` of each command of `include/uapi/linux/gdirect.h`.
pub const ALL: [(&str, u32); 12] = [
    ("GET_INFO", raw::GDIRECT_IOC_GET_INFO),
    ("REGISTER", raw::GDIRECT_IOC_REGISTER),
    ("UNREGISTER", raw::GDIRECT_IOC_UNREGISTER),
    ("QUERY", raw::GDIRECT_IOC_QUERY),
    ("READ", raw::GDIRECT_IOC_READ),
    ("WRITE", raw::GDIRECT_IOC_WRITE),
    ("SUBMIT", raw::GDIRECT_IOC_SUBMIT),
    ("REAP", raw::GDIRECT_IOC_REAP),
    ("SET_EVENTFD", raw::GDIRECT_IOC_SET_EVENTFD),
    ("GET_STATS", raw::GDIRECT_IOC_GET_STATS),
    ("GET_STATS_V1", raw::GDIRECT_IOC_GET_STATS_V1),
    ("PEER_CHECK", raw::GDIRECT_IOC_PEER_CHECK),
];
