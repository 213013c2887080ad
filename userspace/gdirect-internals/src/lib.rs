// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The `gdirect` command's and the test rig's own parts, kept out of the published library
//! (`gdirect`): the model behind `gdirect check` ([`topology`], [`nvmeof`]), the checksums reads
//! are verified with ([`checksum`]), and the rig's emulated GPU ([`egpu`], whose handle frees
//! any of the rig's allocations by address: a test tool's power, not an application's).
//! Not published.

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod checksum;
pub mod egpu;
pub mod nvmeof;
pub mod pipe;
mod sys;
mod sysfs;
pub mod topology;
