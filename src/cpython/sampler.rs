//! The fast sampler: one target process, sampled again and again, as cheaply as possible.
//!
//! A sample costs syscalls, not bytes, so the sampler predicts. It remembers the addresses of
//! the previous sample (interpreter states, thread states, GIL, each thread's frame region in
//! its data stack, frames outside it) and reads them all in **one** `process_vm_readv`. It
//! then walks the lists as they are now, using the prefetched bytes wherever the addresses
//! still match and reading only what changed; a wrong prediction costs extra reads, never a
//! wrong stack.
//!
//! Frames: on 3.15 with the frame cache, the target keeps a marker (`last_profiled_frame`,
//! `last_profiled_frame_seq`) that the sampler sets on a frame a little below the top; the
//! interpreter moves it to the parent (and bumps the sequence) when that frame returns, so
//! the frames from the marker outwards are known unchanged and come from the cache. Without
//! the marker (3.11-3.14, `read_only`, or `frame_cache: false`) the used part of the thread's
//! data-stack chunks is copied and walked locally. Generator and coroutine frames live outside
//! the chunks and are read (and next time prefetched) by address.
//!
//! Code objects: a bounded LRU keyed by address, loaded and validated in batches (three
//! syscalls for any number of new code objects, one for all validations). 3.14+ validate with
//! the interpreter's `code_object_generation`; older versions compare the object's name,
//! file and line-table pointers every sample.
//!
//! Idle threads (`skip_idle`, the default): a thread the kernel says has not run since it was
//! read keeps its last stack and nothing of it is read (only its thread state, for the
//! thread list); when no thread of the process ran, the whole last sample is kept. While
//! some thread of the process runs, only the threads that cost more to read than to check
//! (deep stacks, frames spread over several pages) are checked; the light ones are read. See
//! [`runstate`](crate::process::runstate) for why that is exact.
//!
//! The only write to the target is the 3.15 marker, at the offset the target's own
//! `_Py_DebugOffsets` gives (validated), and never in `read_only` mode.

use super::layout::{
    CurrentFrame, GilLayout, Layout, CHUNK_DATA, CHUNK_PREVIOUS, CHUNK_SIZE, CHUNK_TOP,
    OWNED_BY_GENERATOR,
};
use super::objects::{read_chunks, read_codes, CodeInfo};
use super::unwind::{Frame, InterpreterStacks, ThreadStack, MAX_DEPTH};
use super::UnwindError;
use crate::binary::RuntimeLocation;
use crate::memory::{Bytes, Pauser, ReadRequest, RemoteMemory, STACK_IOVECS};
use crate::process::namespace::ThreadIds;
use crate::process::runstate::{RunWatch, Still};
use crate::stacks::{FrameId, FunctionId, StackId, StackTable};
use lru::LruCache;
use rustc_hash::{FxBuildHasher, FxHashMap};
use std::borrow::Cow;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most interpreters and threads followed per sample.
const MAX_INTERPRETERS: usize = 4096;
const MAX_THREADS: usize = 1 << 16;
/// Most data-stack chunks followed per thread.
const MAX_CHUNKS: usize = 64;
/// The 3.15 marker goes on the outermost frame at most this many bytes below the top frame,
/// so that calls and returns near the top do not move it.
const MARKER_SPAN: u64 = 2048;
/// Room prefetched above a moving top frame for calls made before the next sample (none
/// above a top frame that held still): the rest of its page, at least [`MIN_GROWTH`] and at
/// most [`GROWTH`] bytes. A page more costs the kernel about as much as an iovec more.
const GROWTH: u64 = 2048;
const MIN_GROWTH: u64 = 512;
/// Granularity of the kernel's work in `process_vm_readv` (pinning and copying a page).
const PAGE: u64 = 4096;
/// Most frames outside the data stack (generators, coroutines) prefetched per thread.
const MAX_OUTSIDE: usize = 64;
/// Ranges of a batch closer than this, or that start in the page where the one before ends,
/// are read as one iovec: on a cold target each iovec costs the kernel about 0.5-0.75 µs
/// (pinning its pages), a few KiB more of a page it pins anyway cost less.
const MERGE_GAP: u64 = 1024;
/// Longest single region read (bytes); deeper stacks are read in several regions.
const MAX_REGION: u64 = 1 << 20;
/// Largest data-stack chunk believed (bytes). CPython's chunks are 16 KiB unless one frame
/// needs more; a larger size read from the target is garbage.
const MAX_CHUNK_SIZE: u64 = 1 << 24;
/// Most bytes of older chunks read per thread (a 2^16-frame stack fits).
const MAX_OLDER_BYTES: u64 = 1 << 25;
/// Most samples in a row that keep a thread's stack (or a whole sample) without reading it:
/// a full read at least this often bounds what anything the kernel's counts do not see
/// (another process writing the target's memory) could leave unnoticed.
pub const MAX_KEPT: u32 = 100;

/// How a sampler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerOptions {
    /// Use the 3.15 frame-cache marker (ignored before 3.15 and in read-only mode).
    pub frame_cache: bool,
    /// Never write to the target.
    pub read_only: bool,
    /// Fill `on_cpu` from /proc (one extra file read per thread that ran).
    pub cpu_status: bool,
    /// Keep the last stack of a thread that the kernel says has not run since it was read,
    /// and the whole last sample when no thread of the process ran (see
    /// [`runstate`](crate::process::runstate)); a full read at least every
    /// [`MAX_KEPT`] samples all the same.
    pub skip_idle: bool,
    /// Pause every thread of the target for each read (`--blocking`, see
    /// [`Pauser`](crate::memory::Pauser)): the stack is one instant's by construction. Pausing
    /// wakes sleeping threads, so it implies reading every thread (no `skip_idle`).
    pub blocking: bool,
    /// Code objects kept in the cache.
    pub code_cache_capacity: usize,
    /// Distinct stacks interned before the table starts afresh (and 2.5 times as many
    /// frames): bounds memory to a few MiB per process however long it runs.
    pub max_interned_stacks: usize,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            frame_cache: true,
            read_only: false,
            cpu_status: false,
            skip_idle: true,
            blocking: false,
            code_cache_capacity: 4096,
            max_interned_stacks: 20_000,
        }
    }
}

/// What one sampler has done so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SamplerStats {
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
    /// Threads whose last stack was kept because they had not run (also counted as full
    /// frame-cache hits).
    pub threads_unchanged: u64,
    /// Samples kept whole because no thread of the process had run.
    pub samples_unchanged: u64,
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
    /// `None` unless [`SamplerOptions::cpu_status`].
    pub on_cpu: Option<bool>,
    /// Innermost frame first; see [`Sampler::stacks`]. Empty stacks are sampled too.
    pub stack: StackId,
}

struct CodeEntry {
    function: FunctionId,
    info: Arc<CodeInfo>,
    fingerprint: u64,
    /// Generation (3.14+) or sample epoch (older) when last known valid.
    valid_at: u64,
}

/// A frame of the previous sample's chain (shims included: the marker moves through them).
#[derive(Debug, Clone, Copy)]
struct ChainFrame {
    addr: u64,
    code: u64,
    previous: u64,
    instr: u64,
    id: Option<FrameId>,
}

/// What the sampler remembers about one thread between samples.
#[derive(Default)]
struct ThreadCache {
    chain: Vec<ChainFrame>,
    /// The marker as we left it: (frame address, sequence, index in `chain`).
    marker: Option<(u64, u64, usize)>,
    chunk: u64,
    /// Used ranges of the current chunk's data area bound and of older chunks.
    chunk_end: u64,
    older: Vec<(u64, u64)>,
    regions: Vec<(u64, u64)>,
    outside: Vec<u64>,
    /// 3.11/3.12: where `tstate->cframe` pointed.
    cframe: u64,
    seen: u64,
    /// The previous sample's top frame, walked frame ids, stack id and cached-tail length:
    /// when nothing above the marker changed, the stack id is reused without hashing.
    last_top: u64,
    last_walked: Vec<FrameId>,
    last_stack: Option<StackId>,
    last_tail_len: usize,
    /// The thread's native id and the epoch its stack was last read (for `skip_idle`), and
    /// how many samples in a row kept it since.
    tid: i32,
    read_at: u64,
    kept: u32,
    /// Reading this thread costs more than checking whether it ran (see [`RunWatch::watch`]).
    heavy: bool,
}

/// What was prefetched, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Head,
    Interp(u64),
    Word(u64),
    Gil(u64),
    Tstate(u64),
    Region(u64),
    Frame(u64),
    /// The validation fields of a code object (before 3.14).
    Code(u64),
}

/// One sample's prefetch: what to read (`keys`, `ranges`, as `predict` pushed them) and,
/// once fetched, where each range landed in `buf`. The physical plan (sorted, coalesced
/// iovecs and the index) is rebuilt only when the prediction differs from the previous
/// sample's; in steady state a fetch is one syscall and no hashing or sorting.
#[derive(Default)]
struct Batch {
    ranges: Vec<(u64, usize)>,
    keys: Vec<Key>,
    buf: Vec<u8>,
    index: FxHashMap<Key, (usize, usize)>,
    /// The prediction the plan below was built for.
    plan_keys: Vec<Key>,
    plan_ranges: Vec<(u64, usize)>,
    // The plan: physical reads (start, end), their offsets in `buf`, and for each logical
    // range its physical read and offset in it.
    phys: Vec<(u64, u64)>,
    offsets: Vec<usize>,
    place: Vec<(usize, usize)>,
    order: Vec<usize>,
}

impl Batch {
    fn clear(&mut self) {
        self.ranges.clear();
        self.keys.clear();
    }
    fn push(&mut self, key: Key, addr: u64, len: usize) {
        if len > 0 {
            self.keys.push(key);
            self.ranges.push((addr, len));
        }
    }
    /// Sorts the ranges by address, coalesces those less than [`MERGE_GAP`] apart or in one
    /// page into one iovec (each iovec costs the kernel a lookup and a pin, a few hundred
    /// bytes more cost nothing) and indexes where every key's bytes will land.
    fn plan(&mut self) {
        self.order.clear();
        self.order.extend(0..self.ranges.len());
        let ranges = &self.ranges;
        self.order.sort_unstable_by_key(|&i| ranges[i].0);
        self.phys.clear();
        self.place.clear();
        self.place.resize(self.ranges.len(), (0, 0));
        for &i in &self.order {
            let (addr, len) = self.ranges[i];
            let end = addr.saturating_add(len as u64);
            match self.phys.last_mut() {
                Some((s, e))
                    if addr >= *s
                        && (addr <= e.saturating_add(MERGE_GAP)
                            || addr <= (e.saturating_add(PAGE - 1) & !(PAGE - 1))) =>
                {
                    *e = (*e).max(end);
                }
                _ => self.phys.push((addr, end)),
            }
            let p = self.phys.len() - 1;
            self.place[i] = (p, (addr - self.phys[p].0) as usize);
        }
        self.offsets.clear();
        let mut total = 0usize;
        for &(s, e) in &self.phys {
            self.offsets.push(total);
            total += (e - s) as usize;
        }
        self.buf.clear();
        self.buf.resize(total, 0);
        self.index.clear();
        for (i, (k, r)) in self.keys.iter().zip(&self.ranges).enumerate() {
            let (p, off) = self.place[i];
            self.index.insert(*k, (self.offsets[p] + off, r.1));
        }
        self.plan_keys.clone_from(&self.keys);
        self.plan_ranges.clone_from(&self.ranges);
    }
    /// Reads everything in one batch. A range that cannot be read (a thread that exited took
    /// its memory with it) is left out and the rest read again from after it: predictions are
    /// only hints, and a miss costs one more syscall, not the whole batch.
    fn fetch<M: RemoteMemory>(&mut self, mem: &M) {
        if self.keys != self.plan_keys || self.ranges != self.plan_ranges {
            self.plan();
        }
        let mut failed: Vec<usize> = Vec::new();
        let mut from = 0;
        while from < self.phys.len() {
            let n = self.phys.len() - from;
            let mut rest = &mut self.buf[self.offsets[from]..];
            let mut requests = self.phys[from..].iter().map(|&(s, e)| {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut((e - s) as usize);
                rest = tail;
                ReadRequest::new(s, head)
            });
            // Up to STACK_IOVECS ranges (any steady-state sample but of a process with very
            // many threads) without allocating.
            let mut on_stack: [ReadRequest<'_>; STACK_IOVECS];
            let mut on_heap: Vec<ReadRequest<'_>>;
            let reqs: &mut [ReadRequest<'_>] = if n <= STACK_IOVECS {
                on_stack = std::array::from_fn(|_| {
                    requests
                        .next()
                        .unwrap_or_else(|| ReadRequest::new(0, &mut []))
                });
                &mut on_stack[..n]
            } else {
                on_heap = requests.collect();
                &mut on_heap
            };
            match mem.read_many(reqs) {
                Ok(()) => break,
                Err((i, e)) if !e.is_process_gone() => {
                    failed.push(from + i);
                    from += i + 1;
                }
                Err(_) => {
                    failed.extend(from..self.phys.len());
                    break;
                }
            }
        }
        if !failed.is_empty() {
            // Unread keys are absent this time; the plan is rebuilt next time.
            for (i, k) in self.keys.iter().enumerate() {
                if failed.contains(&self.place[i].0) {
                    self.index.insert(*k, (usize::MAX, 0));
                }
            }
            self.plan_keys.clear();
        }
    }

    fn get(&self, key: Key) -> Option<&[u8]> {
        let (pos, len) = self.locate(key)?;
        self.buf.get(pos..pos + len)
    }
    /// Where `key`'s bytes are in `buf` (position, length), if they were read.
    fn locate(&self, key: Key) -> Option<(usize, usize)> {
        let &(pos, len) = self.index.get(&key)?;
        (pos.checked_add(len)? <= self.buf.len()).then_some((pos, len))
    }
}

/// A thread state as read this sample.
struct Tstate {
    addr: u64,
    /// Position in the interpreters' thread lists as walked (newest thread first).
    order: usize,
    /// The thread has not run since its stack was read, and its state agrees: the stack is
    /// kept, nothing of it is read.
    keep: bool,
    interp_id: i64,
    thread_id: u64,
    /// As the target's namespace sees it, and as we do (0: not found).
    native_thread_id: u64,
    host_tid: i32,
    current_frame: u64,
    chunk: u64,
    marker: Option<(u64, u64)>,
    holds_gil: Option<bool>,
}

impl Tstate {
    /// The thread's id as pyfleet sees it, else as the target does.
    fn native(&self) -> u64 {
        match self.host_tid {
            0 => self.native_thread_id,
            t => t as u64,
        }
    }
}

/// A frame walked (read from the target) this sample.
#[derive(Clone, Copy)]
struct RawFrame {
    addr: u64,
    code: u64,
    previous: u64,
    instr: u64,
    shim: bool,
    generator: bool,
}

/// Per-thread work of one sample.
struct Work {
    ts: Tstate,
    raw: std::ops::Range<usize>,
    /// Cached chain index from which the rest of the stack is reused.
    tail: Option<usize>,
    holds_gil: bool,
}

/// The fast sampler of one process. See the module documentation.
pub struct Sampler<M: RemoteMemory> {
    pid: i32,
    mem: M,
    layout: Layout,
    runtime: u64,
    code_type: Option<u64>,
    binary: PathBuf,
    opts: SamplerOptions,
    use_marker: bool,
    codes: LruCache<u64, CodeEntry, FxBuildHasher>,
    table: StackTable,
    threads: FxHashMap<u64, ThreadCache>,
    interps: Vec<u64>,
    gils: Vec<u64>,
    batch: Batch,
    epoch: u64,
    stats: SamplerStats,
    out: Vec<ThreadSample>,
    /// Ids of the interpreters seen by the last sample, in list order.
    interp_ids: Vec<i64>,
    // Scratch, kept to avoid allocating in steady state.
    raws: Vec<RawFrame>,
    work: Vec<Work>,
    ids: Vec<FrameId>,
    chain_new: Vec<ChainFrame>,
    /// A cached code object was found stale (and reloaded) this sample.
    codes_changed: bool,
    /// The distinct code objects of the last sample: their validation fields are prefetched
    /// with the next sample's batch (before 3.14), so validating costs no syscall of its own.
    prev_codes: Vec<u64>,
    /// Which threads ran since they were read (`skip_idle`), the epoch of the last sample
    /// read in full that succeeded (`out` holds it), and how many samples in a row were
    /// kept whole since.
    watch: Option<RunWatch>,
    last_full: Option<u64>,
    whole_kept: u32,
    /// `blocking`: pauses the target around each read; which threads ran just before.
    pauser: Option<Pauser>,
    running: Vec<i32>,
    /// The target's thread ids mapped to ours (containers).
    tids: ThreadIds,
    /// Buffers a sample fills and the next one reuses, so that a steady-state sample
    /// allocates nothing.
    spare: Spare,
}

#[derive(Default)]
struct Spare {
    interps: Vec<u64>,
    gils: Vec<u64>,
    interp_ids: Vec<i64>,
    holders: Vec<u64>,
    tstates: Vec<Tstate>,
    /// A thread's prefetched regions: (address, position and length in the batch buffer).
    held: Vec<(u64, usize, usize)>,
    codes: Vec<u64>,
    check: Vec<u64>,
    load: Vec<u64>,
    fingerprints: Vec<u8>,
}

impl<M: RemoteMemory> Sampler<M> {
    pub fn new(
        pid: i32,
        mem: M,
        layout: Layout,
        loc: &RuntimeLocation,
        opts: SamplerOptions,
    ) -> Self {
        let use_marker =
            opts.frame_cache && !opts.read_only && layout.tstate.frame_marker.is_some();
        let cap = NonZeroUsize::new(opts.code_cache_capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        Sampler {
            pid,
            mem,
            layout,
            runtime: loc.runtime,
            code_type: loc.code_type,
            binary: loc.path.clone(),
            opts,
            use_marker,
            codes: LruCache::with_hasher(cap, FxBuildHasher),
            table: StackTable::new(),
            threads: FxHashMap::default(),
            interps: Vec::new(),
            gils: Vec::new(),
            batch: Batch::default(),
            epoch: 0,
            stats: SamplerStats::default(),
            out: Vec::new(),
            interp_ids: Vec::new(),
            raws: Vec::new(),
            work: Vec::new(),
            ids: Vec::new(),
            chain_new: Vec::new(),
            codes_changed: false,
            prev_codes: Vec::new(),
            watch: if opts.skip_idle && !opts.blocking {
                RunWatch::new(pid)
            } else {
                None
            },
            last_full: None,
            whole_kept: 0,
            pauser: opts.blocking.then(|| Pauser::new(pid)),
            running: Vec::new(),
            tids: ThreadIds::new(pid),
            spare: Spare::default(),
        }
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
    pub fn options(&self) -> SamplerOptions {
        self.opts
    }
    /// The interned stacks, frames and functions that sample ids refer to.
    pub fn stacks(&self) -> &StackTable {
        &self.table
    }
    pub fn stats(&self) -> SamplerStats {
        let mut s = self.stats;
        s.remote_reads = self.mem.stats().reads();
        s.remote_read_bytes = self.mem.stats().bytes();
        s
    }

    /// The threads of the last sample (what [`Sampler::sample`] returned; empty after an error).
    pub fn last_sample(&self) -> &[ThreadSample] {
        &self.out
    }

    /// Takes one sample of every thread of every interpreter.
    pub fn sample(&mut self) -> Result<&[ThreadSample], UnwindError> {
        self.epoch += 1;
        // Memory stays bounded however many distinct stacks a process shows over days: past
        // a limit the interning starts afresh (stack ids are not reused, so an id from before
        // resolves to nothing), with the caches that hold function and frame ids.
        let (_, frames, stacks) = self.table.len();
        let max = self.opts.max_interned_stacks.max(1);
        if stacks > max || frames > max.saturating_mul(5) / 2 {
            self.table.reset();
            self.codes.clear();
            self.threads.clear();
            self.stats.table_resets += 1;
            self.last_full = None;
        }
        let mut still = Still::No;
        if let Some(w) = self.watch.as_mut() {
            still = w.check(self.epoch);
            // No thread ran since the last full sample read them: it is still the truth.
            if still == Still::All
                && self.whole_kept < MAX_KEPT
                && self.last_full.is_some_and(|f| f >= w.newest_reference())
            {
                self.whole_kept += 1;
                let n = self.out.len() as u64;
                self.stats.samples += 1;
                self.stats.samples_unchanged += 1;
                self.stats.threads_unchanged += n;
                self.stats.frame_cache_hits += n;
                if self.opts.cpu_status {
                    for s in &mut self.out {
                        s.on_cpu = Some(false);
                    }
                }
                return Ok(&self.out);
            }
        }
        self.whole_kept = 0;
        let mut batch = std::mem::take(&mut self.batch);
        // Blocking: every thread stays stopped until the sample is read in full (the guard
        // resumes them when dropped, on every path).
        self.tids.begin();
        if self.pauser.is_some() && self.opts.cpu_status {
            // Stopped threads are not running: ask the kernel before stopping them.
            crate::process::running_threads(self.pid, MAX_THREADS, &mut self.running);
        }
        let r = match self.pauser.as_ref().map(Pauser::pause).transpose() {
            Ok(_paused) => self.sample_with(&mut batch),
            Err(e) => Err(e.into()),
        };
        self.batch = batch;
        match r {
            Ok(()) => {
                self.stats.samples += 1;
                self.last_full = Some(self.epoch);
                if let Some(w) = self.watch.as_mut() {
                    for tc in self.threads.values() {
                        w.watch(tc.tid, tc.heavy);
                    }
                    // Every watched thread held still: list the process's threads, so that
                    // the next check can tell that none of them ran.
                    if still == Still::Watched {
                        w.list();
                    }
                }
                Ok(&self.out)
            }
            Err(e) => {
                self.stats.errors += 1;
                self.last_full = None;
                self.out.clear();
                // The interpreter list is read afresh next time; a thread whose walk failed
                // has already lost its cache (`collect`).
                self.interps.clear();
                Err(e)
            }
        }
    }

    /// One sample, fully resolved: every interpreter (main first) with its threads that run
    /// Python code (as `sys._current_frames()` lists them) and their frames. For `dump`.
    pub fn snapshot(&mut self) -> Result<Vec<InterpreterStacks>, UnwindError> {
        let samples = self.sample()?.to_vec();
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
                .stack_frames(s.stack)
                .unwrap_or(&[])
                .iter()
                .filter_map(|&f| {
                    let key = self.table.frame_key(f)?;
                    Some(Frame {
                        code: self.table.function_info(key.function)?.clone(),
                        line: key.line,
                    })
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
                    frames,
                });
            }
        }
        Ok(out)
    }

    fn predict(&self, b: &mut Batch) {
        let l = &self.layout;
        b.clear();
        b.push(Key::Head, self.runtime + l.runtime_interpreters_head, 8);
        let gil_struct = self.gil_from_struct();
        if let (GilLayout::Runtime { locked, holder }, true) = (l.gil, gil_struct) {
            let lo = locked.min(holder);
            b.push(
                Key::Gil(self.runtime + lo),
                self.runtime + lo,
                (locked.max(holder) - lo + 8) as usize,
            );
        }
        let (lo, len) = self.interp_span();
        for &ia in &self.interps {
            b.push(Key::Interp(ia), ia.wrapping_add(lo), len);
            if let (GilLayout::InterpPointer { ptr, .. }, true) = (l.gil, gil_struct) {
                b.push(Key::Word(ia.wrapping_add(ptr)), ia.wrapping_add(ptr), 8);
            }
            if let Some(g) = l.interp.code_object_generation {
                b.push(Key::Word(ia.wrapping_add(g)), ia.wrapping_add(g), 8);
            }
        }
        if let (GilLayout::InterpPointer { locked, holder, .. }, true) = (l.gil, gil_struct) {
            let lo = locked.min(holder);
            for &g in &self.gils {
                b.push(
                    Key::Gil(g.wrapping_add(lo)),
                    g.wrapping_add(lo),
                    (locked.max(holder) - lo + 8) as usize,
                );
            }
        }
        let tsize = l.tstate.size as usize;
        let fsize = l.frame.size as usize;
        for (&ta, tc) in &self.threads {
            b.push(Key::Tstate(ta), ta, tsize);
            if self.keeps(tc) {
                continue;
            }
            if let CurrentFrame::ViaCFrame { current_frame, .. } = l.tstate.current_frame {
                if tc.cframe != 0 {
                    b.push(
                        Key::Word(tc.cframe.wrapping_add(current_frame)),
                        tc.cframe.wrapping_add(current_frame),
                        8,
                    );
                }
            }
            for &(s, e) in &tc.regions {
                b.push(Key::Region(s), s, (e - s) as usize);
            }
            for &f in &tc.outside {
                b.push(Key::Frame(f), f, fsize);
            }
        }
        if l.interp.code_object_generation.is_none() {
            let (fp_lo, fp_len) = self.fingerprint_span();
            for &a in &self.prev_codes {
                b.push(Key::Code(a), a.wrapping_add(fp_lo), fp_len);
            }
        }
    }

    /// Whether a thread's last stack is still its stack, unless its thread state says
    /// otherwise: it has not run since that stack was read (`skip_idle`).
    fn keeps(&self, tc: &ThreadCache) -> bool {
        tc.last_stack.is_some()
            && tc.kept < MAX_KEPT
            && self
                .watch
                .as_ref()
                .and_then(|w| w.quiet_since(tc.tid))
                .is_some_and(|since| tc.read_at >= since)
    }

    /// Where a code object's validation fields lie: (offset, length) covering its name,
    /// qualname, file name and line table pointers.
    fn fingerprint_span(&self) -> (u64, usize) {
        let c = &self.layout.code;
        let fields = [c.name, c.qualname, c.filename, c.linetable];
        let lo = fields.iter().copied().min().unwrap_or(0);
        let hi = fields.iter().copied().max().unwrap_or(0);
        (lo, (hi - lo + 8) as usize)
    }

    /// The part of an interpreter state the sampler reads: from the lowest to the highest of
    /// `next`, `id` and `threads_head` (they sit ~7 KiB into the struct on 3.13+).
    fn interp_span(&self) -> (u64, usize) {
        let i = &self.layout.interp;
        let lo = i.next.min(i.id).min(i.threads_head);
        (lo, (i.next.max(i.id).max(i.threads_head) + 8 - lo) as usize)
    }

    /// Whether GIL holders come from the GIL struct (not from a per-thread flag).
    fn gil_from_struct(&self) -> bool {
        self.layout.tstate.holds_gil.is_none()
    }

    /// Bytes at `addr`: from the batch when it holds them under `key`, else from the target.
    fn bytes<'b>(
        &self,
        b: &'b Batch,
        key: Key,
        addr: u64,
        len: usize,
    ) -> Result<Cow<'b, [u8]>, UnwindError> {
        match b.get(key) {
            Some(v) if v.len() == len => Ok(Cow::Borrowed(v)),
            _ => Ok(Cow::Owned(self.mem.read_vec(addr, len)?)),
        }
    }

    fn word(&self, b: &Batch, addr: u64) -> Result<u64, UnwindError> {
        Ok(Bytes(&self.bytes(b, Key::Word(addr), addr, 8)?).u64(0)?)
    }

    fn sample_with(&mut self, b: &mut Batch) -> Result<(), UnwindError> {
        self.predict(b);
        b.fetch(&self.mem);
        self.out.clear();
        self.raws.clear();
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        let r = self.collect(b, &mut work).and_then(|gen| {
            self.resolve_codes(b, gen)?;
            self.finish(&mut work)
        });
        self.work = work;
        r
    }

    /// Reads interpreters and threads, and walks every thread's frames.
    fn collect(&mut self, b: &Batch, work: &mut Vec<Work>) -> Result<u64, UnwindError> {
        let l = self.layout.clone();
        let head =
            Bytes(&self.bytes(b, Key::Head, self.runtime + l.runtime_interpreters_head, 8)?)
                .u64(0)?;
        let (span_lo, span_len) = self.interp_span();
        let gil_struct = self.gil_from_struct();
        let mut interps = std::mem::take(&mut self.spare.interps);
        let mut holders = std::mem::take(&mut self.spare.holders);
        let mut gils = std::mem::take(&mut self.spare.gils);
        let mut generation = 0u64;
        let mut tstates = std::mem::take(&mut self.spare.tstates);
        let mut interp_ids = std::mem::take(&mut self.spare.interp_ids);
        interps.clear();
        holders.clear();
        gils.clear();
        tstates.clear();
        interp_ids.clear();

        if let (GilLayout::Runtime { locked, holder }, true) = (l.gil, gil_struct) {
            let lo = locked.min(holder);
            let len = (locked.max(holder) - lo + 8) as usize;
            let g = self.bytes(b, Key::Gil(self.runtime + lo), self.runtime + lo, len)?;
            if Bytes(&g).u32(locked - lo)? != 0 {
                holders.push(Bytes(&g).u64(holder - lo)?);
            }
        }
        let mut ia = head;
        while ia != 0 {
            if interps.len() >= MAX_INTERPRETERS || interps.contains(&ia) {
                return Err(UnwindError::Cycle("interpreter list"));
            }
            interps.push(ia);
            let ib = self.bytes(b, Key::Interp(ia), ia.wrapping_add(span_lo), span_len)?;
            let ib = Bytes(&ib);
            let at = |off: u64| off - span_lo;
            let interp_id = ib.i64(at(l.interp.id))?;
            interp_ids.push(interp_id);
            if let Some(g) = l.interp.code_object_generation {
                generation = generation.wrapping_add(self.word(b, ia.wrapping_add(g))?);
            }
            if let (
                GilLayout::InterpPointer {
                    ptr,
                    locked,
                    holder,
                },
                true,
            ) = (l.gil, gil_struct)
            {
                let gp = self.word(b, ia.wrapping_add(ptr))?;
                if gp != 0 && !gils.contains(&gp) {
                    gils.push(gp);
                    let lo = locked.min(holder);
                    let len = (locked.max(holder) - lo + 8) as usize;
                    let g =
                        self.bytes(b, Key::Gil(gp.wrapping_add(lo)), gp.wrapping_add(lo), len)?;
                    if Bytes(&g).u32(locked - lo)? != 0 {
                        holders.push(Bytes(&g).u64(holder - lo)?);
                    }
                }
            }
            let mut ta = ib.u64(at(l.interp.threads_head))?;
            let first = tstates.len();
            while ta != 0 {
                if tstates.len() - first >= MAX_THREADS
                    || tstates[first..].iter().any(|t| t.addr == ta)
                {
                    return Err(UnwindError::Cycle("thread list"));
                }
                let tb = self.bytes(b, Key::Tstate(ta), ta, l.tstate.size as usize)?;
                let t = Bytes(&tb);
                // A thread that has not run keeps its stack if its state agrees.
                let kept = self
                    .threads
                    .get(&ta)
                    .filter(|tc| self.keeps(tc))
                    .map(|tc| (tc.cframe, tc.last_top, tc.tid));
                let current_frame = match l.tstate.current_frame {
                    CurrentFrame::Direct(off) => t.u64(off)?,
                    CurrentFrame::ViaCFrame {
                        cframe,
                        current_frame,
                    } => {
                        let cf = t.u64(cframe)?;
                        match kept {
                            // The C frame holding the pointer is the idle thread's own.
                            Some((c, top, _)) if c == cf && cf != 0 => top,
                            _ => {
                                let tc = self.threads.entry(ta).or_default();
                                tc.cframe = cf;
                                if cf == 0 {
                                    0
                                } else {
                                    self.word(b, cf.wrapping_add(current_frame))?
                                }
                            }
                        }
                    }
                };
                let native_thread_id = t.u64(l.tstate.native_thread_id)?;
                let host_tid = self.tids.host(native_thread_id).unwrap_or(0);
                tstates.push(Tstate {
                    addr: ta,
                    order: tstates.len(),
                    interp_id,
                    thread_id: t.u64(l.tstate.thread_id)?,
                    native_thread_id,
                    host_tid,
                    keep: kept.is_some_and(|(_, top, tid)| top == current_frame && tid == host_tid),
                    current_frame,
                    chunk: match l.tstate.datastack_chunk {
                        Some(off) => t.u64(off)?,
                        None => 0,
                    },
                    marker: match l.tstate.frame_marker {
                        Some((m, s)) => Some((t.u64(m)?, t.u64(s)?)),
                        None => None,
                    },
                    holds_gil: match l.tstate.holds_gil {
                        Some(off) => Some(t.i32(off)? != 0),
                        None => None,
                    },
                });
                ta = t.u64(l.tstate.next)?;
            }
            ia = ib.u64(at(l.interp.next))?;
        }
        self.spare.interps = std::mem::replace(&mut self.interps, interps);
        self.spare.gils = std::mem::replace(&mut self.gils, gils);
        self.spare.interp_ids = std::mem::replace(&mut self.interp_ids, interp_ids);

        // Threads, oldest first within each interpreter (the lists are newest first).
        tstates.sort_unstable_by_key(|t| (t.interp_id, std::cmp::Reverse(t.order)));
        for ts in tstates.drain(..) {
            let start = self.raws.len();
            let holds_gil = ts.holds_gil.unwrap_or_else(|| holders.contains(&ts.addr));
            if ts.keep {
                self.threads.entry(ts.addr).or_default().seen = self.epoch;
                work.push(Work {
                    raw: start..start,
                    tail: None,
                    holds_gil,
                    ts,
                });
                continue;
            }
            let tail = match self.walk(b, &ts) {
                Ok(tail) => tail,
                Err(e) => {
                    // What this thread's cache predicted may be what misled the walk: it
                    // starts afresh. The other threads' caches stay (a torn read of one
                    // thread says nothing about the others, and re-learning every thread
                    // of a busy process costs a syscall each).
                    self.threads.remove(&ts.addr);
                    return Err(e);
                }
            };
            work.push(Work {
                raw: start..self.raws.len(),
                tail,
                holds_gil,
                ts,
            });
        }
        self.spare.tstates = tstates;
        self.spare.holders = holders;
        Ok(generation)
    }

    /// Refreshes what we know of a thread's data-stack chunks when its current chunk changed.
    fn chunks(&mut self, ts: &Tstate) -> Result<(), UnwindError> {
        let tc = self.threads.entry(ts.addr).or_default();
        if tc.chunk == ts.chunk && ts.chunk != 0 {
            return Ok(());
        }
        tc.chunk = ts.chunk;
        tc.older.clear();
        tc.chunk_end = 0;
        let mut c = ts.chunk;
        let mut first = true;
        let mut older = Vec::new();
        let mut chunk_end = 0;
        let mut older_bytes = 0u64;
        while c != 0 && older.len() < MAX_CHUNKS {
            let h = self.mem.read_vec(c, CHUNK_DATA as usize)?;
            let h = Bytes(&h);
            let size = h.u64(CHUNK_SIZE)?;
            // Sizes and addresses are the target's: bounded, and never wrapped around.
            let Some(end) = c.checked_add(size) else {
                break;
            };
            if size <= CHUNK_DATA || size > MAX_CHUNK_SIZE {
                break;
            }
            if first {
                chunk_end = end;
                first = false;
            } else {
                let used = h.u64(CHUNK_TOP)?.saturating_mul(8).min(size - CHUNK_DATA);
                older_bytes += used;
                if older_bytes > MAX_OLDER_BYTES {
                    break;
                }
                older.push((c + CHUNK_DATA, c + CHUNK_DATA + used));
            }
            c = h.u64(CHUNK_PREVIOUS)?;
        }
        let tc = self.threads.entry(ts.addr).or_default();
        tc.chunk_end = chunk_end;
        tc.older = older;
        Ok(())
    }

    /// Walks one thread's frames into `self.raws`; returns the cached chain index from which
    /// the rest of the stack is unchanged (3.15 marker), if any.
    fn walk(&mut self, b: &Batch, ts: &Tstate) -> Result<Option<usize>, UnwindError> {
        self.chunks(ts)?;
        let f = self.layout.frame.clone();
        let fsize = f.size as usize;
        let tc = self.threads.entry(ts.addr).or_default();
        tc.seen = self.epoch;
        // Which cached frame, if any, the marker proves unchanged.
        let mut valid: Option<usize> = None;
        if self.use_marker {
            if let (Some((m, seq)), Some((wm, wseq, wi))) = (ts.marker, tc.marker) {
                let k = seq.wrapping_sub(wseq) as usize;
                let i = wi.checked_add(k).filter(|&i| i < tc.chain.len());
                if let Some(i) = i.filter(|&i| tc.chain[i].addr == m && (k > 0 || m == wm)) {
                    valid = Some(i);
                }
            }
        }
        let chain = std::mem::take(&mut tc.chain);
        let chunk_lo = ts.chunk.saturating_add(CHUNK_DATA);
        let chunk_hi = tc.chunk_end;
        // Addresses are the target's: a garbage one near 2^64 must not wrap into the chunk.
        let in_chunk =
            |a: u64| a >= chunk_lo && a.checked_add(fsize as u64).is_some_and(|e| e <= chunk_hi);
        let older = std::mem::take(&mut tc.older);

        // The bytes we hold: the prefetched regions; more is read at the first miss.
        let mut held = std::mem::take(&mut self.spare.held);
        held.clear();
        held.extend(tc.regions.iter().filter_map(|&(s, _)| {
            let (pos, len) = b.locate(Key::Region(s))?;
            Some((s, pos, len))
        }));
        let mut extra: Vec<(u64, Vec<u8>)> = Vec::new();
        let (mut caught_up, mut older_loaded) = (false, false);
        let mut frame_buf = [0u8; 256];
        let batch_buf = &b.buf;
        let find =
            |held: &[(u64, usize, usize)], extra: &[(u64, Vec<u8>)], a: u64, out: &mut [u8]| {
                held.iter()
                    .filter_map(|&(s, pos, len)| Some((s, batch_buf.get(pos..pos + len)?)))
                    .chain(extra.iter().map(|(s, v)| (*s, v.as_slice())))
                    .find_map(|(s, v)| {
                        let off = a.checked_sub(s)? as usize;
                        v.get(off..off.checked_add(out.len())?)
                    })
                    .map(|v| out.copy_from_slice(v))
                    .is_some()
            };

        let mut addr = ts.current_frame;
        let mut tail = None;
        let mut depth = 0usize;
        let mut outside = std::mem::take(&mut tc.outside);
        outside.clear();
        let walked_from = self.raws.len();
        while addr != 0 {
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(UnwindError::TooLong("frame chain", MAX_DEPTH));
            }
            let out = frame_buf
                .get_mut(..fsize)
                .ok_or(UnwindError::TooLong("frame header", 256))?;
            let mut local = find(&held, &extra, addr, out);
            if !local && in_chunk(addr) && !caught_up {
                // One read for everything still needed from the current chunk: down to the
                // marker when it is valid, else the whole used part (bounded).
                caught_up = true;
                let end = addr + fsize as u64;
                let low = match valid {
                    Some(i) if in_chunk(chain[i].addr) && chain[i].addr <= addr => chain[i].addr,
                    _ => chunk_lo.max(end.saturating_sub(MAX_REGION)),
                };
                extra.push((low, self.mem.read_vec(low, (end - low) as usize)?));
                local = find(&held, &extra, addr, out);
            }
            if !local && !older_loaded && older.iter().any(|&(s, e)| addr >= s && addr < e) {
                // A deep stack continues in older chunks: read their used parts at once.
                older_loaded = true;
                for &(s, e) in &older {
                    if let Some((pos, len)) = b.locate(Key::Region(s)) {
                        if len as u64 == e - s {
                            held.push((s, pos, len));
                            continue;
                        }
                    }
                    extra.push((s, self.mem.read_vec(s, (e - s) as usize)?));
                }
                local = find(&held, &extra, addr, out);
            }
            let bytes: Cow<'_, [u8]> = match local {
                true => Cow::Borrowed(&*out),
                false => {
                    if outside.len() < MAX_OUTSIDE {
                        outside.push(addr);
                    }
                    self.bytes(b, Key::Frame(addr), addr, fsize)?
                }
            };
            let fb = Bytes(&bytes);
            let previous = fb.u64(f.previous)?;
            let owner = fb.u8(f.owner)?;
            let raw = RawFrame {
                addr,
                code: fb.u64(f.code)? & !f.code_tag_mask,
                previous,
                instr: fb.u64(f.instr)?,
                shim: f.shim_owners.contains(&owner),
                generator: owner == OWNED_BY_GENERATOR,
            };
            if previous == addr {
                return Err(UnwindError::Cycle("frame chain"));
            }
            self.raws.push(raw);
            if let Some(i) = valid {
                if chain[i].addr == addr {
                    if chain[i].code == raw.code && chain[i].previous == previous {
                        tail = Some(i);
                        break;
                    }
                    valid = None;
                }
            }
            addr = previous;
        }
        // From 3.12 every entry into the interpreter pushes a C-stack shim frame, so a thread's
        // chain always ends in a shim. One that ends in a Python frame was read torn (a
        // generator's frame suspended, a frame being pushed, between reading the thread state
        // and the frame): reporting it would count a truncated stack.
        if tail.is_none() && !f.shim_owners.is_empty() {
            if let Some(last) = self.raws[walked_from..].last().filter(|r| !r.shim) {
                return Err(UnwindError::BadObject {
                    addr: last.addr,
                    what: "the stack does not end at an entry frame (read while it changed)".into(),
                });
            }
        }
        self.stats.frames_from_memory += (self.raws.len() - walked_from) as u64;
        let tc = self.threads.entry(ts.addr).or_default();
        tc.chain = chain;
        tc.older = older;
        tc.outside = outside;
        self.spare.held = held;
        Ok(tail)
    }

    /// Makes sure every code object walked this sample is cached and valid: one batch of
    /// validations, one batch of loads.
    fn resolve_codes(&mut self, b: &Batch, generation: u64) -> Result<(), UnwindError> {
        self.codes_changed = false;
        let use_generation = self.layout.interp.code_object_generation.is_some();
        let stamp = if use_generation {
            generation
        } else {
            self.epoch
        };
        let (fp_lo, fp_len) = self.fingerprint_span();

        // Distinct code objects of this sample, each counted once as a hit or a miss.
        let mut distinct = std::mem::take(&mut self.spare.codes);
        distinct.clear();
        distinct.extend(
            self.raws
                .iter()
                .filter(|r| !r.shim && r.code != 0)
                .map(|r| r.code),
        );
        distinct.sort_unstable();
        distinct.dedup();
        let mut check = std::mem::take(&mut self.spare.check);
        let mut load = std::mem::take(&mut self.spare.load);
        check.clear();
        load.clear();
        for &a in &distinct {
            match self.codes.peek(&a) {
                Some(e) if e.valid_at == stamp => self.stats.code_cache_hits += 1,
                Some(_) => check.push(a),
                None => load.push(a),
            }
        }
        if !check.is_empty() {
            // Prefetched with the batch when the code object was in the last sample too.
            let mut buf = std::mem::take(&mut self.spare.fingerprints);
            buf.clear();
            buf.resize(fp_len * check.len(), 0);
            let mut unread = Vec::new();
            for (i, (&a, slot)) in check.iter().zip(buf.chunks_exact_mut(fp_len)).enumerate() {
                match b.get(Key::Code(a)) {
                    Some(v) if v.len() == fp_len => slot.copy_from_slice(v),
                    _ => unread.push(i),
                }
            }
            if !unread.is_empty() {
                let mut more = vec![0u8; fp_len * unread.len()];
                read_chunks(
                    &self.mem,
                    unread
                        .iter()
                        .map(|&i| (check[i].wrapping_add(fp_lo), fp_len)),
                    &mut more,
                )?;
                for (&i, v) in unread.iter().zip(more.chunks_exact(fp_len)) {
                    buf[i * fp_len..(i + 1) * fp_len].copy_from_slice(v);
                }
            }
            for (&a, fp) in check.iter().zip(buf.chunks_exact(fp_len)) {
                let fp = fingerprint(fp);
                let fresh = match self.codes.peek_mut(&a) {
                    Some(e) if e.fingerprint == fp => {
                        e.valid_at = stamp;
                        true
                    }
                    _ => false,
                };
                if fresh {
                    self.stats.code_cache_hits += 1;
                } else {
                    self.stats.stale_invalidations += 1;
                    self.codes_changed = true;
                    self.codes.pop(&a);
                    load.push(a);
                }
            }
            self.spare.fingerprints = buf;
        }
        self.stats.code_cache_misses += load.len() as u64;
        if !load.is_empty() {
            let infos = read_codes(&self.mem, &self.layout, self.code_type, &load)?;
            let mut fps = vec![0u8; fp_len * load.len()];
            read_chunks(
                &self.mem,
                load.iter().map(|&a| (a.wrapping_add(fp_lo), fp_len)),
                &mut fps,
            )?;
            for ((&a, info), fp) in load.iter().zip(infos).zip(fps.chunks_exact(fp_len)) {
                match info {
                    Ok(info) => {
                        let info = Arc::new(info);
                        let function = self.table.function(&info);
                        self.codes.put(
                            a,
                            CodeEntry {
                                function,
                                info,
                                fingerprint: fingerprint(fp),
                                valid_at: stamp,
                            },
                        );
                    }
                    // Not a code object: the frame is not a Python function's; skip it.
                    Err(UnwindError::NotCode(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        self.spare.codes = std::mem::replace(&mut self.prev_codes, distinct);
        self.spare.check = check;
        self.spare.load = load;
        Ok(())
    }

    /// Turns walked frames into interned stacks, updates the caches and the marker.
    fn finish(&mut self, work: &mut [Work]) -> Result<(), UnwindError> {
        let adaptive = self.layout.code.code_adaptive;
        let fsize = self.layout.frame.size;
        for w in work.iter() {
            if w.ts.keep {
                let tc = self.threads.entry(w.ts.addr).or_default();
                if let Some(stack) = tc.last_stack {
                    tc.kept += 1;
                    self.stats.threads_unchanged += 1;
                    self.stats.frame_cache_hits += 1;
                    self.stats.frames_from_cache += tc.chain.len() as u64;
                    self.out.push(ThreadSample {
                        interpreter_id: w.ts.interp_id,
                        thread_id: w.ts.thread_id,
                        native_thread_id: w.ts.native(),
                        namespace_thread_id: self
                            .tids
                            .namespaced()
                            .then_some(w.ts.native_thread_id),
                        holds_gil: w.holds_gil,
                        // It has not run since the last check.
                        on_cpu: self.opts.cpu_status.then_some(false),
                        stack,
                    });
                    continue;
                }
            }
            let mut chain_new = std::mem::take(&mut self.chain_new);
            chain_new.clear();
            self.ids.clear();
            let raws = &self.raws[w.raw.clone()];
            // Without the 3.15 marker every frame is walked, but the outer ones rarely change:
            // frames identical to last sample's from the bottom up (same address, code object,
            // caller and instruction) keep their frame ids, so only the top is resolved. Not
            // after a code object was found stale this sample (its function may differ).
            let common = match (w.tail, self.codes_changed) {
                (None, false) => self.threads.get(&w.ts.addr).map_or(0, |tc| {
                    raws.iter()
                        .rev()
                        .zip(tc.chain.iter().rev())
                        .take_while(|(r, c)| {
                            r.addr == c.addr
                                && r.code == c.code
                                && r.previous == c.previous
                                && r.instr == c.instr
                        })
                        .count()
                }),
                _ => 0,
            };
            let top = raws.len() - common;
            for r in &raws[..top] {
                let id = if r.shim || r.code == 0 {
                    None
                } else if let Some(e) = self.codes.get(&r.code) {
                    if !r.generator && !e.info.started(r.code, adaptive, r.instr) {
                        // Pushed but not started, or one of the interpreter's own shims.
                        None
                    } else {
                        let line = e.info.line_at(r.code, adaptive, r.instr);
                        let function = e.function;
                        Some(self.table.frame(function, line))
                    }
                } else {
                    None // not a code object: not a Python function's frame
                };
                if let Some(id) = id {
                    self.ids.push(id);
                }
                chain_new.push(ChainFrame {
                    addr: r.addr,
                    code: r.code,
                    previous: r.previous,
                    instr: r.instr,
                    id,
                });
            }
            let tc = self.threads.entry(w.ts.addr).or_default();
            let walked_ids = self.ids.len();
            let stack = match w.tail {
                Some(i) => {
                    let tail_len = tc.chain.len() - (i + 1);
                    self.stats.frames_from_cache += tail_len as u64;
                    if w.raw.len() == 1 && i == 0 {
                        self.stats.frame_cache_hits += 1;
                    } else {
                        self.stats.frame_cache_partial_hits += 1;
                    }
                    let unchanged = tc.last_tail_len == tail_len && tc.last_walked == self.ids;
                    // Replace the walked part of the chain; the cached rest stays in place.
                    if chain_new.len() == i + 1 {
                        tc.chain[..=i].copy_from_slice(&chain_new);
                    } else {
                        tc.chain.splice(..=i, chain_new.drain(..));
                    }
                    match tc.last_stack {
                        Some(id) if unchanged => id,
                        _ => {
                            let rest = &tc.chain[w.raw.len()..];
                            self.ids.extend(rest.iter().filter_map(|c| c.id));
                            tc.last_tail_len = tail_len;
                            self.table.stack(&self.ids)
                        }
                    }
                }
                None if common > 0 => {
                    self.stats.frame_cache_misses += 1;
                    self.stats.frames_from_cache += common as u64;
                    let same = top == 0 && tc.chain.len() == common;
                    let keep_from = tc.chain.len() - common;
                    tc.chain.splice(..keep_from, chain_new.drain(..));
                    tc.last_tail_len = usize::MAX;
                    match tc.last_stack {
                        Some(id) if same => id,
                        _ => {
                            let rest = &tc.chain[top..];
                            self.ids.extend(rest.iter().filter_map(|c| c.id));
                            self.table.stack(&self.ids)
                        }
                    }
                }
                None => {
                    self.stats.frame_cache_misses += 1;
                    std::mem::swap(&mut tc.chain, &mut chain_new);
                    tc.last_tail_len = usize::MAX;
                    self.table.stack(&self.ids)
                }
            };
            tc.last_walked.clear();
            tc.last_walked.extend_from_slice(&self.ids[..walked_ids]);
            tc.last_stack = Some(stack);
            tc.tid = w.ts.host_tid;
            tc.read_at = self.epoch;
            tc.kept = 0;

            // The marker and next sample's regions.
            let chunk_lo = w.ts.chunk.saturating_add(CHUNK_DATA);
            let chunk_hi = tc.chunk_end;
            let in_chunk =
                |a: u64| a >= chunk_lo && a.checked_add(fsize).is_some_and(|e| e <= chunk_hi);
            tc.regions.clear();
            let top = w.ts.current_frame;
            // The anchor: the innermost frame in the current chunk (the top frame, unless it
            // is a generator's or coroutine's, which live outside; those are prefetched by
            // address through `outside`).
            let anchor = tc.chain.iter().position(|c| in_chunk(c.addr));
            if let Some(a) = anchor {
                let base = tc.chain[a].addr;
                let still = tc.last_top == top;
                let growth = if still {
                    0
                } else {
                    // To the end of the top frame's page, within [MIN_GROWTH, GROWTH].
                    let e = base + fsize;
                    (e.saturating_add(PAGE - 1) & !(PAGE - 1))
                        .saturating_sub(e)
                        .clamp(MIN_GROWTH, GROWTH)
                };
                // `base` is in the chunk, so `base + fsize` is at most `chunk_hi`.
                let end = (base + fsize).saturating_add(growth).min(chunk_hi);
                if self.use_marker {
                    // A stack whose top held still since the last sample gets the marker on
                    // the anchor (then the next sample is a full hit); otherwise the outermost
                    // frame of the current chunk within MARKER_SPAN of the anchor, which calls
                    // and returns near the top leave alone.
                    // The marker the target holds now, if it is on this stack near the anchor:
                    // keeping it costs no write (hysteresis against depth that comes and goes).
                    let kept = w.ts.marker.and_then(|(m_now, _)| {
                        let j = a + tc.chain[a..].iter().position(|c| c.addr == m_now)?;
                        (in_chunk(m_now) && m_now <= base && base - m_now <= 2 * MARKER_SPAN)
                            .then_some(j)
                    });
                    let j = if still {
                        Some(a)
                    } else if kept.is_some() {
                        kept
                    } else {
                        tc.chain[a..]
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| in_chunk(c.addr))
                            .take_while(|(_, c)| c.addr <= base && base - c.addr <= MARKER_SPAN)
                            .map(|(j, _)| a + j)
                            .last()
                    };
                    if let (Some(j), Some((m_now, seq_now))) = (j, w.ts.marker) {
                        let m = tc.chain[j].addr;
                        if m != m_now {
                            if let Some((off, _)) = self.layout.tstate.frame_marker {
                                // The thread state was read whole at `addr`, so this is in it.
                                self.mem
                                    .write(w.ts.addr.wrapping_add(off), &m.to_le_bytes())?;
                                self.stats.marker_writes += 1;
                            }
                        }
                        tc.marker = Some((m, seq_now, j));
                        tc.regions.push((m.min(base), end));
                    } else {
                        tc.marker = None;
                        tc.regions
                            .push((chunk_lo.max(end.saturating_sub(MAX_REGION)), end));
                    }
                } else {
                    tc.regions
                        .push((chunk_lo.max(end.saturating_sub(MAX_REGION)), end));
                    let older = std::mem::take(&mut tc.older);
                    tc.regions.extend(older.iter().filter(|(s, e)| e > s));
                    tc.older = older;
                }
            } else {
                tc.marker = None;
            }
            tc.heavy = heavy(&tc.regions, &tc.outside, w.raw.len());
            tc.last_top = top;
            let on_cpu = self.opts.cpu_status.then(|| match self.pauser {
                Some(_) => self.running.contains(&w.ts.host_tid),
                None => crate::process::thread_on_cpu(self.pid, w.ts.host_tid).unwrap_or(false),
            });
            self.out.push(ThreadSample {
                interpreter_id: w.ts.interp_id,
                thread_id: w.ts.thread_id,
                native_thread_id: w.ts.native(),
                namespace_thread_id: self.tids.namespaced().then_some(w.ts.native_thread_id),
                holds_gil: w.holds_gil,
                on_cpu,
                stack,
            });
            self.chain_new = chain_new;
        }
        let epoch = self.epoch;
        self.threads.retain(|_, t| t.seen == epoch);
        Ok(())
    }
}

/// Whether a thread whose next read is `regions` and frames at `outside`, after walking
/// `walked` frames, costs more to read than a schedstat check (about 2 µs, two to three cold
/// iovecs): it spans more than two pages, or a page or more of bytes, or many frames to walk.
fn heavy(regions: &[(u64, u64)], outside: &[u64], walked: usize) -> bool {
    let bytes: u64 = regions.iter().map(|(s, e)| e.saturating_sub(*s)).sum();
    let mut pages = regions.len();
    let mut last = None;
    for page in outside.iter().map(|a| a / PAGE) {
        if last != Some(page) {
            pages += 1;
            last = Some(page);
        }
    }
    bytes >= PAGE || pages > 2 || walked >= 32
}

/// A cheap digest of a code object's name, qualname, file and line-table pointers.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
