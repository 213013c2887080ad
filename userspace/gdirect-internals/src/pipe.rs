// SPDX-License-Identifier: GPL-2.0 OR MIT
//! A command-line tool's end on a closed pipe.
//!
//! Rust programs start with `SIGPIPE` ignored, so a write to a pipe whose reader has gone
//! (`gdirect check | grep -q …`, `gdirect info | head -1`) fails with `EPIPE` and `println!`
//! panics on it: a panic message and exit status 101 where every Unix filter just ends.

use nix::sys::signal::{signal, SigHandler, Signal};

/// Restores the default action of `SIGPIPE`: a write to a closed pipe ends the process by the
/// signal, quietly, as it ends `cat` or `grep`. Call it first thing in `main`, before any thread
/// starts. An error (none is possible for this signal and handler) is ignored: the tool then
/// behaves as before.
pub fn end_on_closed_pipe() {
    // SAFETY: `SIG_DFL` installs no handler, so no code of ours runs in signal context; the
    // disposition is process-wide, and the callers set it at the start of `main`, before they
    // start threads or open pipes to children that could rely on `SIGPIPE` being ignored.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}
