//! The fleet page's past windows: the daemon's snapshot directories (`--out`) listed
//! (`/api/snapshots`), their files served (`/snapshots/NAME/FILE`), each rendered again in
//! any format for the fleet, a process or a service (`/snapshots/NAME/window.EXT`, see
//! `windows`), and two of them compared (`/diff.svg?base=NAME&new=NAME`, see
//! `output::differential`).
//!
//! Only what the daemon writes is served: a NAME that is a snapshot's (`utc_name`), a FILE
//! of plain characters (letters, digits, `.`, `-`, `_`; not starting with `.`) that is a
//! regular file in it, at most [`MAX_FILE_BYTES`], all opened beneath the `--out` the daemon
//! holds open (`output::beneath`: no symlink followed, nothing outside it). At most
//! [`MAX_LISTED`] snapshots are listed, newest first. Blocking: callers run these off the
//! async workers.

use super::http::{filter_request, text, with_type};
use super::windows::{self, past};
use crate::output::beneath::{Beneath, Kind};
use crate::output::snapshot_dir::is_snapshot_name;
use crate::output::snapshot_load::plain_file_name;
use crate::output::{differential, profile_input};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use pyfleet_actors::PullFilter;
use serde::Serialize;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

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

/// The snapshots in `out`, newest first, each with its plain files, sorted.
pub fn list(out: &Beneath) -> Vec<SnapshotInfo> {
    let mut names: Vec<String> = out
        .entries()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, kind)| *kind == Kind::Directory)
        .filter_map(|(name, _)| name.to_str().map(str::to_string))
        .filter(|n| is_snapshot_name(n))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.truncate(MAX_LISTED);
    names
        .into_iter()
        .map(|name| {
            let mut files: Vec<String> = out
                .subdirectory(Path::new(&name))
                .and_then(|snapshot| snapshot.entries())
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, kind)| *kind == Kind::File)
                .filter_map(|(file, _)| file.to_str().map(str::to_string))
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
pub fn file(out: &Beneath, name: &str, file: &str) -> Result<(Vec<u8>, &'static str), NotServed> {
    if !is_snapshot_name(name) || !plain_file_name(file) {
        return Err(NotServed::NotFound);
    }
    let (f, meta) = out
        .open_regular(&Path::new(name).join(file))
        .map_err(|_| NotServed::NotFound)?;
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

/// The differential flamegraph from snapshot `base` to snapshot `new`, of `filter`'s
/// processes in each, by function (as `pyfleet diff` compares by default).
pub fn diff(out: &Beneath, base: &str, new: &str, filter: &PullFilter) -> Result<Vec<u8>, String> {
    let (b, n) = (
        past(out, base, filter, windows::View::All)?,
        past(out, new, filter, windows::View::All)?,
    );
    let (b_folded, n_folded) = (
        profile_input::from_snapshot(&b.snapshot)?.by_function(),
        profile_input::from_snapshot(&n.snapshot)?.by_function(),
    );
    let deltas = differential::folded_deltas(&b_folded, &n_folded)?;
    differential::svg(
        &format!("What changed in {}", b.ctx.title),
        &format!(
            "{base} ({} samples) to {new} ({} samples), by function; red grew, blue shrank",
            b_folded.total, n_folded.total
        ),
        &deltas,
    )
}

/// The answer to GET `path` (`/api/snapshots`, `/diff.svg`, `/snapshots/...`) with `query`,
/// of the snapshots in `out` (`None`: the daemon writes none). Reads on a blocking thread.
pub async fn respond(out: Option<Arc<Beneath>>, path: &str, query: &str) -> Response<Full<Bytes>> {
    // Reading and rendering a snapshot is a rendering: at most `RENDERINGS` at once.
    let Ok(permit) = super::routes::RENDERING.try_acquire() else {
        return super::routes::busy_rendering();
    };
    let (path, query) = (path.to_string(), query.to_string());
    let answer = tokio::task::spawn_blocking(move || {
        let a = answer(out.as_deref(), &path, &query);
        drop(permit);
        a
    })
    .await
    .unwrap_or_else(|e| Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())));
    match answer {
        Ok((body, kind)) => with_type(StatusCode::OK, body, kind),
        Err((status, why)) => text(status, format!("{why}\n")),
    }
}

type Answer = Result<(Vec<u8>, &'static str), (StatusCode, String)>;

fn answer(out: Option<&Beneath>, path: &str, query: &str) -> Answer {
    let not_found = |why: String| (StatusCode::NOT_FOUND, why);
    if path == "/api/snapshots" {
        let listed = out.map(list).unwrap_or_default();
        let body = serde_json::to_vec(&listed)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        return Ok((body, "application/json"));
    }
    let out = out.ok_or_else(|| not_found("this daemon writes no snapshots".into()))?;
    if path == "/diff.svg" {
        let bad = |why: String| (StatusCode::BAD_REQUEST, why);
        let (base, new) = diff_request(query).map_err(bad)?;
        let filter = filter_request(query).map_err(bad)?;
        let svg = diff(out, &base, &new, &filter).map_err(bad)?;
        return Ok((svg, "image/svg+xml"));
    }
    let (name, file) = path
        .strip_prefix("/snapshots/")
        .and_then(|p| p.split_once('/'))
        .filter(|(_, f)| !f.contains('/'))
        .ok_or_else(|| not_found("no such snapshot file".into()))?;
    if let Some(format) = windows::format_of(file) {
        // A window of the snapshot, in any format.
        let filter = filter_request(query).map_err(|why| (StatusCode::BAD_REQUEST, why))?;
        let view = windows::view_request(query).map_err(|why| (StatusCode::BAD_REQUEST, why))?;
        let mut window = past(out, name, &filter, view).map_err(not_found)?;
        window.ctx.title = format!("{}, {name}", window.ctx.title);
        let body = window
            .render(format)
            .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
        return Ok((body.to_vec(), windows::content_type(format)));
    }
    match self::file(out, name, file) {
        Ok(served) => Ok(served),
        Err(NotServed::TooLarge) => {
            Err((StatusCode::PAYLOAD_TOO_LARGE, "too large to serve".into()))
        }
        Err(NotServed::NotFound) => Err(not_found("no such snapshot file".into())),
    }
}

/// The two snapshot names of a `/diff.svg` query (`base`, `new`).
fn diff_request(query: &str) -> Result<(String, String), String> {
    let (mut base, mut new) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("base", v)) => base = Some(v.to_string()),
            Some(("new", v)) => new = Some(v.to_string()),
            _ => {}
        }
    }
    match (base, new) {
        (Some(b), Some(n)) => Ok((b, n)),
        _ => Err("diff.svg wants base=SNAPSHOT&new=SNAPSHOT (see /api/snapshots)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_snapshots_plain_files_are_listed_and_served() {
        let out = tempfile::tempdir().unwrap();
        // Two windows of one process: alpha's share from 30 to 70 samples in 100.
        let dir = crate::output::snapshot_dir::SnapshotDir::open(
            out.path(),
            pyfleet_policies::RetentionPolicy::default(),
            pyfleet_policies::FileMode::default(),
        )
        .unwrap()
        .with_formats(&[crate::output::format::Format::Folded]);
        let mut names = Vec::new();
        for (minute, alpha) in [(0u64, 30u64), (1, 70)] {
            use pyfleet_actors::{FrameInfo, ProcessProfile, Snapshot, SnapshotWriter};
            let at =
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + 60 * minute);
            let stack = |leaf: &str, line: i32| -> pyfleet_actors::Frames {
                vec![
                    FrameInfo::new(leaf, "a.py", Some(line)),
                    FrameInfo::new("main", "a.py", Some(1)),
                ]
                .into()
            };
            let snap = Snapshot {
                started_at: at,
                taken_at: at,
                processes: vec![ProcessProfile {
                    pid: 1,
                    name: "web".into(),
                    role: pyfleet_policies::Role::Single,
                    labels: Default::default(),
                    samples: vec![
                        (Default::default(), stack("alpha", 2), alpha),
                        (Default::default(), stack("beta", 3), 100 - alpha),
                    ],
                    sampled: std::time::Duration::ZERO,
                }],
            };
            let path = dir.write(&snap).unwrap();
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
        let (a, b) = (names[0].as_str(), names[1].as_str());
        std::fs::write(out.path().join(a).join(".hidden"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", out.path().join(a).join("passwd")).unwrap();
        std::fs::create_dir(out.path().join("not-a-snapshot")).unwrap();
        // A snapshot's name planted as a link to a directory elsewhere (a copy of a snapshot
        // there, and the files of /etc): neither listed, nor served, nor read back.
        let elsewhere = tempfile::tempdir().unwrap();
        let copy = elsewhere.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        for f in std::fs::read_dir(out.path().join(a)).unwrap().flatten() {
            std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
        }
        let (planted, planted_etc) = ("2031-01-01T00-00-00Z", "2031-01-01T00-00-01Z");
        std::os::unix::fs::symlink(&copy, out.path().join(planted)).unwrap();
        std::os::unix::fs::symlink("/etc", out.path().join(planted_etc)).unwrap();
        let held = Beneath::open(out.path()).unwrap();
        for name in [planted, planted_etc] {
            assert!(file(&held, name, "all.folded").is_err(), "{name}");
            assert!(file(&held, name, "passwd").is_err(), "{name}");
            assert!(
                past(&held, name, &PullFilter::default(), windows::View::All).is_err(),
                "{name}"
            );
            assert!(
                diff(&held, a, name, &PullFilter::default()).is_err(),
                "{name}"
            );
        }
        let listed = list(&held);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].name, b, "newest first");
        assert_eq!(
            listed[1].files,
            ["all.folded", "labels.json", "metadata.json", "web-1.folded"]
        );
        let (bytes, kind) = file(&held, a, "all.folded").unwrap();
        assert!(bytes.starts_with(b"web-1;") && kind.starts_with("text/plain"));
        for (name, f) in [
            (a, "passwd"),
            (a, ".hidden"),
            (a, "../../etc/passwd"),
            ("..", "all.folded"),
            ("not-a-snapshot", "x"),
            (a, "missing"),
        ] {
            assert_eq!(file(&held, name, f), Err(NotServed::NotFound), "{name}/{f}");
        }
        let everyone = PullFilter::default();
        let svg = String::from_utf8(diff(&held, a, b, &everyone).unwrap()).unwrap();
        assert!(svg.contains("+40.00%"), "alpha grew by 40 points");
        assert!(diff(&held, a, "../x", &everyone).is_err());
        let nobody = PullFilter {
            pid: Some(2),
            ..Default::default()
        };
        assert!(diff(&held, a, b, &nobody).is_err(), "no samples of pid 2");

        // The routes: a window of a snapshot in any format, for a process; the files; refusals.
        let get = |path: &str, query: &str| answer(Some(&held), path, query);
        let (folded, kind) = get(&format!("/snapshots/{a}/window.folded"), "pid=1").unwrap();
        // A past window's seconds are its own: a `seconds` asked for is not a mistake.
        assert!(get(&format!("/snapshots/{a}/window.svg"), "seconds=5&pid=1").is_ok());
        assert_eq!(kind, "text/plain; charset=utf-8");
        assert!(String::from_utf8(folded)
            .unwrap()
            .contains("alpha (a.py:2) 30"));
        // Its views: by entry, and none by thread status (folded stacks keep none).
        assert!(get(&format!("/snapshots/{a}/window.folded"), "view=entry").is_ok());
        let (pprof, _) = get(&format!("/snapshots/{a}/window.pb.gz"), "").unwrap();
        assert!(pprof.starts_with(&[0x1f, 0x8b]), "gzip");
        let (svg, _) = get("/diff.svg", &format!("base={a}&new={b}&pid=1")).unwrap();
        assert!(String::from_utf8(svg).unwrap().contains("+40.00%"));
        assert!(get("/api/snapshots", "").is_ok());
        for (path, query, status) in [
            (
                format!("/snapshots/{a}/window.exe"),
                "",
                StatusCode::NOT_FOUND,
            ),
            (
                format!("/snapshots/{a}/window.svg"),
                "pid=x",
                StatusCode::BAD_REQUEST,
            ),
            (
                format!("/snapshots/{a}/../b/all.folded"),
                "",
                StatusCode::NOT_FOUND,
            ),
            (
                "/snapshots/not-a-snapshot/window.svg".into(),
                "",
                StatusCode::NOT_FOUND,
            ),
            ("/diff.svg".into(), "base=x", StatusCode::BAD_REQUEST),
            (
                format!("/snapshots/{a}/window.svg"),
                "view=gil",
                StatusCode::NOT_FOUND,
            ),
            (
                format!("/snapshots/{a}/window.svg"),
                "view=wall",
                StatusCode::BAD_REQUEST,
            ),
        ] {
            let refused = get(&path, query).map(|_| ()).unwrap_err();
            assert_eq!(refused.0, status, "{path}?{query}");
        }
        let none = answer(None, &format!("/snapshots/{a}/all.folded"), "");
        assert_eq!(none.map(|_| ()).unwrap_err().0, StatusCode::NOT_FOUND);
    }
}
