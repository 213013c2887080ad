// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect … | head -1`: the tool ends by `SIGPIPE` when its reader has gone, as any Unix
//! filter does, without a panic.

use std::{
    io::Read,
    os::unix::process::ExitStatusExt,
    process::{Command, Stdio},
};

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdirect"))
        // `check` prints its topology without the module, on any machine.
        .arg("check")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdirect starts");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr is piped")
        .read_to_string(&mut stderr)
        .expect("stderr reads");
    let status = child.wait().expect("gdirect ends");
    assert!(!stderr.contains("panicked"), "gdirect panicked: {stderr}");
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGPIPE as i32),
        "gdirect ended with {status:?}, not by SIGPIPE; stderr: {stderr}"
    );
}
