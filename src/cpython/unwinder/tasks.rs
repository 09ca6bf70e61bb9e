//! The asyncio tasks of the interpreters and threads the last sample read (`dump --async`):
//! the task walk (`cpython::asyncio::walk`) over them, a running task's frames taken from its
//! thread's walked chain down to its coroutine's frame, a pending task's coroutine frames
//! resolved from their code objects. Called right after a successful sample, whose threads
//! (`spare.work`) and chains (`threads`) it uses.

use super::*;
use crate::cpython::asyncio::walk::{RawTask, TaskReader, TaskThread};
use crate::cpython::asyncio::AsyncioLayout;
use crate::cpython::layout::TaskObjectsLayout;
use crate::cpython::resolved::{InterpreterTasks, Task};

impl<M: RemoteMemory> Unwinder<M> {
    /// Every task of every interpreter of the last sample, main interpreter first.
    pub fn tasks(
        &mut self,
        table: &AsyncioLayout,
        objects: &TaskObjectsLayout,
    ) -> Result<Vec<InterpreterTasks>, UnwindError> {
        let mut out = Vec::new();
        let mut reader = TaskReader::new(&self.mem, &self.layout, objects, table);
        for (&interp, &id) in self.interps.iter().zip(&self.interp_ids) {
            let threads: Vec<TaskThread> = self
                .spare
                .work
                .iter()
                .filter(|w| w.ts.interp_id == id)
                .map(|w| TaskThread {
                    thread_id: w.ts.thread_id,
                    tstate: w.ts.addr,
                })
                .collect();
            let raw = reader.read(interp, &threads)?;
            out.push((id, raw, threads));
        }
        let mut resolved = Vec::with_capacity(out.len());
        for (id, raw, threads) in out {
            let codes = self.coroutine_codes(&raw)?;
            let tasks = raw
                .into_iter()
                .map(|t| self.task(t, &threads, &codes))
                .collect::<Result<Vec<Task>, UnwindError>>()?;
            resolved.push(InterpreterTasks { id, tasks });
        }
        resolved.sort_by_key(|i| i.id);
        Ok(resolved)
    }

    /// The code objects of the pending tasks' coroutine frames, read in one batch.
    fn coroutine_codes(&self, raw: &[RawTask]) -> Result<FxHashMap<u64, CodeInfo>, UnwindError> {
        let mut addrs: Vec<u64> = raw
            .iter()
            .flat_map(|t| t.frames.iter().map(|f| f.code))
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        let loaded = read_codes(&self.mem, &self.layout, self.code_type, &addrs)?;
        addrs
            .into_iter()
            .zip(loaded)
            .map(|(a, code)| Ok((a, code?.info)))
            .collect()
    }

    fn task(
        &self,
        t: RawTask,
        threads: &[TaskThread],
        codes: &FxHashMap<u64, CodeInfo>,
    ) -> Result<Task, UnwindError> {
        let adaptive = self.layout.code.code_adaptive;
        let frames = match t.running {
            true => self.running_task_frames(&t, threads)?,
            false => t
                .frames
                .iter()
                .map(|f| {
                    let info = codes.get(&f.code).ok_or(UnwindError::NotCode(f.code))?;
                    Ok(Frame {
                        function: info.function(),
                        line: info.line_at(f.code, adaptive, f.instr),
                    })
                })
                .collect::<Result<Vec<Frame>, UnwindError>>()?,
        };
        Ok(Task {
            id: t.addr,
            name: t.name,
            thread_id: t.thread_id,
            running: t.running,
            frames,
            awaited_by: t.awaited_by,
        })
    }

    /// A running task's frames: its thread's chain as the sample walked it, from the top
    /// down to the task's coroutine frame.
    fn running_task_frames(
        &self,
        t: &RawTask,
        threads: &[TaskThread],
    ) -> Result<Vec<Frame>, UnwindError> {
        let chain = threads
            .iter()
            .find(|th| Some(th.thread_id) == t.thread_id)
            .and_then(|th| self.threads.get(&th.tstate))
            .map(|c| c.chain.as_slice())
            .unwrap_or_default();
        let Some(end) = chain.iter().position(|f| f.addr == t.frame) else {
            return Err(UnwindError::Moved(
                "a running task's frame is not on its thread's stack",
            ));
        };
        Ok(chain[..=end]
            .iter()
            .filter_map(|f| f.id)
            .filter_map(|id| self.table.resolve_frame(id))
            .map(|f| Frame {
                function: f.function.clone(),
                line: f.line,
            })
            .collect())
    }
}
