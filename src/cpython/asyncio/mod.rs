//! asyncio tasks of a target (3.14+): where `_asyncio` publishes its layout, and reading every
//! task, its name, its coroutine chain and the tasks that await it.
//!
//! From 3.14 on, `_asyncio` keeps every task in a list: each thread's own (in its thread
//! state, beside the thread's running loop and running task), and the interpreter's, which
//! holds the tasks of threads that ended. It describes those lists and its `TaskObj` in a
//! table, `_Py_AsyncioModuleDebugOffsets`, in an ELF section of its own (`.AsyncioDebug`) of
//! whichever file holds `_asyncio`: the `_asyncio` extension module on 3.14 (mapped once the
//! target imports asyncio), libpython or the executable on 3.15. The other objects read on the
//! way (generators, sets, ints) are described by `_Py_DebugOffsets` ([`TaskObjectsLayout`]).
//! Before 3.14 no such table exists and tasks are not linked: [`locate`] says so.
//!
//! Everything read is bounded by pyfleet: at most [`walk::MAX_TASKS`] tasks, awaiters and
//! coroutine chains of bounded length, cycles refused (see `walk`).

pub mod ready;
pub mod walk;

use super::layout::{Layout, TaskObjectsLayout};
use super::UnwindError;
use crate::binary::{self, BinaryError};
use crate::memory::{Bytes, RemoteMemory};
use crate::process::Process;
use std::path::Path;

/// Bytes of `_Py_AsyncioModuleDebugOffsets`: thirteen 64-bit fields.
pub const MODULE_TABLE_BYTES: usize = 13 * 8;
/// Largest `TaskObj` believed (168 bytes on 3.14 and 3.15).
const MAX_TASK_SIZE: u64 = 4096;
/// Largest thread or interpreter state believed: the fields lie within it.
const MAX_STATE_SIZE: u64 = 1 << 22;

/// `_Py_AsyncioModuleDebugOffsets`, validated: where a task keeps what is read of it, and
/// where the thread and interpreter states keep their task lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncioLayout {
    pub task_size: u64,
    pub task_name: u64,
    pub task_awaited_by: u64,
    /// Bytes (`char`): whether the future is a task, whether `awaited_by` is a set (else
    /// the one future that awaits it).
    pub task_is_task: u64,
    pub task_awaited_by_is_set: u64,
    pub task_coro: u64,
    /// The task's `struct llist_node` in its thread's (or the interpreter's) list.
    pub task_node: u64,
    /// The head of the interpreter's list (tasks of threads that ended).
    pub interp_tasks_head: u64,
    /// In the thread state: its running loop, the task it runs, the head of its list.
    pub thread_running_loop: u64,
    pub thread_running_task: u64,
    pub thread_tasks_head: u64,
}

impl AsyncioLayout {
    /// Parses and validates the table's bytes.
    pub fn parse(raw: &[u8]) -> Result<AsyncioLayout, String> {
        let b = Bytes(raw);
        let word = |i: u64| b.u64(i * 8).map_err(|e| e.to_string());
        let task_size = word(0)?;
        let interp_size = word(7)?;
        let thread_size = word(9)?;
        let layout = AsyncioLayout {
            task_size,
            task_name: word(1)?,
            task_awaited_by: word(2)?,
            task_is_task: word(3)?,
            task_awaited_by_is_set: word(4)?,
            task_coro: word(5)?,
            task_node: word(6)?,
            interp_tasks_head: word(8)?,
            thread_running_loop: word(10)?,
            thread_running_task: word(11)?,
            thread_tasks_head: word(12)?,
        };
        if task_size == 0 || task_size > MAX_TASK_SIZE {
            return Err(format!("the task size is {task_size}"));
        }
        for (name, size) in [("interpreter", interp_size), ("thread", thread_size)] {
            if size == 0 || size > MAX_STATE_SIZE {
                return Err(format!("the {name} state size is {size}"));
            }
        }
        let fits = |what: &str, off: u64, len: u64, size: u64| match off.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(format!(
                "{what} = {off} is outside its struct ({size} bytes)"
            )),
        };
        fits("task_name", layout.task_name, 8, task_size)?;
        fits("task_awaited_by", layout.task_awaited_by, 8, task_size)?;
        fits("task_is_task", layout.task_is_task, 1, task_size)?;
        fits(
            "task_awaited_by_is_set",
            layout.task_awaited_by_is_set,
            1,
            task_size,
        )?;
        fits("task_coro", layout.task_coro, 8, task_size)?;
        fits("task_node", layout.task_node, 16, task_size)?;
        fits(
            "asyncio_tasks_head",
            layout.interp_tasks_head,
            16,
            interp_size,
        )?;
        fits(
            "asyncio_running_loop",
            layout.thread_running_loop,
            8,
            thread_size,
        )?;
        fits(
            "asyncio_running_task",
            layout.thread_running_task,
            8,
            thread_size,
        )?;
        fits(
            "asyncio_tasks_head",
            layout.thread_tasks_head,
            16,
            thread_size,
        )?;
        Ok(layout)
    }

    /// Where a future keeps its state (an `int` enum, 0 pending): just before `is_task` in
    /// `FutureObj_HEAD` (3.14, 3.15); `None` for a table that places `is_task` first.
    pub fn future_state(&self) -> Option<u64> {
        self.task_is_task.checked_sub(4)
    }

    /// Where a task keeps the future it awaits (`task_fut_waiter`, NULL for none): just
    /// before `task_coro` in `TaskObj` (3.14, 3.15).
    pub fn task_fut_waiter(&self) -> Option<u64> {
        self.task_coro.checked_sub(8)
    }

    /// Bytes of a future read to get its awaiters and whether it is a task (a future that
    /// is not a task is smaller than a task, and has these fields at the same offsets).
    pub fn future_span(&self) -> u64 {
        (self.task_awaited_by + 8)
            .max(self.task_is_task + 1)
            .max(self.task_awaited_by_is_set + 1)
    }
}

/// Which tasks a sample shows (`--async-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskScope {
    /// The task each thread runs, in place of the thread's stack.
    #[default]
    Running,
    /// Every task, running or waiting: each a sample of its own at each tick.
    All,
}

impl std::str::FromStr for TaskScope {
    type Err = String;

    fn from_str(s: &str) -> Result<TaskScope, String> {
        match s {
            "running" => Ok(TaskScope::Running),
            "all" => Ok(TaskScope::All),
            other => Err(format!("must be running or all (got {other:?})")),
        }
    }
}

/// What reading one target's tasks needs and keeps: its layouts and the reader's memo.
pub struct Tasks {
    pub table: AsyncioLayout,
    pub objects: TaskObjectsLayout,
    pub memo: walk::TaskMemo,
}

/// Why a process's tasks cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum TasksUnavailable {
    #[error("asyncio tasks can be read from Python 3.14 on; process {pid} runs {version}, whose asyncio publishes no layout and links no task list")]
    Version { pid: i32, version: String },
    #[error(transparent)]
    Binary(#[from] BinaryError),
    #[error("invalid _Py_AsyncioModuleDebugOffsets in process {pid}: {why}")]
    BadTable { pid: i32, why: String },
    #[error(transparent)]
    Read(#[from] UnwindError),
}

/// The task layout of a process: `Ok(None)` when it has not loaded `_asyncio` (3.14: the
/// module is mapped when asyncio is first imported), so that it has no task.
pub fn locate<M: RemoteMemory>(
    process: &Process,
    mem: &M,
    layout: &Layout,
) -> Result<Option<Tasks>, TasksUnavailable> {
    let Some(objects) = layout.task_objects.clone() else {
        return Err(TasksUnavailable::Version {
            pid: process.pid(),
            version: layout.version.to_string(),
        });
    };
    let minor = layout.version.minor;
    let Some(at) = binary::locate_section(process, &[".AsyncioDebug", "AsyncioDebug"], |path| {
        holds_asyncio(path, minor)
    })?
    else {
        return Ok(None);
    };
    let raw = mem
        .read_vec(at, MODULE_TABLE_BYTES)
        .map_err(UnwindError::from)?;
    let table = AsyncioLayout::parse(&raw).map_err(|why| TasksUnavailable::BadTable {
        pid: process.pid(),
        why,
    })?;
    Ok(Some(Tasks {
        table,
        objects,
        memo: walk::TaskMemo::default(),
    }))
}

/// Whether a mapped file may hold `_asyncio`'s table on 3.`minor`: the extension module on
/// 3.14 (so that a process that has not imported asyncio costs a look at its maps, no ELF
/// read), else the module, libpython or a Python executable.
fn holds_asyncio(path: &Path, minor: u32) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with("_asyncio.") || (minor != 14 && name.contains("python"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(words: [u64; 13]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// 3.14.10's table, as its `_asyncio` module holds it.
    const TABLE_314: [u64; 13] = [
        0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x37248, 0x2a80, 0x3a8, 0x360, 0x368, 0x370,
    ];

    #[test]
    fn a_real_table_parses() {
        let l = AsyncioLayout::parse(&table(TABLE_314)).expect("parses");
        assert_eq!(l.task_node, 0x98);
        assert_eq!(l.thread_tasks_head, 0x370);
        assert_eq!(l.future_span(), 0x6e);
    }

    #[test]
    fn fields_outside_their_struct_are_refused() {
        let mut t = TABLE_314;
        t[6] = 0xa0; // task_node's 16 bytes past the 0xa8-byte task
        assert!(AsyncioLayout::parse(&table(t)).is_err());
        let mut t = TABLE_314;
        t[0] = 1 << 40;
        assert!(AsyncioLayout::parse(&table(t)).is_err());
        let mut t = TABLE_314;
        t[12] = u64::MAX - 4; // overflowing offset
        assert!(AsyncioLayout::parse(&table(t)).is_err());
        assert!(AsyncioLayout::parse(&[0u8; 40]).is_err());
    }
}
