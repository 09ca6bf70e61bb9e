//! Reading one interpreter's tasks: the lists of its threads and its own, each task's name,
//! its coroutine chain (a pending task's: the coroutines it awaits, one within the other), and
//! the tasks that await it.
//!
//! Contracts:
//! - A task is listed once, with the thread whose list holds it (`None`: the interpreter's list,
//!   tasks of threads that ended), and is running when its thread's `asyncio_running_task`
//!   names it while a loop runs there.
//! - A pending task's chain starts at its coroutine and follows what each coroutine awaits
//!   (`_PyGen_yf`: the object below its frame's stack pointer) while that is a coroutine of the
//!   same type, as CPython's own remote reader does; a cleared coroutine (a task that is done)
//!   has no frame. A running task's frames are its thread's, down to its coroutine's frame
//!   ([`RawTask::frame`]): they are the caller's to take from the thread's stack.
//! - Awaiters are tasks of the lists read: a future that is not a task (what `gather` returns)
//!   is looked through to the tasks awaiting it; a set's removed entries (hash -1) are skipped.
//! - Bounded: at most [`MAX_TASKS`] tasks, [`MAX_CHAIN`] coroutines in a chain,
//!   [`MAX_SET_SLOTS`] slots in a set of awaiters and [`MAX_FUTURES`] futures looked through
//!   per task; a list or chain that loops is a [`UnwindError::Cycle`], never a hang.

use super::super::layout::{Layout, TaskObjectsLayout, OWNED_BY_GENERATOR};
use super::super::objects::{read_chunks, unicode_header, StrData};
use super::super::UnwindError;
use super::ready::{monotonic_now_s, ready_tasks, Waiting};
use super::AsyncioLayout;
use crate::memory::capture_records::CapturedTask;
use crate::memory::{Bytes, RemoteMemory};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// Most tasks read in one interpreter.
pub const MAX_TASKS: usize = 1 << 16;
/// Most coroutines in one task's chain.
pub const MAX_CHAIN: usize = 1024;
/// Most slots of a set of awaiters read.
pub const MAX_SET_SLOTS: u64 = 1 << 16;
/// Most tasks between a task and the task nothing awaits.
pub const MAX_AWAIT_DEPTH: usize = 256;
/// Most futures that are not tasks looked through to find the tasks awaiting one task.
pub const MAX_FUTURES: usize = 256;
/// Batched reads of one task list before it counts as changing too fast to be read.
pub const LIST_ROUNDS: usize = 4;
/// Most bytes read for one walk (and read again to verify it).
pub const MAX_WITNESS_BYTES: usize = 64 << 20;

/// `Py_TPFLAGS_LONG_SUBCLASS`, `Py_TPFLAGS_UNICODE_SUBCLASS`.
const LONG_SUBCLASS: u64 = 1 << 24;
const UNICODE_SUBCLASS: u64 = 1 << 28;
/// `ob_refcnt`, the first word of every object (default builds).
const REFCOUNT_BYTES: usize = 8;
/// Tag bits of object pointers kept as `_PyStackRef`s or tagged by asyncio.
pub(crate) const TAG_BITS: u64 = 3;

/// A thread whose task list is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskThread {
    pub thread_id: u64,
    pub tstate: u64,
    /// The task it ran when its stack was read (0: none), if read then; else the walk reads
    /// it.
    pub running_task: Option<u64>,
}

/// One coroutine of a chain: its code object and instruction pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoroutineFrame {
    pub code: u64,
    pub instr: u64,
}

/// A task as read, before its code objects are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTask {
    /// The task object's address: its id.
    pub addr: u64,
    /// Untrusted (`Task.get_name()`; an unnamed task's counter gives `Task-N`).
    pub name: Arc<str>,
    pub thread_id: Option<u64>,
    pub running: bool,
    /// The frame of its coroutine (inside the coroutine object; 0 when it has none).
    pub frame: u64,
    /// A pending task's chain, innermost first (empty for a running or finished task).
    pub frames: Vec<CoroutineFrame>,
    /// The tasks awaiting it (addresses), each once.
    pub awaited_by: Vec<u64>,
    /// Pending, no thread runs it, and its loop will resume it without waiting for
    /// anything more (see `ready`).
    pub ready: bool,
}

/// What a reader remembers between reads of one target: the flags of types met and the tasks
/// of each list, each bounded (cleared when full). Names are read with each walk: a task and
/// its name object freed and made again at the same addresses is another task.
#[derive(Default)]
pub struct TaskMemo {
    type_flags: FxHashMap<u64, u64>,
    /// The tasks of each list (by its head) as the last walk met them, in order.
    lists: FxHashMap<u64, Vec<u64>>,
    /// Each coroutine chain (by its outermost coroutine) as the last walk read it: each
    /// coroutine's address, and the stack slot it awaited from and what that held (0, 0
    /// for the innermost).
    chains: FxHashMap<u64, Vec<(u64, u64, u64)>>,
    /// What the reader of ready tasks remembers.
    ready: super::ready::ReadyMemo,
}

/// Most entries of each of a [`TaskMemo`]'s maps.
const MAX_MEMO: usize = 4096;

/// A task object as read (not whether it runs, nor its frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskObject {
    pub addr: u64,
    pub name: Arc<str>,
    /// Its coroutine (0: none).
    pub coro: u64,
    /// The tasks awaiting it (see [`TaskReader::awaiters`]).
    pub awaited_by: Vec<u64>,
}

/// A task's name object: a str (its header), or an unnamed task's counter (the name it
/// stands for, and the bytes of the int that hold it).
enum NameObject {
    Str(StrData),
    Counter(String, usize),
}

/// Reads tasks of one target.
pub struct TaskReader<'a, M: RemoteMemory> {
    mem: &'a M,
    layout: &'a Layout,
    objects: &'a TaskObjectsLayout,
    table: &'a AsyncioLayout,
    memo: &'a mut TaskMemo,
    /// Every range read since the last [`TaskReader::verify`], and its bytes as read.
    witnessed: Vec<(u64, usize)>,
    witness: Vec<u8>,
    /// Ranges read ahead in one batch (the last walk's coroutine chains): a read of the same
    /// address and length takes its bytes from here (at their offset in `ahead`).
    prefetched: FxHashMap<(u64, usize), usize>,
    ahead: Vec<u8>,
}

/// A task found in a list, with its object's bytes.
struct Listed {
    addr: u64,
    thread_id: Option<u64>,
    bytes: Vec<u8>,
}

impl<'a, M: RemoteMemory> TaskReader<'a, M> {
    pub fn new(
        mem: &'a M,
        layout: &'a Layout,
        objects: &'a TaskObjectsLayout,
        table: &'a AsyncioLayout,
        memo: &'a mut TaskMemo,
    ) -> Self {
        TaskReader {
            mem,
            layout,
            objects,
            table,
            memo,
            witnessed: Vec::new(),
            witness: Vec::new(),
            prefetched: FxHashMap::default(),
            ahead: Vec::new(),
        }
    }

    /// `len` bytes at `addr`: read ahead, or read now.
    fn fetch(&self, addr: u64, len: usize) -> Result<Vec<u8>, UnwindError> {
        match self.prefetched.get(&(addr, len)) {
            Some(&o) => Ok(self.ahead[o..o + len].to_vec()),
            None => Ok(self.mem.read_vec(addr, len)?),
        }
    }

    /// Reads in one batch what the last walk read of the chains of coroutines `coros`, for
    /// the reads of this walk to take (a batch that fails is dropped: they read on their own).
    fn prefetch_chains(&mut self, coros: &[u64]) {
        let o = self.objects;
        let mut ranges: Vec<(u64, usize)> = Vec::new();
        for c in coros {
            for &(at, slot, awaited) in self.memo.chains.get(c).into_iter().flatten() {
                ranges.push((at, o.gen_size as usize));
                if slot != 0 {
                    ranges.push((slot, 8));
                    ranges.push((awaited.wrapping_add(o.ob_type), 8));
                }
            }
        }
        ranges.sort_unstable();
        ranges.dedup();
        let total: usize = ranges.iter().map(|r| r.1).sum();
        self.prefetched.clear();
        self.ahead.clear();
        if ranges.is_empty() || total > MAX_WITNESS_BYTES {
            return;
        }
        self.ahead.resize(total, 0);
        if read_chunks(self.mem, ranges.iter().copied(), &mut self.ahead).is_err() {
            self.ahead.clear();
            return;
        }
        let mut at = 0;
        for r in ranges {
            self.prefetched.insert(r, at);
            at += r.1;
        }
    }

    /// `len` bytes at `addr` (see [`TaskReader::fetch`]), within the walk's byte budget.
    fn fetch_within_budget(&self, addr: u64, len: usize) -> Result<Vec<u8>, UnwindError> {
        if self.witness.len() + len > MAX_WITNESS_BYTES {
            return Err(UnwindError::Budget("bytes of asyncio tasks read"));
        }
        self.fetch(addr, len)
    }

    /// Reads `len` bytes at `addr`, witnessed (see [`TaskReader::verify`]).
    fn read(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, UnwindError> {
        let bytes = self.fetch_within_budget(addr, len)?;
        self.witnessed.push((addr, len));
        self.witness.extend_from_slice(&bytes);
        Ok(bytes)
    }

    /// Reads `len` bytes of the object at `addr`, witnessed but for its reference count
    /// (which the target changes without changing the object).
    fn read_object(&mut self, addr: u64, len: usize) -> Result<Vec<u8>, UnwindError> {
        let bytes = self.fetch_within_budget(addr, len)?;
        self.witness_object(addr, &bytes);
        Ok(bytes)
    }

    fn witness_object(&mut self, addr: u64, bytes: &[u8]) {
        if bytes.len() > REFCOUNT_BYTES {
            self.witnessed.push((
                addr.wrapping_add(REFCOUNT_BYTES as u64),
                bytes.len() - REFCOUNT_BYTES,
            ));
            self.witness.extend_from_slice(&bytes[REFCOUNT_BYTES..]);
        }
    }

    fn word(&mut self, addr: u64) -> Result<u64, UnwindError> {
        Ok(Bytes(&self.read(addr, 8)?).u64(0)?)
    }

    /// Reads again, in one batch, everything read since the last call: what was read is one
    /// instant's (this one's) only if every byte is unchanged, else the reads are torn
    /// ([`UnwindError::Moved`]: read again, or count the sample failed).
    pub fn verify(&mut self) -> Result<(), UnwindError> {
        self.prefetched.clear();
        self.ahead.clear();
        let mut now = vec![0u8; self.witness.len()];
        let r = read_chunks(self.mem, self.witnessed.iter().copied(), &mut now);
        self.witnessed.clear();
        let same = now == self.witness;
        self.witness.clear();
        r?;
        match same {
            true => Ok(()),
            false => Err(UnwindError::Moved("asyncio tasks changed while read")),
        }
    }

    /// Which of the threads at `tstates` run a task now (each one's `asyncio_running_task`
    /// while a loop runs there), in one batched read, witnessed.
    pub fn running_tasks(&mut self, tstates: &[u64]) -> Result<Vec<Option<u64>>, UnwindError> {
        let t = self.table;
        let lo = t.thread_running_loop.min(t.thread_running_task);
        let len = (t.thread_running_loop.max(t.thread_running_task) - lo + 8) as usize;
        let ranges: Vec<(u64, usize)> = tstates
            .iter()
            .map(|&ts| (ts.wrapping_add(lo), len))
            .collect();
        let mut buf = vec![0u8; len * ranges.len()];
        read_chunks(self.mem, ranges.iter().copied(), &mut buf)?;
        self.witnessed.extend_from_slice(&ranges);
        self.witness.extend_from_slice(&buf);
        buf.chunks_exact(len)
            .map(|words| {
                let b = Bytes(words);
                if b.u64(t.thread_running_loop - lo)? == 0 {
                    return Ok(None);
                }
                let task = b.u64(t.thread_running_task - lo)? & !TAG_BITS;
                Ok((task != 0).then_some(task))
            })
            .collect()
    }

    /// The task the thread at `tstate` runs (see [`TaskReader::running_tasks`]).
    pub fn running_task(&mut self, tstate: u64) -> Result<Option<u64>, UnwindError> {
        Ok(self.running_tasks(&[tstate])?.pop().flatten())
    }

    /// The task at `addr`; its awaiters looked through as [`TaskReader::awaiters`] says.
    pub fn task(
        &mut self,
        addr: u64,
        known: Option<&FxHashSet<u64>>,
    ) -> Result<TaskObject, UnwindError> {
        let bytes = self.read_object(addr, self.table.task_size as usize)?;
        let b = Bytes(&bytes);
        if b.u8(self.table.task_is_task)? != 1 {
            return Err(UnwindError::BadObject {
                addr,
                what: "a task that is no task".into(),
            });
        }
        let name = b.u64(self.table.task_name)? & !TAG_BITS;
        let name = self.names(&[(addr, name)])?.pop().unwrap_or_default();
        self.parse(addr, &b, name, known)
    }

    fn parse(
        &mut self,
        addr: u64,
        b: &Bytes<'_>,
        name: Arc<str>,
        known: Option<&FxHashSet<u64>>,
    ) -> Result<TaskObject, UnwindError> {
        Ok(TaskObject {
            addr,
            name,
            coro: b.u64(self.table.task_coro)? & !TAG_BITS,
            awaited_by: self.awaiters(b, known)?,
        })
    }

    /// The task at `task` and the tasks awaiting it, one within the other (the lowest address
    /// of several awaiters) up to one nothing awaits, each but the first with its coroutine
    /// chain (the first runs: its frames are its thread's). A loop is a
    /// [`UnwindError::Cycle`], more than [`MAX_AWAIT_DEPTH`] tasks [`UnwindError::TooLong`].
    #[allow(clippy::type_complexity)]
    pub fn awaited_chain(
        &mut self,
        task: u64,
    ) -> Result<Vec<(TaskObject, Vec<CoroutineFrame>)>, UnwindError> {
        let first = self.task(task, None)?;
        self.awaited_chain_from(first)
    }

    /// [`TaskReader::awaited_chain`] of a running task the kernel capture copied with its
    /// thread's chain (`copy`): named as it was then. A task nothing awaited then needs no
    /// read; one that was awaited is read now for its awaiters, and must still be the task
    /// copied (its name and coroutine) and not have finished, else the chain is
    /// [`UnwindError::Moved`] (a task freed since, or another made at its address).
    #[allow(clippy::type_complexity)]
    pub fn captured_chain(
        &mut self,
        copy: &CapturedTask,
    ) -> Result<Vec<(TaskObject, Vec<CoroutineFrame>)>, UnwindError> {
        if copy.name == 0 {
            return Err(UnwindError::Moved(
                "a running task whose name the capture could not copy",
            ));
        }
        let mut first = TaskObject {
            addr: copy.addr,
            name: self.copied_name(copy.addr, copy.name & !TAG_BITS, &copy.name_head)?,
            coro: copy.coro & !TAG_BITS,
            awaited_by: Vec::new(),
        };
        if copy.awaited_by == 0 {
            return Ok(vec![(first, Vec::new())]);
        }
        let now = self.task(copy.addr, None)?;
        if now.coro != first.coro || now.name != first.name || !self.unfinished(first.coro)? {
            return Err(UnwindError::Moved(
                "a task that finished between its interrupt and the read of its awaiters",
            ));
        }
        first.awaited_by = now.awaited_by;
        self.awaited_chain_from(first)
    }

    /// The name of task `task` from the first bytes of its name object `name` as copied at
    /// an interrupt (`head`): a str's characters (`…` past those copied) or an unnamed
    /// task's counter. The type's flags are read now (a type outlives its objects).
    fn copied_name(&mut self, task: u64, name: u64, head: &[u8]) -> Result<Arc<str>, UnwindError> {
        match self.name_object(task, name, head)? {
            NameObject::Str(s) => {
                let start = usize::try_from(s.addr.wrapping_sub(name))
                    .ok()
                    .filter(|&st| s.addr >= name && st <= head.len())
                    .ok_or_else(|| UnwindError::BadObject {
                        addr: task,
                        what: "a task name whose characters lie apart from it".into(),
                    })?;
                let end = start.saturating_add(s.read_len()).min(head.len());
                let mut text = s.decode(&head[start..end]);
                if end - start < s.read_len() && !text.ends_with('…') {
                    text.push('…');
                }
                Ok(Arc::from(text))
            }
            NameObject::Counter(text, _) => Ok(Arc::from(text)),
        }
    }

    /// What the name object `name` of task `task` is, from its first bytes `head` (its
    /// type's flags read, or remembered).
    fn name_object(
        &mut self,
        task: u64,
        name: u64,
        head: &[u8],
    ) -> Result<NameObject, UnwindError> {
        let o = self.objects;
        let bad = |what: &str| UnwindError::BadObject {
            addr: task,
            what: what.into(),
        };
        let flags = self.type_flags(Bytes(head).u64(o.ob_type)?)?;
        if flags & UNICODE_SUBCLASS != 0 {
            return Ok(NameObject::Str(unicode_header(self.layout, name, head)?));
        }
        if flags & LONG_SUBCLASS == 0 {
            return Err(bad("a task name that is neither a str nor an int"));
        }
        let (text, own) = task_counter(&Bytes(head), o)
            .ok_or_else(|| bad("a task counter too large to be one"))?;
        Ok(NameObject::Counter(text, own))
    }

    /// [`TaskReader::awaited_chain`] from its first task, already read.
    #[allow(clippy::type_complexity)]
    fn awaited_chain_from(
        &mut self,
        first: TaskObject,
    ) -> Result<Vec<(TaskObject, Vec<CoroutineFrame>)>, UnwindError> {
        let task = first.addr;
        let mut chain = vec![(first, Vec::new())];
        let mut seen = vec![task];
        while let Some(&parent) = chain.last().and_then(|(t, _)| t.awaited_by.first()) {
            if seen.contains(&parent) {
                return Err(UnwindError::Cycle("tasks awaiting each other"));
            }
            if chain.len() >= MAX_AWAIT_DEPTH {
                return Err(UnwindError::TooLong(
                    "tasks awaiting one another",
                    MAX_AWAIT_DEPTH,
                ));
            }
            seen.push(parent);
            let awaiting = self.task(parent, None)?;
            let frames = match awaiting.coro {
                0 => Vec::new(),
                c => self.coroutine_chain(c)?,
            };
            chain.push((awaiting, frames));
        }
        Ok(chain)
    }

    /// How many tasks the lists of the interpreter at `interp` and its `threads` hold (the
    /// lists alone are read).
    pub fn listed(&mut self, interp: u64, threads: &[TaskThread]) -> Result<usize, UnwindError> {
        Ok(self.walk_lists(interp, threads)?.0.len())
    }

    /// The tasks of the lists of `threads` and of the interpreter at `interp`, and their set.
    fn walk_lists(
        &mut self,
        interp: u64,
        threads: &[TaskThread],
    ) -> Result<(Vec<Listed>, FxHashSet<u64>), UnwindError> {
        let mut listed = Vec::new();
        let mut seen = FxHashSet::default();
        for t in threads {
            let head = t.tstate.wrapping_add(self.table.thread_tasks_head);
            self.list(head, Some(t.thread_id), &mut listed, &mut seen)?;
        }
        let head = interp.wrapping_add(self.table.interp_tasks_head);
        self.list(head, None, &mut listed, &mut seen)?;
        Ok((listed, seen))
    }

    /// Every task of the interpreter at `interp` whose threads are `threads`.
    pub fn all_tasks(
        &mut self,
        interp: u64,
        threads: &[TaskThread],
    ) -> Result<Vec<RawTask>, UnwindError> {
        let sampled: Option<Vec<Option<u64>>> = threads
            .iter()
            .map(|t| t.running_task.map(|task| (task != 0).then_some(task)))
            .collect();
        let runs = match sampled {
            Some(runs) => runs,
            None => {
                let tstates: Vec<u64> = threads.iter().map(|t| t.tstate).collect();
                self.running_tasks(&tstates)?
            }
        };
        let running: FxHashMap<u64, u64> = runs
            .into_iter()
            .zip(threads)
            .filter_map(|(task, t)| Some((task?, t.thread_id)))
            .collect();
        let (listed, seen) = self.walk_lists(interp, threads)?;

        let name_objects = listed
            .iter()
            .map(|l| {
                Ok((
                    l.addr,
                    Bytes(&l.bytes).u64(self.table.task_name)? & !TAG_BITS,
                ))
            })
            .collect::<Result<Vec<(u64, u64)>, UnwindError>>()?;
        let names = self.names(&name_objects)?;
        let coros = listed
            .iter()
            .filter(|l| !running.contains_key(&l.addr))
            .map(|l| Ok(Bytes(&l.bytes).u64(self.table.task_coro)? & !TAG_BITS))
            .collect::<Result<Vec<u64>, UnwindError>>()?;
        self.prefetch_chains(&coros);
        let waiting: Vec<Waiting<'_>> = listed
            .iter()
            .filter(|l| !running.contains_key(&l.addr))
            .map(|l| Waiting {
                addr: l.addr,
                bytes: &l.bytes,
            })
            .collect();
        let ready = ready_tasks(
            self.mem,
            self.layout,
            self.table,
            &mut self.memo.ready,
            &waiting,
            monotonic_now_s(),
        );
        let mut tasks = Vec::with_capacity(listed.len());
        for (l, name) in listed.iter().zip(names) {
            let task = self.parse(l.addr, &Bytes(&l.bytes), name, Some(&seen))?;
            let running_on = running.get(&l.addr).copied();
            let frames = match (running_on, task.coro) {
                (None, c) if c != 0 => self.coroutine_chain(c)?,
                _ => Vec::new(),
            };
            tasks.push(RawTask {
                addr: l.addr,
                name: task.name,
                thread_id: running_on.or(l.thread_id),
                running: running_on.is_some(),
                frame: self.frame_of(task.coro),
                frames,
                awaited_by: task.awaited_by,
                ready: ready.contains(&l.addr),
            });
        }
        // A task its thread ran when the sample read it, and no list holds now: it finished
        // (and was freed) since. Read where it was: its thread's chain, read with it, shows it
        // if it is the task that ran then (another task made at its address has another
        // coroutine, whose frame the chain does not hold); memory that is no task now is
        // left out, its thread showing its own stack.
        let mut gone: Vec<(u64, u64)> = running
            .iter()
            .filter(|(addr, _)| !seen.contains(addr))
            .map(|(&addr, &thread)| (addr, thread))
            .collect();
        gone.sort_unstable();
        for (addr, thread_id) in gone {
            let Ok(task) = self.task(addr, Some(&seen)) else {
                continue;
            };
            tasks.push(RawTask {
                addr,
                name: task.name,
                thread_id: Some(thread_id),
                running: true,
                frame: self.frame_of(task.coro),
                frames: Vec::new(),
                awaited_by: task.awaited_by,
                ready: false,
            });
        }
        Ok(tasks)
    }

    /// Where the frame of coroutine `coro` is (0 for none).
    pub fn frame_of(&self, coro: u64) -> u64 {
        match coro {
            0 => 0,
            c => c.wrapping_add(self.objects.gen_iframe),
        }
    }

    /// Appends the tasks of the circular list whose head is at `head`, read in one batch:
    /// the tasks the last walk of this list met, the head's link, and then, when the list
    /// is not all in it, the tasks it did not know (learnt one link at a time, then read in
    /// one batch again), at most [`LIST_ROUNDS`] batches.
    fn list(
        &mut self,
        head: u64,
        thread_id: Option<u64>,
        listed: &mut Vec<Listed>,
        seen: &mut FxHashSet<u64>,
    ) -> Result<(), UnwindError> {
        let next_at = self.table.task_node + self.objects.llist_next;
        let size = self.table.task_size as usize;
        let head_link = head.wrapping_add(self.objects.llist_next);
        let mut known: Vec<u64> = self.memo.lists.get(&head).cloned().unwrap_or_default();
        for _ in 0..LIST_ROUNDS {
            let ranges: Vec<(u64, usize)> = std::iter::once((head_link, 8))
                .chain(known.iter().map(|&t| (t, size)))
                .collect();
            let total = 8 + known.len() * size;
            if self.witness.len() + total > MAX_WITNESS_BYTES {
                return Err(UnwindError::Budget("bytes of asyncio tasks read"));
            }
            let mut buf = vec![0u8; total];
            if let Err(e) = read_chunks(self.mem, ranges.iter().copied(), &mut buf) {
                // A task of the last walk is gone (its memory with it): from the head again.
                if known.is_empty() {
                    return Err(e);
                }
                known.clear();
                continue;
            }
            let at: FxHashMap<u64, usize> = known
                .iter()
                .enumerate()
                .map(|(i, &t)| (t, 8 + i * size))
                .collect();
            let mut node = Bytes(&buf).u64(0)?;
            let mut order = Vec::new();
            let mut local = FxHashSet::default();
            let mut unknown = None;
            while node != head {
                if node == 0 {
                    return Err(UnwindError::BadObject {
                        addr: head,
                        what: "a task list that does not come back to its head".into(),
                    });
                }
                if listed.len() + order.len() >= MAX_TASKS {
                    return Err(UnwindError::TooLong("task lists", MAX_TASKS));
                }
                let addr = node.wrapping_sub(self.table.task_node);
                if !local.insert(addr) {
                    return Err(UnwindError::Cycle("task list"));
                }
                let Some(&o) = at.get(&addr) else {
                    unknown = Some(addr);
                    break;
                };
                let b = Bytes(&buf[o..o + size]);
                if b.u8(self.table.task_is_task)? != 1 {
                    return Err(UnwindError::BadObject {
                        addr,
                        what: "a task list holds an object that is not a task".into(),
                    });
                }
                order.push((addr, o));
                node = b.u64(next_at)?;
            }
            let Some(first_unknown) = unknown else {
                for &(addr, o) in &order {
                    if !seen.insert(addr) {
                        return Err(UnwindError::Cycle("task lists"));
                    }
                    listed.push(Listed {
                        addr,
                        thread_id,
                        bytes: buf[o..o + size].to_vec(),
                    });
                }
                self.witnessed.push((head_link, 8));
                self.witness.extend_from_slice(&buf[..8]);
                for (i, &t) in known.iter().enumerate() {
                    let o = 8 + i * size;
                    self.witness_object(t, &buf[o..o + size]);
                }
                if self.memo.lists.len() >= MAX_MEMO {
                    self.memo.lists.clear();
                }
                self.memo
                    .lists
                    .insert(head, order.iter().map(|&(a, _)| a).collect());
                return Ok(());
            };
            // Learn the rest of the list one link at a time; the next batch reads it whole.
            known = order.iter().map(|&(a, _)| a).collect();
            let mut addr = first_unknown;
            loop {
                if listed.len() + known.len() >= MAX_TASKS
                    || !local.insert(addr) && addr != first_unknown
                {
                    break;
                }
                known.push(addr);
                let Ok(next) = self.mem.read_u64(addr.wrapping_add(next_at)) else {
                    break;
                };
                if next == head || next == 0 {
                    break;
                }
                addr = next.wrapping_sub(self.table.task_node);
            }
        }
        Err(UnwindError::Moved("a task list changed while read"))
    }

    /// `Task.get_name()` of each (task, name object): a string, or `Task-N` for the counter
    /// an unnamed task keeps. Two batched reads for all: the objects' heads, then the
    /// characters of the strings longer than a head holds.
    fn names(&mut self, objs: &[(u64, u64)]) -> Result<Vec<Arc<str>>, UnwindError> {
        let o = self.objects;
        let head = ((self.layout.unicode.compact_size + 8).max(o.long_digit + 8)) as usize;
        if let Some(&(task, _)) = objs.iter().find(|(_, n)| *n == 0) {
            return Err(UnwindError::BadObject {
                addr: task,
                what: "a task without a name".into(),
            });
        }
        let mut heads = vec![0u8; head * objs.len()];
        read_chunks(self.mem, objs.iter().map(|&(_, n)| (n, head)), &mut heads)?;
        let mut names: Vec<Option<String>> = Vec::with_capacity(objs.len());
        let mut data = Vec::new();
        for (&(task, name), h) in objs.iter().zip(heads.chunks_exact(head)) {
            match self.name_object(task, name, h)? {
                NameObject::Str(s) => {
                    let start = s.addr.wrapping_sub(name) as usize;
                    // Only the object's own bytes are witnessed: past it lie others'.
                    match start.checked_add(s.read_len()) {
                        Some(end) if s.addr >= name && end <= head => {
                            self.witness_object(name, &h[..end]);
                            names.push(Some(s.decode(&h[start..end])))
                        }
                        _ => {
                            let own = (self.layout.unicode.ascii_size as usize).min(head);
                            self.witness_object(name, &h[..own]);
                            data.push((names.len(), s));
                            names.push(None);
                        }
                    }
                }
                NameObject::Counter(text, own) => {
                    self.witness_object(name, &h[..own.min(head)]);
                    names.push(Some(text));
                }
            }
        }
        if !data.is_empty() {
            let mut chars = vec![0u8; data.iter().map(|(_, s)| s.read_len()).sum()];
            read_chunks(
                self.mem,
                data.iter().map(|(_, s)| (s.addr, s.read_len())),
                &mut chars,
            )?;
            let mut at = 0;
            for (i, s) in &data {
                let bytes = &chars[at..at + s.read_len()];
                self.witnessed.push((s.addr, bytes.len()));
                self.witness.extend_from_slice(bytes);
                names[*i] = Some(s.decode(bytes));
                at += s.read_len();
            }
        }
        Ok(names
            .into_iter()
            .map(|n| Arc::from(n.unwrap_or_default()))
            .collect())
    }

    /// `tp_flags` of the type at `ty` (types live as long as their objects: remembered).
    fn type_flags(&mut self, ty: u64) -> Result<u64, UnwindError> {
        if let Some(&f) = self.memo.type_flags.get(&ty) {
            return Ok(f);
        }
        let flags = self.mem.read_u64(ty.wrapping_add(self.objects.tp_flags))?;
        if self.memo.type_flags.len() >= MAX_MEMO {
            self.memo.type_flags.clear();
        }
        self.memo.type_flags.insert(ty, flags);
        Ok(flags)
    }

    /// The chain of coroutines from `coro` inwards, innermost first.
    pub fn coroutine_chain(&mut self, coro: u64) -> Result<Vec<CoroutineFrame>, UnwindError> {
        let o = self.objects;
        let f = &self.layout.frame;
        let mut chain = Vec::new();
        let mut visited = FxHashSet::default();
        let mut links = Vec::new();
        let mut at = coro;
        loop {
            links.push((at, 0, 0));
            if chain.len() >= MAX_CHAIN {
                return Err(UnwindError::TooLong("coroutine chain", MAX_CHAIN));
            }
            let raw = self.read_object(at, o.gen_size as usize)?;
            let g = Bytes(&raw);
            let state = g.u8(o.gen_frame_state)? as i8;
            if state == o.gen_cleared {
                break;
            }
            let frame = o.gen_iframe;
            if g.u8(frame + f.owner)? != OWNED_BY_GENERATOR {
                return Err(UnwindError::BadObject {
                    addr: at,
                    what: "a coroutine whose frame is not its own".into(),
                });
            }
            chain.push(CoroutineFrame {
                code: g.u64(frame + f.code)? & !f.code_tag_mask,
                instr: g.u64(frame + f.instr)?,
            });
            if !o.gen_yield_from.contains(&state) {
                break;
            }
            let stack_pointer = g.u64(frame + o.frame_stackpointer)?;
            let slot = stack_pointer.wrapping_sub(8 * o.awaited_depth);
            if stack_pointer == 0 || slot > stack_pointer {
                break;
            }
            let awaited = self.word(slot)? & !TAG_BITS;
            if awaited == 0 || self.word(awaited.wrapping_add(o.ob_type))? != g.u64(o.ob_type)? {
                break;
            }
            if !visited.insert(awaited) || awaited == coro {
                return Err(UnwindError::Cycle("coroutine chain"));
            }
            if let Some(last) = links.last_mut() {
                *last = (at, slot, awaited);
            }
            at = awaited;
        }
        if self.memo.chains.len() >= MAX_MEMO {
            self.memo.chains.clear();
        }
        self.memo.chains.insert(coro, links);
        chain.reverse();
        Ok(chain)
    }

    /// Whether coroutine `coro` has not finished, witnessed.
    pub fn unfinished(&mut self, coro: u64) -> Result<bool, UnwindError> {
        if coro == 0 {
            return Ok(false);
        }
        let o = self.objects;
        let raw = self.read_object(coro, o.gen_size as usize)?;
        Ok(!o
            .gen_finished
            .contains(&(Bytes(&raw).u8(o.gen_frame_state)? as i8)))
    }

    /// The tasks awaiting the future whose bytes are `b`, looking through futures that are
    /// not tasks (what `gather` returns), each task once, lowest address first. With
    /// `known` (the tasks of the lists read), an awaiter there is a task without reading it,
    /// and a task not there (made since) is left out.
    pub fn awaiters(
        &mut self,
        b: &Bytes<'_>,
        known: Option<&FxHashSet<u64>>,
    ) -> Result<Vec<u64>, UnwindError> {
        let t = self.table;
        let mut out = Vec::new();
        let mut pending = vec![(
            b.u64(t.task_awaited_by)? & !TAG_BITS,
            b.u8(t.task_awaited_by_is_set)? != 0,
        )];
        let mut looked_through = FxHashSet::default();
        while let Some((awaited_by, is_set)) = pending.pop() {
            if awaited_by == 0 {
                continue;
            }
            let keys = match is_set {
                true => self.set_keys(awaited_by)?,
                false => vec![awaited_by],
            };
            for key in keys {
                if known.is_some_and(|k| k.contains(&key)) {
                    out.push(key);
                    continue;
                }
                if !looked_through.insert(key) {
                    continue;
                }
                if looked_through.len() > MAX_FUTURES {
                    return Err(UnwindError::TooLong("futures awaiting a task", MAX_FUTURES));
                }
                let raw = self.read_object(key, t.future_span() as usize)?;
                let f = Bytes(&raw);
                if f.u8(t.task_is_task)? != 0 {
                    if known.is_none() {
                        out.push(key);
                    }
                    continue;
                }
                pending.push((
                    f.u64(t.task_awaited_by)? & !TAG_BITS,
                    f.u8(t.task_awaited_by_is_set)? != 0,
                ));
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The keys of the set at `set` (its removed entries, whose hash is -1, skipped).
    fn set_keys(&mut self, set: u64) -> Result<Vec<u64>, UnwindError> {
        let o = self.objects;
        let raw = self.read_object(set, o.set_size as usize)?;
        let s = Bytes(&raw);
        let used = s.i64(o.set_used)?;
        let mask = s.i64(o.set_mask)?;
        let table = s.u64(o.set_table)?;
        let slots = mask.wrapping_add(1);
        if mask < 0 || slots as u64 > MAX_SET_SLOTS || used < 0 || used > slots {
            return Err(UnwindError::BadObject {
                addr: set,
                what: format!("a set of awaiters with mask {mask} and {used} entries"),
            });
        }
        let entries = self.read(table, slots as usize * 16)?;
        let e = Bytes(&entries);
        let mut keys = Vec::with_capacity(used as usize);
        for i in 0..slots as u64 {
            let key = e.u64(i * 16)?;
            if key != 0 && e.i64(i * 16 + 8)? != -1 {
                keys.push(key);
            }
        }
        Ok(keys)
    }
}

/// `Task-N` from the head of the int object an unnamed task keeps (compact ints: `lv_tag` is
/// the digit count shifted by 3, with the sign in its low two bits: 0 positive, 1 zero, 2
/// negative; digits are 30 bits); `None` for more than two digits.
/// With the bytes the object takes up to its last digit.
fn task_counter(b: &Bytes<'_>, o: &TaskObjectsLayout) -> Option<(String, usize)> {
    let tag = b.u64(o.long_lv_tag).ok()?;
    let digits = tag >> 3;
    let sign = tag & 3;
    if digits > 2 || sign == 3 {
        return None;
    }
    let d0 = u64::from(b.u32(o.long_digit).ok()?);
    let d1 = u64::from(b.u32(o.long_digit + 4).ok()?);
    let value = match (sign, digits) {
        (1, _) | (_, 0) => 0,
        (_, 1) => d0,
        _ => d0 | (d1 << 30),
    };
    let text = match sign {
        2 => format!("Task--{value}"),
        _ => format!("Task-{value}"),
    };
    Some((text, (o.long_digit + 4 * digits.max(1)) as usize))
}

#[cfg(test)]
mod tests {
    //! Hostile task graphs on the in-memory image: every walk ends, within its bounds, with
    //! the error that says why.
    use super::*;
    use crate::cpython::synthetic;
    use crate::memory::capture_records::TASK_NAME_BYTES;
    use crate::memory::MemoryImage;

    const BASE: u64 = 0x1000_0000;
    /// 3.14.10's `_Py_AsyncioModuleDebugOffsets`.
    const TABLE: [u64; 13] = [
        0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x37248, 0x2a80, 0x3a8, 0x360, 0x368, 0x370,
    ];

    struct World {
        bytes: Vec<u8>,
        next: u64,
        str_type: u64,
    }

    impl World {
        fn new(size: usize) -> World {
            let mut w = World {
                bytes: vec![0; size],
                next: BASE,
                str_type: 0,
            };
            w.str_type = w.alloc(0x100);
            w.put_u64(w.str_type + 0xa8, UNICODE_SUBCLASS);
            w
        }
        fn alloc(&mut self, n: u64) -> u64 {
            let at = self.next;
            self.next += (n + 15) & !15;
            at
        }
        fn put_u64(&mut self, at: u64, v: u64) {
            let o = (at - BASE) as usize;
            self.bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        fn put_u8(&mut self, at: u64, v: u8) {
            self.bytes[(at - BASE) as usize] = v;
        }
        /// A compact ASCII string (the synthetic layout's).
        fn string(&mut self, s: &str) -> u64 {
            let at = self.alloc(0x28 + s.len() as u64 + 1);
            self.put_u64(at + 8, self.str_type);
            self.put_u64(at + 0x10, s.len() as u64);
            let state: u64 = (1 << 2) | (1 << 5) | (1 << 6);
            self.put_u64(at + 0x20, state);
            let o = (at - BASE) as usize + 0x28;
            self.bytes[o..o + s.len()].copy_from_slice(s.as_bytes());
            at
        }
        /// A task (no coroutine) named `name`, awaited by `awaited_by` (0: none).
        fn task(&mut self, name: u64, awaited_by: u64, is_task: bool) -> u64 {
            let at = self.alloc(0xa8);
            self.put_u8(at + 0x6c, u8::from(is_task));
            self.put_u64(at + 0x88, name);
            self.put_u64(at + 0x60, awaited_by);
            at
        }
        /// A thread state whose task list holds `tasks` in order; its address.
        fn thread(&mut self, tasks: &[u64]) -> u64 {
            let ts = self.alloc(0x3a8);
            let head = ts + 0x370;
            let nodes: Vec<u64> = tasks.iter().map(|t| t + 0x98).collect();
            let mut prev = head;
            for &n in &nodes {
                self.put_u64(prev, n);
                prev = n;
            }
            self.put_u64(prev, head);
            ts
        }
        fn interp(&mut self) -> u64 {
            let i = self.alloc(0x2a90);
            self.put_u64(i + 0x2a80, i + 0x2a80);
            i
        }
        fn image(self) -> MemoryImage {
            let mut img = MemoryImage::new();
            img.map(BASE, self.bytes);
            img
        }
    }

    fn objects() -> TaskObjectsLayout {
        TaskObjectsLayout {
            ob_type: 8,
            tp_flags: 0xa8,
            gen_size: 0x48 + 0x50,
            gen_iframe: 0x48,
            gen_frame_state: 0x43,
            gen_cleared: 4,
            gen_yield_from: &[-1],
            gen_finished: &[1, 4],
            frame_stackpointer: 0x28,
            awaited_depth: 1,
            set_size: 0x30,
            set_used: 0x18,
            set_mask: 0x20,
            set_table: 0x28,
            long_lv_tag: 0x10,
            long_digit: 0x18,
            llist_next: 0,
        }
    }

    fn table() -> AsyncioLayout {
        let raw: Vec<u8> = TABLE.iter().flat_map(|w| w.to_le_bytes()).collect();
        AsyncioLayout::parse(&raw).expect("3.14's table")
    }

    fn read_all(img: &MemoryImage, interp: u64, ts: u64) -> Result<Vec<RawTask>, UnwindError> {
        read_all_running(img, interp, ts, None)
    }

    /// [`read_all`] of a thread whose running task the sample read (`Some`), or not.
    fn read_all_running(
        img: &MemoryImage,
        interp: u64,
        ts: u64,
        running_task: Option<u64>,
    ) -> Result<Vec<RawTask>, UnwindError> {
        let (layout, objects, table) = (synthetic::layout(), objects(), table());
        let mut memo = TaskMemo::default();
        let mut reader = TaskReader::new(img, &layout, &objects, &table, &mut memo);
        let tasks = reader.all_tasks(
            interp,
            &[TaskThread {
                thread_id: 1,
                tstate: ts,
                running_task,
            }],
        )?;
        reader.verify()?;
        Ok(tasks)
    }

    #[test]
    fn the_running_task_is_the_one_the_sample_read() {
        let mut w = World::new(1 << 20);
        let (n1, n2, n3) = (w.string("listed"), w.string("finished"), w.string("freed"));
        let listed = w.task(n1, 0, true);
        // Ran as the sample read its thread, then finished: no list holds it now.
        let finished = w.task(n2, 0, true);
        // Freed since, and its memory no task now.
        let freed = w.task(n3, 0, false);
        let ts = w.thread(&[listed]);
        let interp = w.interp();
        let img = w.image();
        let running = |tasks: &[RawTask]| -> Vec<(String, Option<u64>)> {
            tasks
                .iter()
                .filter(|t| t.running)
                .map(|t| (t.name.to_string(), t.thread_id))
                .collect()
        };
        // The thread state in the image names no running task: the sample's word is used.
        let tasks = read_all_running(&img, interp, ts, Some(listed)).expect("read");
        assert_eq!(running(&tasks), [("listed".to_string(), Some(1))]);
        let tasks = read_all_running(&img, interp, ts, Some(finished)).expect("read");
        assert_eq!(running(&tasks), [("finished".to_string(), Some(1))]);
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        let tasks = read_all_running(&img, interp, ts, Some(freed)).expect("read");
        assert_eq!(running(&tasks), []);
        assert_eq!(tasks.len(), 1, "{tasks:?}");
        let tasks = read_all_running(&img, interp, ts, Some(0)).expect("read");
        assert_eq!(running(&tasks), []);
    }

    #[test]
    fn a_sound_graph_is_read() {
        let mut w = World::new(1 << 20);
        let (n1, n2) = (w.string("parent"), w.string("child"));
        let parent = w.task(n1, 0, true);
        let child = w.task(n2, parent, true);
        let ts = w.thread(&[parent, child]);
        let interp = w.interp();
        let tasks = read_all(&w.image(), interp, ts).expect("read");
        let names: Vec<(&str, Vec<u64>)> = tasks
            .iter()
            .map(|t| (&*t.name, t.awaited_by.clone()))
            .collect();
        assert_eq!(names, [("parent", vec![]), ("child", vec![parent])]);
    }

    #[test]
    fn a_million_tasks_end_at_the_bound() {
        // One more task than the bound is enough to show it; a million would only take longer
        // to build (the walk stops at the bound whatever the list's length).
        let n = MAX_TASKS + 1;
        let mut w = World::new(n * 0xb0 + (1 << 20));
        let name = w.string("many");
        let tasks: Vec<u64> = (0..n).map(|_| w.task(name, 0, true)).collect();
        let ts = w.thread(&tasks);
        let interp = w.interp();
        let started = std::time::Instant::now();
        let r = read_all(&w.image(), interp, ts);
        assert!(
            matches!(r, Err(UnwindError::TooLong("task lists", MAX_TASKS))),
            "{r:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn a_list_that_never_comes_back_is_a_cycle() {
        let mut w = World::new(1 << 20);
        let name = w.string("loop");
        let tasks: Vec<u64> = (0..3).map(|_| w.task(name, 0, true)).collect();
        let ts = w.thread(&tasks);
        // The last links back to the second, not to the head.
        w.put_u64(tasks[2] + 0x98, tasks[1] + 0x98);
        let interp = w.interp();
        let r = read_all(&w.image(), interp, ts);
        assert!(matches!(r, Err(UnwindError::Cycle(_))), "{r:?}");
    }

    #[test]
    fn tasks_awaiting_each_other_are_a_cycle() {
        let mut w = World::new(1 << 20);
        let name = w.string("a");
        let a = w.task(name, 0, true);
        let b = w.task(name, a, true);
        w.put_u64(a + 0x60, b);
        let img = w.image();
        let (layout, objects, table) = (synthetic::layout(), objects(), table());
        let mut memo = TaskMemo::default();
        let mut reader = TaskReader::new(&img, &layout, &objects, &table, &mut memo);
        let r = reader.awaited_chain(a);
        assert!(matches!(r, Err(UnwindError::Cycle(_))), "{r:?}");
    }

    #[test]
    fn futures_awaiting_each_other_end() {
        let mut w = World::new(1 << 20);
        let name = w.string("t");
        let f1 = w.task(0, 0, false);
        let f2 = w.task(0, f1, false);
        w.put_u64(f1 + 0x60, f2);
        let t = w.task(name, f1, true);
        let ts = w.thread(&[t]);
        let interp = w.interp();
        let tasks = read_all(&w.image(), interp, ts).expect("read");
        assert_eq!(tasks.len(), 1);
        assert!(tasks[0].awaited_by.is_empty());
    }

    #[test]
    fn a_set_of_awaiters_too_large_is_refused() {
        let mut w = World::new(1 << 20);
        let name = w.string("t");
        let set = w.alloc(0x40);
        w.put_u64(set + 0x18, 3);
        w.put_u64(set + 0x20, (1 << 20) - 1);
        w.put_u64(set + 0x28, set);
        let t = w.task(name, set, true);
        w.put_u8(t + 0x6d, 1);
        let ts = w.thread(&[t]);
        let interp = w.interp();
        let r = read_all(&w.image(), interp, ts);
        assert!(matches!(r, Err(UnwindError::BadObject { .. })), "{r:?}");
    }

    #[test]
    fn a_list_changed_after_it_was_read_fails_verification() {
        let mut w = World::new(1 << 20);
        let name = w.string("t");
        let tasks: Vec<u64> = (0..3).map(|_| w.task(name, 0, true)).collect();
        let ts = w.thread(&tasks);
        let interp = w.interp();
        let img = w.image();
        let (layout, objects, table) = (synthetic::layout(), objects(), table());
        let mut memo = TaskMemo::default();
        {
            let mut reader = TaskReader::new(&img, &layout, &objects, &table, &mut memo);
            let thread = TaskThread {
                thread_id: 1,
                tstate: ts,
                running_task: None,
            };
            assert_eq!(reader.all_tasks(interp, &[thread]).expect("read").len(), 3);
        }
        // The second task is unlinked between the walk and its verifying read.
        img.poke(tasks[0] + 0x98, &(tasks[2] + 0x98).to_le_bytes());
        let mut reader = TaskReader::new(&img, &layout, &objects, &table, &mut memo);
        let thread = TaskThread {
            thread_id: 1,
            tstate: ts,
            running_task: None,
        };
        reader.all_tasks(interp, &[thread]).expect("read again");
        img.poke(tasks[0] + 0x98, &(tasks[1] + 0x98).to_le_bytes());
        let r = reader.verify();
        assert!(matches!(r, Err(UnwindError::Moved(_))), "{r:?}");
    }

    /// The copy the kernel capture would make of the task at `task` (its name object's first
    /// bytes), as it is in `w` now.
    fn copy_of(w: &World, task: u64, name: u64, awaited_by: u64) -> CapturedTask {
        let o = (name - BASE) as usize;
        let mut name_head = [0u8; TASK_NAME_BYTES];
        name_head.copy_from_slice(&w.bytes[o..o + TASK_NAME_BYTES]);
        CapturedTask {
            addr: task,
            name,
            coro: 0,
            awaited_by,
            name_head,
        }
    }

    #[test]
    fn a_copied_task_is_named_as_copied_and_one_replaced_since_fails() {
        let mut w = World::new(1 << 20);
        let short = w.string("request-7");
        let long_text = "x".repeat(200);
        let long = w.string(&long_text);
        let root = w.task(short, 0, true);
        let child = w.task(short, root, true);
        // The child runs a coroutine that has not finished (frame state 0: created).
        let coro = w.alloc(objects().gen_size);
        w.put_u64(child + table().task_coro, coro);
        let other = w.string("another");
        let (short_copy, long_copy) = (copy_of(&w, root, short, 0), copy_of(&w, root, long, 0));
        let child_copy = CapturedTask {
            coro,
            ..copy_of(&w, child, short, root)
        };
        let img = w.image();
        let (layout, objects, table) = (synthetic::layout(), objects(), table());
        let mut memo = TaskMemo::default();
        let mut reader = TaskReader::new(&img, &layout, &objects, &table, &mut memo);
        // Nothing awaited it: named from the copy alone.
        let chain = reader.captured_chain(&short_copy).expect("named");
        assert_eq!(chain.len(), 1);
        assert_eq!(&*chain[0].0.name, "request-7");
        // A name longer than the bytes copied ends in an ellipsis.
        let name = reader.captured_chain(&long_copy).expect("named")[0]
            .0
            .name
            .clone();
        assert!(name.ends_with('…') && name.starts_with("xxxx"), "{name}");
        assert!(name.chars().count() < long_text.len());
        // Awaited: its awaiter is read now, and it is still the task copied.
        let chain = reader.captured_chain(&child_copy).expect("awaited");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1].0.addr, root);
        // Another task made at its address since (another name): the sample fails.
        img.poke(child + 0x88, &other.to_le_bytes());
        let mut reader = TaskReader::new(&img, &layout, &objects, &table, &mut memo);
        let r = reader.captured_chain(&child_copy);
        assert!(matches!(r, Err(UnwindError::Moved(_))), "{r:?}");
        // A name the capture could not copy fails too.
        let r = reader.captured_chain(&CapturedTask {
            name: 0,
            ..short_copy
        });
        assert!(matches!(r, Err(UnwindError::Moved(_))), "{r:?}");
    }
}
