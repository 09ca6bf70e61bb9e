//! One process's link to the shared capture, and the one place that decides what each chain
//! the kernel copied for it becomes: a sample, a stretch off the CPU, or a counted failure
//! (see the room's documentation, `capture`).

use super::shared::{PendingRecord, SharedCapture};
use super::wall_time::{self, Chain, Seen, SwitchedOut, WallTime};
use super::{OffCpu, CAPTURE_FULL_REFRESH, CAPTURE_RECHECK, CAPTURE_RETRY};
use crate::cpython::{self, Unwinder};
use crate::memory::capture_records::{frames_in, CaptureLayout};
use crate::memory::{ProcessMemory, RemoteMemory};
use crate::task_stacks::TaskView;
use pyfleet_actors::{CapturedCounts, SampleError, SampleKind, SampledThread, ThreadStatus};
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most threads a capturing source remembers as not running Python.
const MAX_NOT_PYTHON: usize = 8192;

/// A capturing source's share of the [`SharedCapture`].
pub struct CaptureLink {
    shared: Arc<SharedCapture>,
    pid: u32,
    /// When the source is next called though no record waits (its next full read, or a
    /// retry of one that failed), and when the process was last read in full.
    next_call: Option<Instant>,
    refreshed: Option<Instant>,
    /// Threads the kernel told of that a read then found not running Python, and when.
    not_python: FxHashMap<u32, Instant>,
    /// The threads watched: those of the last full sample that succeeded.
    threads: Vec<cpython::CapturedThread>,
    records: Vec<PendingRecord>,
    /// What the last call held.
    last: CapturedCounts,
    /// A chain deeper than the capture copies was seen.
    deeper: bool,
    /// The process ended: reported at the call after the one that handed out what was
    /// captured before.
    gone: Option<SampleError>,
    /// Wall and gil modes (see `UnwinderFactory::off_cpu`).
    wall: Option<WallTime>,
    /// The layout the threads were last watched with (watched again when it changes: the
    /// asyncio offsets, known once `_asyncio` is).
    watched_layout: Option<CaptureLayout>,
    /// Called at every tick, records or not (see [`CaptureLink::called_every_tick`]).
    every_tick: bool,
}

impl CaptureLink {
    /// The link of process `pid` to `shared`; with `off_cpu`, its threads' time off the CPU
    /// counts too (wall and gil modes).
    pub fn new(shared: Arc<SharedCapture>, pid: i32, off_cpu: Option<OffCpu>) -> CaptureLink {
        // Off the CPU, time counts at the rate the capture samples on it.
        let wall = off_cpu.map(|o| WallTime::new(f64::from(shared.rate_hz()), o.gil_holder_only));
        CaptureLink {
            shared,
            pid: pid as u32,
            next_call: None,
            refreshed: None,
            not_python: FxHashMap::default(),
            threads: Vec::new(),
            records: Vec::new(),
            last: CapturedCounts::default(),
            gone: None,
            deeper: false,
            wall,
            watched_layout: None,
            every_tick: false,
        }
    }

    /// A link whose source is called at every tick, whether records wait or not: with
    /// `--async-mode all`, whose waiting tasks are read at each call. Those reads must fall at
    /// the ticks' instants, as by reads: called only when records arrive, they would fall
    /// where the process's threads switch, which is when its tasks change phase, and a
    /// waiting task's share of time would lean to the phases that end in a switch.
    pub fn called_every_tick(mut self) -> CaptureLink {
        self.every_tick = true;
        self
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What the last call held.
    pub fn last(&self) -> CapturedCounts {
        self.last
    }

    /// A chain deeper than the capture copies was seen.
    pub fn deeper(&self) -> bool {
        self.deeper
    }

    /// Wall and gil modes: time off the CPU is counted at each call, so the slot calls before
    /// each batch (`StackSource::counts_at_batch`).
    pub fn counts_off_cpu(&self) -> bool {
        self.wall.is_some()
    }

    /// Whether the source should be called now: records that make it due wait, its full read
    /// is due, or its process ended.
    pub fn due(&self) -> bool {
        if self.gone.is_some() || self.every_tick {
            return true;
        }
        let now = Instant::now();
        self.next_call.is_none_or(|t| now >= t) || self.shared.has_records(self.pid, now)
    }

    /// A tick of a capturing source: every chain captured for this process since the last
    /// tick, its threads learnt again first when due. With `tasks` (`--async`), a chain
    /// copied while its thread ran an asyncio task becomes that task's stack.
    pub fn sample(
        &mut self,
        unwinder: &mut Unwinder<ProcessMemory>,
        out: &mut Vec<SampledThread>,
        mut tasks: Option<&mut TaskView>,
    ) -> Result<SampleKind, SampleError> {
        let link = self;
        link.last = CapturedCounts::default();
        if let Some(gone) = link.gone.take() {
            return Err(gone);
        }
        let mut records = std::mem::take(&mut link.records);
        let now = Instant::now();
        // Wall mode: time off the CPU is counted up to this, taken before the ring is drained
        // (a switch-in recorded before it is then in the drain).
        let now_ns = wall_time::now_ns();
        link.shared.take(link.pid, &mut records);
        if !link.not_python.is_empty() {
            link.not_python
                .retain(|_, at| now.duration_since(*at) < CAPTURE_RECHECK);
        }
        let known = |threads: &[cpython::CapturedThread], tid: u32| {
            threads.iter().find(|t| t.tid as u32 == tid).copied()
        };
        let new_thread_ran = records.iter().any(|r| {
            r.unknown_thread
                && known(&link.threads, r.tid).is_none()
                && !link.not_python.contains_key(&r.tid)
        });
        // What this call cost: a read (to learn the threads, or code objects not cached),
        // else whether it had chains to decode (from what the kernel copied alone), else
        // nothing.
        let mut kind = SampleKind::Kept;
        // Spread by pid, so that processes attached together are not all read at one tick.
        let refresh_every =
            CAPTURE_FULL_REFRESH + Duration::from_millis(u64::from(link.pid % 2000));
        let refresh_due = link
            .refreshed
            .is_none_or(|t| now.duration_since(t) >= refresh_every);
        let mut learnt = false;
        // Called again without records after CAPTURE_RETRY, unless the process has been
        // read in full since (then at its next full read, below): a call that fails on the
        // way retries.
        link.next_call = Some(now + CAPTURE_RETRY);
        if refresh_due || new_thread_ran {
            match unwinder.sample() {
                Ok(_) => {
                    kind = unwinder.last_kind();
                    learnt = true;
                    let first = link.refreshed.is_none();
                    link.refreshed = Some(now);
                    if refresh_due {
                        link.not_python.clear();
                    }
                    let threads = unwinder.captured_threads();
                    if let Some(wall) = link.wall.as_mut() {
                        // A thread not heard of yet is off its CPU in the stack this read
                        // found (asleep since before the capture watched it).
                        for t in unwinder.last_sample() {
                            let stack = SampledThread {
                                tid: t.native_thread_id,
                                status: ThreadStatus {
                                    on_cpu: false,
                                    holds_gil: t.holds_gil,
                                    waits_gil: t.waits_gil,
                                },
                                stack: u64::from(t.stack),
                                samples: 1,
                            };
                            wall.learnt(t.native_thread_id as u32, stack, now_ns);
                        }
                        wall.retain(|tid| threads.iter().any(|t| t.tid as u32 == tid));
                    }
                    let mut layout = unwinder.capture_layout();
                    layout.tasks = tasks.as_mut().and_then(|t| t.running_offsets(unwinder));
                    if first || threads != link.threads || link.watched_layout != Some(layout) {
                        link.threads = threads;
                        link.watched_layout = Some(layout);
                        if let Err(message) = link.shared.watch(link.pid, &link.threads, layout) {
                            // Watched again at the next read, due after CAPTURE_RETRY.
                            link.threads.clear();
                            link.watched_layout = None;
                            link.refreshed = None;
                            return Err(SampleError {
                                kind: "capture",
                                process_gone: false,
                                message,
                            });
                        }
                    }
                }
                // What was captured before it ended goes out first.
                Err(e) if e.is_process_gone() => link.gone = Some(sample_error(&e)),
                // Its threads are learnt at a later tick; the capture goes on meanwhile.
                Err(_) => {}
            }
        }
        if let Some(at) = link
            .refreshed
            .map(|t| t + refresh_every)
            .filter(|&at| at > now)
        {
            link.next_call = Some(at);
        }
        let reads_before = unwinder.memory().stats().reads();
        let mut first_error = None;
        let (mut failed, mut decoded) = (0usize, 0usize);
        let out_before = out.len();
        for r in records.drain(..) {
            link.deeper |= r.truncated;
            let thread = known(&link.threads, r.tid);
            let seen = Seen {
                tid: r.tid,
                at_ns: r.time_ns,
                switched_in_ns: r.switched_in_ns,
                holds_gil: r.holds_gil,
                waits_gil: r.waits_gil,
            };
            if let Some(wall) = link.wall.as_mut().filter(|_| thread.is_some()) {
                if r.unchanged {
                    failed += wall.switched_out(seen, SwitchedOut::Unchanged, out) as usize;
                    continue;
                }
            }
            let sampled = match (r.unknown_thread, r.incomplete, thread) {
                // A Python thread that ran before this source learnt it.
                (true, _, Some(_)) => {
                    unwinder.captured_failure("a thread that started since its process was read")
                }
                // Not Python, as the read just made found.
                (true, _, None) => {
                    if learnt && link.not_python.len() < MAX_NOT_PYTHON {
                        link.not_python.insert(r.tid, now);
                    }
                    continue;
                }
                (false, Some(why), _) => unwinder.captured_failure(why),
                // Captured before this source stopped watching it: a thread that ended.
                (false, None, None) => continue,
                (false, None, Some(t)) => {
                    let sampled = unwinder.sample_captured(
                        t,
                        frames_in(&r.frames),
                        false,
                        r.collecting,
                        r.holds_gil,
                    );
                    match (sampled, tasks.as_mut(), r.task.as_ref()) {
                        // The task it ran, when the chain shows it.
                        (Ok(mut s), Some(view), Some(task)) => {
                            view.captured(unwinder, t.tstate, task).map(|stack| {
                                s.stack = stack.unwrap_or(s.stack);
                                s
                            })
                        }
                        (sampled, _, _) => sampled,
                    }
                }
            };
            decoded += 1;
            // The kernel copied the chain (and took it as the thread's last) unless it said
            // it could not, or did not know the thread yet.
            let copied = !r.unknown_thread && r.incomplete.is_none();
            let chain = match sampled {
                Ok(t) => Chain::Stack(SampledThread {
                    tid: t.native_thread_id,
                    status: ThreadStatus {
                        on_cpu: !r.switched_out,
                        holds_gil: r.holds_gil,
                        waits_gil: r.waits_gil,
                    },
                    stack: u64::from(t.stack),
                    samples: 1,
                }),
                Err(e) => {
                    first_error.get_or_insert(e);
                    match copied {
                        true => Chain::Undecoded,
                        false => Chain::NotCopied,
                    }
                }
            };
            match link.wall.as_mut() {
                Some(wall) if r.switched_out => {
                    failed += wall.switched_out(seen, SwitchedOut::With(chain), out) as usize;
                }
                Some(wall) => failed += wall.on_cpu(seen, chain, out) as usize,
                None => match chain {
                    Chain::Stack(s) => out.push(s),
                    _ => failed += 1,
                },
            }
        }
        link.records = records;
        if let Some(wall) = link.wall.as_mut() {
            failed += wall.until(now_ns, out) as usize;
        }
        let taken: usize = out[out_before..].iter().map(|s| s.samples as usize).sum();
        // Chains decoded from what the kernel copied alone are `checked`; a call that read
        // the process (to learn its threads, or code objects not cached) is `read`.
        if kind == SampleKind::Kept && decoded > 0 {
            kind = match unwinder.memory().stats().reads() == reads_before {
                true => SampleKind::Checked,
                false => SampleKind::Read,
            };
        }
        if taken == 0 && first_error.is_none() {
            if let Some(gone) = link.gone.take() {
                return Err(gone);
            }
        }
        link.last = CapturedCounts {
            taken: taken as u64,
            failed: failed as u64,
            failed_kind: first_error.as_ref().map_or("", |e| e.kind()),
            period: link.shared.period(),
        };
        match (taken, first_error) {
            (0, Some(e)) => Err(sample_error(&e)),
            _ => Ok(kind),
        }
    }

    /// Wall and gil modes' sampling rate (0 in cpu mode).
    pub fn wall_rate(&self) -> f64 {
        self.wall.as_ref().map_or(0.0, WallTime::rate_hz)
    }

    /// Counts one more failed sample in this call's counts (the waiting tasks of all mode,
    /// read after the chains were decoded).
    pub fn count_failure(&mut self, kind: &'static str) {
        self.last.failed += 1;
        if self.last.failed_kind.is_empty() {
            self.last.failed_kind = kind;
        }
    }
}

impl Drop for CaptureLink {
    fn drop(&mut self) {
        self.shared.forget(self.pid);
    }
}

fn sample_error(e: &cpython::UnwindError) -> SampleError {
    SampleError {
        kind: e.kind(),
        process_gone: e.is_process_gone(),
        message: e.to_string(),
    }
}
