//! The unwinder: one target process, sampled again and again, as cheaply as possible.
//!
//! A sample costs syscalls, not bytes, so the unwinder predicts. It remembers the addresses of
//! the previous sample (interpreter states, thread states, GIL, each thread's frame region in
//! its data stack, frames outside it) and reads them all in **one** `process_vm_readv`. It
//! then walks the lists as they are now, using the prefetched bytes wherever the addresses
//! still match and reading only what changed; a wrong prediction costs extra reads, never a
//! wrong stack.
//!
//! One sample (`Unwinder::sample`) goes through the parts in this order, each a module that
//! owns its state and its limits:
//! - `next_read`: the read plan from last sample's addresses, and which threads are kept
//!   unread (they have not run: [`runstate`](crate::process::runstate) says why that is
//!   exact; a full read at least every [`MAX_KEPT`] samples all the same);
//! - `read_plan`: the plan as sorted, coalesced iovecs, and where each key's bytes landed;
//! - `threads`: interpreters, thread states, GIL holders, data-stack chunks;
//! - `frames`: each thread's frames, read again when they do not hold together, the top
//!   settled from what the frames show (`top`);
//! - `code_cache`: the code objects of the frames walked (bounded LRU, batch loads,
//!   validation every sample);
//! - `frame_cache`: the stack interned, reusing the frames that did not change; then
//!   `next_read` places the 3.15 marker and the thread's regions for the next sample;
//! - `budget`: the limits of one sample (reads, syscalls, bytes, frames, time), checked
//!   throughout.
//!
//! Frames: on 3.15 with the frame cache, the target keeps a marker (`last_profiled_frame`,
//! `last_profiled_frame_seq`) that the unwinder sets on a frame a little below the top; the
//! interpreter moves it to the parent (and bumps the sequence) when that frame returns, so
//! the frames from the marker outwards are known unchanged and come from the cache. Without
//! the marker (3.11-3.14, `read_only`, or `frame_cache: false`) the used part of the thread's
//! data-stack chunks is copied and walked locally. Generator and coroutine frames live outside
//! the chunks and are read (and next time prefetched) by address.
//!
//! The top frame: the thread state's pointer to it is read a microsecond or so before the
//! frames, while the target runs. Frames say whether they are live ([`Liveness`]), so the top
//! is the one the frames show when they were read ([`settle_top`]); the pointer only says
//! where to look. For a thread paused by `blocking` (or `target_stopped`), the pointer is the
//! top. A walk that does not hold together (a frame without its code object, a
//! chain that climbs, a stale C-stack entry frame that no frame before its callee replaces) is
//! read again.
//!
//! The only write to the target is the 3.15 marker, at the offset the target's own
//! `_Py_DebugOffsets` gives (validated), in a thread state that proves it is one (`threads`),
//! and never in `read_only` mode.

mod budget;
mod captured;
pub use captured::CapturedThread;
mod code_cache;
mod frame_cache;
mod frames;
mod next_read;
mod read_plan;
mod tasks;
pub use tasks::{named_task, TaskStack, TASK_FILE};
mod threads;
mod top;

use super::layout::{
    CurrentFrame, GilLayout, Layout, Liveness, CHUNK_DATA, CHUNK_PREVIOUS, CHUNK_SIZE, CHUNK_TOP,
    OWNED_BY_GENERATOR,
};
use super::objects::{
    fingerprint, fingerprint_span, read_chunks, read_codes, CodeInfo, LoadedCode,
};
use super::resolved::{Frame, InterpreterStacks, ThreadStack, MAX_DEPTH};
use super::UnwindError;
use crate::binary::RuntimeLocation;
use crate::memory::capture_records::GilAt;
use crate::memory::{Bytes, Pauser, RemoteMemory};
use crate::process::cpu_share::{self, CpuShare};
use crate::process::namespace::ThreadIds;
use crate::process::runstate::{RunWatch, Still};
use crate::stacks::{FrameId, Function, FunctionId, StackId, StackTable};
use budget::*;
use code_cache::*;
use frame_cache::*;
use frames::*;
use lru::LruCache;
use next_read::*;
use read_plan::{Key, ReadPlan, PAGE};
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use std::borrow::Cow;
use std::cell::Cell;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use threads::*;
use top::*;

/// Most samples in a row that keep a thread's stack (or a whole sample) without reading it:
/// a full read at least this often bounds what anything the kernel's counts do not see
/// (another process writing the target's memory) could leave unnoticed. Each unwinder starts
/// at its own point of the count (from its pid), so that the forced reads of processes
/// attached together do not fall on the same tick.
pub const MAX_KEPT: u32 = 1000;

/// The frame that stands for the interpreter's garbage collector running on a thread (see
/// [`Unwinder::with_gc_frame`]), named in angle brackets as the other frames pyfleet makes up.
pub const GC_FUNCTION: &str = "<GC>";
pub const GC_FILE: &str = "<interpreter>";

/// What a successful sample cost (the actors count samples by it).
pub use pyfleet_actors::SampleKind;

/// How an unwinder behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwinderOptions {
    /// Use the 3.15 frame-cache marker (ignored before 3.15 and in read-only mode).
    pub frame_cache: bool,
    /// Never write to the target.
    pub read_only: bool,
    /// Fill `on_cpu` from /proc (one extra file read per thread that ran).
    pub cpu_status: bool,
    /// Tell which threads wait to take the GIL: 3.15+ from the thread state's own flag (read
    /// anyway); before, for a thread that ran since it was read, holds no GIL while another
    /// thread holds one and is not known to be on a CPU, from the futex it sleeps on (one read
    /// of its `/proc/PID/task/TID/syscall`): one inside its GIL's struct is a wait for it. A
    /// kept thread keeps what its last read said.
    pub gil_waits: bool,
    /// Keep the last stack of a thread that the kernel says has not run since it was read,
    /// and the whole last sample when no thread of the process ran (see
    /// [`runstate`](crate::process::runstate)); a full read at least every
    /// [`MAX_KEPT`] samples all the same.
    pub skip_idle: bool,
    /// Pause every thread of the target for each read (`--blocking`, see
    /// [`Pauser`](crate::memory::Pauser)): the stack is one instant's by construction. Pausing
    /// wakes sleeping threads, so it implies reading every thread (no `skip_idle`).
    pub blocking: bool,
    /// The caller keeps the target stopped while it samples (SIGSTOP, a debugger's stop):
    /// each thread's pointer to its top frame is its top, as with `blocking`, instead of the
    /// top the frames show (a frame is linked before it becomes the current one and unlinked
    /// before it is cleared: a thread stopped in between shows it).
    pub target_stopped: bool,
    /// Code objects kept in the cache.
    pub code_cache_capacity: usize,
    /// Distinct stacks interned before the table starts afresh (and 2.5 times as many
    /// frames): bounds memory to a few MiB per process however long it runs.
    pub max_interned_stacks: usize,
}

impl Default for UnwinderOptions {
    fn default() -> Self {
        UnwinderOptions {
            frame_cache: true,
            read_only: false,
            cpu_status: false,
            gil_waits: false,
            skip_idle: true,
            blocking: false,
            target_stopped: false,
            code_cache_capacity: 4096,
            max_interned_stacks: 20_000,
        }
    }
}

/// What one unwinder has done so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct UnwinderStats {
    pub samples: u64,
    pub errors: u64,
    /// Threads whose whole stack came from the frame cache (only the top frame re-read).
    pub frame_cache_hits: u64,
    /// Threads whose stack was walked down to the marker, the rest from the cache.
    pub frame_cache_partial_hits: u64,
    /// Threads walked in full.
    pub frame_cache_misses: u64,
    pub frames_from_cache: u64,
    pub frames_from_memory: u64,
    pub code_cache_hits: u64,
    pub code_cache_misses: u64,
    pub stale_invalidations: u64,
    pub marker_writes: u64,
    /// Times the interning table grew past its bounds and started afresh.
    pub table_resets: u64,
    /// Times the cached code objects were dropped after [`FORGET_AFTER_FAILURES`] failed
    /// samples in a row (a cached entry read torn would otherwise fail every sample it is in).
    pub cache_drops: u64,
    /// Threads whose last stack was kept because they had not run (also counted as full
    /// frame-cache hits).
    pub threads_unchanged: u64,
    /// Samples kept whole because a check found that no thread of the process had run (they
    /// cost the check, no read of the target's memory).
    pub samples_unchanged: u64,
    /// Samples that read the target's memory after a check found some thread had run (they
    /// cost the check and the read). The others that read did so without a check.
    pub samples_checked: u64,
    /// Threads read again at once because their stack moved during (or since the prediction
    /// of) the sample's read.
    pub rereads: u64,
    /// Whole samples read again at once because what was read did not hold together.
    pub resamples: u64,
    /// `process_vm_readv`/`writev` calls and bytes moved.
    pub remote_reads: u64,
    pub remote_read_bytes: u64,
}

/// One thread in one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSample {
    pub interpreter_id: i64,
    pub thread_id: u64,
    /// The kernel's thread id as pyfleet sees it (mapped from the target's pid namespace;
    /// the target's own value when it cannot be mapped).
    pub native_thread_id: u64,
    /// The target's own value, when the target lives in another pid namespace.
    pub namespace_thread_id: Option<u64>,
    pub holds_gil: bool,
    /// It waited to take the GIL (see [`UnwinderOptions::gil_waits`]; `false` when not asked).
    pub waits_gil: bool,
    /// `None` unless [`UnwinderOptions::cpu_status`].
    pub on_cpu: Option<bool>,
    /// Innermost frame first; see [`Unwinder::stacks`]. Empty stacks are sampled too.
    pub stack: StackId,
}

/// The unwinder of one process. See the module documentation.
pub struct Unwinder<M: RemoteMemory> {
    pid: i32,
    mem: M,
    layout: Layout,
    runtime: u64,
    code_type: Option<u64>,
    binary: PathBuf,
    opts: UnwinderOptions,
    use_marker: bool,
    codes: CodeCache,
    table: StackTable,
    threads: FxHashMap<u64, ThreadCache>,
    interps: Vec<u64>,
    gils: Vec<u64>,
    batch: ReadPlan,
    epoch: u64,
    stats: UnwinderStats,
    /// The sample under way against its limits.
    budget: SampleBudget,
    out: Vec<ThreadSample>,
    /// Ids of the interpreters seen by the last sample, in list order.
    interp_ids: Vec<i64>,
    /// Which threads, or whether the whole last sample (`out`), may be kept unread.
    idle: Idle,
    /// What the last successful sample cost.
    last_kind: SampleKind,
    /// Samples in a row that failed (see [`FORGET_AFTER_FAILURES`]).
    failed_in_row: u32,
    /// `blocking`: pauses the target around each read; which threads ran just before.
    pauser: Option<Pauser>,
    running: Vec<i32>,
    /// cpu mode: each thread's credit of CPU used, and the sampling interval (see
    /// [`cpu_share`]).
    cpu_share: CpuShare,
    /// The target's thread ids mapped to ours (containers).
    tids: ThreadIds,
    /// Buffers a sample fills and the next one reuses, so that a steady-state sample
    /// allocates nothing.
    spare: Spare,
    /// Where the thread state keeps its running asyncio loop and task (offsets), once the
    /// task walk asked: read with each thread state, so that a sample's running tasks are
    /// those of the instant its chains were read (see [`Tstate::running_task`]).
    running_task_fields: Option<(u64, u64)>,
    /// The target's own types, for reading values (`dump --locals`).
    builtin_types: crate::binary::BuiltinTypes,
}

/// One thread's Python frames in the last sample: each frame's address and its code
/// object's, innermost first, one for each frame of its stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampledFrames {
    pub interpreter_id: i64,
    pub thread_id: u64,
    pub frames: Vec<(u64, u64)>,
}

#[derive(Default)]
struct Spare {
    /// The walk: the frames of the thread under way, what is left to read, their interned
    /// ids, and the part of a chain new since the frame cache.
    raws: Vec<RawFrame>,
    work: Vec<Work>,
    ids: Vec<FrameId>,
    chain_new: Vec<ChainFrame>,
    interps: Vec<u64>,
    gils: Vec<u64>,
    interp_ids: Vec<i64>,
    holders: Vec<u64>,
    tstates: Vec<Tstate>,
    seen_tstates: FxHashSet<u64>,
    /// A thread's prefetched regions: (address, position and length in the batch buffer).
    held: Vec<(u64, usize, usize)>,
    codes: Vec<u64>,
    check: Vec<u64>,
    load: Vec<u64>,
    fingerprints: Vec<u8>,
    /// A captured chain's code-object fingerprints, one per frame, and its distinct
    /// (code object, fingerprint) pairs.
    captured_fingerprints: Vec<u64>,
    captured_codes: Vec<(u64, u64)>,
    outside: Vec<u64>,
    /// The batch of a thread read again (see `walk_consistent`).
    reread: ReadPlan,
    /// The interpreters of the sample whose collector ran, with the frame that started the
    /// collection where the version says (3.15+; see [`Unwinder::with_gc_frame`]).
    collecting: Vec<(u64, Option<u64>)>,
}

impl<M: RemoteMemory> Unwinder<M> {
    pub fn new(
        pid: i32,
        mem: M,
        layout: Layout,
        loc: &RuntimeLocation,
        opts: UnwinderOptions,
    ) -> Self {
        let use_marker = opts.frame_cache
            && !opts.read_only
            && layout.tstate.frame_marker.is_some()
            && mem.writable();
        let cap = NonZeroUsize::new(opts.code_cache_capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        Unwinder {
            pid,
            mem,
            layout,
            runtime: loc.runtime,
            code_type: loc.code_type,
            binary: loc.path.clone(),
            opts,
            use_marker,
            codes: CodeCache::new(cap),
            table: StackTable::new(),
            threads: FxHashMap::default(),
            interps: Vec::new(),
            gils: Vec::new(),
            batch: ReadPlan::default(),
            epoch: 0,
            stats: UnwinderStats::default(),
            budget: SampleBudget::default(),
            out: Vec::new(),
            interp_ids: Vec::new(),
            idle: Idle::new(
                pid,
                match opts.skip_idle && !opts.blocking {
                    true => RunWatch::new(pid),
                    false => None,
                },
            ),
            last_kind: SampleKind::Read,
            failed_in_row: 0,
            pauser: opts.blocking.then(|| Pauser::new(pid)),
            running: Vec::new(),
            cpu_share: CpuShare::default(),
            tids: ThreadIds::new(pid),
            spare: Spare::default(),
            running_task_fields: None,
            builtin_types: loc.builtin_types,
        }
    }

    /// The target's own types (see [`crate::binary::BuiltinTypes`]).
    pub fn builtin_types(&self) -> crate::binary::BuiltinTypes {
        self.builtin_types
    }

    /// Each thread's Python frames in the last sample (see [`SampledFrames`]).
    pub fn sampled_frames(&self) -> Vec<SampledFrames> {
        self.spare
            .work
            .iter()
            .map(|w| SampledFrames {
                interpreter_id: w.ts.interp_id,
                thread_id: w.ts.thread_id,
                frames: self
                    .threads
                    .get(&w.ts.addr)
                    .map(|tc| {
                        tc.chain
                            .iter()
                            .filter(|c| c.id.is_some())
                            .map(|c| (c.addr, c.code))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// Bytes of each thread state read per sample: the struct, and the running asyncio task's
    /// fields when they lie beyond it (see [`Unwinder::running_task_fields`]).
    fn tstate_read_len(&self) -> usize {
        let fields_end = self
            .running_task_fields
            .map_or(0, |(lp, task)| lp.max(task).saturating_add(8));
        self.layout.tstate.size.max(fields_end) as usize
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn binary(&self) -> &Path {
        &self.binary
    }
    pub fn memory(&self) -> &M {
        &self.mem
    }
    /// The target address of `_PyRuntime`.
    pub fn runtime_address(&self) -> u64 {
        self.runtime
    }
    pub fn options(&self) -> UnwinderOptions {
        self.opts
    }
    /// The interned stacks, frames and functions that sample ids refer to.
    pub fn stacks(&self) -> &StackTable {
        &self.table
    }
    /// The `threading` module's name of each thread it knows, by `threading.get_ident()`
    /// (see [`super::threading_names`]): a few hundred reads, for `dump`.
    pub fn threading_names(&self) -> Result<std::collections::HashMap<u64, String>, UnwindError> {
        super::threading_names::read(&self.mem, &self.layout, self.runtime)
    }
    /// The same, to intern stacks of a view built on the samples' (the table is reset, ids
    /// and all, only at the start of [`Unwinder::sample`]).
    pub fn stacks_mut(&mut self) -> &mut StackTable {
        &mut self.table
    }
    pub fn stats(&self) -> UnwinderStats {
        let mut s = self.stats;
        s.remote_reads = self.mem.stats().reads();
        s.remote_read_bytes = self.mem.stats().bytes();
        s
    }

    /// The threads of the last sample (what [`Unwinder::sample`] returned; empty after an error).
    pub fn last_sample(&self) -> &[ThreadSample] {
        &self.out
    }

    /// What the last successful sample cost (read, until one succeeded).
    pub fn last_kind(&self) -> SampleKind {
        self.last_kind
    }

    /// Takes one sample of every thread of every interpreter.
    pub fn sample(&mut self) -> Result<&[ThreadSample], UnwindError> {
        self.sample_then(|_| Ok(()))?;
        Ok(&self.out)
    }

    /// Takes one sample, then calls `after` on the unwinder at once: with `blocking`, while
    /// the target is still paused, so that what `after` reads (the tasks of `dump --async`)
    /// is of the sample's instant. A failure of `after` fails the sample.
    pub fn sample_then<T>(
        &mut self,
        after: impl FnOnce(&mut Self) -> Result<T, UnwindError>,
    ) -> Result<T, UnwindError> {
        self.epoch += 1;
        self.cpu_share.sample_began(Instant::now());
        // Memory stays bounded however many distinct stacks a process shows over days: past
        // a limit the interning starts afresh (stack ids are not reused, so an id from before
        // resolves to nothing), with the caches that hold function and frame ids.
        let (functions, frames, stacks) = self.table.len();
        let max = self.opts.max_interned_stacks.max(1);
        if stacks > max || frames > max.saturating_mul(5) / 2 || functions > max {
            self.table.reset();
            self.forget_codes();
            self.stats.table_resets += 1;
            self.idle.forget();
        }
        let (kept, checked) = self.idle.check(self.epoch);
        // No thread ran since the last full sample read them: it is still the truth.
        if kept {
            let n = self.out.len() as u64;
            self.stats.samples += 1;
            self.stats.samples_unchanged += 1;
            self.last_kind = SampleKind::Kept;
            self.stats.threads_unchanged += n;
            self.stats.frame_cache_hits += n;
            if self.opts.cpu_status {
                for s in &mut self.out {
                    s.on_cpu = Some(false);
                }
            }
            return after(self);
        }
        self.budget.begin(self.mem.stats().reads());
        let mut batch = std::mem::take(&mut self.batch);
        // Blocking: every thread stays stopped until the sample is read in full (the guard
        // resumes them when dropped, on every path).
        self.tids.begin();
        if self.pauser.is_some() && self.opts.cpu_status {
            // Stopped threads are not running: ask the kernel before stopping them.
            crate::process::running_threads(self.pid, MAX_THREADS, &mut self.running);
        }
        let r = match self.pauser.as_ref().map(Pauser::pause).transpose() {
            Ok(_paused) => {
                // A read that does not hold together (a thread's frames or code objects
                // changed under it) is made again at once, a bounded number of times.
                let mut r = self.sample_with(&mut batch);
                let mut reads = 1;
                while reads < MAX_SAMPLE_READS && r.as_ref().is_err_and(UnwindError::is_torn) {
                    reads += 1;
                    self.stats.resamples += 1;
                    self.interps.clear();
                    r = self.sample_with(&mut batch);
                }
                r.and_then(|()| after(self))
            }
            Err(e) => Err(e.into()),
        };
        self.batch = batch;
        match r {
            Ok(extra) => {
                self.stats.samples += 1;
                self.failed_in_row = 0;
                self.idle
                    .read_in_full(self.epoch, self.threads.values().map(|t| (t.tid, t.heavy)));
                if checked {
                    self.stats.samples_checked += 1;
                    self.last_kind = SampleKind::Checked;
                } else {
                    self.last_kind = SampleKind::Read;
                }
                Ok(extra)
            }
            Err(e) => {
                self.stats.errors += 1;
                self.idle.forget();
                self.out.clear();
                // The interpreter list is read afresh next time; a thread whose walk failed
                // has already lost its cache (`collect`).
                self.interps.clear();
                self.failed_in_row += 1;
                if self.failed_in_row >= FORGET_AFTER_FAILURES {
                    self.failed_in_row = 0;
                    self.forget_codes();
                    self.stats.cache_drops += 1;
                }
                Err(e)
            }
        }
    }

    /// One sample, fully resolved: every interpreter (main first) with its threads that run
    /// Python code (as `sys._current_frames()` lists them) and their frames. For `dump`.
    pub fn snapshot(&mut self) -> Result<Vec<InterpreterStacks>, UnwindError> {
        self.snapshot_then(|_| Ok(())).map(|(stacks, ())| stacks)
    }

    /// [`Unwinder::snapshot`], with what `after` reads right after the sample (see
    /// [`Unwinder::sample_then`]).
    pub fn snapshot_then<T>(
        &mut self,
        after: impl FnOnce(&mut Self) -> Result<T, UnwindError>,
    ) -> Result<(Vec<InterpreterStacks>, T), UnwindError> {
        let extra = self.sample_then(after)?;
        let samples = self.out.clone();
        let mut ids = self.interp_ids.clone();
        ids.sort_unstable();
        ids.dedup();
        let mut out: Vec<InterpreterStacks> = ids
            .into_iter()
            .map(|id| InterpreterStacks {
                id,
                threads: Vec::new(),
            })
            .collect();
        for s in samples {
            let frames: Vec<Frame> = self
                .table
                .resolve(s.stack)
                .into_iter()
                .flatten()
                .map(|f| Frame {
                    function: f.function.clone(),
                    line: f.line,
                })
                .collect();
            if frames.is_empty() {
                continue;
            }
            if let Some(i) = out.iter_mut().find(|i| i.id == s.interpreter_id) {
                i.threads.push(ThreadStack {
                    thread_id: s.thread_id,
                    native_thread_id: s.native_thread_id,
                    namespace_thread_id: s.namespace_thread_id,
                    holds_gil: s.holds_gil,
                    on_cpu: s.on_cpu.unwrap_or(false),
                    name: None,
                    os_name: None,
                    frames,
                    locals: None,
                });
            }
        }
        Ok((out, extra))
    }

    /// Bytes at `addr`: from the batch when it holds them under `key`, else from the target.
    fn bytes<'b>(
        &self,
        b: &'b ReadPlan,
        key: Key,
        addr: u64,
        len: usize,
    ) -> Result<Cow<'b, [u8]>, UnwindError> {
        match b.get(key) {
            Some(v) if v.len() == len => Ok(Cow::Borrowed(v)),
            _ => Ok(Cow::Owned(self.mem.read_vec(addr, len)?)),
        }
    }

    fn word(&self, b: &ReadPlan, addr: u64) -> Result<u64, UnwindError> {
        Ok(Bytes(&self.bytes(b, Key::Word(addr), addr, 8)?).u64(0)?)
    }

    fn sample_with(&mut self, b: &mut ReadPlan) -> Result<(), UnwindError> {
        self.predict(b);
        b.fetch(&self.mem);
        self.budget.set_bytes(b.buf.len());
        self.out.clear();
        self.spare.raws.clear();
        let mut work = std::mem::take(&mut self.spare.work);
        work.clear();
        let r = self.collect(b, &mut work).and_then(|gen| {
            self.resolve_codes(b, gen)?;
            self.finish(&mut work)
        });
        self.spare.work = work;
        self.load_callee_codes();
        r
    }

    /// Turns walked frames into interned stacks, updates the caches and the marker.
    /// Each thread's sample from its walk: a thread kept unread (it has not run) keeps its
    /// last stack; any other gets its stack interned ([`Unwinder::intern_stack`]), its next
    /// read planned ([`Unwinder::plan_next_read`]) and its status.
    fn finish(&mut self, work: &mut [Work]) -> Result<(), UnwindError> {
        for w in work.iter() {
            if w.ts.keep {
                let tc = self.threads.entry(w.ts.addr).or_default();
                if let Some(stack) = tc.last_stack {
                    tc.kept += 1;
                    self.stats.threads_unchanged += 1;
                    self.stats.frame_cache_hits += 1;
                    self.stats.frames_from_cache += tc.chain.len() as u64;
                    // It has not run since the last check.
                    let on_cpu = self.opts.cpu_status.then_some(false);
                    let last = tc.waits_gil;
                    let waits_gil = self.waits_gil(w, on_cpu, Some(last));
                    self.push_sample(w, on_cpu, waits_gil, stack);
                    continue;
                }
            }
            let stack = self.intern_stack(w);
            let stack = match self.spare.collecting.iter().find(|c| c.0 == w.ts.interp) {
                Some(&(_, started_at)) => {
                    self.with_gc_frame(w.ts.addr, started_at.unwrap_or(0), w.holds_gil, stack)
                }
                None => stack,
            };
            self.plan_next_read(w)?;
            let on_cpu = self.opts.cpu_status.then(|| self.on_cpu(w.ts.host_tid));
            let waits_gil = self.waits_gil(w, on_cpu, None);
            if let Some(tc) = self.threads.get_mut(&w.ts.addr) {
                tc.waits_gil = waits_gil;
            }
            self.push_sample(w, on_cpu, waits_gil, stack);
        }
        let epoch = self.epoch;
        self.threads.retain(|_, t| t.seen == epoch);
        Ok(())
    }

    /// Whether a thread that was read is on a CPU (state `R`): known before the pause when
    /// blocking, else asked now (through the run watch's open file when it watches the thread).
    fn on_cpu(&mut self, tid: i32) -> bool {
        let runnable = match self.pauser.is_some() {
            true => self.running.contains(&tid),
            false => self
                .idle
                .watch
                .as_mut()
                .and_then(|w| w.on_cpu(tid))
                .or_else(|| crate::process::thread_on_cpu(self.pid, tid))
                .unwrap_or(false),
        };
        // Runnable is not running: the sample counts as the CPU the thread used says.
        let run_ns = match runnable {
            true => self
                .idle
                .watch
                .as_ref()
                .and_then(|w| w.run_ns(tid))
                .or_else(|| cpu_share::run_ns(self.pid, tid)),
            false => None,
        };
        self.cpu_share.counts(tid, runnable, run_ns)
    }

    /// Whether a thread waits to take the GIL ([`UnwinderOptions::gil_waits`]): 3.15's flag
    /// in its state; before, what its last read said when it is kept (`kept`: it has not run
    /// since), else the futex it sleeps on.
    fn waits_gil(&self, w: &Work, on_cpu: Option<bool>, kept: Option<bool>) -> bool {
        if w.holds_gil {
            return false;
        }
        if let Some(flag) = w.ts.waits_gil.or(kept) {
            return flag;
        }
        let GilAt::Holder { locked, .. } = w.ts.gil else {
            return false;
        };
        if !self.opts.gil_waits || !w.gil_held_elsewhere || on_cpu == Some(true) {
            return false;
        }
        if w.ts.host_tid == 0 {
            return false;
        }
        crate::process::syscall::futex_word(self.pid, w.ts.host_tid)
            .is_some_and(|word| word.wrapping_sub(locked) < crate::cpython::layout::GIL_WAIT_SPAN)
    }

    /// `stack` of the thread at `tstate` (its chain just interned), taken while its
    /// interpreter's collector ran, with a `<GC>` frame where the collector runs on it: on
    /// the thread whose chain holds the frame that started the collection (`started_at`),
    /// right above that frame (3.15+: the collector's own calls, such as finalizers, above
    /// it); before 3.15, or when no Python frame started it (`started_at` 0), at the top of
    /// the thread that holds the GIL (`holds_gil`: the collector runs holding it).
    fn with_gc_frame(
        &mut self,
        tstate: u64,
        started_at: u64,
        holds_gil: bool,
        stack: StackId,
    ) -> StackId {
        let above = match started_at {
            0 if holds_gil => 0,
            0 => return stack,
            frame => {
                let chain = self.threads.get(&tstate).map(|t| t.chain.as_slice());
                let Some(at) = chain.and_then(|c| c.iter().position(|f| f.addr == frame)) else {
                    return stack;
                };
                chain.map_or(0, |c| c[..at].iter().filter(|f| f.id.is_some()).count())
            }
        };
        let Some(frames) = self.table.stack_frames(stack) else {
            return stack;
        };
        let mut ids = frames.to_vec();
        let function = self.table.function(Function {
            name: GC_FUNCTION.into(),
            qualname: GC_FUNCTION.into(),
            filename: GC_FILE.into(),
            first_line: 0,
        });
        let gc = self.table.frame(function, None);
        ids.insert(above.min(ids.len()), gc);
        self.table.stack(&ids)
    }

    fn push_sample(&mut self, w: &Work, on_cpu: Option<bool>, waits_gil: bool, stack: StackId) {
        let ts = &w.ts;
        self.out.push(ThreadSample {
            interpreter_id: ts.interp_id,
            thread_id: ts.thread_id,
            native_thread_id: ts.native(),
            namespace_thread_id: self.tids.namespaced().then_some(ts.native_thread_id),
            holds_gil: w.holds_gil,
            waits_gil,
            on_cpu,
            stack,
        });
    }
}
