//! Which watched threads ran, from the kernel's log of context switches (one
//! [`SwitchRing`] per online CPU), so that a check of an idle thread costs no syscall.
//!
//! Contract. [`start`] opens the log once per pyfleet process (it needs `CAP_PERFMON`: without
//! it nothing changes and the run watch reads schedstat as before). A thread is tracked while
//! some watch [registers](Switches::register) it, by the times of the latest switch in and the
//! latest switch out seen for it. It is known to be out (not running) when the latest out is
//! later than the latest in, running when the latest in is later; with neither seen (it has
//! not run since it was registered), or after the kernel dropped records, it is unknown until
//! a check proves by other means that it had not run ([`Switches::settle`]); the caller then
//! asks schedstat.
//!
//! Why it holds. A thread runs on one CPU at a time, from a switch in to a switch out on that
//! CPU, and both records go to that CPU's ring in that order; rings are drained one after the
//! other, so a drain may see a switch in on one CPU before the switch out it followed on
//! another, but never a run's switch out without its switch in. Comparing the latest times
//! (not the order records were read in) therefore never calls a running thread out: "out"
//! means its last run seen ended, and a run after it is logged with a later time and seen by
//! a later drain. If the set of online CPUs changes, switches on a CPU without a ring would
//! go unseen: the log then stops for good.
//!
//! A drain less than [`DRAIN_REUSE`] old may be reused (one drain serves the many processes
//! checked one after the other in a tick): what a check then finds is the state at that
//! drain, so a sample kept on it is the stack of that instant. That holds only if the
//! process was not read after the drain (its memory would be newer than the state): a
//! watch whose process was read asks for a fresh drain at its next check.

use crate::memory::switch_ring::{cpu_list, online_cpus, Switch, SwitchRing};
use rustc_hash::FxHashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How old a drain a check may use without draining again.
const DRAIN_REUSE: Duration = Duration::from_micros(500);

/// How often the set of online CPUs is checked.
const CPU_CHECK: Duration = Duration::from_secs(1);

/// The log, once [`start`]ed and only if it could be opened.
static LOG: OnceLock<Option<Mutex<Switches>>> = OnceLock::new();

/// Opens the log (once; later calls do nothing). Returns whether it is running.
pub fn start() -> bool {
    LOG.get_or_init(|| Switches::open().map(Mutex::new))
        .is_some()
}

/// Runs `f` on the log, if it was started (whether it still runs or not: registrations are
/// kept either way).
pub fn with<T>(f: impl FnOnce(&mut Switches) -> T) -> Option<T> {
    let log = LOG.get()?.as_ref()?;
    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
    Some(f(&mut log))
}

/// Whether the log was started and still runs.
pub fn running() -> bool {
    with(|l| l.running()).unwrap_or(false)
}

/// The log, locked, if it was started and still runs.
pub fn lock() -> Option<MutexGuard<'static, Switches>> {
    let log = LOG.get()?.as_ref()?;
    let log = log.lock().unwrap_or_else(PoisonError::into_inner);
    log.running().then_some(log)
}

/// A tracked thread's state: running or not, and the time of its latest switch in (any run
/// after it changes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub running: bool,
    pub since: u64,
}

#[derive(Default)]
struct Tracked {
    users: u32,
    /// Times of the latest switch in and out seen (0: none).
    last_in: u64,
    last_out: u64,
}

/// The log; see the module documentation.
pub struct Switches {
    rings: Vec<SwitchRing>,
    online: String,
    checked_cpus: Instant,
    stopped: bool,
    drains: u64,
    last_drain: Instant,
    tids: FxHashMap<i32, Tracked>,
    scratch: Vec<Switch>,
}

impl Switches {
    fn open() -> Option<Switches> {
        let online = online_cpus()?;
        let mut rings = Vec::new();
        for cpu in cpu_list(&online)? {
            match SwitchRing::open(cpu) {
                Ok(r) => rings.push(r),
                Err(e) => {
                    tracing::debug!("no context-switch log ({e}): idle checks read schedstat");
                    return None;
                }
            }
        }
        Some(Switches::with_rings(rings, online, Instant::now()))
    }

    /// A log over `rings` (of the CPUs listed in `online`) that has drained nothing yet.
    fn with_rings(rings: Vec<SwitchRing>, online: String, now: Instant) -> Switches {
        Switches {
            rings,
            online,
            checked_cpus: now,
            stopped: false,
            drains: 0,
            last_drain: now,
            tids: FxHashMap::default(),
            scratch: Vec::new(),
        }
    }

    fn running(&self) -> bool {
        !self.stopped
    }

    /// Tracks `tid` (counted: as many [`unregister`](Self::unregister)s as registrations).
    pub fn register(&mut self, tid: i32) {
        self.tids.entry(tid).or_default().users += 1;
    }

    pub fn unregister(&mut self, tid: i32) {
        if let Some(t) = self.tids.get_mut(&tid) {
            t.users = t.users.saturating_sub(1);
            if t.users == 0 {
                self.tids.remove(&tid);
            }
        }
    }

    /// Reads what the kernel logged since the last drain, at `now` (the caller's clock: a
    /// check reads it anyway), unless the last drain is less than [`DRAIN_REUSE`] old and
    /// `fresh` is not asked for (see the module documentation); returns the number of the
    /// drain the log's state is from.
    pub fn drain(&mut self, now: Instant, fresh: bool) -> u64 {
        if !fresh && self.drains > 0 && now.saturating_duration_since(self.last_drain) < DRAIN_REUSE
        {
            return self.drains;
        }
        self.drains += 1;
        self.last_drain = now;
        if now.saturating_duration_since(self.checked_cpus) >= CPU_CHECK {
            self.checked_cpus = now;
            if online_cpus().as_deref() != Some(self.online.as_str()) {
                tracing::warn!("the online CPUs changed: context-switch log stopped");
                self.stopped = true;
                self.forget_all();
                return self.drains;
            }
        }
        let mut records = std::mem::take(&mut self.scratch);
        records.clear();
        for ring in &mut self.rings {
            ring.drain(&mut records);
        }
        self.apply(&records);
        self.scratch = records;
        self.drains
    }

    /// Takes one drain's records into the tracked threads' latest times.
    fn apply(&mut self, records: &[Switch]) {
        for r in records {
            match *r {
                Switch::In { tid, time } => {
                    if let Some(t) = self.tids.get_mut(&tid) {
                        t.last_in = t.last_in.max(time);
                    }
                }
                Switch::Out { tid, time } => {
                    if let Some(t) = self.tids.get_mut(&tid) {
                        t.last_out = t.last_out.max(time);
                    }
                }
                Switch::Lost => self.forget_all(),
            }
        }
    }

    /// What the log knows of `tid` as of the last drain.
    pub fn state(&self, tid: i32) -> Option<State> {
        let t = self.tids.get(&tid)?;
        if t.last_in == 0 && t.last_out == 0 {
            return None;
        }
        Some(State {
            running: t.last_in >= t.last_out,
            since: t.last_in,
        })
    }

    /// `tid` was proved (by schedstat, after the last drain began) not to have run since
    /// before that drain: if the log has seen nothing of it, it is out from now on.
    pub fn settle(&mut self, tid: i32) {
        if let Some(t) = self.tids.get_mut(&tid) {
            if t.last_in == 0 && t.last_out == 0 {
                t.last_out = 1;
            }
        }
    }

    fn forget_all(&mut self) {
        for t in self.tids.values_mut() {
            t.last_in = 0;
            t.last_out = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without rings: what the latest times say, whatever order the rings were read in.
    #[test]
    fn the_latest_switch_says_whether_a_thread_runs() {
        let mut s = Switches::with_rings(Vec::new(), String::new(), Instant::now());
        let (i, o) = (
            |time| Switch::In { tid: 7, time },
            |time| Switch::Out { tid: 7, time },
        );
        s.register(7);
        s.apply(&[Switch::In { tid: 8, time: 5 }]);
        assert_eq!(s.state(7), None, "unknown until named or settled");
        s.settle(7);
        let out = s.state(7).unwrap();
        assert!(!out.running);
        // Others' switches change nothing.
        s.apply(&[Switch::Out { tid: 9, time: 6 }]);
        assert_eq!(s.state(7), Some(out));
        // It ran 10-20 on one CPU, then came in at 30 on another; the second ring was read
        // first: running, since 30.
        s.apply(&[i(30), i(10), o(20)]);
        assert_eq!(
            s.state(7),
            Some(State {
                running: true,
                since: 30
            })
        );
        // Its switch out at 40 comes with the next drain.
        s.apply(&[o(40)]);
        assert_eq!(
            s.state(7),
            Some(State {
                running: false,
                since: 30
            })
        );
        // A later run, in and out within one drain: out again, but since a later time.
        s.apply(&[o(60), i(50)]);
        assert_eq!(
            s.state(7),
            Some(State {
                running: false,
                since: 50
            })
        );
        // Settling does not override what the log saw.
        s.apply(&[i(70)]);
        s.settle(7);
        assert!(s.state(7).unwrap().running);
        // Lost records: unknown.
        s.apply(&[Switch::Lost]);
        assert_eq!(s.state(7), None);
        s.unregister(7);
        assert!(s.tids.is_empty());
    }

    /// A recent drain serves the next checks, unless a check asks for a fresh one (its
    /// process was read since); an old one never does.
    #[test]
    fn a_recent_drain_is_reused_unless_a_fresh_one_is_asked_for() {
        let t0 = Instant::now();
        let mut s = Switches::with_rings(Vec::new(), String::new(), t0);
        let first = s.drain(t0, false);
        assert_eq!(first, 1, "the first check always drains");
        let soon = t0 + DRAIN_REUSE / 2;
        assert_eq!(s.drain(soon, false), first);
        let fresh = s.drain(soon, true);
        assert_eq!(fresh, first + 1);
        assert_eq!(s.drain(soon + DRAIN_REUSE, false), fresh + 1);
    }
}
