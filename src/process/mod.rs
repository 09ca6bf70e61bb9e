//! What procfs says about a target: its mappings, command line, threads, and its files as the
//! target sees them (through `/proc/PID/root`, so targets in other mount namespaces work).
//!
//! Reads only /proc; never touches target memory (that is `memory`'s job).

pub mod namespace;
pub mod runstate;

use std::fs::File;
use std::path::{Path, PathBuf};

/// Why procfs could not tell us about a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("no such process (pid {0})")]
    NoSuchProcess(i32),
    #[error("permission denied for pid {0} (needs root or CAP_SYS_PTRACE)")]
    PermissionDenied(i32),
    /// The target's files could not be opened through /proc/PID/root: reading another user's
    /// files (and their directories) takes CAP_DAC_READ_SEARCH besides CAP_SYS_PTRACE.
    #[error("permission denied opening {path} of pid {pid} (needs root, or CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)")]
    FilePermissionDenied { pid: i32, path: PathBuf },
    #[error("cannot read /proc/{pid}: {msg}")]
    Proc { pid: i32, msg: String },
    #[error("cannot open {path} of pid {pid}: {source}")]
    OpenFile {
        pid: i32,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ProcessError {
    fn from_proc(pid: i32, e: procfs::ProcError) -> Self {
        match e {
            procfs::ProcError::NotFound(_) => ProcessError::NoSuchProcess(pid),
            procfs::ProcError::PermissionDenied(_) => ProcessError::PermissionDenied(pid),
            procfs::ProcError::Io(io, _) if io.kind() == std::io::ErrorKind::NotFound => {
                ProcessError::NoSuchProcess(pid)
            }
            procfs::ProcError::Io(io, _) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                ProcessError::PermissionDenied(pid)
            }
            other => ProcessError::Proc {
                pid,
                msg: other.to_string(),
            },
        }
    }
}

/// A file-backed mapping of the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// Device and inode: identify the file across processes (for caching ELF parsing).
    pub dev: (i32, i32),
    pub inode: u64,
    pub path: PathBuf,
}

/// Handle on a target process in procfs.
pub struct Process {
    pid: i32,
    inner: procfs::process::Process,
}

impl Process {
    pub fn new(pid: i32) -> Result<Self, ProcessError> {
        if pid <= 0 {
            return Err(ProcessError::NoSuchProcess(pid));
        }
        let inner =
            procfs::process::Process::new(pid).map_err(|e| ProcessError::from_proc(pid, e))?;
        Ok(Process { pid, inner })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// File-backed mappings, in address order.
    pub fn file_mappings(&self) -> Result<Vec<Mapping>, ProcessError> {
        let maps = self
            .inner
            .maps()
            .map_err(|e| ProcessError::from_proc(self.pid, e))?;
        Ok(maps
            .into_iter()
            .filter_map(|m| match m.pathname {
                procfs::process::MMapPath::Path(path) => Some(Mapping {
                    start: m.address.0,
                    end: m.address.1,
                    offset: m.offset,
                    dev: m.dev,
                    inode: m.inode,
                    path,
                }),
                _ => None,
            })
            .collect())
    }

    /// The executable's path as the target sees it.
    pub fn exe(&self) -> Result<PathBuf, ProcessError> {
        self.inner
            .exe()
            .map_err(|e| ProcessError::from_proc(self.pid, e))
    }

    /// The command line; empty for kernel threads and zombies.
    pub fn cmdline(&self) -> Result<Vec<String>, ProcessError> {
        self.inner
            .cmdline()
            .map_err(|e| ProcessError::from_proc(self.pid, e))
    }

    /// Opens a file of the target through `/proc/PID/root`, so that a target in another mount
    /// namespace (a container) gets its own file, not ours.
    pub fn open_file(&self, path: &Path) -> Result<File, ProcessError> {
        let rel = path.strip_prefix("/").unwrap_or(path);
        let through_root = PathBuf::from(format!("/proc/{}/root", self.pid)).join(rel);
        File::open(&through_root).map_err(|source| match source.kind() {
            std::io::ErrorKind::PermissionDenied => ProcessError::FilePermissionDenied {
                pid: self.pid,
                path: path.to_path_buf(),
            },
            _ if !Path::new(&format!("/proc/{}", self.pid)).exists() => {
                ProcessError::NoSuchProcess(self.pid)
            }
            _ => ProcessError::OpenFile {
                pid: self.pid,
                path: path.to_path_buf(),
                source,
            },
        })
    }
}

/// Whether the thread `tid` of `pid` is running or runnable right now (state `R` in
/// `/proc/PID/task/TID/stat`). `None` when the thread is gone or unreadable.
pub fn thread_on_cpu(pid: i32, tid: i32) -> Option<bool> {
    let stat = std::fs::read(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may contain anything.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let state = *stat.get(close + 2)?;
    Some(state == b'R')
}

/// The threads of `pid` that are running or runnable right now (state `R`), at most `max`
/// of them looked at. For `--blocking`, which must ask before it stops them.
pub fn running_threads(pid: i32, max: usize, out: &mut Vec<i32>) {
    out.clear();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for entry in dir.flatten().take(max) {
        if let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
            if thread_on_cpu(pid, tid) == Some(true) {
                out.push(tid);
            }
        }
    }
}

/// When the process started, in clock ticks after boot (`/proc/PID/stat` field 22): with the
/// pid, it names one process for its whole life (a reused pid gets another start time).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    // Fields after the command name start at field 3 (state); start time is field 22.
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This process's resident memory in bytes (`/proc/self/statm`).
pub fn own_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * procfs::page_size())
}

/// Whether this process holds CAP_SYS_PTRACE (root normally does): without it, only processes
/// of the same user can be read. From `CapEff` in /proc/self/status; `None` if unreadable.
pub fn has_ptrace_capability() -> Option<bool> {
    const CAP_SYS_PTRACE: u32 = 19;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let caps = u64::from_str_radix(hex, 16).ok()?;
    Some(caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// CPU time used so far by the calling thread, in nanoseconds (`/proc/thread-self/schedstat`).
pub fn own_thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Every pid on the host (processes, not threads).
pub fn all_pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_mappings_and_runs() {
        let me = std::process::id() as i32;
        let p = Process::new(me).unwrap();
        let maps = p.file_mappings().unwrap();
        let exe = p.exe().unwrap();
        assert!(maps.iter().any(|m| m.path == exe));
        assert!(!p.cmdline().unwrap().is_empty());
        // This thread is running while it reads its own stat.
        let tid = unsafe_free_gettid();
        assert_eq!(thread_on_cpu(me, tid), Some(true));
        assert!(all_pids().contains(&me));
        assert!(p.open_file(&exe).is_ok());
    }

    fn unsafe_free_gettid() -> i32 {
        std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn missing_process_is_reported_as_such() {
        assert!(matches!(
            Process::new(i32::MAX),
            Err(ProcessError::NoSuchProcess(_))
        ));
        assert!(matches!(
            Process::new(0),
            Err(ProcessError::NoSuchProcess(_))
        ));
    }
}
