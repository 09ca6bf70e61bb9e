//! The root package's stack sources for the fleet's actors, an adapter only:
//! [`UnwinderFactory`] attaches one [`UnwinderSource`] (the unwinder of `cpython`) per
//! process, which samples by reading it from outside or, with a [`SharedCapture`], through
//! its [`CaptureLink`] (the kernel capture: see `crate::capture`); the views that apply to
//! every sample (`--threads`, wall mode's `--no-idle` and GIL blame) are applied here. [`Counted`] wraps a
//! factory to count the samples taken and failed across the fleet (for `record`'s progress
//! line).
//!
//! Must not schedule anything (the actors decide when) nor format output (`output/` does).

use crate::capture::{CaptureLink, OffCpu, SharedCapture};
use crate::cpython::asyncio::TaskScope;
use crate::cpython::{self, Unwinder, UnwinderOptions};
use crate::gil_blame::GilBlame;
use crate::idle_stacks::IdleStacks;
use crate::memory::ProcessMemory;
use crate::task_stacks::TaskView;
use crate::thread_frames::ThreadFrames;
use pyfleet_actors::{
    AttachFailure, CapturedCounts, FrameInfo, ProcessInfo, SampleError, SampleKind, SampledThread,
    SourceFactory, SourceStats, StackSource, ThreadStatus,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
    /// (see [`crate::capture::wall_time`]).
    pub off_cpu: Option<OffCpu>,
    /// `--threads`: each stack rooted at a frame naming its thread (see
    /// [`crate::thread_frames`]).
    pub threads: bool,
    /// Wall mode's `--no-idle`: threads off their CPU waiting for work left out (see
    /// [`crate::idle_stacks`]).
    pub leave_out_idle: bool,
    /// `--async`: asyncio task stacks (see [`crate::task_stacks`]).
    pub tasks: Option<TaskScope>,
    /// Wall mode, by reads: a thread waiting for the GIL charged to the holder's function
    /// (see [`crate::gil_blame`]).
    pub gil_blame: bool,
}

impl UnwinderFactory {
    /// The factory of what `sampling` asks for, through `capture` when it started.
    pub fn new(
        sampling: &crate::sampling_options::Sampling,
        capture: Option<Arc<SharedCapture>>,
    ) -> UnwinderFactory {
        UnwinderFactory {
            read_only: sampling.read_only,
            blocking: sampling.blocking,
            capture,
            reads_if_deeper: sampling.capture == crate::capture::Capture::Auto,
            off_cpu: OffCpu::for_mode(sampling.mode),
            threads: sampling.threads,
            leave_out_idle: sampling.leave_out_idle,
            tasks: sampling.tasks,
            gil_blame: sampling.mode == pyfleet_policies::Mode::Wall,
        }
    }
}

impl SourceFactory for UnwinderFactory {
    type Source = UnwinderSource;

    fn attach(
        &self,
        p: &ProcessInfo,
        needs_cpu_status: bool,
    ) -> Result<UnwinderSource, AttachFailure> {
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
            // Which threads wait for the GIL: pyfleet_thread_samples_total's states.
            gil_waits: true,
            blocking: self.blocking,
            ..Default::default()
        };
        let unwinder = cpython::attach(p.pid, opts).map_err(|e| {
            // What an exiting process no longer has (its memory, its maps) is no failure.
            match crate::process::has_ended_or_is_ending(p.pid) {
                true => AttachFailure::Ended(e.to_string()),
                false => AttachFailure::Failed(e.to_string()),
            }
        })?;
        // A process whose tasks cannot be read is sampled by thread all the same (a fleet
        // may mix versions; `record --pid` refuses it before it starts).
        let tasks = self
            .tasks
            .and_then(|scope| match TaskView::new(scope, &unwinder) {
                Ok(view) => Some(view),
                Err(e) => {
                    tracing::warn!(pid = p.pid, "no asyncio task stacks: {e}");
                    None
                }
            });
        Ok(UnwinderSource {
            tasks,
            unwinder,
            thread_frames: self.threads.then(|| ThreadFrames::new(p.pid)),
            idle: self.leave_out_idle.then(IdleStacks::default),
            gil_blame: self.gil_blame.then(GilBlame::default),
            reads_if_deeper: self.reads_if_deeper,
            switched_last: None,
            capture: capture.map(|shared| {
                let link = CaptureLink::new(shared, p.pid, self.off_cpu);
                match self.tasks {
                    Some(TaskScope::All) => link.called_every_tick(),
                    _ => link,
                }
            }),
        })
    }
}

/// One process's unwinder, as the actors see it.
pub struct UnwinderSource {
    unwinder: Unwinder<ProcessMemory>,
    /// See [`UnwinderFactory::threads`].
    thread_frames: Option<ThreadFrames>,
    /// See [`UnwinderFactory::leave_out_idle`].
    idle: Option<IdleStacks>,
    /// See [`UnwinderFactory::gil_blame`].
    gil_blame: Option<GilBlame>,
    /// See [`UnwinderFactory::tasks`].
    tasks: Option<TaskView>,
    capture: Option<CaptureLink>,
    /// See [`UnwinderFactory::reads_if_deeper`].
    reads_if_deeper: bool,
    /// What the call that turned it to reads held (for that call only).
    switched_last: Option<CapturedCounts>,
}

impl UnwinderSource {
    /// One call's samples, as every view but `--threads` has them.
    fn sample_stacks(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        if let Some(link) = self.capture.as_mut() {
            let result = link.sample(&mut self.unwinder, out, self.tasks.as_mut());
            if let Some(view) = self.tasks.as_mut() {
                view.count_if_due(&mut self.unwinder);
            }
            if link.deeper() && self.reads_if_deeper {
                tracing::info!(
                    pid = link.pid(),
                    "stacks deeper than the kernel capture copies: reading this process instead"
                );
                // Dropping the link stops capturing it; its last counts stay this call's.
                let last = link.last();
                self.capture = None;
                self.switched_last = Some(last);
            }
            return result;
        }
        self.switched_last = None;
        // A read the target changed under is read again by the unwinder itself (its one
        // retry policy, `MAX_SAMPLE_READS`); any failure that reaches here is counted.
        let sampled = match self.tasks.as_mut() {
            Some(view) => self.unwinder.sample_then(|u| view.read(u)),
            None => self.unwinder.sample().map(|_| ()),
        };
        if let Err(e) = sampled {
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
                waits_gil: t.waits_gil,
            },
            stack: u64::from(t.stack),
            samples: 1,
        }));
        Ok(self.unwinder.last_kind())
    }
}

impl StackSource for UnwinderSource {
    fn due(&mut self) -> bool {
        self.capture.as_ref().is_none_or(CaptureLink::due)
    }

    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        let from = out.len();
        let result = self.sample_stacks(out);
        // What the threads ran, for the task view to blame ready tasks on, before the idle
        // view leaves any out (a loop waking from its wait is blamed on that).
        if let Some(view) = self.tasks.as_mut() {
            view.see_threads(&out[from..]);
        }
        if let Some(idle) = self.idle.as_mut() {
            idle.leave_out(self.unwinder.stacks(), out, from);
        }
        // The task view after the idle one, which judges the threads, and then the waiting
        // tasks it added (a running task's thread was on its CPU). A capturing
        // source has the running tasks from the chains; in all mode the waiting ones are read
        // now, and a read of them that fails is one failed sample of this call (the captured
        // chains stay).
        if let (Ok(_), Some(view)) = (&result, self.tasks.as_mut()) {
            if let Some(link) = self.capture.as_mut() {
                if let Err(e) = view.read_waiting(&mut self.unwinder, link.wall_rate()) {
                    link.count_failure(e.kind());
                }
            }
            let waiting_from = out.len();
            view.apply(
                out,
                from,
                self.unwinder.stacks_mut(),
                self.capture.is_none(),
            );
            if let Some(idle) = self.idle.as_mut() {
                idle.leave_out_tasks(self.unwinder.stacks(), out, waiting_from);
            }
        }
        // By reads only: a call's statuses are then one instant's. The capture knows who
        // held the GIL only as of its last full read.
        if let (Some(blame), None) = (self.gil_blame.as_mut(), &self.capture) {
            blame.apply(self.unwinder.stacks_mut(), &mut out[from..]);
        }
        if let Some(threads) = self.thread_frames.as_mut() {
            let now = Instant::now();
            if threads.names_due(now, out.iter().skip(from).map(|t| t.tid)) {
                // By kernel thread id, through the last full read's threads.
                let names = self.unwinder.threading_names().unwrap_or_default();
                let by_tid: Vec<(u64, Option<String>)> = self
                    .unwinder
                    .last_sample()
                    .iter()
                    .map(|t| (t.native_thread_id, names.get(&t.thread_id).cloned()))
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
        self.capture
            .as_ref()
            .map(CaptureLink::last)
            .or(self.switched_last)
    }

    fn counts_at_batch(&self) -> bool {
        self.capture
            .as_ref()
            .is_some_and(CaptureLink::counts_off_cpu)
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
            asyncio_tasks: self.tasks.as_ref().and_then(TaskView::counts),
            idle_left_out: self.idle.as_ref().map_or(0, IdleStacks::left_out),
        }
    }
}

/// Samples taken and failed so far, across every source a [`Counted`] factory attached.
#[derive(Debug, Default)]
pub struct SampleCounters {
    samples: AtomicU64,
    errors: AtomicU64,
    idle_left_out: AtomicU64,
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

    /// Samples of threads and tasks waiting for work left out (wall mode without `--idle`).
    pub fn idle_left_out(&self) -> u64 {
        self.idle_left_out.load(Ordering::Relaxed)
    }
}

/// A factory whose sources count their samples and errors into shared [`SampleCounters`].
pub struct Counted<F> {
    pub inner: F,
    pub counters: Arc<SampleCounters>,
}

impl<F: SourceFactory> SourceFactory for Counted<F> {
    type Source = CountedSource<F::Source>;

    fn attach(
        &self,
        p: &ProcessInfo,
        needs_cpu_status: bool,
    ) -> Result<Self::Source, AttachFailure> {
        Ok(CountedSource {
            inner: self.inner.attach(p, needs_cpu_status)?,
            counters: self.counters.clone(),
            idle_left_out: 0,
        })
    }
}

/// A source of a [`Counted`] factory.
pub struct CountedSource<S> {
    inner: S,
    counters: Arc<SampleCounters>,
    /// The source's count of idle samples left out, as last added.
    idle_left_out: u64,
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
        let left_out = self.inner.stats().idle_left_out;
        self.counters.idle_left_out.fetch_add(
            left_out.saturating_sub(self.idle_left_out),
            Ordering::Relaxed,
        );
        self.idle_left_out = left_out;
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
