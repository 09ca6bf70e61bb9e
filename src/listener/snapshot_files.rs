//! The fleet page's past windows: the daemon's snapshot directories (`--out`) listed
//! (`/api/snapshots`), their files served (`/snapshots/NAME/FILE`), and two of them compared
//! (`/diff.svg?base=NAME&new=NAME`, see `output::differential`).
//!
//! Only what the daemon writes is served: a NAME that is a snapshot's (`utc_name`), a FILE
//! of plain characters (letters, digits, `.`, `-`, `_`; not starting with `.`) that is a
//! regular file in it, opened without following a symlink, at most [`MAX_FILE_BYTES`]. At
//! most [`MAX_LISTED`] snapshots are listed, newest first. Blocking: callers run these off the
//! async workers.

use crate::output::snapshot_dir::is_snapshot_name;
use crate::output::{differential, profile_input};
use serde::Serialize;
use std::io::Read;
use std::path::Path;

/// Most snapshots listed.
pub const MAX_LISTED: usize = 500;
/// Largest file served.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// One snapshot: its name and files.
#[derive(Debug, Serialize, PartialEq)]
pub struct SnapshotInfo {
    pub name: String,
    pub files: Vec<String>,
}

fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The snapshots in `out`, newest first, each with its plain files, sorted.
pub fn list(out: &Path) -> Vec<SnapshotInfo> {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| is_snapshot_name(n))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.truncate(MAX_LISTED);
    names
        .into_iter()
        .map(|name| {
            let mut files: Vec<String> = std::fs::read_dir(out.join(&name))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|f| plain_file_name(f))
                .collect();
            files.sort();
            SnapshotInfo { name, files }
        })
        .collect()
}

/// Why a file is not served.
#[derive(Debug, PartialEq)]
pub enum NotServed {
    /// Not a snapshot's name, not a plain file name, or not there.
    NotFound,
    TooLarge,
}

/// File `file` of snapshot `name` in `out`, and its content type.
pub fn file(out: &Path, name: &str, file: &str) -> Result<(Vec<u8>, &'static str), NotServed> {
    use std::os::unix::fs::OpenOptionsExt;
    if !is_snapshot_name(name) || !plain_file_name(file) {
        return Err(NotServed::NotFound);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(out.join(name).join(file))
        .map_err(|_| NotServed::NotFound)?;
    let meta = f.metadata().map_err(|_| NotServed::NotFound)?;
    if !meta.is_file() {
        return Err(NotServed::NotFound);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(NotServed::TooLarge);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|_| NotServed::NotFound)?;
    let kind = match file.rsplit('.').next() {
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("gz") => "application/gzip",
        _ => "text/plain; charset=utf-8",
    };
    Ok((bytes, kind))
}

/// The differential flamegraph from snapshot `base` to snapshot `new`.
pub fn diff(out: &Path, base: &str, new: &str) -> Result<Vec<u8>, String> {
    for name in [base, new] {
        if !is_snapshot_name(name) {
            return Err("base and new must name snapshots (see /api/snapshots)".into());
        }
    }
    let b = profile_input::read(&out.join(base)).map_err(|_| format!("{base}: no profile"))?;
    let n = profile_input::read(&out.join(new)).map_err(|_| format!("{new}: no profile"))?;
    let deltas = differential::folded_deltas(&b, &n)?;
    differential::svg(
        "pyfleet: what changed",
        &format!(
            "{base} ({} samples) to {new} ({} samples); red grew, blue shrank",
            b.total, n.total
        ),
        &deltas,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_snapshots_plain_files_are_listed_and_served() {
        let out = tempfile::tempdir().unwrap();
        let a = "2026-11-28T10-00-00Z";
        let b = "2026-11-28T10-01-00Z";
        for (name, alpha) in [(a, 30), (b, 70)] {
            let d = out.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(
                d.join("all.folded"),
                format!("web-1;main (a.py:1);alpha (a.py:2) {alpha}\nweb-1;main (a.py:1);beta (a.py:3) {}\n", 100 - alpha),
            )
            .unwrap();
        }
        std::fs::write(out.path().join(a).join(".hidden"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", out.path().join(a).join("passwd")).unwrap();
        std::fs::create_dir(out.path().join("not-a-snapshot")).unwrap();
        let listed = list(out.path());
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].name, b, "newest first");
        assert_eq!(listed[1].files, ["all.folded"]);
        let (bytes, kind) = file(out.path(), a, "all.folded").unwrap();
        assert!(bytes.starts_with(b"web-1;") && kind.starts_with("text/plain"));
        for (name, f) in [
            (a, "passwd"),
            (a, ".hidden"),
            (a, "../../etc/passwd"),
            ("..", "all.folded"),
            ("not-a-snapshot", "x"),
            (a, "missing"),
        ] {
            assert_eq!(
                file(out.path(), name, f),
                Err(NotServed::NotFound),
                "{name}/{f}"
            );
        }
        let svg = String::from_utf8(diff(out.path(), a, b).unwrap()).unwrap();
        assert!(svg.contains("+40.00%"), "alpha grew by 40 points");
        assert!(diff(out.path(), a, "../x").is_err());
    }
}
