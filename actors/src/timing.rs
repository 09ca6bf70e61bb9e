//! Deadline arithmetic for periodic work that must not drift, and a periodic message timer for
//! actors.
//!
//! Owns [`Deadlines`] (the sampling thread's tick schedule, one grid for every process on it:
//! `next = previous deadline + period`, periods an overrun left behind counted and skipped,
//! never bursted;
//! each tick runs at a random point of its period, see below), [`Jitter`] (the random numbers
//! for it and for restart backoff) and [`spawn_ticker`] (the fixed-grid rule on tokio time,
//! used for scans, rate checks and snapshots). It must not sleep on a thread or read a clock
//! itself in [`Deadlines`]: callers pass `now` and the random fraction, so the arithmetic is
//! testable.
//!
//! Why sampling ticks are jittered. Real programs repeat themselves: a server renders the same
//! template, a parser parses the same grammar, in loops whose period is as steady as the
//! sampler's. Samples taken exactly one period apart then fall on the same few phases of the
//! target's loop, and the profile is biased towards whatever code runs there, differently in
//! every run (aliasing). A tick at a uniformly random point of each period (stratified
//! sampling) is unbiased whatever the target does, keeps the mean rate exact and the grid for
//! counting missed ticks.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use ractor::{ActorRef, Message};

/// Shortest period accepted; shorter ones (or zero) are raised to it.
const MIN_PERIOD: Duration = Duration::from_micros(1);

/// A tick schedule anchored on its deadlines, not on when ticks ran. Deadline `k` opens the
/// period `[start + k * period, start + (k + 1) * period)`; its tick runs at a point of that
/// period chosen when the schedule moves to it (the first tick at `start` itself).
#[derive(Debug, Clone)]
pub(crate) struct Deadlines {
    period: Duration,
    /// The deadline of the last tick that ran, if any.
    last: Option<Instant>,
    next: Instant,
    /// Where in its period the next tick runs, in `[0, 1)`.
    fraction: f64,
}

impl Deadlines {
    /// First tick due at `start`.
    pub(crate) fn new(start: Instant, period: Duration) -> Self {
        Deadlines {
            period: period.max(MIN_PERIOD),
            last: None,
            next: start,
            fraction: 0.0,
        }
    }

    /// When the next tick runs: its deadline plus its offset into the period.
    pub(crate) fn next(&self) -> Instant {
        after(self.next, self.period.mul_f64(self.fraction))
    }

    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// The tick due at [`Self::next`] has run; `now` is after it ran. Moves to the following
    /// deadline; its tick runs `random` (in `[0, 1)`, clamped) of the way into its period.
    /// When `now` is already past that deadline, the periods that ended by `now` are skipped
    /// and counted (missed), and the tick of the period in progress runs at the same share of
    /// what is left of it (a tick late into its period that ran past the next deadline costs
    /// that period nothing). Returns how many periods were missed.
    pub(crate) fn advance(&mut self, now: Instant, random: f64) -> u64 {
        let due = self.next;
        self.last = Some(due);
        self.next = after(due, self.period);
        let random = match random {
            r if r > 0.0 && r < 1.0 => r,
            _ => 0.0,
        };
        self.fraction = random;
        if now < self.next {
            return 0;
        }
        let period_ns = self.period.as_nanos();
        let behind_ns = (now - self.next).as_nanos();
        let missed = behind_ns / period_ns;
        let skipped = Duration::from_nanos(u64::try_from(missed * period_ns).unwrap_or(u64::MAX));
        self.next = after(self.next, skipped);
        let into = (behind_ns % period_ns) as f64 / period_ns as f64;
        self.fraction = into + random * (1.0 - into);
        u64::try_from(missed).unwrap_or(u64::MAX)
    }

    /// Passes over the next `periods` ticks without running them (nothing is due in them):
    /// the tick after runs at the same point of its period the next one would have. Not
    /// counted as missed.
    pub(crate) fn skip(&mut self, periods: u64) {
        let periods = u32::try_from(periods).unwrap_or(u32::MAX);
        let skipped = self
            .period
            .checked_mul(periods)
            .unwrap_or(Duration::from_secs(100 * 365 * 24 * 3600));
        self.next = after(self.next, skipped);
    }

    /// Changes the period; it applies from the next tick on: the next deadline becomes the
    /// last tick's deadline plus the new period (or stays as it is before the first tick).
    pub(crate) fn set_period(&mut self, period: Duration) {
        self.period = period.max(MIN_PERIOD);
        if let Some(last) = self.last {
            self.next = after(last, self.period);
        }
    }
}

/// A small xorshift generator (tick and restart jitter; not for anything secret), seeded from
/// std's random hasher keys.
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn seeded() -> Self {
        Jitter(RandomState::new().hash_one(Instant::now()) | 1)
    }

    /// A number in `[0, 1)`.
    pub(crate) fn next(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `t + d`, or a point so far away it never comes when that overflows.
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(t)
}

/// The period of a rate in Hz, or `None` when the rate is not a positive finite number.
pub(crate) fn period_of(hz: f64) -> Option<Duration> {
    if !(hz > 0.0 && hz.is_finite()) {
        return None;
    }
    Duration::try_from_secs_f64(1.0 / hz)
        .ok()
        .map(|p| p.max(MIN_PERIOD))
}

/// Sends `make()` to `actor` every `period`, first after one period, on deadlines that do not
/// drift (late timers skip, they do not burst). Ends when the actor is gone or the handle is
/// aborted. A period too long to represent never fires.
pub(crate) fn spawn_ticker<M, F>(
    actor: ActorRef<M>,
    period: Duration,
    make: F,
) -> tokio::task::JoinHandle<()>
where
    M: Message,
    F: Fn() -> M + Send + 'static,
{
    tokio::spawn(async move {
        let period = period.max(MIN_PERIOD);
        let mut next = match tokio::time::Instant::now().checked_add(period) {
            Some(t) => t,
            None => return std::future::pending().await,
        };
        loop {
            tokio::time::sleep_until(next).await;
            if actor.send_message(make()).is_err() {
                return;
            }
            let now = tokio::time::Instant::now();
            next = match next.checked_add(period) {
                Some(t) => t,
                None => return std::future::pending().await,
            };
            while next <= now {
                next = match next.checked_add(period) {
                    Some(t) => t,
                    None => return std::future::pending().await,
                };
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn on_time_ticks_do_not_drift() {
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, 10 * MS);
        assert_eq!(d.next(), t0);
        // Each tick runs a little late; the schedule stays on t0 + k * 10 ms.
        for k in 1..=5u32 {
            let ran_at = d.next() + 3 * MS;
            assert_eq!(d.advance(ran_at, 0.0), 0);
            assert_eq!(d.next(), t0 + k * 10 * MS);
        }
    }

    #[test]
    fn overruns_skip_and_count_missed_periods() {
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, 10 * MS);
        // The tick at t0 finished at t0 + 35 ms: the periods from 10 and 20 are over (missed);
        // the one from 30 is in progress, and its tick runs in what is left of it.
        assert_eq!(d.advance(t0 + 35 * MS, 0.0), 2);
        assert_eq!(d.next(), t0 + 35 * MS);
        // Finishing exactly on a deadline misses only the period that ended there.
        assert_eq!(d.advance(t0 + 50 * MS, 0.0), 1);
        assert_eq!(d.next(), t0 + 50 * MS);
        // A tick late in its period that runs past the next deadline misses nothing: the next
        // tick runs at its random share of the rest of its period.
        assert_eq!(d.advance(t0 + 50 * MS, 0.95), 0);
        assert_eq!(d.next(), t0 + 69_500 * MS / 1000);
        assert_eq!(d.advance(t0 + 72 * MS, 0.5), 0);
        assert_eq!(d.next(), t0 + 76 * MS);
    }

    #[test]
    fn skipped_periods_move_the_next_tick_and_are_not_missed() {
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, 10 * MS);
        assert_eq!(d.advance(t0 + MS, 0.5), 0);
        assert_eq!(d.next(), t0 + 15 * MS);
        d.skip(3);
        assert_eq!(d.next(), t0 + 45 * MS);
        // On time for the tick after the skip: nothing missed.
        assert_eq!(d.advance(t0 + 46 * MS, 0.0), 0);
        assert_eq!(d.next(), t0 + 50 * MS);
    }

    #[test]
    fn rate_change_applies_from_the_last_deadline() {
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, 10 * MS);
        d.set_period(20 * MS);
        assert_eq!(
            d.next(),
            t0,
            "before the first tick the first deadline stays"
        );
        d.advance(t0 + MS, 0.0);
        assert_eq!(d.next(), t0 + 20 * MS);
        d.set_period(5 * MS);
        assert_eq!(d.next(), t0 + 5 * MS);
        assert_eq!(d.period(), 5 * MS);
    }

    #[test]
    fn each_tick_runs_at_its_random_point_of_its_period() {
        let t0 = Instant::now();
        let mut d = Deadlines::new(t0, 10 * MS);
        assert_eq!(d.advance(t0, 0.25), 0);
        assert_eq!(d.next(), t0 + 12_500 * MS / 1000);
        // Ran late within its period: nothing missed, the grid holds.
        assert_eq!(d.advance(t0 + 19 * MS, 0.9), 0);
        assert_eq!(d.next(), t0 + 29 * MS);
        // A rate change keeps the offset's share of the new period (from the last deadline).
        d.set_period(20 * MS);
        assert_eq!(d.next(), t0 + 48 * MS);
        // Out of range: at the deadline.
        assert_eq!(d.advance(t0 + 48 * MS, 1.0), 0);
        assert_eq!(d.next(), t0 + 50 * MS);
        assert_eq!(d.advance(t0 + 51 * MS, f64::NAN), 0);
        assert_eq!(d.next(), t0 + 70 * MS);
    }

    #[test]
    fn jitter_covers_the_unit_interval_evenly() {
        // 10,000 draws in 10 bins: each holds 1,000 on average, sd about 30; 850-1150 is
        // five standard deviations.
        let mut j = Jitter::seeded();
        let mut bins = [0u32; 10];
        for _ in 0..10_000 {
            let x = j.next();
            assert!((0.0..1.0).contains(&x));
            bins[(x * 10.0) as usize] += 1;
        }
        assert!(bins.iter().all(|&n| (850..=1150).contains(&n)), "{bins:?}");
    }

    #[test]
    fn periods_of_rates() {
        assert_eq!(period_of(100.0), Some(10 * MS));
        assert_eq!(period_of(0.0), None);
        assert_eq!(period_of(-1.0), None);
        assert_eq!(period_of(f64::NAN), None);
        assert_eq!(period_of(f64::INFINITY), None);
        assert_eq!(period_of(1e12), Some(MIN_PERIOD));
    }
}
