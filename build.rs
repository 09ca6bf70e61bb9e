//! Puts the kernel capture's BPF program into every build, with no compiler needed.
//!
//! `bpf/capture.bpf.o` is kept in the repository beside its source `bpf/capture.bpf.c`, built
//! reproducibly by `scripts/build-bpf.sh`, and `bpf/capture.bpf.o.built-from` names the source
//! it was built from (FNV-1a 64 of its bytes). When that is this source, the kept object is
//! what the binary embeds (copied to `OUT_DIR/capture.bpf.o`): no clang is looked for, so
//! `cargo build`, `cargo install` and the image all get the program CI checked (CI rebuilds
//! it from source with `scripts/build-bpf.sh --check` and fails when the two differ).
//!
//! When the source changed since (a developer's edit), the object is built from source by
//! `scripts/build-bpf.sh --out` with clang (`PYFLEET_CLANG`, else the first clang on PATH)
//! and a warning says to commit it; a clang that fails, or none at all, fails the build with
//! its reason.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "bpf/capture.bpf.c";
const OBJECT: &str = "bpf/capture.bpf.o";
const BUILT_FROM: &str = "bpf/capture.bpf.o.built-from";
const SCRIPT: &str = "scripts/build-bpf.sh";

fn main() {
    for input in [SOURCE, OBJECT, BUILT_FROM, SCRIPT] {
        println!("cargo::rerun-if-changed={input}");
    }
    println!("cargo::rerun-if-env-changed=PYFLEET_CLANG");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let embedded = out_dir.join("capture.bpf.o");
    let source = read(Path::new(SOURCE));
    let want = format!("source-fnv1a64 {:016x}", fnv1a64(&source));
    let built_from = String::from_utf8_lossy(&read(Path::new(BUILT_FROM))).into_owned();
    if built_from.lines().any(|l| l.trim() == want) {
        if let Err(e) = std::fs::copy(OBJECT, &embedded) {
            fail(&format!("cannot copy {OBJECT}: {e}"));
        }
        return;
    }
    let status = Command::new("bash")
        .arg(SCRIPT)
        .arg("--out")
        .arg(&embedded)
        .status();
    match status {
        Ok(s) if s.success() => println!(
            "cargo::warning={SOURCE} changed since {OBJECT} was built: built from source; \
             run {SCRIPT} and commit {OBJECT} and {BUILT_FROM}"
        ),
        Ok(_) => fail(&format!(
            "{SOURCE} changed since {OBJECT} was built, and {SCRIPT} could not build it \
             (its error is above)"
        )),
        Err(e) => fail(&format!("cannot run {SCRIPT} with bash: {e}")),
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())))
}

fn fail(why: &str) -> ! {
    eprintln!("pyfleet build: {why}");
    std::process::exit(1);
}

/// FNV-1a 64 over bytes (what `scripts/build-bpf.sh` writes to the built-from file).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
