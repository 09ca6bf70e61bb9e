//! One sampled process on a sampling thread: its [`StackSource`] and everything its sampling
//! needs (the tally, the metric handles, the consecutive-error count, the settings), and how
//! it ends.
//!
//! Owns [`Slot`], [`SlotSettings`], [`SlotEnd`] and the life ids ([`next_life`]). A slot is
//! built by its owner (the supervisor) once the process's source is attached, handed to a
//! sampling thread ([`sampling`](crate::sampling)), and from then on used only by that
//! thread. Its contract:
//! - every tick ([`Slot::sample`]), when its source is due ([`StackSource::due`]; a slot
//!   not due for a few ticks in a row is [`Slot::dormant`], looked at every [`DORMANT_POLL`]
//!   only): applies the [`Mode`] to each thread's status and tallies
//!   `(stack id, status)` locally (no allocation once the tally has seen the stacks; the
//!   thread's `out` buffer is reused), records `pyfleet_sample_duration_seconds`, counts
//!   samples and errors by kind. A sample slower than [`SLOW_SAMPLE`] costs its own process
//!   the next ticks, never the other slots;
//! - every `batch_interval` (checked after each tick), and once more when the slot ends
//!   however it ends ([`Slot::flush_if_due`], [`Slot::finish`]): calls a source that
//!   [counts at batches](StackSource::counts_at_batch) once more, then sends the aggregator a
//!   batch: the counts, plus the frames of stack ids not sent before in this life (resolved
//!   once per stack id; past a cap of remembered ids it forgets them all, bumps an epoch and
//!   resends, which bounds memory here and in the aggregator), and turns the increases of
//!   [`SourceStats`] into counters;
//! - it ends ([`SlotEnd`]) by itself on a [`SampleError`](crate::SampleError) with
//!   `process_gone` ([`SlotEnd::ProcessGone`]), after `max_consecutive_errors` errors in a
//!   row or on a panic in any call into its source ([`SlotEnd::Failed`]; the panic is caught
//!   and ends this slot only), or when the thread removes it ([`SlotEnd::Removed`]: asked
//!   to, its owner dropped the "done" receiver, or the thread stops);
//! - however it ends, in this order: the final batch is sent, the source dropped (a panic in
//!   its `Drop` caught), the end given to the slot's [`OnEnd`], then "done" fired. So an owner
//!   that waits for "done" knows the final batch is at the aggregator. A slot dropped without
//!   finishing (its thread unwinding) reports [`SlotEnd::Failed`]; one discarded before it
//!   was ever sampled ([`Slot::discard`]) reports nothing.
//!
//! It must not attach sources, decide restarts, aggregate across processes, or write files.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};
use pyfleet_policies::Mode;
use ractor::ActorRef;
use tokio::sync::oneshot;

use crate::aggregator::{AggregatorMsg, Batch};
use crate::metric_names as m;
use crate::panics::guard;
use crate::snapshot::UNKNOWN_FUNCTION;
use crate::source::{
    FrameInfo, Labels, ProcessInfo, SampleKind, SampledThread, SourceStats, StackSource,
    ThreadStatus,
};

/// Sampler lives (a restart is a new life); also the id of the life's slot.
static NEXT_LIFE: AtomicU64 = AtomicU64::new(1);

/// A new life id, unique in this process.
pub(crate) fn next_life() -> u64 {
    NEXT_LIFE.fetch_add(1, Ordering::Relaxed)
}

/// Settings every slot gets from the fleet configuration. (The rate is not among them: it is
/// one for the fleet and belongs to the sampling threads.)
#[derive(Debug, Clone)]
pub(crate) struct SlotSettings {
    pub mode: Mode,
    pub batch_interval: Duration,
    pub max_consecutive_errors: u32,
    /// Stack ids remembered as sent before the slot forgets them and starts a new epoch.
    pub max_known_stacks: usize,
}

/// How a slot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotEnd {
    /// Removed by its thread: asked to, abandoned by its owner, or the thread stopped.
    Removed,
    /// The process is gone (a sample error said so); the message says how it was seen.
    ProcessGone(String),
    /// Too many sample errors in a row, or a panic in the source; the message says which.
    Failed(String),
}

/// Told how a slot ended, once, on the sampling thread (after the final batch is sent and the
/// source dropped). It must not block: the thread's other slots wait for it.
pub(crate) type OnEnd = Box<dyn FnOnce(SlotEnd) + Send>;

/// One process on a sampling thread: its source and everything its sampling needs; see the
/// module documentation.
pub(crate) struct Slot {
    id: u64,
    work: SlotWork,
    reporter: Reporter,
}

/// The part of a slot that the thread drops (with the source) before reporting the end.
struct SlotWork {
    source: Box<dyn StackSource>,
    tally: Tally,
    metrics: ProcessMetrics,
    mode: Mode,
    batch_interval: Duration,
    max_consecutive_errors: u32,
    consecutive_errors: u32,
    next_flush: Instant,
    /// Slow samples in a row, and the ticks still to skip for them (see [`SLOW_SAMPLE`]).
    slow_streak: u32,
    skip: u32,
    /// Calls of [`Slot::sample`] (see [`OWNER_CHECK_EVERY`]).
    samples_called: u32,
    /// Ticks in a row at which the source was not due, and when it last was (see
    /// [`Slot::dormant`]).
    not_due: u32,
    last_due: Instant,
    /// What a tick's sample stands for, as of the last tick (see [`Slot::sample`]).
    tick: Duration,
    /// Ticks skipped since the last sample (slow samples): the next one stands for them too.
    owed_ticks: u32,
}

/// A slot whose source was not due at this many ticks in a row, for at least
/// [`DORMANT_QUIET`], is dormant: its thread asks it again only every [`DORMANT_POLL`]. (A
/// busy process at a high rate has ticks with nothing now and then; only a quiet spell
/// longer than that makes it dormant.)
const DORMANT_AFTER: u32 = 3;
const DORMANT_QUIET: Duration = Duration::from_millis(30);
/// How often a sampling thread looks at a dormant slot.
pub(crate) const DORMANT_POLL: Duration = Duration::from_millis(100);

/// A slot asks whether its owner abandoned it once in this many ticks.
const OWNER_CHECK_EVERY: u32 = 64;

/// A sample that takes longer than this costs its process the next ticks (1, then 2, 4... up
/// to [`MAX_SLOW_SKIP`] while its samples stay slow): a process whose memory is built to be
/// expensive to read slows itself, not the fleet on its sampling thread. Ordinary samples
/// take microseconds, the first of a process (code objects read afresh) up to a millisecond
/// or two.
pub(crate) const SLOW_SAMPLE: Duration = Duration::from_millis(5);
/// Most ticks skipped after one slow sample.
const MAX_SLOW_SKIP: u32 = 64;

/// Tells the slot's owner how it ended, then fires "done". Dropped without
/// [`Reporter::report`] (the sampling thread unwinding with the slot on it), it reports a
/// failure, so no owner is left waiting for samples that will never come.
struct Reporter {
    /// `None` once used.
    on_end: Option<OnEnd>,
    /// Fired after the end is reported; `None` once used. Its receiver, dropped, abandons the
    /// slot.
    done: Option<oneshot::Sender<()>>,
}

impl Reporter {
    fn report(mut self, end: SlotEnd) {
        if let Some(on_end) = self.on_end.take() {
            on_end(end);
        }
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }

    /// Used up without a word (a slot never sampled); "done" is dropped unsent.
    fn silence(mut self) {
        self.on_end = None;
        self.done = None;
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(on_end) = self.on_end.take() {
            on_end(SlotEnd::Failed(
                "the sampling thread dropped this process without ending it".to_string(),
            ));
        }
    }
}

impl Slot {
    /// A slot for life `life` of the process `info`, sampling `source`; `on_end` is told how
    /// it ends. Also returns the receiver of its "done" signal: fired once it has ended and
    /// reported; dropping it abandons the slot (its thread removes it at the next tick).
    pub(crate) fn new(
        life: u64,
        info: &ProcessInfo,
        settings: &SlotSettings,
        source: Box<dyn StackSource>,
        on_end: OnEnd,
    ) -> (Self, oneshot::Receiver<()>) {
        let (done_tx, done_rx) = oneshot::channel();
        let reporter = Reporter {
            on_end: Some(on_end),
            done: Some(done_tx),
        };
        let now = Instant::now();
        let slot = Slot {
            id: life,
            work: SlotWork {
                source,
                tally: Tally {
                    life,
                    epoch: 0,
                    pid: info.pid,
                    name: Arc::from(info.name.as_str()),
                    role: info.role,
                    labels: Arc::new(info.labels.clone()),
                    counts: HashMap::new(),
                    sampled_ns: 0,
                    known: HashSet::new(),
                    max_known: settings.max_known_stacks.max(1),
                },
                metrics: ProcessMetrics::new(info),
                mode: settings.mode,
                batch_interval: settings.batch_interval,
                max_consecutive_errors: settings.max_consecutive_errors,
                consecutive_errors: 0,
                next_flush: later(now, settings.batch_interval),
                slow_streak: 0,
                skip: 0,
                samples_called: 0,
                not_due: 0,
                last_due: Instant::now(),
                tick: Duration::ZERO,
                owed_ticks: 0,
            },
            reporter,
        };
        (slot, done_rx)
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn pid(&self) -> i32 {
        self.work.tally.pid
    }

    /// Placed on a sampling thread at `now`: the first batch is due one interval later.
    pub(crate) fn placed(&mut self, now: Instant) {
        self.work.next_flush = later(now, self.work.batch_interval);
    }

    /// The owner is gone without asking for removal (it dropped the "done" receiver).
    pub(crate) fn abandoned(&self) -> bool {
        self.reporter.done.as_ref().is_none_or(|d| d.is_closed())
    }

    /// One sample, tallied; `tick`: the time since the sampling thread's last tick (its period,
    /// more after ticks it missed): what each thread's sample stands for, with the ticks this
    /// slot skipped since its last sample, unless the source says otherwise (the capture's).
    /// `Some` when the slot must end.
    pub(crate) fn sample(
        &mut self,
        out: &mut Vec<SampledThread>,
        tick: Duration,
    ) -> Option<SlotEnd> {
        self.work.tick = tick;
        // Whether the owner abandoned the slot is asked every OWNER_CHECK_EVERY samples
        // only: it costs a cold cache line of every slot at every tick.
        self.work.samples_called = self.work.samples_called.wrapping_add(1);
        if self.work.samples_called.is_multiple_of(OWNER_CHECK_EVERY) && self.abandoned() {
            return Some(SlotEnd::Removed);
        }
        let w = &mut self.work;
        if !w.source.due() {
            w.not_due = w.not_due.saturating_add(1);
            return None;
        }
        w.not_due = 0;
        w.last_due = Instant::now();
        self.collect(out)
    }

    /// Calls the source and tallies what it returns (a tick's sample, or the call before a
    /// batch). `Some` when the slot must end.
    fn collect(&mut self, out: &mut Vec<SampledThread>) -> Option<SlotEnd> {
        let w = &mut self.work;
        out.clear();
        if w.skip > 0 {
            w.skip -= 1;
            w.owed_ticks = w.owed_ticks.saturating_add(1);
            w.metrics.slow_skips.increment(1);
            return None;
        }
        let began = Instant::now();
        let result = guard(|| w.source.sample(out));
        let took = began.elapsed();
        w.metrics.took(took);
        if took > SLOW_SAMPLE {
            w.slow_streak = w.slow_streak.saturating_add(1);
            w.skip = (1u32 << (w.slow_streak - 1).min(6)).min(MAX_SLOW_SKIP);
        } else {
            w.slow_streak = 0;
        }
        match result {
            Ok(Ok(kind)) => {
                w.consecutive_errors = 0;
                let captured = w.source.captured_in_last();
                let ticks = w.owed_ticks.saturating_add(1);
                let each = captured.map_or(w.tick.saturating_mul(ticks), |c| c.period);
                w.owed_ticks = 0;
                w.metrics
                    .succeeded(kind, took, captured.map_or(1, |c| c.taken));
                if let Some(c) = captured {
                    for _ in 0..c.failed {
                        w.metrics.error(c.failed_kind);
                        w.metrics.failed();
                    }
                }
                for thread in out.iter() {
                    let s = thread.status;
                    w.metrics.thread_state(s, thread.samples);
                    if w.mode.counts(s.on_cpu, s.holds_gil) {
                        w.tally.add(thread.stack, s, thread.samples, each);
                    }
                }
                None
            }
            Ok(Err(e)) => {
                // A failed sample's time is not known: it stands for nothing.
                w.owed_ticks = 0;
                if e.process_gone {
                    w.metrics.error(e.kind);
                    return Some(SlotEnd::ProcessGone(e.message));
                }
                // A capturing source's call fails when every sample it held failed.
                let failed = w.source.captured_in_last().map_or(1, |c| c.failed.max(1));
                for _ in 0..failed {
                    w.metrics.error(e.kind);
                    w.metrics.failed();
                }
                w.consecutive_errors = w.consecutive_errors.saturating_add(1);
                if w.consecutive_errors >= w.max_consecutive_errors {
                    return Some(SlotEnd::Failed(format!(
                        "{} consecutive sample errors, the last: {e}",
                        w.consecutive_errors
                    )));
                }
                None
            }
            Err(panic) => Some(SlotEnd::Failed(format!("sample panicked: {panic}"))),
        }
    }

    /// The source was not due at the last [`DORMANT_AFTER`] ticks, for [`DORMANT_QUIET`] at
    /// least: it holds nothing and has nothing to do, so the thread may look at it less often
    /// (see [`StackSource::due`]).
    pub(crate) fn dormant(&self) -> bool {
        self.work.not_due >= DORMANT_AFTER && self.work.last_due.elapsed() >= DORMANT_QUIET
    }

    /// When the next batch is due ([`Slot::flush_if_due`] does nothing before).
    pub(crate) fn next_flush(&self) -> Instant {
        self.work.next_flush
    }

    /// Counts ticks this slot (like every slot on its thread) missed.
    pub(crate) fn missed(&self, ticks: u64) {
        self.work.metrics.missed.increment(ticks);
    }

    /// Sends a batch if one is due at `now`, a source that [counts at
    /// batches](StackSource::counts_at_batch) called first (into `out`). `Some` when the slot
    /// must end (that call ended it, or a panic in the source while resolving stacks or
    /// reading its stats; the batch went out regardless).
    pub(crate) fn flush_if_due(
        &mut self,
        now: Instant,
        aggregator: &ActorRef<AggregatorMsg>,
        out: &mut Vec<SampledThread>,
    ) -> Option<SlotEnd> {
        if now < self.work.next_flush {
            return None;
        }
        let ended = match self.work.source.counts_at_batch() {
            true => self.collect(out),
            false => None,
        };
        let w = &mut self.work;
        w.next_flush = later(w.next_flush, w.batch_interval);
        if w.next_flush <= now {
            w.next_flush = later(now, w.batch_interval);
        }
        let flushed = flush(
            &mut w.tally,
            &mut w.metrics,
            w.source.as_ref(),
            aggregator,
            false,
        );
        ended.or(flushed.err().map(SlotEnd::Failed))
    }

    /// Ends the slot: a removed capturing source collects once more; sends the final batch,
    /// drops the source (a panic in its `Drop` is caught), then tells the owner how it ended
    /// and fires "done". A panic in the source while flushing turns any end into a failure.
    pub(crate) fn finish(mut self, aggregator: &ActorRef<AggregatorMsg>, end: SlotEnd) {
        if matches!(end, SlotEnd::Removed) && self.work.source.captured_in_last().is_some() {
            // A capturing source holds what was taken since its last tick: collected once
            // more, so that stopping loses none of it.
            let _ = self.collect(&mut Vec::new());
        }
        let Slot {
            id: _,
            mut work,
            reporter,
        } = self;
        let flushed = flush(
            &mut work.tally,
            &mut work.metrics,
            work.source.as_ref(),
            aggregator,
            true,
        );
        let end = match (flushed, end) {
            (_, SlotEnd::Failed(why)) | (Err(why), _) => SlotEnd::Failed(why),
            (Ok(()), end) => end,
        };
        let pid = work.tally.pid;
        let name = work.tally.name.clone();
        if let Err(panic) = guard(move || drop(work)) {
            tracing::warn!(pid, process = %name, "dropping the stack source panicked: {panic}");
        }
        if let SlotEnd::Failed(why) = &end {
            tracing::warn!(pid, process = %name, "sampler failed: {why}");
        }
        reporter.report(end);
    }

    /// Drops a slot that was never sampled (its owner went away before it was placed, or no
    /// thread took it), sending and reporting nothing.
    pub(crate) fn discard(self) {
        let Slot {
            id: _,
            work,
            reporter,
        } = self;
        let _ = guard(move || drop(work));
        reporter.silence();
    }
}

/// `t + d`, saturating far in the future.
fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(t)
}

/// Sends the tally as a batch and exports the source's counters. `Err` is a panic in the
/// source (while resolving or reading stats); the batch is sent regardless.
fn flush<S: StackSource + ?Sized>(
    tally: &mut Tally,
    metrics: &mut ProcessMetrics,
    source: &S,
    aggregator: &ActorRef<AggregatorMsg>,
    last: bool,
) -> Result<(), String> {
    let (batch, resolved) = tally.batch(source, last);
    // The aggregator is gone only when the fleet is shutting down: nothing to do about it.
    let _ = aggregator.send_message(AggregatorMsg::Batch(batch));
    metrics.publish();
    let stats = guard(|| source.stats());
    if let Ok(stats) = &stats {
        metrics.add_stats(stats);
    }
    metrics.touch();
    resolved?;
    stats.map(|_| ())
}

/// The counts since the last batch, and what was sent of this life's stacks.
struct Tally {
    life: u64,
    epoch: u64,
    pid: i32,
    name: Arc<str>,
    role: pyfleet_policies::Role,
    labels: Arc<Labels>,
    counts: HashMap<(u64, ThreadStatus), u64>,
    /// The time the samples in `counts` stand for, nanoseconds.
    sampled_ns: u64,
    known: HashSet<u64>,
    max_known: usize,
}

impl Tally {
    /// `samples` more of a stack, each standing for `each`.
    fn add(&mut self, stack: u64, status: ThreadStatus, samples: u32, each: Duration) {
        let n = self.counts.entry((stack, status)).or_default();
        *n = n.saturating_add(u64::from(samples));
        let ns = u64::try_from(each.as_nanos()).unwrap_or(u64::MAX);
        self.sampled_ns = self
            .sampled_ns
            .saturating_add(ns.saturating_mul(u64::from(samples)));
    }

    /// Drains the counts into a batch (keeping the map's capacity). The second value is `Err`
    /// with the message of a panic in `resolve`; the batch is complete regardless (the stack
    /// is marked unknown).
    fn batch<S: StackSource + ?Sized>(
        &mut self,
        source: &S,
        last: bool,
    ) -> (Batch, Result<(), String>) {
        if self.known.len() > self.max_known {
            self.known.clear();
            self.epoch += 1;
        }
        let mut resolved = Ok(());
        let mut counts = Vec::with_capacity(self.counts.len());
        let mut new_stacks = Vec::new();
        for ((stack, status), n) in self.counts.drain() {
            if self.known.insert(stack) {
                let frames = match guard(|| source.resolve(stack)) {
                    Ok(Some(frames)) => frames,
                    Ok(None) => unknown_stack(),
                    Err(panic) => {
                        resolved = Err(format!("resolve panicked: {panic}"));
                        unknown_stack()
                    }
                };
                new_stacks.push((stack, frames));
            }
            counts.push((stack, status, n));
        }
        let batch = Batch {
            life: self.life,
            epoch: self.epoch,
            pid: self.pid,
            name: self.name.clone(),
            role: self.role,
            labels: self.labels.clone(),
            counts,
            sampled_ns: std::mem::take(&mut self.sampled_ns),
            new_stacks,
            last,
        };
        (batch, resolved)
    }
}

fn unknown_stack() -> Vec<FrameInfo> {
    vec![FrameInfo::new(UNKNOWN_FUNCTION, "", None)]
}

/// The per-process metric handles of one sampler, registered once.
struct ProcessMetrics {
    /// The labels of every series of this process (see [`process_labels`]).
    base: Vec<metrics::Label>,
    samples: Counter,
    duration: Histogram,
    missed: Counter,
    slow_skips: Counter,
    errors: Vec<(&'static str, Counter)>,
    /// Samples that succeeded and failed, and their ratio as a gauge.
    succeeded: u64,
    failed: u64,
    failure_ratio: Gauge,
    /// What samples recorded since the last flush: successes and the time of each sample
    /// (handed to the exporter at each batch, not at every sample: see [`Self::publish`]).
    pending_samples: u64,
    pending_durations: Vec<f64>,
    /// Successful samples and the nanoseconds they took since the last flush, by kind.
    pending_kinds: [(u64, u64); 3],
    frame_cache_hits: Counter,
    frame_cache_partial_hits: Counter,
    frame_cache_misses: Counter,
    code_cache_hits: Counter,
    code_cache_misses: Counter,
    remote_reads: Counter,
    remote_read_bytes: Counter,
    idle_left_out: Counter,
    /// `pyfleet_sample_kinds_total` (kept, checked, read).
    kinds: [Counter; 3],
    /// `pyfleet_asyncio_tasks` (running, pending), once the source counts tasks.
    asyncio_tasks: Option<[Gauge; 2]>,
    /// `pyfleet_thread_samples_total` by [`ThreadStatus::STATES`], and what the samples
    /// since the last flush add to each.
    thread_states: [Counter; 4],
    pending_states: [u64; 4],
    last: SourceStats,
}

/// Most sample times held between two flushes; past it (a flush long overdue) they go to the
/// exporter at once.
const MAX_PENDING_DURATIONS: usize = 4096;

/// The `kind` labels of `pyfleet_sample_kinds_total`.
const SAMPLE_KINDS: [&str; 3] = ["kept", "checked", "read"];

/// Time inside successful samples of every slot, by kind (nanoseconds).
static KIND_NANOS: [std::sync::atomic::AtomicU64; 3] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Seconds spent inside successful samples of every process since pyfleet started, by kind
/// (`pyfleet_sample_kind_seconds_total`).
pub fn sample_kind_seconds() -> [(&'static str, f64); 3] {
    let mut out = [("", 0.0); 3];
    for (o, (kind, total)) in out.iter_mut().zip(SAMPLE_KINDS.iter().zip(&KIND_NANOS)) {
        *o = (
            *kind,
            total.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9,
        );
    }
    out
}

/// The labels of a process's series: `process`, `role` and `pid`, and of its labels only the
/// bounded ones, `service` and `namespace` (one value each per process; the others would make
/// a series per container).
pub(crate) fn process_labels(info: &ProcessInfo) -> Vec<metrics::Label> {
    let mut labels = vec![
        metrics::Label::new("process", info.name.clone()),
        metrics::Label::new("role", info.role.as_str()),
        metrics::Label::new("pid", info.pid.to_string()),
    ];
    for key in ["service", "namespace"] {
        if let Some(v) = info.labels.get(key) {
            labels.push(metrics::Label::new(key, v.to_string()));
        }
    }
    labels
}

impl ProcessMetrics {
    fn new(info: &ProcessInfo) -> Self {
        let base = process_labels(info);
        let counter = |name: &'static str| metrics::counter!(name, base.iter());
        ProcessMetrics {
            samples: counter(m::SAMPLES),
            duration: metrics::histogram!(m::SAMPLE_DURATION, base.iter()),
            missed: counter(m::MISSED_TICKS),
            slow_skips: counter(m::SLOW_SKIPS),
            errors: Vec::new(),
            succeeded: 0,
            failed: 0,
            pending_samples: 0,
            pending_durations: Vec::new(),
            pending_kinds: [(0, 0); 3],
            failure_ratio: metrics::gauge!(m::SAMPLE_FAILURE_RATIO, base.iter()),
            frame_cache_hits: counter(m::FRAME_CACHE_HITS),
            frame_cache_partial_hits: counter(m::FRAME_CACHE_PARTIAL_HITS),
            frame_cache_misses: counter(m::FRAME_CACHE_MISSES),
            code_cache_hits: counter(m::CODE_CACHE_HITS),
            code_cache_misses: counter(m::CODE_CACHE_MISSES),
            remote_reads: counter(m::REMOTE_READS),
            remote_read_bytes: counter(m::REMOTE_READ_BYTES),
            idle_left_out: counter(m::IDLE_LEFT_OUT),
            kinds: SAMPLE_KINDS.map(|kind| {
                let mut labels = base.clone();
                labels.push(metrics::Label::new("kind", kind));
                metrics::counter!(m::SAMPLE_KINDS, labels)
            }),
            asyncio_tasks: None,
            thread_states: ThreadStatus::STATES.map(|state| {
                let mut labels = base.clone();
                labels.push(metrics::Label::new("state", state));
                metrics::counter!(m::THREAD_SAMPLES, labels)
            }),
            pending_states: [0; 4],
            last: SourceStats::default(),
            base,
        }
    }

    /// Counts one successful call of `kind` that took `took` and held `samples` samples (one,
    /// or a capturing source's count), exported with the failure ratio at the next
    /// [`publish`](Self::publish).
    fn succeeded(&mut self, kind: SampleKind, took: Duration, samples: u64) {
        self.succeeded += samples;
        self.pending_samples += samples;
        let k = &mut self.pending_kinds[kind.index()];
        k.0 += 1;
        k.1 += u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
    }

    /// Counts what a sampled thread was doing, `samples` times.
    fn thread_state(&mut self, status: ThreadStatus, samples: u32) {
        self.pending_states[status.state_index()] += u64::from(samples);
    }

    /// Counts one failed sample.
    fn failed(&mut self) {
        self.failed += 1;
    }

    /// The time of one sample, successful or not.
    fn took(&mut self, took: Duration) {
        let seconds = took.as_secs_f64();
        if self.pending_durations.len() < MAX_PENDING_DURATIONS {
            self.pending_durations.push(seconds);
        } else {
            self.duration.record(seconds);
        }
    }

    /// Hands what samples recorded since the last call to the exporter. Once a batch rather
    /// than once a sample: the exporter's histogram and counters are shared, and touching
    /// them at every sample of every process cost more than a kept sample itself.
    fn publish(&mut self) {
        for &seconds in &self.pending_durations {
            self.duration.record(seconds);
        }
        self.pending_durations.clear();
        self.samples
            .increment(std::mem::take(&mut self.pending_samples));
        for (counter, n) in self
            .thread_states
            .iter()
            .zip(std::mem::take(&mut self.pending_states))
        {
            counter.increment(n);
        }
        for ((counter, total), (n, nanos)) in self
            .kinds
            .iter()
            .zip(&KIND_NANOS)
            .zip(std::mem::take(&mut self.pending_kinds))
        {
            counter.increment(n);
            total.fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
        }
        let attempts = self.failed + self.succeeded;
        if attempts > 0 {
            self.failure_ratio.set(self.failed as f64 / attempts as f64);
        }
    }

    fn error(&mut self, kind: &'static str) {
        if let Some((_, c)) = self.errors.iter().find(|(k, _)| *k == kind) {
            c.increment(1);
            return;
        }
        let mut labels = self.base.clone();
        labels.push(metrics::Label::new("kind", kind));
        let c = metrics::counter!(m::SAMPLE_ERRORS, labels);
        c.increment(1);
        self.errors.push((kind, c));
    }

    /// Exports the increases since the last call (a counter that went backwards adds 0).
    fn add_stats(&mut self, now: &SourceStats) {
        let last = &self.last;
        let pairs = [
            (
                &self.frame_cache_hits,
                now.frame_cache_hits,
                last.frame_cache_hits,
            ),
            (
                &self.frame_cache_partial_hits,
                now.frame_cache_partial_hits,
                last.frame_cache_partial_hits,
            ),
            (
                &self.frame_cache_misses,
                now.frame_cache_misses,
                last.frame_cache_misses,
            ),
            (
                &self.code_cache_hits,
                now.code_cache_hits,
                last.code_cache_hits,
            ),
            (
                &self.code_cache_misses,
                now.code_cache_misses,
                last.code_cache_misses,
            ),
            (&self.remote_reads, now.remote_reads, last.remote_reads),
            (
                &self.remote_read_bytes,
                now.remote_read_bytes,
                last.remote_read_bytes,
            ),
            (&self.idle_left_out, now.idle_left_out, last.idle_left_out),
        ];
        for (counter, now, last) in pairs {
            counter.increment(now.saturating_sub(last));
        }
        if let Some(counts) = now.asyncio_tasks {
            let base = &self.base;
            let gauges = self.asyncio_tasks.get_or_insert_with(|| {
                ["running", "pending"].map(|state| {
                    let mut labels = base.clone();
                    labels.push(metrics::Label::new("state", state));
                    metrics::gauge!(m::ASYNCIO_TASKS, labels)
                })
            });
            for (g, n) in gauges.iter().zip(counts) {
                g.set(n as f64);
            }
        }
        self.last = *now;
    }

    /// Marks every series of this process as alive, so an exporter's idle timeout removes
    /// them only once the sampler is gone (see the crate documentation).
    fn touch(&self) {
        for c in [
            &self.samples,
            &self.missed,
            &self.slow_skips,
            &self.frame_cache_hits,
            &self.frame_cache_partial_hits,
            &self.frame_cache_misses,
            &self.code_cache_hits,
            &self.code_cache_misses,
            &self.remote_reads,
            &self.remote_read_bytes,
            &self.idle_left_out,
        ]
        .into_iter()
        .chain(&self.kinds)
        {
            c.increment(0);
        }
        for (_, c) in &self.errors {
            c.increment(0);
        }
        self.failure_ratio.increment(0.0);
        for g in self.asyncio_tasks.iter().flatten() {
            g.increment(0.0);
        }
    }
}
