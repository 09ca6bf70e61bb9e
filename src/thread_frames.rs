//! `--threads`: every sampled stack gets one more frame, outermost, naming its thread, so
//! that each thread's samples make a tree of their own in every format. The frame's function
//! is `thread NAME` and its file `tid TID`, so threads of one name stay apart. NAME is the
//! `threading` module's name of the thread (`Thread.name`, read from the target with
//! `crate::cpython::threading_names`), else the kernel's (`/proc/PID/task/TID/comm`: what the
//! program set with `pthread_setname_np`, which CPython 3.14+ does from `Thread.name`; else
//! the program's name).
//!
//! The threading module's names are learnt from the target at most every [`NAME_KEPT`], or
//! once a second while a thread the last learning did not see samples (a thread the
//! threading module does not know is not asked about again before [`NAME_KEPT`]); a kernel's name is read when its thread
//! is first seen and again after [`NAME_KEPT`] (a thread may rename itself, and a thread id
//! may be reused). Names are untrusted: formats sanitise them like any string from a target.

use crate::stacks::{FrameId, Function, StackId, StackTable};
use rustc_hash::FxHashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a thread's name is believed before it is read again.
pub const NAME_KEPT: Duration = Duration::from_secs(10);
/// Most threads remembered per process; past it the names are all read again.
const MAX_THREADS: usize = 4096;
/// Longest name kept, in characters (the kernel's are at most 15 bytes).
const MAX_NAME_CHARS: usize = 64;

/// How long after learning the threading module's names a thread the learning did not see
/// waits before they are learnt again.
const UNNAMED_RETRY: Duration = Duration::from_secs(1);

/// The thread frames of one process.
pub struct ThreadFrames {
    pid: i32,
    names: FxHashMap<u64, (Function, Instant)>,
    /// The threads the last learning saw, by kernel thread id, with their threading module's
    /// name if it has one, and when they were learnt.
    threading: FxHashMap<u64, Option<String>>,
    learnt: Option<Instant>,
    scratch: Vec<FrameId>,
}

impl ThreadFrames {
    pub fn new(pid: i32) -> ThreadFrames {
        ThreadFrames {
            pid,
            names: FxHashMap::default(),
            threading: FxHashMap::default(),
            learnt: None,
            scratch: Vec::new(),
        }
    }

    /// Whether the threading module's names should be learnt again now, for samples of
    /// threads `tids`.
    pub fn names_due(&self, now: Instant, mut tids: impl Iterator<Item = u64>) -> bool {
        match self.learnt {
            None => true,
            Some(at) => {
                let since = now.saturating_duration_since(at);
                since >= NAME_KEPT
                    || (since >= UNNAMED_RETRY && tids.any(|t| !self.threading.contains_key(&t)))
            }
        }
    }

    /// Takes the threads seen as of now (kernel thread id, and the threading module's name if
    /// it has one); the frames are named afresh.
    pub fn learn(&mut self, seen: impl Iterator<Item = (u64, Option<String>)>, now: Instant) {
        self.threading.clear();
        self.threading.extend(seen);
        self.learnt = Some(now);
        self.names.clear();
    }

    /// `stack` of thread `tid` (the kernel's id, as pyfleet sees it) with the thread's frame
    /// outermost, interned in `table`; `stack` itself when it is from before a reset.
    pub fn stack_of(
        &mut self,
        table: &mut StackTable,
        stack: StackId,
        tid: u64,
        now: Instant,
    ) -> StackId {
        let function = self.function(tid, now);
        let function = table.function(function);
        let frame = table.frame(function, None);
        table
            .with_outermost(stack, frame, &mut self.scratch)
            .unwrap_or(stack)
    }

    /// The function that stands for thread `tid`.
    fn function(&mut self, tid: u64, now: Instant) -> Function {
        if let Some((f, read)) = self.names.get(&tid) {
            if now.saturating_duration_since(*read) < NAME_KEPT {
                return f.clone();
            }
        }
        if self.names.len() >= MAX_THREADS {
            self.names.clear();
        }
        let name = match self.threading.get(&tid) {
            Some(Some(name)) => name.clone(),
            Some(None) | None => crate::process::thread_name(self.pid, tid).unwrap_or_default(),
        };
        let f = thread_function(&name, tid);
        self.names.insert(tid, (f.clone(), now));
        f
    }
}

/// The function of a thread frame: `thread NAME` in file `tid TID` (`thread ?` without a
/// name: the thread ended before it was read).
pub fn thread_function(name: &str, tid: u64) -> Function {
    let name: String = name.chars().take(MAX_NAME_CHARS).collect();
    let name: Arc<str> = match name.is_empty() {
        true => "thread ?".into(),
        false => format!("thread {name}").into(),
    };
    Function {
        name: name.clone(),
        qualname: name,
        filename: format!("tid {tid}").into(),
        first_line: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table holding one stack, `work (app.py:3)`.
    fn one_stack() -> (StackTable, StackId) {
        let mut table = StackTable::new();
        let f = table.function(Function {
            name: "work".into(),
            qualname: "work".into(),
            filename: "app.py".into(),
            first_line: 1,
        });
        let frame = table.frame(f, Some(3));
        let stack = table.stack(&[frame]);
        (table, stack)
    }

    /// Two threads of one name are two frames; one thread's samples share one.
    #[test]
    fn each_thread_roots_its_own_stacks() {
        let (mut table, stack) = one_stack();
        let mut threads = ThreadFrames::new(i32::MAX);
        let now = Instant::now();
        let a = threads.stack_of(&mut table, stack, 1, now);
        let b = threads.stack_of(&mut table, stack, 2, now);
        let a_again = threads.stack_of(&mut table, stack, 1, now);
        assert_ne!(a, b);
        assert_eq!(a, a_again);
        let outermost: Vec<String> = table
            .resolve(a)
            .into_iter()
            .flatten()
            .map(|r| format!("{} {}", r.function.qualname, r.function.filename))
            .collect();
        // No such process: the name could not be read.
        assert_eq!(outermost, ["work app.py", "thread ? tid 1"]);
    }

    /// The threading module's name wins over the kernel's; learnt again when due.
    #[test]
    fn the_threading_modules_names_come_first() {
        let (mut table, stack) = one_stack();
        let mut threads = ThreadFrames::new(i32::MAX);
        let t0 = Instant::now();
        assert!(threads.names_due(t0, [1].into_iter()));
        threads.learn(
            [(1, Some("MainThread".to_string())), (3, None)].into_iter(),
            t0,
        );
        let outermost = |table: &StackTable, id| -> String {
            let frames: Vec<_> = table.resolve(id).into_iter().flatten().collect();
            frames
                .last()
                .map(|f| f.function.qualname.to_string())
                .unwrap_or_default()
        };
        let main = threads.stack_of(&mut table, stack, 1, t0);
        assert_eq!(outermost(&table, main), "thread MainThread");
        let other = threads.stack_of(&mut table, stack, 2, t0);
        assert_eq!(outermost(&table, other), "thread ?");
        // Thread 2 was not seen: learnt again after a second, not before.
        assert!(!threads.names_due(t0, [1, 2].into_iter()));
        assert!(threads.names_due(t0 + UNNAMED_RETRY, [2].into_iter()));
        assert!(!threads.names_due(t0 + UNNAMED_RETRY, [1].into_iter()));
        // Thread 3 was seen without a name (not a threading thread): no walk for it.
        assert!(!threads.names_due(t0 + UNNAMED_RETRY, [3].into_iter()));
        assert!(threads.names_due(t0 + NAME_KEPT, [1].into_iter()));
    }

    #[test]
    fn names_are_bounded() {
        let long = "x".repeat(1000);
        let f = thread_function(&long, 7);
        assert_eq!(f.name.chars().count(), "thread ".len() + MAX_NAME_CHARS);
        assert_eq!(&*f.filename, "tid 7");
    }
}
