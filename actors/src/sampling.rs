//! The fleet's sampling thread: one OS thread that wakes once per tick and samples every
//! process on it back to back, instead of one sleeping thread per process.
//!
//! Why: a thread wakeup costs far more CPU than a sample (on a VM, some twenty times as much:
//! BENCHMARKS.md, "The fleet"), so a thread per process would spend the fleet's CPU budget on
//! wakeups; here the whole fleet costs one wakeup per tick plus the samples themselves.
//!
//! Owns [`SamplingPool`] (created by [`Fleet::start`](crate::Fleet::start), shut down by
//! [`Fleet::shutdown`](crate::Fleet::shutdown)) and the loop of each sampling thread. A
//! thread holds [`Slot`]s, one per sampled process, which the supervisor hands over once
//! their source is attached (see [`slot`](crate::slot)). The thread's loop:
//! - ticks on one deadline grid ([`Deadlines`]): `next = previous deadline + period`; a tick
//!   that overruns makes the periods already over count as missed, for every slot
//!   (`pyfleet_missed_ticks_total`), and skip, never burst. The rate is one for the fleet
//!   (the supervisor's rate policy); a new rate applies from the next tick (last deadline +
//!   new period). With no slot the thread does not tick at all: it blocks until one arrives,
//!   and the grid starts afresh then (the first tick is at once);
//! - at each tick samples every slot once ([`Slot::sample`]), but a dormant slot (one whose
//!   source was not due at its last ticks: a capturing source with nothing captured) only
//!   every [`DORMANT_POLL`]: the thread keeps, per slot, the tick and the time it next looks at
//!   it side by side, so a tick of a mostly idle fleet touches one small entry per slot, not
//!   each slot's state, and when every slot is dormant the thread sleeps through the ticks
//!   before the first one due (not counted as missed); slots that end (process gone,
//!   too many errors, a panic in their source, or an owner gone without asking) are finished
//!   after the tick: final batch, drop, report the end ([`Slot::finish`]);
//! - sends each slot's batch (every `batch_interval` per slot) right after the first tick at
//!   or past its due time: counts only change at ticks, so this delays no sample and costs no
//!   wakeup of its own (with a period longer than `batch_interval`, a batch per tick);
//! - between ticks sleeps in `recv_timeout` on its control channel (add a slot, remove one,
//!   set the rate, stop), so a new slot, a removal or a stop is handled at once. A removal
//!   finishes the slot (final batch first); a stop, or every sender gone, finishes every slot
//!   and ends the thread.
//!
//! How many threads. `FleetConfig::sampling_threads`, default 1. Every thread adds one wakeup
//! per tick, which is the cost this module exists to avoid, and one thread has room to spare:
//! the rate policy keeps pyfleet's whole CPU under a budget of a few percent of one core, so
//! the sampling work of a tick fits in a small fraction of the period. More threads are for
//! isolation, not throughput: a
//! source that stalls delays every slot on its thread (seen as missed ticks), and a fleet
//! whose tick work approaches the period can be split. With several threads a new slot goes
//! to the thread with the fewest slots (round-robin while processes only arrive, and even
//! again after churn, which plain round-robin is not).
//!
//! It must not attach sources, decide restarts or rates, or aggregate: the supervisor and the
//! aggregator do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ractor::ActorRef;
use tokio::sync::oneshot;

use crate::aggregator::AggregatorMsg;
use crate::panics::guard;
use crate::slot::{Slot, SlotEnd, DORMANT_POLL};
use crate::source::SampledThread;
use crate::timing::{period_of, Deadlines, Jitter};

/// Rate used when the rate passed in is not a positive finite number.
const FALLBACK_PERIOD: Duration = Duration::from_secs(1);

enum Control {
    Add(Box<Slot>),
    /// Remove the slot with this id (unknown ids are slots that already ended).
    Remove(u64),
    SetRate(f64),
    Stop,
}

/// The sampling threads of a fleet; see the module documentation.
pub(crate) struct SamplingPool {
    workers: Vec<Worker>,
}

struct Worker {
    name: String,
    control: mpsc::Sender<Control>,
    /// Slots placed on the thread and not yet ended.
    load: Arc<AtomicUsize>,
    /// The thread and its "ended" signal, until shutdown takes them.
    thread: Mutex<Option<(JoinHandle<()>, oneshot::Receiver<()>)>>,
}

impl SamplingPool {
    /// Starts `threads` sampling threads (at least one), ticking at `rate_hz` and sending
    /// batches to `aggregator`. On error the threads already started end by themselves.
    pub(crate) fn start(
        threads: usize,
        rate_hz: f64,
        aggregator: ActorRef<AggregatorMsg>,
    ) -> Result<SamplingPool, String> {
        let period = period_of(rate_hz).unwrap_or(FALLBACK_PERIOD);
        let count = threads.max(1);
        let mut workers = Vec::with_capacity(count);
        for index in 0..count {
            // Linux keeps 15 bytes of a thread's name: this fits up to pyfleet-samp-99.
            let name = format!("pyfleet-samp-{index}");
            let (control_tx, control_rx) = mpsc::channel();
            let (ended_tx, ended_rx) = oneshot::channel();
            let load = Arc::new(AtomicUsize::new(0));
            let thread = SamplingThread {
                control: control_rx,
                load: load.clone(),
                aggregator: aggregator.clone(),
                ticks: Deadlines::new(Instant::now(), period),
                jitter: Jitter::seeded(),
                slots: Vec::new(),
                tick_count: 0,
                missed_since: 0,
                out: Vec::new(),
                ending: Vec::new(),
            };
            let thread_name = name.clone();
            let spawned = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    if let Err(panic) = guard(|| thread.run()) {
                        // Its slots reported failures as they were dropped.
                        tracing::error!("sampling thread {thread_name} panicked: {panic}");
                    }
                    let _ = ended_tx.send(());
                });
            let handle = spawned.map_err(|e| format!("cannot start thread {name}: {e}"))?;
            workers.push(Worker {
                name,
                control: control_tx,
                load,
                thread: Mutex::new(Some((handle, ended_rx))),
            });
        }
        Ok(SamplingPool { workers })
    }

    /// Places a slot on the thread with the fewest slots; returns that thread's index.
    pub(crate) fn add(&self, slot: Slot) -> Result<usize, String> {
        let pid = slot.pid();
        let mut order: Vec<usize> = (0..self.workers.len()).collect();
        order.sort_by_key(|&i| self.workers[i].load.load(Ordering::Relaxed));
        let mut add = Control::Add(Box::new(slot));
        for i in order {
            let worker = &self.workers[i];
            worker.load.fetch_add(1, Ordering::Relaxed);
            match worker.control.send(add) {
                Ok(()) => return Ok(i),
                // That thread is gone (it panicked): try the next one.
                Err(mpsc::SendError(back)) => {
                    worker.load.fetch_sub(1, Ordering::Relaxed);
                    add = back;
                }
            }
        }
        if let Control::Add(slot) = add {
            slot.discard();
        }
        Err(format!("no sampling thread is running to sample pid {pid}"))
    }

    /// Asks thread `thread` to finish the slot `id` (final batch first). The slot's "done"
    /// fires once it is gone.
    pub(crate) fn remove(&self, thread: usize, id: u64) {
        if let Some(worker) = self.workers.get(thread) {
            // A send error means the thread is gone, and the slot with it.
            let _ = worker.control.send(Control::Remove(id));
        }
    }

    /// The fleet's new sampling rate, from the next tick of every thread.
    pub(crate) fn set_rate(&self, hz: f64) {
        for worker in &self.workers {
            let _ = worker.control.send(Control::SetRate(hz));
        }
    }

    /// Tells every thread to stop without waiting (for a fleet that failed to start).
    pub(crate) fn stop(&self) {
        for worker in &self.workers {
            let _ = worker.control.send(Control::Stop);
        }
    }

    /// Stops every thread (each finishes the slots still on it, final batches first) and
    /// joins them, waiting `timeout` in all; a thread that does not end by then is left
    /// detached.
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        self.stop();
        let deadline = tokio::time::Instant::now() + timeout;
        for worker in &self.workers {
            let taken = worker
                .thread
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let Some((handle, ended)) = taken else {
                continue;
            };
            // Ok or a receive error: the thread's last act is done (it sent, or unwound past
            // the sender), so the join below returns at once.
            if tokio::time::timeout_at(deadline, ended).await.is_ok() {
                let _ = handle.join();
            } else {
                tracing::warn!(
                    "sampling thread {} did not stop within {timeout:?}; left detached",
                    worker.name
                );
            }
        }
    }
}

/// A slot on its thread, with when the thread next looks at it.
struct Placed {
    /// The tick ([`SamplingThread::tick_count`]) at which it is next sampled.
    next_tick: u64,
    /// When its next batch is due ([`Slot::next_flush`]).
    next_flush: Instant,
    slot: Box<Slot>,
}

/// The state of one sampling thread; see the module documentation.
struct SamplingThread {
    control: mpsc::Receiver<Control>,
    load: Arc<AtomicUsize>,
    aggregator: ActorRef<AggregatorMsg>,
    ticks: Deadlines,
    /// Where in its period each tick runs (see [`crate::timing`]).
    jitter: Jitter,
    slots: Vec<Placed>,
    /// Ticks so far.
    tick_count: u64,
    /// Deadlines missed after the last tick (it ran late): the next tick's samples stand for
    /// them too.
    missed_since: u32,
    /// Reused by every sample of every slot.
    out: Vec<SampledThread>,
    /// Slots to finish, by index, ascending; empty between uses.
    ending: Vec<(usize, SlotEnd)>,
}

impl SamplingThread {
    fn run(mut self) {
        loop {
            let control = if self.slots.is_empty() {
                // Nothing to sample: no ticks, no wakeups until something arrives.
                self.control.recv().unwrap_or(Control::Stop)
            } else {
                let now = Instant::now();
                let due = self.ticks.next();
                if now >= due {
                    match self.control.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => {
                            self.tick();
                            continue;
                        }
                        Err(TryRecvError::Disconnected) => Control::Stop,
                    }
                } else {
                    match self.control.recv_timeout(due - now) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => Control::Stop,
                    }
                }
            };
            if !self.obey(control) {
                return;
            }
        }
    }

    /// Handles a control message; `false` when the thread must end (every slot is finished).
    fn obey(&mut self, control: Control) -> bool {
        match control {
            Control::Add(mut slot) => {
                if slot.abandoned() {
                    // Its owner is already gone: never sampled, nothing to send.
                    (*slot).discard();
                    self.load.fetch_sub(1, Ordering::Relaxed);
                    return true;
                }
                let now = Instant::now();
                if self.slots.is_empty() {
                    self.ticks = Deadlines::new(now, self.ticks.period());
                }
                slot.placed(now);
                self.slots.push(Placed {
                    next_tick: self.tick_count + 1,
                    next_flush: slot.next_flush(),
                    slot,
                });
            }
            Control::Remove(id) => {
                if let Some(i) = self.slots.iter().position(|p| p.slot.id() == id) {
                    let placed = self.slots.remove(i);
                    self.finish(*placed.slot, SlotEnd::Removed);
                }
            }
            Control::SetRate(hz) => {
                if let Some(period) = period_of(hz) {
                    self.ticks.set_period(period);
                }
            }
            Control::Stop => {
                for placed in std::mem::take(&mut self.slots) {
                    self.finish(*placed.slot, SlotEnd::Removed);
                }
                return false;
            }
        }
        true
    }

    /// Samples every slot once, back to back; counts missed ticks; finishes the slots that
    /// ended; sends the batches due.
    fn tick(&mut self) {
        self.tick_count += 1;
        let tick = self.tick_count;
        let period = self.ticks.period();
        let since_last = period.saturating_mul(1 + std::mem::take(&mut self.missed_since));
        let dormant_ticks = DORMANT_POLL.as_nanos().div_ceil(period.as_nanos().max(1));
        let dormant_ticks = u64::try_from(dormant_ticks).unwrap_or(u64::MAX).max(1);
        for (i, p) in self.slots.iter_mut().enumerate() {
            if p.next_tick > tick {
                continue;
            }
            if let Some(end) = p.slot.sample(&mut self.out, since_last) {
                self.ending.push((i, end));
            }
            let wait = if p.slot.dormant() { dormant_ticks } else { 1 };
            p.next_tick = tick.saturating_add(wait);
        }
        let now = Instant::now();
        let missed = self.ticks.advance(now, self.jitter.next());
        self.missed_since = u32::try_from(missed).unwrap_or(u32::MAX);
        if missed > 0 {
            for p in &self.slots {
                p.slot.missed(missed);
            }
        }
        self.reap();
        for (i, p) in self.slots.iter_mut().enumerate() {
            if now < p.next_flush {
                continue;
            }
            if let Some(end) = p.slot.flush_if_due(now, &self.aggregator, &mut self.out) {
                self.ending.push((i, end));
            }
            p.next_flush = p.slot.next_flush();
        }
        self.reap();
        // Every slot dormant: the ticks before the first one due would touch nothing, so the
        // thread sleeps through them.
        if let Some(first) = self.slots.iter().map(|p| p.next_tick).min() {
            let idle = first.saturating_sub(self.tick_count + 1);
            if idle > 0 {
                self.ticks.skip(idle);
                self.tick_count += idle;
            }
        }
    }

    /// Finishes the slots listed in `ending`.
    fn reap(&mut self) {
        // Highest index first, so the lower ones stay valid.
        while let Some((i, end)) = self.ending.pop() {
            let placed = self.slots.remove(i);
            self.finish(*placed.slot, end);
        }
    }

    fn finish(&self, slot: Slot, end: SlotEnd) {
        slot.finish(&self.aggregator, end);
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64};

    use pyfleet_policies::Mode;
    use ractor::rpc::CallResult;
    use ractor::Actor;

    use super::*;
    use crate::aggregator::AggregatorActor;
    use crate::slot::{next_life, OnEnd, SlotSettings, SLOW_SAMPLE};
    use crate::snapshot::Snapshot;
    use crate::source::{
        FrameInfo, ProcessInfo, SampleError, SampleKind, SourceStats, StackSource,
    };

    /// Counts its samples (one thread, stack 7, each) and its drop; panics on demand.
    struct Counting {
        samples: Arc<AtomicU64>,
        dropped: Arc<AtomicBool>,
        panic_at: Option<u64>,
    }

    impl StackSource for Counting {
        fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
            let n = self.samples.load(Ordering::SeqCst);
            if Some(n) == self.panic_at {
                panic!("source panics after {n} samples");
            }
            out.push(SampledThread {
                tid: 1,
                status: Default::default(),
                stack: 7,
                samples: 1,
            });
            self.samples.fetch_add(1, Ordering::SeqCst);
            Ok(SampleKind::Read)
        }

        fn resolve(&self, _stack: u64) -> Option<Vec<FrameInfo>> {
            Some(vec![FrameInfo {
                function: "f".into(),
                file: "f.py".into(),
                line: Some(1),
            }])
        }

        fn stats(&self) -> SourceStats {
            SourceStats::default()
        }
    }

    impl Drop for Counting {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    /// Records the ends reported to it, as their debug strings.
    fn recorder(ends: &Arc<Mutex<Vec<String>>>) -> OnEnd {
        let ends = ends.clone();
        Box::new(move |end| ends.lock().unwrap().push(format!("{end:?}")))
    }

    struct Fake {
        pid: i32,
        samples: Arc<AtomicU64>,
        dropped: Arc<AtomicBool>,
        ends: Arc<Mutex<Vec<String>>>,
        slot_id: u64,
        done: Option<oneshot::Receiver<()>>,
    }

    /// A process's info and slot settings for a test slot (batches only at the end).
    fn slot_args(pid: i32, name: &str) -> (ProcessInfo, SlotSettings) {
        let info = ProcessInfo {
            ppid: 1,
            role: pyfleet_policies::Role::Single,
            pid,
            name: name.to_string(),
            cmdline: String::new(),
            python_version: "3.13.1".to_string(),
            labels: Default::default(),
            start_time: 0,
        };
        let settings = SlotSettings {
            mode: Mode::Wall,
            batch_interval: Duration::from_secs(3600),
            max_consecutive_errors: 10,
            max_known_stacks: 100,
        };
        (info, settings)
    }

    async fn place(pool: &SamplingPool, pid: i32, panic_at: Option<u64>) -> Fake {
        let samples = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let ends = Arc::new(Mutex::new(Vec::new()));
        let (info, settings) = slot_args(pid, &format!("p{pid}"));
        let source = Counting {
            samples: samples.clone(),
            dropped: dropped.clone(),
            panic_at,
        };
        let (slot, done) = Slot::new(
            next_life(),
            &info,
            &settings,
            Box::new(source),
            recorder(&ends),
        );
        let slot_id = slot.id();
        assert_eq!(pool.add(slot), Ok(0));
        Fake {
            pid,
            samples,
            dropped,
            ends,
            slot_id,
            done: Some(done),
        }
    }

    /// Takes `SLOW_SAMPLE` and a bit per sample while `slow` is set.
    struct Slow {
        slow: Arc<AtomicBool>,
        calls: Arc<AtomicU64>,
    }

    impl StackSource for Slow {
        fn sample(&mut self, _out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.slow.load(Ordering::SeqCst) {
                std::thread::sleep(SLOW_SAMPLE + Duration::from_millis(1));
            }
            Ok(SampleKind::Read)
        }
        fn resolve(&self, _stack: u64) -> Option<Vec<FrameInfo>> {
            None
        }
        fn stats(&self) -> SourceStats {
            SourceStats::default()
        }
    }

    #[tokio::test]
    async fn a_slow_source_is_skipped_for_longer_and_longer_then_sampled_again() {
        let (slow, calls) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
        let (info, settings) = slot_args(1, "slow");
        let source = Slow {
            slow: slow.clone(),
            calls: calls.clone(),
        };
        let (mut slot, _done) = Slot::new(
            next_life(),
            &info,
            &settings,
            Box::new(source),
            recorder(&Arc::default()),
        );
        let mut out = Vec::new();
        // Sampled at ticks 0, 2, 5, 10 and 19: skipped 1, 2, 4, 8 ticks after each.
        for _ in 0..20 {
            assert!(slot.sample(&mut out, Duration::from_millis(10)).is_none());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // Fast again: after the pending skips, every tick samples.
        slow.store(false, Ordering::SeqCst);
        for _ in 0..40 {
            slot.sample(&mut out, Duration::from_millis(10));
        }
        let before = calls.load(Ordering::SeqCst);
        for _ in 0..10 {
            slot.sample(&mut out, Duration::from_millis(10));
        }
        assert_eq!(calls.load(Ordering::SeqCst), before + 10);
    }

    /// Holds two samples a call and is due at every fourth tick: a capturing source's shape;
    /// with `at_batch`, one that counts at batches too (wall mode's).
    struct Collecting {
        ticks: u64,
        calls: Arc<AtomicU64>,
        at_batch: bool,
    }

    impl StackSource for Collecting {
        fn due(&mut self) -> bool {
            self.ticks += 1;
            self.ticks.is_multiple_of(4)
        }
        fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            for tid in [1, 2] {
                out.push(SampledThread {
                    tid,
                    status: Default::default(),
                    stack: 7,
                    samples: 1,
                });
            }
            Ok(SampleKind::Read)
        }
        fn resolve(&self, _stack: u64) -> Option<Vec<FrameInfo>> {
            None
        }
        fn stats(&self) -> SourceStats {
            SourceStats::default()
        }
        fn captured_in_last(&self) -> Option<crate::source::CapturedCounts> {
            Some(crate::source::CapturedCounts {
                taken: 2,
                failed: 0,
                failed_kind: "",
                period: Duration::from_millis(10),
            })
        }
        fn counts_at_batch(&self) -> bool {
            self.at_batch
        }
    }

    /// A slot of process `pid` over a [`Collecting`] source; its calls and how it ended.
    #[allow(clippy::type_complexity)]
    fn collecting_slot(
        pid: i32,
        at_batch: bool,
    ) -> (
        Slot,
        oneshot::Receiver<()>,
        Arc<AtomicU64>,
        Arc<Mutex<Vec<String>>>,
    ) {
        let calls = Arc::new(AtomicU64::new(0));
        let (info, settings) = slot_args(pid, "collecting");
        let source = Collecting {
            ticks: 0,
            calls: calls.clone(),
            at_batch,
        };
        let ends = Arc::default();
        let (slot, done) = Slot::new(
            next_life(),
            &info,
            &settings,
            Box::new(source),
            recorder(&ends),
        );
        (slot, done, calls, ends)
    }

    #[tokio::test]
    async fn a_collecting_source_is_called_when_due_dormant_when_not_and_once_more_when_removed() {
        let (aggregator, _) = Actor::spawn(None, AggregatorActor, (100, false))
            .await
            .unwrap();
        let (mut slot, _done, calls, ends) = collecting_slot(1, false);
        let mut out = Vec::new();
        for _ in 0..15 {
            assert!(slot.sample(&mut out, Duration::from_millis(10)).is_none());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Not due at its last three ticks, but a moment ago: not dormant yet.
        assert!(!slot.dormant());
        slot.sample(&mut out, Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(40));
        for _ in 0..3 {
            slot.sample(&mut out, Duration::from_millis(10));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Not due at its last three ticks, over 30 ms: its thread looks at it less often.
        assert!(slot.dormant());
        // The 20th tick would be due: removal collects what it holds.
        slot.finish(&aggregator, SlotEnd::Removed);
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(*ends.lock().unwrap(), ["Removed"]);
        aggregator.stop(None);
    }

    #[tokio::test]
    async fn a_source_counting_at_batches_is_called_before_each_batch_though_not_due() {
        let (aggregator, _) = Actor::spawn(None, AggregatorActor, (100, false))
            .await
            .unwrap();
        let (mut slot, _done, calls, _) = collecting_slot(2, true);
        let mut out = Vec::new();
        for _ in 0..3 {
            assert!(slot.sample(&mut out, Duration::from_millis(10)).is_none());
        }
        // Not due yet, and no batch due: not called.
        assert!(slot
            .flush_if_due(Instant::now(), &aggregator, &mut out)
            .is_none());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // A batch due: called first, though not due, and what it returned goes out with it.
        let at = slot.next_flush();
        assert!(slot.flush_if_due(at, &aggregator, &mut out).is_none());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let snap = take_snapshot(&aggregator).await;
        assert_eq!(total(&snap, 2), 2);
        aggregator.stop(None);
    }

    /// The aggregator's window, taken as a snapshot.
    async fn take_snapshot(aggregator: &ActorRef<AggregatorMsg>) -> Snapshot {
        let taken = aggregator
            .call(
                |reply| AggregatorMsg::TakeWindows {
                    snapshot: true,
                    push: false,
                    reply,
                },
                None,
            )
            .await;
        match taken {
            Ok(CallResult::Success((Some(snap), _))) => snap,
            _ => panic!("no snapshot"),
        }
    }

    async fn until(cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "condition not met in time");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn total(snap: &Snapshot, pid: i32) -> u64 {
        snap.processes
            .iter()
            .filter(|p| p.pid == pid)
            .map(|p| p.total())
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_end_by_removal_abandonment_or_panic_with_their_final_batch() {
        let (aggregator, _) = Actor::spawn(None, AggregatorActor, (100, false))
            .await
            .unwrap();
        let pool = SamplingPool::start(1, 500.0, aggregator.clone()).unwrap();
        let mut removed = place(&pool, 1, None).await;
        let mut abandoned = place(&pool, 2, None).await;
        let panics = place(&pool, 3, Some(5)).await;
        let stays = place(&pool, 4, None).await;
        let all = [&removed, &abandoned, &panics, &stays];
        until(|| all.iter().all(|f| f.samples.load(Ordering::SeqCst) >= 5)).await;

        // Removal: the final batch is sent and the end reported before "done" fires.
        pool.remove(0, removed.slot_id);
        removed.done.take().unwrap().await.unwrap();
        assert!(removed.dropped.load(Ordering::SeqCst));
        assert_eq!(*removed.ends.lock().unwrap(), ["Removed"]);
        // Its owner gone without asking (the receiver dropped): removed within 64 ticks.
        drop(abandoned.done.take());
        until(|| abandoned.dropped.load(Ordering::SeqCst)).await;
        // A panic ended its slot only, and was reported as a failure.
        until(|| panics.ends.lock().unwrap().len() == 1).await;
        assert!(panics.dropped.load(Ordering::SeqCst));
        let end = panics.ends.lock().unwrap()[0].clone();
        assert!(end.starts_with("Failed(\"sample panicked"), "{end}");
        // An unknown id is ignored; the last slot goes on.
        pool.remove(0, u64::MAX);
        let n = stays.samples.load(Ordering::SeqCst);
        until(|| stays.samples.load(Ordering::SeqCst) >= n + 10).await;
        assert!(!stays.dropped.load(Ordering::SeqCst));

        // Shutdown finishes the slot left (final batch first) and joins the thread.
        pool.shutdown(Duration::from_secs(5)).await;
        assert!(stays.dropped.load(Ordering::SeqCst));
        let snap = take_snapshot(&aggregator).await;
        for f in [&removed, &abandoned, &panics, &stays] {
            assert_eq!(total(&snap, f.pid), f.samples.load(Ordering::SeqCst));
        }
        // Each slot reported its end once.
        for f in [&removed, &abandoned, &stays] {
            assert_eq!(*f.ends.lock().unwrap(), ["Removed"], "pid {}", f.pid);
        }
        // Stopped: a new slot finds no thread, and its source is dropped.
        let samples = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let late_ends = Arc::new(Mutex::new(Vec::new()));
        let source = Counting {
            samples,
            dropped: dropped.clone(),
            panic_at: None,
        };
        let info = ProcessInfo {
            ppid: 1,
            role: pyfleet_policies::Role::Single,
            pid: 5,
            name: "late".to_string(),
            cmdline: String::new(),
            python_version: String::new(),
            labels: Default::default(),
            start_time: 0,
        };
        let settings = SlotSettings {
            mode: Mode::Wall,
            batch_interval: Duration::from_secs(1),
            max_consecutive_errors: 1,
            max_known_stacks: 1,
        };
        let (slot, _done) = Slot::new(
            next_life(),
            &info,
            &settings,
            Box::new(source),
            recorder(&late_ends),
        );
        assert!(pool.add(slot).is_err());
        assert!(dropped.load(Ordering::SeqCst));
        // Discarded without a report: `add`'s error is the only word of it.
        assert!(late_ends.lock().unwrap().is_empty());
    }
}
