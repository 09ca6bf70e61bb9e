//! The entry point: [`Fleet::start`] spawns the aggregator, the fleet's sampling thread(s),
//! the snapshot sink and the supervisor (which spawns the sampler actors);
//! [`Fleet::shutdown`] stops them in the order that loses no sample and returns once the
//! final snapshot is written.
//!
//! The samplers are one actor per process (supervision, restarts, exits, per-process
//! metrics), but the sampling itself runs on shared threads owned here, by default exactly
//! one: every process is sampled at the same tick by the same thread, so the fleet pays one
//! thread wakeup per tick (about 60 µs of CPU on a VM) instead of one per process per tick.
//! See [`sampling`](crate::sampling) for the thread and why one is the default, and
//! [`sampler`](crate::sampler) for how a process's slot comes and goes.
//!
//! Shutdown order: the supervisor stops every sampler actor, each of which has its slot
//! removed from the sampling thread and waits until the slot's final batch is sent; then the
//! sampling threads stop (finishing any slot still there) and are joined, all of it bounded
//! by `stop_timeout`; then the sink writes the final snapshot, which therefore holds every
//! sample taken (not bounded: cut short, it would lose everything); then the sink and the
//! aggregator stop.
//!
//! Owns [`FleetConfig`] (every knob of the actors, with the daemon's defaults), the start and
//! shutdown order, and the status query. It must not parse command lines, install signal
//! handlers or metric exporters: the root package's `main` does, then calls in here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyfleet_policies::{Mode, RatePolicy, RestartPolicy};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};

use crate::aggregator::{AggregatorActor, AggregatorMsg};
use crate::sampling::SamplingPool;
use crate::sink::{SinkActor, SinkArgs, SinkMsg};
use crate::snapshot::SnapshotWriter;
use crate::source::{Discovery, SourceFactory};
use crate::supervisor::{SupervisorActor, SupervisorArgs, SupervisorMsg};

/// Everything the actors need to know. [`Default`] gives the daemon's defaults.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// How often discovery runs (default 1 s).
    pub scan_interval: Duration,
    /// How often a snapshot is written (default 60 s); one more is written at shutdown.
    pub snapshot_interval: Duration,
    /// How often each sampler sends its counts to the aggregator (default 1 s).
    pub batch_interval: Duration,
    /// How often pyfleet's own CPU is measured and the rate adjusted (default 2 s: soon
    /// enough that a budget holds from the start, long enough for 10 ms CPU ticks to measure).
    pub rate_interval: Duration,
    /// Which thread samples count (default wall).
    pub mode: Mode,
    /// The shared rate under the CPU budget; samplers start at `base_hz`.
    pub rate: RatePolicy,
    /// Backoff and give-up for failed samplers.
    pub restart: RestartPolicy,
    /// Sample errors in a row that make a sampler fail (default 100).
    pub max_consecutive_errors: u32,
    /// Distinct stacks per process per snapshot window before `[truncated]` (default 50 000).
    pub max_stacks_per_process: usize,
    /// A sampler running this long counts as healthy: its next failure backs off from the
    /// initial backoff again (default 10 s).
    pub healthy_after: Duration,
    /// How long stopping may take as a whole: every sampler's final batch sent, the sampling
    /// threads joined (default 5 s). The final snapshot is written after, whatever it takes.
    pub stop_timeout: Duration,
    /// OS threads that sample the fleet (default 1; at least 1). Every process is sampled by
    /// one of them, at the same ticks; a new process goes to the one with the fewest. One
    /// thread is one wakeup per tick for the whole fleet, the cheapest; more only isolate
    /// processes from a source that stalls (see the `sampling` module's documentation).
    pub sampling_threads: usize,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            scan_interval: Duration::from_secs(1),
            snapshot_interval: Duration::from_secs(60),
            batch_interval: Duration::from_secs(1),
            rate_interval: Duration::from_secs(2),
            mode: Mode::default(),
            rate: RatePolicy::default(),
            restart: RestartPolicy::default(),
            max_consecutive_errors: 100,
            max_stacks_per_process: 50_000,
            healthy_after: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(5),
            sampling_threads: 1,
        }
    }
}

impl FleetConfig {
    /// Rejects intervals of zero and limits of zero (zero sampling threads included).
    pub fn validate(&self) -> Result<(), FleetError> {
        let intervals = [
            ("scan_interval", self.scan_interval),
            ("snapshot_interval", self.snapshot_interval),
            ("batch_interval", self.batch_interval),
            ("rate_interval", self.rate_interval),
        ];
        for (name, d) in intervals {
            if d.is_zero() {
                return Err(FleetError::Config(format!("{name} must be above zero")));
            }
        }
        if self.max_consecutive_errors == 0 {
            return Err(FleetError::Config(
                "max_consecutive_errors must be at least 1".to_string(),
            ));
        }
        if self.max_stacks_per_process == 0 {
            return Err(FleetError::Config(
                "max_stacks_per_process must be at least 1".to_string(),
            ));
        }
        if self.sampling_threads == 0 {
            return Err(FleetError::Config(
                "sampling_threads must be at least 1".to_string(),
            ));
        }
        Ok(())
    }

    /// The idle timeout to give the metrics exporter so that a process's series disappear
    /// soon after its sampler is gone, yet never while it lives: samplers touch their series
    /// with every batch (every `batch_interval`, or every sampling period when that is longer,
    /// since batches go out after ticks) and record a sample duration every period, and the
    /// supervisor touches its series every `scan_interval`, so any timeout well above all
    /// three works. This is four times the longest of them (the sampling period taken at the
    /// rate policy's floor), and at least 10 s.
    pub fn metrics_idle_timeout(&self) -> Duration {
        let slowest_sample = crate::timing::period_of(self.rate.min_hz()).unwrap_or_default();
        let longest = self
            .batch_interval
            .max(self.scan_interval)
            .max(slowest_sample);
        longest
            .checked_mul(4)
            .unwrap_or(longest)
            .max(Duration::from_secs(10))
    }
}

/// Why the fleet could not start, or how shutdown went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet configuration: {0}")]
    Config(String),
    #[error("cannot start the {actor} actor: {reason}")]
    Spawn { actor: &'static str, reason: String },
    #[error("the {0} actor is not running")]
    ActorGone(&'static str),
    #[error("final snapshot not written: {0}")]
    Snapshot(String),
}

/// What the supervisor knows, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetStatus {
    /// The shared sampling rate now.
    pub rate_hz: f64,
    /// Every pid the supervisor tracks, by pid.
    pub processes: Vec<ProcessStatus>,
    /// Profiled processes seen to exit since start.
    pub exits: u64,
    /// Sampler restarts since start.
    pub restarts: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessStatus {
    pub pid: i32,
    pub name: String,
    pub state: ProcessState,
    /// Failures still in the restart policy's window.
    pub failures_in_window: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Listed, its sampler is being spawned.
    Starting,
    /// A sampler is running.
    Sampling,
    /// The sampler failed; a restart is scheduled.
    RestartPending,
    /// The sampler failed too often; not sampled again while the pid is listed.
    GivenUp,
    /// The sampler saw the process exit; not sampled again while the pid is listed.
    Exited,
}

/// The running actors. Dropping it without [`Fleet::shutdown`] leaves them running until the
/// tokio runtime ends, and no final snapshot is written.
pub struct Fleet {
    supervisor: ActorRef<SupervisorMsg>,
    aggregator: ActorRef<AggregatorMsg>,
    sink: ActorRef<SinkMsg>,
    sampling: Arc<SamplingPool>,
    handles: Vec<tokio::task::JoinHandle<()>>,
    stop_timeout: Duration,
}

impl Fleet {
    /// Starts profiling: the supervisor scans at once and then every `scan_interval`.
    /// Must be called inside a tokio runtime (multi-threaded, as the daemon's is).
    pub async fn start<D, F, W>(
        config: FleetConfig,
        discovery: D,
        factory: F,
        writer: W,
    ) -> Result<Fleet, FleetError>
    where
        D: Discovery,
        F: SourceFactory,
        W: SnapshotWriter,
    {
        config.validate()?;
        let spawn_err = |actor| {
            move |e: ractor::SpawnErr| FleetError::Spawn {
                actor,
                reason: e.to_string(),
            }
        };
        let (aggregator, aggregator_handle) =
            Actor::spawn(None, AggregatorActor, config.max_stacks_per_process)
                .await
                .map_err(spawn_err("aggregator"))?;
        let sampling = match SamplingPool::start(
            config.sampling_threads,
            config.rate.base_hz(),
            aggregator.clone(),
        ) {
            Ok(pool) => Arc::new(pool),
            Err(reason) => {
                aggregator.stop(None);
                return Err(FleetError::Spawn {
                    actor: "sampling",
                    reason,
                });
            }
        };
        let sink_args = SinkArgs {
            writer: Arc::new(writer),
            aggregator: aggregator.clone(),
            interval: config.snapshot_interval,
        };
        let (sink, sink_handle) = match Actor::spawn(None, SinkActor::<W>::new(), sink_args).await {
            Ok(s) => s,
            Err(e) => {
                sampling.stop();
                aggregator.stop(None);
                return Err(spawn_err("snapshot sink")(e));
            }
        };
        let stop_timeout = config.stop_timeout;
        let supervisor_args = SupervisorArgs {
            discovery,
            factory: Arc::new(factory),
            sampling: sampling.clone(),
            config,
        };
        let (supervisor, supervisor_handle) =
            match Actor::spawn(None, SupervisorActor::<D, F>::new(), supervisor_args).await {
                Ok(s) => s,
                Err(e) => {
                    sink.stop(None);
                    sampling.stop();
                    aggregator.stop(None);
                    return Err(spawn_err("supervisor")(e));
                }
            };
        Ok(Fleet {
            supervisor,
            aggregator,
            sink,
            sampling,
            handles: vec![supervisor_handle, sink_handle, aggregator_handle],
            stop_timeout,
        })
    }

    /// The supervisor's view of the fleet now.
    pub async fn status(&self) -> Result<FleetStatus, FleetError> {
        match self.supervisor.call(SupervisorMsg::Status, None).await {
            Ok(CallResult::Success(status)) => Ok(status),
            _ => Err(FleetError::ActorGone("supervisor")),
        }
    }

    /// Stops the supervisor and every sampler (each sends its last partial batch) and the
    /// sampling threads, writes the final snapshot from everything aggregated since the last
    /// one, stops the remaining actors, and only then returns, with where the final snapshot
    /// went. Stopping is bounded by `stop_timeout` as a whole (what has not stopped by then is
    /// left detached); the write is not: it is pyfleet's own work on data it bounds, and
    /// cutting it short would lose the whole recording.
    pub async fn shutdown(self) -> Result<PathBuf, FleetError> {
        let deadline = tokio::time::Instant::now() + self.stop_timeout;
        // Samplers first: each has its slot's final batch sent before it stops, so the
        // aggregator has them queued before the sink's request below.
        let confirmed = self
            .supervisor
            .call(SupervisorMsg::Shutdown, Some(self.stop_timeout))
            .await;
        if !matches!(confirmed, Ok(CallResult::Success(()))) {
            tracing::warn!("the supervisor did not confirm that every sampler stopped");
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let _ = self.supervisor.stop_and_wait(None, Some(left)).await;
        // Every slot is gone by now, unless a sampler gave up waiting for its removal: the
        // threads finish what is left (final batches first) before they end.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.sampling.shutdown(left).await;

        let written = match self.sink.call(SinkMsg::Final, None).await {
            Ok(CallResult::Success(result)) => result.map_err(FleetError::Snapshot),
            _ => Err(FleetError::ActorGone("snapshot sink")),
        };
        let _ = self.sink.stop_and_wait(None, Some(self.stop_timeout)).await;
        let _ = self
            .aggregator
            .stop_and_wait(None, Some(self.stop_timeout))
            .await;
        for handle in self.handles {
            let _ = tokio::time::timeout(self.stop_timeout, handle).await;
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeros_are_not() {
        assert_eq!(FleetConfig::default().validate(), Ok(()));
        let zero_scan = FleetConfig {
            scan_interval: Duration::ZERO,
            ..FleetConfig::default()
        };
        assert!(matches!(zero_scan.validate(), Err(FleetError::Config(_))));
        let no_errors_allowed = FleetConfig {
            max_consecutive_errors: 0,
            ..FleetConfig::default()
        };
        assert!(no_errors_allowed.validate().is_err());
        let no_sampling_thread = FleetConfig {
            sampling_threads: 0,
            ..FleetConfig::default()
        };
        assert!(no_sampling_thread.validate().is_err());
        assert_eq!(FleetConfig::default().sampling_threads, 1);
    }

    #[test]
    fn idle_timeout_outlasts_every_keepalive() {
        let defaults = FleetConfig::default();
        assert_eq!(defaults.metrics_idle_timeout(), Duration::from_secs(10));
        let slow = FleetConfig {
            scan_interval: Duration::from_secs(5),
            ..FleetConfig::default()
        };
        assert_eq!(slow.metrics_idle_timeout(), Duration::from_secs(20));
        let slow_rate = FleetConfig {
            rate: RatePolicy::new(0.25, 5.0).unwrap_or_default(),
            ..FleetConfig::default()
        };
        assert_eq!(slow_rate.metrics_idle_timeout(), Duration::from_secs(16));
    }
}
