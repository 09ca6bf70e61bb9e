//! The names of the metrics the actors record (a public interface: dashboards use them), and
//! their descriptions.
//!
//! Owns the names only. It must not install a recorder or choose an exporter: the root package
//! installs the Prometheus exporter, then may call [`describe`] so the exporter has help texts.
//!
//! Labels: per-target series carry `process` (the [`ProcessInfo`](crate::ProcessInfo) name)
//! and `pid`; nothing else goes into per-target labels. How those series disappear after the
//! process exits is told in the crate documentation.

/// Successful `sample()` calls, `{process,role,pid}`.
pub const SAMPLES: &str = "pyfleet_samples_total";
/// Failed `sample()` calls, `{process,role,pid,kind}`.
pub const SAMPLE_ERRORS: &str = "pyfleet_sample_errors_total";
/// Share of failed `sample()` calls (0 to 1) since the process's sampler started (gauge),
/// `{process,role,pid}`; for a recent window, divide the rates of the two counters above.
pub const SAMPLE_FAILURE_RATIO: &str = "pyfleet_sample_failure_ratio";
/// Time of one `sample()` call, successful or not, `{process,role,pid}`.
pub const SAMPLE_DURATION: &str = "pyfleet_sample_duration_seconds";
/// Sampling ticks skipped because the previous tick (the samples of every process on the same
/// sampling thread) overran, `{process,role,pid}`; every process on that thread counts them.
pub const MISSED_TICKS: &str = "pyfleet_missed_ticks_total";
/// Ticks a process was not sampled because its samples were slow (over 5 ms: a process
/// expensive to read slows itself, not the fleet), `{process,role,pid}`.
pub const SLOW_SKIPS: &str = "pyfleet_slow_sample_skips_total";
/// Successful samples by what they cost, `{process,role,pid,kind}`: `kept` (a check of the
/// kernel's per-thread counts found that nothing of the process had run; the last sample was
/// kept, no memory read), `checked` (the check found a thread had run; memory was read),
/// `read` (memory read without a check).
pub const SAMPLE_KINDS: &str = "pyfleet_sample_kinds_total";
/// Time inside successful samples of every process, by the kinds of [`SAMPLE_KINDS`], in
/// fractional seconds, `{kind}` (fleet-wide: what each kind costs). Not in the metrics
/// facade (its counters are integers): the /metrics handler renders it at each scrape from
/// [`sample_kind_seconds`](crate::sample_kind_seconds), with [`SAMPLE_KIND_SECONDS_HELP`].
pub const SAMPLE_KIND_SECONDS: &str = "pyfleet_sample_kind_seconds_total";
/// The `# HELP` text of [`SAMPLE_KIND_SECONDS`].
pub const SAMPLE_KIND_SECONDS_HELP: &str =
    "Time inside successful samples of every process, by kind (see pyfleet_sample_kinds_total)";
/// From [`SourceStats`](crate::SourceStats), `{process,role,pid}`.
pub const FRAME_CACHE_HITS: &str = "pyfleet_frame_cache_hits_total";
pub const FRAME_CACHE_PARTIAL_HITS: &str = "pyfleet_frame_cache_partial_hits_total";
pub const FRAME_CACHE_MISSES: &str = "pyfleet_frame_cache_misses_total";
pub const CODE_CACHE_HITS: &str = "pyfleet_code_cache_hits_total";
pub const CODE_CACHE_MISSES: &str = "pyfleet_code_cache_misses_total";
pub const REMOTE_READS: &str = "pyfleet_remote_reads_total";
pub const REMOTE_READ_BYTES: &str = "pyfleet_remote_read_bytes_total";
/// Wall mode: samples of threads and asyncio tasks waiting for work, left out of the
/// profile (`--idle` keeps them).
pub const IDLE_LEFT_OUT: &str = "pyfleet_idle_samples_left_out_total";
/// `--async`: a process's asyncio tasks at the last count (gauge), `{process,role,pid,state}`,
/// `state` `running` (run by a thread) or `pending`.
pub const ASYNCIO_TASKS: &str = "pyfleet_asyncio_tasks";
/// Threads' samples by what the thread was doing, `{process,role,pid,state}`, `state` one of
/// [`ThreadStatus::STATES`](crate::ThreadStatus::STATES): every thread of every sample taken,
/// whether or not the mode counts it (a stretch off the CPU counted at once counts as its
/// samples).
pub const THREAD_SAMPLES: &str = "pyfleet_thread_samples_total";
/// Live samplers (gauge, no labels).
pub const PROCESSES: &str = "pyfleet_processes";
/// Processes that exited while profiled (no labels: an exit counter per pid would vanish
/// with the pid and count nothing, and one per name would grow with the names targets
/// choose).
pub const PROCESS_EXITS: &str = "pyfleet_process_exits_total";
/// Sampler restarts after a failure, `{process,role,pid}`.
pub const ACTOR_RESTARTS: &str = "pyfleet_actor_restarts_total";
/// Snapshots written (no labels).
pub const SNAPSHOTS_WRITTEN: &str = "pyfleet_snapshots_written_total";
/// Push requests to a profile store, `{result="sent"|"failed"}` (a failed attempt is retried).
pub const PUSH_REQUESTS: &str = "pyfleet_push_requests_total";
/// Push windows dropped: the queue was full (the store was down for long) or the store
/// refused them for good (a 4xx answer).
pub const PUSH_DROPPED: &str = "pyfleet_push_windows_dropped_total";
/// Body bytes of push requests the store accepted.
pub const PUSH_BYTES: &str = "pyfleet_push_bytes_total";
/// Push windows waiting to be sent.
pub const PUSH_QUEUED: &str = "pyfleet_push_queued_windows";
/// pyfleet's own CPU time, user + system, in fractional seconds. Not in the metrics facade (its
/// counters are integers): the /metrics handler renders it at each scrape from
/// [`own_cpu_time`](crate::own_cpu_time), with [`CPU_SECONDS_HELP`].
pub const CPU_SECONDS: &str = "pyfleet_cpu_seconds_total";
/// The `# HELP` text of [`CPU_SECONDS`].
pub const CPU_SECONDS_HELP: &str = "pyfleet's own CPU time (user + system of every thread)";

/// Registers a description (and unit) for every metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(SAMPLES, Unit::Count, "Successful samples of a process");
    describe_counter!(SAMPLE_ERRORS, Unit::Count, "Failed samples, by kind");
    describe_counter!(
        SAMPLE_KINDS,
        Unit::Count,
        "Successful samples by cost: kept (checked, not read), checked (checked, then read), read"
    );
    describe_counter!(
        THREAD_SAMPLES,
        Unit::Count,
        "Threads' samples by state: holds_gil, waits_gil, running_no_gil, idle"
    );
    describe_gauge!(
        ASYNCIO_TASKS,
        Unit::Count,
        "asyncio tasks of a process at its last count (--async), run by a thread or waiting"
    );
    describe_gauge!(
        SAMPLE_FAILURE_RATIO,
        Unit::Count,
        "Share of failed samples since the sampler started"
    );
    describe_histogram!(SAMPLE_DURATION, Unit::Seconds, "Time of one sample");
    describe_counter!(
        MISSED_TICKS,
        Unit::Count,
        "Sampling ticks skipped because a tick overran"
    );
    describe_counter!(
        SLOW_SKIPS,
        Unit::Count,
        "Ticks a process was not sampled because its samples were slow"
    );
    describe_counter!(FRAME_CACHE_HITS, Unit::Count, "Frame cache full hits");
    describe_counter!(
        FRAME_CACHE_PARTIAL_HITS,
        Unit::Count,
        "Frame cache partial hits"
    );
    describe_counter!(FRAME_CACHE_MISSES, Unit::Count, "Frame cache misses");
    describe_counter!(CODE_CACHE_HITS, Unit::Count, "Code object cache hits");
    describe_counter!(CODE_CACHE_MISSES, Unit::Count, "Code object cache misses");
    describe_counter!(REMOTE_READS, Unit::Count, "Remote memory reads (syscalls)");
    describe_counter!(REMOTE_READ_BYTES, Unit::Bytes, "Bytes read from targets");
    describe_counter!(
        IDLE_LEFT_OUT,
        Unit::Count,
        "Samples of threads and asyncio tasks waiting for work, left out of the profile (wall mode without --idle)"
    );
    describe_gauge!(PROCESSES, Unit::Count, "Processes being sampled");
    describe_counter!(PROCESS_EXITS, Unit::Count, "Profiled processes that exited");
    describe_counter!(
        ACTOR_RESTARTS,
        Unit::Count,
        "Sampler restarts after a failure"
    );
    describe_counter!(SNAPSHOTS_WRITTEN, Unit::Count, "Snapshots written");
    describe_counter!(
        PUSH_REQUESTS,
        Unit::Count,
        "Requests to the profile store, by result (sent, failed)"
    );
    describe_counter!(
        PUSH_DROPPED,
        Unit::Count,
        "Push windows dropped (queue full, or refused by the store)"
    );
    describe_counter!(PUSH_BYTES, Unit::Bytes, "Bytes the profile store accepted");
    describe_gauge!(PUSH_QUEUED, Unit::Count, "Push windows waiting to be sent");
}
