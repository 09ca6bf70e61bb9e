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
use crate::cpython::instances::{c_string, type_name, ObjectReader, OB_TYPE};
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
/// How long a loop's attribute slots are used before they are looked for again, and a type
/// found to be of no kind wanted is believed.
pub const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// How long what a type is stays remembered (a class freed and another made at its
/// address is another type).
pub const KIND_LIFE: Duration = Duration::from_secs(60);

/// Where a future keeps its loop.
const FUTURE_LOOP: u64 = 16;
const FUTURE_STATE_PENDING: u32 = 0;
/// Longest class or member name read.
const MAX_NAME: usize = 64;
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
    kinds: FxHashMap<u64, (Kind, Instant)>,
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
    // The loops the rest wait on, and where each keeps its queues.
    let mut loops: Vec<(u64, LoopSlots)> = Vec::new();
    for &(_, _, lp) in &awaiting {
        if lp != 0 && loops.len() < MAX_LOOPS && !loops.iter().any(|(l, _)| *l == lp) {
            if let Some(slots) = reader.slots(lp) {
                loops.push((lp, slots));
            }
        }
    }
    // What they await, done or not, and the loops' queues: one batch.
    let mut futures: Vec<u64> = awaiting.iter().map(|a| a.1).collect();
    futures.sort_unstable();
    futures.dedup();
    let head = (state_at + 4) as usize;
    let ranges = futures.iter().map(|&f| (f, head)).chain(
        loops
            .iter()
            .flat_map(|(_, s)| [(s.ready, 8), (s.scheduled, 8)]),
    );
    let mut buf = vec![0u8; head * futures.len() + 16 * loops.len()];
    if read_chunks(mem, ranges, &mut buf).is_err() {
        return ready;
    }
    let (heads, queues) = buf.split_at(head * futures.len());
    let mut done = FxHashSet::default();
    for (i, &f) in futures.iter().enumerate() {
        let b = Bytes(&heads[i * head..(i + 1) * head]);
        let (Ok(ty), Ok(state)) = (b.u64(OB_TYPE), b.u32(state_at)) else {
            continue;
        };
        if reader.kind(ty) == Kind::Future && state != FUTURE_STATE_PENDING {
            done.insert(f);
        }
    }
    let queues: Vec<(u64, u64)> = queues
        .chunks_exact(16)
        .filter_map(|q| Some((Bytes(q).u64(0).ok()?, Bytes(q).u64(8).ok()?)))
        .collect();
    // What the loops will run next.
    let mut woken = FxHashSet::default();
    if awaiting.iter().any(|a| !done.contains(&a.1)) {
        let _ = reader.woken_by(&queues, now_s, &mut woken);
    }
    for &(task, waiter, _) in &awaiting {
        if done.contains(&waiter) || woken.contains(&waiter) || woken.contains(&task) {
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
    /// What the type at `ty` is, remembered: for [`KIND_LIFE`], or [`LOOK_AGAIN`] when it
    /// is none of the kinds wanted. A type met for the first time is read twice and
    /// remembered only when both reads agree (a torn read of a class would otherwise stick).
    fn kind(&mut self, ty: u64) -> Kind {
        if let Some(&(k, at)) = self.memo.kinds.get(&ty) {
            let life = if k == Kind::Other {
                LOOK_AGAIN
            } else {
                KIND_LIFE
            };
            if at.elapsed() < life {
                return k;
            }
        }
        let kind = self.classify(ty).unwrap_or(Kind::Other);
        if self.classify(ty).unwrap_or(Kind::Other) != kind {
            return Kind::Other;
        }
        if self.memo.kinds.len() >= MAX_MEMO {
            self.memo.kinds.clear();
        }
        self.memo.kinds.insert(ty, (kind, Instant::now()));
        kind
    }

    fn classify(&self, ty: u64) -> Option<Kind> {
        let (mut callback, mut args, mut when) = (None, None, None);
        let mut at = ty;
        for depth in 0..MAX_BASES {
            if at == 0 {
                break;
            }
            let name = String::from_utf8(type_name(self.mem, at, MAX_NAME).ok()?).ok()?;
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
                    let name = c_string(self.mem, name, MAX_NAME).ok()?;
                    let slot = match name.as_slice() {
                        b"_callback" => &mut callback,
                        b"_args" => &mut args,
                        b"_when" => &mut when,
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

    /// Adds to `woken` what the handles the loops whose queues are `queues` (their `_ready`
    /// deque and `_scheduled` list) will run next act on: their ready queues', and their
    /// timers' due at `now_s`. Their heads, then their first items, each in one batch.
    fn woken_by(
        &mut self,
        queues: &[(u64, u64)],
        now_s: f64,
        woken: &mut FxHashSet<u64>,
    ) -> Option<()> {
        const LIST_HEAD: usize = (LIST_ITEMS + 8) as usize;
        let span = DEQUE_HEAD_BYTES + LIST_HEAD;
        let mut heads = vec![0u8; span * queues.len()];
        let ranges = queues
            .iter()
            .flat_map(|&(d, l)| [(d, DEQUE_HEAD_BYTES), (l, LIST_HEAD)]);
        read_chunks(self.mem, ranges, &mut heads).ok()?;
        // Where each queue's first items are: a deque's first block's (from `leftindex`), a
        // list's array (its first `MAX_TIMERS`).
        let mut firsts: Vec<(u64, usize, u64, bool)> = Vec::new();
        for q in heads.chunks_exact(span) {
            let (d, l) = q.split_at(DEQUE_HEAD_BYTES);
            let (d, l) = (Bytes(d), Bytes(l));
            if d.u64(OB_TYPE).is_ok_and(|ty| self.kind(ty) == Kind::Deque) {
                let n = (d.u64(VAR_SIZE).ok()? as usize).min(MAX_HANDLES);
                let (block, index) = (d.u64(DEQUE_LEFTBLOCK).ok()?, d.u64(DEQUE_LEFTINDEX).ok()?);
                if n > 0 && index < BLOCK_ITEMS {
                    firsts.push((block, n, index, true));
                }
            }
            if l.u64(OB_TYPE).is_ok_and(|ty| self.kind(ty) == Kind::List) {
                let n = (l.u64(VAR_SIZE).ok()? as usize).min(MAX_TIMERS);
                if n > 0 {
                    firsts.push((l.u64(LIST_ITEMS).ok()?, n, 0, false));
                }
            }
        }
        let take = |&(_, n, index, deque): &(u64, usize, u64, bool)| match deque {
            true => n.min((BLOCK_ITEMS - index) as usize),
            false => n,
        };
        let ranges = firsts.iter().map(|f| {
            let at = match f.3 {
                true => f.0 + BLOCK_DATA + f.2 * 8,
                false => f.0,
            };
            (at, take(f) * 8)
        });
        let mut items = vec![0u8; firsts.iter().map(|f| take(f) * 8).sum()];
        read_chunks(self.mem, ranges, &mut items).ok()?;
        let word = |w: &[u8]| {
            w.try_into()
                .ok()
                .map(|w| u64::from_le_bytes(w) & !TAG_BITS)
                .filter(|&a| a != 0)
        };
        let (mut ready, mut timers) = (Vec::new(), Vec::new());
        let mut at = 0;
        for f in &firsts {
            let len = take(f) * 8;
            let these = items[at..at + len].chunks_exact(8).filter_map(word);
            at += len;
            match f.3 {
                true => {
                    ready.extend(these);
                    // A ready queue longer than its first block: the rest block by block.
                    let (mut block, mut left) = (f.0, f.1 - take(f));
                    while left > 0 {
                        block = self.mem.read_u64(block + BLOCK_RIGHTLINK).ok()?;
                        let n = left.min(BLOCK_ITEMS as usize);
                        let raw = self.mem.read_vec(block + BLOCK_DATA, n * 8).ok()?;
                        ready.extend(raw.chunks_exact(8).filter_map(word));
                        left -= n;
                    }
                }
                false => timers.extend(these),
            }
        }
        let ready_count = ready.len();
        ready.extend(timers);
        self.acted_on(&ready, ready_count, now_s, woken)
    }

    /// Adds what `handles` act on to `woken`: all of the first `ready_count` (the ready
    /// queue's), and of the rest (timers) those due at `now_s`. Each step one batch: the
    /// handles' types; the ready ones' callback and arguments and the timers' time; the
    /// times' values; the due timers' callback and arguments; what the callbacks are bound
    /// to and the first arguments.
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
        let mut heads = vec![0u8; 16 * handles.len()];
        read_chunks(self.mem, handles.iter().map(|&h| (h, 16)), &mut heads).ok()?;
        // Each handle's slots: (callback, args, when), `when` for a timer only.
        let mut slots: Vec<Option<(u64, u64, Option<u64>)>> = Vec::with_capacity(handles.len());
        for (i, head) in heads.chunks_exact(16).enumerate() {
            let ty = Bytes(head).u64(OB_TYPE).ok()?;
            slots.push(match self.kind(ty) {
                Kind::Handle { callback, args, .. } if i < ready_count => {
                    Some((callback, args, None))
                }
                Kind::Handle {
                    callback,
                    args,
                    when: Some(when),
                } => Some((callback, args, Some(when))),
                _ => None,
            });
        }
        // The ready handles' callback and arguments, the timers' time object.
        let mut ranges = Vec::new();
        for (&h, s) in handles.iter().zip(&slots) {
            match s {
                Some((callback, args, None)) => {
                    ranges.push((h + callback, 8));
                    ranges.push((h + args, 8));
                }
                Some((_, _, Some(when))) => ranges.push((h + when, 8)),
                None => {}
            }
        }
        let words = self.words(&ranges)?;
        let mut next: Vec<(u64, u64)> = Vec::new();
        let mut times: Vec<(usize, u64)> = Vec::new();
        let mut w = words.iter();
        for (i, s) in slots.iter().enumerate() {
            match s {
                Some((_, _, None)) => next.push((*w.next()?, *w.next()?)),
                Some((_, _, Some(_))) => times.push((i, *w.next()?)),
                None => {}
            }
        }
        // The timers due: their time a float no later than now.
        let mut values = vec![0u8; 24 * times.len()];
        read_chunks(self.mem, times.iter().map(|&(_, t)| (t, 24)), &mut values).ok()?;
        let mut ranges = Vec::new();
        for (&(i, _), v) in times.iter().zip(values.chunks_exact(24)) {
            let (Ok(ty), Ok(bits)) = (Bytes(v).u64(OB_TYPE), Bytes(v).u64(FLOAT_VALUE)) else {
                continue;
            };
            if self.kind(ty) != Kind::Float || f64::from_bits(bits) > now_s {
                continue;
            }
            if let Some((callback, args, _)) = slots[i] {
                ranges.push((handles[i] + callback, 8));
                ranges.push((handles[i] + args, 8));
            }
        }
        let words = self.words(&ranges)?;
        next.extend(words.chunks_exact(2).map(|w| (w[0], w[1])));
        // What each callback is bound to, and the first argument.
        let tuple_items = self.layout.tuple_items;
        let args_span = (tuple_items + 8) as usize;
        let span = 32 + args_span;
        let mut objs = vec![0u8; span * next.len()];
        let ranges = next
            .iter()
            .flat_map(|&(callback, args)| [(callback, 32), (args, args_span)]);
        read_chunks(self.mem, ranges, &mut objs).ok()?;
        for o in objs.chunks_exact(span) {
            let (cb, args) = o.split_at(32);
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

    /// The pointer-sized words at `ranges` (each 8 bytes), tag bits cleared, in one batch.
    fn words(&self, ranges: &[(u64, usize)]) -> Option<Vec<u64>> {
        let mut raw = vec![0u8; 8 * ranges.len()];
        read_chunks(self.mem, ranges.iter().copied(), &mut raw).ok()?;
        raw.chunks_exact(8)
            .map(|w| Some(u64::from_le_bytes(w.try_into().ok()?) & !TAG_BITS))
            .collect()
    }
}

/// The target's `CLOCK_MONOTONIC` now, in seconds (`loop.time()`'s clock; a target in a time
/// namespace of its own is not allowed for).
pub fn monotonic_now_s() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}
