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

use super::format::{render, Format, RenderContext};
use pyfleet_actors::{ProcessProfile, Snapshot, SnapshotWriter, ThreadStatus};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

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
}

/// Writes a whole recording into one file; see the module documentation. Clones share the
/// recording (one goes to the fleet, one stays with the caller to read [`Self::written`]).
#[derive(Clone)]
pub struct RecordFile {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    format: Format,
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
    /// Checks that `path` can be written (its directory is created if missing, and a
    /// temporary file is created in it and removed) and returns the writer. The file itself is
    /// not touched until the first write.
    pub fn open(path: &Path, format: Format, ctx: RenderContext) -> Result<Self, String> {
        let shown = path.display();
        let Some(name) = path.file_name() else {
            return Err(format!("cannot write the output {shown}: not a file name"));
        };
        if path.is_dir() {
            return Err(format!(
                "cannot write the output {shown}: it is a directory"
            ));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir).map_err(|e| {
            format!(
                "cannot write the output {shown}: cannot create {}: {e}",
                dir.display()
            )
        })?;
        let (tmp, _) = super::create_beside(&dir.join(name))
            .map_err(|e| format!("cannot write the output {shown}: {e}"))?;
        let _ = fs::remove_file(&tmp);
        Ok(RecordFile {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                format,
                started: Instant::now(),
                state: Mutex::new(State {
                    recording: Snapshot {
                        taken_at: SystemTime::now(),
                        processes: Vec::new(),
                    },
                    ctx,
                    written: None,
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

    /// Forgets the rate (pprof then carries counts only): call when the rate changed during
    /// the recording.
    pub fn forget_rate(&self) {
        self.lock().ctx.rate_hz = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_atomically(&self, data: &[u8]) -> std::io::Result<()> {
        super::write_atomically(&self.inner.path, data)
    }
}

impl SnapshotWriter for RecordFile {
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String> {
        let mut state = self.lock();
        merge(&mut state.recording, snap);
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

/// Adds `window` to `acc`: processes by (pid, name), samples by (status, frames), each
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
                    samples: Vec::new(),
                });
                acc.processes.len() - 1
            }
        };
        let target = &mut acc.processes[i];
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
    use std::time::{Duration, UNIX_EPOCH};

    fn window(at: u64, pid: i32, function: &str, n: u64) -> Snapshot {
        Snapshot {
            taken_at: UNIX_EPOCH + Duration::from_secs(at),
            processes: vec![ProcessProfile {
                pid,
                name: "app".into(),
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
            }],
        }
    }

    #[test]
    fn every_write_holds_the_whole_recording() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/out.folded");
        let rec = RecordFile::open(&path, Format::Folded, RenderContext::default()).unwrap();
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
    fn unwritable_paths_fail_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, "x").unwrap();
        for bad in [file.join("out.svg"), dir.path().to_path_buf()] {
            let e = RecordFile::open(&bad, Format::Svg, RenderContext::default()).unwrap_err();
            assert!(e.starts_with("cannot write the output"), "{e}");
            assert_eq!(e.lines().count(), 1);
        }
    }
}
