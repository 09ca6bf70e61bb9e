//! pyfleet's actors: the supervisor, one sampler per process on a shared sampling thread, the
//! aggregator and the snapshot sink, generic over the traits defined in [`source`] and
//! [`snapshot`], which the root package implements with its real unwinder and output formats.
//!
//! ```text
//!  Fleet::start ──► supervisor ──(attach, blocking pool)──► a slot per sampled pid
//!                     │  scan (blocking thread),                 │ handed over
//!                     │  restarts, exits                         ▼
//!                     ├──(rate, add/remove slot)─────────► sampling thread (one for the
//!                     │                                     │ fleet: one wakeup per tick,
//!                     ◄──(SlotEnded: how a slot ended)──────┤ every slot's StackSource)
//!                                                           ▼ batches
//!                   sink ──(every snapshot / push interval: TakeWindows)──► aggregator
//!                     ├──► SnapshotWriter (blocking thread)        ▲ taps (Profiler)
//!                     └──► WindowPusher (queues, never blocks)
//! ```
//!
//! A *sampler* is one life of one process's sampling: the supervisor attaches its source,
//! hands it to a sampling thread as a slot, and learns how it ended as a typed value
//! (process gone, failed and why, or removed because the supervisor stopped it, and the
//! supervisor knows why it did). No outcome travels as a string.
//!
//! # Modules, and which may use which
//!
//! Dependencies inside the crate point one way: a module uses only modules listed before it
//! (a unit test below checks every `use crate::…`).
//!
//! | module | owns | uses |
//! |---|---|---|
//! | [`source`] | the traits the root implements (discovery, attach, sample) and their data | — |
//! | [`snapshot`] | [`Snapshot`], [`SnapshotWriter`] and [`WindowPusher`] | source |
//! | `metric_names` | every metric's name and help | — |
//! | `panics` | turning a panic into an error | — |
//! | `self_cpu` | pyfleet's own CPU time | — |
//! | `timing` | tick deadlines, jitter, periodic messages | — |
//! | `error` | [`FleetError`] | — |
//! | `status` | [`FleetStatus`], [`ProcessStatus`], [`ProcessState`] | source |
//! | `config` | [`FleetConfig`], [`PushSchedule`], defaults and checks | error, snapshot, timing |
//! | `aggregator` | the windows' counts (snapshot, push, taps); batches in, snapshots out | snapshot, source |
//! | `slot` | one process on a sampling thread, and how it ends (`SlotEnd`) | aggregator, metric_names, panics, snapshot, source |
//! | `sampling` | the sampling threads and their loop | slot, aggregator, panics, source, timing |
//! | `sink` | writing a snapshot every interval, handing push windows over | aggregator, config, metric_names, panics, snapshot, timing |
//! | `supervisor` | which pids are sampled, sampler lives, restarts, exits, the rate | config, status, slot, sampling, metric_names, panics, self_cpu, source, timing |
//! | `fleet` | [`Fleet`]: start and shutdown order, the status query, [`Profiler`] | config, error, status, supervisor, sampling, sink, aggregator, snapshot, source |
//!
//! Data two modules share lives in a module below both (`slot`'s ends for `sampling` and
//! `supervisor`; `config` and `status` for `supervisor` and `fleet`), never in one of them.
//!
//! This crate owns scheduling, supervision, batching, counting and metrics. It must not read
//! target processes, format output or touch the file system: those are behind the traits.
//! It depends on `pyfleet-policies` for every decision (restart, rate, mode), never on the
//! root package.
//!
//! # Metrics of exited processes
//!
//! The `metrics` facade cannot remove a series, so per-process series (labels `process`,
//! `role`, `pid`, and the `service` and `namespace` of [`ProcessInfo::labels`], taken only
//! from the [`ProcessInfo`]) disappear through
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
//! nobody scrapes them (the exporter drops idle series only while it renders). A sampler
//! restarted after a backoff longer than the timeout starts its counters from zero again (a
//! counter reset to Prometheus).
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

pub use aggregator::{MAX_TAPS, MAX_TAP_AGE};
pub use config::{FleetConfig, PushSchedule};
pub use error::FleetError;
pub use fleet::{Fleet, Profiler, PullError, PullFilter};
pub use self_cpu::cpu_time as own_cpu_time;
pub use slot::sample_kind_seconds;
pub use snapshot::{rate_hz, Frames, ProcessProfile, Snapshot, SnapshotWriter, WindowPusher};
pub use source::{
    AttachFailure, CapturedCounts, Discovery, FrameInfo, Labels, ProcessInfo, SampleError,
    SampleKind, SampledThread, SourceFactory, SourceStats, StackSource, ThreadStatus, LABEL_KEYS,
};
pub use status::{FleetStatus, ProcessState, ProcessStatus};

#[cfg(test)]
mod tests {
    /// Every module of the crate, in the order of the crate documentation, with its source.
    const MODULES: &[(&str, &str)] = &[
        ("source", include_str!("source.rs")),
        ("snapshot", include_str!("snapshot.rs")),
        ("metric_names", include_str!("metric_names.rs")),
        ("panics", include_str!("panics.rs")),
        ("self_cpu", include_str!("self_cpu.rs")),
        ("timing", include_str!("timing.rs")),
        ("error", include_str!("error.rs")),
        ("status", include_str!("status.rs")),
        ("config", include_str!("config.rs")),
        ("aggregator", include_str!("aggregator.rs")),
        ("slot", include_str!("slot.rs")),
        ("sampling", include_str!("sampling.rs")),
        ("sink", include_str!("sink.rs")),
        ("supervisor", include_str!("supervisor.rs")),
        ("fleet", include_str!("fleet.rs")),
    ];

    #[test]
    fn modules_use_only_the_modules_before_them() {
        let lib = include_str!("lib.rs");
        let declared = lib
            .lines()
            .filter_map(|l| l.trim_start_matches("pub ").strip_prefix("mod "))
            .filter_map(|l| l.strip_suffix(';'))
            .count();
        assert_eq!(declared, MODULES.len(), "a module is missing from MODULES");
        for (i, (module, source)) in MODULES.iter().enumerate() {
            let code = source.lines().filter(|l| !l.trim_start().starts_with("//"));
            for line in code {
                for (_, rest) in line
                    .match_indices("crate::")
                    .map(|(at, _)| line.split_at(at))
                {
                    let used: String = rest["crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    let before = MODULES[..i].iter().any(|(m, _)| *m == used);
                    assert!(
                        before,
                        "{module} uses crate::{used}, which is not a module listed before it: \
                         {line}"
                    );
                }
            }
        }
    }
}
