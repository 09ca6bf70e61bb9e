//! Finding the Python processes on the host: the process source of `pyfleet list` and of the
//! fleet supervisor. A process counts as Python when `_PyRuntime` is found in it and its
//! version can be read; processes that vanish or refuse us while we look are skipped.

use crate::binary;
use crate::cpython::{self, Version};
use crate::memory::ProcessMemory;
use crate::process::{self, Process};
use pyfleet_policies::{MatchPolicy, ProcessFacts};

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

/// Every Python process on the host that the policy matches, in pid order.
pub fn scan(policy: &MatchPolicy) -> Vec<PythonProcess> {
    process::all_pids()
        .into_iter()
        .filter_map(probe)
        .filter(|p| {
            policy.matches(&ProcessFacts {
                pid: p.pid,
                cmdline: &p.cmdline,
                exe_name: &p.exe_name,
            })
        })
        .collect()
}
