//! Whether a target's threads have run since the sampler last read them, from the kernel's
//! per-thread scheduler statistics (`/proc/PID/task/TID/schedstat`: the thread's CPU time and
//! how many times it was switched in), or, for the threads it knows, from the kernel's log of
//! context switches when it runs ([`super::switches`], `--switch-log`: no syscall per check,
//! no backoff, no two-tick rule). A thread that has not run has not changed its own
//! stack, so the sampler keeps what it read last time instead of reading it again; a process
//! none of whose threads ran has not changed at all, and its whole sample is kept.
//!
//! Why it holds. The kernel counts a switch-in when a thread starts to run and adds its CPU
//! time when it stops running and at every scheduler tick while it runs. A reading equal to
//! the reference (the first reading with those figures) proves the thread did not run since
//! the reference in either of two cases:
//! - the two readings are at least two ticks apart: a run that began before the reference
//!   and went on would have met a tick, one that ended would have added its time, one that
//!   began after would have been counted;
//! - the thread's state (`/proc/PID/task/TID/stat`) was read between the two readings and
//!   said neither running nor runnable: a run before that reading ended (adding its time), a
//!   run after it began (counted). The sampler reads that state after each read of a thread's
//!   memory anyway in cpu mode ([`RunWatch::on_cpu`]); otherwise a check reads it when the
//!   reference is younger than two ticks.
//!
//! One caveat, on a VM whose host stalls a virtual CPU: a thread that ran less than one tick
//! and then stalled with its CPU shows no change until the CPU is back; the kept stack is then
//! the thread's stack of at most one tick of its running earlier. Not used when the kernel
//! does not keep the counts (`CONFIG_SCHED_INFO` off) or may stop the tick under a running
//! thread (`nohz_full` CPUs).
//!
//! Whole process: threads are only made by threads that run. With every thread of the process
//! watched, known to be all of them after each watched thread's reference reading, a check
//! that finds them all still proves that nothing of the process changed. A check that finds
//! every watched thread still makes the watch complete itself: by the process's thread count
//! (the link count of `/proc/PID/task`, one `fstat`, taken after every reference and before
//! the readings) when it equals the watched threads, else by a listing of `/proc/PID/task`.
//! Processes with more than [`MAX_WATCHED`] threads only get the per-thread check.
//!
//! Costs: one `pread` of a small procfs file per watched thread per check (about half a bare
//! 8-byte `process_vm_readv` of a cold target: BENCHMARKS.md, "The fleet"), up to two file
//! descriptors per watched thread and one per process, and an `fstat` (a listing when threads
//! came) when a process turns quiet. A check that finds a thread running costs its `pread` on
//! top of the read that follows, so a thread (or process) found running [`BACKOFF_AFTER`]
//! checks in a row is checked less and less often (after 1, 3, 7, ... up to [`MAX_REST`]
//! samples), and while any thread of the process runs only the threads whose stacks cost more
//! to read than a check (the caller weighs them when it [watches](RunWatch::watch) them) are
//! checked. A worker that wakes between most samples is checked at every one. Reads only
//! /proc.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Most threads of one process watched (each holds a file descriptor).
pub const MAX_WATCHED: usize = 64;
/// Most checks in a row that read only heavy threads while the process runs.
pub const MAX_REST: u8 = 31;
/// The figures of a reading that came from the context-switch log (see [`super::switches`]):
/// no schedstat time is this large.
const LOGGED_OUT: u64 = u64::MAX;
const LOGGED_RUNNING: u64 = u64::MAX - 1;

/// Checks in a row that find a thread (or the process) running before it is checked less
/// often: a worker that wakes every few samples is found running once per wake, and must not
/// be backed off.
pub const BACKOFF_AFTER: u8 = 3;

/// What a [`RunWatch::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Still {
    /// Every thread of the process held still (the watch is complete).
    All,
    /// Every watched thread held still, but the process may have others: list them.
    Watched,
    /// Some thread ran, or could not be told.
    No,
}

/// Watches the threads of one process; see the module documentation.
pub struct RunWatch {
    pid: i32,
    /// Two scheduler ticks: readings closer than this tell nothing.
    min_interval: Duration,
    /// Few per process (a linear search beats hashing, and the checks walk them in order).
    threads: Vec<Watched>,
    /// Every thread of the process is watched, by a listing (or a thread count) taken after
    /// every reference.
    complete: bool,
    /// `/proc/PID/task`, kept open for its link count (see [`RunWatch::thread_count`]).
    task_dir: Option<File>,
    /// Checks in a row that found some thread running, and checks still to make on heavy
    /// threads only.
    moving: u8,
    rest: u8,
    /// Checks made so far, and whether a watched thread was heavy at the last full one.
    checks: u64,
    /// The process was read since the last check: that check must drain the context-switch
    /// log afresh (see [`super::switches`]).
    read_since_check: bool,
    any_heavy: bool,
    /// The last check read some thread's figures (it cost something).
    read_any: bool,
}

struct Watched {
    file: File,
    /// `/proc/PID/task/TID/stat`, opened at its first use.
    stat: Option<File>,
    tid: i32,
    /// Tracked by the context-switch log (see [`super::switches`]).
    registered: bool,
    reference: Option<Reading>,
    /// The check (of [`RunWatch::checks`]) that last found it still.
    quiet_at: u64,
    /// Worth a check while the process runs (see [`RunWatch::watch`]).
    heavy: bool,
    /// Checks in a row that found the thread running, and checks still to skip: a thread
    /// that runs between most samples is read less often (1, 3, 7, then 15 checks skipped),
    /// since its reading would only say what its memory read will anyway.
    moving: u8,
    rest: u8,
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    run_ns: u64,
    switches: u64,
    /// Taken after the reading (so an interval measured from it is never too long).
    at: Instant,
    /// The caller's counter (the sampler's epoch) when the reading was taken.
    epoch: u64,
    /// The thread's state was read since, and it was neither running nor runnable: a later
    /// equal reading proves it still however young this one is (see the module documentation).
    settled: bool,
}

impl RunWatch {
    /// `None` when the kernel cannot tell whether a thread ran (see the module documentation).
    pub fn new(pid: i32) -> Option<RunWatch> {
        let tick = (*kernel_tick())?;
        Some(RunWatch {
            pid,
            min_interval: tick * 2,
            threads: Vec::new(),
            complete: false,
            task_dir: None,
            moving: 0,
            rest: 0,
            checks: 0,
            read_since_check: true,
            any_heavy: false,
            read_any: false,
        })
    }

    /// Reads every watched thread whose reference is at least two ticks old; a thread whose
    /// figures moved gets this reading as its new reference (tagged `epoch`: take it before
    /// reading the thread's memory). Says whether every thread (of the process, or watched)
    /// is known to have been still since its reference.
    ///
    /// A check that finds some thread running makes the next 1, 3, 7, ... up to
    /// [`MAX_REST`] checks read only the [heavy](Self::watch) threads: while the process runs,
    /// the whole-process answer is "no" anyway, and keeping a light thread's stack saves
    /// less than its reading costs.
    pub fn check(&mut self, epoch: u64) -> Still {
        self.checks += 1;
        self.read_any = false;
        // With the context-switch log a check costs nothing: no reason to rest.
        if self.rest > 0 && super::switches::running() {
            self.rest = 0;
        }
        let resting = self.rest > 0;
        if resting {
            self.rest -= 1;
            if !self.any_heavy {
                return Still::No;
            }
        }
        // The process's thread count, taken after every reference and before the readings
        // below: if it equals the watched threads and they all hold still, no other thread
        // existed then, and none can have been made since (only a thread that runs makes
        // one), so the watch is complete without a listing.
        let count =
            (!self.complete && !resting && self.threads.iter().all(|w| w.reference.is_some()))
                .then(|| self.thread_count())
                .flatten();
        let mut still = self.check_threads(epoch, resting);
        if still == Still::Watched {
            if count == Some(self.threads.len()) {
                self.complete = true;
            } else {
                // A listing now is newer than every reference.
                self.list();
            }
            if self.complete {
                still = Still::All;
            }
        }
        if !resting {
            if still == Still::No {
                self.moving = self.moving.saturating_add(1);
                self.rest = backoff(self.moving, MAX_REST);
            } else {
                self.moving = 0;
            }
        }
        still
    }

    fn check_threads(&mut self, epoch: u64, heavy_only: bool) -> Still {
        let now = Instant::now();
        let min = self.min_interval;
        let pid = self.pid;
        let read_any = &mut self.read_any;
        let mut log = super::switches::lock();
        let drain = log
            .as_deref_mut()
            .map_or(0, |l| l.drain(now, self.read_since_check));
        self.read_since_check = false;
        let mut all = !self.threads.is_empty() && !heavy_only;
        let mut changed = false;
        let checks = self.checks;
        let mut any_heavy = false;
        self.threads.retain_mut(|w| {
            any_heavy |= w.heavy;
            if heavy_only && !w.heavy {
                return true;
            }
            // From the context-switch log when it knows the thread (exact and free: no
            // reason to check it less often), else from schedstat.
            let logged = log.as_deref().and_then(|l| l.state(w.tid));
            if w.rest > 0 && logged.is_none() {
                w.rest -= 1;
                all = false;
                return true;
            }
            *read_any = true;
            let mut young = false;
            let (run_ns, switches) = match logged {
                Some(st) if st.running => (LOGGED_RUNNING, drain),
                Some(st) => (LOGGED_OUT, st.since),
                None => {
                    // A reference younger than two ticks proves nothing by itself: unless a
                    // state reading since settled it, the state is read now, before the
                    // figures.
                    young = w
                        .reference
                        .is_some_and(|r| !r.settled && now.saturating_duration_since(r.at) < min);
                    if young && w.state_running(pid) != Some(false) {
                        all = false;
                        return true;
                    }
                    let Some(figures) = read(&w.file) else {
                        // Gone (it exited, which it ran to do). Forgotten here: the log is
                        // locked.
                        all = false;
                        changed = true;
                        if let Some(l) = log.as_deref_mut() {
                            l.unregister(w.tid);
                        }
                        w.registered = false;
                        return false;
                    };
                    figures
                }
            };
            match w.reference {
                Some(r) if r.run_ns == run_ns && r.switches == switches => {
                    w.quiet_at = checks;
                    w.moving = 0;
                    if young {
                        // The state read just before said not running (see above).
                        w.reference = Some(Reading { settled: true, ..r });
                    }
                    if logged.is_none() {
                        // Proved not running now: the log knows it from this drain on.
                        if let Some(l) = log.as_deref_mut() {
                            l.settle(w.tid);
                        }
                    }
                }
                _ => {
                    if w.reference.is_some() {
                        w.moving = w.moving.saturating_add(1);
                        w.rest = backoff(w.moving, 15);
                    }
                    w.reference = Some(Reading {
                        run_ns,
                        switches,
                        at: Instant::now(),
                        epoch,
                        // The log's figures need no second proof.
                        settled: logged.is_some(),
                    });
                    all = false;
                    changed = true;
                }
            }
            true
        });
        if !heavy_only {
            self.any_heavy = any_heavy;
        }
        if changed {
            self.complete = false;
        }
        match (all, self.complete) {
            (true, true) => Still::All,
            (true, false) => Still::Watched,
            _ => Still::No,
        }
    }

    /// When the last [`check`](Self::check) found thread `tid` still: the epoch of its
    /// reference (what was read of it after that is still valid).
    pub fn quiet_since(&self, tid: i32) -> Option<u64> {
        let w = self.threads.iter().find(|w| w.tid == tid)?;
        (w.quiet_at == self.checks).then_some(w.reference?.epoch)
    }

    /// Whether the last [`check`](Self::check) read any thread's figures (rather than
    /// answering from its backoff alone).
    pub fn last_check_read(&self) -> bool {
        self.read_any
    }

    /// Whether thread `tid` is running or runnable right now (state `R`), read through the
    /// watch's open file; a "no" settles its reference (see the module documentation).
    /// `None` when the thread is not watched or its state cannot be read.
    pub fn on_cpu(&mut self, tid: i32) -> Option<bool> {
        let pid = self.pid;
        let w = self.threads.iter_mut().find(|w| w.tid == tid)?;
        let running = w.state_running(pid)?;
        if !running {
            if let Some(r) = w.reference.as_mut() {
                r.settled = true;
            }
        }
        Some(running)
    }

    /// Thread `tid`'s schedstat run time now, read through the watch's open file. `None`
    /// when the thread is not watched or the file cannot be read.
    pub fn run_ns(&self, tid: i32) -> Option<u64> {
        let w = self.threads.iter().find(|w| w.tid == tid)?;
        let mut buf = [0u8; 128];
        let n = w.file.read_at(&mut buf, 0).ok()?;
        super::cpu_share::parse_run_ns(buf.get(..n)?)
    }

    /// The newest reference's epoch (`u64::MAX` while a watched thread has none yet).
    pub fn newest_reference(&self) -> u64 {
        self.threads
            .iter()
            .map(|w| w.reference.map_or(u64::MAX, |r| r.epoch))
            .max()
            .unwrap_or(u64::MAX)
    }

    /// The caller read the process's memory (after the last check).
    pub fn was_read(&mut self) {
        self.read_since_check = true;
    }

    /// Starts watching thread `tid` (its first reading is taken at the next check). False
    /// when it cannot be watched.
    ///
    /// `heavy`: keeping this thread's stack saves more than reading its schedstat costs
    /// (about two to three iovecs of a cold `process_vm_readv`): a deep stack, or one whose
    /// frames lie in several places. Light threads are not read while the process runs (see
    /// [`check`](Self::check)); the caller says again at every full sample.
    pub fn watch(&mut self, tid: i32, heavy: bool) -> bool {
        if let Some(w) = self.threads.iter_mut().find(|w| w.tid == tid) {
            w.heavy = heavy;
            return true;
        }
        if tid <= 0 || self.threads.len() >= MAX_WATCHED {
            return false;
        }
        // Every watch of this process shares a budget of file descriptors.
        if OPEN.fetch_add(1, Ordering::Relaxed) >= fd_budget() {
            OPEN.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let Ok(file) = File::open(format!("/proc/{}/task/{tid}/schedstat", self.pid)) else {
            OPEN.fetch_sub(1, Ordering::Relaxed);
            return false;
        };
        let registered = super::switches::with(|l| l.register(tid)).is_some();
        self.threads.push(Watched {
            registered,
            file,
            stat: None,
            tid,
            reference: None,
            quiet_at: 0,
            heavy,
            moving: 0,
            rest: 0,
        });
        self.complete = false;
        true
    }

    /// Lists the process's threads: watches the new ones, forgets the gone ones. Call after
    /// [`check`](Self::check) (the listing must be newer than every reference): when the
    /// listing holds no thread that was not already watched with a reference, the watch is
    /// complete, and a later check that finds every thread still proves the process unchanged.
    pub fn list(&mut self) {
        self.complete = false;
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        let mut tids: Vec<i32> = Vec::new();
        for entry in dir.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            tids.push(tid);
            if tids.len() > MAX_WATCHED {
                return;
            }
        }
        let before = self.threads.len();
        self.threads.retain(|w| tids.contains(&w.tid));
        let mut complete = self.threads.len() == before;
        for &tid in &tids {
            if !self.threads.iter().any(|w| w.tid == tid) {
                self.watch(tid, false);
                complete = false;
            }
        }
        self.complete = complete
            && self.threads.len() == tids.len()
            && self.threads.iter().all(|w| w.reference.is_some());
    }

    /// How many threads the process has, from the link count of its `task` directory (two
    /// plus the number of threads), through a descriptor opened at first use.
    fn thread_count(&mut self) -> Option<usize> {
        if self.task_dir.is_none() {
            if OPEN.fetch_add(1, Ordering::Relaxed) >= fd_budget() {
                OPEN.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
            match File::open(format!("/proc/{}/task", self.pid)) {
                Ok(dir) => self.task_dir = Some(dir),
                Err(_) => {
                    OPEN.fetch_sub(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let links = self.task_dir.as_ref()?.metadata().ok()?.nlink();
        usize::try_from(links.checked_sub(2)?).ok()
    }

    /// Threads watched.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }
}

/// Whether this kernel lets [`RunWatch`] tell (see the module documentation).
pub fn available() -> bool {
    kernel_tick().is_some()
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        if self.task_dir.is_some() {
            OPEN.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Watched {
    /// Whether the thread is running or runnable now, from its `stat` (opened at first use,
    /// then read in place).
    fn state_running(&mut self, pid: i32) -> Option<bool> {
        if self.stat.is_none() {
            self.stat = File::open(format!("/proc/{pid}/task/{}/stat", self.tid)).ok();
        }
        let mut buf = [0u8; 512];
        let n = self.stat.as_ref()?.read_at(&mut buf, 0).ok()?;
        super::state_is_running(buf.get(..n)?)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        if self.registered {
            super::switches::with(|l| l.unregister(self.tid));
        }
    }
}

/// Checks to skip after `moving` checks in a row found a thread (or process) running: none
/// before [`BACKOFF_AFTER`], then 1, 3, 7, ... up to `max`.
fn backoff(moving: u8, max: u8) -> u8 {
    let over = moving.saturating_sub(BACKOFF_AFTER - 1);
    if over == 0 {
        return 0;
    }
    ((1u16 << over.min(8)) - 1).min(u16::from(max)) as u8
}

/// Threads watched, and task directories held, by every watch of this process.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// The most threads the watches of this process may hold (each holds up to two file
/// descriptors): a quarter of the soft limit on open files as first seen, so that the watches
/// hold at most half of it (sockets, snapshots and target files keep the other half).
fn fd_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(256, |(soft, _)| {
                usize::try_from(soft / 4).unwrap_or(usize::MAX)
            })
    })
}

/// Raises this process's soft limit on open files to its hard limit (a daemon watching many
/// processes holds a descriptor per watched thread). Call before any watch exists. Returns
/// the soft limit now in force.
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// CPU time (ns) and switch-in count of a thread.
fn read(file: &File) -> Option<(u64, u64)> {
    let mut buf = [0u8; 96];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse(buf.get(..n)?)
}

fn parse(text: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut f = text.split_ascii_whitespace();
    let run_ns = f.next()?.parse().ok()?;
    let _wait = f.next()?;
    let switches = f.next()?.parse().ok()?;
    Some((run_ns, switches))
}

/// The scheduler tick, when the kernel's counts can be trusted (see the module
/// documentation); checked once per process.
fn kernel_tick() -> &'static Option<Duration> {
    static TICK: OnceLock<Option<Duration>> = OnceLock::new();
    TICK.get_or_init(|| {
        // CPUs that may run a thread without a tick.
        if let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/nohz_full") {
            let s = s.trim();
            if !s.is_empty() && s != "(null)" {
                return None;
            }
        }
        // Without CONFIG_SCHED_INFO every thread reads "0 0 0"; this one has run.
        let own = std::fs::read("/proc/thread-self/schedstat").ok()?;
        if parse(&own)?.1 == 0 {
            return None;
        }
        // The coarse clock advances once per tick.
        let res = nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).ok()?;
        let tick = Duration::from(res);
        (!tick.is_zero() && tick <= Duration::from_millis(100)).then_some(tick)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_tid() -> i32 {
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        link.file_name().unwrap().to_str().unwrap().parse().unwrap()
    }

    #[test]
    fn backs_off_only_after_several_checks_found_running() {
        let rests: Vec<u8> = (0..=9).map(|m| backoff(m, MAX_REST)).collect();
        assert_eq!(rests, [0, 0, 0, 1, 3, 7, 15, 31, 31, 31]);
        assert_eq!(backoff(200, 15), 15);
    }

    #[test]
    fn parses_schedstat() {
        assert_eq!(parse(b"282385 0 3\n"), Some((282385, 3)));
        assert_eq!(parse(b"1 2\n"), None);
        assert_eq!(parse(b"x 0 3\n"), None);
        assert_eq!(parse(b""), None);
    }

    /// Real threads of this process: a sleeping one is found still once two ticks have
    /// passed, a spinning one never; the listing makes the watch complete only while
    /// every thread is still.
    #[test]
    fn tells_a_sleeping_thread_from_a_running_one() {
        let Some(mut w) = RunWatch::new(std::process::id() as i32) else {
            eprintln!("this kernel cannot tell (no schedstat counts or nohz_full CPUs)");
            return;
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            tx.send(own_tid()).ok();
            std::thread::sleep(Duration::from_secs(3));
        });
        let s2 = stop.clone();
        let (tx2, rx2) = std::sync::mpsc::channel();
        let spinner = std::thread::spawn(move || {
            tx2.send(own_tid()).ok();
            let mut x = 0u64;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                x = x.wrapping_add(1);
                std::hint::black_box(x);
            }
        });
        let (sleeping, spinning) = (rx.recv().unwrap(), rx2.recv().unwrap());
        assert!(w.watch(sleeping, true) && w.watch(spinning, false));
        // Checks over `epochs`: how many found the sleeping thread still (never the spinner).
        let count_still = |w: &mut RunWatch, epochs: std::ops::RangeInclusive<u64>| {
            let mut still = 0;
            for epoch in epochs {
                w.check(epoch);
                still += usize::from(w.quiet_since(sleeping).is_some());
                assert_eq!(
                    w.quiet_since(spinning),
                    None,
                    "a spinning thread found still"
                );
                std::thread::sleep(w.min_interval + Duration::from_millis(1));
            }
            still
        };
        // A heavy thread is checked even while another runs.
        let still = count_still(&mut w, 1..=20);
        assert!(
            still >= 15,
            "the sleeping thread was found still {still}/20 times"
        );
        // A light one is not, while the process runs: only the full checks, after 1, 3,
        // 7, ... checks, read it.
        w.watch(sleeping, false);
        let light_still = count_still(&mut w, 21..=40);
        assert!(
            light_still <= 2,
            "a light thread was read {light_still}/20 times while another ran"
        );
        // This thread runs, so the process is never still.
        w.list();
        assert_eq!(w.check(41), Still::No);
        // Checks 1 ms apart, closer than two ticks: a thread that wakes every 20 ms gets a
        // new reference at each wake, and the checks after it are proved still by its state
        // (asleep), not by the time since. Without that, the checks within two ticks of each
        // wake (about 40% of them at 4 ms ticks) would say "not still".
        let s3 = stop.clone();
        let (tx3, rx3) = std::sync::mpsc::channel();
        let napper = std::thread::spawn(move || {
            tx3.send(own_tid()).ok();
            while !s3.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let napping = rx3.recv().unwrap();
        assert!(w.watch(napping, true));
        let mut napper_still = 0;
        for epoch in 42..=241 {
            w.check(epoch);
            napper_still += usize::from(w.quiet_since(napping).is_some());
            assert_eq!(
                w.quiet_since(spinning),
                None,
                "a spinning thread found still"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            napper_still >= 140,
            "a thread that naps 20 ms at a time was found still {napper_still}/200 times"
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().unwrap();
        napper.join().unwrap();
        sleeper.join().unwrap();
    }
}
