// SPDX-License-Identifier: GPL-2.0 OR MIT
//! `gdirect`: the command-line face of the gdirect library.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use gdirect::{Driver, Error, Info, Provider};
use serde::Serialize;

/// GPU-direct storage: read file data straight into GPU memory.
#[derive(Parser)]
#[command(name = "gdirect", version, about, long_about = None)]
struct Cli {
    /// The gdirect device node.
    #[arg(long, global = true, env = "GDIRECT_DEVICE", default_value = gdirect::DEFAULT_DEVICE_PATH)]
    device: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the loaded module's version, ABI and the memory providers it can use now.
    ///
    /// Exit status: 0 when the module answered, 1 when it is not loaded or cannot be used.
    Info {
        /// Print one JSON object instead of text (schema: see README).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Info { json } => info(&cli.device, json),
    }
}

#[derive(Serialize)]
struct VersionJson {
    version: String,
    abi_version: u32,
}

#[derive(Serialize)]
struct InfoJson {
    device: String,
    module: VersionJson,
    library: VersionJson,
    /// Every provider the ABI defines, with whether the module can use it now.
    providers: serde_json::Map<String, serde_json::Value>,
    open_files: u32,
}

#[derive(Serialize)]
struct ErrorJson {
    device: String,
    error: ErrorDetail,
}

#[derive(Serialize)]
struct ErrorDetail {
    kind: &'static str,
    message: String,
    errno: Option<String>,
}

fn error_kind(err: &Error) -> &'static str {
    match err {
        Error::ModuleNotLoaded { .. } => "module_not_loaded",
        Error::PermissionDenied { .. } => "permission_denied",
        Error::NotGdirect { .. } => "not_gdirect",
        Error::VersionMismatch { .. } => "version_mismatch",
        Error::Open { .. } => "open",
        Error::Ioctl { .. } => "ioctl",
        _ => "other",
    }
}

fn info(device: &PathBuf, json: bool) -> ExitCode {
    let result = Driver::open_path(device).and_then(|driver| driver.info());
    match (result, json) {
        (Ok(info), false) => {
            print_info(device, &info);
            ExitCode::SUCCESS
        }
        (Ok(info), true) => {
            let providers = Provider::ALL
                .into_iter()
                .map(|p| {
                    (
                        p.name().to_string(),
                        serde_json::Value::Bool(info.has_provider(p)),
                    )
                })
                .collect();
            let out = InfoJson {
                device: device.display().to_string(),
                module: VersionJson {
                    version: info.version.to_string(),
                    abi_version: info.abi_version,
                },
                library: VersionJson {
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    abi_version: gdirect::ABI_VERSION,
                },
                providers,
                open_files: info.open_files,
            };
            print_json(&out);
            ExitCode::SUCCESS
        }
        (Err(err), false) => {
            eprintln!("gdirect: {err}");
            ExitCode::FAILURE
        }
        (Err(err), true) => {
            let out = ErrorJson {
                device: device.display().to_string(),
                error: ErrorDetail {
                    kind: error_kind(&err),
                    message: err.to_string(),
                    errno: err.errno().map(|e| format!("{e:?}")),
                },
            };
            print_json(&out);
            eprintln!("gdirect: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_json(value: &impl Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("gdirect: cannot encode JSON: {e}"),
    }
}

fn print_info(device: &std::path::Path, info: &Info) {
    println!(
        "module     gdirect {} (ABI {}) at {}",
        info.version,
        info.abi_version,
        device.display()
    );
    println!(
        "library    gdirect {} (ABI {})",
        env!("CARGO_PKG_VERSION"),
        gdirect::ABI_VERSION
    );
    let available: Vec<&str> = info.providers().map(Provider::name).collect();
    let missing: Vec<&str> = Provider::ALL
        .into_iter()
        .filter(|p| !info.has_provider(*p))
        .map(Provider::name)
        .collect();
    if available.is_empty() {
        println!(
            "providers  none available (not available: {})",
            missing.join(", ")
        );
    } else if missing.is_empty() {
        println!("providers  {}", available.join(", "));
    } else {
        println!(
            "providers  {} (not available: {})",
            available.join(", "),
            missing.join(", ")
        );
    }
    println!("open files {}", info.open_files);
}
