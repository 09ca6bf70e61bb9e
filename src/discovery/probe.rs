//! Probing a process: is it Python, and which version. The host scan
//! ([`HostDiscovery`](super::HostDiscovery), shared by `list`, `record` and the daemon)
//! probes each new process with it. A process counts as Python when `_PyRuntime` is found in it and its
//! version can be read; processes that vanish or refuse us while we look are skipped.
//!
//! A probe reads files a target names and its memory: hostile input. Each runs on a thread
//! of its own, waited for at most a deadline ([`probe_within`]; [`probe_many`] runs up to
//! [`PROBE_WAVE`] at once under one deadline), so that one process (a file on a hung mount, a
//! panic in a parser) costs that pid alone; a probe given up on keeps its thread until it
//! returns, and at most [`MAX_STUCK_PROBES`] such threads exist (then new probes are refused
//! as `Busy` until one ends).

use crate::binary;
use crate::cpython::{self, Version};
use crate::memory::ProcessMemory;
use crate::process::Process;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest a probe of one process is waited for.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// Probes given up on that may still hold a thread.
pub const MAX_STUCK_PROBES: usize = 32;
/// Probes run at the same time by [`probe_many`].
pub const PROBE_WAVE: usize = 16;

/// Probes given up on whose thread has not returned yet.
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// What probing one process within a deadline found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    Python(PythonProcess),
    /// Not a Python process (or gone, or its probe panicked).
    NotPython,
    /// It may be Python, but pyfleet may not read it: why, in one clause.
    Refused(String),
    /// The probe did not return within the deadline: try again later.
    TimedOut,
    /// Too many probes are stuck already: not probed, try again later.
    Busy,
}

/// A Python process found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonProcess {
    pub pid: i32,
    pub version: Version,
    /// Arguments joined by spaces (untrusted: escape before display).
    pub cmdline: String,
    /// The executable's file name.
    pub exe_name: String,
}

/// Cheap pre-check before parsing any ELF: the executable is called python-something, or a
/// libpython is mapped. Embedding programs (uwsgi, ...) map libpython.
fn looks_like_python(p: &Process) -> bool {
    let exe_named = p
        .exe()
        .ok()
        .and_then(|e| Some(e.file_name()?.to_str()?.contains("python")))
        .unwrap_or(false);
    exe_named
        || p.file_mappings().is_ok_and(|maps| {
            maps.iter().any(|m| {
                m.path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libpython"))
            })
        })
}

/// Examines one pid: Python (and which), not Python, or refused (its files or memory may
/// not be read: then whether it is Python is not known).
pub fn probe(pid: i32) -> Probed {
    let Ok(p) = Process::new(pid) else {
        return Probed::NotPython;
    };
    if !looks_like_python(&p) {
        return Probed::NotPython;
    }
    let refused = |e: &dyn std::fmt::Display| Probed::Refused(e.to_string());
    let loc = match binary::locate_runtime(&p) {
        Ok(loc) => loc,
        Err(e) if e.is_permission_denied() => return refused(&e),
        Err(_) => return Probed::NotPython,
    };
    let version = match cpython::detect_version(&ProcessMemory::new(pid), &loc, pid) {
        Ok(v) => v,
        Err(e) if e.is_permission_denied() => return refused(&e),
        Err(_) => return Probed::NotPython,
    };
    let Ok(argv) = p.cmdline() else {
        return Probed::NotPython;
    };
    let exe_name = p
        .exe()
        .ok()
        .and_then(|e| Some(e.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_default();
    Probed::Python(PythonProcess {
        pid,
        version,
        cmdline: argv.join(" "),
        exe_name,
    })
}

/// A [`probe`] under way on a thread of its own.
struct PendingProbe {
    pid: i32,
    rx: mpsc::Receiver<Probed>,
    /// Whether the probe returned, and whether its waiter gave up on it (under one lock, so
    /// that exactly one of them counts a stuck probe's end).
    state: Arc<Mutex<(bool, bool)>>,
}

/// Starts `probe` of `pid` on a thread of its own; `Err(Probed::Busy)` when too many probes
/// are stuck already (or no thread can be made).
fn start_probe(pid: i32, probe: fn(i32) -> Probed) -> Result<PendingProbe, Probed> {
    if STUCK.load(Ordering::Relaxed) >= MAX_STUCK_PROBES {
        return Err(Probed::Busy);
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let state = Arc::new(Mutex::new((false, false)));
    let theirs = state.clone();
    std::thread::Builder::new()
        .name(format!("probe-{pid}"))
        .spawn(move || {
            let found = std::panic::catch_unwind(|| probe(pid)).unwrap_or(Probed::NotPython);
            let _ = tx.send(found);
            let mut s = theirs.lock().unwrap_or_else(PoisonError::into_inner);
            s.0 = true;
            if s.1 {
                STUCK.fetch_sub(1, Ordering::Relaxed);
            }
        })
        .map_err(|_| Probed::Busy)?;
    Ok(PendingProbe { pid, rx, state })
}

impl PendingProbe {
    /// What the probe found, waiting for it until `until` at most.
    fn wait_until(self, until: Instant) -> Probed {
        let pid = self.pid;
        let left = until.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(found) => found,
            Err(mpsc::RecvTimeoutError::Disconnected) => Probed::NotPython,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if s.0 {
                    // It returned just now.
                    return self.rx.try_recv().unwrap_or(Probed::NotPython);
                }
                s.1 = true;
                STUCK.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pid, "probing process {pid} took too long: skipped for now");
                Probed::TimedOut
            }
        }
    }
}

/// [`probe`] on a thread of its own, waited for at most `deadline`.
pub fn probe_within(pid: i32, deadline: Duration) -> Probed {
    match start_probe(pid, probe) {
        Ok(pending) => pending.wait_until(Instant::now() + deadline),
        Err(busy) => busy,
    }
}

/// Probes many processes, [`PROBE_WAVE`] at a time, each wave waited for at most `deadline`:
/// processes whose probes hang cost a scan one deadline per wave they are in, not one each.
/// Answers in the order of `pids`.
pub fn probe_many(pids: &[i32], deadline: Duration) -> Vec<Probed> {
    probe_many_with(pids, deadline, probe)
}

fn probe_many_with(pids: &[i32], deadline: Duration, probe: fn(i32) -> Probed) -> Vec<Probed> {
    let mut out = Vec::with_capacity(pids.len());
    for wave in pids.chunks(PROBE_WAVE) {
        let started: Vec<Result<PendingProbe, Probed>> =
            wave.iter().map(|&pid| start_probe(pid, probe)).collect();
        let until = Instant::now() + deadline;
        out.extend(started.into_iter().map(|p| match p {
            Ok(pending) => pending.wait_until(until),
            Err(busy) => busy,
        }));
    }
    out
}

/// Probes given up on whose thread is still running.
pub fn stuck_probes() -> usize {
    STUCK.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Odd pids hang for a while, even ones answer at once.
    fn half_hang(pid: i32) -> Probed {
        if pid % 2 == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        Probed::NotPython
    }

    #[test]
    fn hanging_probes_cost_a_deadline_per_wave_not_each() {
        // 24 pids, 12 of them hanging (under MAX_STUCK_PROBES): two waves of 16 and 8.
        let pids: Vec<i32> = (1..=24).collect();
        let deadline = Duration::from_millis(200);
        let start = Instant::now();
        let probed = probe_many_with(&pids, deadline, half_hang);
        let took = start.elapsed();
        assert_eq!(probed.len(), pids.len());
        for (pid, p) in pids.iter().zip(&probed) {
            let want = match pid % 2 {
                1 => Probed::TimedOut,
                _ => Probed::NotPython,
            };
            assert_eq!(*p, want, "pid {pid}");
        }
        // One at a time it would take 12 deadlines (2.4 s); two waves take two (0.4 s),
        // plus thread start-up: 1.2 s leaves room for a loaded machine and none for the
        // sequential way.
        assert!(took < Duration::from_millis(1200), "took {took:?}");
    }
}
