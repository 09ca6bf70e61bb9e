//! Whether `top`'s terminal is still there: a wait for a key that ends when the terminal hangs
//! up, and a watch that ends the process when the screen cannot end itself.
//!
//! crossterm's reader loops without end, at a whole core, once the terminal it reads has hung
//! up: its read returns at once with nothing, or with an error it retries. So the screen waits
//! for input here ([`KeyInput::wait`]) and asks crossterm to read only when there is some; a
//! hang-up ends the screen with an error instead. A hang-up in the moment between that wait and
//! crossterm's read still traps the screen, and so may anything else that blocks it: the
//! [`Watch`] thread notices the hang-up (or a stop asked for by a signal) on its own and, when
//! the screen has not ended [`GRACE`] later, ends the process.

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::IsTerminal;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the screen has to end after a hang-up or a stop, before the watch ends the process.
pub const GRACE: Duration = Duration::from_secs(2);
/// How often the watch looks.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What a wait for input found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Something to read (crossterm's read will not block).
    Ready,
    /// Nothing within the wait.
    Quiet,
    /// The terminal hung up (or its descriptor failed): nothing will ever come.
    HungUp,
}

/// The terminal crossterm reads keys from: standard input when it is a terminal, else
/// `/dev/tty` (crossterm's own choice).
pub struct KeyInput {
    dev_tty: Option<OwnedFd>,
}

impl KeyInput {
    pub fn open() -> Result<KeyInput> {
        let dev_tty = if std::io::stdin().is_terminal() {
            None
        } else {
            let tty = std::fs::OpenOptions::new()
                .read(true)
                .open("/dev/tty")
                .context("cannot open the terminal (/dev/tty) for keys")?;
            Some(OwnedFd::from(tty))
        };
        Ok(KeyInput { dev_tty })
    }

    /// Waits up to `timeout` for input.
    pub fn wait(&self, timeout: Duration) -> Result<Input> {
        let stdin = std::io::stdin();
        let fd = match &self.dev_tty {
            Some(tty) => tty.as_fd(),
            None => stdin.as_fd(),
        };
        wait_for_input(fd, timeout).context("cannot read the terminal")
    }
}

/// Waits up to `timeout` for `fd` to have input or to hang up.
fn wait_for_input(fd: BorrowedFd<'_>, timeout: Duration) -> nix::Result<Input> {
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok(Input::Quiet),
        Err(e) => return Err(e),
    }
    let revents = fds[0].revents().unwrap_or(PollFlags::empty());
    Ok(
        if revents.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL) {
            Input::HungUp
        } else if revents.contains(PollFlags::POLLIN) {
            Input::Ready
        } else {
            Input::Quiet
        },
    )
}

/// Whether `fd` has hung up, now.
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    matches!(wait_for_input(fd, Duration::ZERO), Ok(Input::HungUp))
}

/// The watch over the screen: a thread that sets `stop` when standard output (the terminal
/// drawn on) hangs up, and ends the process with status 1 when `stop` has been set for
/// [`GRACE`] and the screen has not ended. Dropping it tells the thread the screen ended.
pub struct Watch {
    screen_ended: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    pub fn start(stop: Arc<AtomicBool>) -> Result<Watch> {
        let screen_ended = Arc::new(AtomicBool::new(false));
        let ended = screen_ended.clone();
        let thread = std::thread::Builder::new()
            .name("pyfleet-top-watch".into())
            .spawn(move || watch(&stop, &ended))
            .context("cannot start the terminal's watch")?;
        Ok(Watch {
            screen_ended,
            thread: Some(thread),
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.screen_ended.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(stop: &AtomicBool, screen_ended: &AtomicBool) {
    let stdout = std::io::stdout();
    let mut stopping_since: Option<Instant> = None;
    while !screen_ended.load(Ordering::Relaxed) {
        if hung_up(stdout.as_fd()) {
            stop.store(true, Ordering::Relaxed);
        }
        if stop.load(Ordering::Relaxed) {
            let since = *stopping_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= GRACE {
                // The terminal is likely gone, so this line may reach no one; the status does.
                eprintln!("pyfleet: the screen did not end within {GRACE:?} of a stop or of the terminal hanging up; ending the process");
                std::process::exit(1);
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}
