//! The interpreters 3.11-3.15 the tests run against, and the target scripts.

use super::*;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Interp {
    pub label: String,
    /// 11..=15
    pub minor: u32,
    pub path: PathBuf,
}

pub(super) fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| OsString::from("/root")))
}

/// `${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}`
pub fn pythons_dir() -> PathBuf {
    match std::env::var_os("PYFLEET_PYTHONS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => home().join(".cache/pyfleet/pythons"),
    }
}

/// The newest `~/.pyenv/versions/3.<minor>.<micro>/bin/python3.<minor>` (plain releases only:
/// `3.13.0` yes, `3.13.0t` or `3.13-dev` no).
fn newest_pyenv(minor: u32) -> Option<PathBuf> {
    let versions = home().join(".pyenv/versions");
    let prefix = format!("3.{minor}.");
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in fs::read_dir(&versions).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(micro) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Ok(micro) = micro.parse::<u32>() else {
            continue;
        };
        let exe = entry.path().join(format!("bin/python3.{minor}"));
        if exe.is_file() && best.as_ref().is_none_or(|(m, _)| micro > *m) {
            best = Some((micro, exe));
        }
    }
    best.map(|(_, p)| p)
}

/// Every supported interpreter, in order: found, or what is missing.
fn lookup_interpreters() -> Vec<Result<Interp, Missing>> {
    let pythons = pythons_dir();
    let pyenv = |minor: u32| {
        (
            newest_pyenv(minor),
            format!("~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"),
            format!("`pyenv install 3.{minor}`"),
        )
    };
    let unstable = |minor: u32| {
        let path = pythons.join(format!("3.{minor}/usr/bin/python3.{minor}"));
        let wanted = path.display().to_string();
        (Some(path), wanted, SETUP_PYTHONS.to_string())
    };
    let candidates = vec![
        (
            "3.11-debian",
            11,
            (
                Some(PathBuf::from("/usr/bin/python3.11")),
                "/usr/bin/python3.11".to_string(),
                "Debian's python3.11 package".to_string(),
            ),
        ),
        ("3.11-pyenv", 11, pyenv(11)),
        ("3.12-pyenv", 12, pyenv(12)),
        ("3.13-pyenv", 13, pyenv(13)),
        ("3.14", 14, unstable(14)),
        ("3.15", 15, unstable(15)),
    ];
    candidates
        .into_iter()
        .map(|(label, minor, (path, wanted, setup))| match path {
            Some(p) if p.is_file() => Ok(Interp {
                label: label.to_string(),
                minor,
                path: p,
            }),
            _ => Err(Missing {
                what: format!("Python {label} ({wanted})"),
                setup,
                part: Some(label.to_string()),
            }),
        })
        .collect()
}

/// The interpreters every exactness test runs against. A missing one fails the test, naming
/// it and what provides it, unless `PYFLEET_ALLOW_MISSING=1`: then the test leaves it out
/// (see `skip_or_fail`).
#[track_caller]
pub fn interpreters() -> Vec<Interp> {
    let (found, missing): (Vec<_>, Vec<_>) =
        lookup_interpreters().into_iter().partition(Result::is_ok);
    skip_or_fail(
        &missing
            .into_iter()
            .filter_map(Result::err)
            .collect::<Vec<_>>(),
    );
    found.into_iter().filter_map(Result::ok).collect()
}

/// Some supported interpreter, for tests that need just one Python (does not require the
/// others to be provisioned).
pub fn any_interpreter() -> Interp {
    let path = newest_pyenv(12).expect("no ~/.pyenv/versions/3.12.*/bin/python3.12");
    Interp {
        label: "3.12-pyenv".to_string(),
        minor: 12,
        path,
    }
}

/// One interpreter by label; None only when it is missing and PYFLEET_ALLOW_MISSING=1 (the
/// test leaves out what needs it; see `skip_or_fail`).
#[track_caller]
pub fn interpreter(label: &str) -> Option<Interp> {
    match lookup_interpreters()
        .into_iter()
        .find(|i| match i {
            Ok(interp) => interp.label == label,
            Err(missing) => missing.part.as_deref() == Some(label),
        })
        .unwrap_or_else(|| panic!("no interpreter is labelled {label}"))
    {
        Ok(interp) => Some(interp),
        Err(missing) => {
            skip_or_fail(&[missing]);
            None
        }
    }
}

/// pyenv's newest python3.10 (not supported by pyfleet; used for the unsupported-version test).
pub fn python310() -> Option<PathBuf> {
    newest_pyenv(10)
}

/// Like `python310()`; None (the test returns) only when it is missing and
/// PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn require_python310() -> Option<PathBuf> {
    let found = python310();
    if found.is_none() {
        skip_or_fail(&[Missing {
            what: "Python 3.10-pyenv (~/.pyenv/versions/3.10.*/bin/python3.10)".to_string(),
            setup: "`pyenv install 3.10`".to_string(),
            part: None,
        }]);
    }
    found
}

pub fn targets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/targets")
}

pub fn target_script(name: &str) -> PathBuf {
    let p = targets_dir().join(name);
    assert!(p.is_file(), "target script {} does not exist", p.display());
    p
}
