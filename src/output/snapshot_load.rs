//! A snapshot directory (see `snapshot_dir`) read back as a [`Snapshot`] and the context it
//! was rendered with, so that a past window can be shown for one process or service and
//! rendered again in any format (the fleet page's past windows, `diff`'s snapshot inputs).
//!
//! The processes are `labels.json`'s (pid, root name, role, labels); each one's stacks come
//! from its own `<root>.folded` when the snapshot was written in folded, else from
//! `profile.pb.gz` (by pid). A snapshot written in neither (svg or speedscope alone) cannot be
//! read back: an error says so. The mode, rate and window come from `metadata.json`.
//!
//! Folded stacks carry no thread status, so stacks read from them have the default one; a
//! frame's label is split back into function, file and line at its last ` (` and last `:`.
//! The directory is pyfleet's but its files are read as untrusted: every read is bounded
//! ([`profile_input::MAX_INPUT_BYTES`](super::profile_input::MAX_INPUT_BYTES)), a process's
//! file name must be a plain one in the directory, and symlinks are not followed.

use super::beneath::Beneath;
use super::format::{Format, RenderContext};
use super::pprof;
use super::profile_input::{from_folded, read_bounded};
use super::snapshot_dir::{fleet_file_name, LABELS_FILE, METADATA_FILE};
use pyfleet_actors::{FrameInfo, Labels, ProcessProfile, Snapshot, ThreadStatus, LABEL_KEYS};
use pyfleet_policies::{Mode, Role};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// A snapshot read back.
#[derive(Debug)]
pub struct Loaded {
    pub snapshot: Snapshot,
    /// Its mode, rate and window as `metadata.json` says (the title is the directory's name).
    pub ctx: RenderContext,
    /// Its samples carry their threads' status (read from pprof; folded stacks keep none).
    pub statuses: bool,
}

/// Reads snapshot directory `dir` back (held open: its files are read beneath it, never
/// through a link).
pub fn load(dir: &Beneath) -> Result<Loaded, String> {
    let shown = dir.path().display();
    let name = dir
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let read_file = |file: &str| read_file(dir, file);
    if !dir.is_file(Path::new(LABELS_FILE)) {
        return Err(format!(
            "{shown}: not a snapshot directory (it holds no {LABELS_FILE})"
        ));
    }
    let labels: serde_json::Value = serde_json::from_slice(&read_file(LABELS_FILE)?)
        .map_err(|e| format!("{shown}/{LABELS_FILE}: {e}"))?;
    let metadata: serde_json::Value = serde_json::from_slice(&read_file(METADATA_FILE)?)
        .map_err(|e| format!("{shown}/{METADATA_FILE}: {e}"))?;
    let has_folded = dir.is_file(Path::new(fleet_file_name(Format::Folded)));
    let from_pprof = match has_folded {
        true => None,
        false => {
            let path = fleet_file_name(Format::Pprof);
            if !dir.is_file(Path::new(path)) {
                return Err(format!(
                    "{shown}: written in neither folded nor pprof, so it cannot be read back"
                ));
            }
            let p = pprof::decode(&read_file(path)?).map_err(|e| format!("{shown}: {e}"))?;
            Some(pprof::snapshot(&p, Duration::ZERO))
        }
    };
    let mut processes = Vec::new();
    for entry in labels["processes"].as_array().into_iter().flatten() {
        let pid = entry["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| format!("{shown}/{LABELS_FILE}: a process without a pid"))?;
        let root = entry["name"].as_str().unwrap_or_default();
        let role: Role = entry["role"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(Role::Single);
        // The time its samples stand for, as metadata.json says (older snapshots do not).
        let sampled = metadata["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["pid"].as_i64() == Some(i64::from(pid)))
            .and_then(|m| m["sampled_seconds"].as_f64())
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or(Duration::ZERO);
        let mut process = ProcessProfile {
            pid,
            name: process_name(root, role, pid),
            role,
            labels: labels_of(&entry["labels"]),
            samples: Vec::new(),
            sampled,
        };
        match &from_pprof {
            Some(snap) => {
                if let Some(p) = snap.processes.iter().find(|p| p.pid == pid) {
                    process.samples = p.samples.clone();
                }
            }
            None => {
                let file = format!("{root}.folded");
                if plain_file_name(&file) && dir.is_file(Path::new(&file)) {
                    let text = read_file(&file)?;
                    let text = String::from_utf8_lossy(&text);
                    let stacks = from_folded(&text).map_err(|e| format!("{shown}/{file}: {e}"))?;
                    process.samples = stacks
                        .stacks
                        .into_iter()
                        .map(|(stack, n)| (ThreadStatus::default(), frames_of(&stack).into(), n))
                        .collect();
                }
            }
        }
        process.samples.sort_by_key(|s| std::cmp::Reverse(s.2));
        processes.push(process);
    }
    processes.sort_by_key(|p| p.pid);
    let at = |key: &str| {
        metadata[key]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let ctx = RenderContext {
        title: format!("pyfleet {name}"),
        rate_hz: metadata["rate_hz"].as_f64(),
        asked_hz: metadata["rate_hz_asked"]
            .as_f64()
            .filter(|a| Some(*a) != metadata["rate_hz"].as_f64()),
        mode: metadata["mode"]
            .as_str()
            .and_then(|m| m.parse::<Mode>().ok())
            .unwrap_or_default(),
        duration: metadata["window_seconds"]
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        ..Default::default()
    };
    Ok(Loaded {
        snapshot: Snapshot {
            started_at: at("window_start"),
            taken_at: at("window_end"),
            processes,
        },
        ctx,
        statuses: from_pprof.is_some(),
    })
}

/// File `name` of `dir`, bounded, without following a symlink.
fn read_file(dir: &Beneath, name: &str) -> Result<Vec<u8>, String> {
    let shown = dir.path().join(name);
    let (f, _) = dir
        .open_regular(Path::new(name))
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    read_bounded(f, &shown.display())
}

/// A file name of letters, digits, `.`, `-` and `_`, not starting with `.`.
pub fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The process's name in its root frame (`<name>-<pid>`, `<name>-<role>-<pid>`).
fn process_name(root: &str, role: Role, pid: i32) -> String {
    let suffix = match role {
        Role::Single => format!("-{pid}"),
        role => format!("-{role}-{pid}"),
    };
    root.strip_suffix(&suffix).unwrap_or(root).to_string()
}

fn labels_of(v: &serde_json::Value) -> Labels {
    let mut labels = Labels::default();
    for key in LABEL_KEYS {
        if let Some(value) = v[key].as_str() {
            labels.set(key, value.chars().take(256).collect());
        }
    }
    labels
}

/// A folded stack's frames, innermost first (as a snapshot holds them).
fn frames_of(stack: &str) -> Vec<FrameInfo> {
    stack.split(';').rev().map(frame_of).collect()
}

/// A frame's label (`function (file:line)`, `function (file)`) split back.
fn frame_of(label: &str) -> FrameInfo {
    let Some((function, rest)) = label.strip_suffix(')').and_then(|l| l.rsplit_once(" (")) else {
        return FrameInfo::new(label, "", None);
    };
    match rest.rsplit_once(':') {
        Some((file, line)) if line.parse::<i32>().is_ok() => {
            FrameInfo::new(function, file, line.parse::<i32>().ok())
        }
        _ => FrameInfo::new(function, rest, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::folded;
    use crate::output::snapshot_dir::SnapshotDir;
    use pyfleet_actors::SnapshotWriter;
    use pyfleet_policies::{FileMode, RetentionPolicy};

    fn snapshot() -> Snapshot {
        let busy = ThreadStatus {
            on_cpu: true,
            ..Default::default()
        };
        let mut labels = Labels::default();
        labels.set("service", "checkout".into());
        let frames = |names: &[(&str, i32)]| -> pyfleet_actors::Frames {
            names
                .iter()
                .map(|(f, l)| FrameInfo::new(*f, "/srv/app (v2).py", Some(*l)))
                .collect::<Vec<_>>()
                .into()
        };
        Snapshot {
            started_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            taken_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_060),
            processes: vec![
                ProcessProfile {
                    pid: 41,
                    name: "gunicorn".into(),
                    role: Role::Master,
                    labels: Labels::default(),
                    samples: vec![(busy, frames(&[("run", 3)]), 2)],
                    sampled: std::time::Duration::ZERO,
                },
                ProcessProfile {
                    pid: 42,
                    name: "gunicorn".into(),
                    role: Role::Worker,
                    labels,
                    samples: vec![
                        (busy, frames(&[("render", 9), ("handle", 4), ("run", 3)]), 7),
                        (busy, frames(&[("handle", 5), ("run", 3)]), 1),
                    ],
                    sampled: std::time::Duration::ZERO,
                },
            ],
        }
    }

    fn written(formats: &[Format]) -> (tempfile::TempDir, std::path::PathBuf) {
        let out = tempfile::tempdir().unwrap();
        let dir = SnapshotDir::open(out.path(), RetentionPolicy::default(), FileMode::default())
            .unwrap()
            .with_formats(formats)
            .with_sampling(Mode::Wall, 99.0);
        let path = dir.write(&snapshot()).unwrap();
        (out, path)
    }

    #[test]
    fn a_snapshot_reads_back_as_it_was_written_from_folded_or_pprof() {
        for formats in [&[Format::Folded][..], &[Format::Pprof, Format::Svg][..]] {
            let (_out, path) = written(formats);
            let loaded = load(&Beneath::open(&path).unwrap()).unwrap();
            let written = snapshot();
            assert_eq!(
                folded::fleet_lines(&loaded.snapshot),
                folded::fleet_lines(&written),
                "{formats:?}"
            );
            let worker = &loaded.snapshot.processes[1];
            assert_eq!(
                (worker.pid, worker.name.as_str(), worker.role),
                (42, "gunicorn", Role::Worker)
            );
            assert_eq!(worker.labels.get("service"), Some("checkout"));
            assert_eq!(worker.samples[0].2, 7, "highest count first");
            assert_eq!(loaded.ctx.mode, Mode::Wall);
            assert_eq!(loaded.ctx.rate_hz, Some(99.0));
            assert_eq!(loaded.snapshot.taken_at, written.taken_at);
        }
    }

    #[test]
    fn a_snapshot_in_svg_alone_or_with_a_bad_name_is_not_read_amiss() {
        let (_out, path) = written(&[Format::Svg]);
        let e = load(&Beneath::open(&path).unwrap()).unwrap_err();
        assert!(e.contains("cannot be read back"), "{e}");
        // A root that would leave the directory is not opened: the process has no stacks.
        let (_out, path) = written(&[Format::Folded]);
        let labels = std::fs::read_to_string(path.join(LABELS_FILE)).unwrap();
        std::fs::write(
            path.join(LABELS_FILE),
            labels.replace("gunicorn-worker-42", "../../gunicorn-worker-42"),
        )
        .unwrap();
        let loaded = load(&Beneath::open(&path).unwrap()).unwrap();
        assert!(loaded.snapshot.processes[1].samples.is_empty());
    }

    #[test]
    fn frame_labels_split_back_to_the_same_label() {
        assert_eq!(
            frame_of("f (a.py:12)"),
            FrameInfo::new("f", "a.py", Some(12))
        );
        assert_eq!(
            frame_of("task t (<task>)"),
            FrameInfo::new("task t", "<task>", None)
        );
        assert_eq!(
            frame_of("[truncated]"),
            FrameInfo::new("[truncated]", "", None)
        );
        assert_eq!(frame_of("g (c.py:x)"), FrameInfo::new("g", "c.py:x", None));
        // Where a label is ambiguous, the split may differ but the label does not.
        for label in ["f (a (b).py:12)", "task t (awaited by 2) (<task>)"] {
            let mut again = String::new();
            folded::push_frame(&mut again, &frame_of(label));
            assert_eq!(again, label);
        }
    }
}
