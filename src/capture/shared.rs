//! The kernel capture shared by every source of a fleet: the one ring, drained by whichever
//! source comes first and filed under each record's process, at most [`MAX_PENDING`] records
//! waiting per process (older ones dropped and counted), and the two atomics an idle source's
//! tick looks at instead of the lock.

use super::kernel::KernelCapture;
use crate::cpython;
use crate::host::PidNamespace;
use crate::memory::capture_records::CapturedTask;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most captured records waiting for one process's source (about 4 s of one busy thread at
/// 1 kHz); past it the oldest are dropped and counted.
pub const MAX_PENDING: usize = 4096;

/// Records waiting for one process that make its source due though none is prompt (see
/// [`PendingRecord::prompt`]).
const PROMPT_AT: usize = MAX_PENDING / 4;

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

/// One captured chain, copied out of the ring for its process's source.
pub(super) struct PendingRecord {
    pub(super) tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds of the record.
    pub(super) time_ns: u64,
    /// Copied as the thread left its CPU (without frames when unchanged since the last chain
    /// sent for it).
    pub(super) switched_out: bool,
    pub(super) unchanged: bool,
    /// When the thread was last switched in (0: not known).
    pub(super) switched_in_ns: u64,
    /// The thread held the GIL.
    pub(super) holds_gil: bool,
    /// Switched out to wait for the GIL.
    pub(super) waits_gil: bool,
    /// A thread the capture does not watch ran: no frames.
    pub(super) unknown_thread: bool,
    /// Why the chain is not whole, if it is not.
    pub(super) incomplete: Option<&'static str>,
    /// It is not whole because it is deeper than the capture copies.
    pub(super) truncated: bool,
    /// The frames as the ring held them (`capture_records::frames_in`).
    pub(super) frames: Vec<u8>,
    /// The asyncio task the thread ran, as copied with the chain (none, or not asked).
    pub(super) task: Option<CapturedTask>,
    /// Its interpreter's collector ran: with the frame that started it (0: not known).
    pub(super) collecting: Option<u64>,
}

impl PendingRecord {
    /// Whether it makes its source due: all but a switch-out with the chain last sent, which
    /// names no code object that may go away and tells only when a stretch off the CPU began
    /// (it waits for the source's next call, at the latest the one before its next batch).
    pub(super) fn prompt(&self) -> bool {
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
    /// See [`KernelCapture::rate_hz`].
    rate_hz: u32,
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
            rate_hz: capture.rate_hz(),
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

    /// The rate every sample of the capture is taken at, whatever the sampling threads'
    /// rate: time off the CPU (wall and gil modes) counts at it too.
    pub fn rate_hz(&self) -> u32 {
        self.rate_hz
    }

    /// The time one sample of the capture stands for.
    pub fn period(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1) / self.rate_hz.max(1)
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
    pub(super) fn watch(
        &self,
        pid: u32,
        threads: &[cpython::CapturedThread],
        layout: crate::memory::capture_records::CaptureLayout,
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
                .watch(pid, tid, t.tstate, layout, t.gil, t.collector)
                .map_err(|e| e.to_string())?;
            now.push(tid);
        }
        s.pending.entry(pid).or_default();
        s.watched.insert(pid, now);
        Ok(())
    }

    /// Stops capturing `pid`'s threads and drops what waits for it.
    pub(super) fn forget(&self, pid: u32) {
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
    pub(super) fn take(&self, pid: u32, out: &mut Vec<PendingRecord>) {
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
    pub(super) fn has_records(&self, pid: u32, now: Instant) -> bool {
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
                waits_gil: r.waits_gil(),
                unknown_thread: r.unknown_thread(),
                truncated: r.truncated(),
                incomplete: r.unreadable().or(r
                    .truncated()
                    .then_some("a chain deeper than the capture copies")),
                frames: r.frame_bytes().to_vec(),
                task: r.task,
                collecting: r.collecting,
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
