//! The supervisor actor: which processes are sampled, each sampler's life, restarts, and the
//! shared rate.
//!
//! A *sampler* is one life of one process's sampling: the supervisor attaches the process's
//! source ([`SourceFactory::attach`], which can take milliseconds) on tokio's blocking pool,
//! never on the sampling thread nor on the async workers; the source comes back as
//! [`SupervisorMsg::Attached`], and the supervisor hands it to the sampling pool as a
//! [`Slot`]. The slot tells how it ended, typed ([`SlotEnd`]), in
//! [`SupervisorMsg::SlotEnded`], after its final batch went to the aggregator. Each life has
//! an id ([`next_life`]); a message about a life the supervisor has moved on from (stopped
//! while attaching, replaced) is ignored, and a source that arrives for it is dropped on the
//! blocking pool.
//!
//! Owns the table of known pids and their sampler's state (attaching or sampling, restart
//! pending, given up, exited), the restart state of each, why it stopped a sampler
//! ([`StopReason`]), and the one sampling rate. Every `scan_interval` it runs
//! [`Discovery::scan`] on a blocking thread (the result comes back as a message, so the
//! supervisor keeps handling events meanwhile) and then:
//! - starts a sampler per newly listed pid;
//! - stops the sampler of each pid no longer listed and counts the exit
//!   (`pyfleet_process_exits_total`);
//! - stops (without counting an exit) the sampler of a pid whose role changed; the next scan
//!   samples it afresh, so that its series and snapshots carry the role it has now (a master
//!   listed before its workers existed);
//! - marks samplers that have run for `healthy_after` as healthy (the restart policy's backoff
//!   starts over for them).
//!
//! How a sampler ended decides what follows: stopped by the supervisor (unlisted, role
//! changed, shutdown), whatever the slot saw meanwhile, the entry is dropped (a later scan that
//! lists the pid starts afresh); [`SlotEnd::ProcessGone`], or an attach that found the process
//! ending ([`AttachFailure::Ended`]), is an exit (counted once, no warning; the pid is not
//! sampled again while discovery still lists it); a failure (a failed or panicking attach,
//! too many sample errors, a panic in the source, a slot removed unasked) goes to the
//! [`RestartPolicy`](pyfleet_policies::RestartPolicy): a restart after its backoff
//! (`pyfleet_actor_restarts_total{process,role,pid}` counts restarts), or giving up: one
//! warning, and no sampler for that pid while it is listed. An exit is never a failure.
//!
//! Every `rate_interval` it reads pyfleet's own CPU time, asks the
//! [`RatePolicy`](pyfleet_policies::RatePolicy) for the next rate and sends it to the fleet's
//! sampling threads (one rate for every process; see [`sampling`](crate::sampling)). It keeps
//! `pyfleet_processes` equal to the number of live samplers. On shutdown it stops every
//! sampler and waits, bounded by `stop_timeout`, until each slot's final batch is sent.
//!
//! It must not sample, aggregate or write anything, and must not block: discovery and
//! attaches run on blocking threads, and sources it drops are dropped there too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use metrics::{Counter, Gauge};
use pyfleet_policies::{RestartDecision, RestartState};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::FleetConfig;
use crate::metric_names as m;
use crate::panics::guard;
use crate::sampling::SamplingPool;
use crate::self_cpu::{cpu_time, CpuMeter};
use crate::slot::{next_life, Slot, SlotEnd, SlotSettings};
use crate::source::{AttachFailure, Discovery, ProcessInfo, SourceFactory, StackSource};
use crate::status::{FleetStatus, ProcessState, ProcessStatus};
use crate::timing::{spawn_ticker, Jitter};

/// Why the supervisor stopped a sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// Discovery no longer lists the pid (or lists another process under it). An exit,
    /// counted when the sampler is stopped.
    Unlisted,
    /// A listed process's role changed (a master whose workers appeared after it was listed):
    /// sampled afresh from the next scan under the new labels. Neither an exit nor a failure.
    RoleChanged,
    /// The fleet is shutting down.
    Shutdown,
}

pub(crate) struct SupervisorArgs<D, F> {
    pub discovery: D,
    pub factory: Arc<F>,
    pub sampling: Arc<SamplingPool>,
    pub config: FleetConfig,
}

pub(crate) enum SupervisorMsg {
    Scan,
    /// `None`: the scan failed (discovery panicked); nothing is concluded from it.
    ScanDone(Option<Vec<ProcessInfo>>),
    /// From an attach task: the source of sampler life `life` of `pid`, or why there is none.
    Attached {
        pid: i32,
        life: u64,
        source: Result<Box<dyn StackSource>, AttachFailure>,
    },
    /// From a sampling thread: the slot of sampler life `life` of `pid` has ended, its final
    /// batch sent.
    SlotEnded {
        pid: i32,
        life: u64,
        end: SlotEnd,
    },
    Restart {
        pid: i32,
        generation: u64,
    },
    MeasureRate,
    Status(RpcReplyPort<FleetStatus>),
    /// Stops every sampler and waits until they have sent their final batches.
    Shutdown(RpcReplyPort<()>),
}

/// The supervisor actor; see the module documentation.
pub(crate) struct SupervisorActor<D, F>(std::marker::PhantomData<fn() -> (D, F)>);

impl<D, F> SupervisorActor<D, F> {
    pub(crate) fn new() -> Self {
        SupervisorActor(std::marker::PhantomData)
    }
}

enum EntryState {
    /// Listed, sampler about to be started.
    Pending,
    /// A sampler life: attaching, then sampling on a thread.
    Running {
        life: u64,
        since: Instant,
        healthy: bool,
        /// Once its slot is on a sampling thread.
        placed: Option<Placed>,
        /// Set once the supervisor has asked it to stop, with why.
        stopping: Option<StopReason>,
    },
    Backoff {
        generation: u64,
    },
    GivenUp,
    Exited,
}

/// Where a sampler's slot is.
struct Placed {
    /// The sampling thread it is on.
    thread: usize,
    /// Fires once the slot has ended and its final batch is sent. Dropped (with the entry, or
    /// the whole supervisor), it abandons the slot: the thread removes it at its next tick.
    done: oneshot::Receiver<()>,
}

struct Entry {
    info: ProcessInfo,
    listed: bool,
    state: EntryState,
    restart: RestartState,
    exit_counted: bool,
    restarts: Counter,
}

impl Entry {
    fn new(info: ProcessInfo) -> Self {
        let restarts =
            metrics::counter!(m::ACTOR_RESTARTS, crate::slot::process_labels(&info).iter());
        Entry {
            info,
            listed: true,
            state: EntryState::Pending,
            restart: RestartState::default(),
            exit_counted: false,
            restarts,
        }
    }
}

pub(crate) struct SupervisorState<D, F> {
    discovery: Arc<Mutex<D>>,
    factory: Arc<F>,
    sampling: Arc<SamplingPool>,
    config: FleetConfig,
    started: Instant,
    entries: HashMap<i32, Entry>,
    scanning: bool,
    shutting_down: bool,
    rate_hz: f64,
    cpu: CpuMeter,
    timers: Vec<JoinHandle<()>>,
    next_generation: u64,
    jitter: Jitter,
    exits: u64,
    restarts: u64,
    processes: Gauge,
    /// Held here only to be touched every scan (the sink increments it).
    snapshots_written: Counter,
    exit_counter: Counter,
}

impl<D: Discovery, F: SourceFactory> Actor for SupervisorActor<D, F> {
    type Msg = SupervisorMsg;
    type State = SupervisorState<D, F>;
    type Arguments = SupervisorArgs<D, F>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let rate_hz = args.config.rate.base_hz();
        let mut cpu = CpuMeter::new();
        if let Ok(t) = cpu_time() {
            cpu.observe(Instant::now(), t);
        }
        Ok(SupervisorState {
            discovery: Arc::new(Mutex::new(args.discovery)),
            factory: args.factory,
            sampling: args.sampling,
            config: args.config,
            started: Instant::now(),
            entries: HashMap::new(),
            scanning: false,
            shutting_down: false,
            rate_hz,
            cpu,
            timers: Vec::new(),
            next_generation: 1,
            jitter: Jitter::seeded(),
            exits: 0,
            restarts: 0,
            processes: metrics::gauge!(m::PROCESSES),
            snapshots_written: metrics::counter!(m::SNAPSHOTS_WRITTEN),
            exit_counter: metrics::counter!(m::PROCESS_EXITS),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.processes.set(0.0);
        myself.send_message(SupervisorMsg::Scan)?;
        state.timers.push(spawn_ticker(
            myself.clone(),
            state.config.scan_interval,
            || SupervisorMsg::Scan,
        ));
        state.timers.push(spawn_ticker(
            myself.clone(),
            state.config.rate_interval,
            || SupervisorMsg::MeasureRate,
        ));
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in state.timers.drain(..) {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Scan => state.start_scan(&myself),
            SupervisorMsg::ScanDone(list) => {
                state.scanning = false;
                if let Some(list) = list {
                    state.apply_scan(&myself, list);
                }
            }
            SupervisorMsg::Attached { pid, life, source } => {
                state.attached(&myself, pid, life, source)
            }
            SupervisorMsg::SlotEnded { pid, life, end } => {
                state.sampler_ended(&myself, pid, life, end)
            }
            SupervisorMsg::Restart { pid, generation } => state.restart(&myself, pid, generation),
            SupervisorMsg::MeasureRate => state.measure_rate(),
            SupervisorMsg::Status(reply) => {
                let _ = reply.send(state.status());
            }
            SupervisorMsg::Shutdown(reply) => {
                state.shutting_down = true;
                for t in state.timers.drain(..) {
                    t.abort();
                }
                state.stop_all(&myself).await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

impl<D: Discovery, F: SourceFactory> SupervisorState<D, F> {
    fn start_scan(&mut self, myself: &ActorRef<SupervisorMsg>) {
        if self.scanning || self.shutting_down {
            return;
        }
        self.scanning = true;
        let discovery = self.discovery.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let scanned = tokio::task::spawn_blocking(move || {
                let mut d = discovery.lock().unwrap_or_else(PoisonError::into_inner);
                guard(|| d.scan())
            })
            .await;
            let list = match scanned {
                Ok(Ok(list)) => Some(list),
                Ok(Err(panic)) => {
                    tracing::warn!("process discovery panicked: {panic}");
                    None
                }
                Err(e) => {
                    tracing::warn!("process discovery did not complete: {e}");
                    None
                }
            };
            let _ = me.send_message(SupervisorMsg::ScanDone(list));
        });
    }

    fn apply_scan(&mut self, myself: &ActorRef<SupervisorMsg>, list: Vec<ProcessInfo>) {
        if self.shutting_down {
            return;
        }
        let mut listed = HashSet::with_capacity(list.len());
        let mut to_spawn = Vec::new();
        let mut to_stop = Vec::new();
        for info in list {
            let pid = info.pid;
            // Another process under a pid still sampled (the first exited and the pid was
            // reused before its sampler noticed): the old sampler ends as if unlisted, the new
            // process is taken up at the next scan.
            let reused = self.entries.get(&pid).is_some_and(|e| {
                e.info.start_time != 0
                    && info.start_time != 0
                    && e.info.start_time != info.start_time
                    && matches!(e.state, EntryState::Running { .. })
            });
            if reused || !listed.insert(pid) {
                continue;
            }
            match self.entries.get_mut(&pid) {
                None => {
                    self.entries.insert(pid, Entry::new(info));
                    to_spawn.push(pid);
                }
                Some(entry) => {
                    entry.listed = true;
                    if entry.info.role != info.role {
                        if let EntryState::Running { stopping, .. } = &entry.state {
                            if stopping.is_none() {
                                tracing::debug!(
                                    pid,
                                    "role {} -> {}: sampler restarted",
                                    entry.info.role,
                                    info.role
                                );
                                to_stop.push((pid, StopReason::RoleChanged));
                            }
                            continue;
                        }
                    }
                    let idle = matches!(
                        entry.state,
                        EntryState::GivenUp | EntryState::Exited | EntryState::Backoff { .. }
                    );
                    if idle && entry.info != info {
                        // The pid was reused by another process: start afresh.
                        self.entries.insert(pid, Entry::new(info));
                        to_spawn.push(pid);
                    }
                }
            }
        }

        let gone: Vec<i32> = self
            .entries
            .keys()
            .copied()
            .filter(|pid| !listed.contains(pid))
            .collect();
        for pid in gone {
            let Some(entry) = self.entries.get_mut(&pid) else {
                continue;
            };
            entry.listed = false;
            match &entry.state {
                EntryState::Running { stopping, .. } => {
                    if stopping.is_none() {
                        count_exit(entry, &mut self.exits, &self.exit_counter);
                        to_stop.push((pid, StopReason::Unlisted));
                    }
                }
                _ => {
                    count_exit(entry, &mut self.exits, &self.exit_counter);
                    self.entries.remove(&pid);
                }
            }
        }

        for (pid, reason) in to_stop {
            self.stop(myself, pid, reason);
        }
        for pid in to_spawn {
            self.spawn(myself, pid);
        }

        let healthy_after = self.config.healthy_after;
        for entry in self.entries.values_mut() {
            if let EntryState::Running { since, healthy, .. } = &mut entry.state {
                if !*healthy && since.elapsed() >= healthy_after {
                    *healthy = true;
                    self.config.restart.on_healthy(&mut entry.restart);
                }
            }
            // Keeps the series alive while the pid is listed (see the crate docs).
            entry.restarts.increment(0);
        }
        self.update_gauge();
        self.touch_fleet_series();
    }

    /// Marks the fleet-wide series as alive every scan, so an exporter's idle timeout only
    /// ever removes per-process series (see the crate documentation).
    fn touch_fleet_series(&self) {
        self.snapshots_written.increment(0);
        self.exit_counter.increment(0);
    }

    fn slot_settings(&self) -> SlotSettings {
        SlotSettings {
            mode: self.config.mode,
            batch_interval: self.config.batch_interval,
            max_consecutive_errors: self.config.max_consecutive_errors,
            max_known_stacks: self.config.max_stacks_per_process.saturating_mul(2),
        }
    }

    /// Starts a sampler life for `pid`: its source is attached on the blocking pool and comes
    /// back as [`SupervisorMsg::Attached`].
    fn spawn(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32) {
        let needs_cpu_status = self.config.mode.needs_cpu_status();
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        let life = next_life();
        let factory = self.factory.clone();
        let target = entry.info.clone();
        let me = myself.clone();
        tokio::task::spawn_blocking(move || {
            let source = match guard(|| factory.attach(&target, needs_cpu_status)) {
                Ok(Ok(source)) => Ok(Box::new(source) as Box<dyn StackSource>),
                Ok(Err(AttachFailure::Failed(e))) => {
                    Err(AttachFailure::Failed(format!("attach failed: {e}")))
                }
                Ok(Err(ended)) => Err(ended),
                Err(panic) => Err(AttachFailure::Failed(format!("attach panicked: {panic}"))),
            };
            // If the supervisor is gone, the message and its source are dropped here.
            let _ = me.send_message(SupervisorMsg::Attached { pid, life, source });
        });
        entry.state = EntryState::Running {
            life,
            since: Instant::now(),
            healthy: false,
            placed: None,
            stopping: None,
        };
        self.update_gauge();
    }

    /// The attach of life `life` of `pid` is done: hands its source to the sampling pool as
    /// a slot, or fails the sampler.
    fn attached(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        pid: i32,
        life: u64,
        source: Result<Box<dyn StackSource>, AttachFailure>,
    ) {
        let settings = self.slot_settings();
        let current = self.entries.get(&pid).filter(|e| {
            matches!(
                e.state,
                EntryState::Running { life: l, placed: None, stopping: None, .. } if l == life
            )
        });
        let Some(entry) = current else {
            // A life already over (stopped while it attached).
            if let Ok(source) = source {
                drop_off_async_workers(pid, source);
            }
            return;
        };
        let source = match source {
            Ok(source) => source,
            Err(AttachFailure::Ended(why)) => {
                self.ended(pid, &why);
                self.update_gauge();
                return;
            }
            Err(AttachFailure::Failed(why)) => {
                tracing::warn!(pid, process = %entry.info.name, "sampler failed: {why}");
                self.failed(myself, pid, why);
                self.update_gauge();
                return;
            }
        };
        let me = myself.clone();
        let (slot, done) = Slot::new(
            life,
            &entry.info,
            &settings,
            source,
            Box::new(move |end| {
                // If the supervisor is gone (the fleet stopped), nobody needs to know.
                let _ = me.send_message(SupervisorMsg::SlotEnded { pid, life, end });
            }),
        );
        match self.sampling.add(slot) {
            Ok(thread) => {
                if let Some(entry) = self.entries.get_mut(&pid) {
                    if let EntryState::Running { placed, .. } = &mut entry.state {
                        *placed = Some(Placed { thread, done });
                    }
                    tracing::debug!(pid, process = %entry.info.name, "sampling");
                }
            }
            Err(why) => {
                self.failed(myself, pid, why);
                self.update_gauge();
            }
        }
    }

    /// Stops the sampler of `pid` for `reason`, unless it is stopping already. A sampler on a
    /// thread has its slot removed (the end comes back as [`SupervisorMsg::SlotEnded`]); one
    /// still attaching ends at once (its source is dropped when it arrives).
    fn stop(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32, reason: StopReason) {
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        let EntryState::Running {
            life,
            placed,
            stopping,
            ..
        } = &mut entry.state
        else {
            return;
        };
        if stopping.is_some() {
            return;
        }
        *stopping = Some(reason);
        let life = *life;
        match placed {
            Some(placed) => self.sampling.remove(placed.thread, life),
            None => self.sampler_ended(myself, pid, life, SlotEnd::Removed),
        }
    }

    /// Stops every sampler and waits, bounded by `stop_timeout`, until each slot's final batch
    /// is sent.
    async fn stop_all(&mut self, myself: &ActorRef<SupervisorMsg>) {
        let running: Vec<i32> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, EntryState::Running { .. }))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in running {
            self.stop(myself, pid, StopReason::Shutdown);
        }
        // Every slot still on a thread, those stopped earlier for another reason included.
        let pending: Vec<oneshot::Receiver<()>> = self
            .entries
            .values_mut()
            .filter_map(|e| match &mut e.state {
                EntryState::Running { placed, .. } => placed.take().map(|p| p.done),
                _ => None,
            })
            .collect();
        let timeout = self.config.stop_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut late = 0;
        for done in pending {
            // A receive error is "done" dropped unsent: the slot is gone all the same.
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                late += 1;
            }
        }
        if late > 0 {
            tracing::warn!(
                "{late} slot(s) not removed from the sampling threads within {timeout:?}: their \
                 last batches may be lost"
            );
        }
    }

    /// The process of a sampler exited (seen by its slot or its attach): counted once, and
    /// not sampled again while discovery still lists it.
    fn ended(&mut self, pid: i32, why: &str) {
        if let Some(entry) = self.entries.get_mut(&pid) {
            count_exit(entry, &mut self.exits, &self.exit_counter);
            entry.state = EntryState::Exited;
            tracing::debug!(pid, process = %entry.info.name, "process exited: {why}");
        }
    }

    /// A sampler failed: restart it later, or give up.
    fn failed(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32, why: String) {
        let now = self.started.elapsed();
        let random = self.jitter.next();
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        match self
            .config
            .restart
            .on_failure(&mut entry.restart, now, random)
        {
            RestartDecision::RestartAfter(delay) => {
                let generation = self.next_generation;
                self.next_generation += 1;
                entry.state = EntryState::Backoff { generation };
                tracing::info!(
                    pid,
                    process = %entry.info.name,
                    "sampler failed ({why}); restarting in {delay:?}"
                );
                myself.send_after(delay, move || SupervisorMsg::Restart { pid, generation });
            }
            RestartDecision::GiveUp { restarts, window } => {
                entry.state = EntryState::GivenUp;
                tracing::warn!(
                    pid,
                    process = %entry.info.name,
                    cmdline = %entry.info.cmdline,
                    "giving up on sampling this process: it failed after {restarts} restarts \
                     within {window:?}; last failure: {why}"
                );
            }
        }
    }

    fn restart(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32, generation: u64) {
        if self.shutting_down {
            return;
        }
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        if !matches!(entry.state, EntryState::Backoff { generation: g } if g == generation)
            || !entry.listed
        {
            return;
        }
        entry.restarts.increment(1);
        self.restarts += 1;
        self.spawn(myself, pid);
    }

    /// Sampler life `life` of `pid` has ended (its slot ended, or it was stopped while it
    /// attached): concludes an exit, a failure, or the end of a stop it asked for.
    fn sampler_ended(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        pid: i32,
        life: u64,
        end: SlotEnd,
    ) {
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        let stopping = match &entry.state {
            EntryState::Running {
                life: current,
                stopping,
                ..
            } if *current == life => *stopping,
            // A life the supervisor has moved on from.
            _ => return,
        };
        match (stopping, end) {
            (Some(reason), _) => {
                // Whatever the slot saw meanwhile, it was asked to stop. Unlisted: the exit
                // is counted; a later scan that lists the pid again starts afresh, as it does
                // after a role change.
                tracing::debug!(pid, process = %entry.info.name, "sampler stopped: {reason:?}");
                self.entries.remove(&pid);
            }
            (None, SlotEnd::ProcessGone(why)) => self.ended(pid, &why),
            (None, SlotEnd::Failed(why)) => self.failed(myself, pid, why),
            (None, SlotEnd::Removed) => self.failed(
                myself,
                pid,
                "removed from its sampling thread unasked".to_string(),
            ),
        }
        self.update_gauge();
    }

    fn measure_rate(&mut self) {
        if self.shutting_down {
            return;
        }
        let cpu = match cpu_time() {
            Ok(cpu) => cpu,
            Err(e) => {
                tracing::debug!("getrusage failed: {e}");
                return;
            }
        };
        let Some(percent) = self.cpu.observe(Instant::now(), cpu) else {
            return;
        };
        let rate = self.config.rate.adjust(self.rate_hz, percent);
        if rate == self.rate_hz {
            return;
        }
        tracing::debug!(
            "own CPU {percent:.2}% of a core: sampling rate {:.1} -> {rate:.1} Hz",
            self.rate_hz
        );
        self.rate_hz = rate;
        self.sampling.set_rate(rate);
    }

    fn status(&self) -> FleetStatus {
        let mut processes: Vec<ProcessStatus> = self
            .entries
            .values()
            .map(|e| ProcessStatus {
                pid: e.info.pid,
                name: e.info.name.clone(),
                role: e.info.role,
                labels: e.info.labels.clone(),
                python_version: e.info.python_version.clone(),
                state: match &e.state {
                    EntryState::Pending => ProcessState::Starting,
                    EntryState::Running { .. } => ProcessState::Sampling,
                    EntryState::Backoff { .. } => ProcessState::RestartPending,
                    EntryState::GivenUp => ProcessState::GivenUp,
                    EntryState::Exited => ProcessState::Exited,
                },
                failures_in_window: e.restart.failures_in_window(),
            })
            .collect();
        processes.sort_by_key(|p| p.pid);
        FleetStatus {
            rate_hz: self.rate_hz,
            processes,
            exits: self.exits,
            restarts: self.restarts,
        }
    }

    fn update_gauge(&self) {
        let live = self
            .entries
            .values()
            .filter(|e| matches!(e.state, EntryState::Running { .. }))
            .count();
        self.processes.set(live as f64);
    }
}

/// Drops a source nobody will sample on the blocking pool (a source's `Drop` may do I/O; a
/// panic in it is caught).
fn drop_off_async_workers(pid: i32, source: Box<dyn StackSource>) {
    tokio::task::spawn_blocking(move || {
        if let Err(panic) = guard(move || drop(source)) {
            tracing::warn!(pid, "dropping the stack source panicked: {panic}");
        }
    });
}

/// Counts a process's exit once (one fleet-wide counter: no label a target chooses, so that
/// a churn of new names cannot grow the series).
fn count_exit(entry: &mut Entry, exits: &mut u64, counter: &Counter) {
    if entry.exit_counted {
        return;
    }
    entry.exit_counted = true;
    *exits += 1;
    counter.increment(1);
}
