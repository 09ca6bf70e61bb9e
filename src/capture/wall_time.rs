//! Wall and gil modes from the kernel capture: a thread's samples on its CPU and off it, each
//! kind at the sampling rate, so that its share of the samples is its share of the time.
//!
//! On its CPU a thread is sampled by the capture's interrupts, at the rate per CPU second:
//! each chain copied there is one sample, as in cpu mode. Off its CPU its stack cannot change,
//! and the kernel told which it left with (copied as it was switched out, or unchanged since
//! the last chain it sent as the thread left its CPU; interrupts' chains do not count): its
//! time off the CPU, from the switch-out to the switch-in, counts at the rate in that stack, a
//! fraction carried to the next count. The switch-in is told by the thread's next record (each
//! carries its last switch-in), which comes within a sampling period or so of its CPU time (an
//! interrupt on its CPU, or its next switch-out): a stretch not ended by a record yet counts
//! only up to [`WallTime::settle_ns`] before now, the rest once a record ends it or that time
//! has passed. A thread learnt by a read of its process and not heard of since counts as off its
//! CPU since then, in the stack the read found. A record that does not tell a switch-in after the
//! stretch began (not known) ends it at its own time. A stretch off the CPU whose stack could not
//! be copied or decoded counts as failed samples, and so does one unchanged from a chain copied but
//! not decoded (see [`Chain`]: one the kernel could not copy leaves its last chain as it was).
//!
//! gil mode (`gil_holder_only`): only time the thread held the GIL counts, samples and
//! failures alike; each record says whether it held it (a thread cannot take or drop the GIL
//! off its CPU, so a stretch off it is held or not throughout, as its switch-out said).
//!
//! Times are the kernel's `CLOCK_MONOTONIC` nanoseconds (the records', and [`now_ns`]). A
//! stretch off the CPU goes out as one entry standing for its samples
//! (`SampledThread::samples`). Pure but for [`now_ns`]: fed by the capturing source, one call
//! per record, oldest first.

use pyfleet_actors::SampledThread;
use rustc_hash::FxHashMap;

/// Most threads followed per process (the capture watches no more).
pub const MAX_THREADS: usize = 16384;

/// Sampling periods a record of a switched-in thread may take to come (see the module
/// documentation), and the least time.
const SETTLE_PERIODS: f64 = 3.0;
const MIN_SETTLE_NS: u64 = 20_000_000;

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock of the capture's records).
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

/// What a record tells of its thread besides its stack: which, when, its last switch-in (0:
/// not known), whether it held the GIL and whether it left its CPU to wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub tid: u32,
    pub at_ns: u64,
    pub switched_in_ns: u64,
    pub holds_gil: bool,
    pub waits_gil: bool,
}

/// A record's chain, as far as it went. The kernel takes a chain it sent at a switch-out as the
/// thread's last (what a later switch-out is unchanged from) whether pyfleet decodes it or
/// not, and keeps the one before when it could not copy one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chain {
    /// Copied and decoded.
    Stack(SampledThread),
    /// Copied, not decoded (a failed sample).
    Undecoded,
    /// Not copied (a failed sample).
    NotCopied,
}

impl Chain {
    fn stack(&self) -> Option<&SampledThread> {
        match self {
            Chain::Stack(s) => Some(s),
            _ => None,
        }
    }
}

/// How a thread left its CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchedOut {
    /// With this chain.
    With(Chain),
    /// With the last chain sent as it left its CPU.
    Unchanged,
}

#[derive(Debug, Default)]
struct Thread {
    /// The stack of the last chain the kernel sent as it left its CPU (None: not decoded, or
    /// none sent).
    last: Option<SampledThread>,
    /// While it is off its CPU: the stack it is off in (None: not known), up to when that
    /// time has been counted, and whether it counts (see `gil_holder_only`).
    off: Option<Off>,
    /// Samples owed below one.
    carry: f64,
}

#[derive(Debug)]
struct Off {
    stack: Option<SampledThread>,
    /// When it left its CPU (or was read off it), and up to when its time has been counted.
    since_ns: u64,
    counted_ns: u64,
    counts: bool,
}

/// The samples of one process's threads (see the module documentation).
#[derive(Debug)]
pub struct WallTime {
    rate_hz: f64,
    gil_holder_only: bool,
    settle_ns: u64,
    threads: FxHashMap<u32, Thread>,
}

impl WallTime {
    pub fn new(rate_hz: f64, gil_holder_only: bool) -> WallTime {
        let rate_hz = rate_hz.max(0.0);
        let period_ns = if rate_hz > 0.0 { 1e9 / rate_hz } else { 0.0 };
        WallTime {
            rate_hz,
            gil_holder_only,
            settle_ns: ((SETTLE_PERIODS * period_ns) as u64).max(MIN_SETTLE_NS),
            threads: FxHashMap::default(),
        }
    }

    /// gil mode: only time holding the GIL counts.
    pub fn gil_holder_only(&self) -> bool {
        self.gil_holder_only
    }

    /// How long before now a stretch off the CPU not ended by a record is counted to.
    pub fn settle_ns(&self) -> u64 {
        self.settle_ns
    }

    /// Whether time of a thread that holds the GIL or not counts.
    fn counts(&self, holds_gil: bool) -> bool {
        holds_gil || !self.gil_holder_only
    }

    /// Thread `tid` was read at `at_ns` with `stack`: off its CPU since then, unless it was
    /// heard of before.
    pub fn learnt(&mut self, tid: u32, stack: SampledThread, at_ns: u64) {
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&tid) {
            return;
        }
        let counts = self.counts(stack.status.holds_gil);
        self.threads.entry(tid).or_insert_with(|| Thread {
            last: Some(stack.clone()),
            off: Some(Off {
                stack: Some(stack),
                since_ns: at_ns,
                counted_ns: at_ns,
                counts,
            }),
            carry: 0.0,
        });
    }

    /// Forgets the threads `keep` does not keep.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.threads.retain(|&tid, _| keep(tid));
    }

    /// A chain of an interrupt of a thread: one sample of its stack into `out` (a failed one,
    /// if it counts, when there is none). Returns the failed samples.
    pub fn on_cpu(&mut self, seen: Seen, chain: Chain, out: &mut Vec<SampledThread>) -> u64 {
        let counts = self.counts(seen.holds_gil);
        let failed = self.back_on(seen, out);
        match chain {
            Chain::Stack(s) => {
                out.push(s);
                failed
            }
            Chain::Undecoded | Chain::NotCopied => failed + u64::from(counts),
        }
    }

    /// A thread left its CPU: the stretch before it ran is counted into `out`. Returns the
    /// failed samples.
    pub fn switched_out(
        &mut self,
        seen: Seen,
        how: SwitchedOut,
        out: &mut Vec<SampledThread>,
    ) -> u64 {
        let counts = self.counts(seen.holds_gil);
        let failed = self.back_on(seen, out);
        let t = self.threads.entry(seen.tid).or_default();
        let stack = match &how {
            SwitchedOut::With(chain) => chain.stack().cloned(),
            SwitchedOut::Unchanged => t.last.clone().map(|mut s| {
                s.status.holds_gil = seen.holds_gil;
                s.status.waits_gil = seen.waits_gil;
                s.status.on_cpu = false;
                s
            }),
        };
        if !matches!(how, SwitchedOut::With(Chain::NotCopied)) {
            t.last.clone_from(&stack);
        }
        t.off = Some(Off {
            stack,
            since_ns: seen.at_ns,
            counted_ns: seen.at_ns,
            counts,
        });
        failed
    }

    /// A record says its thread ran since its last switch-in: its stretch off the CPU, if
    /// one is open, ends there (at the record's time when that is not after the stretch
    /// began).
    fn back_on(&mut self, seen: Seen, out: &mut Vec<SampledThread>) -> u64 {
        let rate = self.rate_hz;
        let Some(t) = self.threads.get_mut(&seen.tid) else {
            return 0;
        };
        let Some(off) = t.off.as_ref() else {
            return 0;
        };
        let end = match seen.switched_in_ns > off.since_ns {
            true => seen.switched_in_ns.min(seen.at_ns),
            false => seen.at_ns,
        };
        let failed = count_off(t, rate, end, out);
        t.off = None;
        failed
    }

    /// Samples a second.
    pub fn rate_hz(&self) -> f64 {
        self.rate_hz
    }

    /// Counts every thread's time off its CPU up to [`settle_ns`](Self::settle_ns) before
    /// `now_ns` into `out`. Returns the failed samples.
    pub fn until(&mut self, now_ns: u64, out: &mut Vec<SampledThread>) -> u64 {
        let rate = self.rate_hz;
        let to_ns = now_ns.saturating_sub(self.settle_ns);
        self.threads
            .values_mut()
            .map(|t| count_off(t, rate, to_ns, out))
            .sum()
    }
}

/// Counts `t`'s time off its CPU up to `to_ns`, if it is off, at `rate` samples a second.
fn count_off(t: &mut Thread, rate: f64, to_ns: u64, out: &mut Vec<SampledThread>) -> u64 {
    let Some(Off {
        stack,
        counted_ns,
        counts,
        ..
    }) = t.off.as_mut()
    else {
        return 0;
    };
    let span = to_ns.saturating_sub(*counted_ns);
    *counted_ns = (*counted_ns).max(to_ns);
    if !*counts {
        return 0;
    }
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
            tid: 1,
            status: ThreadStatus::default(),
            stack: id,
            samples: 1,
        }
    }

    fn seen(tid: u32, at_ns: u64, switched_in_ns: u64, holds_gil: bool) -> Seen {
        Seen {
            tid,
            at_ns,
            switched_in_ns,
            holds_gil,
            waits_gil: false,
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
        use SwitchedOut::*;
        let mut w = WallTime::new(100.0, false);
        assert_eq!(w.settle_ns(), 30 * MS);
        let mut out = Vec::new();
        // On its CPU: one sample per interrupt.
        assert_eq!(
            w.on_cpu(seen(7, 0, 0, false), Chain::Stack(stack(1)), &mut out),
            0
        );
        // Off at 10 ms in stack 2, switched in at 45 ms (told by an interrupt at 50 ms, in
        // stack 3): 3.5 samples (3, half carried).
        w.switched_out(
            seen(7, 10 * MS, 0, false),
            With(Chain::Stack(stack(2))),
            &mut out,
        );
        assert_eq!(
            w.on_cpu(
                seen(7, 50 * MS, 45 * MS, false),
                Chain::Stack(stack(3)),
                &mut out
            ),
            0
        );
        assert_eq!((count(&out, 1), count(&out, 2), count(&out, 3)), (1, 3, 1));
        // Off again, unchanged: from the last chain sent as it left its CPU (stack 2), not
        // the interrupt's since (stack 3). While no record ends it, counted up to 30 ms
        // before now, once.
        w.switched_out(seen(7, 60 * MS, 45 * MS, false), Unchanged, &mut out);
        assert_eq!(w.until(105 * MS, &mut out), 0);
        assert_eq!(count(&out, 2), 5); // 1.5 + the carried half
        assert_eq!(w.until(105 * MS, &mut out), 0);
        assert_eq!(count(&out, 2), 5);
        // Its next switch-out tells it was switched in at 95 ms: counted to there.
        w.switched_out(seen(7, 120 * MS, 95 * MS, false), Unchanged, &mut out);
        assert_eq!(count(&out, 2), 7);
        // A record that tells no switch-in after the stretch began ends it at its own time.
        assert_eq!(
            w.on_cpu(
                seen(7, 150 * MS, 95 * MS, false),
                Chain::Stack(stack(1)),
                &mut out
            ),
            0
        );
        assert_eq!((count(&out, 1), count(&out, 2), count(&out, 3)), (2, 10, 1));
        // Nothing counts while it runs.
        assert_eq!(w.until(900 * MS, &mut out), 0);
        assert_eq!(count(&out, 1) + count(&out, 2) + count(&out, 3), 13);
    }

    #[test]
    fn an_unknown_stack_off_the_cpu_is_failed_samples_and_a_read_thread_is_off_since() {
        use SwitchedOut::*;
        let mut w = WallTime::new(100.0, false);
        let mut out = Vec::new();
        w.switched_out(seen(3, 0, 0, false), With(Chain::NotCopied), &mut out);
        assert_eq!(
            w.on_cpu(
                seen(3, 60 * MS, 50 * MS, false),
                Chain::Stack(stack(6)),
                &mut out
            ),
            5
        );
        assert_eq!(count(&out, 6), 1);
        // Off in stack 7 (20 ms: two samples); a failed copy on the CPU is one failed sample.
        let on = |at, since| seen(3, at * MS, since * MS, false);
        w.switched_out(on(70, 50), With(Chain::Stack(stack(7))), &mut out);
        assert_eq!(w.on_cpu(on(100, 90), Chain::NotCopied, &mut out), 1);
        assert_eq!(count(&out, 7), 2);
        // A switch-out chain the kernel could not copy leaves its last chain as it was: its
        // own stretch is failed samples (10 ms: one), and a switch-out unchanged after it is
        // in stack 7 (20 ms: two samples).
        w.switched_out(on(110, 90), With(Chain::NotCopied), &mut out);
        assert_eq!(w.switched_out(on(130, 120), Unchanged, &mut out), 1);
        assert_eq!(w.on_cpu(on(160, 150), Chain::Stack(stack(6)), &mut out), 0);
        assert_eq!((count(&out, 6), count(&out, 7)), (2, 4));
        // One copied that pyfleet could not decode is its last chain: a switch-out unchanged
        // from it counts failed samples, not the stack before it.
        w.switched_out(on(170, 150), With(Chain::Undecoded), &mut out);
        assert_eq!(w.on_cpu(on(200, 190), Chain::Stack(stack(6)), &mut out), 2);
        w.switched_out(on(210, 190), Unchanged, &mut out);
        assert_eq!(w.on_cpu(on(240, 230), Chain::Stack(stack(6)), &mut out), 2);
        assert_eq!((count(&out, 6), count(&out, 7)), (4, 4));
        // Learnt by a read at 100 ms, asleep: counted from then in the stack read.
        w.learnt(4, stack(9), 100 * MS);
        w.learnt(4, stack(8), 120 * MS); // known already: kept as it was
        assert_eq!(w.until(230 * MS, &mut out), 0);
        assert_eq!(count(&out, 9), 10);
        // An interrupt of it, switched in before the read (it ran then): ends it there.
        assert_eq!(
            w.on_cpu(
                seen(4, 210 * MS, 90 * MS, false),
                Chain::Stack(stack(5)),
                &mut out
            ),
            0
        );
        assert_eq!((count(&out, 9), count(&out, 5)), (11, 1));
        assert_eq!(w.until(400 * MS, &mut out), 0);
        assert_eq!(count(&out, 9) + count(&out, 5), 12);
        // Forgotten threads count no more.
        assert_eq!(
            w.switched_out(seen(4, 400 * MS, 0, false), Unchanged, &mut out),
            0
        );
        w.retain(|tid| tid != 4);
        assert_eq!(w.until(900 * MS, &mut out), 0);
        assert_eq!(count(&out, 9) + count(&out, 5), 12);
    }

    #[test]
    fn gil_mode_counts_only_time_holding_the_gil() {
        use SwitchedOut::*;
        let mut w = WallTime::new(100.0, true);
        let mut out = Vec::new();
        let holding = |id| SampledThread {
            status: ThreadStatus {
                on_cpu: false,
                holds_gil: true,
                waits_gil: false,
            },
            ..stack(id)
        };
        // Off 50 ms holding the GIL (blocked in C without giving it up): 5 samples, counted
        // when its next switch-out tells its switch-in; off again without it: nothing.
        w.switched_out(
            seen(1, 0, 0, true),
            With(Chain::Stack(holding(1))),
            &mut out,
        );
        w.switched_out(seen(1, 60 * MS, 50 * MS, false), Unchanged, &mut out);
        assert_eq!(count(&out, 1), 5);
        // Unchanged but holding it: the last stack, marked as holding it; an unknown stack
        // without it is no failure either.
        w.switched_out(seen(1, 200 * MS, 160 * MS, true), Unchanged, &mut out);
        assert_eq!(count(&out, 1), 5);
        w.switched_out(seen(2, 0, 0, false), With(Chain::NotCopied), &mut out);
        assert_eq!(w.until(260 * MS, &mut out), 0);
        assert_eq!(count(&out, 1), 8);
        assert!(out.iter().all(|s| s.status.holds_gil));
        // A failed copy on the CPU counts only while holding it; a read thread, as read.
        assert_eq!(
            w.on_cpu(seen(3, 0, 0, false), Chain::NotCopied, &mut out),
            0
        );
        assert_eq!(w.on_cpu(seen(3, 1, 0, true), Chain::NotCopied, &mut out), 1);
        w.learnt(4, stack(9), 0);
        w.learnt(5, holding(10), 0);
        assert_eq!(w.until(330 * MS, &mut out), 0);
        assert_eq!((count(&out, 9), count(&out, 10)), (0, 30));
    }
}
