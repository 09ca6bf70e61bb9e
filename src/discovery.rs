//! Finding the Python processes on the host: the process source of `pyfleet list` and of the
//! fleet supervisor. A process counts as Python when `_PyRuntime` is found in it and its
//! version can be read; processes that vanish or refuse us while we look are skipped.
//!
//! A probe reads files a target names and its memory: hostile input. [`probe_within`] runs
//! it on a thread of its own and waits at most a deadline, so that one process (a file on a
//! hung mount, a panic in a parser) costs that pid alone; a probe given up on keeps its thread
//! until it returns, and at most [`MAX_STUCK_PROBES`] such threads exist (then new probes wait
//! for one to end).

use crate::binary;
use crate::cpython::{self, Version};
use crate::memory::ProcessMemory;
use crate::process::{self, Process};
use pyfleet_policies::{MatchPolicy, ProcessFacts};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

/// Longest a probe of one process is waited for.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// Probes given up on that may still hold a thread.
pub const MAX_STUCK_PROBES: usize = 32;

/// Probes given up on whose thread has not returned yet.
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// What probing one process within a deadline found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    Python(PythonProcess),
    /// Not a Python process pyfleet can read (or gone, or refused, or its probe panicked).
    NotPython,
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

/// Examines one pid; `None` when it is not a (readable) Python process.
pub fn probe(pid: i32) -> Option<PythonProcess> {
    let p = Process::new(pid).ok()?;
    if !looks_like_python(&p) {
        return None;
    }
    let loc = binary::locate_runtime(&p).ok()?;
    let version = cpython::detect_version(&ProcessMemory::new(pid), &loc, pid).ok()?;
    let cmdline = p.cmdline().ok()?.join(" ");
    let exe_name = p
        .exe()
        .ok()
        .and_then(|e| Some(e.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_default();
    Some(PythonProcess {
        pid,
        version,
        cmdline,
        exe_name,
    })
}

/// [`probe`] on a thread of its own, waited for at most `deadline`.
pub fn probe_within(pid: i32, deadline: Duration) -> Probed {
    if STUCK.load(Ordering::Relaxed) >= MAX_STUCK_PROBES {
        return Probed::Busy;
    }
    let (tx, rx) = mpsc::sync_channel(1);
    // Whether the probe returned, and whether its waiter gave up on it (under one lock, so
    // that exactly one of them counts a stuck probe's end).
    let state = Arc::new(Mutex::new((false, false)));
    let theirs = state.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("probe-{pid}"))
        .spawn(move || {
            let found = std::panic::catch_unwind(|| probe(pid)).ok().flatten();
            let _ = tx.send(found);
            let mut s = theirs.lock().unwrap_or_else(PoisonError::into_inner);
            s.0 = true;
            if s.1 {
                STUCK.fetch_sub(1, Ordering::Relaxed);
            }
        });
    if spawned.is_err() {
        return Probed::Busy;
    }
    match rx.recv_timeout(deadline) {
        Ok(Some(p)) => Probed::Python(p),
        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => Probed::NotPython,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            if s.0 {
                // It returned just now.
                return match rx.try_recv() {
                    Ok(Some(p)) => Probed::Python(p),
                    _ => Probed::NotPython,
                };
            }
            s.1 = true;
            STUCK.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                pid,
                "probing process {pid} took over {deadline:?}: skipped for now"
            );
            Probed::TimedOut
        }
    }
}

/// Probes given up on whose thread is still running.
pub fn stuck_probes() -> usize {
    STUCK.load(Ordering::Relaxed)
}

/// Every Python process on the host that the policy matches, in pid order (a process whose
/// probe does not return within [`PROBE_DEADLINE`] is left out).
pub fn scan(policy: &MatchPolicy) -> Vec<PythonProcess> {
    process::all_pids()
        .into_iter()
        .filter_map(|pid| match probe_within(pid, PROBE_DEADLINE) {
            Probed::Python(p) => Some(p),
            _ => None,
        })
        .filter(|p| {
            policy.matches(&ProcessFacts {
                pid: p.pid,
                cmdline: &p.cmdline,
                exe_name: &p.exe_name,
            })
        })
        .collect()
}
