//! Snapshots on disk: `<out>/<UTC time the window ended>/` holding `metadata.json` (the
//! window's start and end, mode, rate, pyfleet's version, samples per process),
//! `labels.json` (each process's labels: service, container, pod; see
//! `discovery::labels`) and, for the
//! formats chosen (`--snapshot-format`, default folded and svg): `<root>.folded` per process
//! with samples (`<root>` is [`folded::process_root`]: `<process>-<pid>`, or with the role
//! for a master and its workers) and the fleet-wide `all.folded` (each stack rooted at
//! `<root>`) for folded, `flamegraph.svg` for svg, `profile.speedscope.json` (one
//! profile per process) for speedscope and `profile.pb.gz` (the process as a label) for pprof.
//! No file is empty: a folded file with no stack is not written (`metadata.json` says the
//! window had no samples).
//!
//! Owns the directory layout, atomicity and retention. `out` is opened once and must be
//! private (see `beneath`): every file is written, listed, renamed and deleted beneath that
//! descriptor, never through a link. A snapshot is built in a hidden `.partial-<name>`
//! directory (every file written and fsynced), then renamed into place, so a reader never
//! sees half a snapshot. Retention deletes only directories whose names this module made.
//! File names come from sanitised process names (policies' `naming`), never straight from a
//! target.

use super::beneath::{Beneath, Kind};
use super::folded;
use super::format::{self, Format, RenderContext};
use super::views::TaskFrames;
use super::FileMode;
use pyfleet_actors::{Snapshot, SnapshotWriter};
use pyfleet_policies::{Mode, RetentionPolicy, SnapshotEntry};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const PARTIAL: &str = ".partial-";

/// Writes snapshots under one output directory.
#[derive(Debug)]
pub struct SnapshotDir {
    out: PathBuf,
    /// `out`, held open: everything is done beneath it.
    dir: Arc<Beneath>,
    retention: RetentionPolicy,
    formats: Vec<Format>,
    mode: Mode,
    /// The rate asked for (the rate controller may have lowered it for a while).
    rate_hz: Option<f64>,
    /// How asyncio tasks show (`--group-by task`).
    tasks: TaskFrames,
    /// The bits of every file and directory written.
    file_mode: FileMode,
    /// Frames folded by function (`--function`: see `views::by_function`).
    by_function: bool,
}

/// The file in each snapshot that describes it.
pub const METADATA_FILE: &str = "metadata.json";
pub const LABELS_FILE: &str = "labels.json";

/// The formats of a snapshot unless told otherwise.
pub const DEFAULT_FORMATS: [Format; 2] = [Format::Folded, Format::Svg];

/// The fleet-wide file of a format in a snapshot directory.
pub fn fleet_file_name(format: Format) -> &'static str {
    match format {
        Format::Folded => "all.folded",
        Format::Svg => "flamegraph.svg",
        Format::Speedscope => "profile.speedscope.json",
        Format::Pprof => "profile.pb.gz",
    }
}

impl SnapshotDir {
    /// Creates `out` if needed (only `out` itself, private: a missing parent is a mistake, not
    /// a directory tree to make), opens it (following no link another user could have
    /// planted), requires it to be private (pyfleet's user's, writable by nobody else) and
    /// checks that snapshots can be written there (a probe file is written and removed), so an
    /// unusable directory fails at startup, not an hour later. Files and directories are
    /// created with `file_mode`'s bits (`out` too when it is created here).
    pub fn open(
        out: &Path,
        retention: RetentionPolicy,
        file_mode: FileMode,
    ) -> Result<Self, String> {
        Self::open_for(out, retention, file_mode, None)
    }

    /// [`SnapshotDir::open`] for a daemon that becomes `owner` once started (`--user`): `out`
    /// must be theirs, and is made theirs when created here; whether it can be written is
    /// checked as them, after the change ([`SnapshotDir::ready_to_write`]).
    pub fn open_for(
        out: &Path,
        retention: RetentionPolicy,
        file_mode: FileMode,
        owner: Option<crate::output::Owner>,
    ) -> Result<Self, String> {
        let fail = |what: &str, e: String| format!("unusable --out {}: {what}{e}", out.display());
        let existed = Beneath::open(out).is_ok();
        let dir = Beneath::open_or_create(out, file_mode).map_err(|e| fail("", e.to_string()))?;
        if let (Some(owner), false) = (owner, existed) {
            dir.give_to(owner).map_err(|e| fail("", e.to_string()))?;
        }
        let me = owner.map_or_else(|| nix::unistd::geteuid().as_raw(), |o| o.uid);
        dir.require_private_to(me).map_err(|e| fail("", e))?;
        let opened = SnapshotDir {
            out: out.to_path_buf(),
            dir: Arc::new(dir),
            retention,
            formats: DEFAULT_FORMATS.to_vec(),
            mode: Mode::default(),
            rate_hz: None,
            tasks: TaskFrames::default(),
            file_mode,
            by_function: false,
        };
        // For another user, checked once pyfleet is that user (`ready_to_write`).
        if owner.is_none() {
            opened.ready_to_write()?;
        }
        Ok(opened)
    }

    /// Checks that snapshots can be written here as pyfleet's user now (a probe file written
    /// and removed), and removes what a run that died mid-write left.
    pub fn ready_to_write(&self) -> Result<(), String> {
        let probe = PathBuf::from(format!("{PARTIAL}probe-{}", std::process::id()));
        self.dir.create_new(&probe, self.file_mode).map_err(|e| {
            format!(
                "unusable --out {}: cannot write in it: {e}",
                self.out.display()
            )
        })?;
        let _ = self.dir.remove_all(&probe);
        for (name, _) in self.dir.entries().unwrap_or_default() {
            if name.to_string_lossy().starts_with(PARTIAL) {
                let _ = self.dir.remove_all(Path::new(&name));
            }
        }
        Ok(())
    }

    /// The mode and rate the samples are taken with, for the outputs and `metadata.json`.
    pub fn with_sampling(mut self, mode: Mode, rate_hz: f64) -> Self {
        self.mode = mode;
        self.rate_hz = Some(rate_hz);
        self
    }

    /// Shows asyncio tasks as `tasks` says (`--group-by task`) in what it writes.
    pub fn showing_tasks(mut self, tasks: TaskFrames) -> Self {
        self.tasks = tasks;
        self
    }

    /// Folds frames by function, without line numbers (`--function`), in what it writes.
    pub fn by_function(mut self, on: bool) -> Self {
        self.by_function = on;
        self
    }

    /// Writes these formats (in this order, duplicates once) instead of the default ones.
    pub fn with_formats(mut self, formats: &[Format]) -> Self {
        let mut chosen: Vec<Format> = Vec::new();
        for f in formats {
            if !chosen.contains(f) {
                chosen.push(*f);
            }
        }
        if !chosen.is_empty() {
            self.formats = chosen;
        }
        self
    }

    pub fn formats(&self) -> &[Format] {
        &self.formats
    }

    pub fn out(&self) -> &Path {
        &self.out
    }

    /// `out`, held open (the listener serves the snapshots beneath it).
    pub fn directory(&self) -> Arc<Beneath> {
        self.dir.clone()
    }

    /// Names of the snapshots present, oldest first, with their sizes.
    pub fn list(&self) -> Vec<SnapshotEntry> {
        let mut found: Vec<SnapshotEntry> = self
            .dir
            .entries()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, kind)| {
                let name = name.to_str()?.to_string();
                if !is_snapshot_name(&name) || kind != Kind::Directory {
                    return None;
                }
                let snapshot = self.dir.subdirectory(Path::new(&name)).ok()?;
                let bytes = snapshot
                    .entries()
                    .unwrap_or_default()
                    .iter()
                    .map(|(file, _)| snapshot.file_len(Path::new(file)))
                    .sum();
                Some(SnapshotEntry { name, bytes })
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    }

    fn write_files(&self, dir: &Beneath, snap: &Snapshot, title: &str) -> std::io::Result<()> {
        let window = snap.taken_at.duration_since(snap.started_at).ok();
        let ctx = RenderContext {
            title: title.to_string(),
            rate_hz: self.rate_hz,
            asked_hz: None,
            mode: self.mode,
            duration: window,
            tasks: self.tasks,
            icicle: false,
        }
        .for_snapshot(snap);
        let mode = self.file_mode;
        write_synced(dir, METADATA_FILE, &self.metadata(snap, &ctx), mode)?;
        write_synced(dir, LABELS_FILE, &labels_json(snap), mode)?;
        for &f in &self.formats {
            if f == Format::Folded {
                for p in snap.processes.iter().filter(|p| p.total() > 0) {
                    let lines = folded::process_lines(p, None);
                    write_synced(
                        dir,
                        &format!("{}.folded", folded::process_root(p)),
                        folded::render(&lines).as_bytes(),
                        mode,
                    )?;
                }
            }
            let data = format::render(f, snap, &ctx).map_err(std::io::Error::other)?;
            if !data.is_empty() {
                write_synced(dir, fleet_file_name(f), &data, mode)?;
            }
        }
        Ok(())
    }

    /// `metadata.json`: what the window is (start and end, UTC, RFC 3339), how it was sampled
    /// and by which pyfleet, and the counted samples of each process seen in it.
    fn metadata(&self, snap: &Snapshot, ctx: &RenderContext) -> Vec<u8> {
        let processes: Vec<serde_json::Value> = snap
            .processes
            .iter()
            .map(|p| {
                serde_json::json!({
                    "pid": p.pid,
                    "name": folded::process_root(p),
                    "role": p.role.as_str(),
                    "samples": p.total(),
                    "sampled_seconds": p.sampled.as_secs_f64(),
                })
            })
            .collect();
        let samples: u64 = snap.processes.iter().map(|p| p.total()).sum();
        let doc = serde_json::json!({
            "pyfleet_version": env!("CARGO_PKG_VERSION"),
            "window_start": rfc3339(snap.started_at),
            "window_end": rfc3339(snap.taken_at),
            "window_seconds": ctx.duration.map(|d| d.as_secs_f64()),
            "mode": self.mode.as_str(),
            // What the samples were taken at (counts over the time they stand for), and what
            // was asked when that differs (the CPU budget lowered it).
            "rate_hz": ctx.rate_hz,
            "rate_hz_asked": ctx.asked_hz.or(self.rate_hz),
            "samples": samples,
            "formats": self.formats.iter().map(|f| f.name()).collect::<Vec<_>>(),
            "processes": processes,
        });
        let mut out = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// `labels.json`: `{"processes": [{"pid", "name", "role", "labels": {key: value}}]}`, one entry
/// per process of the window.
fn labels_json(snap: &Snapshot) -> Vec<u8> {
    let processes: Vec<serde_json::Value> = snap
        .processes
        .iter()
        .map(|p| {
            let labels: serde_json::Map<String, serde_json::Value> = p
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
                .collect();
            serde_json::json!({
                "pid": p.pid,
                "name": folded::process_root(p),
                "role": p.role.as_str(),
                "labels": labels,
            })
        })
        .collect();
    let mut out = serde_json::to_vec_pretty(&serde_json::json!({ "processes": processes }))
        .unwrap_or_default();
    out.push(b'\n');
    out
}

impl SnapshotWriter for SnapshotDir {
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String> {
        let folded;
        let snap = match self.by_function {
            true => {
                folded = super::views::by_function(snap);
                &folded
            }
            false => snap,
        };
        let base = utc_name(snap.taken_at);
        // Two snapshots in one second (the final one right after a periodic one) get a suffix.
        let mut name = base.clone();
        let mut n = 1;
        while self.dir.kind(Path::new(&name)).is_some() {
            name = format!("{base}-{n}");
            n += 1;
        }
        let partial = format!("{PARTIAL}{name}");
        let fin = self.out.join(&name);
        let title = format!("pyfleet {name}");
        let r = (|| {
            // Whatever is there (a stale partial snapshot) goes first, never followed.
            if self.dir.kind(Path::new(&partial)).is_some() {
                self.dir.remove_all(Path::new(&partial))?;
            }
            self.dir.create_dir(Path::new(&partial), self.file_mode)?;
            let built = self.dir.subdirectory(Path::new(&partial))?;
            self.write_files(&built, snap, &title)?;
            built.sync()?;
            self.dir.rename(OsStr::new(&partial), OsStr::new(&name))?;
            self.dir.sync()
        })();
        match r {
            Ok(()) => Ok(fin),
            Err(e) => {
                let _ = self.dir.remove_all(Path::new(&partial));
                Err(format!("writing snapshot {} failed: {e}", fin.display()))
            }
        }
    }

    fn apply_retention(&self) {
        let found = self.list();
        for i in self.retention.to_delete(&found) {
            if let Some(e) = found.get(i) {
                if let Err(err) = self.dir.remove_all(Path::new(&e.name)) {
                    tracing::warn!(
                        "retention: cannot delete {}: {err}",
                        self.out.join(&e.name).display()
                    );
                }
            }
        }
    }
}

/// Writes `data` to the new file `name` of a partial snapshot and fsyncs it. No temporary
/// name: the partial directory is pyfleet's own and hidden until it is renamed into place
/// (after its own fsync), so a file there needs neither a rename nor a directory fsync of
/// its own.
fn write_synced(dir: &Beneath, name: &str, data: &[u8], mode: FileMode) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = dir.create_new(Path::new(name), mode)?;
    f.write_all(data)?;
    f.sync_all()
}

/// `2026-11-23T02-55-07Z`: UTC, sortable, no colons (awkward in file names).
pub fn utc_name(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// `2026-11-23T02:55:07.250Z`: UTC, RFC 3339, milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (the well-known era-based conversion).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A snapshot directory's name: `utc_name`, and `-N` when two windows ended in one second.
pub fn is_snapshot_name(name: &str) -> bool {
    let b = name.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let stamp = b.len() >= 20
        && digits(0..4)
        && at(4, b'-')
        && digits(5..7)
        && at(7, b'-')
        && digits(8..10)
        && at(10, b'T')
        && digits(11..13)
        && at(13, b'-')
        && digits(14..16)
        && at(16, b'-')
        && digits(17..19)
        && at(19, b'Z');
    stamp && (b.len() == 20 || (at(20, b'-') && b.len() > 21 && digits(21..b.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::{FrameInfo, ProcessProfile, ThreadStatus};
    use std::fs;
    use std::time::Duration;

    #[test]
    fn utc_names() {
        assert_eq!(utc_name(UNIX_EPOCH), "1970-01-01T00-00-00Z");
        // 2024-02-29T23:59:59Z (a leap day).
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(utc_name(t), "2024-02-29T23-59-59Z");
        let t = UNIX_EPOCH + Duration::from_secs(4_102_444_800); // 2100-01-01
        assert_eq!(utc_name(t), "2100-01-01T00-00-00Z");
        assert!(is_snapshot_name("2024-02-29T23-59-59Z"));
        assert!(is_snapshot_name("2024-02-29T23-59-59Z-3"));
        assert!(!is_snapshot_name("2024-02-29T23-59-59Z-"));
        assert!(!is_snapshot_name("..2024-02-29T23-59-59Z"));
        assert!(!is_snapshot_name("notes"));
    }

    fn snap(at: u64, name: &str) -> Snapshot {
        Snapshot {
            started_at: UNIX_EPOCH + Duration::from_secs(at.saturating_sub(60)),
            taken_at: UNIX_EPOCH + Duration::from_secs(at),
            processes: vec![ProcessProfile {
                pid: 42,
                name: name.into(),
                role: pyfleet_policies::Role::Single,
                labels: {
                    let mut l = pyfleet_actors::Labels::default();
                    l.set("service", "checkout".into());
                    l.set("namespace", "prod".into());
                    l
                },
                samples: vec![(
                    ThreadStatus::default(),
                    vec![FrameInfo {
                        function: "handle".into(),
                        file: "/srv/app.py".into(),
                        line: Some(7),
                    }]
                    .into(),
                    5,
                )],
                sampled: std::time::Duration::ZERO,
            }],
        }
    }

    #[test]
    fn writes_atomically_and_keeps_the_last_n() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("snaps");
        let dir = SnapshotDir::open(
            &out,
            RetentionPolicy::new(2, None).unwrap(),
            FileMode::default(),
        )
        .unwrap();
        fs::write(out.join("notes.txt"), "mine").unwrap();
        let mut written = Vec::new();
        for i in 0..4 {
            let p = dir.write(&snap(1_700_000_000 + i, "web")).unwrap();
            dir.apply_retention();
            written.push(p);
        }
        // Same second twice: a suffix, not an overwrite.
        let again = dir.write(&snap(1_700_000_003, "web")).unwrap();
        assert!(
            again.to_string_lossy().ends_with("Z-1"),
            "{}",
            again.display()
        );
        dir.apply_retention();
        let left: Vec<String> = dir.list().into_iter().map(|e| e.name).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(
            out.join("notes.txt").exists(),
            "retention touched a file it did not make"
        );
        let last = &written[3];
        let folded = fs::read_to_string(last.join("web-42.folded")).unwrap();
        assert_eq!(folded, "handle (/srv/app.py:7) 5\n");
        let all = fs::read_to_string(last.join("all.folded")).unwrap();
        assert_eq!(all, "web-42;handle (/srv/app.py:7) 5\n");
        assert!(fs::read_to_string(last.join("flamegraph.svg"))
            .unwrap()
            .contains("handle"));
        // Nothing half-written is left around.
        assert!(fs::read_dir(&out)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(PARTIAL)));
    }

    #[test]
    fn writes_the_chosen_formats_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SnapshotDir::open(tmp.path(), RetentionPolicy::default(), FileMode::default())
            .unwrap()
            .with_formats(&[Format::Pprof, Format::Speedscope, Format::Pprof]);
        assert_eq!(dir.formats(), &[Format::Pprof, Format::Speedscope]);
        let p = dir.write(&snap(1_700_000_000, "web")).unwrap();
        let mut names: Vec<String> = fs::read_dir(&p)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                "labels.json",
                "metadata.json",
                "profile.pb.gz",
                "profile.speedscope.json"
            ]
        );
        let profile =
            super::super::pprof::decode(&fs::read(p.join("profile.pb.gz")).unwrap()).unwrap();
        assert_eq!(profile.sample.len(), 1);
        assert_eq!(profile.sample[0].value, vec![5]);
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(p.join("profile.speedscope.json")).unwrap()).unwrap();
        assert_eq!(json["profiles"][0]["name"], "web-42");
        let labels: serde_json::Value =
            serde_json::from_slice(&fs::read(p.join(LABELS_FILE)).unwrap()).unwrap();
        let first = &labels["processes"][0];
        assert_eq!(first["pid"], 42);
        assert_eq!(first["labels"]["service"], "checkout");
        assert_eq!(first["labels"]["namespace"], "prod");
    }

    #[test]
    fn unusable_out_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        fs::write(&file, "x").unwrap();
        let missing = tmp.path().join("no/such");
        for (bad, why) in [
            (file.join("sub"), "is a file, not a directory"),
            (file.clone(), "is a file, not a directory"),
            (missing.clone(), "does not exist"),
        ] {
            let e = SnapshotDir::open(&bad, RetentionPolicy::default(), FileMode::default())
                .unwrap_err();
            assert!(e.starts_with("unusable --out"), "{e}");
            assert!(e.contains(why), "{e}");
            assert_eq!(e.lines().count(), 1);
        }
        assert!(
            !tmp.path().join("no").exists(),
            "only the last component is created"
        );
        let last = tmp.path().join("new");
        assert!(SnapshotDir::open(&last, RetentionPolicy::default(), FileMode::default()).is_ok());
        assert!(last.is_dir());
    }

    #[test]
    fn metadata_says_what_the_window_is_and_no_file_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SnapshotDir::open(tmp.path(), RetentionPolicy::default(), FileMode::default())
            .unwrap()
            .with_sampling(Mode::Cpu, 100.0);
        let mut s = snap(1_700_000_060, "web");
        // A process seen in the window without a counted sample (idle, in cpu mode).
        s.processes.push(ProcessProfile {
            pid: 43,
            name: "web".into(),
            role: pyfleet_policies::Role::Single,
            labels: Default::default(),
            samples: vec![],
            sampled: std::time::Duration::ZERO,
        });
        let p = dir.write(&s).unwrap();
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(p.join(METADATA_FILE)).unwrap()).unwrap();
        assert_eq!(meta["window_start"], "2023-11-14T22:13:20.000Z");
        assert_eq!(meta["window_end"], "2023-11-14T22:14:20.000Z");
        assert_eq!(meta["window_seconds"], 60.0);
        assert_eq!(meta["mode"], "cpu");
        assert_eq!(meta["rate_hz"], 100.0);
        assert_eq!(meta["samples"], 5);
        assert_eq!(meta["processes"][1]["samples"], 0);
        assert_eq!(meta["processes"][0]["role"], "single");
        assert_eq!(meta["pyfleet_version"], env!("CARGO_PKG_VERSION"));
        assert!(p.join("web-42.folded").exists());
        assert!(
            !p.join("web-43.folded").exists(),
            "a process without samples"
        );
        let svg = fs::read_to_string(p.join("flamegraph.svg")).unwrap();
        assert!(
            svg.contains("cpu mode") && svg.contains("100 Hz"),
            "the subtitle"
        );
        // A window with nothing: metadata and an SVG that says so, no empty file.
        let empty = Snapshot {
            processes: vec![],
            ..snap(1_700_000_120, "web")
        };
        let p = dir.write(&empty).unwrap();
        for e in fs::read_dir(&p).unwrap().flatten() {
            assert!(
                e.metadata().unwrap().len() > 0,
                "{:?} is empty",
                e.file_name()
            );
        }
        assert!(!p.join("all.folded").exists());
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(p.join(METADATA_FILE)).unwrap()).unwrap();
        assert_eq!(meta["samples"], 0);
    }
}
