//! When to restart a failed sampler, and when to give up on its process.
//!
//! Owns the backoff arithmetic (exponential, capped, jittered) and the cap on restarts per
//! sliding window. It must not sleep, read a clock or draw random numbers: the supervisor
//! passes the failure time (a [`Duration`] since its own monotonic start) and a random number
//! in `[0, 1)`, then schedules the restart itself.
//!
//! Rules:
//! - Backoff for the n-th consecutive failure is `initial_backoff * multiplier^(n-1)`, capped
//!   at `max_backoff`, then jittered: `random` in `[0, 1)` maps linearly to a factor in
//!   `[1 - jitter, 1 + jitter]`. The result is never negative and never above
//!   `max_backoff * (1 + jitter)`.
//! - A failure counts in the window while it is less than `window` old (a failure exactly
//!   `window` ago has dropped out). The failure that would be restart number
//!   `max_restarts + 1` within the window gives up instead. A zero window disables the cap
//!   (only the current failure is ever in it), unless `max_restarts` is zero.
//! - [`RestartPolicy::on_healthy`] (the sampler ran fine for a while) resets the backoff to
//!   `initial_backoff` but keeps the window history, so a flapping sampler still hits the cap.
//! - Bad inputs are tamed rather than trusted: `random` is clamped into `[0, 1)` (NaN counts as
//!   0.5, i.e. no jitter), `jitter` into `[0, 1]` (NaN counts as 0), a multiplier that is not
//!   a finite number of at least 1 counts as 1, and huge failure counts saturate.

use std::collections::VecDeque;
use std::time::Duration;

/// How failed samplers are restarted. The fields are public so a configuration can set them;
/// [`Default`] gives the daemon's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartPolicy {
    /// Backoff before the first restart after a healthy run.
    pub initial_backoff: Duration,
    /// Backoff cap, before jitter.
    pub max_backoff: Duration,
    /// Growth of the backoff per consecutive failure (at least 1).
    pub multiplier: f64,
    /// Jitter as a fraction of the backoff, `0..=1`.
    pub jitter: f64,
    /// Restarts allowed within `window`; the next failure gives up.
    pub max_restarts: u32,
    /// Length of the sliding window restarts are counted in.
    pub window: Duration,
}

impl Default for RestartPolicy {
    /// 500 ms initial backoff doubling up to 30 s, ±20% jitter, at most 5 restarts per 60 s.
    fn default() -> Self {
        RestartPolicy {
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
            jitter: 0.2,
            max_restarts: 5,
            window: Duration::from_secs(60),
        }
    }
}

/// What the policy remembers about one sampler (one per process).
#[derive(Default, Debug, Clone)]
pub struct RestartState {
    /// Times of the failures still in the window, oldest first; at most `max_restarts + 1`.
    failures: VecDeque<Duration>,
    /// Failures since the last healthy run.
    consecutive: u32,
}

impl RestartState {
    /// Failures since the sampler was last reported healthy.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }

    /// Failures counted in the window as of the last call to [`RestartPolicy::on_failure`].
    pub fn failures_in_window(&self) -> usize {
        self.failures.len()
    }
}

/// What to do about a failed sampler.
#[derive(Debug, Clone, PartialEq)]
pub enum RestartDecision {
    /// Restart the sampler after this delay.
    RestartAfter(Duration),
    /// Stop trying: the sampler was already restarted `restarts` times within `window`.
    GiveUp { restarts: u32, window: Duration },
}

impl RestartPolicy {
    /// Records a failure observed at `now` and decides what to do. `random` is a fresh random
    /// number in `[0, 1)` from the caller, used for jitter.
    pub fn on_failure(
        &self,
        state: &mut RestartState,
        now: Duration,
        random: f64,
    ) -> RestartDecision {
        // Drop failures that have left the window (a clock going backwards keeps them).
        while let Some(&oldest) = state.failures.front() {
            if now.saturating_sub(oldest) >= self.window {
                state.failures.pop_front();
            } else {
                break;
            }
        }
        state.failures.push_back(now);
        // Only the most recent max_restarts + 1 failures can change a decision.
        let limit = usize::try_from(self.max_restarts)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        while state.failures.len() > limit {
            state.failures.pop_front();
        }
        state.consecutive = state.consecutive.saturating_add(1);

        let restarts_before = state.failures.len() - 1;
        if u64::try_from(restarts_before).unwrap_or(u64::MAX) >= u64::from(self.max_restarts) {
            return RestartDecision::GiveUp {
                restarts: self.max_restarts,
                window: self.window,
            };
        }
        RestartDecision::RestartAfter(self.backoff(state.consecutive, random))
    }

    /// The sampler ran fine for a while: the next failure backs off from `initial_backoff`
    /// again. The window history stays, so restarts keep counting against the cap.
    pub fn on_healthy(&self, state: &mut RestartState) {
        state.consecutive = 0;
    }

    /// Backoff for the `consecutive`-th failure in a row (1 for the first), jittered.
    fn backoff(&self, consecutive: u32, random: f64) -> Duration {
        let multiplier = if self.multiplier.is_finite() && self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        let random = clamp_unit(random);

        let max = self.max_backoff.as_secs_f64();
        let exponent = i32::try_from(consecutive.saturating_sub(1)).unwrap_or(i32::MAX);
        // powi of a huge exponent is +inf, which min() turns into the cap; a zero initial
        // backoff times +inf is NaN, which stays zero.
        let grown = self.initial_backoff.as_secs_f64() * multiplier.powi(exponent);
        let base = if grown.is_nan() { 0.0 } else { grown.min(max) };
        let jittered = base * (1.0 + jitter * (2.0 * random - 1.0));
        let ceiling = max * (1.0 + jitter);
        let secs = if jittered.is_nan() {
            0.0
        } else {
            jittered.clamp(0.0, ceiling)
        };
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
}

/// Clamps a caller's random number into `[0, 1)`; NaN becomes the midpoint (no jitter).
fn clamp_unit(random: f64) -> f64 {
    if random.is_nan() {
        0.5
    } else if random >= 1.0 {
        1.0 - f64::EPSILON / 2.0
    } else if random <= 0.0 {
        0.0
    } else {
        random
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MID: f64 = 0.5; // no jitter

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= Duration::from_micros(1)
    }

    fn restart_after(d: RestartDecision) -> Duration {
        match d {
            RestartDecision::RestartAfter(d) => d,
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    /// A policy with no restart cap to speak of, for backoff tests.
    fn uncapped() -> RestartPolicy {
        RestartPolicy {
            max_restarts: u32::MAX,
            ..RestartPolicy::default()
        }
    }

    #[test]
    fn defaults() {
        let p = RestartPolicy::default();
        assert_eq!(p.initial_backoff, ms(500));
        assert_eq!(p.max_backoff, secs(30));
        assert_eq!(p.multiplier, 2.0);
        assert_eq!(p.jitter, 0.2);
        assert_eq!(p.max_restarts, 5);
        assert_eq!(p.window, secs(60));
        let s = RestartState::default();
        assert_eq!(s.consecutive_failures(), 0);
        assert_eq!(s.failures_in_window(), 0);
    }

    #[test]
    fn backoff_doubles_then_caps() {
        let p = uncapped();
        let mut s = RestartState::default();
        let expected = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000];
        for (i, want) in expected.into_iter().enumerate() {
            // Failures far apart in time: the window plays no part here.
            let now = secs(1000 * i as u64);
            let got = restart_after(p.on_failure(&mut s, now, MID));
            assert!(close(got, ms(want)), "failure {}: {got:?}", i + 1);
        }
        assert_eq!(s.consecutive_failures(), 9);
    }

    #[test]
    fn jitter_maps_random_to_plus_minus_fraction() {
        let p = uncapped();
        let at = |random: f64| {
            let mut s = RestartState::default();
            restart_after(p.on_failure(&mut s, secs(0), random))
        };
        assert!(close(at(0.0), ms(400)));
        assert!(close(at(0.25), ms(450)));
        assert!(close(at(0.5), ms(500)));
        assert!(close(at(0.75), ms(550)));
        let top = at(0.999_999);
        assert!(top < ms(600) && top > ms(599), "{top:?}");
        // Every draw stays within ±20%.
        for i in 0..1000 {
            let d = at(f64::from(i) / 1000.0);
            assert!(d >= ms(400) && d < ms(600), "{d:?}");
        }
    }

    #[test]
    fn jitter_at_the_cap_stays_within_bounds() {
        let p = uncapped();
        let mut s = RestartState::default();
        for i in 0..20u64 {
            p.on_failure(&mut s, secs(1000 * i), MID);
        }
        for random in [0.0, 0.3, 0.5, 0.9999, 1.0, 7.0, f64::INFINITY] {
            let d = restart_after(p.clone().on_failure(&mut s.clone(), secs(99_999), random));
            assert!(d >= secs(24) && d <= secs(36), "{random}: {d:?}");
        }
    }

    #[test]
    fn bad_random_is_clamped() {
        let p = uncapped();
        let at = |random: f64| {
            let mut s = RestartState::default();
            restart_after(p.on_failure(&mut s, secs(0), random))
        };
        assert!(close(at(-3.0), ms(400)));
        assert!(close(at(f64::NEG_INFINITY), ms(400)));
        assert!(close(at(f64::NAN), ms(500)));
        // Just below 1, which rounding may carry to the very top of the range, never past it.
        let high = at(1.0);
        assert!(high <= ms(600) && high > ms(599), "{high:?}");
        assert!(close(at(f64::INFINITY), high));
        assert!(close(at(f64::MAX), high));
    }

    #[test]
    fn bad_jitter_is_clamped() {
        let with_jitter = |jitter: f64, random: f64| {
            let p = RestartPolicy {
                jitter,
                ..uncapped()
            };
            restart_after(p.on_failure(&mut RestartState::default(), secs(0), random))
        };
        // NaN and negative jitter: none at all.
        assert!(close(with_jitter(f64::NAN, 0.0), ms(500)));
        assert!(close(with_jitter(-1.0, 0.0), ms(500)));
        // Above 1: as 1, so the delay can reach zero but never go negative.
        assert_eq!(with_jitter(5.0, 0.0), Duration::ZERO);
        assert_eq!(with_jitter(f64::INFINITY, 0.0), Duration::ZERO);
        assert!(with_jitter(5.0, 0.999_999) < ms(1000));
        // Zero jitter: exact.
        assert!(close(with_jitter(0.0, 0.0), ms(500)));
        assert!(close(with_jitter(0.0, 0.999), ms(500)));
    }

    #[test]
    fn bad_multiplier_counts_as_one() {
        for multiplier in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -2.0, 0.0, 0.5] {
            let p = RestartPolicy {
                multiplier,
                ..uncapped()
            };
            let mut s = RestartState::default();
            for i in 0..10u64 {
                let d = restart_after(p.on_failure(&mut s, secs(1000 * i), MID));
                assert!(close(d, ms(500)), "{multiplier}: {d:?}");
            }
        }
        // Exactly 1 is allowed and constant too; 1.5 grows.
        let p = RestartPolicy {
            multiplier: 1.5,
            ..uncapped()
        };
        let mut s = RestartState::default();
        p.on_failure(&mut s, secs(0), MID);
        let d = restart_after(p.on_failure(&mut s, secs(1000), MID));
        assert!(close(d, ms(750)), "{d:?}");
    }

    #[test]
    fn huge_consecutive_counts_do_not_overflow() {
        let p = RestartPolicy {
            multiplier: f64::MAX,
            ..uncapped()
        };
        let mut s = RestartState {
            failures: VecDeque::new(),
            consecutive: u32::MAX - 1,
        };
        let d = restart_after(p.on_failure(&mut s, secs(0), MID));
        assert!(close(d, secs(30)));
        assert_eq!(s.consecutive_failures(), u32::MAX);
        // Saturates instead of wrapping back to the initial backoff.
        let d = restart_after(p.on_failure(&mut s, secs(1000), MID));
        assert!(close(d, secs(30)));
        assert_eq!(s.consecutive_failures(), u32::MAX);
    }

    #[test]
    fn extreme_durations() {
        // A max backoff of Duration::MAX with jitter above it cannot overflow.
        let p = RestartPolicy {
            initial_backoff: Duration::MAX,
            max_backoff: Duration::MAX,
            ..uncapped()
        };
        let d = restart_after(p.on_failure(&mut RestartState::default(), secs(0), 0.99));
        assert!(d > Duration::from_secs(u64::MAX / 2));
        // Zero backoff stays zero whatever the jitter.
        let p = RestartPolicy {
            initial_backoff: Duration::ZERO,
            ..uncapped()
        };
        let d = restart_after(p.on_failure(&mut RestartState::default(), secs(0), 0.99));
        assert_eq!(d, Duration::ZERO);
        let p = RestartPolicy {
            initial_backoff: Duration::ZERO,
            multiplier: f64::MAX,
            ..uncapped()
        };
        let mut s = RestartState::default();
        for i in 0..2000u64 {
            let d = restart_after(p.on_failure(&mut s, secs(1000 * i), 0.99));
            assert_eq!(d, Duration::ZERO);
        }
        // A cap below the initial backoff wins.
        let p = RestartPolicy {
            max_backoff: ms(100),
            jitter: 0.0,
            ..uncapped()
        };
        let d = restart_after(p.on_failure(&mut RestartState::default(), secs(0), MID));
        assert!(close(d, ms(100)));
    }

    #[test]
    fn gives_up_on_restart_max_plus_one_within_window() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        for i in 0..5u64 {
            let d = p.on_failure(&mut s, secs(i), MID);
            assert!(matches!(d, RestartDecision::RestartAfter(_)), "{i}: {d:?}");
        }
        assert_eq!(s.failures_in_window(), 5);
        assert_eq!(
            p.on_failure(&mut s, secs(5), MID),
            RestartDecision::GiveUp {
                restarts: 5,
                window: secs(60)
            }
        );
        // Asking again keeps giving up, and the history stays bounded.
        for i in 6..100u64 {
            assert!(matches!(
                p.on_failure(&mut s, secs(i) / 10 + secs(5), MID),
                RestartDecision::GiveUp { .. }
            ));
        }
        assert_eq!(s.failures_in_window(), 6);
    }

    #[test]
    fn old_failures_drop_out_of_the_window() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        // Five failures at t = 0..4 s.
        for i in 0..5u64 {
            restart_after(p.on_failure(&mut s, secs(i), MID));
        }
        // At t = 60 s the failure at 0 s is exactly one window old: it no longer counts.
        restart_after(p.on_failure(&mut s, secs(60), MID));
        assert_eq!(s.failures_in_window(), 5);
        // Just before 61 s the one at 1 s still counts: 6 in the window -> give up.
        let mut t = s.clone();
        assert!(matches!(
            p.on_failure(&mut t, secs(61) - ms(1), MID),
            RestartDecision::GiveUp { .. }
        ));
        // At 61 s it has dropped out.
        restart_after(p.on_failure(&mut s, secs(61), MID));
        // Long after, the window is empty again.
        restart_after(p.on_failure(&mut s, secs(1000), MID));
        assert_eq!(s.failures_in_window(), 1);
    }

    #[test]
    fn steady_failures_slower_than_the_cap_never_give_up() {
        // One failure every 13 s: at most 5 in any 60 s window.
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        for i in 0..100u64 {
            restart_after(p.on_failure(&mut s, secs(13 * i), MID));
            assert!(s.failures_in_window() <= 5);
        }
        // One every 11 s: the sixth within 60 s gives up.
        let mut s = RestartState::default();
        let decisions: Vec<_> = (0..6u64)
            .map(|i| p.on_failure(&mut s, secs(11 * i), MID))
            .collect();
        assert!(matches!(decisions[5], RestartDecision::GiveUp { .. }));
    }

    #[test]
    fn healthy_resets_backoff_but_not_the_window() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        assert!(close(
            restart_after(p.on_failure(&mut s, secs(0), MID)),
            ms(500)
        ));
        assert!(close(
            restart_after(p.on_failure(&mut s, secs(1), MID)),
            ms(1000)
        ));
        assert!(close(
            restart_after(p.on_failure(&mut s, secs(2), MID)),
            ms(2000)
        ));
        p.on_healthy(&mut s);
        assert_eq!(s.consecutive_failures(), 0);
        assert_eq!(s.failures_in_window(), 3);
        assert!(close(
            restart_after(p.on_failure(&mut s, secs(10), MID)),
            ms(500)
        ));
        p.on_healthy(&mut s);
        assert!(close(
            restart_after(p.on_failure(&mut s, secs(20), MID)),
            ms(500)
        ));
        p.on_healthy(&mut s);
        // Sixth failure within 60 s: healthy spells in between do not save it.
        assert_eq!(
            p.on_failure(&mut s, secs(30), MID),
            RestartDecision::GiveUp {
                restarts: 5,
                window: secs(60)
            }
        );
    }

    #[test]
    fn zero_max_restarts_gives_up_at_once() {
        let p = RestartPolicy {
            max_restarts: 0,
            ..RestartPolicy::default()
        };
        let mut s = RestartState::default();
        assert_eq!(
            p.on_failure(&mut s, secs(0), MID),
            RestartDecision::GiveUp {
                restarts: 0,
                window: secs(60)
            }
        );
    }

    #[test]
    fn zero_window_disables_the_cap() {
        let p = RestartPolicy {
            window: Duration::ZERO,
            ..RestartPolicy::default()
        };
        let mut s = RestartState::default();
        for _ in 0..50 {
            restart_after(p.on_failure(&mut s, secs(7), MID));
        }
        assert_eq!(s.failures_in_window(), 1);
    }

    #[test]
    fn clock_going_backwards_keeps_history() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        for i in 0..5u64 {
            restart_after(p.on_failure(&mut s, secs(100 + i), MID));
        }
        // An earlier `now` than recorded failures: they are not dropped, so the cap holds.
        assert!(matches!(
            p.on_failure(&mut s, secs(50), MID),
            RestartDecision::GiveUp { .. }
        ));
    }

    #[test]
    fn clamp_unit_is_half_open() {
        assert_eq!(clamp_unit(0.0), 0.0);
        assert_eq!(clamp_unit(-0.0), 0.0);
        assert_eq!(clamp_unit(0.25), 0.25);
        assert!(clamp_unit(1.0) < 1.0);
        assert!(clamp_unit(f64::INFINITY) < 1.0);
        assert_eq!(clamp_unit(f64::NAN), 0.5);
        assert_eq!(clamp_unit(f64::NEG_INFINITY), 0.0);
    }
}
