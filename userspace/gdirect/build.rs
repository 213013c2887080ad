// SPDX-License-Identifier: GPL-2.0 OR MIT
//! Generates the `sys` bindings from `include/uapi/linux/gdirect.h` with bindgen, and the table
//! that checks the kernel module's hand-written mirror of that header (`kernel/uapi.rs`) against
//! them (`abi` tests). One header, no drift.

use std::{
    collections::BTreeMap,
    env,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let header = root.join("include/uapi/linux/gdirect.h");
    let egpu_header = root.join("tests/egpu/gdirect_egpu.h");
    let mirror = root.join("kernel/uapi.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed={}", egpu_header.display());
    println!("cargo:rerun-if-changed={}", mirror.display());

    // The rig's emulated GPU: its allocations are device memory the library knows.
    let egpu = bindgen::Builder::default()
        .header(egpu_header.to_string_lossy())
        .allowlist_type("egpu_.*")
        .allowlist_var("EGPU_.*")
        .clang_macro_fallback()
        .clang_macro_fallback_build_dir(&out)
        .derive_default(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {}: {e}", egpu_header.display()))
        .to_string();
    fs::write(out.join("egpu.rs"), egpu).expect("write egpu bindings");

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("gdirect_.*")
        .allowlist_var("GDIRECT_.*")
        // `_IOWR(...)` is a function-like macro bindgen cannot expand by itself: let clang
        // evaluate the command codes, so they come from the header too.
        .clang_macro_fallback()
        .clang_macro_fallback_build_dir(&out)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_eq(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen failed on {}: {e} (is libclang installed? scripts/setup installs it)",
                header.display()
            )
        })
        .to_string();
    fs::write(out.join("uapi.rs"), &bindings).expect("write bindings");

    let checks = mirror_checks(
        &bindings,
        &fs::read_to_string(&mirror).expect("read kernel/uapi.rs"),
        &mirror,
    );
    fs::write(out.join("abi_mirror_checks.rs"), checks).expect("write mirror checks");
}

/// A struct declared in the kernel mirror: C name, size, fields with offsets.
struct MirrorStruct {
    cname: String,
    size: u64,
    fields: Vec<(String, u64)>,
}

/// Parses the `uapi_struct!` declarations and the `pub(crate) const` items of `kernel/uapi.rs`.
fn parse_mirror(
    text: &str,
    path: &Path,
) -> (BTreeMap<String, MirrorStruct>, BTreeMap<String, String>) {
    let mut structs = BTreeMap::new();
    let mut consts = BTreeMap::new();
    let mut current: Option<(String, MirrorStruct)> = None;
    let mut in_invocation = false;
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        let bad = || -> ! {
            panic!(
                "{}:{}: cannot parse mirror line: {line}",
                path.display(),
                no + 1
            )
        };
        if line == "uapi_struct! {" {
            in_invocation = true;
        } else if let Some(rest) = line
            .strip_prefix("pub(crate) struct ")
            .filter(|_| in_invocation)
        {
            in_invocation = false;
            // `Name: c_name, size N {`
            let (name, rest) = rest.split_once(':').unwrap_or_else(|| bad());
            let (cname, rest) = rest.split_once(", size ").unwrap_or_else(|| bad());
            let size = rest
                .trim_end_matches('{')
                .trim()
                .parse()
                .unwrap_or_else(|_| bad());
            let s = MirrorStruct {
                cname: cname.trim().to_string(),
                size,
                fields: Vec::new(),
            };
            current = Some((name.trim().to_string(), s));
        } else if let Some((_, s)) = current.as_mut() {
            if line == "}" {
                let (name, s) = current.take().unwrap_or_else(|| bad());
                structs.insert(name, s);
            } else if !line.starts_with("///") && !line.is_empty() {
                // `field @ offset: type,`
                let (field, rest) = line.split_once('@').unwrap_or_else(|| bad());
                let (off, _) = rest.split_once(':').unwrap_or_else(|| bad());
                let off = off.trim().parse().unwrap_or_else(|_| bad());
                s.fields.push((field.trim().to_string(), off));
            }
        } else if let Some(rest) = line.strip_prefix("pub(crate) const ") {
            // `NAME: u32 = expr;`
            let (name, rest) = rest.split_once(':').unwrap_or_else(|| bad());
            let (_, expr) = rest.split_once('=').unwrap_or_else(|| bad());
            consts.insert(
                name.trim().to_string(),
                expr.trim().trim_end_matches(';').to_string(),
            );
        }
    }
    (structs, consts)
}

/// The fields of every `pub struct gdirect_*` in the bindgen output.
fn parse_bindgen_structs(bindings: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in bindings.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("pub struct gdirect_") {
            let name = format!("gdirect_{}", rest.trim_end_matches('{').trim());
            current = Some((name, Vec::new()));
        } else if let Some((_, fields)) = current.as_mut() {
            if line == "}" {
                if let Some((name, fields)) = current.take() {
                    out.insert(name, fields);
                }
            } else if let Some(rest) = line.strip_prefix("pub ") {
                if let Some((field, _)) = rest.split_once(':') {
                    fields.push(field.trim().to_string());
                }
            }
        }
    }
    out
}

/// The value of an integer literal as the mirror writes it (`1`, `0xD6`, `0x00`).
fn literal(s: &str) -> Option<u64> {
    let s = s.trim().replace('_', "");
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Generates `MIRROR_CHECKS: &[(what, mirror value, header value)]`; header values are evaluated
/// by the compiler on the bindgen types and constants.
fn mirror_checks(bindings: &str, mirror_text: &str, path: &Path) -> String {
    let (structs, consts) = parse_mirror(mirror_text, path);
    let header_structs = parse_bindgen_structs(bindings);
    const MISSING: u64 = u64::MAX;
    let mut out = String::from(
        "/// Generated by build.rs from kernel/uapi.rs: (what, kernel mirror, header).\n",
    );
    out.push_str("pub(crate) const MISSING: u64 = u64::MAX;\n");
    out.push_str("pub(crate) const MIRROR_CHECKS: &[(&str, u64, u64)] = &[\n");
    let by_cname: BTreeMap<&str, &MirrorStruct> =
        structs.values().map(|s| (s.cname.as_str(), s)).collect();

    // Every header struct has a mirror with the same fields at the same offsets, and vice versa.
    for (cname, fields) in &header_structs {
        let Some(m) = by_cname.get(cname.as_str()) else {
            let _ = writeln!(
                out,
                "    (\"struct {cname} has a kernel mirror\", {MISSING}, 0),"
            );
            continue;
        };
        let _ = writeln!(
            out,
            "    (\"size_of struct {cname}\", {}, core::mem::size_of::<{cname}>() as u64),",
            m.size
        );
        for field in fields {
            let mirror_off = m
                .fields
                .iter()
                .find(|(f, _)| f == field)
                .map_or(MISSING, |(_, o)| *o);
            let _ = writeln!(out, "    (\"offset_of {cname}.{field}\", {mirror_off}, core::mem::offset_of!({cname}, {field}) as u64),");
        }
        for (field, _) in &m.fields {
            if !fields.contains(field) {
                let _ = writeln!(out, "    (\"{cname}.{field} of the kernel mirror exists in the header\", 0, {MISSING}),");
            }
        }
    }
    for m in by_cname.values() {
        if !header_structs.contains_key(&m.cname) {
            let _ = writeln!(
                out,
                "    (\"mirror struct {} exists in the header\", 0, {MISSING}),",
                m.cname
            );
        }
    }

    // Constants: plain literals, and ioctl codes rebuilt from the mirror's direction, struct and number.
    let magic = consts
        .get("IOC_MAGIC")
        .and_then(|v| literal(v))
        .unwrap_or(MISSING);
    for (name, expr) in &consts {
        let header = format!("GDIRECT_{name}");
        let mirror = if let Some(v) = literal(expr) {
            v
        } else if let Some((dir, rest)) = expr.split_once("::<") {
            // `_IOWR::<InfoArgs>(IOC_MAGIC, 0x00)`
            let (sname, rest) = rest
                .split_once(">(")
                .unwrap_or_else(|| panic!("cannot parse ioctl {name}"));
            let nr = rest
                .split(',')
                .nth(1)
                .and_then(|n| literal(n.trim_end_matches(')')))
                .unwrap_or(MISSING);
            let size = structs.get(sname).map_or(MISSING, |s| s.size);
            let dir_bits: u64 = match dir {
                "_IOR" => 2,
                "_IOW" => 1,
                "_IOWR" => 3,
                _ => panic!("unknown ioctl direction in {name}: {dir}"),
            };
            (dir_bits << 30) | (size << 16) | (magic << 8) | nr
        } else {
            panic!(
                "{}: cannot evaluate mirror constant {name} = {expr}",
                path.display()
            );
        };
        let _ = writeln!(out, "    (\"{header}\", {mirror}, {header} as u64),");
    }
    out.push_str("];\n");
    out
}
