//! The traits the root package implements to feed the actors, and the plain data they carry.
//!
//! Owns the contract between the generic actors of this crate and the real unwinder:
//! [`Discovery`] lists the processes to profile, [`SourceFactory`] attaches one
//! [`StackSource`] per process, and a source samples every thread of its process into
//! interned stack ids that it resolves to frames on demand.
//!
//! This module must not do any work itself: no I/O, no threads, no metrics. Whoever implements
//! the traits decides how; the actors decide when.

use std::sync::Arc;

/// One process that [`Discovery::scan`] found and that should be profiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: i32,
    /// The parent's pid (0 if unknown).
    pub ppid: i32,
    /// Short name, already sanitised (it becomes the `process` metric label and part of file
    /// names).
    pub name: String,
    /// Master, worker or single (the `role` metric label), as of the scan that listed it.
    pub role: pyfleet_policies::Role,
    /// Full command line, for logs.
    pub cmdline: String,
    /// Interpreter version as detected, for logs (e.g. `3.13.1`).
    pub python_version: String,
    /// When the process started (clock ticks since boot, /proc/PID/stat), 0 if unknown: a
    /// process is its pid and its start time (a pid is reused by another process).
    pub start_time: u64,
    /// Who it is beyond its name (service, container, pod), for profile stores.
    pub labels: Labels,
}

/// The keys a process's [`Labels`] may have.
pub const LABEL_KEYS: [&str; 5] = ["container_id", "namespace", "pod", "pod_uid", "service"];

/// Labels of a process, by fixed key (one of [`LABEL_KEYS`]), kept in key order; values
/// already sanitised by whoever found them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Vec<(&'static str, String)>);

impl Labels {
    /// Sets `key` (replacing its value, if any).
    pub fn set(&mut self, key: &'static str, value: String) {
        match self.0.binary_search_by(|(k, _)| (*k).cmp(key)) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every label, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.0.iter().map(|(k, v)| (*k, v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Finds the processes to profile. Called by the supervisor every scan interval, on a blocking
/// thread (never on the async workers), so it may read procfs at leisure.
pub trait Discovery: Send + 'static {
    /// Every matching process now, with the match policy already applied.
    fn scan(&mut self) -> Vec<ProcessInfo>;
}

/// One frame of a resolved stack. The names are shared (a source hands out the same
/// `Arc` for every frame of one function), so a stack of deep frames costs a few words a
/// frame wherever it is copied, not its strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameInfo {
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// `None` when the instruction has no line (CPython's location table allows that).
    pub line: Option<i32>,
}

impl FrameInfo {
    pub fn new(
        function: impl Into<Arc<str>>,
        file: impl Into<Arc<str>>,
        line: Option<i32>,
    ) -> Self {
        FrameInfo {
            function: function.into(),
            file: file.into(),
            line,
        }
    }
}

/// What a thread was doing when sampled; the profiling mode decides from it whether the sample
/// counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadStatus {
    /// The kernel reported the thread running (only read when the mode needs it; otherwise
    /// `false`).
    pub on_cpu: bool,
    /// The thread held the GIL.
    pub holds_gil: bool,
    /// The thread waited to take the GIL another thread held (`false` when not known: see
    /// the source).
    pub waits_gil: bool,
}

impl ThreadStatus {
    /// What a thread can be doing, as `pyfleet_thread_samples_total` names it (its `state`
    /// label), indexed by [`state_index`](Self::state_index): `holds_gil`, `waits_gil`,
    /// `running_no_gil` (seen on a CPU without the GIL: native code that released it) or
    /// `idle` (the rest: off its CPU, or not asked whether it was on one).
    pub const STATES: [&'static str; 4] = ["holds_gil", "waits_gil", "running_no_gil", "idle"];

    /// This status's place in [`STATES`](Self::STATES).
    pub fn state_index(&self) -> usize {
        match (self.holds_gil, self.waits_gil, self.on_cpu) {
            (true, _, _) => 0,
            (false, true, _) => 1,
            (false, false, true) => 2,
            (false, false, false) => 3,
        }
    }
}

/// One thread in one sample, or in several of one stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampledThread {
    /// The kernel's thread id, as pyfleet sees it (the host's, for a target in a container).
    pub tid: u64,
    pub status: ThreadStatus,
    /// Stack id interned by the source; [`StackSource::resolve`] turns it into frames.
    pub stack: u64,
    /// How many samples it stands for: 1, or more for a stretch of time a thread spent in one
    /// stack, counted at the rate at once (wall mode from the kernel capture).
    pub samples: u32,
}

/// A sample that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct SampleError {
    /// Short, fixed category; becomes the `kind` label of `pyfleet_sample_errors_total`.
    pub kind: &'static str,
    /// The target process no longer exists: the sampler ends cleanly instead of retrying.
    pub process_gone: bool,
    pub message: String,
}

/// What a successful sample cost: the `kind` of `pyfleet_sample_kinds_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SampleKind {
    /// Kept whole after a check of the kernel's figures found that nothing of the process had
    /// run (no memory read).
    Kept,
    /// Read after such a check found something had run.
    Checked,
    /// Read without a check.
    #[default]
    Read,
}

impl SampleKind {
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Cumulative counters of one source since it was attached. The sampler exports their
/// increases as metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SourceStats {
    pub samples: u64,
    pub errors: u64,
    pub frame_cache_hits: u64,
    pub frame_cache_partial_hits: u64,
    pub frame_cache_misses: u64,
    pub code_cache_hits: u64,
    pub code_cache_misses: u64,
    pub remote_reads: u64,
    pub remote_read_bytes: u64,
    /// `--async`: the process's asyncio tasks at the last count, run by a thread and waiting.
    pub asyncio_tasks: Option<[u64; 2]>,
    /// Wall mode: samples of threads and tasks waiting for work left out of the profile.
    pub idle_left_out: u64,
}

/// Samples one process. Owned by that process's sampler and used only from the fleet's
/// sampling thread (after being attached elsewhere), so it needs `Send` but not `Sync`. That
/// thread samples every process of the fleet (or its share of them) one after the other at
/// each tick: a call that blocks delays the other processes' samples too, so none should.
pub trait StackSource: Send + 'static {
    /// Samples every thread once into `out`, which the caller has cleared. In steady state
    /// neither this nor the caller allocates: `out` keeps its capacity from sample to sample.
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError>;

    /// Whether this tick calls [`sample`](Self::sample) (by default, every tick). A source
    /// that collects samples taken elsewhere answers no when it holds none and has no work of
    /// its own due: such a tick costs the fleet nothing more for it (no timing, no metrics).
    /// Called at every tick (or, once it was not due a few times, every
    /// `DORMANT_POLL`), so it must cost next to nothing. A source must be due at least every
    /// few seconds: its sample-duration series lives on the durations of its calls.
    fn due(&mut self) -> bool {
        true
    }

    /// Frames of an interned stack, innermost frame first. The sampler asks once per stack id
    /// per source lifetime (and again only after it has forgotten what it sent, see the
    /// sampler's module docs); `None` means the id is unknown.
    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>>;

    /// Cumulative counters since attach.
    fn stats(&self) -> SourceStats;

    /// For a source whose calls return every sample taken since its last call (the kernel
    /// capture: as many per call as there were, each one thread at one instant), what the
    /// last call held (a call fails when every sample it held failed: then `failed` of them,
    /// or 0 when it failed for another reason); `None` (the default) for a source that
    /// samples every thread once per call.
    fn captured_in_last(&self) -> Option<CapturedCounts> {
        None
    }

    /// Whether a call also hands out samples owed for time up to the call (the kernel
    /// capture in wall and gil modes: threads' time off their CPU): the slot then calls it
    /// right before each batch, even when it is not [`due`](Self::due), so that a batch
    /// holds every sample owed up to its time and the source need not be due just to count.
    /// By default, no.
    fn counts_at_batch(&self) -> bool {
        false
    }
}

/// What one call of a capturing source held (see [`StackSource::captured_in_last`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapturedCounts {
    /// Samples returned.
    pub taken: u64,
    /// Samples that failed (not returned), and the kind of the first failure.
    pub failed: u64,
    pub failed_kind: &'static str,
    /// The time each sample returned stands for (the capture's sampling period, whatever
    /// the sampling threads' rate).
    pub period: std::time::Duration,
}

/// Why a [`SourceFactory`] attached no source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachFailure {
    /// The process exited, or is exiting (what attaching reads of it is already gone): an
    /// exit, which is never a failure nor worth a warning.
    Ended(String),
    /// Anything else: a failure, for the restart policy.
    Failed(String),
}

/// Attaches a [`StackSource`] to a process. Called on tokio's blocking pool (never on the
/// async workers nor on the sampling thread, so it may take its time), once per sampler
/// start, including each restart.
pub trait SourceFactory: Send + Sync + 'static {
    type Source: StackSource;

    /// `needs_cpu_status`: the mode counts only threads on CPU, so the source must find out
    /// which are (otherwise it may report `on_cpu: false` for all and skip that cost).
    fn attach(
        &self,
        p: &ProcessInfo,
        needs_cpu_status: bool,
    ) -> Result<Self::Source, AttachFailure>;
}
