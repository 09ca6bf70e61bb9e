//! The fleet's configuration: every knob of the actors, with the daemon's defaults, and the
//! checks a configuration must pass before anything starts.
//!
//! Owns [`FleetConfig`]. It must not start anything or read the environment: the root
//! package fills it from its options and the fleet reads it.

use std::time::Duration;

use pyfleet_policies::{Mode, RatePolicy, RestartPolicy};

use crate::error::FleetError;
use crate::timing::period_of;

/// Everything the actors need to know. [`Default`] gives the daemon's defaults.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// How often discovery runs (default 1 s).
    pub scan_interval: Duration,
    /// How often a snapshot is written (default 60 s); one more is written at shutdown.
    pub snapshot_interval: Duration,
    /// How long the run will last from the fleet's start, when known (`--duration`): a
    /// snapshot or push due less than a tenth of its interval before the end is left to the
    /// final one, so that no window at the end is that short (default: not known).
    pub ends_after: Option<Duration>,
    /// How often each sampler sends its counts to the aggregator (default 1 s).
    pub batch_interval: Duration,
    /// How often pyfleet's own CPU is measured and the rate adjusted (default 2 s: soon
    /// enough that a budget holds from the start, long enough for 10 ms CPU ticks to measure).
    pub rate_interval: Duration,
    /// Which thread samples count (default wall).
    pub mode: Mode,
    /// The shared rate under the CPU budget; samplers start at `base_hz`.
    pub rate: RatePolicy,
    /// Backoff and give-up for failed samplers.
    pub restart: RestartPolicy,
    /// Sample errors in a row that make a sampler fail (default 100).
    pub max_consecutive_errors: u32,
    /// Distinct stacks per process per snapshot window before `[truncated]` (default 50 000).
    pub max_stacks_per_process: usize,
    /// A sampler running this long counts as healthy: its next failure backs off from the
    /// initial backoff again (default 10 s).
    pub healthy_after: Duration,
    /// How long stopping may take as a whole: every sampler's final batch sent, the sampling
    /// threads joined (default 5 s). The final snapshot is written after, whatever it takes.
    pub stop_timeout: Duration,
    /// OS threads that sample the fleet (default 1; at least 1). Every process is sampled by
    /// one of them, at the same ticks; a new process goes to the one with the fewest. One
    /// thread is one wakeup per tick for the whole fleet, the cheapest; more only isolate
    /// processes from a source that stalls (see the `sampling` module's documentation).
    pub sampling_threads: usize,
    /// Push windows besides snapshot windows (default none): every `interval` the window of
    /// counts since the last is handed to `pusher`, and once more at shutdown.
    pub push: Option<PushSchedule>,
}

/// When and to what push windows go (see [`FleetConfig::push`]). A push window is cut at the
/// same instant as a snapshot window when both fall due together (equal intervals).
#[derive(Clone)]
pub struct PushSchedule {
    pub interval: Duration,
    pub pusher: std::sync::Arc<dyn crate::snapshot::WindowPusher>,
}

impl std::fmt::Debug for PushSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSchedule")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            scan_interval: Duration::from_secs(1),
            snapshot_interval: Duration::from_secs(60),
            ends_after: None,
            batch_interval: Duration::from_secs(1),
            rate_interval: Duration::from_secs(2),
            mode: Mode::default(),
            rate: RatePolicy::default(),
            restart: RestartPolicy::default(),
            max_consecutive_errors: 100,
            max_stacks_per_process: 50_000,
            healthy_after: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(5),
            sampling_threads: 1,
            push: None,
        }
    }
}

impl FleetConfig {
    /// Rejects intervals of zero and limits of zero (zero sampling threads included).
    pub fn validate(&self) -> Result<(), FleetError> {
        let intervals = [
            ("scan_interval", self.scan_interval),
            ("snapshot_interval", self.snapshot_interval),
            ("batch_interval", self.batch_interval),
            ("rate_interval", self.rate_interval),
        ];
        let push = self.push.as_ref().map(|p| ("push interval", p.interval));
        for (name, d) in intervals.into_iter().chain(push) {
            if d.is_zero() {
                return Err(FleetError::Config(format!("{name} must be above zero")));
            }
        }
        if self.max_consecutive_errors == 0 {
            return Err(FleetError::Config(
                "max_consecutive_errors must be at least 1".to_string(),
            ));
        }
        if self.max_stacks_per_process == 0 {
            return Err(FleetError::Config(
                "max_stacks_per_process must be at least 1".to_string(),
            ));
        }
        if self.sampling_threads == 0 {
            return Err(FleetError::Config(
                "sampling_threads must be at least 1".to_string(),
            ));
        }
        Ok(())
    }

    /// The idle timeout to give the metrics exporter so that a process's series disappear
    /// soon after its sampler is gone, yet never while it lives: samplers touch their series
    /// with every batch (every `batch_interval`, or every sampling period when that is longer,
    /// since batches go out after ticks) and record a sample duration every period, and the
    /// supervisor touches its series every `scan_interval`, so any timeout well above all
    /// three works. This is four times the longest of them (the sampling period taken at the
    /// rate policy's floor), and at least 30 s: the exporter drops idle series only while it
    /// renders, which for a large fleet costs more than its sampling when done every few
    /// seconds, and a series that lingers half a minute after its process is harmless.
    pub fn metrics_idle_timeout(&self) -> Duration {
        let slowest_sample = period_of(self.rate.min_hz()).unwrap_or_default();
        let longest = self
            .batch_interval
            .max(self.scan_interval)
            .max(slowest_sample);
        longest
            .checked_mul(4)
            .unwrap_or(longest)
            .max(Duration::from_secs(30))
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeros_are_not() {
        assert_eq!(FleetConfig::default().validate(), Ok(()));
        let zero_scan = FleetConfig {
            scan_interval: Duration::ZERO,
            ..FleetConfig::default()
        };
        assert!(matches!(zero_scan.validate(), Err(FleetError::Config(_))));
        let no_errors_allowed = FleetConfig {
            max_consecutive_errors: 0,
            ..FleetConfig::default()
        };
        assert!(no_errors_allowed.validate().is_err());
        let no_sampling_thread = FleetConfig {
            sampling_threads: 0,
            ..FleetConfig::default()
        };
        assert!(no_sampling_thread.validate().is_err());
        assert_eq!(FleetConfig::default().sampling_threads, 1);
    }

    #[test]
    fn idle_timeout_outlasts_every_keepalive() {
        let defaults = FleetConfig::default();
        assert_eq!(defaults.metrics_idle_timeout(), Duration::from_secs(30));
        let slow = FleetConfig {
            scan_interval: Duration::from_secs(10),
            ..FleetConfig::default()
        };
        assert_eq!(slow.metrics_idle_timeout(), Duration::from_secs(40));
        let slow_rate = FleetConfig {
            rate: RatePolicy::new(0.1, 5.0).unwrap_or_default(),
            ..FleetConfig::default()
        };
        assert_eq!(slow_rate.metrics_idle_timeout(), Duration::from_secs(40));
    }
}
