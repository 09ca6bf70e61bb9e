//! The supervisor actor: which processes have a sampler, restarts, and the shared rate.
//!
//! Owns the table of known pids and their sampler's state (running, restart pending, given up,
//! exited), the restart state of each, and the one sampling rate. Every `scan_interval` it
//! runs [`Discovery::scan`] on a blocking thread (the result comes back as a message, so the
//! supervisor keeps handling events meanwhile) and then:
//! - spawns one sampler, linked to itself, per newly listed pid;
//! - stops the sampler of each pid no longer listed and counts the exit
//!   (`pyfleet_process_exits_total{process}`);
//! - restarts (without counting an exit) the sampler of a pid whose role changed, so that its
//!   series and snapshots carry the role it has now (a master listed before its workers
//!   existed);
//! - marks samplers that have run for `healthy_after` as healthy (the restart policy's backoff
//!   starts over for them).
//!
//! Sampler ends arrive as ractor supervision events. A clean end with reason
//! `process_gone` is an exit (counted once; the pid is not sampled again while discovery still
//! lists it). A failure (`ActorFailed`: an error, too many sample errors, a failed attach, a
//! panic in the source) goes to the [`RestartPolicy`](pyfleet_policies::RestartPolicy): a
//! restart after its backoff (`pyfleet_actor_restarts_total{process,role,pid}` counts restarts), or
//! giving up: one warning, and no sampler for that pid while it is listed. Every
//! `rate_interval` it reads pyfleet's own CPU time, asks the
//! [`RatePolicy`](pyfleet_policies::RatePolicy) for the next rate and sends it to the fleet's
//! sampling threads (one rate for every process; see [`sampling`](crate::sampling)). It keeps
//! `pyfleet_processes` equal to the number of live samplers.
//!
//! It must not sample, aggregate or write anything, and must not block: discovery runs on a
//! blocking thread, and the samplers attach on tokio's blocking pool.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use metrics::{Counter, Gauge};
use pyfleet_policies::{RestartDecision, RestartState};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinHandle;

use crate::config::FleetConfig;
use crate::metric_names as m;
use crate::panics::guard;
use crate::sampler::{SamplerActor, SamplerArgs, SamplerMsg, REASON_PROCESS_GONE};
use crate::sampling::SamplingPool;
use crate::self_cpu::{cpu_time, CpuMeter};
use crate::slot::SlotSettings;
use crate::source::{Discovery, ProcessInfo, SourceFactory};
use crate::status::{FleetStatus, ProcessState, ProcessStatus};
use crate::timing::{spawn_ticker, Jitter};

const REASON_UNLISTED: &str = "unlisted";
/// A listed process's role changed (a master whose workers appeared after it was listed): its
/// sampler is stopped and, at the next scan, started afresh under the new labels.
const REASON_RELABEL: &str = "role changed";
const REASON_SHUTDOWN: &str = "shutdown";

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
    /// Listed, sampler about to be spawned.
    Pending,
    Running {
        actor: ActorRef<SamplerMsg>,
        since: Instant,
        healthy: bool,
        /// Told to stop because the pid is no longer listed.
        stopping: bool,
    },
    Backoff {
        generation: u64,
    },
    GivenUp,
    Exited,
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
        let restarts = metrics::counter!(
            m::ACTOR_RESTARTS,
            "process" => info.name.clone(),
            "role" => info.role.as_str(),
            "pid" => info.pid.to_string()
        );
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
    by_actor: HashMap<ActorId, i32>,
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
            by_actor: HashMap::new(),
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
                    state.apply_scan(&myself, list).await;
                }
            }
            SupervisorMsg::Restart { pid, generation } => {
                state.restart(&myself, pid, generation).await
            }
            SupervisorMsg::MeasureRate => state.measure_rate(),
            SupervisorMsg::Status(reply) => {
                let _ = reply.send(state.status());
            }
            SupervisorMsg::Shutdown(reply) => {
                state.shutting_down = true;
                for t in state.timers.drain(..) {
                    t.abort();
                }
                let wait = state.config.stop_timeout + state.config.stop_timeout;
                myself
                    .stop_children_and_wait(Some(REASON_SHUTDOWN.to_string()), Some(wait))
                    .await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if let Some(pid) = state.by_actor.remove(&cell.get_id()) {
                    state.sampler_ended(&myself, pid, Ok(reason)).await;
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some(pid) = state.by_actor.remove(&cell.get_id()) {
                    state
                        .sampler_ended(&myself, pid, Err(err.to_string()))
                        .await;
                }
            }
            _ => {}
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

    async fn apply_scan(&mut self, myself: &ActorRef<SupervisorMsg>, list: Vec<ProcessInfo>) {
        if self.shutting_down {
            return;
        }
        let mut listed = HashSet::with_capacity(list.len());
        let mut to_spawn = Vec::new();
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
                        if let EntryState::Running {
                            actor, stopping, ..
                        } = &mut entry.state
                        {
                            if !*stopping {
                                tracing::debug!(
                                    pid,
                                    "role {} -> {}: sampler restarted",
                                    entry.info.role,
                                    info.role
                                );
                                *stopping = true;
                                actor.stop(Some(REASON_RELABEL.to_string()));
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
            match &mut entry.state {
                EntryState::Running {
                    actor, stopping, ..
                } => {
                    if !*stopping {
                        *stopping = true;
                        actor.stop(Some(REASON_UNLISTED.to_string()));
                        count_exit(entry, &mut self.exits, &self.exit_counter);
                    }
                }
                _ => {
                    count_exit(entry, &mut self.exits, &self.exit_counter);
                    self.entries.remove(&pid);
                }
            }
        }

        for pid in to_spawn {
            self.spawn(myself, pid).await;
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

    async fn spawn(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32) {
        let Some(entry) = self.entries.get(&pid) else {
            return;
        };
        let args = SamplerArgs {
            factory: self.factory.clone(),
            info: entry.info.clone(),
            sampling: self.sampling.clone(),
            settings: SlotSettings {
                mode: self.config.mode,
                batch_interval: self.config.batch_interval,
                max_consecutive_errors: self.config.max_consecutive_errors,
                max_known_stacks: self.config.max_stacks_per_process.saturating_mul(2),
            },
            stop_timeout: self.config.stop_timeout,
        };
        let spawned = myself
            .get_cell()
            .spawn_linked(None, SamplerActor::<F>::new(), args)
            .await;
        match spawned {
            Ok((actor, _join)) => {
                self.by_actor.insert(actor.get_id(), pid);
                if let Some(entry) = self.entries.get_mut(&pid) {
                    entry.state = EntryState::Running {
                        actor,
                        since: Instant::now(),
                        healthy: false,
                        stopping: false,
                    };
                }
            }
            Err(e) => self.failed(myself, pid, format!("cannot start sampler: {e}")),
        }
        self.update_gauge();
    }

    /// A sampler failed (or could not start): restart it later, or give up.
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

    async fn restart(&mut self, myself: &ActorRef<SupervisorMsg>, pid: i32, generation: u64) {
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
        self.spawn(myself, pid).await;
    }

    async fn sampler_ended(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        pid: i32,
        how: Result<Option<String>, String>,
    ) {
        if self.shutting_down {
            if let Some(entry) = self.entries.get_mut(&pid) {
                entry.state = EntryState::Exited;
            }
            self.update_gauge();
            return;
        }
        let Some(entry) = self.entries.get_mut(&pid) else {
            return;
        };
        let stopping = matches!(entry.state, EntryState::Running { stopping: true, .. });
        if !entry.listed || stopping {
            // Stopped because discovery no longer listed it (the exit is counted); a later
            // scan that lists the pid again starts afresh.
            self.entries.remove(&pid);
        } else {
            match how {
                Ok(Some(reason)) if reason == REASON_PROCESS_GONE => {
                    count_exit(entry, &mut self.exits, &self.exit_counter);
                    entry.state = EntryState::Exited;
                    tracing::debug!(pid, process = %entry.info.name, "process exited");
                }
                Ok(reason) => self.failed(
                    myself,
                    pid,
                    format!("sampler stopped unexpectedly ({reason:?})"),
                ),
                Err(why) => self.failed(myself, pid, why),
            }
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
