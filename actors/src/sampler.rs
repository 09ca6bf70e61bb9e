//! The sampler actor: one per profiled process, owning that process's [`StackSource`].
//!
//! Design. Sampling runs on a dedicated OS thread that the actor starts in `pre_start` and that
//! owns the source from attach to drop, so a slow or blocking read never stalls the tokio
//! workers that run the other actors, and the tick schedule is not at the mercy of the async
//! scheduler. The actor itself only relays: rate changes go to the thread over a channel (the
//! thread's sleep is a `recv_timeout` on that channel, so a rate change or a stop wakes it at
//! once), and the thread reports how it ended back to the actor as a message.
//!
//! The thread's loop:
//! - ticks on deadlines ([`Deadlines`]): `next = previous deadline + period`; a sample that
//!   overruns makes the deadlines already past count as missed (`pyfleet_missed_ticks_total`)
//!   and skip, never burst; a new rate applies from the next tick (last deadline + new period);
//! - per sample: applies the [`Mode`] to each thread's status and tallies `(stack id, status)`
//!   locally (no allocation once the tally has seen the stacks; `out` is reused);
//! - every `batch_interval`, and once more when it ends however it ends, sends the aggregator
//!   a batch: the counts, plus the frames of stack ids not sent before in this sampler's life
//!   (resolved once per stack id; past a cap of remembered ids it forgets them all, bumps an
//!   epoch and resends, which bounds memory here and in the aggregator), and turns the
//!   increases of [`SourceStats`] into counters;
//! - a [`SampleError`](crate::SampleError) with `process_gone` ends it cleanly: the actor
//!   stops with reason [`REASON_PROCESS_GONE`], which the supervisor sees as an exit, not a
//!   failure. Other errors are counted by kind; `max_consecutive_errors` in a row, a failed
//!   attach, or a panic in any call into the source (caught on the thread) end it with a
//!   failure: the actor returns an error, so the supervisor gets `ActorFailed` and applies
//!   the restart policy. The process itself never goes down with a source.
//!
//! On stop (`post_stop`) the actor tells the thread to stop and waits, bounded by
//! `stop_timeout`, until the thread has sent its final batch, so a snapshot taken after the
//! sampler stopped includes it. If the actor dies without `post_stop` (killed), dropping its
//! state disconnects the channel, which the thread also takes as a stop.
//!
//! It must not aggregate across processes, write files, or decide restarts.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};
use pyfleet_policies::Mode;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::aggregator::{AggregatorMsg, Batch};
use crate::metric_names as m;
use crate::panics::guard;
use crate::snapshot::UNKNOWN_FUNCTION;
use crate::source::{
    FrameInfo, ProcessInfo, SourceFactory, SourceStats, StackSource, ThreadStatus,
};
use crate::timing::{period_of, Deadlines};

/// Exit reason of a sampler whose process is gone.
pub(crate) const REASON_PROCESS_GONE: &str = "process_gone";

/// Rate used when the rate passed in is not a positive finite number.
const FALLBACK_PERIOD: Duration = Duration::from_secs(1);

static NEXT_LIFE: AtomicU64 = AtomicU64::new(1);

/// Settings every sampler gets from the fleet configuration.
#[derive(Debug, Clone)]
pub(crate) struct SamplerSettings {
    pub mode: Mode,
    pub rate_hz: f64,
    pub batch_interval: Duration,
    pub max_consecutive_errors: u32,
    /// Stack ids remembered as sent before the sampler forgets them and starts a new epoch.
    pub max_known_stacks: usize,
    pub stop_timeout: Duration,
}

pub(crate) struct SamplerArgs<F> {
    pub factory: Arc<F>,
    pub info: ProcessInfo,
    pub aggregator: ActorRef<AggregatorMsg>,
    pub settings: SamplerSettings,
}

#[derive(Debug)]
pub(crate) enum SamplerMsg {
    /// The shared sampling rate changed.
    SetRate(f64),
    /// From the sampling thread: it has ended (after sending its final batch).
    Ended(Outcome),
}

#[derive(Debug)]
pub(crate) enum Outcome {
    ProcessGone(String),
    Failed(String),
}

enum Control {
    SetRate(f64),
    Stop,
}

/// The sampler actor; see the module documentation.
pub(crate) struct SamplerActor<F>(PhantomData<fn() -> F>);

impl<F> SamplerActor<F> {
    pub(crate) fn new() -> Self {
        SamplerActor(PhantomData)
    }
}

pub(crate) struct SamplerState {
    pid: i32,
    control: mpsc::Sender<Control>,
    done: Option<oneshot::Receiver<()>>,
    stop_timeout: Duration,
}

impl<F: SourceFactory> Actor for SamplerActor<F> {
    type Msg = SamplerMsg;
    type State = SamplerState;
    type Arguments = SamplerArgs<F>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (control_tx, control_rx) = mpsc::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let pid = args.info.pid;
        let stop_timeout = args.settings.stop_timeout;
        let thread = SamplingThread {
            life: NEXT_LIFE.fetch_add(1, Ordering::Relaxed),
            factory: args.factory,
            info: args.info,
            aggregator: args.aggregator,
            settings: args.settings,
            control: control_rx,
            myself,
        };
        std::thread::Builder::new()
            .name(format!("pyfleet-{pid}"))
            .spawn(move || {
                thread.run();
                // Dropping done_tx would do as well; sending says it explicitly.
                let _ = done_tx.send(());
            })
            .map_err(|e| format!("cannot start the sampling thread for pid {pid}: {e}"))?;
        Ok(SamplerState {
            pid,
            control: control_tx,
            done: Some(done_rx),
            stop_timeout,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SamplerMsg::SetRate(hz) => {
                // A send error means the thread has ended; its Ended message is on its way.
                let _ = state.control.send(Control::SetRate(hz));
            }
            SamplerMsg::Ended(Outcome::ProcessGone(why)) => {
                tracing::debug!(pid = state.pid, "process gone: {why}");
                myself.stop(Some(REASON_PROCESS_GONE.to_string()));
            }
            SamplerMsg::Ended(Outcome::Failed(why)) => return Err(why.into()),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.control.send(Control::Stop);
        if let Some(done) = state.done.take() {
            if tokio::time::timeout(state.stop_timeout, done)
                .await
                .is_err()
            {
                tracing::warn!(
                    pid = state.pid,
                    "sampling thread did not stop within {:?}; its last batch may be lost",
                    state.stop_timeout
                );
            }
        }
        Ok(())
    }
}

enum End {
    /// Told to stop (or the actor is gone): nothing to report.
    Stopped,
    ProcessGone(String),
    Failed(String),
}

struct SamplingThread<F> {
    life: u64,
    factory: Arc<F>,
    info: ProcessInfo,
    aggregator: ActorRef<AggregatorMsg>,
    settings: SamplerSettings,
    control: mpsc::Receiver<Control>,
    myself: ActorRef<SamplerMsg>,
}

impl<F: SourceFactory> SamplingThread<F> {
    fn run(self) {
        let end = self.sample_until_end();
        let outcome = match end {
            End::Stopped => return,
            End::ProcessGone(why) => Outcome::ProcessGone(why),
            End::Failed(why) => {
                tracing::warn!(
                    pid = self.info.pid,
                    process = %self.info.name,
                    "sampler failed: {why}"
                );
                Outcome::Failed(why)
            }
        };
        // The actor may already be stopping; then nobody needs to know.
        let _ = self.myself.send_message(SamplerMsg::Ended(outcome));
    }

    fn sample_until_end(&self) -> End {
        let info = &self.info;
        let settings = &self.settings;
        let mut metrics = ProcessMetrics::new(&info.name, info.pid);
        let mut source = match guard(|| self.factory.attach(info, settings.mode.needs_cpu_status()))
        {
            Ok(Ok(source)) => source,
            Ok(Err(e)) => return End::Failed(format!("attach failed: {e}")),
            Err(panic) => return End::Failed(format!("attach panicked: {panic}")),
        };
        tracing::debug!(pid = info.pid, process = %info.name, "sampling");
        let mut tally = Tally {
            life: self.life,
            epoch: 0,
            pid: info.pid,
            name: Arc::from(info.name.as_str()),
            counts: HashMap::new(),
            known: HashSet::new(),
            max_known: settings.max_known_stacks.max(1),
        };
        let start = Instant::now();
        let mut ticks = Deadlines::new(
            start,
            period_of(settings.rate_hz).unwrap_or(FALLBACK_PERIOD),
        );
        let mut next_flush = later(start, settings.batch_interval);
        let mut consecutive_errors: u32 = 0;
        let mut out = Vec::new();

        // Every way out sends the final batch first.
        let finish = |tally: &mut Tally,
                      metrics: &mut ProcessMetrics,
                      source: &F::Source,
                      end: End|
         -> End {
            match flush(tally, metrics, source, &self.aggregator, true) {
                Ok(()) => end,
                Err(panic) => match end {
                    End::Failed(why) => End::Failed(why),
                    _ => End::Failed(panic),
                },
            }
        };

        loop {
            // Wait for the next deadline, flushing and obeying control messages meanwhile.
            loop {
                let now = Instant::now();
                if now >= next_flush {
                    if let Err(why) =
                        flush(&mut tally, &mut metrics, &source, &self.aggregator, false)
                    {
                        // The batch went out; the last one tells the aggregator to forget us.
                        return finish(&mut tally, &mut metrics, &source, End::Failed(why));
                    }
                    next_flush = later(next_flush, settings.batch_interval);
                    if next_flush <= now {
                        next_flush = later(now, settings.batch_interval);
                    }
                }
                let due = ticks.next();
                let control = if now >= due {
                    match self.control.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => Control::Stop,
                    }
                } else {
                    match self.control.recv_timeout(due.min(next_flush) - now) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => Control::Stop,
                    }
                };
                match control {
                    Control::SetRate(hz) => {
                        if let Some(period) = period_of(hz) {
                            ticks.set_period(period);
                        }
                    }
                    Control::Stop => {
                        return finish(&mut tally, &mut metrics, &source, End::Stopped)
                    }
                }
            }

            out.clear();
            let began = Instant::now();
            let result = guard(|| source.sample(&mut out));
            metrics.duration.record(began.elapsed().as_secs_f64());
            match result {
                Ok(Ok(())) => {
                    consecutive_errors = 0;
                    metrics.samples.increment(1);
                    for thread in &out {
                        let s = thread.status;
                        if settings.mode.counts(s.on_cpu, s.holds_gil) {
                            tally.add(thread.stack, s);
                        }
                    }
                }
                Ok(Err(e)) => {
                    metrics.error(e.kind);
                    if e.process_gone {
                        let end = End::ProcessGone(e.message);
                        return finish(&mut tally, &mut metrics, &source, end);
                    }
                    consecutive_errors = consecutive_errors.saturating_add(1);
                    if consecutive_errors >= settings.max_consecutive_errors {
                        let end = End::Failed(format!(
                            "{consecutive_errors} consecutive sample errors, the last: {e}"
                        ));
                        return finish(&mut tally, &mut metrics, &source, end);
                    }
                }
                Err(panic) => {
                    let end = End::Failed(format!("sample panicked: {panic}"));
                    return finish(&mut tally, &mut metrics, &source, end);
                }
            }
            let missed = ticks.advance(Instant::now());
            if missed > 0 {
                metrics.missed.increment(missed);
            }
        }
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
fn flush<S: StackSource>(
    tally: &mut Tally,
    metrics: &mut ProcessMetrics,
    source: &S,
    aggregator: &ActorRef<AggregatorMsg>,
    last: bool,
) -> Result<(), String> {
    let (batch, resolved) = tally.batch(source, last);
    // The aggregator is gone only when the fleet is shutting down: nothing to do about it.
    let _ = aggregator.send_message(AggregatorMsg::Batch(batch));
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
    counts: HashMap<(u64, ThreadStatus), u64>,
    known: HashSet<u64>,
    max_known: usize,
}

impl Tally {
    fn add(&mut self, stack: u64, status: ThreadStatus) {
        let n = self.counts.entry((stack, status)).or_default();
        *n = n.saturating_add(1);
    }

    /// Drains the counts into a batch (keeping the map's capacity). The second value is `Err`
    /// with the message of a panic in `resolve`; the batch is complete regardless (the stack
    /// is marked unknown).
    fn batch<S: StackSource>(&mut self, source: &S, last: bool) -> (Batch, Result<(), String>) {
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
            counts,
            new_stacks,
            last,
        };
        (batch, resolved)
    }
}

fn unknown_stack() -> Vec<FrameInfo> {
    vec![FrameInfo {
        function: UNKNOWN_FUNCTION.to_string(),
        file: String::new(),
        line: None,
    }]
}

/// The per-process metric handles of one sampler, registered once.
struct ProcessMetrics {
    process: String,
    pid: String,
    samples: Counter,
    duration: Histogram,
    missed: Counter,
    errors: Vec<(&'static str, Counter)>,
    frame_cache_hits: Counter,
    frame_cache_partial_hits: Counter,
    frame_cache_misses: Counter,
    code_cache_hits: Counter,
    code_cache_misses: Counter,
    remote_reads: Counter,
    remote_read_bytes: Counter,
    last: SourceStats,
}

impl ProcessMetrics {
    fn new(process: &str, pid: i32) -> Self {
        let process = process.to_string();
        let pid = pid.to_string();
        let counter = |name: &'static str| metrics::counter!(name, "process" => process.clone(), "pid" => pid.clone());
        ProcessMetrics {
            samples: counter(m::SAMPLES),
            duration: metrics::histogram!(
                m::SAMPLE_DURATION, "process" => process.clone(), "pid" => pid.clone()
            ),
            missed: counter(m::MISSED_TICKS),
            errors: Vec::new(),
            frame_cache_hits: counter(m::FRAME_CACHE_HITS),
            frame_cache_partial_hits: counter(m::FRAME_CACHE_PARTIAL_HITS),
            frame_cache_misses: counter(m::FRAME_CACHE_MISSES),
            code_cache_hits: counter(m::CODE_CACHE_HITS),
            code_cache_misses: counter(m::CODE_CACHE_MISSES),
            remote_reads: counter(m::REMOTE_READS),
            remote_read_bytes: counter(m::REMOTE_READ_BYTES),
            last: SourceStats::default(),
            process,
            pid,
        }
    }

    fn error(&mut self, kind: &'static str) {
        if let Some((_, c)) = self.errors.iter().find(|(k, _)| *k == kind) {
            c.increment(1);
            return;
        }
        let c = metrics::counter!(
            m::SAMPLE_ERRORS,
            "process" => self.process.clone(),
            "pid" => self.pid.clone(),
            "kind" => kind
        );
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
        ];
        for (counter, now, last) in pairs {
            counter.increment(now.saturating_sub(last));
        }
        self.last = *now;
    }

    /// Marks every series of this process as alive, so an exporter's idle timeout removes
    /// them only once the sampler is gone (see the crate documentation).
    fn touch(&self) {
        for c in [
            &self.samples,
            &self.missed,
            &self.frame_cache_hits,
            &self.frame_cache_partial_hits,
            &self.frame_cache_misses,
            &self.code_cache_hits,
            &self.code_cache_misses,
            &self.remote_reads,
            &self.remote_read_bytes,
        ] {
            c.increment(0);
        }
        for (_, c) in &self.errors {
            c.increment(0);
        }
    }
}
