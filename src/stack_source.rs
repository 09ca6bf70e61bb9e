//! The root package's stack sources for the fleet's actors: [`UnwinderFactory`] attaches one
//! [`UnwinderSource`] (the unwinder of `cpython`) per process; [`Counted`] wraps a factory to
//! count the samples taken and failed across the fleet (for `record`'s progress line).
//!
//! [`Capture`] is `--capture`: which way, resolved for the mode, and starting the kernel
//! capture (or, for `auto`, falling back to reads). With a [`SharedCapture`] (the kernel
//! capture), a source reads its process in full only to learn its threads: at its first tick,
//! when the kernel tells of a thread of it that runs and is not yet known (a thread it found
//! not to run Python is asked about again after [`CAPTURE_RECHECK`]), and every
//! [`CAPTURE_FULL_REFRESH`]. Samples of a thread before it is learnt are counted failures.
//! Its samples are the chains the kernel copied at interrupts of those threads since the
//! last tick, as many per tick as there were (each one thread on a CPU at one instant); a
//! process that ended hands out what was captured before, then reports its end. In wall
//! and gil modes ([`UnwinderFactory::off_cpu`]) the kernel also copies a thread's chain as it
//! leaves its CPU and tells when it comes back, and a call adds each thread's time off its
//! CPU since the last (see [`crate::wall_time`]); the slot calls it before each batch
//! ([`StackSource::counts_at_batch`]), so that a process whose threads sleep costs a call a
//! batch, not one a tick. A capturing source is due ([`StackSource::due`]) only when records
//! that make it due wait for it (all but a switch-out with the chain last sent, which waits
//! for the next call: [`PendingRecord::prompt`]), or when its full read is due (while full
//! reads fail, every [`CAPTURE_RETRY`]): an idle process costs a tick a look at the ring and
//! its queue. Records with frames are decoded at the first tick after they were taken, no
//! later: a code object first seen in a record is read then, and the longer it
//! waited the likelier it is gone (a failed sample). The capture is one for the whole
//! fleet: the source that drains it files every record under its pid, and each source takes
//! its own (at most [`MAX_PENDING`] waiting per process; older ones are dropped and counted).
//!
//! Must not schedule anything (the actors decide when) nor format output (`output/` does).

use crate::cpython::{self, Unwinder, UnwinderOptions};
use crate::idle_stacks::IdleStacks;
use crate::memory::kernel_capture::{frames_in, GilAt, KernelCapture};
use crate::memory::{ProcessMemory, RemoteMemory};
use crate::process::host::PidNamespace;
use crate::thread_frames::ThreadFrames;
use crate::wall_time::{self, Chain, Seen, SwitchedOut, WallTime};
use pyfleet_actors::{
    CapturedCounts, FrameInfo, ProcessInfo, SampleError, SampleKind, SampledThread, SourceFactory,
    SourceStats, StackSource, ThreadStatus,
};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a thread found not to run Python is not asked about again (it may have been
/// starting: its thread state not made yet).
pub const CAPTURE_RECHECK: Duration = Duration::from_secs(1);

/// How often a capturing source reads its process in full though no new thread ran (plus up
/// to 2 s, by pid): to forget threads that ended and learn thread states replaced under a
/// known thread.
pub const CAPTURE_FULL_REFRESH: Duration = Duration::from_secs(10);

/// How often a capturing source whose full read failed (not because its process ended) tries
/// again, records or not.
pub const CAPTURE_RETRY: Duration = Duration::from_secs(1);

/// Most threads a capturing source remembers as not running Python.
const MAX_NOT_PYTHON: usize = 8192;

/// Most captured records waiting for one process's source (about 4 s of one busy thread at
/// 1 kHz); past it the oldest are dropped and counted.
pub const MAX_PENDING: usize = 4096;

/// Records waiting for one process that make its source due though none is prompt (see
/// [`PendingRecord::prompt`]).
const PROMPT_AT: usize = MAX_PENDING / 4;

/// How stacks are taken (`--capture`, `capture =`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// pyfleet reads each target at each tick.
    Reads,
    /// The kernel capture; failing to start it is an error.
    Kernel,
    /// The kernel capture where it can be used (neither `--blocking` nor `--switch-log`, and
    /// it starts: CAP_BPF and CAP_PERFMON, Linux 5.8; in wall and gil mode it must follow
    /// threads off their CPU too), else reads.
    Auto,
    /// What [`Capture::resolve`] makes of `Auto` (or of `Reads` with `--blocking`) where the
    /// capture does not apply: reads, for this reason.
    ReadsWhere(NotApplicable),
}

/// Why the kernel capture does not apply to a profile, whatever the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotApplicable {
    /// `--blocking`: targets are paused and read.
    Blocking,
    /// `--switch-log` goes with reads.
    SwitchLog,
}

/// How a profile's stacks are taken, and when not by the kernel capture, why not: what
/// `record` and `run` say in their first line and the daemon exports
/// (`pyfleet_capture_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HowStacks {
    /// Copied by the kernel at interrupts; `namespaced`: pyfleet runs in a pid namespace not
    /// the host's, whose processes alone can be captured (others are read from outside).
    Kernel { namespaced: bool },
    /// Read from outside (each target paused for it with `--blocking`), for this reason.
    Reads(WhyReads),
}

/// Why stacks are read from outside rather than captured by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WhyReads {
    /// `--capture reads` / `capture = "reads"`.
    Asked,
    /// The capture does not apply to this profile.
    NotApplicable(NotApplicable),
    /// It could not start on this host: the reason's fixed code (`CaptureError::code`) and
    /// its words.
    CannotStart { code: &'static str, why: String },
}

impl HowStacks {
    /// A fixed short name of how (`kernel`, `paused`, `reads`) and why not the capture
    /// (empty for the capture): bounded values for metrics labels and JSON.
    pub fn codes(&self) -> (&'static str, &'static str) {
        match self {
            HowStacks::Kernel { .. } => ("kernel", ""),
            HowStacks::Reads(WhyReads::Asked) => ("reads", "asked"),
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking)) => {
                ("paused", "blocking")
            }
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::SwitchLog)) => {
                ("reads", "switch_log")
            }
            HowStacks::Reads(WhyReads::CannotStart { code, .. }) => ("reads", code),
        }
    }
}

impl std::fmt::Display for HowStacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HowStacks::Kernel { namespaced: false } => {
                f.write_str("stacks from the kernel capture")
            }
            HowStacks::Kernel { namespaced: true } => f.write_str(
                "stacks from the kernel capture, in pyfleet's pid namespace (processes of \
                 other namespaces are read from outside)",
            ),
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking)) => {
                f.write_str("stacks read from outside, each target paused (--blocking)")
            }
            HowStacks::Reads(why) => {
                f.write_str("stacks read from outside: ")?;
                match why {
                    WhyReads::Asked => f.write_str("reads were asked for (capture: reads)"),
                    WhyReads::NotApplicable(_) => {
                        f.write_str("the context-switch log (--switch-log) goes with reads")
                    }
                    WhyReads::CannotStart { why, .. } => f.write_str(why),
                }
            }
        }
    }
}

impl std::str::FromStr for Capture {
    type Err = String;

    fn from_str(s: &str) -> Result<Capture, String> {
        match s {
            "reads" => Ok(Capture::Reads),
            "kernel" => Ok(Capture::Kernel),
            "auto" => Ok(Capture::Auto),
            other => Err(format!("must be auto, reads or kernel (got {other:?})")),
        }
    }
}

impl Capture {
    /// What `self` comes to for a profile with or without pausing targets or the
    /// context-switch log: `Auto` is reads where the capture does not apply. An explicit
    /// `Kernel` where it does not apply is an error, in words for `flag` (the command line's
    /// `--capture` or the config file's `capture`).
    pub fn resolve(self, blocking: bool, switch_log: bool, flag: &str) -> Result<Capture, String> {
        let option = |name: &str| match flag.starts_with("--") {
            true => format!("--{name}"),
            false => name.to_string(),
        };
        match self {
            Capture::Kernel if blocking => Err(format!(
                "{flag} kernel never stops the target: it does not go with {}",
                option("blocking")
            )),
            Capture::Auto | Capture::Reads if blocking => {
                Ok(Capture::ReadsWhere(NotApplicable::Blocking))
            }
            Capture::Auto if switch_log => Ok(Capture::ReadsWhere(NotApplicable::SwitchLog)),
            other => Ok(other),
        }
    }

    /// Starts the kernel capture at `rate_hz` when `self` (resolved) asks for it (with
    /// `off_cpu`, wall and gil modes: threads off their CPU too), and says how stacks will be
    /// taken.
    /// `Kernel` fails with the reason; `Auto` falls back to reads and the second value says
    /// why.
    pub fn start(
        self,
        rate_hz: f64,
        off_cpu: bool,
    ) -> Result<(Option<Arc<SharedCapture>>, HowStacks), String> {
        let reads = |why| Ok((None, HowStacks::Reads(why)));
        match self {
            Capture::Reads => return reads(WhyReads::Asked),
            Capture::ReadsWhere(n) => return reads(WhyReads::NotApplicable(n)),
            Capture::Kernel | Capture::Auto => {}
        }
        let hz = rate_hz.round().clamp(1.0, f64::from(u32::MAX)) as u32;
        match KernelCapture::start(hz, off_cpu) {
            Ok(c) => {
                let namespaced = c.namespace().is_some();
                Ok((
                    Some(Arc::new(SharedCapture::new(c))),
                    HowStacks::Kernel { namespaced },
                ))
            }
            Err(e) if self == Capture::Kernel => Err(format!("--capture kernel: {e}")),
            Err(e) => reads(WhyReads::CannotStart {
                code: e.code(),
                why: e.to_string(),
            }),
        }
    }
}

/// The kernel capture's records lost since it started, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureLosses {
    /// No room in the kernel's ring.
    pub ring_full: u64,
    /// More than [`MAX_PENDING`] waiting for one process (the oldest dropped).
    pub queue_full: u64,
    /// A record shorter than its head says.
    pub unparsable: u64,
}

/// Attaches the unwinder to each process.
#[derive(Clone, Default)]
pub struct UnwinderFactory {
    pub read_only: bool,
    /// Pause each target for its samples (`--blocking`).
    pub blocking: bool,
    /// Sample through the kernel capture instead (`--capture kernel`).
    pub capture: Option<Arc<SharedCapture>>,
    /// With the capture, a process whose stacks are deeper than it copies is read from
    /// outside instead from then on (`--capture auto`); else those samples fail.
    pub reads_if_deeper: bool,
    /// Wall and gil modes: with the capture, each thread's samples on its CPU and off it
    /// (see [`crate::wall_time`]).
    pub off_cpu: Option<OffCpu>,
    /// `--threads`: each stack rooted at a frame naming its thread (see
    /// [`crate::thread_frames`]).
    pub threads: bool,
    /// Wall mode's `--no-idle`: threads off their CPU waiting for work left out (see
    /// [`crate::idle_stacks`]).
    pub leave_out_idle: bool,
}

/// How a capturing source counts threads off their CPU (wall and gil modes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffCpu {
    /// The capture's rate: time off the CPU counts as this many samples a second.
    pub rate_hz: f64,
    /// gil mode: the capture reads with each chain whether the thread holds the GIL, and
    /// only the holder's time counts (on its CPU or off it).
    pub gil_holder_only: bool,
}

impl OffCpu {
    /// What `mode` needs at `rate_hz`: nothing in cpu mode.
    pub fn for_mode(mode: pyfleet_policies::Mode, rate_hz: f64) -> Option<OffCpu> {
        use pyfleet_policies::Mode;
        match mode {
            Mode::Cpu => None,
            Mode::Wall | Mode::Gil => Some(OffCpu {
                rate_hz,
                gil_holder_only: mode == Mode::Gil,
            }),
        }
    }
}

/// One captured chain, copied out of the ring for its process's source.
struct PendingRecord {
    tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds of the record.
    time_ns: u64,
    /// Copied as the thread left its CPU (without frames when unchanged since the last chain
    /// sent for it).
    switched_out: bool,
    unchanged: bool,
    /// When the thread was last switched in (0: not known).
    switched_in_ns: u64,
    /// gil mode: the thread held the GIL.
    holds_gil: bool,
    /// A thread the capture does not watch ran: no frames.
    unknown_thread: bool,
    /// Why the chain is not whole, if it is not.
    incomplete: Option<&'static str>,
    /// It is not whole because it is deeper than the capture copies.
    truncated: bool,
    /// The frames as the ring held them (`kernel_capture::frames_in`).
    frames: Vec<u8>,
}

impl PendingRecord {
    /// Whether it makes its source due: all but a switch-out with the chain last sent, which
    /// names no code object that may go away and tells only when a stretch off the CPU began
    /// (it waits for the source's next call, at the latest the one before its next batch).
    fn prompt(&self) -> bool {
        !self.unchanged
    }
}

/// Records waiting for one process's source.
#[derive(Default)]
struct Queue {
    records: Vec<PendingRecord>,
    /// How many make the source due: prompt records, and one more once [`PROMPT_AT`] wait.
    prompt: usize,
}

struct CaptureState {
    capture: KernelCapture,
    /// Records waiting per pid, for pids some source watches.
    pending: FxHashMap<u32, Queue>,
    /// Watched threads per pid.
    watched: FxHashMap<u32, Vec<u32>>,
    dropped: u64,
    /// The queues' `prompt`, all processes together.
    waiting: usize,
}

/// The kernel capture, shared by every source of a fleet (see the module documentation).
pub struct SharedCapture {
    /// See [`KernelCapture::namespace`].
    namespace: Option<PidNamespace>,
    state: Mutex<CaptureState>,
    /// What an idle source's tick looks at without the lock: how many records that make a
    /// source due wait (as of the last drain) and when the ring was last drained
    /// (microseconds after `since`).
    waiting: AtomicUsize,
    drained_us: AtomicU64,
    since: Instant,
}

/// How long the ring may go undrained while no record waits: the sources a tick calls
/// within it look at two atomics only. Well under a tick's period at any rate (1 ms at
/// 1 kHz), so that each tick drains what was captured before it began.
const DRAIN_EVERY: Duration = Duration::from_micros(200);

impl SharedCapture {
    pub fn new(capture: KernelCapture) -> SharedCapture {
        SharedCapture {
            namespace: capture.namespace(),
            state: Mutex::new(CaptureState {
                capture,
                pending: FxHashMap::default(),
                watched: FxHashMap::default(),
                dropped: 0,
                waiting: 0,
            }),
            waiting: AtomicUsize::new(0),
            drained_us: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// Whether the capture can take process `pid`'s samples: it runs in pyfleet's pid
    /// namespace, or pyfleet runs in the host's (whose ids the kernel gives for every
    /// process).
    pub fn covers(&self, pid: i32) -> bool {
        match self.namespace {
            None => true,
            Some(ours) => PidNamespace::of(&pid.to_string()) == Some(ours),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CaptureState> {
        // A panic elsewhere while holding it leaves plain data behind: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records lost: no room in the kernel's ring, too many waiting for one process, or not
    /// parsable.
    pub fn lost(&self) -> u64 {
        let l = self.losses();
        l.ring_full + l.queue_full + l.unparsable
    }

    /// Records lost since the start, by reason.
    pub fn losses(&self) -> CaptureLosses {
        let s = self.lock();
        CaptureLosses {
            ring_full: s.capture.lost(),
            queue_full: s.dropped,
            unparsable: s.capture.unparsable(),
        }
    }

    /// Watches exactly `threads` of `pid` (those no longer listed are no longer captured).
    fn watch(
        &self,
        pid: u32,
        threads: &[cpython::CapturedThread],
        layout: crate::memory::kernel_capture::CaptureLayout,
        with_gil: bool,
    ) -> Result<(), String> {
        let mut s = self.lock();
        s.capture.watch_process(pid).map_err(|e| e.to_string())?;
        let old = s.watched.remove(&pid).unwrap_or_default();
        for tid in old {
            if !threads.iter().any(|t| t.tid as u32 == tid) {
                s.capture.unwatch(tid);
            }
        }
        let mut now = Vec::with_capacity(threads.len());
        for t in threads {
            let tid = t.tid as u32;
            s.capture
                .watch(
                    pid,
                    tid,
                    t.tstate,
                    layout,
                    if with_gil { t.gil } else { GilAt::NotAsked },
                )
                .map_err(|e| e.to_string())?;
            now.push(tid);
        }
        s.pending.entry(pid).or_default();
        s.watched.insert(pid, now);
        Ok(())
    }

    /// Stops capturing `pid`'s threads and drops what waits for it.
    fn forget(&self, pid: u32) {
        let mut s = self.lock();
        s.capture.unwatch_process(pid);
        for tid in s.watched.remove(&pid).unwrap_or_default() {
            s.capture.unwatch(tid);
        }
        let forgotten = s.pending.remove(&pid).map_or(0, |q| q.prompt);
        s.waiting = s.waiting.saturating_sub(forgotten);
        self.waiting.store(s.waiting, Ordering::Relaxed);
    }

    /// Drains the kernel's ring into the per-process queues, then hands `pid`'s records to
    /// `out` (oldest first).
    fn take(&self, pid: u32, out: &mut Vec<PendingRecord>) {
        let mut s = self.drained(Instant::now());
        let CaptureState {
            pending, waiting, ..
        } = &mut *s;
        if let Some(queue) = pending.get_mut(&pid) {
            *waiting = waiting.saturating_sub(queue.prompt);
            queue.prompt = 0;
            out.append(&mut queue.records);
        }
        self.waiting.store(s.waiting, Ordering::Relaxed);
    }

    /// Whether records that make `pid`'s source due wait, the ring drained first unless none
    /// waited at the last drain, less than [`DRAIN_EVERY`] before `now`.
    fn has_records(&self, pid: u32, now: Instant) -> bool {
        let recent = self
            .micros(now)
            .saturating_sub(self.drained_us.load(Ordering::Relaxed))
            < DRAIN_EVERY.as_micros() as u64;
        if recent && self.waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let s = self.drained(now);
        s.pending.get(&pid).is_some_and(|q| q.prompt > 0)
    }

    /// Microseconds from `since` to `now` (what `drained_us` holds).
    fn micros(&self, now: Instant) -> u64 {
        u64::try_from(now.duration_since(self.since).as_micros()).unwrap_or(u64::MAX)
    }

    /// The state, locked, with the ring drained into it at `now`.
    fn drained(&self, now: Instant) -> MutexGuard<'_, CaptureState> {
        let mut s = self.lock();
        s.drain();
        self.drained_us.store(self.micros(now), Ordering::Relaxed);
        self.waiting.store(s.waiting, Ordering::Relaxed);
        s
    }
}

impl CaptureState {
    /// Files every record of the kernel's ring under its process (those of processes no
    /// source watches are dropped).
    fn drain(&mut self) {
        let CaptureState {
            capture,
            pending,
            dropped,
            waiting,
            ..
        } = self;
        capture.drain(|r| {
            let Some(queue) = pending.get_mut(&r.pid) else {
                return;
            };
            if queue.records.len() >= MAX_PENDING {
                let first = queue.records.remove(0);
                *dropped += 1;
                if first.prompt() {
                    queue.prompt = queue.prompt.saturating_sub(1);
                    *waiting = waiting.saturating_sub(1);
                }
            }
            let record = PendingRecord {
                tid: r.tid,
                time_ns: r.time_ns,
                switched_out: r.switched_out(),
                unchanged: r.unchanged(),
                switched_in_ns: r.switched_in_ns(),
                holds_gil: r.holds_gil(),
                unknown_thread: r.unknown_thread(),
                truncated: r.truncated(),
                incomplete: r.unreadable().or(r
                    .truncated()
                    .then_some("a chain deeper than the capture copies")),
                frames: r.frame_bytes().to_vec(),
            };
            let now_due = record.prompt() || queue.records.len() + 1 == PROMPT_AT;
            if now_due {
                queue.prompt += 1;
                *waiting += 1;
            }
            queue.records.push(record);
        });
    }
}

impl SourceFactory for UnwinderFactory {
    type Source = UnwinderSource;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<UnwinderSource, String> {
        // In a pid namespace not the host's, the capture knows only that namespace's
        // processes: one in another (a nested container) is read from outside.
        let capture = self.capture.clone().filter(|shared| {
            let covered = shared.covers(p.pid);
            if !covered {
                tracing::warn!(
                    pid = p.pid,
                    "in another pid namespace than pyfleet's, which the kernel capture does \
                     not cover from here: reading it from outside"
                );
            }
            covered
        });
        let opts = UnwinderOptions {
            // A capturing source reads its process only to learn its threads: no marker
            // (unless it may turn to reads).
            frame_cache: capture.is_none() || self.reads_if_deeper,
            read_only: self.read_only,
            cpu_status: needs_cpu_status,
            blocking: self.blocking,
            ..Default::default()
        };
        let unwinder = cpython::attach(p.pid, opts).map_err(|e| e.to_string())?;
        Ok(UnwinderSource {
            unwinder,
            thread_frames: self.threads.then(|| ThreadFrames::new(p.pid)),
            idle: self.leave_out_idle.then(IdleStacks::default),
            reads_if_deeper: self.reads_if_deeper,
            switched_last: None,
            capture: capture.map(|shared| CaptureLink {
                shared,
                pid: p.pid as u32,
                next_call: None,
                refreshed: None,
                not_python: FxHashMap::default(),
                threads: Vec::new(),
                records: Vec::new(),
                last: CapturedCounts::default(),
                gone: None,
                deeper: false,
                wall: self
                    .off_cpu
                    .map(|o| WallTime::new(o.rate_hz, o.gil_holder_only)),
            }),
        })
    }
}

/// A capturing source's share of the [`SharedCapture`].
struct CaptureLink {
    shared: Arc<SharedCapture>,
    pid: u32,
    /// When the source is next called though no record waits (its next full read, or a
    /// retry of one that failed), and when the process was last read in full.
    next_call: Option<Instant>,
    refreshed: Option<Instant>,
    /// Threads the kernel told of that a read then found not running Python, and when.
    not_python: FxHashMap<u32, Instant>,
    /// The threads watched: those of the last full sample that succeeded.
    threads: Vec<cpython::CapturedThread>,
    records: Vec<PendingRecord>,
    /// What the last call held.
    last: CapturedCounts,
    /// A chain deeper than the capture copies was seen.
    deeper: bool,
    /// The process ended: reported at the call after the one that handed out what was
    /// captured before.
    gone: Option<SampleError>,
    /// Wall and gil modes (see [`UnwinderFactory::off_cpu`]).
    wall: Option<WallTime>,
}

impl CaptureLink {
    /// gil mode: the capture tells whether each thread holds the GIL.
    fn gil(&self) -> bool {
        self.wall.as_ref().is_some_and(WallTime::gil_holder_only)
    }
}

impl Drop for CaptureLink {
    fn drop(&mut self) {
        self.shared.forget(self.pid);
    }
}

/// One process's unwinder, as the actors see it.
pub struct UnwinderSource {
    unwinder: Unwinder<ProcessMemory>,
    /// See [`UnwinderFactory::threads`].
    thread_frames: Option<ThreadFrames>,
    /// See [`UnwinderFactory::leave_out_idle`].
    idle: Option<IdleStacks>,
    capture: Option<CaptureLink>,
    /// See [`UnwinderFactory::reads_if_deeper`].
    reads_if_deeper: bool,
    /// What the call that turned it to reads held (for that call only).
    switched_last: Option<CapturedCounts>,
}

fn sample_error(e: &cpython::UnwindError) -> SampleError {
    SampleError {
        kind: e.kind(),
        process_gone: e.is_process_gone(),
        message: e.to_string(),
    }
}

impl UnwinderSource {
    /// One call's samples, as every view but `--threads` has them.
    fn sample_stacks(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        if let Some(link) = self.capture.as_mut() {
            let result = Self::sample_captured(&mut self.unwinder, link, out);
            if link.deeper && self.reads_if_deeper {
                tracing::info!(
                    pid = link.pid,
                    "stacks deeper than the kernel capture copies: reading this process instead"
                );
                // Dropping the link stops capturing it; its last counts stay this call's.
                let last = link.last;
                self.capture = None;
                self.switched_last = Some(last);
            }
            return result;
        }
        self.switched_last = None;
        // A target that changed its stack under the read (a torn frame chain, a frame freed
        // mid-read) usually reads fine a moment later: one immediate retry, so the profile
        // loses fewer samples. Both attempts count in the unwinder's own error stats.
        let first = self.unwinder.sample().map(|_| ());
        let result = match first {
            Err(e) if !e.is_process_gone() => self.unwinder.sample().map(|_| ()),
            other => other,
        };
        if let Err(e) = result {
            return Err(SampleError {
                kind: e.kind(),
                process_gone: e.is_process_gone(),
                message: e.to_string(),
            });
        }
        out.extend(self.unwinder.last_sample().iter().map(|t| SampledThread {
            tid: t.native_thread_id,
            status: ThreadStatus {
                on_cpu: t.on_cpu.unwrap_or(false),
                holds_gil: t.holds_gil,
            },
            stack: u64::from(t.stack),
            samples: 1,
        }));
        Ok(self.unwinder.last_kind())
    }

    /// A tick of a capturing source: every chain captured for this process since the last
    /// tick, its threads learnt again first when due.
    fn sample_captured(
        unwinder: &mut Unwinder<ProcessMemory>,
        link: &mut CaptureLink,
        out: &mut Vec<SampledThread>,
    ) -> Result<SampleKind, SampleError> {
        link.last = CapturedCounts::default();
        if let Some(gone) = link.gone.take() {
            return Err(gone);
        }
        let mut records = std::mem::take(&mut link.records);
        let now = Instant::now();
        // Wall mode: time off the CPU is counted up to this, taken before the ring is drained
        // (a switch-in recorded before it is then in the drain).
        let now_ns = wall_time::now_ns();
        link.shared.take(link.pid, &mut records);
        if !link.not_python.is_empty() {
            link.not_python
                .retain(|_, at| now.duration_since(*at) < CAPTURE_RECHECK);
        }
        let known = |threads: &[cpython::CapturedThread], tid: u32| {
            threads.iter().find(|t| t.tid as u32 == tid).copied()
        };
        let new_thread_ran = records.iter().any(|r| {
            r.unknown_thread
                && known(&link.threads, r.tid).is_none()
                && !link.not_python.contains_key(&r.tid)
        });
        // What this call cost: a read (to learn the threads, or code objects not cached),
        // else whether it had chains to decode (from what the kernel copied alone), else
        // nothing.
        let mut kind = SampleKind::Kept;
        // Spread by pid, so that processes attached together are not all read at one tick.
        let refresh_every =
            CAPTURE_FULL_REFRESH + Duration::from_millis(u64::from(link.pid % 2000));
        let refresh_due = link
            .refreshed
            .is_none_or(|t| now.duration_since(t) >= refresh_every);
        let mut learnt = false;
        // Called again without records after CAPTURE_RETRY, unless the process has been
        // read in full since (then at its next full read, below): a call that fails on the
        // way retries.
        link.next_call = Some(now + CAPTURE_RETRY);
        if refresh_due || new_thread_ran {
            match unwinder.sample() {
                Ok(_) => {
                    kind = unwinder.last_kind();
                    learnt = true;
                    let first = link.refreshed.is_none();
                    link.refreshed = Some(now);
                    if refresh_due {
                        link.not_python.clear();
                    }
                    let threads = unwinder.captured_threads();
                    if let Some(wall) = link.wall.as_mut() {
                        // A thread not heard of yet is off its CPU in the stack this read
                        // found (asleep since before the capture watched it).
                        for t in unwinder.last_sample() {
                            let stack = SampledThread {
                                tid: t.native_thread_id,
                                status: ThreadStatus {
                                    on_cpu: false,
                                    holds_gil: t.holds_gil,
                                },
                                stack: u64::from(t.stack),
                                samples: 1,
                            };
                            wall.learnt(t.native_thread_id as u32, stack, now_ns);
                        }
                        wall.retain(|tid| threads.iter().any(|t| t.tid as u32 == tid));
                    }
                    if first || threads != link.threads {
                        link.threads = threads;
                        let layout = unwinder.capture_layout();
                        if let Err(message) =
                            link.shared
                                .watch(link.pid, &link.threads, layout, link.gil())
                        {
                            // Watched again at the next read, due after CAPTURE_RETRY.
                            link.threads.clear();
                            link.refreshed = None;
                            return Err(SampleError {
                                kind: "capture",
                                process_gone: false,
                                message,
                            });
                        }
                    }
                }
                // What was captured before it ended goes out first.
                Err(e) if e.is_process_gone() => link.gone = Some(sample_error(&e)),
                // Its threads are learnt at a later tick; the capture goes on meanwhile.
                Err(_) => {}
            }
        }
        if let Some(at) = link
            .refreshed
            .map(|t| t + refresh_every)
            .filter(|&at| at > now)
        {
            link.next_call = Some(at);
        }
        let reads_before = unwinder.memory().stats().reads();
        let mut first_error = None;
        let (mut failed, mut decoded) = (0usize, 0usize);
        let out_before = out.len();
        for r in records.drain(..) {
            link.deeper |= r.truncated;
            let thread = known(&link.threads, r.tid);
            let seen = Seen {
                tid: r.tid,
                at_ns: r.time_ns,
                switched_in_ns: r.switched_in_ns,
                holds_gil: r.holds_gil,
            };
            if let Some(wall) = link.wall.as_mut().filter(|_| thread.is_some()) {
                if r.unchanged {
                    failed += wall.switched_out(seen, SwitchedOut::Unchanged, out) as usize;
                    continue;
                }
            }
            let sampled = match (r.unknown_thread, r.incomplete, thread) {
                // A Python thread that ran before this source learnt it.
                (true, _, Some(_)) => {
                    unwinder.captured_failure("a thread that started since its process was read")
                }
                // Not Python, as the read just made found.
                (true, _, None) => {
                    if learnt && link.not_python.len() < MAX_NOT_PYTHON {
                        link.not_python.insert(r.tid, now);
                    }
                    continue;
                }
                (false, Some(why), _) => unwinder.captured_failure(why),
                // Captured before this source stopped watching it: a thread that ended.
                (false, None, None) => continue,
                (false, None, Some(t)) => unwinder.sample_captured(t, frames_in(&r.frames), false),
            };
            decoded += 1;
            // The kernel copied the chain (and took it as the thread's last) unless it said
            // it could not, or did not know the thread yet.
            let copied = !r.unknown_thread && r.incomplete.is_none();
            let chain = match sampled {
                Ok(t) => Chain::Stack(SampledThread {
                    tid: t.native_thread_id,
                    status: ThreadStatus {
                        on_cpu: !r.switched_out,
                        holds_gil: match link.gil() {
                            true => r.holds_gil,
                            false => t.holds_gil,
                        },
                    },
                    stack: u64::from(t.stack),
                    samples: 1,
                }),
                Err(e) => {
                    first_error.get_or_insert(e);
                    match copied {
                        true => Chain::Undecoded,
                        false => Chain::NotCopied,
                    }
                }
            };
            match link.wall.as_mut() {
                Some(wall) if r.switched_out => {
                    failed += wall.switched_out(seen, SwitchedOut::With(chain), out) as usize;
                }
                Some(wall) => failed += wall.on_cpu(seen, chain, out) as usize,
                None => match chain {
                    Chain::Stack(s) => out.push(s),
                    _ => failed += 1,
                },
            }
        }
        link.records = records;
        if let Some(wall) = link.wall.as_mut() {
            failed += wall.until(now_ns, out) as usize;
        }
        let taken: usize = out[out_before..].iter().map(|s| s.samples as usize).sum();
        // Chains decoded from what the kernel copied alone are `checked`; a call that read
        // the process (to learn its threads, or code objects not cached) is `read`.
        if kind == SampleKind::Kept && decoded > 0 {
            kind = match unwinder.memory().stats().reads() == reads_before {
                true => SampleKind::Checked,
                false => SampleKind::Read,
            };
        }
        if taken == 0 && first_error.is_none() {
            if let Some(gone) = link.gone.take() {
                return Err(gone);
            }
        }
        link.last = CapturedCounts {
            taken: taken as u64,
            failed: failed as u64,
            failed_kind: first_error.as_ref().map_or("", |e| e.kind()),
        };
        match (taken, first_error) {
            (0, Some(e)) => Err(sample_error(&e)),
            _ => Ok(kind),
        }
    }
}

impl StackSource for UnwinderSource {
    fn due(&mut self) -> bool {
        let Some(link) = self.capture.as_ref() else {
            return true;
        };
        if link.gone.is_some() {
            return true;
        }
        let now = Instant::now();
        link.next_call.is_none_or(|t| now >= t) || link.shared.has_records(link.pid, now)
    }

    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        let from = out.len();
        let result = self.sample_stacks(out);
        if let Some(idle) = self.idle.as_mut() {
            idle.leave_out(self.unwinder.stacks(), out, from);
        }
        if let Some(threads) = self.thread_frames.as_mut() {
            let now = Instant::now();
            if threads.names_due(now, out.iter().skip(from).map(|t| t.tid)) {
                // By kernel thread id, through the last full read's threads.
                let names = self.unwinder.threading_names().unwrap_or_default();
                let by_tid: Vec<(u64, String)> = self
                    .unwinder
                    .last_sample()
                    .iter()
                    .filter_map(|t| Some((t.native_thread_id, names.get(&t.thread_id)?.clone())))
                    .collect();
                threads.learn(by_tid.into_iter(), now);
            }
            let table = self.unwinder.stacks_mut();
            for t in out.iter_mut().skip(from) {
                let Ok(stack) = u32::try_from(t.stack) else {
                    continue;
                };
                t.stack = u64::from(threads.stack_of(table, stack, t.tid, now));
            }
        }
        result
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        let frames = self.unwinder.stacks().resolve(u32::try_from(stack).ok()?)?;
        Some(
            frames
                .map(|f| FrameInfo {
                    function: f.function.qualname.clone(),
                    file: f.function.filename.clone(),
                    line: f.line,
                })
                .collect(),
        )
    }

    fn captured_in_last(&self) -> Option<CapturedCounts> {
        self.capture.as_ref().map(|l| l.last).or(self.switched_last)
    }

    fn counts_at_batch(&self) -> bool {
        self.capture.as_ref().is_some_and(|l| l.wall.is_some())
    }

    fn stats(&self) -> SourceStats {
        let s = self.unwinder.stats();
        SourceStats {
            samples: s.samples,
            errors: s.errors,
            frame_cache_hits: s.frame_cache_hits,
            frame_cache_partial_hits: s.frame_cache_partial_hits,
            frame_cache_misses: s.frame_cache_misses,
            code_cache_hits: s.code_cache_hits,
            code_cache_misses: s.code_cache_misses,
            remote_reads: s.remote_reads,
            remote_read_bytes: s.remote_read_bytes,
        }
    }
}

/// Samples taken and failed so far, across every source a [`Counted`] factory attached.
#[derive(Debug, Default)]
pub struct SampleCounters {
    samples: AtomicU64,
    errors: AtomicU64,
}

impl SampleCounters {
    /// Successful samples (one per process per tick).
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Failed samples (not counting the one that finds a process gone).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A factory whose sources count their samples and errors into shared [`SampleCounters`].
pub struct Counted<F> {
    pub inner: F,
    pub counters: Arc<SampleCounters>,
}

impl<F: SourceFactory> SourceFactory for Counted<F> {
    type Source = CountedSource<F::Source>;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<Self::Source, String> {
        Ok(CountedSource {
            inner: self.inner.attach(p, needs_cpu_status)?,
            counters: self.counters.clone(),
        })
    }
}

/// A source of a [`Counted`] factory.
pub struct CountedSource<S> {
    inner: S,
    counters: Arc<SampleCounters>,
}

impl<S: StackSource> StackSource for CountedSource<S> {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        let r = self.inner.sample(out);
        match (&r, self.inner.captured_in_last()) {
            (Ok(_), Some(c)) => {
                self.counters.errors.fetch_add(c.failed, Ordering::Relaxed);
                self.counters.samples.fetch_add(c.taken, Ordering::Relaxed)
            }
            (Ok(_), None) => self.counters.samples.fetch_add(1, Ordering::Relaxed),
            // The process exiting is how a recording ends, not a failure.
            (Err(e), _) if e.process_gone => 0,
            (Err(_), c) => self
                .counters
                .errors
                .fetch_add(c.map_or(1, |c| c.failed.max(1)), Ordering::Relaxed),
        };
        r
    }

    fn due(&mut self) -> bool {
        self.inner.due()
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        self.inner.resolve(stack)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn captured_in_last(&self) -> Option<CapturedCounts> {
        self.inner.captured_in_last()
    }
}

#[cfg(test)]
mod tests {
    use super::{Capture, HowStacks, NotApplicable, WhyReads};

    #[test]
    fn auto_is_the_kernel_capture_only_where_it_applies() {
        let auto: Capture = "auto".parse().expect("parses");
        // Neither blocking nor the switch log, in any mode.
        assert_eq!(auto.resolve(false, false, "--capture"), Ok(Capture::Auto));
        for (blocking, switch_log, why) in [
            (true, false, NotApplicable::Blocking),
            (false, true, NotApplicable::SwitchLog),
        ] {
            assert_eq!(
                auto.resolve(blocking, switch_log, "--capture"),
                Ok(Capture::ReadsWhere(why))
            );
        }
        assert_eq!(
            Capture::Reads.resolve(true, false, "--capture"),
            Ok(Capture::ReadsWhere(NotApplicable::Blocking))
        );
        let kernel: Capture = "kernel".parse().expect("parses");
        assert_eq!(
            kernel.resolve(false, false, "--capture"),
            Ok(Capture::Kernel)
        );
        let paused = kernel.resolve(true, false, "capture");
        assert!(paused.is_err_and(|e| e.contains("does not go with blocking")));
        assert!("bpf".parse::<Capture>().is_err());
    }

    #[test]
    fn how_stacks_are_taken_is_said_with_one_reason() {
        let said = |how: HowStacks| (how.to_string(), how.codes());
        let (text, codes) = said(HowStacks::Kernel { namespaced: false });
        assert_eq!(
            (text.as_str(), codes),
            ("stacks from the kernel capture", ("kernel", ""))
        );
        let (text, _) = said(HowStacks::Kernel { namespaced: true });
        assert!(text.contains("pid namespace"), "{text}");
        for (how, code, words) in [
            (HowStacks::Reads(WhyReads::Asked), "asked", "asked for"),
            (
                HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::SwitchLog)),
                "switch_log",
                "--switch-log",
            ),
            (
                HowStacks::Reads(WhyReads::CannotStart {
                    code: "no_privilege",
                    why: "needs CAP_BPF".into(),
                }),
                "no_privilege",
                "needs CAP_BPF",
            ),
        ] {
            let (text, codes) = said(how);
            assert_eq!(codes, ("reads", code));
            assert!(text.starts_with("stacks read from outside: ") && text.contains(words));
        }
        let paused = HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking));
        assert_eq!(paused.codes(), ("paused", "blocking"));
    }
}
