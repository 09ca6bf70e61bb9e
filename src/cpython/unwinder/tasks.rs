//! The asyncio tasks of the interpreters and threads the last sample read: every task as
//! `dump --async` shows it ([`Unwinder::tasks`]), and the task stacks a sample shows with
//! `--async` ([`Unwinder::task_stacks`]). Called right after a successful sample, whose
//! threads (`spare.work`), chains (`threads`) and code-object stamp (`codes.stamp`) they use.
//!
//! Contracts:
//! - A running task's frames are its thread's chain as the sample walked it, from the top down
//!   to the task's coroutine frame; a thread whose chain does not hold that frame shows no
//!   task. Which task a thread runs is read with its thread state, in the sample's own batch,
//!   from the first sample after the task walk is first asked for on (before that, and for
//!   that one sample, read right after the sample: a thread may have moved on to another task
//!   by then, and then shows no task).
//! - A pending task's frames are its coroutine chain, resolved through the code-object cache
//!   (an entry valid at the sample's stamp, else loaded).
//! - A task's stack, innermost first: its frames, a frame naming it (`task NAME`, with
//!   `(awaited by N)` when several tasks await it), then the stack of the task awaiting it
//!   (the lowest address of several), up to a task nothing awaits; a loop of awaiters is a
//!   [`UnwindError::Cycle`], a chain deeper than [`MAX_AWAIT_DEPTH`] [`UnwindError::TooLong`].
//! - One instant's: everything a walk read is read again in one batch and must be unchanged
//!   (`TaskReader::verify`); a walk the target changed under is made again, at most
//!   [`TASK_READS`] times, then the sample fails. A running task's frames are the sample's
//!   own read of its thread (with `--blocking`, all of it in one pause); the tasks awaiting it
//!   are read microseconds later and must still await it then: a task resumes only once what
//!   it awaits is done, unless it awaits with a timeout, and one that resumed on its timeout
//!   and waits again within those microseconds would show its later chain.

use super::*;
use crate::cpython::asyncio::walk::{
    CoroutineFrame, RawTask, TaskObject, TaskReader, TaskThread, MAX_AWAIT_DEPTH,
};
use crate::cpython::asyncio::{TaskScope, Tasks};
use crate::cpython::resolved::{InterpreterTasks, Task};
use crate::memory::capture_records::CapturedTask;
use crate::stacks::Function;

/// Reads of the tasks made for one sample before it counts as failed (the first and the
/// ones the target changed under).
pub const TASK_READS: u32 = 3;

/// File of the frames naming tasks.
pub const TASK_FILE: &str = "<asyncio task>";

/// The task a frame names, if it is a frame naming a task (function `task NAME`, or `task NAME
/// (awaited by N)`, in file [`TASK_FILE`]).
pub fn named_task<'a>(function: &'a str, file: &str) -> Option<&'a str> {
    if file != TASK_FILE {
        return None;
    }
    let name = function.strip_prefix("task ")?;
    Some(match name.rfind(" (awaited by ") {
        Some(at) if name.ends_with(')') => &name[..at],
        _ => name,
    })
}

/// One sample's stack of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStack {
    /// The kernel's id of the thread whose loop holds it (0: a thread that ended).
    pub native_thread_id: u64,
    pub running: bool,
    /// Pending, and its loop will resume it once it gets to it (see `asyncio::ready`).
    pub ready: bool,
    pub stack: StackId,
}

/// A thread of the last sample, for the task walk.
struct SampledThreadState {
    tstate: u64,
    thread_id: u64,
    native: u64,
    /// The task it ran as the sample read it (0: none), when read with its state.
    running_task: Option<u64>,
}

/// The threads the task walk reads.
fn walked(threads: &[SampledThreadState]) -> Vec<TaskThread> {
    threads
        .iter()
        .map(|t| TaskThread {
            thread_id: t.thread_id,
            tstate: t.tstate,
            running_task: t.running_task,
        })
        .collect()
}

impl<M: RemoteMemory> Unwinder<M> {
    /// The last sample's interpreters: (address, id).
    fn sampled_interps(&self) -> Vec<(u64, i64)> {
        self.interps
            .iter()
            .copied()
            .zip(self.interp_ids.iter().copied())
            .collect()
    }

    /// From the next sample on, reads each thread's running task with its state (see the
    /// module documentation).
    fn read_running_tasks_with_threads(&mut self, tasks: &Tasks) {
        self.running_task_fields = Some((
            tasks.table.thread_running_loop,
            tasks.table.thread_running_task,
        ));
    }

    /// The task each of `threads` ran: as the sample read it, else (the sample did not read
    /// it) now.
    fn running_tasks_of(
        &mut self,
        tasks: &mut Tasks,
        threads: &[SampledThreadState],
    ) -> Result<Vec<Option<u64>>, UnwindError> {
        let sampled: Option<Vec<Option<u64>>> = threads
            .iter()
            .map(|t| t.running_task.map(|task| (task != 0).then_some(task)))
            .collect();
        if let Some(runs) = sampled {
            return Ok(runs);
        }
        let tstates: Vec<u64> = threads.iter().map(|t| t.tstate).collect();
        self.task_reader(tasks).running_tasks(&tstates)
    }

    fn task_reader<'a>(&'a self, tasks: &'a mut Tasks) -> TaskReader<'a, M> {
        TaskReader::new(
            &self.mem,
            &self.layout,
            &tasks.objects,
            &tasks.table,
            &mut tasks.memo,
        )
    }

    /// `read`, made again at once while the target changed under it, at most
    /// [`TASK_READS`] times in all.
    fn read_again_if_torn<T>(
        &mut self,
        mut read: impl FnMut(&mut Self) -> Result<T, UnwindError>,
    ) -> Result<T, UnwindError> {
        let mut reads = 0;
        loop {
            reads += 1;
            match read(self) {
                Err(e) if e.is_torn() && reads < TASK_READS => self.stats.resamples += 1,
                r => return r,
            }
        }
    }

    fn sampled_threads(&self, interp_id: i64) -> Vec<SampledThreadState> {
        self.spare
            .work
            .iter()
            .filter(|w| w.ts.interp_id == interp_id)
            .map(|w| SampledThreadState {
                tstate: w.ts.addr,
                thread_id: w.ts.thread_id,
                native: w.ts.native(),
                running_task: w.ts.running_task,
            })
            .collect()
    }

    /// Every task of every interpreter of the last sample, main interpreter first.
    pub fn tasks(&mut self, tasks: &mut Tasks) -> Result<Vec<InterpreterTasks>, UnwindError> {
        let mut out = Vec::new();
        let interps = self.sampled_interps();
        for (interp, id) in interps {
            let threads = self.sampled_threads(id);
            let raw = self.read_all_tasks(tasks, interp, &threads)?;
            let mut resolved = Vec::with_capacity(raw.len());
            let mut ids = Vec::new();
            for t in raw {
                ids.clear();
                self.own_frame_ids(&t, &threads, &mut ids)?;
                let frames = ids
                    .iter()
                    .filter_map(|&f| self.table.resolve_frame(f))
                    .map(|f| Frame {
                        function: f.function.clone(),
                        line: f.line,
                    })
                    .collect();
                resolved.push(Task {
                    id: t.addr,
                    name: t.name.to_string(),
                    thread_id: t.thread_id,
                    running: t.running,
                    frames,
                    awaited_by: t.awaited_by,
                    ready: t.ready,
                });
            }
            out.push(InterpreterTasks {
                id,
                tasks: resolved,
            });
        }
        out.sort_by_key(|i| i.id);
        Ok(out)
    }

    /// The task stacks of the last sample (see the module documentation): with `Running`,
    /// one per thread that runs a task; with `All`, one per task, and how many tasks the
    /// lists held.
    pub fn task_stacks(
        &mut self,
        tasks: &mut Tasks,
        scope: TaskScope,
        out: &mut Vec<TaskStack>,
    ) -> Result<Option<usize>, UnwindError> {
        self.read_running_tasks_with_threads(tasks);
        let mut listed = None;
        let interps = self.sampled_interps();
        for (interp, id) in interps {
            let threads = self.sampled_threads(id);
            match scope {
                TaskScope::Running => {
                    // Only the threads that ran a task are read further.
                    let runs = self.running_tasks_of(tasks, &threads)?;
                    for (th, task) in threads.iter().zip(runs) {
                        let Some(task) = task else {
                            continue;
                        };
                        let chain = self.running_chain(tasks, task)?;
                        if let Some(stack) = self.running_task_stack(th.tstate, &chain, tasks)? {
                            out.push(TaskStack {
                                native_thread_id: th.native,
                                running: true,
                                ready: false,
                                stack,
                            });
                        }
                    }
                }
                TaskScope::All => {
                    let raw = self.read_all_tasks(tasks, interp, &threads)?;
                    *listed.get_or_insert(0) += raw.len();
                    self.all_task_stacks(&raw, &threads, false, out)?;
                }
            }
        }
        Ok(listed)
    }

    /// With the kernel capture, all mode: the stacks of the tasks that wait (the running
    /// ones come with the captured chains), read now through the interpreters and threads
    /// of the last full read, and how many tasks the lists held: run by a thread, and in all.
    pub fn waiting_task_stacks(
        &mut self,
        tasks: &mut Tasks,
        out: &mut Vec<TaskStack>,
    ) -> Result<(usize, usize), UnwindError> {
        let (mut running, mut listed) = (0, 0);
        for (interp, id) in self.sampled_interps() {
            let threads = self.sampled_threads(id);
            let raw = self.read_all_tasks(tasks, interp, &threads)?;
            running += raw.iter().filter(|t| t.running).count();
            listed += raw.len();
            self.all_task_stacks(&raw, &threads, true, out)?;
        }
        Ok((running, listed))
    }

    /// How many tasks the lists of the last sample's interpreters hold.
    pub fn tasks_listed(&mut self, tasks: &mut Tasks) -> Result<usize, UnwindError> {
        let interps = self.sampled_interps();
        let mut n = 0;
        for (interp, id) in interps {
            let walk = walked(&self.sampled_threads(id));
            let mut reader = self.task_reader(tasks);
            n += reader.listed(interp, &walk)?;
            reader.verify()?;
        }
        Ok(n)
    }

    /// Every task of one interpreter, through the task walk; a walk the target changed under
    /// is made again, at most [`TASK_READS`] times in all.
    fn read_all_tasks(
        &mut self,
        tasks: &mut Tasks,
        interp: u64,
        threads: &[SampledThreadState],
    ) -> Result<Vec<RawTask>, UnwindError> {
        self.read_again_if_torn(|u| u.read_all_tasks_once(tasks, interp, threads))
    }

    fn read_all_tasks_once(
        &mut self,
        tasks: &mut Tasks,
        interp: u64,
        threads: &[SampledThreadState],
    ) -> Result<Vec<RawTask>, UnwindError> {
        let walk = walked(threads);
        let mut reader = self.task_reader(tasks);
        let tasks = reader.all_tasks(interp, &walk)?;
        reader.verify()?;
        Ok(tasks)
    }

    /// The running task at `task` and the tasks awaiting it, each with its coroutine chain
    /// (the running one's left empty: its frames are the thread's).
    #[allow(clippy::type_complexity)]
    fn running_chain(
        &mut self,
        tasks: &mut Tasks,
        task: u64,
    ) -> Result<Vec<(TaskObject, Vec<CoroutineFrame>)>, UnwindError> {
        self.read_again_if_torn(|u| {
            let mut reader = u.task_reader(tasks);
            let chain = reader.awaited_chain(task)?;
            reader.verify()?;
            Ok(chain)
        })
    }

    /// The stack of the task at the head of `chain` (a running task and those awaiting it,
    /// as [`TaskReader::awaited_chain`] gives them) run by thread `tstate`: the thread's chain
    /// as last walked or captured, cut at the task's coroutine frame, then the frames of the
    /// tasks awaiting it; `None` when that chain does not hold the task's frame.
    fn running_task_stack(
        &mut self,
        tstate: u64,
        chain: &[(TaskObject, Vec<CoroutineFrame>)],
        tasks: &Tasks,
    ) -> Result<Option<StackId>, UnwindError> {
        let mut ids = Vec::new();
        let Some((running, _)) = chain.first() else {
            return Ok(None);
        };
        if !self.running_frame_ids(tstate, running.coro, tasks, &mut ids) {
            return Ok(None);
        }
        for (i, (task, frames)) in chain.iter().enumerate() {
            if i > 0 {
                self.coroutine_frame_ids(frames, &mut ids)?;
            }
            ids.push(self.task_frame_id(&task.name, task.awaited_by.len()));
        }
        Ok(Some(self.table.stack(&ids)))
    }

    /// The task stack of a chain the kernel capture copied of thread `tstate` (just decoded
    /// by [`Unwinder::sample_captured`]) while it ran the task copied with it (`task`):
    /// `None` when the chain does not hold the task's coroutine frame. The task is named as
    /// copied; the tasks awaiting it, if any awaited it then, are read now (see
    /// [`TaskReader::captured_chain`](crate::cpython::asyncio::TaskReader::captured_chain)).
    pub fn captured_task_stack(
        &mut self,
        tasks: &mut Tasks,
        tstate: u64,
        task: &CapturedTask,
    ) -> Result<Option<StackId>, UnwindError> {
        let chain = self.read_again_if_torn(|u| {
            let mut reader = u.task_reader(tasks);
            let chain = reader.captured_chain(task)?;
            reader.verify()?;
            Ok(chain)
        })?;
        self.running_task_stack(tstate, &chain, tasks)
    }

    /// How many threads of the last full read run a task now (one batched read).
    pub fn tasks_running(&mut self, tasks: &mut Tasks) -> Result<usize, UnwindError> {
        let tstates: Vec<u64> = self.spare.work.iter().map(|w| w.ts.addr).collect();
        let runs = self.task_reader(tasks).running_tasks(&tstates)?;
        Ok(runs.iter().filter(|r| r.is_some()).count())
    }

    /// Pushes the frames of thread `tstate`'s chain down to the frame of coroutine `coro`;
    /// false (nothing pushed) when the chain does not hold it.
    fn running_frame_ids(
        &self,
        tstate: u64,
        coro: u64,
        tasks: &Tasks,
        ids: &mut Vec<FrameId>,
    ) -> bool {
        coro != 0
            && self.thread_frames_down_to(tstate, coro.wrapping_add(tasks.objects.gen_iframe), ids)
    }

    /// Pushes the frames of thread `tstate`'s chain (as last walked) from its top down to
    /// the frame at `frame`; false (nothing pushed) when the chain does not hold it.
    fn thread_frames_down_to(&self, tstate: u64, frame: u64, ids: &mut Vec<FrameId>) -> bool {
        let chain = self
            .threads
            .get(&tstate)
            .map(|c| c.chain.as_slice())
            .unwrap_or_default();
        let Some(end) = chain.iter().position(|f| f.addr == frame) else {
            return false;
        };
        ids.extend(chain[..=end].iter().filter_map(|f| f.id));
        true
    }

    /// Pushes a task's own frames (a running task's from its thread, a pending one's
    /// coroutine chain).
    fn own_frame_ids(
        &mut self,
        t: &RawTask,
        threads: &[SampledThreadState],
        ids: &mut Vec<FrameId>,
    ) -> Result<(), UnwindError> {
        if !t.running {
            return self.coroutine_frame_ids(&t.frames, ids);
        }
        let tstate = threads
            .iter()
            .find(|th| Some(th.thread_id) == t.thread_id)
            .map(|th| th.tstate)
            .unwrap_or(0);
        match self.thread_frames_down_to(tstate, t.frame, ids) {
            true => Ok(()),
            false => Err(UnwindError::Moved(
                "a running task's frame is not on its thread's stack",
            )),
        }
    }

    /// One stack per task of `raw`, with the stacks of the tasks awaiting it; with
    /// `waiting_only`, of the tasks that wait alone (a running task's frames are then not
    /// read from its thread: the thread's chain is not this instant's).
    fn all_task_stacks(
        &mut self,
        raw: &[RawTask],
        threads: &[SampledThreadState],
        waiting_only: bool,
        out: &mut Vec<TaskStack>,
    ) -> Result<(), UnwindError> {
        let by_addr: FxHashMap<u64, usize> =
            raw.iter().enumerate().map(|(i, t)| (t.addr, i)).collect();
        // Each task's own part: its frames and the frame naming it. A running task whose
        // frame its thread no longer shows has none: it is not sampled, nor what awaits it.
        let mut own: Vec<Option<Vec<FrameId>>> = Vec::with_capacity(raw.len());
        for t in raw {
            if waiting_only && t.running {
                own.push(None);
                continue;
            }
            let mut ids = Vec::new();
            match self.own_frame_ids(t, threads, &mut ids) {
                Ok(()) => {
                    ids.push(self.task_frame_id(&t.name, t.awaited_by.len()));
                    own.push(Some(ids));
                }
                Err(UnwindError::Moved(_)) => own.push(None),
                Err(e) => return Err(e),
            }
        }
        let mut ids = Vec::new();
        for (i, t) in raw.iter().enumerate() {
            ids.clear();
            let mut at = i;
            let mut depth = 0;
            let whole = loop {
                let Some(part) = &own[at] else {
                    break false;
                };
                ids.extend_from_slice(part);
                depth += 1;
                if depth > MAX_AWAIT_DEPTH {
                    return Err(UnwindError::Cycle("tasks awaiting each other"));
                }
                match raw[at].awaited_by.first().and_then(|p| by_addr.get(p)) {
                    Some(&parent) => at = parent,
                    None => break true,
                }
            };
            if !whole {
                continue;
            }
            let native = threads
                .iter()
                .find(|th| Some(th.thread_id) == t.thread_id)
                .map_or(0, |th| th.native);
            out.push(TaskStack {
                native_thread_id: native,
                running: t.running,
                ready: t.ready,
                stack: self.table.stack(&ids),
            });
        }
        Ok(())
    }

    /// Pushes the frames of a coroutine chain, its code objects from the cache (loaded when
    /// not valid at the last sample's stamp).
    fn coroutine_frame_ids(
        &mut self,
        frames: &[CoroutineFrame],
        ids: &mut Vec<FrameId>,
    ) -> Result<(), UnwindError> {
        let stamp = self.codes.stamp;
        let mut load: Vec<u64> = frames
            .iter()
            .map(|f| f.code)
            .filter(|c| self.codes.peek(c).is_none_or(|e| e.valid_at != stamp))
            .collect();
        load.sort_unstable();
        load.dedup();
        if load.len() > MAX_CODES_PER_SAMPLE {
            return Err(UnwindError::Budget("new code objects in one sample"));
        }
        if !load.is_empty() {
            self.stats.code_cache_misses += load.len() as u64;
            let entries = self.read_code_entries(&load, stamp)?;
            for (&a, entry) in load.iter().zip(entries) {
                self.codes.insert(a, entry?);
            }
        }
        let adaptive = self.layout.code.code_adaptive;
        for f in frames {
            let (function, line) = match self.codes.get(&f.code) {
                Some(e) => (e.function, e.info.line_at(f.code, adaptive, f.instr)),
                None => return Err(UnwindError::NotCode(f.code)),
            };
            ids.push(self.table.frame(function, line));
        }
        Ok(())
    }

    /// The frame naming a task awaited by `awaiters` tasks.
    fn task_frame_id(&mut self, name: &str, awaiters: usize) -> FrameId {
        let shown = match awaiters {
            0 | 1 => format!("task {name}"),
            n => format!("task {name} (awaited by {n})"),
        };
        let shown: std::sync::Arc<str> = shown.into();
        let function = self.table.function(Function {
            name: shown.clone(),
            qualname: shown,
            filename: TASK_FILE.into(),
            first_line: 0,
        });
        self.table.frame(function, None)
    }
}
