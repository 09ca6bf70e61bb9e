//! pyfleet's actors: the supervisor, one sampler per process, the aggregator and the snapshot
//! sink, generic over the traits defined in [`source`] and [`snapshot`], which the root
//! package implements with its real unwinder and output formats.
//!
//! ```text
//!  Fleet::start ──► supervisor ──(spawn_linked, one per pid)──► sampler actor
//!                     │  scan (blocking thread), restarts          │ attach (blocking pool),
//!                     │                                            ▼ then hands over a slot
//!                     └──(rate)──────────────────────────────► sampling thread (one for the
//!                                                               │ fleet: one wakeup per tick,
//!                                                               │ every slot's StackSource)
//!                                                               ▼ batches
//!                   sink ──(every snapshot_interval: TakeSnapshot)──► aggregator
//!                     └──► SnapshotWriter (blocking thread)
//! ```
//!
//! This crate owns scheduling, supervision, batching, counting and metrics. It must not read
//! target processes, format output or touch the file system: those are behind the traits.
//! It depends on `pyfleet-policies` for every decision (restart, rate, mode), never on the
//! root package.
//!
//! # Metrics of exited processes
//!
//! The `metrics` facade cannot remove a series, so per-process series (labels `process` and
//! `pid`, taken only from [`ProcessInfo::name`] and [`ProcessInfo::pid`]) disappear through
//! the exporter's idle timeout. While a process is sampled, its sampler touches every one of
//! its series every `batch_interval` (a zero increment counts as an update for
//! metrics-util's recency tracking), and the supervisor touches
//! `pyfleet_actor_restarts_total{process,role,pid}` every scan while the pid is listed. Once the
//! sampler is gone nothing touches them and the exporter drops them at its next render past
//! the timeout. The supervisor also touches the fleet-wide series (`pyfleet_processes`,
//! `pyfleet_cpu_seconds_total`, `pyfleet_snapshots_written_total`,
//! `pyfleet_process_exits_total`) every scan, so they never go idle. The root package
//! must configure metrics-exporter-prometheus with
//! `idle_timeout(MetricKindMask::ALL, Some(config.metrics_idle_timeout()))`
//! ([`FleetConfig::metrics_idle_timeout`]), and render its metrics now and then even when
//! nobody scrapes them (the exporter drops idle series only while it renders). A sampler restarted after a backoff longer than
//! the timeout starts its counters from zero again (a counter reset to Prometheus).
//! Metric names are in [`metric_names`].

#![forbid(unsafe_code)]

mod aggregator;
mod config;
mod error;
mod fleet;
pub mod metric_names;
mod panics;
mod sampling;
mod self_cpu;
mod sink;
mod slot;
pub mod snapshot;
pub mod source;
mod status;
mod supervisor;
mod timing;

pub use config::FleetConfig;
pub use error::FleetError;
pub use fleet::Fleet;
pub use self_cpu::cpu_time as own_cpu_time;
pub use snapshot::{Frames, ProcessProfile, Snapshot, SnapshotWriter};
pub use source::{
    Discovery, FrameInfo, ProcessInfo, SampleError, SampledThread, SourceFactory, SourceStats,
    StackSource, ThreadStatus,
};
pub use status::{FleetStatus, ProcessState, ProcessStatus};
