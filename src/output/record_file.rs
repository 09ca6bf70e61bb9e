//! The output of `pyfleet record`: one file in one format, written by the fleet's snapshot sink
//! like any snapshot.
//!
//! Owns accumulation and the atomic write. The sink calls [`SnapshotWriter::write`] with each
//! window it takes (normally only the final one, since `record` sets a snapshot interval
//! longer than the recording); every window is added to what came before and the whole
//! recording is rendered and written again, so a periodic snapshot can never replace or split
//! the recording: the last write holds every sample. Writes go to a temporary file in the
//! same directory, fsynced, then renamed over the target (and the directory fsynced), so the
//! file is always a whole profile. [`RecordFile::open`] checks the target is writable before
//! any sampling starts.

use super::beneath::{Beneath, Kind};
use super::format::{render, Format, RenderContext};
use super::{FileMode, Owner};
use pyfleet_actors::{ProcessProfile, Snapshot, SnapshotWriter, ThreadStatus};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

/// Whether the regular file `name` of `dir` starts like a profile in `format` (read without
/// following a symlink, at most 64 KiB).
fn existing_profile(dir: &Beneath, name: &OsStr, format: Format) -> bool {
    use std::io::Read;
    let Ok((f, _)) = dir.open_regular(Path::new(name)) else {
        return false;
    };
    let mut head = Vec::new();
    f.take(64 * 1024).read_to_end(&mut head).is_ok() && super::looks_like_profile(format, &head)
}

/// A function of [`RecordFile::top_functions`].
#[derive(Debug, Clone, PartialEq)]
pub struct HotFunction {
    /// `function (file)`.
    pub label: String,
    /// Percent of the samples recorded.
    pub share: f64,
    /// With several processes recorded: the process with most of its samples, and how many
    /// others have some.
    pub process: Option<(String, usize)>,
}

impl std::fmt::Display for HotFunction {
    /// `fib (app.py) in gunicorn-worker-4243 and 2 others`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)?;
        match &self.process {
            Some((name, 0)) => write!(f, " in {name}"),
            Some((name, 1)) => write!(f, " in {name} and 1 other"),
            Some((name, n)) => write!(f, " in {name} and {n} others"),
            None => Ok(()),
        }
    }
}

/// The longest function label [`RecordFile::top_functions`] gives.
pub const MAX_LABEL: usize = 120;

/// What the last write put in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Written {
    /// Counted samples (thread samples the mode counts) in the file.
    pub samples: u64,
    /// Processes in the file.
    pub processes: usize,
}

struct State {
    recording: Snapshot,
    ctx: RenderContext,
    written: Option<Written>,
    /// Frames folded by function (`--function`: see `views::by_function`).
    by_function: bool,
}

/// Writes a whole recording into one file; see the module documentation. Clones share the
/// recording (one goes to the fleet, one stays with the caller to read [`Self::written`]).
#[derive(Clone)]
pub struct RecordFile {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// The file's directory, held open since `open` (see `beneath`), and its name there.
    dir: Beneath,
    name: OsString,
    format: Format,
    file_mode: FileMode,
    /// Whom the file is handed to (`Owner::sudo_invoker`).
    owner: Option<Owner>,
    started: Instant,
    state: Mutex<State>,
}

impl std::fmt::Debug for RecordFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordFile")
            .field("path", &self.inner.path)
            .field("format", &self.inner.format)
            .finish_non_exhaustive()
    }
}

impl RecordFile {
    /// Folds frames by function, without line numbers (`--function`), in what it writes.
    pub fn by_function(self, on: bool) -> Self {
        self.lock().by_function = on;
        self
    }

    /// Checks that `path` can be written (its directory exists, is reached without following
    /// a link another user could have planted, and a temporary file can be created in it and
    /// removed) and returns the writer, which writes in that directory from then on. An existing file at `path` is
    /// replaced only when it is a profile in `format` (one pyfleet could have written: see
    /// [`looks_like_profile`](super::looks_like_profile)) or with `force`. The file itself is
    /// not touched until the first write; it gets `file_mode`'s bits, and goes to the user who
    /// ran sudo when pyfleet runs through it (`Owner::sudo_invoker`).
    pub fn open(
        path: &Path,
        format: Format,
        ctx: RenderContext,
        force: bool,
        file_mode: FileMode,
    ) -> Result<Self, String> {
        let shown = path.display();
        let (dir, name) = super::output_place(path)
            .map_err(|e| format!("cannot write the output {shown}: {e}"))?;
        match dir.kind(Path::new(&name)) {
            Some(Kind::Directory) => {
                return Err(format!(
                    "cannot write the output {shown}: it is a directory"
                ))
            }
            Some(Kind::Other) if !force => {
                return Err(format!(
                    "cannot write the output {shown}: it exists and is not a regular file \
                     (--force replaces it)"
                ))
            }
            Some(Kind::File) if !force && !existing_profile(&dir, &name, format) => {
                return Err(format!(
                    "cannot write the output {shown}: it exists and is not a {format} profile \
                     (--force replaces it)"
                ))
            }
            _ => {}
        }
        let (tmp, _) = super::create_beside(&dir, &name, file_mode)
            .map_err(|e| format!("cannot write the output {shown}: {e}"))?;
        let _ = dir.remove_all(Path::new(&tmp));
        Ok(RecordFile {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                dir,
                name,
                format,
                file_mode,
                owner: Owner::sudo_invoker(),
                started: Instant::now(),
                state: Mutex::new(State {
                    recording: Snapshot {
                        started_at: SystemTime::now(),
                        taken_at: SystemTime::now(),
                        processes: Vec::new(),
                    },
                    ctx,
                    written: None,
                    by_function: false,
                }),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn format(&self) -> Format {
        self.inner.format
    }

    /// What the last successful write put in the file (`None` before the first).
    pub fn written(&self) -> Option<Written> {
        self.lock().written
    }

    /// The `n` functions with the highest own share of the samples recorded so far (the
    /// innermost frame of each sample, lines merged), highest first: as `function (file)`
    /// (cut to [`MAX_LABEL`] characters), percent, and when several processes were recorded
    /// the one with most of its samples (its file name, `gunicorn-worker-4243`) and how many
    /// others have some.
    pub fn top_functions(&self, n: usize) -> Vec<HotFunction> {
        let state = self.lock();
        let processes = &state.recording.processes;
        // Own samples by function, and by process (its index) within it.
        type Own = (u64, HashMap<usize, u64>);
        let mut own: HashMap<(&str, &str), Own> = HashMap::new();
        let mut total = 0u64;
        for (i, p) in processes.iter().enumerate() {
            for (_, frames, count) in &p.samples {
                total += count;
                if let Some(leaf) = frames.first() {
                    let e = own.entry((&leaf.function, &leaf.file)).or_default();
                    e.0 += count;
                    *e.1.entry(i).or_default() += count;
                }
            }
        }
        let mut ranked: Vec<((&str, &str), Own)> = own.into_iter().collect();
        ranked.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(n)
            .map(|((function, file), (count, by_process))| {
                let base = file.rsplit('/').next().unwrap_or(file);
                let label: String = format!("{function} ({base})")
                    .chars()
                    .take(MAX_LABEL)
                    .collect();
                let process = (processes.len() > 1)
                    .then(|| {
                        let (&top, _) = by_process
                            .iter()
                            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
                        Some((
                            super::folded::process_root(&processes[top]),
                            by_process.len() - 1,
                        ))
                    })
                    .flatten();
                HotFunction {
                    label,
                    share: 100.0 * count as f64 / total.max(1) as f64,
                    process,
                }
            })
            .collect()
    }

    /// The samples of threads waiting for the GIL recorded so far, by the holder's function
    /// (see `blame::gil_holders`), and how many there were.
    pub fn gil_holders(&self) -> (Vec<(String, f64)>, u64) {
        super::blame::gil_holders(&self.lock().recording)
    }

    /// The samples recorded so far in which the garbage collector ran, by the function that
    /// started the collection (see `collector::collections`), and how many there were.
    pub fn collections(&self) -> (Vec<(String, f64)>, u64) {
        super::collector::collections(&self.lock().recording)
    }

    /// The samples of threads waiting for the GIL recorded so far, blamed or not.
    pub fn gil_waits(&self) -> u64 {
        super::blame::gil_waits(&self.lock().recording)
    }

    /// The asyncio task samples recorded so far by their entry into the program's own code
    /// (see `task_entries`), and how many there were.
    pub fn task_entries(&self) -> (Vec<super::task_entries::Entry>, u64) {
        super::task_entries::task_entries(&self.lock().recording)
    }

    /// What held the event loops recorded so far (see `task_entries::loop_holders`), and
    /// how many samples of loops running there were.
    pub fn loop_holders(&self) -> (Vec<super::task_entries::Entry>, u64) {
        super::task_entries::loop_holders(&self.lock().recording)
    }

    /// The ready tasks recorded so far waiting for their loop, by entry and what the loop
    /// ran (see `task_entries::loop_blockers`), and how many samples of them there were.
    pub fn loop_blockers(&self) -> (Vec<super::task_entries::Entry>, u64) {
        super::task_entries::loop_blockers(&self.lock().recording)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_atomically(&self, data: &[u8]) -> std::io::Result<()> {
        super::write_atomically(
            &self.inner.dir,
            &self.inner.name,
            data,
            self.inner.file_mode,
            self.inner.owner,
        )
    }
}

impl SnapshotWriter for RecordFile {
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String> {
        let mut state = self.lock();
        match state.by_function {
            true => merge(&mut state.recording, &super::views::by_function(snap)),
            false => merge(&mut state.recording, snap),
        }
        state.ctx.duration = Some(self.inner.started.elapsed());
        let data = render(self.inner.format, &state.recording, &state.ctx)?;
        self.write_atomically(&data)
            .map_err(|e| format!("writing {} failed: {e}", self.inner.path.display()))?;
        state.written = Some(Written {
            samples: state
                .recording
                .processes
                .iter()
                .map(ProcessProfile::total)
                .sum(),
            processes: state.recording.processes.len(),
        });
        Ok(self.inner.path.clone())
    }

    /// One file, nothing to retain.
    fn apply_retention(&self) {}
}

/// Adds `window` to `acc`: processes by (pid, name) with the window's role, samples by (status, frames), each
/// process's samples kept highest count first, processes by pid.
pub fn merge(acc: &mut Snapshot, window: &Snapshot) {
    acc.taken_at = window.taken_at.max(acc.taken_at);
    for p in &window.processes {
        let i = match acc
            .processes
            .iter()
            .position(|q| q.pid == p.pid && q.name == p.name)
        {
            Some(i) => i,
            None => {
                acc.processes.push(ProcessProfile {
                    pid: p.pid,
                    name: p.name.clone(),
                    role: p.role,
                    labels: p.labels.clone(),
                    samples: Vec::new(),
                    sampled: std::time::Duration::ZERO,
                });
                acc.processes.len() - 1
            }
        };
        let target = &mut acc.processes[i];
        target.sampled = target.sampled.saturating_add(p.sampled);
        // A process's role can change (its parent exits): the latest window's is kept.
        target.role = p.role;
        let mut index: HashMap<(ThreadStatus, &[pyfleet_actors::FrameInfo]), usize> =
            HashMap::new();
        let mut added: Vec<(usize, u64)> = Vec::new();
        let mut fresh = Vec::new();
        for (i, (status, frames, _)) in target.samples.iter().enumerate() {
            index.insert((*status, &frames[..]), i);
        }
        for (status, frames, n) in &p.samples {
            match index.get(&(*status, &frames[..])) {
                Some(&i) => added.push((i, *n)),
                None => fresh.push((*status, frames.clone(), *n)),
            }
        }
        drop(index);
        for (i, n) in added {
            if let Some(entry) = target.samples.get_mut(i) {
                entry.2 = entry.2.saturating_add(n);
            }
        }
        target.samples.extend(fresh);
        target.samples.sort_by_key(|s| std::cmp::Reverse(s.2));
    }
    acc.processes
        .sort_by(|a, b| a.pid.cmp(&b.pid).then_with(|| a.name.cmp(&b.name)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::FrameInfo;
    use std::fs;
    use std::time::{Duration, UNIX_EPOCH};

    fn window(at: u64, pid: i32, function: &str, n: u64) -> Snapshot {
        Snapshot {
            started_at: UNIX_EPOCH,
            taken_at: UNIX_EPOCH + Duration::from_secs(at),
            processes: vec![ProcessProfile {
                pid,
                name: "app".into(),
                role: pyfleet_policies::Role::Single,
                labels: Default::default(),
                samples: vec![(
                    ThreadStatus::default(),
                    vec![FrameInfo {
                        function: function.into(),
                        file: "/a.py".into(),
                        line: Some(1),
                    }]
                    .into(),
                    n,
                )],
                sampled: std::time::Duration::ZERO,
            }],
        }
    }

    #[test]
    fn a_recording_keeps_each_process_role() {
        let mut acc = window(0, 9, "a", 0);
        acc.processes.clear();
        let mut w = window(1, 9, "a", 2);
        w.processes[0].role = pyfleet_policies::Role::Worker;
        merge(&mut acc, &w);
        assert_eq!(acc.processes[0].role, pyfleet_policies::Role::Worker);
        // Its parent exited: the later window's role wins.
        w.processes[0].role = pyfleet_policies::Role::Single;
        merge(&mut acc, &w);
        assert_eq!(acc.processes[0].role, pyfleet_policies::Role::Single);
        assert_eq!(acc.processes[0].total(), 4);
    }

    /// A folded recording into `path`, with the defaults.
    fn folded_recording(path: &Path) -> RecordFile {
        RecordFile::open(
            path,
            Format::Folded,
            RenderContext::default(),
            false,
            FileMode::default(),
        )
        .unwrap()
    }

    #[test]
    fn every_write_holds_the_whole_recording() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.folded");
        let rec = folded_recording(&path);
        assert!(!path.exists(), "nothing written before the first snapshot");
        rec.write(&window(1, 9, "a", 2)).unwrap();
        rec.write(&window(2, 9, "a", 3)).unwrap();
        let last = rec.write(&window(3, 4, "b", 1)).unwrap();
        assert_eq!(last, path);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "app-4;b (/a.py:1) 1\napp-9;a (/a.py:1) 5\n"
        );
        assert_eq!(
            rec.written(),
            Some(Written {
                samples: 6,
                processes: 2
            })
        );
        let left: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    #[test]
    fn top_functions_rank_own_samples() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.folded");
        let rec = folded_recording(&path);
        rec.write(&window(1, 9, "slow", 6)).unwrap();
        rec.write(&window(2, 4, "fast", 2)).unwrap();
        rec.write(&window(3, 9, "slow", 2)).unwrap();
        let top: Vec<(String, f64)> = rec
            .top_functions(5)
            .into_iter()
            .map(|h| (h.to_string(), h.share))
            .collect();
        // Two processes (pids 9 and 4): each function says where it ran.
        assert_eq!(
            top,
            vec![
                ("slow (a.py) in app-9".to_string(), 80.0),
                ("fast (a.py) in app-4".to_string(), 20.0)
            ]
        );
        assert_eq!(rec.top_functions(1).len(), 1);
    }

    #[test]
    fn unwritable_paths_fail_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, "x").unwrap();
        let missing = dir.path().join("no/such/dir/out.svg");
        for (bad, why) in [
            (file.join("out.svg"), "is a file, not a directory"),
            (dir.path().to_path_buf(), "it is a directory"),
            (missing.clone(), "does not exist"),
        ] {
            for force in [false, true] {
                let e = RecordFile::open(
                    &bad,
                    Format::Svg,
                    RenderContext::default(),
                    force,
                    FileMode::default(),
                )
                .unwrap_err();
                assert!(e.starts_with("cannot write the output"), "{e}");
                assert!(e.contains(why), "{e}");
                assert_eq!(e.lines().count(), 1);
            }
        }
        assert!(!dir.path().join("no").exists(), "no directory created");
    }

    #[test]
    fn only_a_profile_is_replaced_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("app.py");
        fs::write(&source, "import time\nprint(1)\n").unwrap();
        let ctx = RenderContext::default;
        let e = RecordFile::open(&source, Format::Folded, ctx(), false, FileMode::default())
            .unwrap_err();
        assert!(e.contains("--force"), "{e}");
        assert!(
            RecordFile::open(&source, Format::Folded, ctx(), true, FileMode::default()).is_ok()
        );
        // An empty file holds nothing to lose (a folded recording of no sample is one).
        let empty = dir.path().join("empty.folded");
        fs::write(&empty, "").unwrap();
        assert!(
            RecordFile::open(&empty, Format::Folded, ctx(), false, FileMode::default()).is_ok()
        );
        assert_eq!(
            fs::read_to_string(&source).unwrap(),
            "import time\nprint(1)\n"
        );
        // What pyfleet writes, it may write again.
        let folded = dir.path().join("old.folded");
        let rec =
            RecordFile::open(&folded, Format::Folded, ctx(), false, FileMode::default()).unwrap();
        rec.write(&window(1, 9, "a", 2)).unwrap();
        assert!(
            RecordFile::open(&folded, Format::Folded, ctx(), false, FileMode::default()).is_ok()
        );
        let svg = dir.path().join("old.svg");
        let rec = RecordFile::open(&svg, Format::Svg, ctx(), false, FileMode::default()).unwrap();
        rec.write(&window(1, 9, "a", 2)).unwrap();
        assert!(RecordFile::open(&svg, Format::Svg, ctx(), false, FileMode::default()).is_ok());
        // But not as another format.
        assert!(RecordFile::open(&svg, Format::Folded, ctx(), false, FileMode::default()).is_err());
    }
}
