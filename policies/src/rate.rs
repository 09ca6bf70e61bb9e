//! The sampling rate under an overhead budget (`--rate`, `--max-cpu`).
//!
//! Owns the validation of those two options and the controller that picks the one rate shared
//! by every sampled process. It must not measure anything: the caller reads pyfleet's own CPU
//! time over the last interval, turns it into a percentage of one core, and passes it in with
//! the rate in force during that interval.
//!
//! The controller. pyfleet's cost is roughly proportional to the sampling rate, so:
//! - over budget (`measured > max_cpu`): scale the rate by `0.9 * max_cpu / measured` in one
//!   step, i.e. aim at 90% of the budget. Overspending lasts one interval, not several.
//! - well under budget (`measured < 0.7 * max_cpu`): raise the rate by 25%. With a linear cost
//!   that lands below 0.7 * 1.25 = 87.5% of the budget, so a raise never overshoots it.
//! - between 70% and 100% of the budget: keep the rate (the dead band stops small measurement
//!   noise from making the rate oscillate).
//! - always within `[min_hz, base_hz]`; `min_hz` is 1 Hz, or `base_hz` when that is lower. When
//!   even `min_hz` costs more than the budget (a fixed cost that does not scale with the rate,
//!   or very many processes), the rate stays at `min_hz` and the budget is exceeded.
//! - a NaN or negative measurement leaves the rate unchanged; +inf counts as over budget. A
//!   `current_hz` outside the bounds is clamped into them first (NaN counts as `base_hz`).
//!
//! One rate for all processes is the fair share: each process is sampled equally often, and
//! the rate comes down for all alike when the total is too expensive.

/// Default `--rate`: samples per second for each process when the budget allows it.
pub const DEFAULT_RATE_HZ: f64 = 100.0;
/// Default `--max-cpu`: pyfleet's own CPU budget, percent of one core.
pub const DEFAULT_MAX_CPU_PERCENT: f64 = 5.0;
/// Highest `--rate` accepted.
pub const MAX_RATE_HZ: f64 = 10_000.0;
/// The rate never goes below this, unless `--rate` itself is lower.
pub const MIN_RATE_HZ: f64 = 1.0;

/// Fraction of the budget a cut aims at.
const TARGET_FRACTION: f64 = 0.9;
/// Below this fraction of the budget the rate may go up.
const RAISE_BELOW_FRACTION: f64 = 0.7;
/// Largest factor a single step raises the rate by.
const MAX_RAISE: f64 = 1.25;

/// `--rate` or `--max-cpu` is out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RateError {
    #[error("--rate must be a positive number of samples per second, at most 10000 (got {0})")]
    Rate(f64),
    #[error("--max-cpu must be a percentage above 0 (got {0})")]
    MaxCpu(f64),
}

/// The rate controller; see the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct RatePolicy {
    base_hz: f64,
    max_cpu_percent: f64,
    min_hz: f64,
}

impl Default for RatePolicy {
    /// 100 Hz, 5% of one core, at least 1 Hz.
    fn default() -> Self {
        RatePolicy {
            base_hz: DEFAULT_RATE_HZ,
            max_cpu_percent: DEFAULT_MAX_CPU_PERCENT,
            min_hz: MIN_RATE_HZ,
        }
    }
}

impl RatePolicy {
    /// `base_hz`: `--rate`, in `(0, 10000]`. `max_cpu_percent`: `--max-cpu`, percent of one
    /// core, any finite number above 0 (above 100 means more than one core).
    pub fn new(base_hz: f64, max_cpu_percent: f64) -> Result<Self, RateError> {
        if !(base_hz > 0.0 && base_hz <= MAX_RATE_HZ) {
            return Err(RateError::Rate(base_hz));
        }
        if !(max_cpu_percent > 0.0 && max_cpu_percent.is_finite()) {
            return Err(RateError::MaxCpu(max_cpu_percent));
        }
        Ok(RatePolicy {
            base_hz,
            max_cpu_percent,
            min_hz: MIN_RATE_HZ.min(base_hz),
        })
    }

    /// The rate when there is room: `--rate`. Also the rate to start at.
    pub fn base_hz(&self) -> f64 {
        self.base_hz
    }

    /// The CPU budget, percent of one core: `--max-cpu`.
    pub fn max_cpu_percent(&self) -> f64 {
        self.max_cpu_percent
    }

    /// The floor of the rate: 1 Hz, or `base_hz` when lower.
    pub fn min_hz(&self) -> f64 {
        self.min_hz
    }

    /// Next shared rate, given the current rate and the CPU percent (of one core) pyfleet
    /// used over the last interval.
    pub fn adjust(&self, current_hz: f64, measured_cpu_percent: f64) -> f64 {
        let current = if current_hz.is_nan() {
            self.base_hz
        } else {
            current_hz.clamp(self.min_hz, self.base_hz)
        };
        let measured = measured_cpu_percent;
        if measured.is_nan() || measured < 0.0 {
            return current;
        }
        let budget = self.max_cpu_percent;
        if measured > budget {
            // measured is above a positive budget, so this is finite or 0 (measured = +inf).
            (current * (TARGET_FRACTION * budget / measured)).clamp(self.min_hz, self.base_hz)
        } else if measured < RAISE_BELOW_FRACTION * budget {
            (current * MAX_RAISE).min(self.base_hz)
        } else {
            current
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RatePolicy {
        RatePolicy::new(100.0, 5.0).unwrap()
    }

    fn approx(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// Runs the controller against a cost model for `steps` intervals from `start`; returns
    /// the rates after each step and the cost measured during each.
    fn simulate(
        p: &RatePolicy,
        start: f64,
        steps: usize,
        cost: impl Fn(f64) -> f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut rate = start;
        let mut rates = Vec::new();
        let mut costs = Vec::new();
        for _ in 0..steps {
            let c = cost(rate);
            costs.push(c);
            rate = p.adjust(rate, c);
            rates.push(rate);
        }
        (rates, costs)
    }

    #[test]
    fn defaults() {
        let p = RatePolicy::default();
        assert_eq!(p.base_hz(), 100.0);
        assert_eq!(p.max_cpu_percent(), 5.0);
        assert_eq!(p.min_hz(), 1.0);
        assert_eq!(
            p,
            RatePolicy::new(DEFAULT_RATE_HZ, DEFAULT_MAX_CPU_PERCENT).unwrap()
        );
    }

    #[test]
    fn new_validates_rate() {
        for bad in [
            0.0,
            -0.0,
            -1.0,
            10_000.5,
            1e9,
            f64::NAN,
            f64::INFINITY,
            -f64::INFINITY,
        ] {
            assert!(
                matches!(RatePolicy::new(bad, 5.0), Err(RateError::Rate(_))),
                "{bad}"
            );
        }
        for good in [0.01, 1.0, 19.0, 100.0, 10_000.0] {
            let p = RatePolicy::new(good, 5.0).unwrap();
            assert_eq!(p.base_hz(), good);
        }
        assert_eq!(
            RatePolicy::new(0.0, 5.0).unwrap_err().to_string(),
            "--rate must be a positive number of samples per second, at most 10000 (got 0)"
        );
        assert_eq!(
            RatePolicy::new(20000.0, 5.0).unwrap_err().to_string(),
            "--rate must be a positive number of samples per second, at most 10000 (got 20000)"
        );
        assert!(RatePolicy::new(f64::NAN, 5.0)
            .unwrap_err()
            .to_string()
            .ends_with("(got NaN)"));
    }

    #[test]
    fn new_validates_max_cpu() {
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY, -f64::INFINITY] {
            assert!(
                matches!(RatePolicy::new(100.0, bad), Err(RateError::MaxCpu(_))),
                "{bad}"
            );
        }
        for good in [0.01, 5.0, 100.0, 350.0] {
            assert_eq!(
                RatePolicy::new(100.0, good).unwrap().max_cpu_percent(),
                good
            );
        }
        assert_eq!(
            RatePolicy::new(100.0, -1.5).unwrap_err().to_string(),
            "--max-cpu must be a percentage above 0 (got -1.5)"
        );
        // The rate is checked first.
        assert!(matches!(RatePolicy::new(0.0, 0.0), Err(RateError::Rate(_))));
        for e in [RatePolicy::new(-1.0, 5.0), RatePolicy::new(1.0, 0.0)] {
            assert_eq!(e.unwrap_err().to_string().lines().count(), 1);
        }
    }

    #[test]
    fn min_is_one_hz_or_base() {
        assert_eq!(RatePolicy::new(100.0, 5.0).unwrap().min_hz(), 1.0);
        assert_eq!(RatePolicy::new(1.0, 5.0).unwrap().min_hz(), 1.0);
        assert_eq!(RatePolicy::new(0.5, 5.0).unwrap().min_hz(), 0.5);
        // With base below 1 Hz the rate is fixed.
        let p = RatePolicy::new(0.5, 5.0).unwrap();
        assert_eq!(p.adjust(0.5, 50.0), 0.5);
        assert_eq!(p.adjust(0.5, 0.0), 0.5);
    }

    #[test]
    fn over_budget_scales_down_in_one_step() {
        let p = policy();
        // 10% at 100 Hz -> aim at 4.5%: 45 Hz.
        assert!(approx(p.adjust(100.0, 10.0), 45.0));
        // 5.5% at 50 Hz -> 50 * 4.5 / 5.5.
        assert!(approx(p.adjust(50.0, 5.5), 50.0 * 4.5 / 5.5));
        // Far over: down to the floor, never below.
        assert_eq!(p.adjust(100.0, 1e6), 1.0);
        assert_eq!(p.adjust(100.0, f64::INFINITY), 1.0);
        assert_eq!(p.adjust(1.0, 80.0), 1.0);
        // Just over the budget is over.
        assert!(p.adjust(100.0, 5.000_001) < 100.0);
    }

    #[test]
    fn under_budget_raises_by_at_most_a_quarter() {
        let p = policy();
        assert!(approx(p.adjust(40.0, 0.0), 50.0));
        assert!(approx(p.adjust(40.0, 1.0), 50.0));
        assert!(approx(p.adjust(40.0, 3.49), 50.0));
        assert!(approx(p.adjust(1.0, 0.1), 1.25));
        // Never above base.
        assert_eq!(p.adjust(90.0, 0.0), 100.0);
        assert_eq!(p.adjust(100.0, 0.0), 100.0);
    }

    #[test]
    fn dead_band_keeps_the_rate() {
        let p = policy();
        for measured in [3.5, 4.0, 4.5, 4.99, 5.0] {
            assert_eq!(p.adjust(40.0, measured), 40.0, "{measured}");
        }
    }

    #[test]
    fn bad_measurements_leave_the_rate_unchanged() {
        let p = policy();
        for measured in [f64::NAN, -1.0, -f64::INFINITY, -1e-9] {
            assert_eq!(p.adjust(40.0, measured), 40.0, "{measured}");
        }
        // -0.0 is not negative: zero cost raises the (clamped) rate.
        assert_eq!(p.adjust(-0.0, -0.0), 1.25);
    }

    #[test]
    fn current_is_clamped_into_bounds() {
        let p = policy();
        assert_eq!(p.adjust(500.0, 4.0), 100.0);
        assert_eq!(p.adjust(f64::INFINITY, 4.0), 100.0);
        assert_eq!(p.adjust(0.0, 4.0), 1.0);
        assert_eq!(p.adjust(-7.0, 4.0), 1.0);
        assert_eq!(p.adjust(f64::NEG_INFINITY, 4.0), 1.0);
        assert_eq!(p.adjust(f64::NAN, 4.0), 100.0);
        assert_eq!(p.adjust(f64::NAN, f64::NAN), 100.0);
        assert!(approx(p.adjust(f64::NAN, 10.0), 45.0));
    }

    #[test]
    fn settles_under_budget_for_linear_costs() {
        let p = policy();
        // Percent of a core per Hz: from negligible to more than the floor can afford.
        for k in [
            0.0001, 0.01, 0.03, 0.04, 0.049, 0.05, 0.051, 0.1, 0.3, 1.0, 4.0,
        ] {
            let (rates, costs) = simulate(&p, p.base_hz(), 50, |hz| k * hz);
            let last = rates[rates.len() - 1];
            if k * p.base_hz() <= 5.0 {
                // Room for the full rate: it never moves.
                assert!(rates.iter().all(|&r| r == 100.0), "k={k}: {rates:?}");
            } else {
                // One step brings the cost to 90% of the budget, and it stays there.
                assert!(approx(last, 4.5 / k), "k={k}: {last}");
                assert!(costs[1..].iter().all(|&c| c <= 5.0), "k={k}: {costs:?}");
                assert!(rates[1..].iter().all(|&r| approx(r, last)), "k={k}");
            }
        }
    }

    #[test]
    fn floor_wins_over_budget() {
        let p = policy();
        // 10% per Hz: even 1 Hz is over budget; the rate sits at the floor.
        let (rates, _) = simulate(&p, p.base_hz(), 10, |hz| 10.0 * hz);
        assert!(rates.iter().all(|&r| r == 1.0), "{rates:?}");
    }

    #[test]
    fn settles_with_a_fixed_cost_too() {
        let p = policy();
        // A fixed part that does not scale with the rate makes each cut fall short; it still
        // converges under the budget within a few steps.
        for (fixed, k) in [(1.0, 0.1), (3.0, 0.1), (4.0, 1.0), (0.5, 0.5)] {
            let (rates, costs) = simulate(&p, p.base_hz(), 40, |hz| fixed + k * hz);
            assert!(
                costs[10..].iter().all(|&c| c <= 5.0),
                "{fixed}+{k}: {costs:?}"
            );
            let last = rates[rates.len() - 1];
            assert!(
                rates[10..].iter().all(|&r| r == last),
                "{fixed}+{k}: {rates:?}"
            );
            assert!(
                fixed + k * last >= 0.7 * 5.0,
                "{fixed}+{k}: settled too low: {last}"
            );
        }
    }

    #[test]
    fn recovers_after_load_drops() {
        let p = policy();
        // Expensive phase: 0.2% per Hz settles at 22.5 Hz.
        let (rates, _) = simulate(&p, p.base_hz(), 5, |hz| 0.2 * hz);
        let settled = rates[rates.len() - 1];
        assert!(approx(settled, 22.5));
        // Load drops to 0.01% per Hz: back to base by steps of at most 25%, under budget.
        let (rates, costs) = simulate(&p, settled, 20, |hz| 0.01 * hz);
        let mut prev = settled;
        for &r in &rates {
            assert!(r >= prev && r <= prev * 1.25 + 1e-9, "{rates:?}");
            prev = r;
        }
        assert!(costs.iter().all(|&c| c <= 5.0));
        let steps_to_base = rates.iter().position(|&r| r == 100.0);
        // 22.5 * 1.25^7 > 100.
        assert_eq!(steps_to_base, Some(6), "{rates:?}");
    }

    #[test]
    fn raising_never_overshoots_a_linear_cost() {
        let p = policy();
        // Any start, any linear cost: a raise never lands over the budget.
        for k in [0.02, 0.05, 0.07, 0.1, 0.2, 0.5] {
            for start in [1.0, 3.0, 10.0, 33.0, 64.0, 100.0] {
                let (_, costs) = simulate(&p, start, 30, |hz| k * hz);
                // The first interval ran at the starting rate; every later one obeys.
                assert!(costs[1..].iter().all(|&c| c <= 5.0 + 1e-9), "{k} {start}");
            }
        }
    }

    #[test]
    fn measurement_noise_inside_the_band_does_not_move_the_rate() {
        let p = policy();
        // Settled at 45 Hz (cost 4.5%); measurements wobble by ±10%.
        let mut rate = 45.0;
        for i in 0..100 {
            let wobble = if i % 2 == 0 { 1.1 } else { 0.9 };
            rate = p.adjust(rate, 0.1 * rate * wobble);
            assert!(approx(rate, 45.0), "{i}: {rate}");
        }
    }
}
