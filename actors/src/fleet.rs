//! The entry point: [`Fleet::start`] spawns the aggregator, the fleet's sampling thread(s),
//! the snapshot sink and the supervisor (which starts a sampler per process);
//! [`Fleet::shutdown`] stops them in the order that loses no sample and returns once the
//! final snapshot is written.
//!
//! Each process's sampler is a slot on a shared sampling thread, by default exactly one:
//! every process is sampled at the same tick by the same thread, so the fleet pays one thread
//! wakeup per tick instead of one per process per tick. See
//! [`sampling`](crate::sampling) for the thread and why one is the default,
//! [`slot`](crate::slot) for what a slot does and how it ends, and
//! [`supervisor`](crate::supervisor) for how samplers come and go.
//!
//! Shutdown order: the supervisor has every slot removed from its sampling thread and waits
//! until each slot's final batch is sent; then the sampling threads stop (finishing any slot
//! still there) and are joined, all of it bounded by `stop_timeout`; then the sink writes the
//! final snapshot, which therefore holds every sample taken (not bounded: cut short, it would
//! lose everything); then the sink and the aggregator stop.
//!
//! Owns [`Fleet`]: the start and shutdown order, and the status query. Its configuration is
//! [`FleetConfig`](crate::FleetConfig) ([`config`](crate::config)). It must not parse command
//! lines, install signal handlers or metric exporters: the root package's `main` does, then
//! calls in here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};

use crate::aggregator::{AggregatorActor, AggregatorMsg, TapFilter, TapRefused};
use crate::config::FleetConfig;
use crate::error::FleetError;
use crate::sampling::SamplingPool;
use crate::sink::{SinkActor, SinkArgs, SinkMsg};
use crate::snapshot::SnapshotWriter;
use crate::source::{Discovery, SourceFactory};
use crate::status::FleetStatus;
use crate::supervisor::{SupervisorActor, SupervisorArgs, SupervisorMsg};

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
        let (aggregator, aggregator_handle) = Actor::spawn(
            None,
            AggregatorActor,
            (config.max_stacks_per_process, config.push.is_some()),
        )
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
            push: config.push.clone(),
            ends_at: config.ends_after.map(|d| tokio::time::Instant::now() + d),
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

    /// A handle that takes profiles of the running fleet on request (see [`Profiler`]).
    pub fn profiler(&self) -> Profiler {
        Profiler {
            aggregator: self.aggregator.clone(),
            supervisor: self.supervisor.clone(),
        }
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

/// Takes profiles of the running fleet on request: what its samplers count in the next
/// seconds, without starting any sampler of its own (a "tap" on the aggregator, see its
/// module documentation). Several requests at once each get their own window. Also says
/// which processes the fleet samples ([`Profiler::status`]).
#[derive(Clone)]
pub struct Profiler {
    aggregator: ActorRef<AggregatorMsg>,
    supervisor: ActorRef<SupervisorMsg>,
}

/// Why a [`Profiler`] gave no profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    #[error("too many profiles are being taken at once (at most {0})")]
    Busy(usize),
    #[error("the fleet is stopping")]
    Stopped,
    #[error("pid {0} is not profiled by this daemon")]
    NotProfiled(i32),
}

/// Which processes a pull counts: one pid, one service, or every one.
pub type PullFilter = TapFilter;

/// Closes its tap if the request is dropped before it took its profile.
struct OpenTap {
    aggregator: ActorRef<AggregatorMsg>,
    id: Option<u64>,
}

impl Drop for OpenTap {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.aggregator.cast(AggregatorMsg::DropTap(id));
        }
    }
}

impl Profiler {
    /// The supervisor's view of the fleet now.
    pub async fn status(&self) -> Result<FleetStatus, PullError> {
        match self.supervisor.call(SupervisorMsg::Status, None).await {
            Ok(CallResult::Success(status)) => Ok(status),
            _ => Err(PullError::Stopped),
        }
    }

    /// What the fleet's samplers count during `duration` from now, of the processes `filter`
    /// admits (to the batch interval: samplers hand over their counts once a second).
    pub async fn profile(
        &self,
        duration: Duration,
        filter: PullFilter,
    ) -> Result<crate::snapshot::Snapshot, PullError> {
        let opened = self
            .aggregator
            .call(|reply| AggregatorMsg::OpenTap(filter, reply), None)
            .await;
        let id = match opened {
            Ok(CallResult::Success(Ok(id))) => id,
            Ok(CallResult::Success(Err(TapRefused::Busy))) => {
                return Err(PullError::Busy(crate::aggregator::MAX_TAPS))
            }
            Ok(CallResult::Success(Err(TapRefused::NotProfiled(pid)))) => {
                return Err(PullError::NotProfiled(pid))
            }
            _ => return Err(PullError::Stopped),
        };
        let mut tap = OpenTap {
            aggregator: self.aggregator.clone(),
            id: Some(id),
        };
        tokio::time::sleep(duration).await;
        tap.id = None;
        match self
            .aggregator
            .call(|reply| AggregatorMsg::CloseTap(id, reply), None)
            .await
        {
            Ok(CallResult::Success(Some(snapshot))) => Ok(snapshot),
            _ => Err(PullError::Stopped),
        }
    }
}
