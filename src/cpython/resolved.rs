//! Fully resolved stacks (what `dump` shows), as opposed to the interned ids of a sample.
//! The walking itself is the unwinder's (`unwinder`): one walker for `dump` and profiling.

use crate::stacks::Function;

/// Deepest stack believed (frames). CPython's default recursion limit is 1000.
pub const MAX_DEPTH: usize = 1 << 16;

/// One Python frame of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub function: Function,
    /// `None` where the instruction has no line (as `frame.f_lineno` gives None).
    pub line: Option<i32>,
}

/// One thread's stack, innermost frame first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStack {
    /// `threading.get_ident()` of the thread (its `pthread_t`).
    pub thread_id: u64,
    /// The kernel's thread id, as pyfleet sees it (the host's, for a target in a container).
    pub native_thread_id: u64,
    /// The id the target's own pid namespace gives the thread, when that is another
    /// namespace than pyfleet's.
    pub namespace_thread_id: Option<u64>,
    pub holds_gil: bool,
    pub on_cpu: bool,
    /// The `threading` module's name of the thread (`Thread.name`), when the caller asked
    /// for it and it could be read; untrusted.
    pub name: Option<String>,
    /// The kernel's name of the thread (see [`crate::process::thread_name`]), when the
    /// caller asked for it; untrusted.
    pub os_name: Option<String>,
    pub frames: Vec<Frame>,
    /// Each frame's locals (one for each of `frames`), when the caller asked for them
    /// (`dump --locals`, see [`crate::cpython::locals`]).
    pub locals: Option<Vec<crate::cpython::locals::FrameLocals>>,
}

/// One interpreter's threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterStacks {
    /// 0 is the main interpreter.
    pub id: i64,
    pub threads: Vec<ThreadStack>,
}

/// One asyncio task (3.14+), as `dump --async` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task object's address.
    pub id: u64,
    /// `Task.get_name()`; untrusted.
    pub name: String,
    /// The thread whose task list holds it, or that runs it (`None`: a thread that ended).
    pub thread_id: Option<u64>,
    pub running: bool,
    /// Innermost first: a running task's frames on its thread down to its coroutine's, a
    /// pending task's coroutine chain (empty when it is done).
    pub frames: Vec<Frame>,
    /// The ids of the tasks awaiting it.
    pub awaited_by: Vec<u64>,
    /// Pending and ready: its loop will resume it once it gets to it (see
    /// `asyncio::ready`).
    pub ready: bool,
}

/// One interpreter's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterTasks {
    pub id: i64,
    pub tasks: Vec<Task>,
}
