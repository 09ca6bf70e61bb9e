//! A program `record` or `run` starts itself (`pyfleet record -- COMMAND ARGS...`).
//!
//! Contract. [`Launched::spawn`] starts the program with pyfleet's standard streams, in
//! pyfleet's process group (so a Ctrl-C at the terminal reaches it as it would without
//! pyfleet), and stops it at once (SIGSTOP): it runs only once [`Launched::release`] says the
//! recorder is ready, so that its first moments are recorded too. Its exit status, once it
//! exited, is [`Launched::exit_code`]: its code, or 128 plus the signal that ended it, as a
//! shell reports it.

use anyhow::{anyhow, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pyfleet_policies::MatchPolicy;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// How often the host is scanned while a program started here runs: its Python subprocesses
/// are profiled from their first moments.
pub const SCAN: Duration = Duration::from_millis(50);

/// The program and what became of it.
pub struct Launched {
    child: Child,
    status: Option<ExitStatus>,
}

impl Launched {
    /// Starts `command` (its first word looked up on PATH) and stops it; a one-line error when
    /// it cannot be started.
    pub fn spawn(command: &[String]) -> Result<Launched> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| anyhow!("give the program to start after --"))?;
        let child = Command::new(program).args(args).spawn().map_err(|e| {
            anyhow!(
                "cannot start {}: {e}",
                pyfleet::output::for_terminal(program)
            )
        })?;
        let launched = Launched {
            child,
            status: None,
        };
        launched.signal(Signal::SIGSTOP);
        Ok(launched)
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

    /// Lets the program run.
    pub fn release(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Sends the program `signal` (nothing if it is gone).
    pub fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.pid()), signal);
    }

    /// Whether the program exited (it is reaped then).
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
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
/// stay stopped: it is killed, and reaped.
impl Drop for Launched {
    fn drop(&mut self) {
        if !self.exited() {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}
