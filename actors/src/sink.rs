//! The snapshot sink actor: every `snapshot_interval`, and once more at shutdown, takes the
//! aggregator's window and hands it to the [`SnapshotWriter`]; with pushing on, every push
//! interval (and at shutdown) it takes the push window and hands it to the pusher, which
//! queues it (both windows in one message when both are due).
//!
//! When the run's end is known (`FleetConfig::ends_after`), a snapshot or push falling due
//! less than a tenth of its interval before the end is skipped: the final one takes its
//! window, a little longer than the interval, instead of leaving a sliver at the end.
//!
//! Owns the snapshot schedule and `pyfleet_snapshots_written_total`. An empty window is
//! written too: "nothing was sampled" is information (no process matched, or every process
//! was idle in `cpu` mode). Writing and retention run on a blocking thread, one at a time; a
//! failed or panicking write is logged and the schedule goes on.
//!
//! It must not format output or touch files itself: the writer does, in the root package.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;

use crate::aggregator::AggregatorMsg;
use crate::config::PushSchedule;
use crate::metric_names as m;
use crate::panics::guard;
use crate::snapshot::{Snapshot, SnapshotWriter};
use crate::timing::spawn_ticker;

pub(crate) struct SinkArgs<W> {
    pub writer: Arc<W>,
    pub aggregator: ActorRef<AggregatorMsg>,
    pub interval: Duration,
    pub push: Option<PushSchedule>,
    /// When the run ends, if known.
    pub ends_at: Option<tokio::time::Instant>,
}

pub(crate) enum SinkMsg {
    /// A snapshot, a push window, or both are due.
    Tick { snapshot: bool, push: bool },
    /// The final snapshot: stops the schedule, writes, replies with where it went.
    Final(RpcReplyPort<Result<PathBuf, String>>),
}

/// The sink actor; see the module documentation.
pub(crate) struct SinkActor<W>(std::marker::PhantomData<fn() -> W>);

impl<W> SinkActor<W> {
    pub(crate) fn new() -> Self {
        SinkActor(std::marker::PhantomData)
    }
}

pub(crate) struct SinkState<W> {
    writer: Arc<W>,
    aggregator: ActorRef<AggregatorMsg>,
    interval: Duration,
    push: Option<PushSchedule>,
    ends_at: Option<tokio::time::Instant>,
    ticker: Option<JoinHandle<()>>,
    push_ticker: Option<JoinHandle<()>>,
    finished: bool,
    written: Counter,
}

impl<W: SnapshotWriter> Actor for SinkActor<W> {
    type Msg = SinkMsg;
    type State = SinkState<W>;
    type Arguments = SinkArgs<W>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SinkState {
            writer: args.writer,
            aggregator: args.aggregator,
            interval: args.interval,
            push: args.push,
            ends_at: args.ends_at,
            ticker: None,
            push_ticker: None,
            finished: false,
            written: metrics::counter!(m::SNAPSHOTS_WRITTEN),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let push_interval = state.push.as_ref().map(|p| p.interval);
        // Equal schedules: one ticker cuts both windows at once.
        let together = push_interval == Some(state.interval);
        state.ticker = Some(spawn_ticker(myself.clone(), state.interval, move || {
            SinkMsg::Tick {
                snapshot: true,
                push: together,
            }
        }));
        if let Some(every) = push_interval.filter(|_| !together) {
            state.push_ticker = Some(spawn_ticker(myself, every, || SinkMsg::Tick {
                snapshot: false,
                push: true,
            }));
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in [state.ticker.take(), state.push_ticker.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SinkMsg::Tick { snapshot, push } => {
                let snapshot = snapshot && !state.near_the_end(state.interval);
                let push = push
                    && !state
                        .push
                        .as_ref()
                        .is_some_and(|p| state.near_the_end(p.interval));
                if !state.finished && (snapshot || push) {
                    if let Err(e) = state.take(snapshot, push).await {
                        tracing::warn!("snapshot not written: {e}");
                    }
                }
            }
            SinkMsg::Final(reply) => {
                for t in [state.ticker.take(), state.push_ticker.take()]
                    .into_iter()
                    .flatten()
                {
                    t.abort();
                }
                state.finished = true;
                let _ = reply.send(state.take(true, true).await);
            }
        }
        Ok(())
    }
}

impl<W> SinkState<W> {
    /// Whether the run ends less than a tenth of `interval` from now (see the module doc).
    fn near_the_end(&self, interval: Duration) -> bool {
        self.ends_at.is_some_and(|end| {
            end.saturating_duration_since(tokio::time::Instant::now()) < interval / 10
        })
    }
}

impl<W: SnapshotWriter> SinkState<W> {
    /// Takes the windows asked for; hands the push window to the pusher and writes the
    /// snapshot (the path it went to; an empty path when no snapshot was asked for).
    async fn take(&mut self, snapshot: bool, push: bool) -> Result<PathBuf, String> {
        let push = push && self.push.is_some();
        let (snap, pushed) = match self
            .aggregator
            .call(
                |reply| AggregatorMsg::TakeWindows {
                    snapshot,
                    push,
                    reply,
                },
                None,
            )
            .await
        {
            Ok(CallResult::Success(windows)) => windows,
            Ok(_) => return Err("the aggregator did not answer".to_string()),
            Err(e) => return Err(format!("the aggregator is gone: {e}")),
        };
        if let (Some(window), Some(schedule)) = (pushed, self.push.as_ref()) {
            if let Err(panic) = guard(|| schedule.pusher.push(window)) {
                tracing::warn!("the pusher panicked: {panic}");
            }
        }
        match snap {
            Some(snap) => self.write(snap).await,
            None => Ok(PathBuf::new()),
        }
    }

    async fn write(&mut self, snap: Snapshot) -> Result<PathBuf, String> {
        let writer = self.writer.clone();
        let written = tokio::task::spawn_blocking(move || {
            let path = guard(|| writer.write(&snap))
                .unwrap_or_else(|panic| Err(format!("snapshot writer panicked: {panic}")))?;
            if let Err(panic) = guard(|| writer.apply_retention()) {
                tracing::warn!("snapshot retention panicked: {panic}");
            }
            Ok(path)
        })
        .await
        .unwrap_or_else(|e| Err(format!("snapshot writing did not complete: {e}")))?;
        self.written.increment(1);
        tracing::debug!("snapshot written to {}", written.display());
        Ok(written)
    }
}
