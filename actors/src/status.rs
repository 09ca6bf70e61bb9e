//! What the supervisor reports about the fleet: the shared rate, and per pid whether it is
//! sampled and why not.
//!
//! Owns [`FleetStatus`], [`ProcessStatus`] and [`ProcessState`]: plain data, built by the
//! supervisor and handed out by [`Fleet::status`](crate::Fleet::status).

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
    /// Its role and labels as of the scan that listed it.
    pub role: pyfleet_policies::Role,
    pub labels: crate::source::Labels,
    /// The interpreter's version as detected (`3.13.1`).
    pub python_version: String,
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
