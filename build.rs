//! Builds the kernel capture program (`bpf/capture.bpf.c`) with clang, when clang is there.
//!
//! With it, the binary can sample with `--capture kernel` (cfg `pyfleet_capture`); without it
//! the build succeeds and that option says which clang was missing. `PYFLEET_CLANG` names the
//! compiler; else the first of `clang`, `clang-20` ... `clang-14` found on PATH.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/capture.bpf.c";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pyfleet_capture)");
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=PYFLEET_CLANG");
    println!("cargo::rerun-if-env-changed=PATH");
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let object = out_dir.join("capture.bpf.o");
    let candidates: Vec<String> = match std::env::var("PYFLEET_CLANG") {
        Ok(c) => vec![c],
        Err(_) => std::iter::once("clang".to_string())
            .chain((14..=20).rev().map(|v| format!("clang-{v}")))
            .collect(),
    };
    for clang in &candidates {
        let status = Command::new(clang)
            .args([
                "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c", SOURCE, "-o",
            ])
            .arg(&object)
            .status();
        match status {
            Ok(s) if s.success() => {
                println!("cargo::rustc-cfg=pyfleet_capture");
                return;
            }
            Ok(s) => panic!("{clang} failed to build {SOURCE} ({s})"),
            Err(_) => continue,
        }
    }
    println!(
        "cargo::warning=no clang found ({}): built without the kernel capture (--capture kernel)",
        candidates.join(", ")
    );
}
