//! Profiles read back, for `diff`: a folded file, a pprof profile (gzipped or not) or a
//! snapshot directory (its fleet-wide `all.folded`, else its `profile.pb.gz`), each as folded
//! stacks of Python frames: root first, `;`-separated, with a count; the process frame
//! pyfleet roots its folded stacks at is left out (pprof has the process as a label).
//!
//! pprof frames are labelled as pyfleet's folded output labels them (`function (file:line)`,
//! through [`folded::push_frame`]), so a pprof and a folded file of pyfleet compare frame for
//! frame. The files are the user's, but may come from anywhere: reading is bounded (bytes of
//! a file and of a decompressed profile, distinct stacks) and a line that is not folded is an
//! error naming its number, never skipped in silence.

use super::folded;
use super::format::Format;
use super::pprof;
use super::snapshot_dir::fleet_file_name;
use pyfleet_actors::Snapshot;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Most bytes read of a file, and of a profile once decompressed.
pub const MAX_INPUT_BYTES: u64 = 1 << 30;
/// Most distinct stacks of one profile.
pub const MAX_STACKS: usize = 1_000_000;

/// A profile as folded stacks.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FoldedProfile {
    /// Each distinct stack and its count (stacks met twice are added up).
    pub stacks: BTreeMap<String, u64>,
    /// The counts' sum.
    pub total: u64,
    /// How the samples were taken, when the input says (a snapshot's metadata, a pyfleet
    /// pprof's period and duration; a folded file does not).
    pub timing: Option<Timing>,
}

/// How a profile's samples were taken: what turns its counts into seconds per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// cpu, wall or gil, when said.
    pub mode: Option<String>,
    /// The rate the samples were taken at.
    pub rate_hz: f64,
    /// The length of the window they were taken over.
    pub seconds: f64,
}

impl Timing {
    fn new(mode: Option<String>, rate_hz: f64, seconds: f64) -> Option<Timing> {
        (rate_hz.is_finite() && rate_hz > 0.0 && seconds.is_finite() && seconds > 0.0).then_some(
            Timing {
                mode,
                rate_hz,
                seconds,
            },
        )
    }

    /// Seconds of the samples per second of the window: `n` samples at the rate over it.
    pub fn per_second(&self, n: u64) -> f64 {
        n as f64 / self.rate_hz / self.seconds
    }
}

impl FoldedProfile {
    fn add(&mut self, stack: String, count: u64) -> Result<(), String> {
        if count == 0 || stack.is_empty() {
            return Ok(());
        }
        if self.stacks.len() >= MAX_STACKS && !self.stacks.contains_key(&stack) {
            return Err(format!("more than {MAX_STACKS} distinct stacks"));
        }
        let n = self.stacks.entry(stack).or_insert(0);
        *n = n.saturating_add(count);
        self.total = self.total.saturating_add(count);
        Ok(())
    }

    /// The same samples with each frame's line left out (`f (a.py:3)` is `f (a.py)`), equal
    /// stacks merged: a function is one frame however its lines moved.
    pub fn by_function(&self) -> FoldedProfile {
        let mut out = FoldedProfile {
            timing: self.timing.clone(),
            ..FoldedProfile::default()
        };
        for (stack, &n) in &self.stacks {
            let merged: Vec<String> = stack
                .split(';')
                .map(super::differential::function_label)
                .collect();
            // No more stacks than read: within the bound.
            let _ = out.add(merged.join(";"), n);
        }
        out
    }

    /// The folded text: a line per stack, `stack count`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (stack, n) in &self.stacks {
            out.push_str(stack);
            out.push(' ');
            out.push_str(&n.to_string());
            out.push('\n');
        }
        out
    }
}

/// Reads the profile at `path`: a snapshot directory, or a file in pprof's format (told by
/// its bytes: gzip, or a protobuf that decodes as a profile with samples) or folded.
pub fn read(path: &Path) -> Result<FoldedProfile, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if meta.is_dir() {
        let all = path.join(fleet_file_name(Format::Folded));
        let pprof = path.join(fleet_file_name(Format::Pprof));
        let chosen = match (all.is_file(), pprof.is_file()) {
            (true, _) => Some(all),
            (false, true) => Some(pprof),
            _ => None,
        };
        if let Some(file) = chosen {
            let mut profile = read(&file)?;
            // The window's own account of how it was sampled wins over a file's.
            if let Some(t) = snapshot_timing(path) {
                profile.timing = Some(t);
            }
            return Ok(profile);
        }
        return Err(format!(
            "{shown}: not a snapshot directory (it holds neither {} nor {})",
            fleet_file_name(Format::Folded),
            fleet_file_name(Format::Pprof)
        ));
    }
    let bytes = read_bounded(
        std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?,
        &shown,
    )?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let raw = read_bounded(flate2::read::GzDecoder::new(bytes.as_slice()), &shown)?;
        return from_pprof(&raw).map_err(|e| format!("{shown}: {e}"));
    }
    match std::str::from_utf8(&bytes) {
        Ok(text) => from_folded(text)
            .map(without_process_frames)
            .map_err(|e| format!("{shown}: {e}")),
        // Not text: a pprof profile that is not gzipped, or nothing known.
        Err(_) => from_pprof(&bytes)
            .map_err(|e| format!("{shown}: neither folded stacks nor a pprof profile ({e})")),
    }
}

/// pyfleet roots a stack at its process's frame (`<name>-<pid>`, or with the role: a
/// record's and a snapshot's folded stacks, see `folded::process_root`): without that frame,
/// profiles compare across processes that came and went (a worker restarted, a deploy). A
/// root frame is taken for one when it is not a Python frame's label (`function (file...)`)
/// and ends in `-` and digits, and frames follow it.
fn without_process_frames(p: FoldedProfile) -> FoldedProfile {
    let timing = p.timing.clone();
    let is_process = |frame: &str| {
        !frame.contains(" (")
            && frame.rsplit_once('-').is_some_and(|(name, pid)| {
                !name.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
            })
    };
    let mut out = FoldedProfile {
        timing,
        ..FoldedProfile::default()
    };
    for (stack, n) in p.stacks {
        let stack = match stack.split_once(';') {
            Some((root, rest)) if is_process(root) => rest.to_string(),
            _ => stack,
        };
        // At most as many stacks as read: within the bound.
        let _ = out.add(stack, n);
    }
    out
}

pub(crate) fn read_bounded(
    from: impl Read,
    shown: &impl std::fmt::Display,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    from.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!(
            "{shown}: larger than {} MiB",
            MAX_INPUT_BYTES >> 20
        ));
    }
    Ok(out)
}

/// Folded stacks: each line `frames count`, the count after the last space; blank lines and
/// lines starting with `#` are left out.
pub fn from_folded(text: &str) -> Result<FoldedProfile, String> {
    let mut p = FoldedProfile::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parsed = line
            .rsplit_once(' ')
            .and_then(|(stack, n)| Some((stack.trim_end(), n.parse::<u64>().ok()?)));
        let Some((stack, count)) = parsed else {
            return Err(format!(
                "line {}: not folded stacks (`frame;frame;... count`)",
                i + 1
            ));
        };
        p.add(stack.to_string(), count)?;
    }
    Ok(p)
}

/// A snapshot directory's `metadata.json`: its mode, the rate its samples were taken at and
/// its window's length.
fn snapshot_timing(dir: &Path) -> Option<Timing> {
    let file = std::fs::File::open(dir.join("metadata.json")).ok()?;
    let text = read_bounded(file, &dir.display()).ok()?;
    let meta: serde_json::Value = serde_json::from_slice(&text).ok()?;
    Timing::new(
        meta["mode"].as_str().map(str::to_string),
        meta["rate_hz"].as_f64()?,
        meta["window_seconds"].as_f64()?,
    )
}

/// A pprof profile's samples by their first value (pyfleet's `samples`/`count`), frames
/// labelled as pyfleet's folded output labels them; its timing from its period (with a time
/// as second value: its mode is that value's type) and its duration.
pub fn from_pprof(raw: &[u8]) -> Result<FoldedProfile, String> {
    let profile = pprof::decode(raw)?;
    if profile.sample.is_empty() && profile.string_table.is_empty() {
        return Err("not a pprof profile (no samples, no strings)".into());
    }
    let snapshot = pprof::snapshot(&profile, std::time::Duration::ZERO);
    let mut folded = from_snapshot(&snapshot)?;
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .cloned()
    };
    let timed = profile
        .sample_type
        .get(1)
        .filter(|t| string(t.unit).as_deref() == Some("nanoseconds"));
    let rate = snapshot
        .rate_hz()
        .or_else(|| (timed.is_some() && profile.period > 0).then(|| 1e9 / profile.period as f64));
    folded.timing = rate.and_then(|hz| {
        Timing::new(
            timed.and_then(|t| string(t.r#type)),
            hz,
            profile.duration_nanos as f64 / 1e9,
        )
    });
    Ok(folded)
}

/// A snapshot's samples, every process's together (the process frame left out).
pub fn from_snapshot(snap: &Snapshot) -> Result<FoldedProfile, String> {
    let mut p = FoldedProfile::default();
    for process in &snap.processes {
        for (stack, count) in folded::process_lines(process, None) {
            p.add(stack, count)?;
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::FrameInfo;

    #[test]
    fn folded_lines_add_up_and_a_bad_line_is_named() {
        let p = from_folded("# comment\na (x.py:1);b (x.py:2) 3\n\na (x.py:1) 2\na (x.py:1) 1\n")
            .unwrap();
        assert_eq!(p.total, 6);
        assert_eq!(p.stacks["a (x.py:1)"], 3);
        assert_eq!(p.stacks["a (x.py:1);b (x.py:2)"], 3);
        // A frame with spaces in it keeps them: the count is after the last space.
        let p = from_folded("main (my file.py:3) 4\n").unwrap();
        assert_eq!(p.stacks["main (my file.py:3)"], 4);
        let e = from_folded("a 1\nno count here\n").unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        assert!(from_folded("a -3\n").is_err());
    }

    #[test]
    fn pprof_is_read_as_the_folded_output_labels_its_frames() {
        use pyfleet_actors::ThreadStatus;
        let status = ThreadStatus::default();
        // Innermost frame first, as sources give them.
        let snap = crate::output::views::one_process(vec![
            (
                status,
                vec![
                    FrameInfo::new("leaf", "app.py", Some(3)),
                    FrameInfo::new("main", "app.py", Some(1)),
                ]
                .into(),
                5,
            ),
            (
                status,
                vec![FrameInfo::new("main", "app.py", Some(1))].into(),
                2,
            ),
        ]);
        let ctx = crate::output::render_context::RenderContext::default();
        let gz = pprof::render(&snap, &ctx).unwrap();
        let raw = read_bounded(flate2::read::GzDecoder::new(gz.as_slice()), &"test").unwrap();
        let p = from_pprof(&raw).unwrap();
        assert_eq!(p.total, 7);
        assert_eq!(p.stacks["main (app.py:1);leaf (app.py:3)"], 5);
        assert_eq!(p.stacks["main (app.py:1)"], 2);
        assert!(from_pprof(b"\xff\xff\xff").is_err());
    }

    #[test]
    fn a_folded_files_and_a_snapshots_stacks_lose_their_process_frame() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("all.folded"),
            "web-41;main (a.py:1);f (a.py:2) 3\nweb-worker-42;main (a.py:1);f (a.py:2) 4\n\
             web-42 1\nmain;foo 2\nmain-2;foo 5\nmain (x-1);foo 6\n",
        )
        .unwrap();
        let p = read(&dir.path().join("all.folded")).unwrap();
        assert_eq!(p.total, 21);
        assert_eq!(p.stacks["main (a.py:1);f (a.py:2)"], 7);
        // A lone frame, a root without a pid, a Python frame: kept.
        assert_eq!(p.stacks["web-42"], 1);
        assert_eq!(p.stacks["main;foo"], 2);
        assert_eq!(p.stacks["foo"], 5);
        assert_eq!(p.stacks["main (x-1);foo"], 6);
        let p = read(dir.path()).unwrap();
        assert_eq!(p.total, 21, "a snapshot directory: its all.folded");
        let empty = tempfile::tempdir().unwrap();
        let e = read(empty.path()).unwrap_err();
        assert!(e.contains("not a snapshot directory"), "{e}");
    }
}
