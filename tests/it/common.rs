//! Shared helpers for the integration tests that run pyfleet against real CPython processes.
//!
//! Every process a test starts is owned by a guard that kills (SIGKILL) and reaps it on drop,
//! also when the test panics.  Every wait polls with a deadline and fails with a message that
//! says what was awaited.
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a single pyfleet invocation may take before the test fails.
pub const PYFLEET_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a target may take to write its ready/expectation file.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// The machine, shared by the tests of one binary
// ---------------------------------------------------------------------------------------------

/// Every test holds the machine while it runs: many tests share it, or one has it alone.
static MACHINE: RwLock<()> = RwLock::new(());

/// A test's hold on the machine, released when dropped (at the end of the test, also when it
/// panics).
pub enum Machine {
    Alone(RwLockWriteGuard<'static, ()>),
    Shared(RwLockReadGuard<'static, ()>),
}

/// The machine to this test alone: it starts once every running test has ended, and no other
/// test starts before it ends. For a test whose assertions depend on the machine's load (shares
/// of samples or of on-CPU time, exactness against a reference recorded at the same time,
/// timings), one that loads the machine itself (busy workers, HTTP load), or one that matches
/// processes host-wide (`--match gunicorn`). A panic in such a test does not stop the others.
pub fn alone() -> Machine {
    Machine::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner()))
}

/// The machine shared with the other tests that share it (the cargo test default: as many at
/// once as `--test-threads`); waits while a test has it `alone()`.
pub fn shared() -> Machine {
    Machine::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner()))
}

// ---------------------------------------------------------------------------------------------
// What the tests need from outside the repository
// ---------------------------------------------------------------------------------------------

/// The scripts that provide what the tests need (scripts/test.sh runs every one).
pub const SETUP_PYTHONS: &str = "scripts/setup-pythons.sh";
pub const SETUP_VENVS: &str = "scripts/setup-venvs.sh";
pub const SETUP_LIBS: &str = "scripts/setup-libs.sh";
pub const SETUP_DEPLOY_TOOLS: &str = "scripts/setup-deploy-tools.sh";
pub const SETUP_FORMAT_TOOLS: &str = "scripts/setup-format-tools.sh";

/// Something a test needs from outside the repository that is not there.
#[derive(Debug)]
pub struct Missing {
    /// A program, a venv, a file or an interpreter (with where it was looked for).
    pub what: String,
    /// What provides it: one of the setup scripts (`SETUP_*`), or what to install.
    pub setup: String,
    /// What the test leaves out without it: None, the whole test; else that part of it (an
    /// interpreter's runs, say).
    pub part: Option<String>,
}

fn allow_missing() -> bool {
    std::env::var("PYFLEET_ALLOW_MISSING").is_ok_and(|v| v == "1")
}

/// The test running on this thread (libtest names each test's thread after the test).
fn this_test() -> String {
    match thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => "this test".to_string(),
    }
}

/// The one place where a test meets something missing (interpreters, tools, venvs, files).
/// Without PYFLEET_ALLOW_MISSING=1, as in CI (scripts/test.sh does not set it), the test fails
/// here, with one line naming what is missing and what provides it. With it, one line on stderr
/// per missing thing (also when the harness captures the test's output) says what the test skips, and the caller skips it: returns from the test,
/// or leaves out the part (`Missing::part`).
#[track_caller]
pub fn skip_or_fail(missing: &[Missing]) {
    if missing.is_empty() {
        return;
    }
    if !allow_missing() {
        let each: Vec<String> = missing
            .iter()
            .map(|m| format!("{} missing: {} installs it", m.what, m.setup))
            .collect();
        panic!(
            "{} (PYFLEET_ALLOW_MISSING=1 skips what needs it)",
            each.join("; ")
        );
    }
    let test = this_test();
    for m in missing {
        let part = m
            .part
            .as_ref()
            .map(|p| format!(" on {p}"))
            .unwrap_or_default();
        let line = format!(
            "PYFLEET_ALLOW_MISSING=1: skipping {test}{part}: {} missing ({} installs it)\n",
            m.what, m.setup
        );
        // Straight to stderr in one write, not through `eprintln!`, which the test harness
        // captures (and shows only for a test that fails): a skip must be seen.
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// A program on PATH that `setup` installs; None (the test returns) only when it is missing
/// and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn tool(name: &str, setup: &str) -> Option<PathBuf> {
    let found = on_path(name);
    if found.is_none() {
        skip_or_fail(&[Missing {
            what: name.to_string(),
            setup: setup.to_string(),
            part: None,
        }]);
    }
    found
}

/// A file that `setup` makes (a venv's program, a schema), described as `what`; None (the test
/// returns) only when it is missing and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn provided(what: &str, path: PathBuf, setup: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    skip_or_fail(&[Missing {
        what: format!("{what} ({})", path.display()),
        setup: setup.to_string(),
        part: None,
    }]);
    None
}

/// `${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}`: the venvs the setup scripts make.
pub fn venvs_dir() -> PathBuf {
    match std::env::var_os("PYFLEET_VENVS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => home().join(".cache/pyfleet/venvs"),
    }
}

// ---------------------------------------------------------------------------------------------
// Interpreters
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Interp {
    pub label: String,
    /// 11..=15
    pub minor: u32,
    pub path: PathBuf,
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| OsString::from("/root")))
}

/// `${PYFLEET_PYTHONS:-$HOME/.cache/pyfleet/pythons}`
pub fn pythons_dir() -> PathBuf {
    match std::env::var_os("PYFLEET_PYTHONS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => home().join(".cache/pyfleet/pythons"),
    }
}

/// The newest `~/.pyenv/versions/3.<minor>.<micro>/bin/python3.<minor>` (plain releases only:
/// `3.13.0` yes, `3.13.0t` or `3.13-dev` no).
fn newest_pyenv(minor: u32) -> Option<PathBuf> {
    let versions = home().join(".pyenv/versions");
    let prefix = format!("3.{minor}.");
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in fs::read_dir(&versions).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(micro) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Ok(micro) = micro.parse::<u32>() else {
            continue;
        };
        let exe = entry.path().join(format!("bin/python3.{minor}"));
        if exe.is_file() && best.as_ref().is_none_or(|(m, _)| micro > *m) {
            best = Some((micro, exe));
        }
    }
    best.map(|(_, p)| p)
}

/// Every supported interpreter, in order: found, or what is missing.
fn lookup_interpreters() -> Vec<Result<Interp, Missing>> {
    let pythons = pythons_dir();
    let pyenv = |minor: u32| {
        (
            newest_pyenv(minor),
            format!("~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"),
            format!("`pyenv install 3.{minor}`"),
        )
    };
    let unstable = |minor: u32| {
        let path = pythons.join(format!("3.{minor}/usr/bin/python3.{minor}"));
        let wanted = path.display().to_string();
        (Some(path), wanted, SETUP_PYTHONS.to_string())
    };
    let candidates = vec![
        (
            "3.11-debian",
            11,
            (
                Some(PathBuf::from("/usr/bin/python3.11")),
                "/usr/bin/python3.11".to_string(),
                "Debian's python3.11 package".to_string(),
            ),
        ),
        ("3.11-pyenv", 11, pyenv(11)),
        ("3.12-pyenv", 12, pyenv(12)),
        ("3.13-pyenv", 13, pyenv(13)),
        ("3.14", 14, unstable(14)),
        ("3.15", 15, unstable(15)),
    ];
    candidates
        .into_iter()
        .map(|(label, minor, (path, wanted, setup))| match path {
            Some(p) if p.is_file() => Ok(Interp {
                label: label.to_string(),
                minor,
                path: p,
            }),
            _ => Err(Missing {
                what: format!("Python {label} ({wanted})"),
                setup,
                part: Some(label.to_string()),
            }),
        })
        .collect()
}

/// The interpreters every exactness test runs against. A missing one fails the test, naming
/// it and what provides it, unless `PYFLEET_ALLOW_MISSING=1`: then the test leaves it out
/// (see `skip_or_fail`).
#[track_caller]
pub fn interpreters() -> Vec<Interp> {
    let (found, missing): (Vec<_>, Vec<_>) =
        lookup_interpreters().into_iter().partition(Result::is_ok);
    skip_or_fail(
        &missing
            .into_iter()
            .filter_map(Result::err)
            .collect::<Vec<_>>(),
    );
    found.into_iter().filter_map(Result::ok).collect()
}

/// Some supported interpreter, for tests that need just one Python (does not require the
/// others to be provisioned).
pub fn any_interpreter() -> Interp {
    let path = newest_pyenv(12).expect("no ~/.pyenv/versions/3.12.*/bin/python3.12");
    Interp {
        label: "3.12-pyenv".to_string(),
        minor: 12,
        path,
    }
}

/// One interpreter by label; None only when it is missing and PYFLEET_ALLOW_MISSING=1 (the
/// test leaves out what needs it; see `skip_or_fail`).
#[track_caller]
pub fn interpreter(label: &str) -> Option<Interp> {
    match lookup_interpreters()
        .into_iter()
        .find(|i| match i {
            Ok(interp) => interp.label == label,
            Err(missing) => missing.part.as_deref() == Some(label),
        })
        .unwrap_or_else(|| panic!("no interpreter is labelled {label}"))
    {
        Ok(interp) => Some(interp),
        Err(missing) => {
            skip_or_fail(&[missing]);
            None
        }
    }
}

/// pyenv's newest python3.10 (not supported by pyfleet; used for the unsupported-version test).
pub fn python310() -> Option<PathBuf> {
    newest_pyenv(10)
}

/// Like `python310()`; None (the test returns) only when it is missing and
/// PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn require_python310() -> Option<PathBuf> {
    let found = python310();
    if found.is_none() {
        skip_or_fail(&[Missing {
            what: "Python 3.10-pyenv (~/.pyenv/versions/3.10.*/bin/python3.10)".to_string(),
            setup: "`pyenv install 3.10`".to_string(),
            part: None,
        }]);
    }
    found
}

pub fn targets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/targets")
}

pub fn target_script(name: &str) -> PathBuf {
    let p = targets_dir().join(name);
    assert!(p.is_file(), "target script {} does not exist", p.display());
    p
}

// ---------------------------------------------------------------------------------------------
// Misc
// ---------------------------------------------------------------------------------------------

/// A token unique to this test run and call (for markers in command lines).
pub fn unique_token(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}{:x}{:x}{n}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("cannot create a temporary directory")
}

/// Where a test may keep files for a human to look at after a failure.
pub fn artifacts_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("pyfleet-tests")
        .join(test);
    fs::create_dir_all(&dir).expect("cannot create the artifacts directory");
    dir
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------------
// Signals and /proc
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Long-running processes (targets)
// ---------------------------------------------------------------------------------------------

/// A spawned long-running process with stdout/stderr in files of its own temporary
/// directory.  SIGKILLed and reaped on drop.
pub struct Proc {
    child: Child,
    reaped: Option<ExitStatus>,
    dir: tempfile::TempDir,
    pub what: String,
}

impl Proc {
    /// Spawn `program args...` in its own temporary directory `dir()` (its working directory,
    /// so relative paths in `args` land there); stdin is /dev/null, stdout/stderr go to files
    /// in `dir()`.
    pub fn spawn<S: AsRef<OsStr>>(what: &str, program: &Path, args: &[S]) -> Proc {
        Proc::spawn_with(what, program, args, |_| {})
    }

    pub fn spawn_with<S: AsRef<OsStr>>(
        what: &str,
        program: &Path,
        args: &[S],
        configure: impl FnOnce(&mut Command),
    ) -> Proc {
        let dir = tempdir("pyfleet-target-");
        let stdout = fs::File::create(dir.path().join("stdout")).unwrap();
        let stderr = fs::File::create(dir.path().join("stderr")).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        configure(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot spawn {}: {e}", program.display()));
        Proc {
            child,
            reaped: None,
            dir,
            what: what.to_string(),
        }
    }

    /// Spawn a Python target script from tests/targets with a clean Python environment.
    pub fn python<S: AsRef<OsStr>>(
        interp_label: &str,
        python: &Path,
        script: &str,
        args: &[S],
    ) -> Proc {
        let script = target_script(script);
        let mut all: Vec<OsString> = vec![script.into_os_string()];
        all.extend(args.iter().map(|a| a.as_ref().to_os_string()));
        let what = format!("{} [{interp_label}]", all[0].to_string_lossy());
        Proc::spawn_with(&what, python, &all, |cmd| {
            for var in [
                "PYTHONPATH",
                "PYTHONHOME",
                "PYTHONSTARTUP",
                "PYTHONSAFEPATH",
                "PYTHONWARNINGS",
            ] {
                cmd.env_remove(var);
            }
            cmd.env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONUTF8", "1");
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&fs::read(self.dir().join("stdout")).unwrap_or_default())
            .into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&fs::read(self.dir().join("stderr")).unwrap_or_default())
            .into_owned()
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped = Some(status);
            }
        }
        self.reaped
    }

    /// Wait until `dir()/name` exists; panics (with the target's stderr) if the target exits
    /// first or the timeout passes.
    pub fn wait_for_file(&mut self, name: &str, timeout: Duration) -> PathBuf {
        let path = self.dir().join(name);
        self.wait_for_path(&path, timeout);
        path
    }

    /// Like `wait_for_file` for any path.
    pub fn wait_for_path(&mut self, path: &Path, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if path.exists() {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "{}: exited ({status}) before writing {}\n--- its stderr ---\n{}",
                    self.what,
                    path.display(),
                    self.stderr()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: timed out after {timeout:?} waiting for {}\n--- its stderr ---\n{}",
                    self.what,
                    path.display(),
                    self.stderr()
                );
            }
            thread::sleep(POLL);
        }
    }

    /// Wait until /proc/PID/exe resolves to a file whose name starts with `exe_name_prefix`
    /// (i.e. the exec has happened).
    pub fn wait_for_exe(&mut self, exe_name_prefix: &str, timeout: Duration) {
        let pid = self.pid();
        let exe_link = format!("/proc/{pid}/exe");
        wait_until(
            timeout,
            &format!("{} (pid {pid}) to exec {exe_name_prefix}", self.what),
            || {
                fs::read_link(&exe_link)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .is_some_and(|n| n.starts_with(exe_name_prefix))
            },
            || format!("/proc/{pid}/exe -> {:?}", fs::read_link(&exe_link)),
        );
    }

    /// SIGKILL without reaping (the process stays a zombie until `reap()` or drop).
    pub fn kill_no_reap(&mut self) {
        if self.reaped.is_none() {
            send_signal(self.pid(), libc::SIGKILL);
        }
    }

    /// Wait for the process to be gone (after it was killed).
    pub fn reap(&mut self) -> ExitStatus {
        if let Some(s) = self.reaped {
            return s;
        }
        let status = self.child.wait().expect("waitpid failed");
        self.reaped = Some(status);
        status
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> ExitStatus {
        self.kill_no_reap();
        self.reap()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Short-lived commands (pyfleet) with a timeout
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
pub struct RunOutput {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
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

/// A running short-lived command whose output is being collected; killed and reaped on drop.
pub struct Running {
    child: Option<Child>,
    command: String,
    started: Instant,
    timeout: Duration,
    readers: Vec<thread::JoinHandle<Vec<u8>>>,
}

fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

impl Running {
    pub fn start(mut cmd: Command, timeout: Duration) -> Running {
        let command = command_line(&cmd);
        cmd.stdin(Stdio::null())
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
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
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
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
    let mut cmd = Command::new(pyfleet_exe());
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE");
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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// `GET path` over HTTP/1.0: (status, body), or None if the connection fails.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_with_token(port, path, None)
}

/// `GET path` over HTTP/1.0 with `Authorization: Bearer TOKEN` when given.
pub fn http_get_with_token(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
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

// gunicorn from the venvs `scripts/setup-venvs.sh` makes.

/// The python of the gunicorn venv `name` (`gunicorn-3.15`); None (the test returns) only when
/// it is missing and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn gunicorn_venv(name: &str) -> Option<PathBuf> {
    provided(
        &format!("venv {name}"),
        venvs_dir().join(name).join("bin/python"),
        SETUP_VENVS,
    )
}

/// Children of `pid` (gunicorn's workers).
pub fn children(pid: i32) -> std::collections::BTreeSet<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// A gunicorn master (serving `tests/targets/wsgi_app.py`) whose workers die with it (SIGKILL to all on drop), so that no worker
/// outlives the test and loads the machine for the next one.
pub struct Gunicorn(pub Proc);

impl Gunicorn {
    pub fn pid(&self) -> i32 {
        self.0.pid()
    }
}

impl Drop for Gunicorn {
    fn drop(&mut self) {
        let workers = children(self.0.pid());
        self.0.kill();
        for w in workers {
            try_signal(w, libc::SIGKILL);
        }
    }
}

/// gunicorn from a venv's `python` (`gunicorn_venv`), serving on `port` once its workers are up.
pub fn gunicorn(label: &str, python: &Path, port: u16, workers: u32) -> Gunicorn {
    let app_dir = targets_dir();
    let args: Vec<String> = vec![
        "-m".into(),
        "gunicorn".into(),
        "--workers".into(),
        workers.to_string(),
        "--bind".into(),
        format!("127.0.0.1:{port}"),
        "--chdir".into(),
        app_dir.display().to_string(),
        "wsgi_app:app".into(),
    ];
    let mut p = Proc::spawn(label, python, &args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while children(p.pid()).len() < workers as usize || http_get(port, "/").is_none() {
        assert!(
            Instant::now() < deadline,
            "{label} did not start: {}",
            p.stderr()
        );
        assert!(p.exited().is_none(), "{label} exited: {}", p.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    Gunicorn(p)
}

/// Clock ticks per second in /proc's times: the kernel's USER_HZ, 100 on x86 and arm64.
pub const CLOCK_TICKS: f64 = 100.0;

/// The process's CPU time so far (utime + stime, clock ticks).
pub fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the name start at 3 (state); utime is 14, stime 15.
    let n = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(14) + n(15)
}

/// A certificate authority made for one test by `openssl` (in `dir`): a server certificate
/// for 127.0.0.1 and a client certificate issued by it, and a client certificate of another,
/// untrusted CA. PEM files; keys unencrypted.
pub struct TestCa {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
}

impl TestCa {
    /// Makes the files, or None when `openssl` is missing (see `tool`).
    pub fn make(dir: &Path) -> Option<TestCa> {
        let openssl = tool("openssl", SETUP_DEPLOY_TOOLS)?;
        let p = |name: &str| dir.join(name);
        let run = |args: &[&str]| {
            let out = run_with_timeout(
                {
                    let mut c = Command::new(&openssl);
                    c.args(args).current_dir(dir);
                    c
                },
                Duration::from_secs(30),
            );
            assert!(out.success(), "openssl {args:?}: {}", out.describe());
        };
        let self_signed = |name: &str, cn: &str| {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ]);
        };
        let issued = |name: &str, cn: &str, extensions: &str| {
            run(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            fs::write(p(&format!("{name}.ext")), extensions).unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ]);
        };
        self_signed("ca", "pyfleet test CA");
        issued(
            "server",
            "127.0.0.1",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        issued(
            "client",
            "scraper",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        self_signed("rogue", "rogue scraper");
        Some(TestCa {
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.pem"),
            client_key: p("client.key"),
            rogue_cert: p("rogue.pem"),
            rogue_key: p("rogue.key"),
        })
    }
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

/// tests/targets/sleeper.py on any interpreter, its command line carrying `token`, once ready:
/// a Python process that stays idle.
pub fn idle_sleeper(token: &str) -> Proc {
    let interp = any_interpreter();
    let mut p = Proc::python(&interp.label, &interp.path, "sleeper.py", &["ready", token]);
    p.wait_for_file("ready", READY_TIMEOUT);
    p
}

/// Checks a wall-mode profile of tests/targets/launched.py (folded lines, of one file or
/// several): its first half second, `early_work`, has at least 20 samples (of about 50 at
/// 100 Hz, the rest allowing for the interpreter's start and a scan) and `late_work` at least
/// 75 (of 150);
/// with `pool`, the pool's two workers ran `pool_work`, each named after the program
/// (`launched-worker-PID`). Returns the two counts, or what was wrong.
pub fn check_launched_profile(text: &str, pool: bool) -> Result<(u64, u64), String> {
    let count = |function: &str| -> u64 {
        text.lines()
            .filter(|l| l.contains(&format!(";{function} (")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    let (early, late) = (count("early_work"), count("late_work"));
    if early < 20 || late < 75 {
        return Err(format!("early_work {early}, late_work {late} samples"));
    }
    if pool {
        let workers: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.contains(";pool_work ("))
            .filter_map(|l| l.split(';').next())
            .collect();
        if workers.len() != 2 || !workers.iter().all(|w| w.starts_with("launched-worker-")) {
            return Err(format!("pool workers: {workers:?}"));
        }
    }
    Ok((early, late))
}
