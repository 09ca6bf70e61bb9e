//! The sampler actor: one per profiled process. It attaches the process's source, hands it
//! to the sampling pool as a [`Slot`](crate::slot::Slot), and mirrors the slot's life to the
//! supervisor through ractor supervision.
//!
//! A sampler's life:
//! - start: attaches its source ([`SourceFactory::attach`], which can take milliseconds) on
//!   tokio's blocking pool, never on the sampling thread nor on the async workers; the result
//!   comes back as [`SamplerMsg::Attached`]. A failed or panicking attach fails the actor.
//!   Otherwise it builds the slot and hands it to the sampling pool;
//! - the slot ends by itself ([`SamplerMsg::Ended`]): process gone stops the actor with
//!   reason [`REASON_PROCESS_GONE`], which the supervisor sees as an exit; a failure fails
//!   the actor, and the supervisor applies the restart policy;
//! - stop (`post_stop`: the supervisor stops it, or the fleet shuts down): asks the sampling
//!   thread to remove its slot and waits, bounded by `stop_timeout`, for "done", which fires
//!   after the final batch went to the aggregator. If the actor dies without `post_stop`
//!   (killed), its state drops the "done" receiver, and the thread removes the slot the same
//!   way.
//!
//! It must not aggregate across processes, write files, or decide restarts.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::panics::guard;
use crate::sampling::SamplingPool;
use crate::slot::{next_life, Slot, SlotEnd, SlotSettings};
use crate::source::{ProcessInfo, SourceFactory, StackSource};

/// Exit reason of a sampler whose process is gone.
pub(crate) const REASON_PROCESS_GONE: &str = "process_gone";

pub(crate) struct SamplerArgs<F> {
    pub factory: Arc<F>,
    pub info: ProcessInfo,
    pub sampling: Arc<SamplingPool>,
    pub settings: SlotSettings,
    pub stop_timeout: Duration,
}

pub(crate) enum SamplerMsg {
    /// From the attach task: the source, or why there is none.
    Attached(Result<Box<dyn StackSource>, String>),
    /// From the sampling thread: the slot has ended (its final batch is sent).
    Ended(SlotEnd),
}

/// The sampler actor; see the module documentation.
pub(crate) struct SamplerActor<F>(PhantomData<fn() -> F>);

impl<F> SamplerActor<F> {
    pub(crate) fn new() -> Self {
        SamplerActor(PhantomData)
    }
}

pub(crate) struct SamplerState {
    life: u64,
    info: ProcessInfo,
    settings: SlotSettings,
    stop_timeout: Duration,
    sampling: Arc<SamplingPool>,
    /// Once the slot is on a sampling thread: that thread, and the slot's "done" signal.
    placed: Option<(usize, oneshot::Receiver<()>)>,
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
        let SamplerArgs {
            factory,
            info,
            sampling,
            settings,
            stop_timeout,
        } = args;
        // Attach off the async workers and off the sampling thread; the answer is a message,
        // handled once the actor has started.
        let me = myself.clone();
        let target = info.clone();
        let needs_cpu_status = settings.mode.needs_cpu_status();
        tokio::task::spawn_blocking(move || {
            let attached = match guard(|| factory.attach(&target, needs_cpu_status)) {
                Ok(Ok(source)) => Ok(Box::new(source) as Box<dyn StackSource>),
                Ok(Err(e)) => Err(format!("attach failed: {e}")),
                Err(panic) => Err(format!("attach panicked: {panic}")),
            };
            // If the actor stopped meanwhile, the message and its source are dropped here.
            let _ = me.send_message(SamplerMsg::Attached(attached));
        });
        Ok(SamplerState {
            life: next_life(),
            info,
            settings,
            stop_timeout,
            sampling,
            placed: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SamplerMsg::Attached(Ok(source)) => {
                let (slot, done_rx) = Slot::new(
                    state.life,
                    &state.info,
                    &state.settings,
                    source,
                    Box::new(move |end| {
                        // The actor may already be stopping; then nobody needs to know.
                        let _ = myself.send_message(SamplerMsg::Ended(end));
                    }),
                );
                let thread = state.sampling.add(slot)?;
                state.placed = Some((thread, done_rx));
                tracing::debug!(pid = state.info.pid, process = %state.info.name, "sampling");
            }
            SamplerMsg::Attached(Err(why)) => {
                tracing::warn!(
                    pid = state.info.pid,
                    process = %state.info.name,
                    "sampler failed: {why}"
                );
                return Err(why.into());
            }
            // Removed on request: the actor is stopping already.
            SamplerMsg::Ended(SlotEnd::Removed) => {}
            SamplerMsg::Ended(SlotEnd::ProcessGone(why)) => {
                state.placed = None;
                tracing::debug!(pid = state.info.pid, "process gone: {why}");
                myself.stop(Some(REASON_PROCESS_GONE.to_string()));
            }
            SamplerMsg::Ended(SlotEnd::Failed(why)) => {
                state.placed = None;
                return Err(why.into());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Not placed: the attach is still running (its result will find no actor), it failed,
        // or the slot has already ended by itself.
        let Some((thread, done)) = state.placed.take() else {
            return Ok(());
        };
        state.sampling.remove(thread, state.life);
        // An error is "done" dropped unsent: the slot is gone all the same.
        if tokio::time::timeout(state.stop_timeout, done)
            .await
            .is_err()
        {
            tracing::warn!(
                pid = state.info.pid,
                "the sampling thread did not remove this process within {:?}; its last batch \
                 may be lost",
                state.stop_timeout
            );
        }
        Ok(())
    }
}
