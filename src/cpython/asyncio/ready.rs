//! Which waiting tasks are ready: their event loop will resume them without waiting for
//! anything more, and only waits to run them because it runs something else. Asked for the
//! tasks of one walk ([`ready_tasks`]); what is ready then shows as `ready, waiting for the
//! loop` (see `task_stacks`).
//!
//! A pending task that no thread runs is ready when:
//! - it awaits nothing (`task_fut_waiter` is NULL): its next step is in the loop's queue (a
//!   new task, or one that yielded with `await asyncio.sleep(0)`);
//! - what it awaits is done (its state no longer pending): the future's callbacks, the
//!   task's wake-up among them, are in the loop's queue;
//! - a callback that completes what it awaits (or wakes the task itself) is due: a handle in
//!   the loop's `_ready` queue (what another thread hands over with `call_soon_threadsafe`:
//!   how `to_thread` and `run_in_executor` complete their future) or a timer of its
//!   `_scheduled` heap whose time has come (`asyncio.sleep`'s) on the target's
//!   `CLOCK_MONOTONIC` (`loop.time()`). A handle names what it acts on as its callback's
//!   `self` (a bound method: `task_wakeup`), the task of a `TaskStepMethWrapper`, or its first
//!   argument (`_set_state(future, ...)`, `_set_result_unless_cancelled(future, ...)`).
//!
//! Layouts (3.14 and 3.15; `Modules/_asynciomodule.c`, checked against real interpreters by
//! the tests): a future's loop is its first field (16); its state (an `int`: 0 pending) lies
//! just before `is_task`, a task's `task_fut_waiter` just before `task_coro` (both placed
//! from the published table, see `AsyncioLayout::future_state`). A loop's `_ready` and
//! `_scheduled` are instance attributes (found through `instances`, their slots remembered
//! for [`LOOK_AGAIN`]). A deque: `ob_size` at 16, `leftblock` at 24, `leftindex` at 40,
//! blocks of 64 items after a link word, the next block's link at 520. A list: `ob_size` at
//! 16, `ob_item` at 24. A float's value at 16. A handle's `_callback`, `_args` and a timer's
//! `_when` are slots, at the offsets their class's member descriptors give (`tp_members` at
//! 240, each `PyMemberDef` 40 bytes: name, type, offset; `tp_base` at 256). A bound method's
//! `self` at 24 (`builtin_function_or_method` and `method` alike), a `TaskStepMethWrapper`'s
//! task at 16, a tuple's items at `Layout::tuple_items`.
//!
//! Best effort, never a failed sample: these objects change under the read, so whatever
//! cannot be read or is not what it should be makes no task ready. Bounded by pyfleet: at
//! most [`MAX_LOOPS`] loops, [`MAX_HANDLES`] ready handles and the first [`MAX_TIMERS`]
//! timers of each (the due ones are the heap's smallest: at its top), one type's class chain
//! [`MAX_BASES`] deep. Not read: whether a handle was cancelled (a cancelled timer still in the
//! heap wakes nothing, but its future would count); loops other than asyncio's own (uvloop's
//! queues are not Python objects): there only the first two rules apply.

use super::AsyncioLayout;
use crate::cpython::instances::{ObjectReader, OB_TYPE};
use crate::cpython::layout::Layout;
use crate::cpython::objects::read_chunks;
use crate::memory::{Bytes, RemoteMemory};
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::{Duration, Instant};

/// Most loops looked into for one walk.
pub const MAX_LOOPS: usize = 8;
/// Most handles of a loop's `_ready` queue looked at.
pub const MAX_HANDLES: usize = 256;
/// Most timers of a loop's `_scheduled` heap looked at (from its top).
pub const MAX_TIMERS: usize = 128;
/// Deepest class chain looked through.
pub const MAX_BASES: usize = 8;
/// How long a loop's attribute slots are used before they are looked for again.
pub const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// Where a future keeps its loop.
const FUTURE_LOOP: u64 = 16;
const FUTURE_STATE_PENDING: u32 = 0;
const TYPE_NAME: u64 = 24;
const TYPE_MEMBERS: u64 = 240;
const TYPE_BASE: u64 = 256;
const MEMBER_DEF_BYTES: u64 = 40;
const MEMBER_OFFSET: u64 = 16;
/// Most member descriptors of one class looked at.
const MAX_MEMBERS: u64 = 64;
const VAR_SIZE: u64 = 16;
const DEQUE_LEFTBLOCK: u64 = 24;
const DEQUE_LEFTINDEX: u64 = 40;
const DEQUE_HEAD_BYTES: usize = 48;
const BLOCK_ITEMS: u64 = 64;
const BLOCK_DATA: u64 = 8;
const BLOCK_RIGHTLINK: u64 = 520;
const LIST_ITEMS: u64 = 24;
const FLOAT_VALUE: u64 = 16;
const BOUND_SELF: u64 = 24;
const STEP_TASK: u64 = 16;
const TAG_BITS: u64 = 0b11;

/// What a type met is, for this reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `_asyncio.Future` or `_asyncio.Task`, or a class made from them.
    Future,
    /// A class with `_callback` and `_args` slots (asyncio's `Handle` and its subclasses),
    /// and `_when` for a timer.
    Handle {
        callback: u64,
        args: u64,
        when: Option<u64>,
    },
    /// `TaskStepMethWrapper`: a task's next step.
    StepWrapper,
    /// A bound method, builtin or Python.
    BoundMethod,
    Deque,
    List,
    Float,
    Other,
}

/// A loop's attribute slots: where it keeps the pointers to `_ready` and `_scheduled`.
#[derive(Debug, Clone, Copy)]
struct LoopSlots {
    ready: u64,
    scheduled: u64,
}

/// What the reader remembers between walks of one target, each map bounded (cleared when
/// full).
#[derive(Default)]
pub struct ReadyMemo {
    kinds: FxHashMap<u64, Kind>,
    /// `None`: the loop has no such attributes (not asyncio's own loop).
    loops: FxHashMap<u64, (Option<LoopSlots>, Instant)>,
}

/// Most entries of each of a [`ReadyMemo`]'s maps.
const MAX_MEMO: usize = 1024;

/// One waiting task of a walk: its address and the bytes read of it (the whole `TaskObj`).
pub struct Waiting<'b> {
    pub addr: u64,
    pub bytes: &'b [u8],
}

/// The tasks of `waiting` (pending tasks that no thread runs) that are ready at `now_s`
/// (the target's `CLOCK_MONOTONIC`, in seconds): see the module documentation.
pub fn ready_tasks<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    table: &AsyncioLayout,
    memo: &mut ReadyMemo,
    waiting: &[Waiting<'_>],
    now_s: f64,
) -> FxHashSet<u64> {
    let mut reader = Reader { mem, layout, memo };
    let mut ready = FxHashSet::default();
    let (Some(state_at), Some(waiter_at)) = (table.future_state(), table.task_fut_waiter()) else {
        return ready;
    };
    // Pending tasks and what they await.
    let mut awaiting: Vec<(u64, u64, u64)> = Vec::new();
    for t in waiting {
        let b = Bytes(t.bytes);
        let (Ok(state), Ok(waiter), Ok(lp)) =
            (b.u32(state_at), b.u64(waiter_at), b.u64(FUTURE_LOOP))
        else {
            continue;
        };
        if state != FUTURE_STATE_PENDING {
            continue;
        }
        match waiter & !TAG_BITS {
            0 => {
                ready.insert(t.addr);
            }
            w => awaiting.push((t.addr, w, lp & !TAG_BITS)),
        }
    }
    if awaiting.is_empty() {
        return ready;
    }
    // What they await, done or not.
    let mut futures: Vec<u64> = awaiting.iter().map(|a| a.1).collect();
    futures.sort_unstable();
    futures.dedup();
    let head = (state_at + 4) as usize;
    let mut buf = vec![0u8; head * futures.len()];
    let mut done = FxHashSet::default();
    if read_chunks(mem, futures.iter().map(|&f| (f, head)), &mut buf).is_ok() {
        for (i, &f) in futures.iter().enumerate() {
            let b = Bytes(&buf[i * head..(i + 1) * head]);
            let (Ok(ty), Ok(state)) = (b.u64(OB_TYPE), b.u32(state_at)) else {
                continue;
            };
            if reader.kind(ty) == Kind::Future && state != FUTURE_STATE_PENDING {
                done.insert(f);
            }
        }
    }
    let mut loops: Vec<u64> = Vec::new();
    for &(task, waiter, lp) in &awaiting {
        if done.contains(&waiter) {
            ready.insert(task);
        } else if lp != 0 && !loops.contains(&lp) && loops.len() < MAX_LOOPS {
            loops.push(lp);
        }
    }
    // What the loops will run next.
    let mut woken = FxHashSet::default();
    for lp in loops {
        reader.woken_by(lp, now_s, &mut woken);
    }
    for &(task, waiter, _) in &awaiting {
        if woken.contains(&waiter) || woken.contains(&task) {
            ready.insert(task);
        }
    }
    ready
}

struct Reader<'a, M: RemoteMemory> {
    mem: &'a M,
    layout: &'a Layout,
    memo: &'a mut ReadyMemo,
}

impl<M: RemoteMemory> Reader<'_, M> {
    /// What the type at `ty` is (remembered).
    fn kind(&mut self, ty: u64) -> Kind {
        if let Some(&k) = self.memo.kinds.get(&ty) {
            return k;
        }
        let kind = self.classify(ty).unwrap_or(Kind::Other);
        if self.memo.kinds.len() >= MAX_MEMO {
            self.memo.kinds.clear();
        }
        self.memo.kinds.insert(ty, kind);
        kind
    }

    fn classify(&self, ty: u64) -> Option<Kind> {
        let (mut callback, mut args, mut when) = (None, None, None);
        let mut at = ty;
        for depth in 0..MAX_BASES {
            if at == 0 {
                break;
            }
            let name = self.c_str(self.mem.read_u64(at + TYPE_NAME).ok()?)?;
            let named = match name.as_str() {
                "_asyncio.Future" | "_asyncio.Task" => Some(Kind::Future),
                _ if depth > 0 => None,
                "TaskStepMethWrapper" => Some(Kind::StepWrapper),
                "builtin_function_or_method" | "method" => Some(Kind::BoundMethod),
                "collections.deque" => Some(Kind::Deque),
                "list" => Some(Kind::List),
                "float" => Some(Kind::Float),
                _ => None,
            };
            if named.is_some() {
                return named;
            }
            let members = self.mem.read_u64(at + TYPE_MEMBERS).ok()?;
            if members != 0 {
                for i in 0..MAX_MEMBERS {
                    let def = members + i * MEMBER_DEF_BYTES;
                    let name = self.mem.read_u64(def).ok()?;
                    if name == 0 {
                        break;
                    }
                    let offset = self.mem.read_u64(def + MEMBER_OFFSET).ok()?;
                    let slot = match self.c_str(name)?.as_str() {
                        "_callback" => &mut callback,
                        "_args" => &mut args,
                        "_when" => &mut when,
                        _ => continue,
                    };
                    slot.get_or_insert(offset);
                }
            }
            at = self.mem.read_u64(at + TYPE_BASE).ok()?;
        }
        Some(match (callback, args) {
            (Some(callback), Some(args)) => Kind::Handle {
                callback,
                args,
                when,
            },
            _ => Kind::Other,
        })
    }

    /// The C string at `addr`, up to 64 bytes: read to the end of its page first, the next
    /// page only when the string goes on (a page after it may not be mapped).
    fn c_str(&self, addr: u64) -> Option<String> {
        const MAX: u64 = 64;
        let in_page = MAX.min(4096 - (addr % 4096));
        let mut raw = self.mem.read_vec(addr, in_page as usize).ok()?;
        if !raw.contains(&0) && in_page < MAX {
            raw.extend(
                self.mem
                    .read_vec(addr + in_page, (MAX - in_page) as usize)
                    .ok()?,
            );
        }
        let end = raw.iter().position(|&b| b == 0)?;
        String::from_utf8(raw[..end].to_vec()).ok()
    }

    /// Where the loop at `lp` keeps `_ready` and `_scheduled`, looked for again after
    /// [`LOOK_AGAIN`].
    fn slots(&mut self, lp: u64) -> Option<LoopSlots> {
        if let Some(&(slots, at)) = self.memo.loops.get(&lp) {
            if at.elapsed() < LOOK_AGAIN {
                return slots;
            }
        }
        let found = ObjectReader::new(self.mem, self.layout).and_then(|r| {
            let ready = r.attribute(lp, "_ready").ok()??;
            let scheduled = r.attribute(lp, "_scheduled").ok()??;
            Some(LoopSlots {
                ready: ready.slot,
                scheduled: scheduled.slot,
            })
        });
        if self.memo.loops.len() >= MAX_MEMO {
            self.memo.loops.clear();
        }
        self.memo.loops.insert(lp, (found, Instant::now()));
        found
    }

    /// Adds to `woken` what the handles the loop at `lp` will run next act on: its ready
    /// queue's, and its timers' due at `now_s`.
    fn woken_by(&mut self, lp: u64, now_s: f64, woken: &mut FxHashSet<u64>) {
        let Some(slots) = self.slots(lp) else {
            return;
        };
        let mut objs = [0u8; 16];
        if read_chunks(
            self.mem,
            [(slots.ready, 8), (slots.scheduled, 8)].into_iter(),
            &mut objs,
        )
        .is_err()
        {
            return;
        }
        let b = Bytes(&objs);
        let (Ok(ready), Ok(scheduled)) = (b.u64(0), b.u64(8)) else {
            return;
        };
        let mut handles = self.ready_handles(ready).unwrap_or_default();
        let ready_count = handles.len();
        handles.extend(self.timers(scheduled).unwrap_or_default());
        let _ = self.acted_on(&handles, ready_count, now_s, woken);
    }

    /// The handles of the deque at `deque`, front first.
    fn ready_handles(&mut self, deque: u64) -> Option<Vec<u64>> {
        let head = self.mem.read_vec(deque, DEQUE_HEAD_BYTES).ok()?;
        let b = Bytes(&head);
        if self.kind(b.u64(OB_TYPE).ok()?) != Kind::Deque {
            return None;
        }
        let n = (b.u64(VAR_SIZE).ok()? as usize).min(MAX_HANDLES);
        let mut block = b.u64(DEQUE_LEFTBLOCK).ok()?;
        let mut index = b.u64(DEQUE_LEFTINDEX).ok()?;
        if index >= BLOCK_ITEMS {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let take = ((BLOCK_ITEMS - index) as usize).min(n - out.len());
            let raw = self
                .mem
                .read_vec(block + BLOCK_DATA + index * 8, take * 8)
                .ok()?;
            out.extend(raw.chunks_exact(8).filter_map(|w| {
                Some(u64::from_le_bytes(w.try_into().ok()?) & !TAG_BITS).filter(|&a| a != 0)
            }));
            if out.len() < n {
                block = self.mem.read_u64(block + BLOCK_RIGHTLINK).ok()?;
                index = 0;
                if block == 0 {
                    break;
                }
            }
        }
        Some(out)
    }

    /// The first [`MAX_TIMERS`] timers of the list at `list` (a heap: the soonest first).
    fn timers(&mut self, list: u64) -> Option<Vec<u64>> {
        let head = self.mem.read_vec(list, (LIST_ITEMS + 8) as usize).ok()?;
        let b = Bytes(&head);
        if self.kind(b.u64(OB_TYPE).ok()?) != Kind::List {
            return None;
        }
        let n = (b.u64(VAR_SIZE).ok()? as usize).min(MAX_TIMERS);
        if n == 0 {
            return Some(Vec::new());
        }
        let items = b.u64(LIST_ITEMS).ok()?;
        let raw = self.mem.read_vec(items, n * 8).ok()?;
        Some(
            raw.chunks_exact(8)
                .filter_map(|w| Some(u64::from_le_bytes(w.try_into().ok()?) & !TAG_BITS))
                .filter(|&a| a != 0)
                .collect(),
        )
    }

    /// Adds what `handles` act on to `woken`: all of the first `ready_count` (the ready
    /// queue's), and of the rest (timers) those due at `now_s`.
    fn acted_on(
        &mut self,
        handles: &[u64],
        ready_count: usize,
        now_s: f64,
        woken: &mut FxHashSet<u64>,
    ) -> Option<()> {
        if handles.is_empty() {
            return Some(());
        }
        // Their types, then their slots.
        let mut heads = vec![0u8; 16 * handles.len()];
        read_chunks(self.mem, handles.iter().map(|&h| (h, 16)), &mut heads).ok()?;
        let mut kinds = Vec::with_capacity(handles.len());
        for i in 0..handles.len() {
            let ty = Bytes(&heads[i * 16..i * 16 + 16]).u64(OB_TYPE).ok()?;
            kinds.push(match self.kind(ty) {
                Kind::Handle {
                    callback,
                    args,
                    when,
                } => Some((callback, args, when.filter(|_| i >= ready_count))),
                _ => None,
            });
        }
        let mut ranges = Vec::new();
        for (&h, k) in handles.iter().zip(&kinds) {
            if let Some((callback, args, when)) = k {
                ranges.push((h + callback, 8));
                ranges.push((h + args, 8));
                ranges.push((h + when.unwrap_or(*callback), 8));
            }
        }
        let mut fields = vec![0u8; 8 * ranges.len()];
        read_chunks(self.mem, ranges.iter().copied(), &mut fields).ok()?;
        let f = Bytes(&fields);
        // The handles that run next, each with its callback and arguments; a timer's time
        // read with them.
        let mut next: Vec<(u64, u64, Option<u64>)> = Vec::new();
        let mut i = 0u64;
        for (n, k) in kinds.iter().enumerate() {
            let Some((_, _, when)) = k else {
                continue;
            };
            let word = |j: u64| f.u64((i + j) * 8).map(|w| w & !TAG_BITS);
            let (callback, args, when_obj) = (word(0).ok()?, word(1).ok()?, word(2).ok()?);
            i += 3;
            match (n < ready_count, when) {
                (true, _) => next.push((callback, args, None)),
                (false, Some(_)) => next.push((callback, args, Some(when_obj))),
                (false, None) => {}
            }
        }
        // What each callback is bound to, the first argument, and each timer's time.
        let tuple_items = self.layout.tuple_items;
        let mut ranges = Vec::new();
        for &(callback, args, when) in &next {
            ranges.push((callback, 32));
            ranges.push((args, (tuple_items + 8) as usize));
            ranges.push((when.unwrap_or(callback), 24));
        }
        let span = 32 + (tuple_items + 8) as usize + 24;
        let mut objs = vec![0u8; span * next.len()];
        read_chunks(self.mem, ranges.iter().copied(), &mut objs).ok()?;
        for (n, &(_, _, when)) in next.iter().enumerate() {
            let o = &objs[n * span..(n + 1) * span];
            let (cb, rest) = o.split_at(32);
            let (args, time) = rest.split_at((tuple_items + 8) as usize);
            if when.is_some() {
                let (Ok(ty), Ok(bits)) = (Bytes(time).u64(OB_TYPE), Bytes(time).u64(FLOAT_VALUE))
                else {
                    continue;
                };
                if self.kind(ty) != Kind::Float || f64::from_bits(bits) > now_s {
                    continue;
                }
            }
            let cb = Bytes(cb);
            if let Ok(ty) = cb.u64(OB_TYPE) {
                let bound = match self.kind(ty) {
                    Kind::BoundMethod => cb.u64(BOUND_SELF).ok(),
                    Kind::StepWrapper => cb.u64(STEP_TASK).ok(),
                    _ => None,
                };
                if let Some(b) = bound.map(|b| b & !TAG_BITS).filter(|&b| b != 0) {
                    woken.insert(b);
                }
            }
            let args = Bytes(args);
            if let (Ok(len), Ok(first)) = (args.u64(VAR_SIZE), args.u64(tuple_items)) {
                if len > 0 && first & !TAG_BITS != 0 {
                    woken.insert(first & !TAG_BITS);
                }
            }
        }
        Some(())
    }
}

/// The target's `CLOCK_MONOTONIC` now, in seconds (`loop.time()`'s clock; a target in a time
/// namespace of its own is not allowed for).
pub fn monotonic_now_s() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}
