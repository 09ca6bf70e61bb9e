//! What one snapshot window holds, and the trait that writes it out.
//!
//! Owns the [`Snapshot`] data type handed from the aggregator to the sink, and the
//! [`SnapshotWriter`] trait the root package implements (folded stacks, SVG, retention).
//! It must not format or write anything itself: every output format lives in the root
//! package's `output/`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::source::{FrameInfo, Labels, ThreadStatus};

/// A stack's frames, innermost first; shared between the aggregator, snapshots and a
/// recording (a clone copies no frame).
pub type Frames = Arc<[FrameInfo]>;

/// Everything sampled in one window, across the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When the window began (wall clock): the previous window's end, or the aggregator's
    /// start for the first.
    pub started_at: SystemTime,
    /// When the window ended (wall clock, for naming the output).
    pub taken_at: SystemTime,
    /// One entry per process that reported to the aggregator during the window (even with no
    /// counted sample, e.g. an idle process in `cpu` mode), sorted by pid.
    pub processes: Vec<ProcessProfile>,
}

/// One process's counts in a window.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessProfile {
    pub pid: i32,
    pub name: String,
    /// Master, worker or single, as of the scan that listed it.
    pub role: pyfleet_policies::Role,
    /// Who it is beyond its name (see [`Labels`]).
    pub labels: Labels,
    /// `(status, frames innermost first, count)`, one entry per distinct (status, frames),
    /// highest count first. A stack of the single frame [`TRUNCATED_FUNCTION`] holds the
    /// samples that did not fit under the per-process cap of distinct stacks.
    pub samples: Vec<(ThreadStatus, Frames, u64)>,
    /// The time `samples` stand for: each sample its sampling period when it was taken (the
    /// sampling threads' rate in force, or the kernel capture's). Zero when not known (a
    /// profile read back from a file that does not say).
    pub sampled: Duration,
}

/// Function name of the frame that stands for the samples over the distinct-stack cap.
pub const TRUNCATED_FUNCTION: &str = "[truncated]";
/// Function name of the frame that stands for a stack the source could not resolve.
pub const UNKNOWN_FUNCTION: &str = "[unknown]";

impl ProcessProfile {
    /// Total counted samples (thread samples that matched the mode) in the window.
    pub fn total(&self) -> u64 {
        self.samples.iter().map(|(_, _, n)| *n).sum()
    }

    /// The rate its samples were taken at, on average over the window: samples per second
    /// they stand for (`None` when that time is not known, or no sample was counted).
    pub fn rate_hz(&self) -> Option<f64> {
        rate_hz(self.total(), self.sampled)
    }
}

impl Snapshot {
    /// The rate the window's samples were taken at, all processes together (see
    /// [`ProcessProfile::rate_hz`]): what turns its counts into seconds.
    pub fn rate_hz(&self) -> Option<f64> {
        let (n, t) = self
            .processes
            .iter()
            .filter(|p| !p.sampled.is_zero())
            .fold((0u64, Duration::ZERO), |(n, t), p| {
                (n.saturating_add(p.total()), t.saturating_add(p.sampled))
            });
        rate_hz(n, t)
    }
}

/// The rate `samples` that stand for `sampled` were taken at (`None` when either is zero).
pub fn rate_hz(samples: u64, sampled: Duration) -> Option<f64> {
    (samples > 0 && !sampled.is_zero()).then(|| samples as f64 / sampled.as_secs_f64())
}

/// Takes each push window (see [`PushSchedule`](crate::PushSchedule)) away to a profile store.
/// Called on the sink's task: it must not block (queue the window and return).
pub trait WindowPusher: Send + Sync + 'static {
    fn push(&self, window: Snapshot);
}

/// Writes snapshots out. Implemented by the root package; the sink calls it on a blocking
/// thread, never on the async workers, one call at a time.
pub trait SnapshotWriter: Send + Sync + 'static {
    /// Writes one snapshot (atomically, as the implementation sees fit) and returns where.
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String>;
    /// Deletes old snapshots by the retention policy. Called after each successful write;
    /// reports its own problems (logs).
    fn apply_retention(&self);
}
