//! What the tests need from outside the repository (setup scripts, tools, venvs), and the
//! one place a missing one fails a test or, with PYFLEET_ALLOW_MISSING=1, skips it.

use super::*;
use std::io::Write;
use std::path::PathBuf;
use std::thread;

/// The scripts that provide what the tests need (scripts/test.sh runs every one).
pub const SETUP_PYTHONS: &str = "scripts/setup-pythons.sh";
pub const SETUP_VENVS: &str = "scripts/setup-venvs.sh";
pub const SETUP_LIBS: &str = "scripts/setup-libs.sh";
pub const SETUP_DEPLOY_TOOLS: &str = "scripts/setup-deploy-tools.sh";
pub const SETUP_FORMAT_TOOLS: &str = "scripts/setup-format-tools.sh";

/// Where scripts/setup-format-tools.sh keeps what it fetches (`PYFLEET_FORMAT_TOOLS`).
pub fn format_tools_dir() -> PathBuf {
    match std::env::var_os("PYFLEET_FORMAT_TOOLS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => home().join(".cache/pyfleet/format-tools"),
    }
}

/// Something a test needs from outside the repository that is not there.
#[derive(Debug)]
pub struct Missing {
    /// A program, a venv, a file or an interpreter (with where it was looked for).
    pub what: String,
    /// What provides it: one of the setup scripts (`SETUP_*`), or what to install.
    pub setup: String,
    /// What the test leaves out without it: None, the whole test; else that part of it (an
    /// interpreter's runs, say).
    pub part: Option<String>,
}

fn allow_missing() -> bool {
    std::env::var("PYFLEET_ALLOW_MISSING").is_ok_and(|v| v == "1")
}

/// The test running on this thread (libtest names each test's thread after the test).
fn this_test() -> String {
    match thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => "this test".to_string(),
    }
}

/// The one place where a test meets something missing (interpreters, tools, venvs, files).
/// Without PYFLEET_ALLOW_MISSING=1, as in CI (scripts/test.sh does not set it), the test fails
/// here, with one line naming what is missing and what provides it. With it, one line on stderr
/// per missing thing (also when the harness captures the test's output) says what the test skips, and the caller skips it: returns from the test,
/// or leaves out the part (`Missing::part`).
#[track_caller]
pub fn skip_or_fail(missing: &[Missing]) {
    if missing.is_empty() {
        return;
    }
    if !allow_missing() {
        let each: Vec<String> = missing
            .iter()
            .map(|m| format!("{} missing: {} installs it", m.what, m.setup))
            .collect();
        panic!(
            "{} (PYFLEET_ALLOW_MISSING=1 skips what needs it)",
            each.join("; ")
        );
    }
    let test = this_test();
    for m in missing {
        let part = m
            .part
            .as_ref()
            .map(|p| format!(" on {p}"))
            .unwrap_or_default();
        let line = format!(
            "PYFLEET_ALLOW_MISSING=1: skipping {test}{part}: {} missing ({} installs it)\n",
            m.what, m.setup
        );
        // Straight to stderr in one write, not through `eprintln!`, which the test harness
        // captures (and shows only for a test that fails): a skip must be seen.
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// A program on PATH that `setup` installs; None (the test returns) only when it is missing
/// and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn tool(name: &str, setup: &str) -> Option<PathBuf> {
    let found = on_path(name);
    if found.is_none() {
        skip_or_fail(&[Missing {
            what: name.to_string(),
            setup: setup.to_string(),
            part: None,
        }]);
    }
    found
}

/// A file that `setup` makes (a venv's program, a schema), described as `what`; None (the test
/// returns) only when it is missing and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn provided(what: &str, path: PathBuf, setup: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    skip_or_fail(&[Missing {
        what: format!("{what} ({})", path.display()),
        setup: setup.to_string(),
        part: None,
    }]);
    None
}

/// `${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}`: the venvs the setup scripts make.
pub fn venvs_dir() -> PathBuf {
    match std::env::var_os("PYFLEET_VENVS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => home().join(".cache/pyfleet/venvs"),
    }
}
