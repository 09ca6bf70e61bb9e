//! Short-lived commands (pyfleet) with a timeout, their output, the error contract, and
//! the snapshot directories a daemon writes.

use super::*;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RunOutput {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// Processes of the command (its tag's) still running once it exited, killed then.
    pub left_behind: Vec<i32>,
}

impl RunOutput {
    pub fn describe(&self) -> String {
        format!(
            "`{}` -> {} after {:?}\n--- stdout ({} bytes) ---\n{}\n--- stderr ---\n{}",
            self.command,
            describe_status(&self.status),
            self.elapsed,
            self.stdout.len(),
            truncate(&self.stdout, 4000),
            truncate(&self.stderr, 4000)
        )
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }
}

pub fn describe_status(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{status}"),
    }
}

pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [{} more bytes]", &s[..end], s.len() - end)
}

/// How long after a command exited its other processes may still run before they count as
/// left behind.
const LEFT_BEHIND_AFTER: Duration = Duration::from_secs(1);

/// A running short-lived command whose output is being collected. It carries a
/// [`PROCESS_TAG`] of its own, which its descendants inherit: when it ends, times out or is
/// dropped, every process still carrying the tag is killed, so none outlives the test (nor
/// holds the output pipes open).
pub struct Running {
    child: Option<Child>,
    command: String,
    started: Instant,
    timeout: Duration,
    readers: Vec<thread::JoinHandle<Vec<u8>>>,
    tag: String,
}

fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

impl Running {
    pub fn start(mut cmd: Command, timeout: Duration) -> Running {
        let command = command_line(&cmd);
        let tag = unique_process_tag();
        cmd.env(PROCESS_TAG, &tag)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn `{command}`: {e}"));
        let mut readers = Vec::new();
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
        ] {
            let mut pipe = pipe;
            readers.push(thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.read_to_end(&mut buf);
                buf
            }));
        }
        Running {
            child: Some(child),
            command,
            started,
            timeout,
            readers,
            tag,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// The value of [`PROCESS_TAG`] this command and its descendants carry.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Kills what is left of the command's processes (see [`Running`]); the pids killed.
    fn kill_left_behind(&self) -> Vec<i32> {
        kill_processes_with_env(PROCESS_TAG, &self.tag)
    }

    /// Wait for the command to finish; panics if it takes longer than its timeout (after
    /// killing it).
    pub fn finish(mut self) -> RunOutput {
        let mut child = self.child.take().unwrap();
        let deadline = self.started + self.timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waitpid failed") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.kill_left_behind();
                let out: Vec<String> = self
                    .readers
                    .drain(..)
                    .map(|r| String::from_utf8_lossy(&r.join().unwrap_or_default()).into_owned())
                    .collect();
                panic!(
                    "`{}` did not finish within {:?} (killed it)\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.command,
                    self.timeout,
                    truncate(&out[0], 4000),
                    truncate(&out[1], 4000)
                );
            }
            thread::sleep(Duration::from_millis(5));
        };
        let elapsed = self.started.elapsed();
        // A descendant still running a moment after the command exited (one being killed with
        // it has that moment to go) would hold the pipes open: it ends here.
        let settle = Instant::now() + LEFT_BEHIND_AFTER;
        while Instant::now() < settle && !processes_with_env(PROCESS_TAG, &self.tag).is_empty() {
            thread::sleep(Duration::from_millis(10));
        }
        let left_behind = self.kill_left_behind();
        let mut out = self.readers.drain(..).map(|r| r.join().unwrap_or_default());
        let stdout = out.next().unwrap();
        let stderr = out.next().unwrap();
        RunOutput {
            command: self.command.clone(),
            status,
            stdout: String::from_utf8(stdout).unwrap_or_else(|e| {
                panic!("`{}` wrote invalid UTF-8 on stdout: {e}", self.command)
            }),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            elapsed,
            left_behind,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.kill_left_behind();
    }
}

pub fn pyfleet_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pyfleet"))
}

/// The pyfleet binary whose exactness is measured: `PYFLEET_EXACTNESS_BIN` when set
/// (scripts/test.sh sets it to the release build, which users run: how far a thread moves
/// while it is read depends on how fast pyfleet gets through a read, and a debug build is
/// several times slower), else the debug build `cargo test` made.
pub fn measured_exe() -> PathBuf {
    match std::env::var_os("PYFLEET_EXACTNESS_BIN") {
        Some(p) if !p.is_empty() => p.into(),
        _ => pyfleet_exe(),
    }
}

/// The arguments of `pyfleet record --pid PID ARGS... --rate RATE --duration SECONDS -o OUT`.
pub fn record_args(pid: i32, args: &[&str], rate: u32, seconds: u32, out: &Path) -> Vec<OsString> {
    let mut all: Vec<OsString> = vec!["record".into(), "--pid".into(), pid.to_string().into()];
    all.extend(args.iter().map(OsString::from));
    for (flag, value) in [("--rate", rate), ("--duration", seconds)] {
        all.push(flag.into());
        all.push(value.to_string().into());
    }
    all.push("-o".into());
    all.push(out.as_os_str().to_owned());
    all
}

/// `pyfleet ARGS` with a deterministic environment (no RUST_LOG, no RUST_BACKTRACE).
pub fn pyfleet_command<S: AsRef<OsStr>>(args: &[S]) -> Command {
    command_of(pyfleet_exe(), args)
}

/// [`pyfleet_command`] of the binary whose exactness is measured ([`measured_exe`]).
pub fn measured_command<S: AsRef<OsStr>>(args: &[S]) -> Command {
    command_of(measured_exe(), args)
}

fn command_of<S: AsRef<OsStr>>(exe: PathBuf, args: &[S]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env("STATE_DIRECTORY", super::harness_state_dir());
    cmd
}

/// Start `pyfleet ARGS` in the background (see `Running::finish`).
pub fn start_pyfleet<S: AsRef<OsStr>>(args: &[S]) -> Running {
    Running::start(pyfleet_command(args), PYFLEET_TIMEOUT)
}

/// Run `pyfleet ARGS`; panics if it takes more than PYFLEET_TIMEOUT.
pub fn pyfleet<S: AsRef<OsStr>>(args: &[S]) -> RunOutput {
    start_pyfleet(args).finish()
}

/// Run any command with a timeout.
pub fn run_with_timeout(cmd: Command, timeout: Duration) -> RunOutput {
    Running::start(cmd, timeout).finish()
}

/// Run `program ARGS` through `setpriv` (`tool("setpriv", SETUP_DEPLOY_TOOLS)`) as user/group
/// nobody (65534) with no supplementary groups and no capabilities.
pub fn as_nobody<S: AsRef<OsStr>>(setpriv: &Path, program: &Path, args: &[S]) -> Command {
    let mut cmd = Command::new(setpriv);
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(program)
    .args(args)
    .env_remove("RUST_LOG")
    .env_remove("RUST_BACKTRACE");
    cmd
}

/// Checks the error contract: non-zero exit that is not a panic (101) nor a signal; stderr is
/// exactly one non-empty line without "panicked"/"backtrace"; it mentions `needle`
/// (case-insensitive) if given.  Returns a description of every violation (empty = OK).
pub fn error_contract_violations(out: &RunOutput, needle: Option<&str>) -> Vec<String> {
    let mut bad = Vec::new();
    match (out.status.code(), out.status.signal()) {
        (Some(0), _) => bad.push("exited 0, expected a failure".to_string()),
        (Some(101), _) => bad.push("exit code 101 (a Rust panic)".to_string()),
        (Some(_), _) => {}
        (None, sig) => bad.push(format!("killed by signal {sig:?}")),
    }
    let trimmed = out.stderr.trim();
    if trimmed.is_empty() {
        bad.push("stderr is empty".to_string());
    } else if trimmed.lines().count() != 1 {
        bad.push(format!(
            "stderr has {} lines, expected exactly one",
            trimmed.lines().count()
        ));
    }
    let lower = out.stderr.to_lowercase();
    for word in ["panicked", "backtrace"] {
        if lower.contains(word) {
            bad.push(format!("stderr contains {word:?}"));
        }
    }
    if let Some(needle) = needle {
        if !lower.contains(&needle.to_lowercase()) {
            bad.push(format!("stderr does not mention {needle:?}"));
        }
    }
    bad
}

pub fn assert_error_contract(out: &RunOutput, needle: Option<&str>) {
    let bad = error_contract_violations(out, needle);
    assert!(
        bad.is_empty(),
        "error contract violated: {}\n{}",
        bad.join("; "),
        out.describe()
    );
}

/// The snapshot directories under `out`, oldest first (hidden partial ones left out).
pub fn snapshot_dirs(out: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(out)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.is_dir() && !d.file_name().unwrap().to_string_lossy().starts_with('.'));
    dirs.sort();
    dirs
}
/// Runs `cmd` (stdin and stdout null, stderr to `stderr_file`) until it exits, calling
/// `at_first_line` once, within a few milliseconds of its first line on stderr (pyfleet's first
/// line comes when it starts sampling). Returns its exit status (None: killed after `timeout`)
/// and what it wrote to stderr.
pub fn run_marking_first_line(
    mut cmd: Command,
    stderr_file: &Path,
    timeout: Duration,
    mut at_first_line: impl FnMut(),
) -> (Option<ExitStatus>, String) {
    let file = fs::File::create(stderr_file).expect("stderr file");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
    let mut child = cmd.spawn().expect("spawn");
    let deadline = Instant::now() + timeout;
    let (mut marked, mut status) = (false, None);
    while status.is_none() && Instant::now() < deadline {
        if !marked && fs::read_to_string(stderr_file).is_ok_and(|text| text.contains('\n')) {
            at_first_line();
            marked = true;
        }
        status = child.try_wait().expect("waitpid");
        thread::sleep(Duration::from_millis(2));
    }
    if status.is_none() {
        let _ = child.kill();
    }
    // Reaps it (a child that exited returns at once).
    let _ = child.wait();
    if status.is_some() && !marked {
        // It said nothing before it exited: mark the end, so callers still get a window.
        at_first_line();
    }
    (status, fs::read_to_string(stderr_file).unwrap_or_default())
}
