//! Wall mode from the kernel capture: a thread's samples on its CPU and off it, each kind at
//! the sampling rate, so that its share of the samples is its share of the time.
//!
//! On its CPU a thread is sampled by the capture's interrupts, at the rate per CPU second:
//! each chain copied there is one sample, as in cpu mode. Off its CPU its stack cannot change,
//! and the kernel told which it left with (copied as it was switched out, or unchanged since
//! the last chain sent for it): its time off the CPU, from the switch-out to the switch-in
//! (or to now, while it stays off), counts at the rate in that stack, a fraction carried to
//! the next count. A thread learnt by a read of its process and not heard of since counts as
//! off its CPU since then, in the stack the read found; a chain copied at an interrupt of a
//! thread counted off its CPU ends that (its switch-in came before the capture watched it).
//! A stretch off the CPU whose stack could not be copied counts as failed samples.
//!
//! Times are the kernel's `CLOCK_MONOTONIC` nanoseconds (the records', and [`now_ns`]). A
//! stretch off the CPU goes out as one entry standing for its samples
//! (`SampledThread::samples`). Pure but for [`now_ns`]: fed by the capturing source, one call
//! per record, oldest first.

use pyfleet_actors::SampledThread;
use rustc_hash::FxHashMap;

/// Most threads followed per process (the capture watches no more).
pub const MAX_THREADS: usize = 16384;

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock of the capture's records).
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

/// How a thread left its CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchedOut {
    /// With this stack (None: the copy failed).
    With(Option<SampledThread>),
    /// With the stack of the last chain sent for it.
    Unchanged,
}

#[derive(Debug, Default)]
struct Thread {
    /// Its newest stack known.
    last: Option<SampledThread>,
    /// While it is off its CPU: the stack it is off in (None: not known), and up to when that
    /// time has been counted.
    off: Option<(Option<SampledThread>, u64)>,
    /// Samples owed below one.
    carry: f64,
}

/// The samples of one process's threads (see the module documentation).
#[derive(Debug)]
pub struct WallTime {
    rate_hz: f64,
    threads: FxHashMap<u32, Thread>,
}

impl WallTime {
    pub fn new(rate_hz: f64) -> WallTime {
        WallTime {
            rate_hz: rate_hz.max(0.0),
            threads: FxHashMap::default(),
        }
    }

    /// Thread `tid` was read at `at_ns` with `stack`: off its CPU since then, unless it was
    /// heard of before.
    pub fn learnt(&mut self, tid: u32, stack: SampledThread, at_ns: u64) {
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&tid) {
            return;
        }
        self.threads.entry(tid).or_insert_with(|| Thread {
            last: Some(stack.clone()),
            off: Some((Some(stack), at_ns)),
            carry: 0.0,
        });
    }

    /// Forgets the threads `keep` does not keep.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.threads.retain(|&tid, _| keep(tid));
    }

    /// A chain copied at an interrupt of `tid` at `at_ns`: one sample of `stack` into `out`
    /// (None: the copy failed, a failed sample). Returns the failed samples.
    pub fn on_cpu(
        &mut self,
        tid: u32,
        at_ns: u64,
        stack: Option<SampledThread>,
        out: &mut Vec<SampledThread>,
    ) -> u64 {
        let rate = self.rate_hz;
        let t = self.threads.entry(tid).or_default();
        let mut failed = count_off(t, rate, at_ns, out);
        t.off = None;
        match stack {
            Some(s) => {
                t.last = Some(s.clone());
                out.push(s);
            }
            None => failed += 1,
        }
        failed
    }

    /// `tid` left its CPU at `at_ns`.
    pub fn switched_out(&mut self, tid: u32, at_ns: u64, how: SwitchedOut) {
        let t = self.threads.entry(tid).or_default();
        let stack = match how {
            SwitchedOut::With(s) => s,
            SwitchedOut::Unchanged => t.last.clone(),
        };
        if stack.is_some() {
            t.last.clone_from(&stack);
        }
        t.off = Some((stack, at_ns));
    }

    /// `tid` was switched in at `at_ns`: its time off the CPU is counted into `out`. Returns
    /// the failed samples.
    pub fn switched_in(&mut self, tid: u32, at_ns: u64, out: &mut Vec<SampledThread>) -> u64 {
        let rate = self.rate_hz;
        let Some(t) = self.threads.get_mut(&tid) else {
            return 0;
        };
        let failed = count_off(t, rate, at_ns, out);
        t.off = None;
        failed
    }

    /// Counts every thread's time off its CPU up to `now_ns` into `out`. Returns the failed
    /// samples.
    pub fn until(&mut self, now_ns: u64, out: &mut Vec<SampledThread>) -> u64 {
        let rate = self.rate_hz;
        self.threads
            .values_mut()
            .map(|t| count_off(t, rate, now_ns, out))
            .sum()
    }
}

/// Counts `t`'s time off its CPU up to `to_ns`, if it is off, at `rate` samples a second.
fn count_off(t: &mut Thread, rate: f64, to_ns: u64, out: &mut Vec<SampledThread>) -> u64 {
    let Some((stack, from)) = t.off.as_mut() else {
        return 0;
    };
    let span = to_ns.saturating_sub(*from);
    *from = (*from).max(to_ns);
    let owed = span as f64 * rate / 1e9 + t.carry;
    let whole = owed.floor();
    t.carry = owed - whole;
    let n = whole as u64;
    match stack {
        // One entry standing for them all.
        Some(s) if n > 0 => {
            out.push(SampledThread {
                samples: u32::try_from(n).unwrap_or(u32::MAX),
                ..s.clone()
            });
            0
        }
        Some(_) => 0,
        None => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::ThreadStatus;

    const MS: u64 = 1_000_000;

    fn stack(id: u64) -> SampledThread {
        SampledThread {
            thread_id: 1,
            status: ThreadStatus::default(),
            stack: id,
            samples: 1,
        }
    }

    fn count(out: &[SampledThread], id: u64) -> usize {
        out.iter()
            .filter(|s| s.stack == id)
            .map(|s| s.samples as usize)
            .sum()
    }

    #[test]
    fn time_off_the_cpu_counts_at_the_rate_in_the_stack_left_with() {
        let mut w = WallTime::new(100.0);
        let mut out = Vec::new();
        // On its CPU: one sample per interrupt.
        assert_eq!(w.on_cpu(7, 0, Some(stack(1)), &mut out), 0);
        // Off 35 ms in stack 2, then back: 3.5 samples (3, half carried).
        w.switched_out(7, 10 * MS, SwitchedOut::With(Some(stack(2))));
        assert_eq!(w.switched_in(7, 45 * MS, &mut out), 0);
        assert_eq!((count(&out, 1), count(&out, 2)), (1, 3));
        // Off again, unchanged (stack 2 again), counted up to now while it stays off.
        w.switched_out(7, 50 * MS, SwitchedOut::Unchanged);
        assert_eq!(w.until(65 * MS, &mut out), 0);
        assert_eq!(count(&out, 2), 5); // 1.5 + the carried half
        assert_eq!(w.until(65 * MS, &mut out), 0);
        assert_eq!(count(&out, 2), 5);
        assert_eq!(w.switched_in(7, 75 * MS, &mut out), 0);
        assert_eq!(count(&out, 2), 6);
        // Nothing counts while it runs.
        assert_eq!(w.until(500 * MS, &mut out), 0);
        assert_eq!(count(&out, 1) + count(&out, 2), 7);
    }

    #[test]
    fn an_unknown_stack_off_the_cpu_is_failed_samples_and_a_read_thread_is_off_since() {
        let mut w = WallTime::new(100.0);
        let mut out = Vec::new();
        w.switched_out(3, 0, SwitchedOut::With(None));
        assert_eq!(w.switched_in(3, 50 * MS, &mut out), 5);
        assert!(out.is_empty());
        // Learnt by a read at 100 ms, asleep: counted from then in the stack read.
        w.learnt(4, stack(9), 100 * MS);
        w.learnt(4, stack(8), 120 * MS); // known already: kept as it was
        assert_eq!(w.until(200 * MS, &mut out), 0);
        assert_eq!(count(&out, 9), 10);
        // An interrupt of it: it was running (switched in before it was watched).
        assert_eq!(w.on_cpu(4, 210 * MS, Some(stack(5)), &mut out), 0);
        assert_eq!((count(&out, 9), count(&out, 5)), (11, 1));
        assert_eq!(w.until(400 * MS, &mut out), 0);
        assert_eq!(count(&out, 9) + count(&out, 5), 12);
        // Forgotten threads count no more.
        w.switched_out(4, 400 * MS, SwitchedOut::Unchanged);
        w.retain(|tid| tid != 4);
        assert_eq!(w.until(900 * MS, &mut out), 0);
        assert_eq!(count(&out, 9) + count(&out, 5), 12);
    }
}
