//! Pausing every thread of a target for a read that must be consistent (`--blocking`).
//!
//! [`Pauser::pause`] seizes each thread (`PTRACE_SEIZE`, which sends no signal), interrupts
//! it (`PTRACE_INTERRUPT`) and waits until it has stopped; the [`Paused`] guard it returns
//! detaches them all when dropped, handing back any signal that arrived while a thread was
//! stopped. While the guard lives no thread of the target runs Python code, so a read made
//! under it sees one instant.
//!
//! Contracts:
//! - **Never left paused.** Seized tracees resume when detached, and the kernel detaches
//!   them itself when the tracer thread exits or pyfleet is killed. A thread that did not
//!   stop within [`STOP_DEADLINE`] (stuck in an uninterruptible sleep) cannot be detached
//!   before it stops: it is remembered and detached by the next [`Pauser::pause`] or
//!   [`release_pending`] on the same OS thread, the moment it stops.
//! - **Bounded by pyfleet.** At most [`MAX_THREADS`] threads are paused; waiting for them to
//!   stop ends at [`STOP_DEADLINE`]; the list of threads is taken again until it holds still,
//!   at most [`MAX_ROUNDS`] times. A target with more threads, or threads that will not stop,
//!   gets an error, not a partial pause.
//! - **One OS thread.** ptrace's tracer is a thread, not a process: the pause, the reads under
//!   it and the detach run on the thread that called [`Pauser::pause`] (the guard is neither
//!   `Send` nor `Sync`).
//! - A target already traced (by a debugger, or another profiler's blocking mode) cannot be
//!   seized: [`MemoryError::AlreadyTraced`].

use super::MemoryError;
use std::cell::RefCell;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// Longest wait for every thread to stop.
pub const STOP_DEADLINE: Duration = Duration::from_millis(100);
/// Pause between checks for threads that have not stopped yet.
const POLL: Duration = Duration::from_micros(20);
/// Most threads of one target paused at once.
pub const MAX_THREADS: usize = 4096;
/// Most times the thread list is taken again (threads started while pausing).
pub const MAX_ROUNDS: usize = 4;
/// `PTRACE_EVENT_STOP`: the stop of `PTRACE_INTERRUPT` (or a group stop) of a seized thread.
const EVENT_STOP: i32 = 128;

thread_local! {
    /// Threads this OS thread seized that had not stopped when their pause gave up: they
    /// are detached as soon as they stop.
    static PENDING: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// Pauses one target process; keeps nothing between pauses but the pid.
#[derive(Debug)]
pub struct Pauser {
    pid: i32,
}

/// The target's threads, stopped until this is dropped.
#[derive(Debug)]
pub struct Paused {
    /// Stopped threads and the signal each must be given back when detached (0: none).
    stopped: Vec<(i32, i32)>,
    /// ptrace state belongs to this OS thread.
    _not_send: PhantomData<*const ()>,
}

/// How a wait for one thread ended.
enum Stop {
    /// Stopped; the signal to hand back on detach (0: none).
    Stopped(i32),
    /// The thread exited.
    Gone,
    /// Not stopped yet.
    Running,
}

impl Pauser {
    pub fn new(pid: i32) -> Self {
        Pauser { pid }
    }

    /// Stops every thread of the target; see the module documentation.
    pub fn pause(&self) -> Result<Paused, MemoryError> {
        release_pending();
        let mut paused = Paused {
            stopped: Vec::new(),
            _not_send: PhantomData,
        };
        let mut seen: HashSet<i32> = HashSet::new();
        let started = Instant::now();
        for _ in 0..MAX_ROUNDS {
            let tids = self.threads()?;
            let new: Vec<i32> = tids.into_iter().filter(|t| !seen.contains(t)).collect();
            if new.is_empty() {
                return if paused.stopped.is_empty() {
                    Err(MemoryError::ProcessGone(self.pid))
                } else {
                    Ok(paused)
                };
            }
            if seen.len() + new.len() > MAX_THREADS {
                return Err(MemoryError::TooManyThreads {
                    pid: self.pid,
                    max: MAX_THREADS,
                });
            }
            let mut waiting = Vec::with_capacity(new.len());
            for &tid in &new {
                seen.insert(tid);
                match seize(tid) {
                    Ok(()) => waiting.push(tid),
                    // Exited since it was listed.
                    Err(libc::ESRCH) => {}
                    Err(libc::EPERM) => {
                        // Ours are detached by `paused`'s drop; this one is not ours.
                        return Err(if is_traced(self.pid, tid) {
                            MemoryError::AlreadyTraced(self.pid)
                        } else {
                            MemoryError::PermissionDenied(self.pid)
                        });
                    }
                    Err(e) => return Err(MemoryError::Os(e)),
                }
            }
            // Every thread was interrupted as it was seized; now collect the stops.
            while !waiting.is_empty() {
                waiting.retain(|&tid| match try_wait(tid) {
                    Stop::Stopped(sig) => {
                        paused.stopped.push((tid, sig));
                        false
                    }
                    Stop::Gone => false,
                    Stop::Running => true,
                });
                if waiting.is_empty() {
                    break;
                }
                if started.elapsed() >= STOP_DEADLINE {
                    PENDING.with(|p| p.borrow_mut().extend(&waiting));
                    return Err(MemoryError::PauseTimeout {
                        pid: self.pid,
                        ms: STOP_DEADLINE.as_millis() as u64,
                    });
                }
                // A thread running on another CPU stops within microseconds of the interrupt;
                // one waiting for ours needs us off it: sleep, not spin or yield (a yield may
                // hand the CPU to anything else for a whole slice).
                std::thread::sleep(POLL);
            }
        }
        Err(MemoryError::Os(libc::EAGAIN))
    }

    /// The target's thread ids (bounded: a listing past [`MAX_THREADS`] is an error).
    fn threads(&self) -> Result<Vec<i32>, MemoryError> {
        let dir =
            std::fs::read_dir(format!("/proc/{}/task", self.pid)).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => MemoryError::ProcessGone(self.pid),
                std::io::ErrorKind::PermissionDenied => MemoryError::PermissionDenied(self.pid),
                _ => MemoryError::Os(e.raw_os_error().unwrap_or(libc::EIO)),
            })?;
        let mut out = Vec::new();
        for entry in dir.flatten() {
            if let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
                if out.len() >= MAX_THREADS {
                    return Err(MemoryError::TooManyThreads {
                        pid: self.pid,
                        max: MAX_THREADS,
                    });
                }
                out.push(tid);
            }
        }
        Ok(out)
    }
}

impl Paused {
    /// Threads stopped.
    pub fn threads(&self) -> usize {
        self.stopped.len()
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for &(tid, sig) in &self.stopped {
            // A thread killed meanwhile (SIGKILL needs no tracer) is gone: nothing to do.
            let _ = detach(tid, sig);
        }
    }
}

/// Detaches the threads that had not stopped when their pause gave up and have stopped since.
/// Called by every pause; a long-lived sampling thread may call it on its own too.
pub fn release_pending() {
    PENDING.with(|p| {
        p.borrow_mut().retain(|&tid| match try_wait(tid) {
            Stop::Stopped(sig) => {
                let _ = detach(tid, sig);
                false
            }
            Stop::Gone => false,
            Stop::Running => true,
        });
    });
}

/// Threads seized by this OS thread still waiting to stop (see [`release_pending`]).
pub fn pending() -> usize {
    PENDING.with(|p| p.borrow().len())
}

/// Whether the thread has a tracer (`TracerPid` in its status).
fn is_traced(pid: i32, tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse::<i32>().ok())
        })
        .is_some_and(|t| t != 0)
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// One ptrace request on thread `tid` that passes no memory of ours: the address argument is
/// unused and `data` is a plain value (options, or a signal number). The errno on failure.
fn request(req: libc::c_uint, tid: i32, data: usize) -> Result<(), i32> {
    // SAFETY: the requests made here (SEIZE, INTERRUPT, DETACH) read no memory of ours: the
    // address is ignored and `data` is taken by value, so no pointer is dereferenced.
    let r = unsafe {
        libc::ptrace(
            req,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if r != 0 {
        return Err(errno());
    }
    Ok(())
}

/// `PTRACE_SEIZE` (no options) then `PTRACE_INTERRUPT`. Returns the errno of the first that
/// failed.
fn seize(tid: i32) -> Result<(), i32> {
    request(libc::PTRACE_SEIZE, tid, 0)?;
    if let Err(e) = request(libc::PTRACE_INTERRUPT, tid, 0) {
        // Seized but not interrupted: it runs; detach fails unless it is stopped, so keep
        // it for `release_pending` (it stops at the next signal, or is detached when we exit).
        if e != libc::ESRCH {
            PENDING.with(|p| p.borrow_mut().push(tid));
        }
        return Err(e);
    }
    Ok(())
}

/// One non-blocking wait for a seized thread.
fn try_wait(tid: i32) -> Stop {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid, writable c_int for the duration of the call.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if r == 0 {
        return Stop::Running;
    }
    if r < 0 {
        // ECHILD: not (or no longer) our tracee.
        return Stop::Gone;
    }
    if libc::WIFSTOPPED(status) {
        let event = status >> 16;
        let sig = libc::WSTOPSIG(status);
        // The interrupt's stop (or a group stop): nothing to hand back. Any other stop is a
        // signal on its way to the thread: it is delivered when we detach.
        Stop::Stopped(if event == EVENT_STOP { 0 } else { sig })
    } else {
        Stop::Gone
    }
}

/// `PTRACE_DETACH`, handing `sig` (0: none) to the thread.
fn detach(tid: i32, sig: i32) -> Result<(), i32> {
    request(libc::PTRACE_DETACH, tid, usize::try_from(sig).unwrap_or(0))
}
