//! The snapshot sink actor: every `snapshot_interval`, and once more at shutdown, takes the
//! aggregator's window and hands it to the [`SnapshotWriter`].
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
use crate::metric_names as m;
use crate::panics::guard;
use crate::snapshot::SnapshotWriter;
use crate::timing::spawn_ticker;

pub(crate) struct SinkArgs<W> {
    pub writer: Arc<W>,
    pub aggregator: ActorRef<AggregatorMsg>,
    pub interval: Duration,
}

pub(crate) enum SinkMsg {
    Tick,
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
    ticker: Option<JoinHandle<()>>,
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
            ticker: None,
            finished: false,
            written: metrics::counter!(m::SNAPSHOTS_WRITTEN),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker = Some(spawn_ticker(myself, state.interval, || SinkMsg::Tick));
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
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
            SinkMsg::Tick => {
                if !state.finished {
                    if let Err(e) = state.snapshot().await {
                        tracing::warn!("snapshot not written: {e}");
                    }
                }
            }
            SinkMsg::Final(reply) => {
                if let Some(t) = state.ticker.take() {
                    t.abort();
                }
                state.finished = true;
                let _ = reply.send(state.snapshot().await);
            }
        }
        Ok(())
    }
}

impl<W: SnapshotWriter> SinkState<W> {
    async fn snapshot(&mut self) -> Result<PathBuf, String> {
        let snap = match self
            .aggregator
            .call(AggregatorMsg::TakeSnapshot, None)
            .await
        {
            Ok(CallResult::Success(snap)) => snap,
            Ok(_) => return Err("the aggregator did not answer".to_string()),
            Err(e) => return Err(format!("the aggregator is gone: {e}")),
        };
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
