//! Signals, and what /proc says of a process and its threads.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// A program on PATH, if there is one.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Like `send_signal`, for clean-ups: a process that is already gone is not an error.
pub fn try_signal(pid: i32, sig: libc::c_int) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

pub fn send_signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        panic!(
            "kill({pid}, {sig}) failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The environment variable that marks every process a test starts through [`Running`] (and
/// their descendants, which inherit it): its value names the start.
pub const PROCESS_TAG: &str = "PYFLEET_TEST_PROCESS";

/// A value of [`PROCESS_TAG`] no other start in this run has.
pub fn unique_process_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The live processes (zombies left out) whose environment holds `NAME=VALUE`.
pub fn processes_with_env(name: &str, value: &str) -> Vec<i32> {
    let needle = format!("{name}={value}");
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| process_state(pid).is_some_and(|s| s != 'Z' && s != 'X'))
        .filter(|&pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()))
        })
        .collect()
}

/// Kills (SIGKILL) every live process whose environment holds `NAME=VALUE`; the pids killed.
pub fn kill_processes_with_env(name: &str, value: &str) -> Vec<i32> {
    let pids = processes_with_env(name, value);
    for &pid in &pids {
        try_signal(pid, libc::SIGKILL);
    }
    pids
}

/// Whether a process with this pid exists (zombies included).
pub fn pid_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The state letter of /proc/PID/task/TID/stat (R, S, D, T, t, Z, ...).
fn task_state(stat_path: &Path) -> Option<char> {
    let stat = fs::read_to_string(stat_path).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// State letters of every thread of a process.
pub fn thread_states(pid: i32) -> Vec<(String, Option<char>)> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let tid = e.file_name().to_string_lossy().into_owned();
            out.push((tid, task_state(&e.path().join("stat"))));
        }
    }
    out
}

/// The session of a process (field 6 of /proc/PID/stat).
pub fn session_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

pub fn process_state(pid: i32) -> Option<char> {
    task_state(Path::new(&format!("/proc/{pid}/stat")))
}

/// Whether the process's main thread stays asleep (state `S`) for `span`, looked at every
/// millisecond. A thread that a pause (`--blocking`) woke from a lock wait sleeps again
/// first waiting for the GIL, then runs a moment to take it and go back to its wait (up to
/// the 5 ms switch interval later): one look at `S` does not tell that it is back.
pub fn asleep_for(pid: i32, span: Duration) -> bool {
    let end = Instant::now() + span;
    while Instant::now() < end {
        if process_state(pid) != Some('S') {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Poll `cond` until it returns true; panic with `what` (and `diag()`) after `timeout`.
pub fn wait_until(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
    diag: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}; {}", diag());
        }
        thread::sleep(POLL);
    }
}

/// SIGSTOPs a process on creation (and waits until every one of its threads is stopped);
/// SIGCONTs it on drop.
pub struct Stopped {
    pid: i32,
}

impl Stopped {
    pub fn new(pid: i32) -> Stopped {
        send_signal(pid, libc::SIGSTOP);
        let guard = Stopped { pid };
        wait_until(
            Duration::from_secs(10),
            &format!("every thread of {pid} to be stopped after SIGSTOP"),
            || {
                let states = thread_states(pid);
                !states.is_empty() && states.iter().all(|(_, s)| *s == Some('T'))
            },
            || format!("thread states: {:?}", thread_states(pid)),
        );
        guard
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: see send_signal; errors (process already gone) are irrelevant here.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}
