//! What procfs says about a target: its mappings, command line, threads, and the files it has
//! mapped.
//!
//! Reads only /proc; never touches target memory (that is `memory`'s job). Every path a target
//! names is hostile: a mapped file is opened as the very file mapped
//! (`/proc/PID/map_files/`, which also works for deleted files and other mount namespaces), or
//! else through `/proc/PID/root` only after the path is found to name that same regular file;
//! always non-blocking (a FIFO planted at the path cannot stall pyfleet), and only regular files
//! no larger than [`MAX_MAPPED_FILE`].

pub mod cpu_share;
pub mod namespace;
pub mod runstate;
pub mod switches;
pub mod syscall;

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest mapped file pyfleet opens (a libpython with debug info is about 30 MiB).
pub const MAX_MAPPED_FILE: u64 = 1 << 30;

/// Why procfs could not tell us about a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("no such process (pid {0})")]
    NoSuchProcess(i32),
    #[error("permission denied for pid {0}: {why}", why = crate::host::access::why_denied(*.0))]
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
    #[error("refusing {path} of pid {pid}: {why}")]
    UnsafeFile {
        pid: i32,
        path: PathBuf,
        why: &'static str,
    },
}

impl ProcessError {
    /// Whether the process, or its files, refused to be read (no privilege over it).
    pub fn is_permission_denied(&self) -> bool {
        matches!(
            self,
            ProcessError::PermissionDenied(_) | ProcessError::FilePermissionDenied { .. }
        )
    }

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

    /// File-backed mappings, in address order (at most [`MAX_MAPS_BYTES`] of the maps file
    /// are read: a process has at most 65,530 mappings by default, about 6 MiB).
    pub fn file_mappings(&self) -> Result<Vec<Mapping>, ProcessError> {
        use std::io::Read;
        let path = format!("/proc/{}/maps", self.pid);
        let mut text = Vec::new();
        File::open(&path)
            .and_then(|f| f.take(MAX_MAPS_BYTES).read_to_end(&mut text))
            .map_err(|e| self.proc_error(e))?;
        Ok(parse_maps(&text))
    }

    /// An error reading one of the process's /proc files.
    fn proc_error(&self, e: std::io::Error) -> ProcessError {
        proc_error(self.pid, e)
    }

    /// The executable's path as the target sees it.
    pub fn exe(&self) -> Result<PathBuf, ProcessError> {
        self.inner
            .exe()
            .map_err(|e| ProcessError::from_proc(self.pid, e))
    }

    /// The command line, its first [`MAX_CMDLINE_BYTES`] bytes (the target chooses its
    /// length); empty for kernel threads and zombies.
    pub fn cmdline(&self) -> Result<Vec<String>, ProcessError> {
        cmdline(self.pid)
    }

    /// Opens the file mapped at `m`: through `/proc/PID/map_files/` (the mapped file itself;
    /// needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), else through `/proc/PID/root` when the
    /// path there is a regular file with the mapping's inode. Never blocks on the open, never
    /// returns anything but a regular file of at most [`MAX_MAPPED_FILE`] bytes.
    pub fn open_mapped(&self, m: &Mapping) -> Result<File, ProcessError> {
        let mapped = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            self.pid, m.start, m.end
        ));
        let (file, by_path) = match open_nonblocking(&mapped) {
            Ok(f) => (f, false),
            Err(_) => {
                let rel = m.path.strip_prefix("/").unwrap_or(&m.path);
                let through_root = PathBuf::from(format!("/proc/{}/root", self.pid)).join(rel);
                // Checked before opening (stat opens nothing) and after (the path may change).
                let meta = std::fs::metadata(&through_root)
                    .map_err(|source| self.open_error(&m.path, source))?;
                self.check_mapped(m, &meta, true)?;
                let f = open_nonblocking(&through_root)
                    .map_err(|source| self.open_error(&m.path, source))?;
                (f, true)
            }
        };
        let meta = file
            .metadata()
            .map_err(|source| self.open_error(&m.path, source))?;
        self.check_mapped(m, &meta, by_path)?;
        Ok(file)
    }

    /// A regular file, not too large, and (when opened by path) the mapping's inode.
    fn check_mapped(
        &self,
        m: &Mapping,
        meta: &Metadata,
        by_path: bool,
    ) -> Result<(), ProcessError> {
        let why = if !meta.file_type().is_file() {
            Some("not a regular file")
        } else if meta.len() > MAX_MAPPED_FILE {
            Some("larger than 1 GiB")
        } else if by_path && meta.ino() != m.inode {
            Some("the path names another file than the one mapped")
        } else {
            None
        };
        match why {
            Some(why) => Err(ProcessError::UnsafeFile {
                pid: self.pid,
                path: m.path.clone(),
                why,
            }),
            None => Ok(()),
        }
    }

    /// Opens a file of the target through `/proc/PID/root`, so that a target in another mount
    /// namespace (a container) gets its own file, not ours. Non-blocking; for files the target
    /// has mapped, [`Process::open_mapped`] is the safe way.
    pub fn open_file(&self, path: &Path) -> Result<File, ProcessError> {
        let rel = path.strip_prefix("/").unwrap_or(path);
        let through_root = PathBuf::from(format!("/proc/{}/root", self.pid)).join(rel);
        open_nonblocking(&through_root).map_err(|source| self.open_error(path, source))
    }

    fn open_error(&self, path: &Path, source: std::io::Error) -> ProcessError {
        match source.kind() {
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
        }
    }
}

/// Most bytes of a command line read.
pub const MAX_CMDLINE_BYTES: u64 = 16 << 10;

/// Most bytes of /proc/PID/maps read.
pub const MAX_MAPS_BYTES: u64 = 32 << 20;

/// The file-backed mappings in the text of /proc/PID/maps: lines
/// `start-end perms offset major:minor inode   path`, the path being the rest of the line (it
/// may hold spaces; the kernel shows a newline in it as `\012`). Lines that do not parse, and
/// mappings without a path starting with `/`, are left out; nothing here can panic.
pub fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            // Paths are bytes; a mapping whose path is not UTF-8 cannot be a Python we know.
            continue;
        };
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(_perms), Some(offset), Some(dev), Some(inode), Some(rest)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let path = rest.trim_start_matches(' ');
        if !path.starts_with('/') {
            continue;
        }
        let hex = |t: &str| u64::from_str_radix(t, 16).ok();
        let Some((start, end)) = range
            .split_once('-')
            .and_then(|(a, b)| Some((hex(a)?, hex(b)?)))
        else {
            continue;
        };
        let Some((major, minor)) = dev.split_once(':').and_then(|(a, b)| {
            Some((
                i32::from_str_radix(a, 16).ok()?,
                i32::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            continue;
        };
        let (Some(offset), Ok(inode)) = (hex(offset), inode.parse::<u64>()) else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            offset,
            dev: (major, minor),
            inode,
            path: PathBuf::from(path),
        });
    }
    out
}

/// Opens for reading without blocking (a FIFO opens at once), without becoming the
/// controlling terminal, closed on exec.
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Whether the thread `tid` of `pid` is running or runnable right now (state `R` in
/// `/proc/PID/task/TID/stat`). `None` when the thread is gone or unreadable.
pub fn thread_on_cpu(pid: i32, tid: i32) -> Option<bool> {
    state_is_running(&std::fs::read(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// Whether the contents of a `stat` file say running or runnable (state `R`).
pub fn state_is_running(stat: &[u8]) -> Option<bool> {
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
    parent_and_start(pid).map(|(_, start)| start)
}

/// A process's parent pid and start time (clock ticks since boot), from one read of
/// `/proc/PID/stat`.
pub fn parent_and_start(pid: i32) -> Option<(i32, u64)> {
    stat_facts(pid).map(|f| (f.ppid, f.start))
}

fn proc_error(pid: i32, e: std::io::Error) -> ProcessError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ProcessError::NoSuchProcess(pid),
        std::io::ErrorKind::PermissionDenied => ProcessError::PermissionDenied(pid),
        _ => ProcessError::Proc {
            pid,
            msg: e.to_string(),
        },
    }
}

/// The command line of `pid`, as [`Process::cmdline`] (without opening the process first).
pub fn cmdline(pid: i32) -> Result<Vec<String>, ProcessError> {
    use std::io::Read;
    // Room for most command lines: read in one call, without probing reads.
    let mut raw = Vec::with_capacity(4096);
    File::open(format!("/proc/{pid}/cmdline"))
        .and_then(|f| f.take(MAX_CMDLINE_BYTES).read_to_end(&mut raw))
        .map_err(|e| proc_error(pid, e))?;
    if raw.last() == Some(&0) {
        raw.pop();
    }
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    Ok(raw
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// The executable's path as `pid` sees it (`None` for kernel threads, zombies, or a
/// process gone).
pub fn exe_path(pid: i32) -> Option<PathBuf> {
    exe_link(pid).ok()
}

/// `/proc/PID/exe`, or why not: `PermissionDenied` when another user's process may not be
/// looked at (no ptrace "read" access), `NotFound` for a kernel thread or a process gone.
pub fn exe_link(pid: i32) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
}

/// The kernel's flag of a task that has begun to exit (`PF_EXITING`, `/proc/PID/stat` field 9):
/// its memory and maps go before it is gone.
const PF_EXITING: u64 = 0x4;

/// Whether `pid` is gone, a zombie, or exiting (`PF_EXITING`): what reading it found missing
/// is then its exit, not a fault.
pub fn has_ended_or_is_ending(pid: i32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    let Some(rest) = stat
        .get(close + 2..)
        .and_then(|r| std::str::from_utf8(r).ok())
    else {
        return false;
    };
    // Field 3 is the state, field 9 the flags.
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    let flags: u64 = fields.nth(9 - 4).and_then(|f| f.parse().ok()).unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// What one read of `/proc/PID/stat` says of who a process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFacts {
    pub ppid: i32,
    /// Clock ticks after boot (field 22).
    pub start: u64,
    /// The command name (at most 16 bytes, as the kernel keeps it): an `exec` changes it
    /// (and so can the process itself).
    pub comm: Vec<u8>,
}

/// The parent, start time and command name of `pid`, from one read of `/proc/PID/stat`.
pub fn stat_facts(pid: i32) -> Option<StatFacts> {
    use std::io::Read;
    let mut file = File::open(format!("/proc/{pid}/stat")).ok()?;
    // One read: the kernel writes the whole line (a few hundred bytes) at once.
    let mut buf = [0u8; 2048];
    let n = file.read(&mut buf).ok()?;
    let stat = buf.get(..n).filter(|s| s.len() < buf.len())?;
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let comm = stat.get(open + 1..close)?.to_vec();
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    // Fields after the command name start at field 3 (state); the parent is field 4, the
    // start time field 22.
    let mut fields = rest.split_whitespace();
    let ppid = fields.nth(4 - 3)?.parse().ok()?;
    let start = fields.nth(22 - 4 - 1)?.parse().ok()?;
    Some(StatFacts { ppid, start, comm })
}

/// The command name in an open `/proc/PID/comm`, read again from its start (into `buf`): what
/// [`StatFacts::comm`] holds, for a fraction of a `stat` read's cost. `None` once the process
/// it was opened for has ended (and been reaped), even if its pid now names another.
pub fn comm_of<'b>(file: &File, buf: &'b mut [u8; 80]) -> Option<&'b [u8]> {
    use std::os::unix::fs::FileExt;
    let n = file.read_at(buf, 0).ok()?;
    let comm = buf.get(..n).filter(|c| c.len() < 80)?;
    Some(comm.strip_suffix(b"\n").unwrap_or(comm))
}

/// The kernel's name of thread `tid` of process `pid` (`/proc/PID/task/TID/comm`: at most 15
/// bytes, what `prctl(PR_SET_NAME)` or `pthread_setname_np` set, else the program's name),
/// as lossy UTF-8. Untrusted: sanitise before showing it. `None` once the thread has ended.
pub fn thread_name(pid: i32, tid: u64) -> Option<String> {
    let file = File::open(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    let mut buf = [0u8; 80];
    comm_of(&file, &mut buf).map(|name| String::from_utf8_lossy(name).into_owned())
}

/// This process's resident memory in bytes (`/proc/self/statm`).
pub fn own_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * procfs::page_size())
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

    #[test]
    fn maps_lines_parse_and_garbage_is_skipped() {
        let text = b"55d0a8a00000-55d0a8a2c000 r--p 00000000 fd:01 1835093                    /usr/bin/python3.11\n\
7f1c2e000000-7f1c2e021000 rw-p 00000000 00:00 0 \n\
7ffd1c9e9000-7ffd1ca0a000 rw-p 00000000 00:00 0                          [stack]\n\
7f1c2e400000-7f1c2e401000 r--s 00000000 00:01 32770                      /SYSV\n\
7f1c2e500000-7f1c2e501000 r--s 00000000 00:01 32771                      /SYSV00000000 (deleted)\n\
7f1c2e600000-7f1c2e601000 r-xp 00001000 08:10 99 /opt/my lib/libpython3.12.so.1.0 (deleted)\n\
zzzz-7f1c2e601000 r-xp 00001000 08:10 99 /bad/start\n\
7f1c2e700000-7f1c2e701000 r-xp\n\
7f1c2e800000-7f1c2e801000 r-xp 00001000 08:10 notanumber /bad/inode\n";
        let maps = parse_maps(text);
        let paths: Vec<&str> = maps.iter().map(|m| m.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/usr/bin/python3.11",
                "/SYSV",
                "/SYSV00000000 (deleted)",
                "/opt/my lib/libpython3.12.so.1.0 (deleted)"
            ]
        );
        assert_eq!(maps[0].start, 0x55d0_a8a0_0000);
        assert_eq!(maps[0].dev, (0xfd, 1));
        assert_eq!(maps[0].inode, 1835093);
        assert_eq!(maps[3].offset, 0x1000);
    }

    #[test]
    fn a_mapped_file_is_opened_as_mapped_and_nothing_else() {
        let me = Process::new(std::process::id() as i32).unwrap();
        let maps = me.file_mappings().unwrap();
        let exe = me.exe().unwrap();
        let m = maps.iter().find(|m| m.path == exe).unwrap();
        assert!(me.open_mapped(m).is_ok());
        // A path that names a FIFO where the mapped file was: refused at once, not blocked on.
        let dir = std::env::temp_dir().join(format!("pyfleet-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("libpython3.12.so.1.0");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let planted = Mapping {
            start: 1,
            end: 2,
            path: fifo.clone(),
            ..m.clone()
        };
        let e = me.open_mapped(&planted).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(
            me.open_file(&fifo).is_ok(),
            "open_file does not block either"
        );
        // A regular file that is not the mapped one.
        let other = dir.join("other");
        std::fs::write(&other, b"x").unwrap();
        let e = me
            .open_mapped(&Mapping {
                path: other,
                ..planted
            })
            .unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn unsafe_free_gettid() -> i32 {
        std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn a_process_ending_is_told_from_one_running() {
        assert!(!has_ended_or_is_ending(std::process::id() as i32));
        assert!(has_ended_or_is_ending(i32::MAX), "no such process");
        // A child that exited and is not reaped yet: a zombie.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !has_ended_or_is_ending(pid) {
            assert!(std::time::Instant::now() < deadline, "never seen ending");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            std::fs::read(format!("/proc/{pid}/stat")).is_ok(),
            "reaped too soon"
        );
        child.wait().unwrap();
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
