//! The root package's stack sources for the fleet's actors: [`UnwinderFactory`] attaches one
//! [`UnwinderSource`] (the unwinder of `cpython`) per process; [`Counted`] wraps a factory to
//! count the samples taken and failed across the fleet (for `record`'s progress line).
//!
//! With a [`SharedCapture`] (`--capture kernel`), a source reads its process in full only to
//! learn its threads (when its thread list changed, looked at once a second, or every
//! [`CAPTURE_FULL_REFRESH`]); its samples are the chains
//! the kernel copied at interrupts of those threads since the last tick, as many per tick as
//! there were (each one thread on a CPU at one instant). The capture is one for the whole
//! fleet: the source that drains it files every record under its pid, and each source takes
//! its own (at most [`MAX_PENDING`] waiting per process; older ones are dropped and counted).
//!
//! Must not schedule anything (the actors decide when) nor format output (`output/` does).

use crate::cpython::{self, Unwinder, UnwinderOptions};
use crate::memory::kernel_capture::{KernelCapture, FRAME_BYTES};
use crate::memory::ProcessMemory;
use pyfleet_actors::{
    CapturedCounts, FrameInfo, ProcessInfo, SampleError, SampleKind, SampledThread, SourceFactory,
    SourceStats, StackSource, ThreadStatus,
};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a capturing source lists its process's threads: a full read follows when the
/// list changed (a thread started or ended), to learn the new thread states.
pub const CAPTURE_REFRESH: Duration = Duration::from_secs(1);

/// How often a capturing source reads its process in full even when its thread list did not
/// change (a thread that starts running Python without starting a thread: an embedded
/// interpreter's, or one whose id was reused within a second).
pub const CAPTURE_FULL_REFRESH: Duration = Duration::from_secs(10);

/// Most threads a capturing source lists.
const MAX_LISTED_THREADS: usize = 8192;

/// Most captured records waiting for one process's source (about 4 s of one busy thread at
/// 1 kHz); past it the oldest are dropped and counted.
pub const MAX_PENDING: usize = 4096;

/// Attaches the unwinder to each process.
#[derive(Clone, Default)]
pub struct UnwinderFactory {
    pub read_only: bool,
    /// Pause each target for its samples (`--blocking`).
    pub blocking: bool,
    /// Sample through the kernel capture instead (`--capture kernel`).
    pub capture: Option<Arc<SharedCapture>>,
}

/// One captured chain, copied out of the ring for its process's source.
struct PendingRecord {
    tid: u32,
    /// Why the chain is not whole, if it is not.
    incomplete: Option<&'static str>,
    frames: Vec<(u64, [u8; FRAME_BYTES])>,
}

struct CaptureState {
    capture: KernelCapture,
    /// Records waiting per pid, for pids some source watches.
    pending: FxHashMap<u32, Vec<PendingRecord>>,
    /// Watched threads per pid.
    watched: FxHashMap<u32, Vec<u32>>,
    dropped: u64,
}

/// The kernel capture, shared by every source of a fleet (see the module documentation).
pub struct SharedCapture {
    state: Mutex<CaptureState>,
}

impl SharedCapture {
    pub fn new(capture: KernelCapture) -> SharedCapture {
        SharedCapture {
            state: Mutex::new(CaptureState {
                capture,
                pending: FxHashMap::default(),
                watched: FxHashMap::default(),
                dropped: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CaptureState> {
        // A panic elsewhere while holding it leaves plain data behind: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records lost: no room in the kernel's ring, or too many waiting for one process.
    pub fn lost(&self) -> u64 {
        let s = self.lock();
        s.capture.lost() + s.dropped
    }

    /// Watches exactly `threads` of `pid` (those no longer listed are no longer captured).
    fn watch(
        &self,
        pid: u32,
        threads: &[cpython::CapturedThread],
        path: crate::memory::kernel_capture::FramePointerPath,
    ) -> Result<(), String> {
        let mut s = self.lock();
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
                .watch(tid, t.tstate, path)
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
        for tid in s.watched.remove(&pid).unwrap_or_default() {
            s.capture.unwatch(tid);
        }
        s.pending.remove(&pid);
    }

    /// Drains the kernel's ring into the per-process queues, then hands `pid`'s records to
    /// `out` (oldest first).
    fn take(&self, pid: u32, out: &mut Vec<PendingRecord>) {
        let mut s = self.lock();
        let CaptureState {
            capture,
            pending,
            dropped,
            ..
        } = &mut *s;
        capture.drain(|r| {
            let Some(queue) = pending.get_mut(&r.pid) else {
                return;
            };
            if queue.len() >= MAX_PENDING {
                queue.remove(0);
                *dropped += 1;
            }
            queue.push(PendingRecord {
                tid: r.tid,
                incomplete: r.unreadable().or(r
                    .truncated()
                    .then_some("a chain deeper than the capture copies")),
                frames: r
                    .frames()
                    .map(|(a, b)| {
                        let mut bytes = [0u8; FRAME_BYTES];
                        let n = b.len().min(FRAME_BYTES);
                        bytes[..n].copy_from_slice(&b[..n]);
                        (a, bytes)
                    })
                    .collect(),
            });
        });
        if let Some(queue) = pending.get_mut(&pid) {
            out.append(queue);
        }
    }
}

impl SourceFactory for UnwinderFactory {
    type Source = UnwinderSource;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<UnwinderSource, String> {
        let opts = UnwinderOptions {
            // A capturing source reads its process only to learn its threads: no marker.
            frame_cache: self.capture.is_none(),
            read_only: self.read_only,
            cpu_status: needs_cpu_status,
            blocking: self.blocking,
            ..Default::default()
        };
        let unwinder = cpython::attach(p.pid, opts).map_err(|e| e.to_string())?;
        Ok(UnwinderSource {
            unwinder,
            capture: self.capture.clone().map(|shared| CaptureLink {
                shared,
                pid: p.pid as u32,
                listed: None,
                refreshed: None,
                tids: Vec::new(),
                listing: Vec::new(),
                threads: Vec::new(),
                records: Vec::new(),
                last: CapturedCounts::default(),
            }),
        })
    }
}

/// A capturing source's share of the [`SharedCapture`].
struct CaptureLink {
    shared: Arc<SharedCapture>,
    pid: u32,
    /// When the thread list was last looked at, and the process last read in full.
    listed: Option<Instant>,
    refreshed: Option<Instant>,
    /// The thread ids listed then (sorted), and the list just taken.
    tids: Vec<i32>,
    listing: Vec<i32>,
    /// The threads watched: those of the last full sample that succeeded.
    threads: Vec<cpython::CapturedThread>,
    records: Vec<PendingRecord>,
    /// What the last call held.
    last: CapturedCounts,
}

impl Drop for CaptureLink {
    fn drop(&mut self) {
        self.shared.forget(self.pid);
    }
}

/// One process's unwinder, as the actors see it.
pub struct UnwinderSource {
    unwinder: Unwinder<ProcessMemory>,
    capture: Option<CaptureLink>,
}

fn sample_error(e: &cpython::UnwindError) -> SampleError {
    SampleError {
        kind: e.kind(),
        process_gone: e.is_process_gone(),
        message: e.to_string(),
    }
}

impl UnwinderSource {
    /// A tick of a capturing source: the threads learnt again when due, then every chain
    /// captured for this process since the last tick.
    fn sample_captured(
        unwinder: &mut Unwinder<ProcessMemory>,
        link: &mut CaptureLink,
        out: &mut Vec<SampledThread>,
    ) -> Result<SampleKind, SampleError> {
        // What this call cost: a full read to learn the threads, else whether it had chains
        // to decode (their code objects are validated with one read), else nothing.
        let mut kind = SampleKind::Kept;
        let full_due = link
            .refreshed
            .is_none_or(|t| t.elapsed() >= CAPTURE_FULL_REFRESH);
        let mut read_now = full_due;
        if full_due || link.listed.is_none_or(|t| t.elapsed() >= CAPTURE_REFRESH) {
            link.listed = Some(Instant::now());
            crate::process::thread_ids(link.pid as i32, MAX_LISTED_THREADS, &mut link.listing);
            read_now |= link.listing != link.tids;
        }
        if read_now {
            match unwinder.sample() {
                Ok(_) => {
                    kind = unwinder.last_kind();
                    let first = link.refreshed.is_none();
                    let now = Instant::now();
                    link.refreshed = Some(now);
                    link.listed = Some(now);
                    std::mem::swap(&mut link.tids, &mut link.listing);
                    let threads = unwinder.captured_threads();
                    if first || threads != link.threads {
                        link.threads = threads;
                        let path = unwinder.frame_pointer_path();
                        link.shared
                            .watch(link.pid, &link.threads, path)
                            .map_err(|message| SampleError {
                                kind: "capture",
                                process_gone: false,
                                message,
                            })?;
                    }
                }
                Err(e) if e.is_process_gone() => return Err(sample_error(&e)),
                // Its threads are learnt at the next tick; the capture goes on meanwhile.
                Err(_) => {}
            }
        }
        let mut records = std::mem::take(&mut link.records);
        link.shared.take(link.pid, &mut records);
        if !records.is_empty() {
            unwinder.begin_captured_batch();
            if kind == SampleKind::Kept {
                kind = SampleKind::Read;
            }
        }
        let mut first_error = None;
        let (mut taken, mut failed) = (0usize, 0usize);
        for r in records.drain(..) {
            let frames = r.frames.iter().map(|(a, b)| (*a, &b[..]));
            let thread = link.threads.iter().find(|t| t.tid as u32 == r.tid);
            let sampled = match (r.incomplete, thread) {
                (Some(why), _) => unwinder.captured_failure(why),
                // Captured before this source stopped watching it: a thread that ended.
                (None, None) => continue,
                (None, Some(&t)) => unwinder.sample_captured(t, frames, false),
            };
            match sampled {
                Ok(t) => {
                    taken += 1;
                    out.push(SampledThread {
                        thread_id: t.thread_id,
                        status: ThreadStatus {
                            on_cpu: true,
                            holds_gil: t.holds_gil,
                        },
                        stack: u64::from(t.stack),
                    });
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        link.records = records;
        match (taken, first_error) {
            (0, Some(e)) => Err(sample_error(&e)),
            (_, e) => {
                link.last = CapturedCounts {
                    taken: taken as u64,
                    failed: failed as u64,
                    failed_kind: e.map_or("", |e| e.kind()),
                };
                Ok(kind)
            }
        }
    }
}

impl StackSource for UnwinderSource {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        if let Some(link) = self.capture.as_mut() {
            return Self::sample_captured(&mut self.unwinder, link, out);
        }
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
            thread_id: t.thread_id,
            status: ThreadStatus {
                on_cpu: t.on_cpu.unwrap_or(false),
                holds_gil: t.holds_gil,
            },
            stack: u64::from(t.stack),
        }));
        Ok(self.unwinder.last_kind())
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
        self.capture.as_ref().map(|l| l.last)
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
            (Err(_), _) => self.counters.errors.fetch_add(1, Ordering::Relaxed),
        };
        r
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
