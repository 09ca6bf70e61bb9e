//! The aggregator actor: counts per (process, thread status, stack) for the current snapshot
//! window, and for the windows of pull requests ("taps").
//!
//! Owns the window's counts and, per sampler life, the frames of the stack ids that sampler
//! has sent (a sampler sends each stack's frames once; see `slot`). On `TakeWindows` it
//! hands over the window as a [`Snapshot`] and starts a new, empty one.
//!
//! With pushing on, a push window counts beside the snapshot window; the sink cuts it on its
//! own schedule (both in one message when both are due, so that equal schedules cut equal
//! windows).
//!
//! A tap ([`Profiler::profile`](crate::Profiler::profile)) is a window of its own, opened by a
//! request and closed by it: it counts the batches that arrive while it is open (samplers send
//! every batch interval, so a tap's edges are as fine as that), optionally of one pid or one
//! service only. At most [`MAX_TAPS`] are open at once, none longer than [`MAX_TAP_AGE`]
//! (one whose requester vanished without closing it is dropped then).
//!
//! Memory is bounded: at most `max_stacks` distinct (sampler life, stack id, status) entries
//! per process per window; samples past that are counted into one `[truncated]` stack per
//! status. The per-life frame tables are bounded by the samplers (they forget and resend
//! after a cap) and are dropped with the sampler's last batch.
//!
//! It must not do I/O, block, or read a clock other than for `taken_at`: it only counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::snapshot::{Frames, ProcessProfile, Snapshot, TRUNCATED_FUNCTION, UNKNOWN_FUNCTION};
use crate::source::{FrameInfo, Labels, ThreadStatus};

/// What a sampler sends every batch interval, and once more when it ends.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    /// Unique per sampler start (a restart is a new life).
    pub life: u64,
    /// Bumped when the sampler forgets which stacks it has sent; a new epoch makes the
    /// aggregator forget that life's frames too.
    pub epoch: u64,
    pub pid: i32,
    pub name: Arc<str>,
    pub role: pyfleet_policies::Role,
    pub labels: Arc<Labels>,
    /// `(stack id, status, count)`, only samples the mode counts.
    pub counts: Vec<(u64, ThreadStatus, u64)>,
    /// The time the samples in `counts` stand for (each its sampling period), nanoseconds.
    pub sampled_ns: u64,
    /// Frames of the stack ids in `counts` not sent before in this life and epoch.
    pub new_stacks: Vec<(u64, Vec<FrameInfo>)>,
    /// The sampler's final batch: the aggregator drops the life's frame table after it.
    pub last: bool,
}

pub(crate) enum AggregatorMsg {
    Batch(Batch),
    /// Cuts the snapshot window, the push window, or both at one instant.
    TakeWindows {
        snapshot: bool,
        push: bool,
        reply: RpcReplyPort<(Option<Snapshot>, Option<Snapshot>)>,
    },
    /// Opens a tap, or says why not.
    OpenTap(TapFilter, RpcReplyPort<Result<u64, TapRefused>>),
    /// Closes a tap and hands over what it counted (`None` if it is not open).
    CloseTap(u64, RpcReplyPort<Option<Snapshot>>),
    /// Closes a tap whose requester went away.
    DropTap(u64),
}

/// Most taps open at once.
pub const MAX_TAPS: usize = 8;
/// A tap open longer than this is dropped (its requester is gone).
pub const MAX_TAP_AGE: Duration = Duration::from_secs(600);

/// Why a tap was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TapRefused {
    /// [`MAX_TAPS`] are open.
    Busy,
    /// The filter's pid has no sampler (none sent a batch lately).
    NotProfiled(i32),
}

/// Which processes a tap counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TapFilter {
    pub pid: Option<i32>,
    /// The `service` label's value.
    pub service: Option<String>,
}

impl TapFilter {
    fn admits(&self, batch: &Batch) -> bool {
        self.admits_labelled(batch.pid, &batch.labels)
    }

    /// Whether a process of a snapshot is one the filter counts.
    pub fn admits_process(&self, p: &crate::snapshot::ProcessProfile) -> bool {
        self.admits_labelled(p.pid, &p.labels)
    }

    fn admits_labelled(&self, pid: i32, labels: &crate::source::Labels) -> bool {
        self.pid.is_none_or(|p| p == pid)
            && self
                .service
                .as_deref()
                .is_none_or(|s| labels.get("service") == Some(s))
    }
}

struct Tap {
    filter: TapFilter,
    opened: SystemTime,
    window: BTreeMap<i32, ProcessWindow>,
}

struct Life {
    pid: i32,
    epoch: u64,
    stacks: HashMap<u64, Frames>,
    /// Windows taken since its last batch: a life whose last batch was lost (its sampler
    /// was torn down) is forgotten after [`MAX_IDLE_WINDOWS`].
    idle_windows: u32,
}

/// Windows without a batch after which a sampler's life is forgotten (a live sampler sends
/// one every batch interval, shorter than a window).
const MAX_IDLE_WINDOWS: u32 = 2;

struct ProcessWindow {
    name: Arc<str>,
    role: pyfleet_policies::Role,
    labels: Arc<Labels>,
    entries: HashMap<(u64, u64, ThreadStatus), (Frames, u64)>,
    truncated: BTreeMap<ThreadStatus, u64>,
    /// The time the window's samples stand for, nanoseconds.
    sampled_ns: u64,
}

/// The counting itself, without the actor around it.
pub(crate) struct Aggregation {
    max_stacks: usize,
    lives: HashMap<u64, Life>,
    window: BTreeMap<i32, ProcessWindow>,
    window_start: SystemTime,
    /// The push window, when pushing (see `FleetConfig::push`).
    push: Option<(BTreeMap<i32, ProcessWindow>, SystemTime)>,
    taps: HashMap<u64, Tap>,
    next_tap: u64,
    unknown: Frames,
    truncated: Frames,
}

fn single_frame(function: &str) -> Frames {
    Arc::from(vec![FrameInfo::new(function, "", None)])
}

impl Aggregation {
    pub(crate) fn new(max_stacks: usize, started_at: SystemTime) -> Self {
        Aggregation {
            max_stacks,
            lives: HashMap::new(),
            window: BTreeMap::new(),
            window_start: started_at,
            push: None,
            taps: HashMap::new(),
            next_tap: 0,
            unknown: single_frame(UNKNOWN_FUNCTION),
            truncated: single_frame(TRUNCATED_FUNCTION),
        }
    }

    pub(crate) fn add(&mut self, mut batch: Batch) {
        let life = self.lives.entry(batch.life).or_insert_with(|| Life {
            pid: batch.pid,
            epoch: batch.epoch,
            stacks: HashMap::new(),
            idle_windows: 0,
        });
        life.idle_windows = 0;
        if life.epoch != batch.epoch {
            life.epoch = batch.epoch;
            life.stacks.clear();
        }
        for (id, frames) in std::mem::take(&mut batch.new_stacks) {
            life.stacks.insert(id, Arc::from(frames));
        }
        let unknown = &self.unknown;
        count(&mut self.window, self.max_stacks, life, unknown, &batch);
        if let Some((window, _)) = self.push.as_mut() {
            count(window, self.max_stacks, life, unknown, &batch);
        }
        for tap in self.taps.values_mut() {
            if tap.filter.admits(&batch) {
                count(&mut tap.window, self.max_stacks, life, unknown, &batch);
            }
        }
        if batch.last {
            self.lives.remove(&batch.life);
        }
    }

    /// Hands over the window and starts a new one.
    pub(crate) fn take(&mut self, taken_at: SystemTime) -> Snapshot {
        self.lives.retain(|_, life| {
            life.idle_windows += 1;
            life.idle_windows <= MAX_IDLE_WINDOWS
        });
        let processes = profiles(std::mem::take(&mut self.window), &self.truncated);
        Snapshot {
            started_at: std::mem::replace(&mut self.window_start, taken_at),
            taken_at,
            processes,
        }
    }

    /// Keeps a push window from now on.
    pub(crate) fn start_pushing(&mut self, now: SystemTime) {
        self.push = Some((BTreeMap::new(), now));
    }

    /// Hands over the push window and starts a new one (`None` when not pushing).
    pub(crate) fn take_push(&mut self, taken_at: SystemTime) -> Option<Snapshot> {
        let (window, started_at) = self.push.as_mut()?;
        Some(Snapshot {
            started_at: std::mem::replace(started_at, taken_at),
            taken_at,
            processes: profiles(std::mem::take(window), &self.truncated),
        })
    }

    /// Opens a tap (see the module documentation): refused when [`MAX_TAPS`] are open, or
    /// when the filter's pid has no sampler that sent a batch lately.
    pub(crate) fn open_tap(
        &mut self,
        filter: TapFilter,
        now: SystemTime,
    ) -> Result<u64, TapRefused> {
        self.taps.retain(|_, t| {
            now.duration_since(t.opened)
                .is_ok_and(|age| age <= MAX_TAP_AGE)
        });
        if let Some(pid) = filter.pid {
            if !self.lives.values().any(|life| life.pid == pid) {
                return Err(TapRefused::NotProfiled(pid));
            }
        }
        if self.taps.len() >= MAX_TAPS {
            return Err(TapRefused::Busy);
        }
        self.next_tap += 1;
        self.taps.insert(
            self.next_tap,
            Tap {
                filter,
                opened: now,
                window: BTreeMap::new(),
            },
        );
        Ok(self.next_tap)
    }

    /// Closes a tap and hands over what it counted.
    pub(crate) fn close_tap(&mut self, id: u64, now: SystemTime) -> Option<Snapshot> {
        let tap = self.taps.remove(&id)?;
        Some(Snapshot {
            started_at: tap.opened,
            taken_at: now,
            processes: profiles(tap.window, &self.truncated),
        })
    }

    #[cfg(test)]
    fn lives(&self) -> usize {
        self.lives.len()
    }
}

/// Counts a batch into a window (of the snapshot or of a tap), `life` holding its frames.
fn count(
    windows: &mut BTreeMap<i32, ProcessWindow>,
    max_stacks: usize,
    life: &Life,
    unknown: &Frames,
    batch: &Batch,
) {
    let window = windows.entry(batch.pid).or_insert_with(|| ProcessWindow {
        name: batch.name.clone(),
        role: batch.role,
        labels: batch.labels.clone(),
        entries: HashMap::new(),
        truncated: BTreeMap::new(),
        sampled_ns: 0,
    });
    window.sampled_ns = window.sampled_ns.saturating_add(batch.sampled_ns);
    if window.name != batch.name {
        window.name = batch.name.clone();
    }
    window.role = batch.role;
    window.labels = batch.labels.clone();
    for &(stack, status, n) in &batch.counts {
        if n == 0 {
            continue;
        }
        let key = (batch.life, stack, status);
        if let Some(entry) = window.entries.get_mut(&key) {
            entry.1 = entry.1.saturating_add(n);
        } else if window.entries.len() < max_stacks {
            let frames = life
                .stacks
                .get(&stack)
                .cloned()
                .unwrap_or_else(|| unknown.clone());
            window.entries.insert(key, (frames, n));
        } else {
            let t = window.truncated.entry(status).or_default();
            *t = t.saturating_add(n);
        }
    }
}

/// A window's processes, each with its distinct stacks merged across lives, highest count
/// first.
fn profiles(window: BTreeMap<i32, ProcessWindow>, truncated: &Frames) -> Vec<ProcessProfile> {
    window
        .into_iter()
        .map(|(pid, w)| {
            // Different lives (restarts) and stack ids may share frames: merge them.
            let mut merged: HashMap<(ThreadStatus, Frames), u64> =
                HashMap::with_capacity(w.entries.len() + w.truncated.len());
            let entries = w
                .entries
                .into_iter()
                .map(|((_, _, status), (frames, n))| ((status, frames), n));
            let over = w
                .truncated
                .into_iter()
                .map(|(status, n)| ((status, truncated.clone()), n));
            for (key, n) in entries.chain(over) {
                let c = merged.entry(key).or_default();
                *c = c.saturating_add(n);
            }
            let mut samples: Vec<(ThreadStatus, Frames, u64)> = merged
                .into_iter()
                .map(|((status, frames), n)| (status, frames, n))
                .collect();
            samples.sort_by(|a, b| {
                b.2.cmp(&a.2)
                    .then_with(|| a.1.cmp(&b.1))
                    .then_with(|| a.0.cmp(&b.0))
            });
            ProcessProfile {
                pid,
                name: w.name.to_string(),
                role: w.role,
                labels: (*w.labels).clone(),
                samples,
                sampled: Duration::from_nanos(w.sampled_ns),
            }
        })
        .collect()
}

/// The aggregator actor; see the module documentation.
pub(crate) struct AggregatorActor;

impl Actor for AggregatorActor {
    type Msg = AggregatorMsg;
    type State = Aggregation;
    /// The per-process cap of distinct stacks per window, and whether to keep a push window.
    type Arguments = (usize, bool);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (max_stacks, pushing): (usize, bool),
    ) -> Result<Self::State, ActorProcessingErr> {
        let now = SystemTime::now();
        let mut state = Aggregation::new(max_stacks, now);
        if pushing {
            state.start_pushing(now);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AggregatorMsg::Batch(batch) => state.add(batch),
            AggregatorMsg::TakeWindows {
                snapshot,
                push,
                reply,
            } => {
                let now = SystemTime::now();
                let snap = snapshot.then(|| state.take(now));
                let pushed = if push { state.take_push(now) } else { None };
                if reply.send((snap, pushed)).is_err() {
                    tracing::warn!("window requester went away; window dropped");
                }
            }
            AggregatorMsg::OpenTap(filter, reply) => {
                let id = state.open_tap(filter, SystemTime::now());
                if reply.send(id).is_err() {
                    if let Ok(id) = id {
                        state.close_tap(id, SystemTime::now());
                    }
                }
            }
            AggregatorMsg::CloseTap(id, reply) => {
                let _ = reply.send(state.close_tap(id, SystemTime::now()));
            }
            AggregatorMsg::DropTap(id) => {
                state.close_tap(id, SystemTime::now());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(name: &str) -> Vec<FrameInfo> {
        vec![
            FrameInfo::new(name, "a.py", Some(1)),
            FrameInfo::new("<module>", "a.py", None),
        ]
    }

    fn shared(name: &str) -> Frames {
        frames(name).into()
    }

    const CPU: ThreadStatus = ThreadStatus {
        on_cpu: true,
        holds_gil: false,
        waits_gil: false,
    };
    const IDLE: ThreadStatus = ThreadStatus {
        on_cpu: false,
        holds_gil: false,
        waits_gil: false,
    };

    fn batch(life: u64, counts: Vec<(u64, ThreadStatus, u64)>) -> Batch {
        Batch {
            life,
            epoch: 0,
            pid: 7,
            name: Arc::from("app"),
            role: pyfleet_policies::Role::Single,
            labels: Arc::default(),
            counts,
            sampled_ns: 0,
            new_stacks: Vec::new(),
            last: false,
        }
    }

    #[test]
    fn a_tap_of_a_pid_needs_its_sampler() {
        let mut agg = Aggregation::new(100, SystemTime::UNIX_EPOCH);
        let of = |pid| TapFilter {
            pid: Some(pid),
            service: None,
        };
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(agg.open_tap(of(7), now), Err(TapRefused::NotProfiled(7)));
        agg.add(batch(1, vec![]));
        assert!(agg.open_tap(of(7), now).is_ok(), "a batch of pid 7 came");
        assert_eq!(agg.open_tap(of(8), now), Err(TapRefused::NotProfiled(8)));
        // Its last batch: pid 7 is not profiled any more.
        let mut last = batch(1, vec![]);
        last.last = true;
        agg.add(last);
        assert_eq!(agg.open_tap(of(7), now), Err(TapRefused::NotProfiled(7)));
        // Without a pid, a tap is for whatever comes.
        assert!(agg.open_tap(TapFilter::default(), now).is_ok());
    }

    #[test]
    fn counts_merge_across_batches_and_lives() {
        let mut agg = Aggregation::new(100, SystemTime::UNIX_EPOCH);
        let mut b = batch(1, vec![(10, CPU, 2), (11, IDLE, 1)]);
        b.new_stacks = vec![(10, frames("f")), (11, frames("g"))];
        agg.add(b);
        agg.add(batch(1, vec![(10, CPU, 3)]));
        // A restarted sampler (new life) interns the same frames under another id.
        let mut b = batch(2, vec![(99, CPU, 4)]);
        b.new_stacks = vec![(99, frames("f"))];
        b.last = true;
        agg.add(b);
        assert_eq!(agg.lives(), 1, "the ended life's table is dropped");

        let snap = agg.take(SystemTime::UNIX_EPOCH);
        assert_eq!(snap.processes.len(), 1);
        let p = &snap.processes[0];
        assert_eq!((p.pid, p.name.as_str()), (7, "app"));
        assert_eq!(
            p.samples,
            vec![(CPU, shared("f"), 9), (IDLE, shared("g"), 1)]
        );
        // The next window starts empty, where the last one ended, but the live sampler's
        // frames are remembered.
        let next_end = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60);
        let next = agg.take(next_end);
        assert!(next.processes.is_empty());
        assert_eq!((next.started_at, next.taken_at), (snap.taken_at, next_end));
        agg.add(batch(1, vec![(11, IDLE, 5)]));
        let snap = agg.take(SystemTime::UNIX_EPOCH);
        assert_eq!(snap.processes[0].samples, vec![(IDLE, shared("g"), 5)]);
    }

    #[test]
    fn a_life_whose_last_batch_was_lost_is_forgotten() {
        let mut agg = Aggregation::new(100, SystemTime::UNIX_EPOCH);
        let mut b = batch(1, vec![(10, CPU, 2)]);
        b.new_stacks = vec![(10, frames("f"))];
        agg.add(b);
        for _ in 0..MAX_IDLE_WINDOWS {
            agg.take(SystemTime::UNIX_EPOCH);
            assert_eq!(agg.lives(), 1, "kept while it may still send");
        }
        agg.take(SystemTime::UNIX_EPOCH);
        assert_eq!(agg.lives(), 0, "forgotten without its last batch");
    }

    #[test]
    fn distinct_stacks_are_capped_into_truncated() {
        let mut agg = Aggregation::new(2, SystemTime::UNIX_EPOCH);
        let mut b = batch(1, vec![(1, CPU, 1), (2, CPU, 1), (3, CPU, 5), (4, IDLE, 2)]);
        b.new_stacks = (1..=4).map(|i| (i, frames(&format!("f{i}")))).collect();
        agg.add(b);
        // Known entries keep counting after the cap is reached.
        agg.add(batch(1, vec![(1, CPU, 1)]));
        let p = &agg.take(SystemTime::UNIX_EPOCH).processes[0];
        assert_eq!(p.total(), 10);
        let truncated: Vec<_> = p
            .samples
            .iter()
            .filter(|s| &*s.1[0].function == TRUNCATED_FUNCTION)
            .map(|s| (s.0, s.2))
            .collect();
        assert_eq!(truncated, vec![(CPU, 5), (IDLE, 2)]);
        assert_eq!(p.samples.len(), 4);
    }

    #[test]
    fn new_epoch_forgets_frames_and_unknown_ids_are_marked() {
        let mut agg = Aggregation::new(100, SystemTime::UNIX_EPOCH);
        let mut b = batch(1, vec![(1, CPU, 1)]);
        b.new_stacks = vec![(1, frames("f"))];
        agg.add(b);
        let mut b = batch(1, vec![(2, CPU, 1)]);
        b.epoch = 1;
        agg.add(b);
        let p = &agg.take(SystemTime::UNIX_EPOCH).processes[0];
        assert!(p.samples.contains(&(CPU, shared("f"), 1)));
        assert!(p
            .samples
            .iter()
            .any(|s| &*s.1[0].function == UNKNOWN_FUNCTION && s.2 == 1));
    }

    #[test]
    fn a_process_with_no_counted_sample_still_appears() {
        let mut agg = Aggregation::new(100, SystemTime::UNIX_EPOCH);
        agg.add(batch(1, Vec::new()));
        let snap = agg.take(SystemTime::UNIX_EPOCH);
        assert_eq!(snap.processes.len(), 1);
        assert!(snap.processes[0].samples.is_empty());
    }
}
