//! `--async`: in a sample, a thread that runs an asyncio task shows the task's stack in place
//! of its own (the task's frames under the frames of the tasks awaiting it, see
//! `cpython::unwinder::tasks`), and with `--async-mode all` every other task is a sample of
//! its own too, of the thread whose loop holds it (neither on a CPU nor holding the GIL).
//! With the kernel capture, the capture copies each thread's running task with its chain
//! ([`TaskView::running_offsets`] says where) and `capture::link` asks [`TaskView::captured`]
//! for that task's stack; in all mode the waiting tasks are read after the chains are decoded
//! ([`TaskView::read_waiting`]), and the counts come from that read.
//!
//! The tasks are read right after the threads' sample ([`TaskView::read`], inside the
//! unwinder's `sample_then`: in the same pause with `--blocking`), and put in its place
//! after the views that judge threads (`--no-idle` leaves out threads, never tasks).
//!
//! The task layout is looked for when the source attaches, and again after [`LOOK_AGAIN`],
//! the wait doubling up to [`LOOK_AT_MOST`], until found: 3.14 maps `_asyncio` when the
//! target first imports asyncio, and a process without it has no task. A process before 3.14
//! has no view (no layout is published).

use crate::cpython::asyncio::{self, TaskScope, Tasks, TasksUnavailable};
use crate::cpython::{TaskStack, UnwindError, Unwinder};
use crate::gil_blame::holder_frame;
use crate::memory::capture_records::{CapturedTask, TaskOffsets};
use crate::memory::ProcessMemory;
use crate::output::blame::{LOOP_BLOCKED_BY, READY_FOR_LOOP};
use crate::output::task_entries::phase_frame;
use crate::process::Process;
use crate::stacks::{FrameId, StackId, StackTable};
use pyfleet_actors::{SampledThread, ThreadStatus};
use std::time::{Duration, Instant};

/// How long after a look that did not find `_asyncio` the process is looked at again, the
/// wait doubling up to [`LOOK_AT_MOST`] (most processes that have not imported asyncio at
/// start never will).
pub const LOOK_AGAIN: Duration = Duration::from_secs(2);
pub const LOOK_AT_MOST: Duration = Duration::from_secs(64);
/// The frame of a ready task when what its loop ran is not named.
fn ready_frame(table: &mut StackTable) -> FrameId {
    let name: std::sync::Arc<str> = READY_FOR_LOOP.into();
    let function = table.function(crate::stacks::Function {
        name: name.clone(),
        qualname: name,
        filename: "".into(),
        first_line: 0,
    });
    table.frame(function, None)
}

/// How often the tasks are counted in running mode (all mode counts them at every sample).
pub const COUNT_EVERY: Duration = Duration::from_secs(1);

/// The task view of one process.
pub struct TaskView {
    scope: TaskScope,
    tasks: Option<Tasks>,
    look_at: Instant,
    look_wait: Duration,
    stacks: Vec<TaskStack>,
    /// At the last count: tasks run by a thread, and waiting (`None` before the first).
    counts: Option<[u64; 2]>,
    count_at: Instant,
    /// What each waiting task's stack stands for (see [`TaskView::read_waiting`]; 1 by
    /// reads): ticks, the time of the last read of them and what is owed of a tick.
    waiting_weight: u32,
    waiting_read_at: Option<Instant>,
    waiting_carry: f64,
    scratch: Vec<FrameId>,
    /// Each thread's stack in the current call, by kernel thread id.
    thread_seen: Vec<(u64, u32)>,
}

impl TaskView {
    /// The view of the process `unwinder` reads; an error for one whose tasks cannot be read
    /// (before 3.14, or a table that is not valid).
    pub fn new(scope: TaskScope, unwinder: &Unwinder<ProcessMemory>) -> Result<TaskView, String> {
        let mut view = TaskView {
            scope,
            tasks: None,
            look_at: Instant::now(),
            look_wait: LOOK_AGAIN,
            stacks: Vec::new(),
            counts: None,
            count_at: Instant::now(),
            waiting_weight: 1,
            waiting_read_at: None,
            waiting_carry: 0.0,
            scratch: Vec::new(),
            thread_seen: Vec::new(),
        };
        view.look(unwinder).map_err(|e| e.to_string())?;
        Ok(view)
    }

    fn look(&mut self, unwinder: &Unwinder<ProcessMemory>) -> Result<(), TasksUnavailable> {
        self.look_at = Instant::now() + self.look_wait;
        self.look_wait = (self.look_wait * 2).min(LOOK_AT_MOST);
        let process = Process::new(unwinder.pid()).map_err(crate::binary::BinaryError::from)?;
        self.tasks = asyncio::locate(&process, unwinder.memory(), unwinder.layout())?;
        Ok(())
    }

    /// With the kernel capture: where the capture finds each thread's running task
    /// (`asyncio_running_loop`, `asyncio_running_task` in the thread state), once the layout
    /// is known (looked for again when due).
    pub fn running_offsets(&mut self, unwinder: &Unwinder<ProcessMemory>) -> Option<TaskOffsets> {
        self.look_if_due(unwinder);
        self.tasks.as_ref().map(|t| TaskOffsets {
            running_loop: t.table.thread_running_loop,
            running_task: t.table.thread_running_task,
            name: t.table.task_name,
            coro: t.table.task_coro,
            awaited_by: t.table.task_awaited_by,
        })
    }

    /// With the kernel capture: the stack of task `task`, which the thread at `tstate` ran
    /// when the chain just decoded was copied (see `Unwinder::captured_task_stack`); `None`
    /// when the chain does not show it.
    pub fn captured(
        &mut self,
        unwinder: &mut Unwinder<ProcessMemory>,
        tstate: u64,
        task: &CapturedTask,
    ) -> Result<Option<StackId>, UnwindError> {
        match self.tasks.as_mut() {
            Some(tasks) => unwinder.captured_task_stack(tasks, tstate, task),
            None => Ok(None),
        }
    }

    /// With the kernel capture, running mode: counts the tasks when due (the lists, and the
    /// threads that run one now), a failed count waiting for the next. All mode counts them
    /// with every read of the waiting tasks ([`TaskView::read_waiting`]).
    pub fn count_if_due(&mut self, unwinder: &mut Unwinder<ProcessMemory>) {
        let Some(tasks) = self.tasks.as_mut() else {
            return;
        };
        if self.scope == TaskScope::All || Instant::now() < self.count_at {
            return;
        }
        self.count_at = Instant::now() + COUNT_EVERY;
        if let (Ok(listed), Ok(running)) =
            (unwinder.tasks_listed(tasks), unwinder.tasks_running(tasks))
        {
            self.counts = Some([running as u64, listed.saturating_sub(running) as u64]);
        }
    }

    fn look_if_due(&mut self, unwinder: &Unwinder<ProcessMemory>) {
        if self.tasks.is_none() && Instant::now() >= self.look_at {
            if let Err(e) = self.look(unwinder) {
                tracing::debug!(pid = unwinder.pid(), "asyncio's layout: {e}");
            }
        }
    }

    /// Tasks run by a thread and waiting, at the last count.
    pub fn counts(&self) -> Option<[u64; 2]> {
        self.counts
    }

    /// Reads the task stacks of the unwinder's last sample (called right after it: within
    /// its pause with `--blocking`), and counts the tasks.
    pub fn read(&mut self, unwinder: &mut Unwinder<ProcessMemory>) -> Result<(), UnwindError> {
        self.stacks.clear();
        // By reads, each waiting task stands for the one tick (also after a capturing
        // source turned to reads).
        self.waiting_weight = 1;
        self.waiting_read_at = None;
        self.waiting_carry = 0.0;
        self.look_if_due(unwinder);
        let Some(tasks) = self.tasks.as_mut() else {
            return Ok(());
        };
        let listed = unwinder.task_stacks(tasks, self.scope, &mut self.stacks)?;
        let running = self.stacks.iter().filter(|s| s.running).count();
        let listed = match listed {
            Some(n) => Some(n),
            // A count failing (its lists moving) is no failed sample: it waits for the next.
            None if Instant::now() >= self.count_at => {
                self.count_at = Instant::now() + COUNT_EVERY;
                unwinder.tasks_listed(tasks).ok()
            }
            None => None,
        };
        if let Some(n) = listed {
            self.counts = Some([running as u64, n.saturating_sub(running) as u64]);
        }
        Ok(())
    }

    /// With the kernel capture, all mode: reads the stacks of the tasks that wait (the
    /// running ones come with the captured chains, see [`TaskView::captured`]); nothing in
    /// running mode. Its source is called at every tick (`CaptureLink::called_every_tick`);
    /// each waiting task stands for the ticks at `rate_hz` since the last read of them, more
    /// than one when the sampling thread missed some.
    pub fn read_waiting(
        &mut self,
        unwinder: &mut Unwinder<ProcessMemory>,
        rate_hz: f64,
    ) -> Result<(), UnwindError> {
        self.stacks.clear();
        if self.scope != TaskScope::All {
            return Ok(());
        }
        let Some(tasks) = self.tasks.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        self.waiting_weight = match self.waiting_read_at.replace(now) {
            None => 1,
            Some(last) => {
                let owed = now.duration_since(last).as_secs_f64() * rate_hz + self.waiting_carry;
                let whole = owed.floor();
                self.waiting_carry = owed - whole;
                whole.min(f64::from(u32::MAX)) as u32
            }
        };
        let (running, listed) = unwinder.waiting_task_stacks(tasks, &mut self.stacks)?;
        self.counts = Some([running as u64, listed.saturating_sub(running) as u64]);
        Ok(())
    }

    /// Notes the stacks of one call's thread samples (before any view leaves some out): what
    /// [`TaskView::apply`] blames ready tasks on.
    pub fn see_threads(&mut self, samples: &[SampledThread]) {
        self.thread_seen.clear();
        // Only all mode samples waiting tasks, ready ones among them.
        if self.scope != TaskScope::All {
            return;
        }
        self.thread_seen.extend(
            samples
                .iter()
                .filter_map(|t| Some((t.tid, u32::try_from(t.stack).ok()?))),
        );
    }

    /// Puts the task stacks [`TaskView::read`] read into `out[from..]` (the threads'
    /// samples): a running task's in place of its thread's, and with `All` every other
    /// task's after them. A ready task's stack gets one more frame, innermost, naming what
    /// its loop's thread ran (`[loop blocked by FUNCTION]`, see `gil_blame::holder_frame`):
    /// what the thread's entry into the program's own code called, as `record` files what
    /// held the loop (`task_entries::phase_frame`: `build_report` of a `report` handler, not
    /// the helper it runs), in the same call (before any view left it out); a call without
    /// one blames the wait on `its thread, not sampled then`. Without `blame_loop` (the
    /// kernel capture's samples: a thread's chain comes at its own interrupts and switches,
    /// not at each call, and a thread that ran less than a period shows its last wait, which
    /// measured wrong by tens of points) the frame only says the task was ready
    /// (`[ready, waiting for the loop]`).
    pub fn apply(
        &mut self,
        out: &mut Vec<SampledThread>,
        from: usize,
        table: &mut StackTable,
        blame_loop: bool,
    ) {
        for s in self.stacks.iter().filter(|s| s.running) {
            if let Some(t) = out[from..].iter_mut().find(|t| t.tid == s.native_thread_id) {
                t.stack = u64::from(s.stack);
            }
            // What the thread ran is the task's stack (its frames, then those naming tasks).
            if let Some(seen) = self
                .thread_seen
                .iter_mut()
                .find(|(tid, _)| *tid == s.native_thread_id)
            {
                seen.1 = s.stack;
            }
        }
        if self.waiting_weight == 0 {
            return;
        }
        let mut blame: Vec<(u64, FrameId)> = Vec::new();
        for s in self.stacks.iter().filter(|s| !s.running) {
            let mut stack = s.stack;
            if s.ready {
                let frame = match blame.iter().find(|(tid, _)| *tid == s.native_thread_id) {
                    Some(&(_, frame)) => frame,
                    None if !blame_loop => {
                        let frame = ready_frame(table);
                        blame.push((s.native_thread_id, frame));
                        frame
                    }
                    None => {
                        let loop_stack = self
                            .thread_seen
                            .iter()
                            .find(|(tid, _)| *tid == s.native_thread_id)
                            .map(|&(_, stack)| stack);
                        let frame =
                            holder_frame(table, LOOP_BLOCKED_BY, loop_stack, Some(phase_frame));
                        blame.push((s.native_thread_id, frame));
                        frame
                    }
                };
                if let Some(blamed) = table.with_innermost(stack, frame, &mut self.scratch) {
                    stack = blamed;
                }
            }
            out.push(SampledThread {
                tid: s.native_thread_id,
                status: ThreadStatus {
                    on_cpu: false,
                    holds_gil: false,
                    waits_gil: false,
                },
                stack: u64::from(stack),
                samples: self.waiting_weight,
            });
        }
    }
}
