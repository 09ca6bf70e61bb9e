//! pyfleet's own CPU time, for the rate controller and `pyfleet_cpu_seconds_total`.
//!
//! Owns the one `getrusage(RUSAGE_SELF)` call (user + system time of every thread of this
//! process, sampling threads included) and the percentage over an interval. It must not decide
//! the rate: [`RatePolicy`](pyfleet_policies::RatePolicy) does.

use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;

/// User + system CPU time of this process so far.
pub fn cpu_time() -> Result<Duration, nix::Error> {
    let usage = getrusage(UsageWho::RUSAGE_SELF)?;
    Ok(to_duration(usage.user_time()) + to_duration(usage.system_time()))
}

fn to_duration(t: TimeVal) -> Duration {
    let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
    let micros = u64::try_from(t.tv_usec()).unwrap_or(0);
    Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// Turns successive CPU-time readings into a percentage of one core.
#[derive(Debug)]
pub(crate) struct CpuMeter {
    last: Option<(Instant, Duration)>,
}

impl CpuMeter {
    pub(crate) fn new() -> Self {
        CpuMeter { last: None }
    }

    /// Records a reading; returns the percentage of one core used since the previous one
    /// (`None` for the first reading or when no time passed).
    pub(crate) fn observe(&mut self, at: Instant, cpu: Duration) -> Option<f64> {
        let previous = self.last.replace((at, cpu));
        let (then, cpu_then) = previous?;
        let wall = at.checked_duration_since(then)?.as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        Some(cpu.saturating_sub(cpu_then).as_secs_f64() / wall * 100.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_of_one_core() {
        let t0 = Instant::now();
        let mut meter = CpuMeter::new();
        assert_eq!(meter.observe(t0, Duration::from_millis(100)), None);
        let p = meter.observe(t0 + Duration::from_secs(2), Duration::from_millis(200));
        assert!((p.unwrap_or(0.0) - 5.0).abs() < 1e-9);
        assert!(cpu_time().is_ok());
    }
}
