//! A program `record` or `run` starts itself (`pyfleet record -- COMMAND ARGS...`).
//!
//! Contract.
//! - [`Launched::spawn`] starts a *gate* first: pyfleet's own binary (`/proc/self/exe
//!   GATE_ARG ...`), with pyfleet's standard streams, in pyfleet's process group (so a Ctrl-C
//!   at the terminal reaches it as it would without pyfleet). The gate waits on a pipe only
//!   pyfleet writes: one byte ([`Launched::release`], once the recorder is ready, so the
//!   program's first moments are recorded) and it becomes the program (`exec`, same pid); end
//!   of file (pyfleet is gone, whatever ended it) and it exits without starting it. The gate
//!   asks the kernel to kill it, and the program it becomes, when pyfleet dies
//!   (`PR_SET_PDEATHSIG`), so no signal to pyfleet, at any instant, leaves the program stopped
//!   or running without pyfleet. Nothing is ever stopped with SIGSTOP.
//! - Signal dispositions are an interactive shell's for a job it runs: SIGINT and SIGTERM,
//!   which pyfleet always takes (see [`StopSignals`]), reach the program at their default (exec
//!   resets handlers), even when pyfleet was started with them ignored (a script's background
//!   job): a program that ignored SIGINT while pyfleet waited for it to end on one would never
//!   end. SIGHUP ignored when pyfleet started (`nohup`) stays ignored, by pyfleet and by the
//!   program.
//! - While it runs, SIGTERM is passed on at once; SIGINT and SIGHUP, which a terminal sends
//!   to the whole process group, are passed on only if the program has not ended
//!   [`GRACE`] later (one sent to pyfleet alone); a program still running [`GRACE`] after
//!   that is sent SIGTERM, then SIGKILL (each said on stderr).
//! - Its exit status, once it exited, is [`Launched::exit_code`]: its code, or 128 plus the
//!   signal that ended it, as a shell reports it. A program pyfleet gives up on (dropped
//!   before it exited) is killed and reaped.

use anyhow::{anyhow, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyfleet_policies::MatchPolicy;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How often the host is scanned while a program started here runs: its Python subprocesses
/// are profiled from their first moments.
pub const SCAN: Duration = Duration::from_millis(50);

/// The first argument that makes pyfleet's binary the gate of a program (see the module
/// documentation); `main` looks for it before anything else.
pub const GATE_ARG: &str = "__pyfleet-launch-gate";

/// How long a program has to end by itself after a SIGINT or SIGHUP that pyfleet got, before
/// pyfleet passes the signal on; and each later step (SIGTERM, SIGKILL).
pub const GRACE: Duration = Duration::from_secs(5);

/// Exit status of a gate whose pyfleet went away before releasing it.
const GATE_ABANDONED: i32 = 125;
/// Exit status of a gate that could not start its program (as a shell's for "not found").
const GATE_CANNOT_EXEC: i32 = 127;

/// The program and what became of it.
pub struct Launched {
    child: Child,
    status: Option<ExitStatus>,
    /// The read end of the gate's pipe: the gate reopens it through /proc, maybe only after
    /// the release, so it stays open here while the program may not have exec'd yet.
    gate_read: Option<std::os::fd::OwnedFd>,
    /// The write end, until the program is released or abandoned.
    gate_write: Option<std::fs::File>,
    /// What is done next to a program that did not end on a signal, and when.
    escalation: Option<(Instant, Signal)>,
}

impl Launched {
    /// Starts `command`'s gate (its first word looked up on PATH now, so a program that cannot
    /// be started is a one-line error before anything runs).
    pub fn spawn(command: &[String]) -> Result<Launched> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| anyhow!("give the program to start after --"))?;
        let cannot = |e: &dyn std::fmt::Display| {
            anyhow!(
                "cannot start {}: {e}",
                pyfleet::output::for_terminal(program)
            )
        };
        executable(program).map_err(|e| cannot(&e))?;
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| cannot(&e))?;
        let read_fd = std::os::fd::AsRawFd::as_raw_fd(&read_end);
        // Under sudo, the program runs as the user who ran sudo, not as root.
        let user = pyfleet::output::Owner::sudo_invoker()
            .map_or_else(|| "-".to_string(), |o| format!("{}:{}", o.uid, o.gid));
        let child = Command::new("/proc/self/exe")
            .arg(GATE_ARG)
            .arg(std::process::id().to_string())
            .arg(read_fd.to_string())
            .arg(user)
            .arg(program)
            .args(args)
            .spawn()
            .map_err(|e| cannot(&e))?;
        Ok(Launched {
            child,
            status: None,
            gate_read: Some(read_end),
            gate_write: Some(std::fs::File::from(write_end)),
            escalation: None,
        })
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// What to profile: this program by its pid (its Python descendants come with
    /// `--subprocesses`, which a program started here always has), never pyfleet itself.
    pub fn policy(&self) -> Result<MatchPolicy> {
        Ok(MatchPolicy::new(
            &[] as &[String],
            [] as [&str; 0],
            &[self.pid()],
            Some(std::process::id() as i32),
        )?)
    }

    /// Lets the program start (once; a gate that already ended is not an error).
    pub fn release(&mut self) {
        if let Some(mut write) = self.gate_write.take() {
            let _ = write.write_all(b"go");
        }
    }

    /// pyfleet was told to stop (`signal`) before it released the program: the gate exits
    /// without starting it, and pyfleet's exit status says the signal (128 plus its number).
    pub fn abandon(&mut self, signal: Signal) {
        (self.gate_write, self.gate_read) = (None, None);
        let _ = self.child.wait();
        self.status = Some(ExitStatus::from_raw(signal as i32));
    }

    /// Sends the program `signal` (nothing if it is gone).
    pub fn signal(&self, signal: Signal) {
        if self.status.is_none() {
            let _ = kill(Pid::from_raw(self.pid()), signal);
        }
    }

    /// pyfleet got `signal` (one of [`StopSignals`]'): SIGTERM is passed on now, SIGINT and
    /// SIGHUP after [`GRACE`] if the program has not ended by then (see [`Launched::escalate`]).
    pub fn heard(&mut self, signal: Signal) {
        let now = Instant::now();
        let next = match signal {
            Signal::SIGTERM => {
                self.signal(Signal::SIGTERM);
                (now + GRACE, Signal::SIGKILL)
            }
            other => (now + GRACE, other),
        };
        // A later signal never puts off a step already planned.
        if self.escalation.is_none_or(|(at, _)| next.0 < at) {
            self.escalation = Some(next);
        }
    }

    /// Takes the step that is due for a program that did not end on a signal: the signal
    /// passed on, then SIGTERM, then SIGKILL, [`GRACE`] apart. Called at every tick.
    pub fn escalate(&mut self) {
        let Some((at, signal)) = self.escalation else {
            return;
        };
        if Instant::now() < at || self.exited() {
            return;
        }
        pyfleet::logging::note(&format!(
            "the program (pid {}) did not end within {} s: sending it {}",
            self.pid(),
            GRACE.as_secs(),
            signal.as_str()
        ));
        self.signal(signal);
        self.escalation = match signal {
            Signal::SIGKILL => None,
            Signal::SIGTERM => Some((Instant::now() + GRACE, Signal::SIGKILL)),
            _ => Some((Instant::now() + GRACE, Signal::SIGTERM)),
        };
    }

    /// Whether the program (or its gate) exited (it is reaped then).
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        if self.status.is_some() {
            (self.gate_write, self.gate_read) = (None, None);
        }
        self.status.is_some()
    }

    /// Waits for the program to exit; its exit status as a shell reports it (1 when it cannot
    /// be had).
    pub fn exit_code(&mut self) -> i32 {
        let status = match self.status {
            Some(s) => s,
            None => match self.child.wait() {
                Ok(s) => s,
                Err(_) => return 1,
            },
        };
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1)
    }
}

/// A program pyfleet gave up on before it exited (an error while starting to record) does not
/// stay behind: it is killed, and reaped.
impl Drop for Launched {
    fn drop(&mut self) {
        (self.gate_write, self.gate_read) = (None, None);
        if !self.exited() {
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Whether `program` can be started as `execvp` would find it: a path (with a `/`) to an
/// executable file, or a name found as one on PATH.
fn executable(program: &str) -> std::io::Result<PathBuf> {
    let is_executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let not_found = || std::io::Error::from(std::io::ErrorKind::NotFound);
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(e) => Err(e),
            Ok(_) if is_executable(&path) => Ok(path),
            Ok(_) => Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(not_found)
}

/// The gate (see the module documentation), run by `main` when pyfleet's binary was started
/// as `pyfleet GATE_ARG PARENT-PID FD USER PROGRAM ARGS...` (USER: `UID:GID` to become
/// before the program, or `-`). It never returns: it becomes the program, or exits.
pub fn gate(args: &[OsString]) -> ! {
    let quit = |code: i32, why: &str| -> ! {
        if !why.is_empty() {
            eprintln!("pyfleet: {why}");
        }
        std::process::exit(code)
    };
    let word = |i: usize| args.get(i).and_then(|a| a.to_str());
    let number = |i: usize| -> Option<i32> { word(i)?.parse().ok() };
    let user = match word(2) {
        Some("-") => Some(None),
        Some(ids) => ids
            .split_once(':')
            .and_then(|(u, g)| Some(Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))),
        None => None,
    };
    let (Some(parent), Some(fd), Some(user), Some(program)) =
        (number(0), number(1), user, args.get(3))
    else {
        quit(2, "the launch gate is pyfleet's own: it is not run by hand")
    };
    // The pipe is opened while the gate may still read pyfleet's descriptors (it becomes the
    // user next); then it is killed with pyfleet (the kernel forgets that on a change of user,
    // so it is asked after); a pyfleet already gone (the gate was handed to init) releases
    // nothing.
    let pipe = std::fs::File::open(format!("/proc/{parent}/fd/{fd}"));
    let mut environment = Vec::new();
    if let Some((uid, gid)) = user {
        match super::privileges::become_user(uid, gid) {
            Ok(vars) => environment = vars,
            Err(e) => quit(
                GATE_CANNOT_EXEC,
                &format!("cannot run the program as uid {uid}: {e}"),
            ),
        }
    }
    if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err()
        || nix::unistd::getppid().as_raw() != parent
    {
        quit(GATE_ABANDONED, "")
    }
    let released = pipe
        .and_then(|mut pipe| {
            let mut byte = [0u8; 1];
            pipe.read(&mut byte)
        })
        .is_ok_and(|n| n == 1);
    if !released {
        quit(GATE_ABANDONED, "")
    }
    let e = Command::new(program)
        .args(&args[4..])
        .envs(environment)
        .exec();
    quit(
        GATE_CANNOT_EXEC,
        &format!(
            "cannot start {}: {e}",
            pyfleet::output::for_terminal(&program.to_string_lossy())
        ),
    )
}

/// The stop signals (SIGINT, SIGTERM, SIGHUP) blocked on the main thread from the daemon's
/// first step until [`StopSignals`] takes them: one that arrives meanwhile waits for it (the
/// daemon then ends as asked, once running), and the threads made meanwhile (the async
/// runtime's, which inherit the mask) never take one: every signal reaches the main thread.
pub struct HeldSignals(nix::sys::signal::SigSet);

impl HeldSignals {
    pub fn hold() -> Result<HeldSignals> {
        use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
        let mut set = SigSet::empty();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(sig);
        }
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)
            .context("cannot hold the stop signals")?;
        Ok(HeldSignals(set))
    }

    /// Lets the held signals in, once [`StopSignals`] is installed (on the main thread).
    pub fn release(self) -> Result<()> {
        use nix::sys::signal::{pthread_sigmask, SigmaskHow};
        pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&self.0), None)
            .context("cannot take the stop signals")
    }
}

/// The signals that end a recording or a run, as streams, installed before a program is started
/// (so it gets them at their default). SIGINT and SIGTERM are always taken; SIGHUP ignored when
/// pyfleet started (`nohup`) is not (it stays ignored, for the program too).
pub struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Takes SIGINT, SIGTERM and, with `hangup`, SIGHUP. Needs the async runtime's context.
    pub fn install(hangup: bool) -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let take = |kind: SignalKind, sig: Signal| {
            signal(kind).with_context(|| format!("cannot handle {}", sig.as_str()))
        };
        let hangup_ignored = pyfleet::host::ignored_signals()
            .is_some_and(|mask| mask & (1u64 << (Signal::SIGHUP as i32 - 1)) != 0);
        Ok(StopSignals {
            interrupt: take(SignalKind::interrupt(), Signal::SIGINT)?,
            terminate: take(SignalKind::terminate(), Signal::SIGTERM)?,
            hangup: match hangup && !hangup_ignored {
                true => Some(take(SignalKind::hangup(), Signal::SIGHUP)?),
                false => None,
            },
        })
    }

    /// The next signal to arrive.
    pub async fn next(&mut self) -> Signal {
        let hangup = async {
            match self.hangup.as_mut() {
                Some(stream) => stream.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = hangup => Signal::SIGHUP,
        }
    }

    /// A signal that arrived already, if any (without waiting).
    pub async fn arrived(&mut self) -> Option<Signal> {
        tokio::select! {
            biased;
            sig = self.next() => Some(sig),
            _ = std::future::ready(()) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_execvp_would() {
        assert!(executable("sh").is_ok());
        assert!(executable("/bin/sh").is_ok());
        assert_eq!(
            executable("/nonexistent/program").map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        );
        assert_eq!(
            executable("no-such-program-pyfleet").map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound)
        );
        // A file that is not executable, and a directory.
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "not a program").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(executable(plain.to_str().unwrap()).is_err());
        assert!(executable(dir.path().to_str().unwrap()).is_err());
    }
}
