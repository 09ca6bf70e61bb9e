//! Long-running processes (targets), owned by guards that kill and reap them; what a
//! profile of a known target must show.

use super::*;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

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

/// tests/targets/shifting.py on any interpreter, once running: a thread spinning in `alpha`
/// for `share` of its time (a number from 0 to 1, changed by writing the target's `share`
/// file) and in `beta` for the rest; its own seconds in each in its `times` file.
pub fn shifting(share: &str) -> Proc {
    let interp = any_interpreter();
    let mut t = Proc::python(
        &interp.label,
        &interp.path,
        "shifting.py",
        &["ready", "share", "times"],
    );
    std::fs::write(t.dir().join("share"), format!("{share}\n")).expect("the share file");
    t.wait_for_file("ready", READY_TIMEOUT);
    t
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

/// The runs of tests/targets/launched.py a `-- COMMAND` test makes: one interpreter of each
/// version 3.11-3.15, the 3.15 one with a multiprocessing pool (`true`). Fails when none is
/// found.
pub fn launched_cases() -> Vec<(Interp, bool)> {
    let mut cases: Vec<(Interp, bool)> = Vec::new();
    for interp in interpreters() {
        if (11..=15).contains(&interp.minor) && !cases.iter().any(|(i, _)| i.minor == interp.minor)
        {
            let pool = interp.minor == 15;
            cases.push((interp, pool));
        }
    }
    assert!(!cases.is_empty(), "no 3.11-3.15 interpreter found");
    cases
}

/// `-- PYTHON launched.py [pool]`: what follows a command's options to start one of
/// [`launched_cases`].
pub fn launched_command(interp: &Interp, pool: bool) -> Vec<String> {
    let mut command = vec![
        "--".to_string(),
        interp.path.display().to_string(),
        target_script("launched.py").display().to_string(),
    ];
    if pool {
        command.push("pool".into());
    }
    command
}
