//! cpu mode with reads: which of a thread's samples count, so that they follow the CPU it
//! used rather than the time it was runnable.
//!
//! A read sample finds a thread in state `R`: running, or runnable and waiting for a CPU. On a
//! saturated host most such threads wait, and counting each would make waiting look hot. So
//! each thread earns credit from the CPU it used since its last check (its schedstat run time,
//! `/proc/PID/task/TID/schedstat`, in units of the process's sampling interval), and a sample
//! counts when the thread is in state `R` and holds a whole interval's credit, which it then
//! spends. Over a run a thread's counted samples add up to its CPU time divided by the
//! sampling interval (less what [`MAX_CREDIT`] cuts off), and each counted stack is one the
//! thread was in while it held or wanted a CPU.
//!
//! A thread checked for the first time, or before the process has an interval, counts by its
//! state alone; so does one past [`MAX_TRACKED`] and one whose schedstat cannot be read
//! (gone, or a kernel without `CONFIG_SCHED_INFO`). Pure: the caller reads the run times.

use std::time::{Duration, Instant};

/// Most threads of one process whose credit is kept.
pub const MAX_TRACKED: usize = 1024;

/// Most credit a thread holds, in intervals: a thread that ran while it was not in state `R`
/// at the ticks (short bursts between them) spends it at the next ticks it is, one a tick; more
/// than this is dropped rather than counted in a burst.
pub const MAX_CREDIT: f64 = 4.0;

/// Shortest time between two samples taken as the sampling interval: a sample taken right
/// after another (in the same tick) says nothing of the interval.
pub const MIN_INTERVAL: Duration = Duration::from_micros(200);

/// One thread's credit, in sampling intervals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Credit {
    held: f64,
}

impl Credit {
    /// The thread ran `ran_ns` since its last check; the process is sampled every
    /// `interval_ns`.
    pub fn earn(&mut self, ran_ns: u64, interval_ns: u64) {
        if interval_ns == 0 {
            return;
        }
        self.held = (self.held + ran_ns as f64 / interval_ns as f64).min(MAX_CREDIT);
    }

    /// Whether a sample of the thread, in state `R` or not (`runnable`), counts; a counted one
    /// spends an interval's credit. A small margin below one keeps a thread that ran the
    /// whole interval from missing a tick to rounding (the interval and its run time are
    /// measured a moment apart).
    pub fn spend(&mut self, runnable: bool) -> bool {
        if !runnable || self.held < 0.95 {
            return false;
        }
        self.held = (self.held - 1.0).max(0.0);
        true
    }
}

/// The credit of a process's threads (see the module documentation).
#[derive(Debug, Default)]
pub struct CpuShare {
    /// (thread id, its run time at its last check, its credit).
    threads: Vec<(i32, u64, Credit)>,
    /// When the process's last sample began, and the time between its last two (ns): a
    /// time under a quarter of the interval, or under [`MIN_INTERVAL`], is not taken.
    last_sample_at: Option<Instant>,
    interval_ns: Option<u64>,
}

impl CpuShare {
    /// A sample of the process begins, at `now`.
    pub fn sample_began(&mut self, now: Instant) {
        let Some(last) = self.last_sample_at else {
            self.last_sample_at = Some(now);
            return;
        };
        let ns = u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
        let floor = self
            .interval_ns
            .map_or(0, |i| i / 4)
            .max(MIN_INTERVAL.as_nanos() as u64);
        if ns >= floor {
            self.interval_ns = Some(ns);
            self.last_sample_at = Some(now);
        }
    }

    /// Whether the sample of thread `tid` taken now counts in cpu mode. `runnable`: the
    /// thread is in state `R` now; `run_ns`: its schedstat run time now, if read.
    pub fn counts(&mut self, tid: i32, runnable: bool, run_ns: Option<u64>) -> bool {
        let interval_ns = self.interval_ns;
        // Not in state R: it does not count, and its run time since counts at its next
        // check (no read now).
        if !runnable {
            return false;
        }
        let i = self.threads.iter().position(|t| t.0 == tid);
        let (Some(run_ns), Some(interval_ns)) = (run_ns, interval_ns) else {
            if let Some(i) = i {
                self.threads.swap_remove(i);
            }
            return runnable;
        };
        match i {
            Some(i) => {
                let (_, last, credit) = &mut self.threads[i];
                credit.earn(run_ns.saturating_sub(*last), interval_ns);
                *last = run_ns;
                credit.spend(runnable)
            }
            None => {
                if self.threads.len() < MAX_TRACKED {
                    self.threads.push((tid, run_ns, Credit::default()));
                }
                runnable
            }
        }
    }

    /// Forgets the threads `alive` says are gone.
    pub fn retain(&mut self, alive: impl Fn(i32) -> bool) {
        self.threads.retain(|t| alive(t.0));
    }
}

/// A thread's run time (ns) from its schedstat, read now.
pub fn run_ns(pid: i32, tid: i32) -> Option<u64> {
    parse_run_ns(&std::fs::read(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?)
}

/// The run time (ns) from the contents of a schedstat file: its first field.
pub fn parse_run_ns(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text)
        .ok()?
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_thread_that_runs_all_the_time_counts_every_tick() {
        let mut c = Credit::default();
        for _ in 0..100 {
            c.earn(10 * MS, 10 * MS);
            assert!(c.spend(true));
        }
    }

    #[test]
    fn a_runnable_thread_that_gets_a_quarter_of_a_cpu_counts_one_tick_in_four() {
        let mut c = Credit::default();
        let counted = (0..400)
            .filter(|_| {
                c.earn(2_500_000, 10 * MS);
                c.spend(true)
            })
            .count();
        assert!((99..=101).contains(&counted), "{counted}");
    }

    #[test]
    fn cpu_used_between_ticks_counts_at_the_next_runnable_ones() {
        // Half of each interval on a CPU, in state R at every other tick only.
        let mut c = Credit::default();
        let counted = (0..400)
            .filter(|i| {
                c.earn(5 * MS, 10 * MS);
                c.spend(i % 2 == 0)
            })
            .count();
        assert!((198..=201).contains(&counted), "{counted}");
        // Never runnable at a tick: nothing counts, and the credit stays bounded.
        let mut c = Credit::default();
        assert!((0..100).all(|_| {
            c.earn(10 * MS, 10 * MS);
            !c.spend(false)
        }));
        assert!(c.held <= MAX_CREDIT);
        // Its next runnable ticks spend at most the bound.
        let burst = (0..10).filter(|_| c.spend(true)).count();
        assert_eq!(burst, MAX_CREDIT as usize);
    }

    #[test]
    fn a_thread_counts_by_its_state_until_it_has_an_interval() {
        let mut share = CpuShare::default();
        let t0 = Instant::now();
        share.sample_began(t0);
        assert!(share.counts(7, true, Some(0)));
        // Samples 10 ms apart; one 1 ms after another does not change the interval.
        share.sample_began(t0 + Duration::from_millis(10));
        share.sample_began(t0 + Duration::from_millis(11));
        assert_eq!(share.interval_ns, Some(10 * MS));
        assert!(!share.counts(7, false, Some(0)));
        // First check: its state; then its credit (a quarter of a CPU: one in four).
        assert!(share.counts(8, true, Some(0)));
        let counted = (1..=8)
            .filter(|k| share.counts(8, true, Some(k * 2_500_000)))
            .count();
        assert_eq!(counted, 2);
        // Without a reading of its run time: its state again.
        assert!(share.counts(8, true, None));
    }

    #[test]
    fn reads_this_threads_run_time() {
        let tid = unsafe_free_gettid();
        let pid = std::process::id() as i32;
        let Some(first) = run_ns(pid, tid) else {
            eprintln!("this kernel keeps no schedstat counts");
            return;
        };
        let spin = std::time::Instant::now();
        while spin.elapsed().as_millis() < 20 {
            std::hint::black_box(0u64);
        }
        let second = run_ns(pid, tid).expect("schedstat");
        assert!(second > first, "{first} -> {second}");
        assert_eq!(parse_run_ns(b"282385 0 3\n"), Some(282385));
        assert_eq!(parse_run_ns(b"x 0 3\n"), None);
    }

    /// This thread's id, from procfs.
    fn unsafe_free_gettid() -> i32 {
        std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .expect("/proc/thread-self")
    }
}
