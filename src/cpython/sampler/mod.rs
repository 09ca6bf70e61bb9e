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
//! The top frame: the thread state's pointer to it is read a microsecond or so before the
//! frames, while the target runs. Frames say whether they are live ([`Liveness`]), so the top
//! is the one the frames show when they were read ([`settle_top`]); the pointer only says
//! where to look. For a thread paused by `blocking` (or `target_stopped`), the pointer is the
//! top. A walk that does not hold together (a frame without its code object, a
//! chain that climbs, a stale C-stack entry frame that no frame before its callee replaces) is
//! read again.
//!
//! With the 3.15 marker, the next read of a thread starts at its outermost frame near the top
//! whatever frame the marker is on: a loop's call that returns and is made again between two
//! samples leaves the top where it was but takes the marker down with it.
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

mod read_plan;

use super::layout::{
    CurrentFrame, GilLayout, Layout, Liveness, CHUNK_DATA, CHUNK_PREVIOUS, CHUNK_SIZE, CHUNK_TOP,
    OWNED_BY_GENERATOR,
};
use super::objects::{
    fingerprint, fingerprint_span, read_chunks, read_codes, CodeInfo, LoadedCode,
};
use super::unwind::{Frame, InterpreterStacks, ThreadStack, MAX_DEPTH};
use super::UnwindError;
use crate::binary::RuntimeLocation;
use crate::memory::{Bytes, Pauser, RemoteMemory};
use crate::process::namespace::ThreadIds;
use crate::process::runstate::{RunWatch, Still};
use crate::stacks::{FrameId, FunctionId, StackId, StackTable};
use lru::LruCache;
use read_plan::{Key, ReadPlan};
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use std::borrow::Cow;
use std::cell::Cell;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most interpreters and threads followed per sample.
const MAX_INTERPRETERS: usize = 256;
/// Most threads read in one sample, all interpreters together.
const MAX_THREADS: usize = 8192;
/// Room read above the top frame when a thread is read again because its stack moved: it
/// keeps moving during the microseconds until that read.
const REREAD_GROWTH: u64 = 8192;
/// Bytes below the last top frame read first (see [`top_split`]), and how far the older part
/// reaches into them (at least a frame header).
const TOP_BEHIND: u64 = 2048;
const TOP_OVERLAP: u64 = 256;
/// 3.12+: bytes of C stack prefetched below a thread's innermost entry frame.
const ENTRY_WINDOW: u64 = 8192;
/// Code objects loaded after a sample because a frame of theirs stopped the search for a top.
const MAX_CALLEE_CODES: usize = 4;
/// Addresses remembered as no code object's (so that they are not read again each sample).
const MAX_NOT_CODE: usize = 64;
/// 3.11/3.12: C frames of a thread whose current-frame words are prefetched.
const MAX_CFRAMES: usize = 4;
/// Most reads of a whole sample (see `Sampler::sample`).
const MAX_SAMPLE_READS: u32 = 3;
/// Most syscalls one sample makes, every read again included (a steady-state sample makes
/// one or two; 8,192 threads each read four times with their code objects stay far below).
const MAX_SAMPLE_SYSCALLS: u64 = 65_536;
/// Longest one sample may take before it is given up as a counted `budget` error (a deep
/// stack of 65,536 frames reads in a few milliseconds): checked between reads, so that a
/// target whose reads are slow costs the fleet's one sampling thread this long at most per
/// sample, plus its first three reads (the clock starts after two, the steady state).
const MAX_SAMPLE_TIME: Duration = Duration::from_millis(250);
/// Failed samples in a row after which the cached code objects are dropped and loaded again:
/// an entry read while its object changed (or freed and reused with the same fingerprint)
/// would otherwise fail, or mislabel, every sample it is in for as long as it is cached.
const FORGET_AFTER_FAILURES: u32 = 8;
/// Most reads of one thread per sample (see `Sampler::walk_consistent`).
const MAX_READS: u32 = 4;
/// Most bytes of stacks one sample reads, every thread and every read again together (a deep
/// stack of 65,536 frames is about 7 MiB).
const MAX_SAMPLE_BYTES: usize = 64 << 20;
/// Most frames of one thread outside its data stack (generators', entry frames on the C
/// stack; each may cost a read of its own): real stacks have a few dozen.
const MAX_OUTSIDE_FRAMES: usize = 1024;
/// Most frames walked in one sample, every thread together.
const MAX_SAMPLE_FRAMES: usize = 1 << 18;
/// Most code objects loaded in one sample.
const MAX_CODES_PER_SAMPLE: usize = 1024;
/// Most bytes of code objects (names, decoded line tables) one sampler keeps.
const MAX_CODE_CACHE_BYTES: usize = 8 << 20;
/// Most data-stack chunks followed per thread.
const MAX_CHUNKS: usize = 64;
/// The 3.15 marker goes on the outermost frame at most this many bytes below the top frame,
/// so that calls and returns near the top do not move it.
const MARKER_SPAN: u64 = 2048;
/// Room prefetched above a moving top frame for calls made before the next sample (none
/// above a top frame that held still): a stack read whole in the first read is a sample of
/// one instant, one that must be read again is a sample of a later one.
const GROWTH: u64 = 8192;
/// Room prefetched above a top frame that held still: enough to see the frame it calls next
/// (see [`settle_top`]).
const STILL_ROOM: u64 = 1024;
/// Granularity of the kernel's work in `process_vm_readv` (pinning and copying a page).
const PAGE: u64 = 4096;
/// Most frames outside the data stack (generators, coroutines) prefetched per thread.
const MAX_OUTSIDE: usize = 64;
/// Frames outside the data stack met by earlier reads, and not by the last one, prefetched.
const MAX_RECENT_OUTSIDE: usize = 16;
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

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            frame_cache: true,
            read_only: false,
            cpu_status: false,
            skip_idle: true,
            blocking: false,
            target_stopped: false,
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
    /// Times the cached code objects were dropped after [`FORGET_AFTER_FAILURES`] failed
    /// samples in a row (a cached entry read torn would otherwise fail every sample it is in).
    pub cache_drops: u64,
    /// Threads whose last stack was kept because they had not run (also counted as full
    /// frame-cache hits).
    pub threads_unchanged: u64,
    /// Samples kept whole because no thread of the process had run.
    pub samples_unchanged: u64,
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
    /// The C frames it pointed to in its last reads, newest first (at most [`MAX_CFRAMES`]):
    /// their current-frame words are prefetched.
    cframes: Vec<u64>,
    /// Its top frame was where the read before left it: it is read with the other quiet
    /// threads' (its ranges merge with theirs), not in a group of its own.
    quiet: bool,
    /// 3.12+: the innermost entry frame on the C stack the last read met (C calls into
    /// Python push one there): the C stack around it is prefetched, since the next ones
    /// come and go near it.
    entries: Option<u64>,
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

/// What a thread's read lacked (see `Sampler::walk`).
#[derive(Debug, Default, Clone, Copy)]
struct Missing {
    /// This range of the current data-stack chunk.
    chunk: Option<(u64, u64)>,
    /// The used parts of the older chunks.
    older: bool,
}

impl Missing {
    fn any(&self) -> bool {
        self.chunk.is_some() || self.older
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
    /// 3.11/3.12: the C frame holding the current frame's pointer was not in the read.
    top_unread: bool,
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
    /// 3.11: the frame's `is_entry` (false on later versions).
    entry: bool,
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
    batch: ReadPlan,
    epoch: u64,
    stats: SamplerStats,
    /// What the cached code objects cost (see [`entry_bytes`]).
    code_bytes: usize,
    /// Bytes of stacks read by the sample under way (see [`MAX_SAMPLE_BYTES`]).
    sample_bytes: usize,
    /// When the sample under way went past its first two reads, and the syscalls made
    /// before it (see [`Sampler::check_budget`]).
    sample_started: Cell<Option<Instant>>,
    syscalls_before: u64,
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
    /// Code objects of frames that stopped the search for a top (see `walk`), loaded after
    /// the sample (at most [`MAX_CALLEE_CODES`]), and addresses found to be none (the newest
    /// [`MAX_NOT_CODE`]).
    callee_codes: Vec<u64>,
    not_code: Vec<u64>,
    /// Which threads ran since they were read (`skip_idle`), the epoch of the last sample
    /// read in full that succeeded (`out` holds it), and how many samples in a row were
    /// kept whole since.
    watch: Option<RunWatch>,
    last_full: Option<u64>,
    whole_kept: u32,
    /// Samples in a row that failed (see [`FORGET_AFTER_FAILURES`]).
    failed_in_row: u32,
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
    seen_tstates: FxHashSet<u64>,
    /// A thread's prefetched regions: (address, position and length in the batch buffer).
    held: Vec<(u64, usize, usize)>,
    codes: Vec<u64>,
    check: Vec<u64>,
    load: Vec<u64>,
    fingerprints: Vec<u8>,
    outside: Vec<u64>,
    /// The batch of a thread read again (see `walk_consistent`).
    reread: ReadPlan,
}

impl<M: RemoteMemory> Sampler<M> {
    pub fn new(
        pid: i32,
        mem: M,
        layout: Layout,
        loc: &RuntimeLocation,
        opts: SamplerOptions,
    ) -> Self {
        let use_marker = opts.frame_cache
            && !opts.read_only
            && layout.tstate.frame_marker.is_some()
            && mem.writable();
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
            batch: ReadPlan::default(),
            epoch: 0,
            stats: SamplerStats::default(),
            code_bytes: 0,
            sample_bytes: 0,
            sample_started: Cell::new(None),
            syscalls_before: 0,
            out: Vec::new(),
            interp_ids: Vec::new(),
            raws: Vec::new(),
            work: Vec::new(),
            ids: Vec::new(),
            chain_new: Vec::new(),
            codes_changed: false,
            prev_codes: Vec::new(),
            callee_codes: Vec::new(),
            not_code: Vec::new(),
            watch: if opts.skip_idle && !opts.blocking {
                RunWatch::new(pid)
            } else {
                None
            },
            last_full: None,
            whole_kept: 0,
            failed_in_row: 0,
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
        let (functions, frames, stacks) = self.table.len();
        let max = self.opts.max_interned_stacks.max(1);
        if stacks > max || frames > max.saturating_mul(5) / 2 || functions > max {
            self.table.reset();
            self.forget_codes();
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
        self.sample_started.set(None);
        self.syscalls_before = self.mem.stats().reads();
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
                r
            }
            Err(e) => Err(e.into()),
        };
        self.batch = batch;
        match r {
            Ok(()) => {
                self.stats.samples += 1;
                self.failed_in_row = 0;
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

    fn predict(&self, b: &mut ReadPlan) {
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
        if l.interp.code_object_generation.is_none() {
            let (fp_lo, fp_len) = fingerprint_span(&self.layout);
            for &a in &self.prev_codes {
                b.push(Key::Code(a), a.wrapping_add(fp_lo), fp_len);
            }
        }
        for (&ta, tc) in &self.threads {
            let keep = self.keeps(tc);
            self.predict_thread(b, ta, tc, keep);
        }
    }

    /// One thread's part of a prediction: its state and, unless its stack is kept, where its
    /// frames are expected.
    fn predict_thread(&self, b: &mut ReadPlan, ta: u64, tc: &ThreadCache, keep: bool) {
        let l = &self.layout;
        if keep || tc.quiet {
            b.shared_group();
        } else {
            b.next_group();
        }
        b.push(Key::Tstate(ta), ta, l.tstate.size as usize);
        if keep {
            return;
        }
        if let CurrentFrame::ViaCFrame { current_frame, .. } = l.tstate.current_frame {
            for &cf in &tc.cframes {
                b.push(
                    Key::Word(cf.wrapping_add(current_frame)),
                    cf.wrapping_add(current_frame),
                    8,
                );
            }
        }
        for &(s, e) in &tc.regions {
            match top_split(s, e, tc.last_top) {
                Some(m) => {
                    // The older part overlaps the newer by a frame header, so that every
                    // header lies whole in one of them.
                    b.push(Key::RegionTop(m), m, (e - m) as usize);
                    b.push(Key::Region(s), s, (m + TOP_OVERLAP - s) as usize);
                }
                None => b.push(Key::Region(s), s, (e - s) as usize),
            }
        }
        for &f in &tc.outside {
            b.push(Key::Frame(f), f, l.frame.size as usize);
        }
        if let Some(e) = tc.entries {
            let lo = e.saturating_sub(ENTRY_WINDOW);
            let end = e.saturating_add(l.frame.size);
            b.push(Key::Entries(e), lo, (end - lo) as usize);
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

    /// The sample under way has time and syscalls left ([`MAX_SAMPLE_TIME`],
    /// [`MAX_SAMPLE_SYSCALLS`]): checked before each read beyond the first of a thread, and
    /// before each thread and each load of code objects.
    fn check_budget(&self) -> Result<(), UnwindError> {
        let reads = self
            .mem
            .stats()
            .reads()
            .saturating_sub(self.syscalls_before);
        if reads > MAX_SAMPLE_SYSCALLS {
            return Err(UnwindError::Budget("reads in one sample"));
        }
        // The batch and one read more are the steady state: the clock is read past them only,
        // and the time counts from then.
        if reads <= 2 {
            return Ok(());
        }
        let started = self.sample_started.get().unwrap_or_else(Instant::now);
        self.sample_started.set(Some(started));
        if started.elapsed() > MAX_SAMPLE_TIME {
            return Err(UnwindError::Budget("time for one sample"));
        }
        Ok(())
    }

    fn word(&self, b: &ReadPlan, addr: u64) -> Result<u64, UnwindError> {
        Ok(Bytes(&self.bytes(b, Key::Word(addr), addr, 8)?).u64(0)?)
    }

    fn sample_with(&mut self, b: &mut ReadPlan) -> Result<(), UnwindError> {
        self.predict(b);
        b.fetch(&self.mem);
        self.sample_bytes = b.buf.len();
        self.out.clear();
        self.raws.clear();
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        let r = self.collect(b, &mut work).and_then(|gen| {
            self.resolve_codes(b, gen)?;
            self.finish(&mut work)
        });
        self.work = work;
        self.load_callee_codes();
        r
    }

    /// Reads interpreters and threads, and walks every thread's frames.
    fn collect(&mut self, b: &ReadPlan, work: &mut Vec<Work>) -> Result<u64, UnwindError> {
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
        let mut seen_tstates = std::mem::take(&mut self.spare.seen_tstates);
        seen_tstates.clear();
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
            while ta != 0 {
                if tstates.len() >= MAX_THREADS {
                    return Err(UnwindError::TooLong("thread lists", MAX_THREADS));
                }
                // A thread state met twice (in one list or two interpreters') is a cycle.
                if !seen_tstates.insert(ta) {
                    return Err(UnwindError::Cycle("thread list"));
                }
                // Thread states outside the batch are read one by one.
                if tstates.len() % 64 == 63 {
                    self.check_budget()?;
                }
                let (ts, next) = self.tstate(b, ta, interp_id, tstates.len(), true)?;
                tstates.push(ts);
                ta = next;
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
            self.check_budget()?;
            let (ts, tail) = match self.walk_consistent(b, ts) {
                Ok(done) => done,
                Err((addr, e)) => {
                    // What this thread's cache predicted may be what misled the walk: it
                    // starts afresh, unless the walk only lacked bytes (the cache then
                    // knows where they are). The other threads' caches stay (a torn read
                    // of one thread says nothing about the others, and re-learning every
                    // thread of a busy process costs a syscall each).
                    if !matches!(e, UnwindError::Moved(_)) {
                        self.threads.remove(&addr);
                    }
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
        self.spare.seen_tstates = seen_tstates;
        self.spare.holders = holders;
        Ok(generation)
    }

    /// Parses the thread state at `ta` from `b` (reading what `b` lacks); returns it and the
    /// next thread state's address. `may_keep`: the thread's last stack may be kept.
    fn tstate(
        &mut self,
        b: &ReadPlan,
        ta: u64,
        interp_id: i64,
        order: usize,
        may_keep: bool,
    ) -> Result<(Tstate, u64), UnwindError> {
        let l = &self.layout;
        let tb = self.bytes(b, Key::Tstate(ta), ta, l.tstate.size as usize)?;
        let t = Bytes(&tb);
        let mut top_unread = false;
        // A thread that has not run keeps its stack if its state agrees.
        let kept = self
            .threads
            .get(&ta)
            .filter(|tc| may_keep && self.keeps(tc))
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
                        let at = cf.wrapping_add(current_frame);
                        let tc = self.threads.entry(ta).or_default();
                        tc.cframe = cf;
                        // The thread's C frames of late, newest first (a generator's eval loop
                        // comes and goes: its C frame and its caller's take turns).
                        if cf != 0 && tc.cframes.first() != Some(&cf) {
                            tc.cframes.retain(|&c| c != cf);
                            tc.cframes.truncate(MAX_CFRAMES - 1);
                            tc.cframes.insert(0, cf);
                        }
                        // 3.12: an eval loop's C frame and its entry frame are locals of one
                        // C function, so the C stack read around the innermost entry frame
                        // mostly holds the word too (read after the frames: the frames then
                        // tell whether the top moved, see `settle_top`).
                        let near_entry = || {
                            let e = tc.entries?;
                            let (pos, len) = b.locate(Key::Entries(e))?;
                            let off = at.checked_sub(e.saturating_sub(ENTRY_WINDOW))? as usize;
                            (off.checked_add(8)? <= len).then_some(())?;
                            b.buf.get(pos + off..pos + off + 8)
                        };
                        match b.get(Key::Word(at)) {
                            _ if cf == 0 => 0,
                            Some(w) => Bytes(w).u64(0)?,
                            None => match near_entry().and_then(|w| Bytes(w).u64(0).ok()) {
                                Some(w) if w != 0 => w,
                                // A C frame the prediction did not know: read later, its
                                // pointer could be anything (the C frame may be gone). The
                                // thread is read again with it.
                                _ => {
                                    top_unread = true;
                                    0
                                }
                            },
                        }
                    }
                }
            }
        };
        let l = &self.layout;
        let native_thread_id = t.u64(l.tstate.native_thread_id)?;
        let host_tid = self.tids.host(native_thread_id).unwrap_or(0);
        let ts = Tstate {
            addr: ta,
            order,
            interp_id,
            thread_id: t.u64(l.tstate.thread_id)?,
            native_thread_id,
            host_tid,
            keep: !top_unread
                && kept.is_some_and(|(_, top, tid)| top == current_frame && tid == host_tid),
            current_frame,
            top_unread,
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
        };
        Ok((ts, t.u64(l.tstate.next)?))
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

    /// Walks one thread's frames from one read of it: first the sample's batch; when the
    /// stack is not all in it (it moved since the prediction) or does not hold together (it
    /// moved during the read), the thread's state and every range its stack needs are read
    /// again at once, in one syscall, at most [`MAX_READS`] times in all. Returns the thread
    /// state the stack was read with.
    fn walk_consistent(
        &mut self,
        b: &ReadPlan,
        mut ts: Tstate,
    ) -> Result<(Tstate, Option<usize>), (u64, UnwindError)> {
        let start = self.raws.len();
        let mut own: Option<ReadPlan> = None;
        let mut reads = 1;
        loop {
            // Without the pointer to the top (3.11/3.12: its C frame was not read), the
            // frames read may still tell the top (see `settle_top`); not on 3.11, where a
            // frame that resumed a generator (from C) runs, while the generator's frame, the
            // top, lives outside the chunk.
            let walked = match ts.top_unread && self.layout.frame.is_entry.is_some() {
                true => Err(UnwindError::Moved("the current frame's C frame")),
                false => self.walk(own.as_ref().unwrap_or(b), &ts),
            };
            let err = match walked {
                Ok((tail, top)) => {
                    if let Some(mut o) = own {
                        o.clear();
                        self.spare.reread = o;
                    }
                    ts.current_frame = top;
                    return Ok((ts, tail));
                }
                Err(e) => e,
            };
            self.raws.truncate(start);
            if reads >= MAX_READS || err.is_process_gone() {
                return Err((ts.addr, err));
            }
            reads += 1;
            self.stats.rereads += 1;
            let addr = ts.addr;
            if !matches!(err, UnwindError::Moved(_)) {
                // Read, but not whole: the cache's prediction (marker, regions) may be what
                // misled it. Next read: the whole used stack.
                // (A chunk that cannot be read was freed meanwhile: the next read of the
                // thread state names the current one.)
                if let Some(tc) = self.threads.get_mut(&addr) {
                    tc.marker = None;
                    tc.chunk = 0;
                    tc.regions.clear();
                }
                if self.chunks(&ts).is_ok() {
                    if let Some(tc) = self.threads.get_mut(&addr) {
                        let lo = ts.chunk.saturating_add(CHUNK_DATA);
                        let hi = tc.chunk_end;
                        if hi > lo {
                            tc.regions.push((lo.max(hi.saturating_sub(MAX_REGION)), hi));
                        }
                        let older = std::mem::take(&mut tc.older);
                        tc.regions.extend(older.iter().filter(|(s, e)| e > s));
                        tc.older = older;
                    }
                }
            }
            let mut o = own
                .take()
                .unwrap_or_else(|| std::mem::take(&mut self.spare.reread));
            o.clear();
            if let Some(tc) = self.threads.get(&addr) {
                self.predict_thread(&mut o, addr, tc, false);
            } else {
                self.predict_thread(&mut o, addr, &ThreadCache::default(), false);
            }
            if let Err(e) = self.check_budget() {
                return Err((addr, e));
            }
            // Checked before reading: what this read would add (merged ranges cost no more).
            let planned: usize = o.ranges.iter().map(|r| r.1).sum();
            self.sample_bytes = self.sample_bytes.saturating_add(planned);
            if self.sample_bytes > MAX_SAMPLE_BYTES {
                return Err((addr, UnwindError::Budget("bytes read in one sample")));
            }
            o.fetch(&self.mem);
            let (interp_id, order, holds_gil) = (ts.interp_id, ts.order, ts.holds_gil);
            ts = match self.tstate(&o, addr, interp_id, order, false) {
                Ok((t, _)) => Tstate { holds_gil, ..t },
                Err(e) => return Err((addr, e)),
            };
            own = Some(o);
        }
    }

    /// Walks one thread's frames into `self.raws`; returns the cached chain index from which
    /// the rest of the stack is unchanged (3.15 marker), if any, and the top frame walked
    /// from (see [`settle_top`]).
    fn walk(&mut self, b: &ReadPlan, ts: &Tstate) -> Result<(Option<usize>, u64), UnwindError> {
        self.chunks(ts)?;
        let f = self.layout.frame.clone();
        let fsize = f.size as usize;
        let tc = self.threads.entry(ts.addr).or_default();
        tc.seen = self.epoch;
        let last_top = tc.last_top;
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
        for &(s, e) in &tc.regions {
            let m = top_split(s, e, tc.last_top);
            if let Some((pos, len)) = b.locate(Key::Region(s)) {
                held.push((s, pos, len));
            }
            if let Some(m) = m {
                if let Some((pos, len)) = b.locate(Key::RegionTop(m)) {
                    held.push((m, pos, len));
                }
            }
        }
        if let Some(e) = tc.entries {
            if let Some((pos, len)) = b.locate(Key::Entries(e)) {
                held.push((e.saturating_sub(ENTRY_WINDOW), pos, len));
            }
        }
        let mut older_loaded = false;
        let mut frame_buf = [0u8; 256];
        let batch_buf = &b.buf;
        let find = |held: &[(u64, usize, usize)], a: u64, out: &mut [u8]| {
            held.iter()
                .filter_map(|&(s, pos, len)| Some((s, batch_buf.get(pos..pos + len)?)))
                .find_map(|(s, v)| {
                    let off = a.checked_sub(s)? as usize;
                    v.get(off..off.checked_add(out.len())?)
                })
                .map(|v| out.copy_from_slice(v))
                .is_some()
        };
        // What `b` lacked of the data stack: the walk stops there, and the thread is read
        // again whole, in one read (by `walk_consistent`); bytes read on their own later would
        // splice two instants. Frames outside the data stack (a generator's, an entry frame on
        // the C stack) are prefetched where the last reads found them, else read on their own:
        // they change only when their generator or C call ends, and a chain through a stale
        // one does not hold together.
        let mut missing = Missing::default();

        // The top as of the read of the frames, not of the pointer to it (read at another time).
        let mut addr = ts.current_frame;
        let unread = ts.top_unread;
        // A paused thread's pointer is its top: nothing moved after it was read.
        let stopped = self.pauser.is_some() || self.opts.target_stopped;
        let settles = unread || !stopped;
        let mut unknown_callee = None;
        if settles {
            let adaptive = self.layout.code.code_adaptive;
            let codes = &self.codes;
            let header = |a: u64| {
                let mut buf = [0u8; 256];
                let out = buf.get_mut(..fsize)?;
                if !find(&held, a, out) {
                    out.copy_from_slice(b.get(Key::Frame(a))?.get(..fsize)?);
                }
                let mut h = FrameHeader::parse(&f, a, out)?;
                // A frame without locals has its stack pointer there while it waits on its
                // callee with an empty stack too.
                let known = codes.peek(&h.code);
                if h.emptied && h.code != 0 && known.is_some_and(|e| !e.info.has_locals) {
                    h.running = true;
                }
                // 3.14+ tell live frames by a code object that is set, which leftovers of
                // older, larger frames (whatever values they held) mostly have too: a frame
                // that names none of the chunk (an entry frame's callee) is believed live
                // only with a code object already known.
                if matches!(f.liveness, Liveness::ClearedCode(_))
                    && !in_chunk(h.previous)
                    && known.is_none()
                {
                    h.running = false;
                }
                Some(h)
            };
            let size_of = |h: &FrameHeader| {
                let e = codes.peek(&h.code)?;
                let size = u64::from(e.info.frame_bytes);
                (size > 0).then(|| (size, e.info.resumed(h.code, adaptive, h.instr)))
            };
            // Whether a pointer not in the cache is a code object's (one read; `true` when the
            // code type is not known).
            let (mem, code_type) = (&self.mem, self.code_type);
            let is_code = |c: u64| match code_type {
                Some(ty) => mem.read_u64(c.wrapping_add(8)).is_ok_and(|t| t == ty),
                None => true,
            };
            // A pointer to an entry frame on the C stack (3.12+): the C call's Python callee
            // returned, and the eval loop is about to leave, or left already and its C stack
            // was reused (the frame's owner overwritten: not a frame of this thread's data
            // stack, nor a generator's or a frame object's). Either way the thread runs, or
            // will, in the entry frame's caller: the top is settled from there.
            let in_older = |a: u64| older.iter().any(|&(s, e)| a >= s && a < e);
            if !unread && addr != 0 && !in_chunk(addr) {
                if let Some(h) = header(addr).filter(|h| {
                    h.shim || (h.owner == OWNED_BY_THREAD && !in_older(addr) && h.previous != 0)
                }) {
                    if in_chunk(h.previous) {
                        addr = h.previous;
                    }
                }
            }
            if in_chunk(addr) || unread {
                // Without the pointer (its C frame unread), every frame of the last sample.
                let below = |a: u64| a < addr || unread;
                let anchors = chain
                    .iter()
                    .map(|c| c.addr)
                    .filter(|&a| below(a) && in_chunk(a));
                addr = settle_top(addr, anchors, header, size_of, is_code, in_chunk, in_older);
                // A frame after the top that names it, with a code object not known yet,
                // stopped the search there (its size is unknown): its code object is loaded
                // after the sample, so that the next reads look past it.
                unknown_callee = header(addr)
                    .and_then(|h| size_of(&h))
                    .map(|(size, _)| addr.wrapping_add(size))
                    .filter(|&c| in_chunk(c))
                    .and_then(&header)
                    .filter(|c| c.previous == addr && c.code != 0 && !c.shim)
                    .map(|c| c.code)
                    .filter(|c| codes.peek(c).is_none());
            }
        }
        if let Some(code) = unknown_callee.filter(|c| {
            !self.not_code.contains(c)
                && !self.callee_codes.contains(c)
                && self.callee_codes.len() < MAX_CALLEE_CODES
        }) {
            self.callee_codes.push(code);
        }
        let top = addr;
        let mut tail = None;
        let mut depth = 0usize;
        // Frames outside the data stack this walk meets, newest first; the thread's list keeps
        // those of earlier reads too (an entry frame on the C stack comes back at the same
        // address whenever C calls into Python at the same depth).
        let mut recent = std::mem::take(&mut tc.outside);
        let mut entries: Option<u64> = None;
        let mut outside = std::mem::take(&mut self.spare.outside);
        outside.clear();
        let walked_from = self.raws.len();
        let mut outside_frames = 0usize;
        // Frames of the current chunk come lower and lower down the stack.
        let mut last_in_chunk = u64::MAX;
        while addr != 0 {
            if in_chunk(addr) {
                if addr >= last_in_chunk {
                    return Err(UnwindError::Cycle("frame chain"));
                }
                last_in_chunk = addr;
            }
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(UnwindError::TooLong("frame chain", MAX_DEPTH));
            }
            if self.raws.len() >= MAX_SAMPLE_FRAMES {
                return Err(UnwindError::Budget("frames in one sample"));
            }
            let out = frame_buf
                .get_mut(..fsize)
                .ok_or(UnwindError::TooLong("frame header", 256))?;
            let mut local = find(&held, addr, out);
            if !local && in_chunk(addr) {
                // Everything needed from the current chunk: down to the marker when it is
                // valid, else the whole used part (bounded), up to the top frame.
                let top = if in_chunk(ts.current_frame) {
                    ts.current_frame.max(addr)
                } else {
                    addr
                };
                let end = top + fsize as u64;
                let low = match valid {
                    Some(i) if in_chunk(chain[i].addr) && chain[i].addr <= addr => chain[i].addr,
                    _ => chunk_lo.max(end.saturating_sub(MAX_REGION)),
                };
                missing.chunk = Some((low, end));
                break;
            }
            if !local && !older_loaded && older.iter().any(|&(s, e)| addr >= s && addr < e) {
                // A deep stack continues in older chunks: their used parts, at once.
                older_loaded = true;
                for &(s, e) in &older {
                    // Prefetched whole, or in its two parts (see `top_split`).
                    let whole = |k: Key, len: u64| b.locate(k).filter(|&(_, l)| l as u64 == len);
                    let parts = match top_split(s, e, last_top) {
                        Some(m) => whole(Key::Region(s), m + TOP_OVERLAP - s)
                            .zip(whole(Key::RegionTop(m), e - m))
                            .map(|(lo, hi)| [(s, lo), (m, hi)]),
                        None => whole(Key::Region(s), e - s).map(|lo| [(s, lo), (s, lo)]),
                    };
                    if let Some(parts) = parts {
                        held.extend(parts.iter().map(|&(a, (pos, len))| (a, pos, len)));
                        continue;
                    }
                    missing.older = true;
                }
                if missing.older {
                    break;
                }
                local = find(&held, addr, out);
            }
            let bytes: Cow<'_, [u8]> = match local {
                true => Cow::Borrowed(&*out),
                false => {
                    if outside.len() < MAX_OUTSIDE {
                        outside.push(addr);
                    }
                    outside_frames += 1;
                    if outside_frames > MAX_OUTSIDE_FRAMES {
                        return Err(UnwindError::Budget("frames outside the data stack"));
                    }
                    self.bytes(b, Key::Frame(addr), addr, fsize)?
                }
            };
            let fb = Bytes(&bytes);
            let previous = fb.u64(f.previous)?;
            let owner = fb.u8(f.owner)?;
            // The entry frame of a C call into Python lives on the C stack, read at another
            // time than the data stack: when it no longer names the frame the callee was pushed
            // after (the C call returned, its stack was reused), that frame is the caller.
            let from = self.raws[walked_from..].last().map(|r| r.addr);
            // A thread's frames lie back to back in its chunk: a caller that does not end
            // where its callee begins was pushed after the callee was read (the callee and its
            // caller returned meanwhile). Their chain would splice two instants.
            if let Some(x) = from.filter(|&x| in_chunk(x) && in_chunk(addr)) {
                let code = fb.u64(f.code)? & !f.code_tag_mask;
                let size = match f.shim_owners.contains(&owner) {
                    true => None,
                    false => self
                        .codes
                        .peek(&code)
                        .map(|e| u64::from(e.info.frame_bytes)),
                };
                if size.is_some_and(|size| size > 0 && addr.wrapping_add(size) != x) {
                    // Either the stack changed or the cached size is wrong (its code object
                    // was read torn): the entry is loaded again when next needed.
                    if let Some(e) = self.codes.pop(&code) {
                        self.code_bytes = self.code_bytes.saturating_sub(entry_bytes(&e));
                    }
                    return Err(UnwindError::BadObject {
                        addr: x,
                        what: "a frame whose caller does not end where it begins (read while \
                               it changed)"
                            .into(),
                    });
                }
            }
            if let Some(x) = from.filter(|&x| in_chunk(x) && !in_chunk(addr)) {
                let header = |a: u64| {
                    let mut buf = [0u8; 256];
                    let out = buf.get_mut(..fsize)?;
                    find(&held, a, out).then(|| FrameHeader::parse(&f, a, out))?
                };
                let adjacent = |a: u64| {
                    header(a).is_some_and(|h| {
                        !h.shim
                            && self.codes.peek(&h.code).is_some_and(|e| {
                                e.info.frame_bytes > 0
                                    && a.wrapping_add(u64::from(e.info.frame_bytes)) == x
                            })
                    })
                };
                let fits = match f.shim_owners.contains(&owner) {
                    // A generator's or coroutine's frame (they live outside), a frame
                    // object's, or a thread's in an older chunk: a thread's frame elsewhere
                    // is the stale C stack of a call that returned.
                    false => match owner {
                        OWNED_BY_GENERATOR | OWNED_BY_FRAME_OBJECT => true,
                        OWNED_BY_THREAD => older.iter().any(|&(s, e)| addr >= s && addr < e),
                        _ => false,
                    },
                    true => {
                        previous != addr
                            && match in_chunk(previous) {
                                // The thread's outermost entry frame.
                                _ if previous == 0 => true,
                                true => adjacent(previous),
                                // A generator's frame (it called into C): when prefetched, it
                                // must be one; else the walk reads it next (no read of its own
                                // here: this runs every sample).
                                false => b.get(Key::Frame(previous)).is_none_or(|g| {
                                    Bytes(g).u8(f.owner).ok() == Some(OWNED_BY_GENERATOR)
                                }),
                            }
                    }
                };
                if !fits {
                    let last = chain.iter().map(|c| c.addr).filter(|&a| a < x);
                    let below = caller_below(x, last, in_chunk, adjacent);
                    if let Some(y) = below {
                        // The stale entry frame is left out: what it says is another call's.
                        addr = y;
                        continue;
                    }
                }
            }
            // An entry frame outside the data stack and the thread state (3.15's base frame
            // lives there) is on the C stack.
            if f.shim_owners.contains(&owner)
                && !in_chunk(addr)
                && addr.wrapping_sub(ts.addr) >= self.layout.tstate.size
            {
                entries = Some(entries.map_or(addr, |e: u64| e.min(addr)));
            }
            let raw = RawFrame {
                addr,
                code: fb.u64(f.code)? & !f.code_tag_mask,
                previous,
                instr: fb.u64(f.instr)?,
                shim: f.shim_owners.contains(&owner),
                generator: owner == OWNED_BY_GENERATOR,
                entry: match f.is_entry {
                    Some(off) => fb.u8(off)? != 0,
                    None => false,
                },
            };
            // A frame of a Python function without its code object returned (3.14+ clear it)
            // after the pointer to it was read: leaving it out would count its caller for it
            // (and only calls that end, never calls that begin, are seen that way).
            if raw.code == 0 && !raw.shim {
                return Err(UnwindError::BadObject {
                    addr,
                    what: "a frame that returned (read while it changed)".into(),
                });
            }
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
        // The pointer to the top was not read and the frames did not tell the top.
        let no_top = unread && top == 0;
        if missing.any() || no_top {
            // Read this thread again, whole, in one read: what the cache predicted and what
            // this walk lacked (the top with room to move).
            self.raws.truncate(walked_from);
            let tc = self.threads.entry(ts.addr).or_default();
            if let Some((low, end)) = missing.chunk {
                let end = end.saturating_add(REREAD_GROWTH).min(chunk_hi);
                tc.regions.retain(|&(s, e)| e <= low || s >= end);
                tc.regions.push((low, end));
            }
            if missing.older {
                tc.regions.extend(older.iter().filter(|(s, e)| e > s));
            }
            tc.chain = chain;
            tc.older = older;
            remember(&mut outside, &mut recent);
            tc.outside = recent;
            self.spare.outside = outside;
            tc.entries = entries.or(tc.entries);
            self.spare.held = held;
            return Err(UnwindError::Moved(match no_top {
                true => "the current frame's C frame",
                false => "frames outside the read",
            }));
        }
        // From 3.12 every entry into the interpreter pushes a C-stack shim frame, so a thread's
        // chain always ends in a shim. One that ends in a Python frame was read torn (a
        // generator's frame suspended, a frame being pushed, between reading the thread state
        // and the frame): reporting it would count a truncated stack.
        // On 3.11 the outermost frame is the first one its eval loop ran (`is_entry`), and not
        // a generator's (a generator's frame loses its `previous` when it yields: read then,
        // its chain ends there).
        if tail.is_none() && (!f.shim_owners.is_empty() || f.is_entry.is_some()) {
            if let Some(last) = self.raws[walked_from..]
                .last()
                .filter(|r| !r.shim && (!r.entry || r.generator))
            {
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
        remember(&mut outside, &mut recent);
        tc.outside = recent;
        self.spare.outside = outside;
        tc.entries = entries;
        self.spare.held = held;
        Ok((tail, top))
    }

    /// Makes sure every code object walked this sample is cached and valid: one batch of
    /// validations, one batch of loads.
    fn resolve_codes(&mut self, b: &ReadPlan, generation: u64) -> Result<(), UnwindError> {
        self.codes_changed = false;
        let use_generation = self.layout.interp.code_object_generation.is_some();
        let stamp = if use_generation {
            generation
        } else {
            self.epoch
        };
        let (fp_lo, fp_len) = fingerprint_span(&self.layout);

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
                    if let Some(e) = self.codes.pop(&a) {
                        self.code_bytes = self.code_bytes.saturating_sub(entry_bytes(&e));
                    }
                    load.push(a);
                }
            }
            self.spare.fingerprints = buf;
        }
        self.stats.code_cache_misses += load.len() as u64;
        // Past the per-sample bound, the first ones are loaded and the sample fails: the
        // next samples load the rest.
        let over = load.len() > MAX_CODES_PER_SAMPLE;
        load.truncate(MAX_CODES_PER_SAMPLE);
        if !load.is_empty() {
            self.check_budget()?;
            let entries = self.read_code_entries(&load, stamp)?;
            for (&a, entry) in load.iter().zip(entries) {
                // Every frame but the interpreter's shims runs a code object: one that does
                // not was read while it changed (its bytes are another frame's, or none), and
                // the sample is read again or fails; it is never shortened.
                self.cache_code(a, entry?);
            }
        }
        self.spare.codes = std::mem::replace(&mut self.prev_codes, distinct);
        self.spare.check = check;
        self.spare.load = load;
        match over {
            true => Err(UnwindError::Budget("new code objects in one sample")),
            false => Ok(()),
        }
    }

    /// Reads code objects (what a stack needs of them, and their fingerprints) into cache
    /// entries valid at `stamp`: one per address, or why it is no code object.
    fn read_code_entries(
        &mut self,
        addrs: &[u64],
        stamp: u64,
    ) -> Result<Vec<Result<CodeEntry, UnwindError>>, UnwindError> {
        let codes = read_codes(&self.mem, &self.layout, self.code_type, addrs)?;
        Ok(codes
            .into_iter()
            .map(|code| {
                let LoadedCode { info, fingerprint } = code?;
                let info = Arc::new(info);
                Ok(CodeEntry {
                    function: self.table.function(&info),
                    info,
                    fingerprint,
                    valid_at: stamp,
                })
            })
            .collect())
    }

    /// Loads, best effort, the code objects of frames that stopped the search for a top
    /// (their size was unknown, see `walk`); what is no code object is remembered as such.
    fn load_callee_codes(&mut self) {
        let mut pending = std::mem::take(&mut self.callee_codes);
        pending.retain(|c| self.codes.peek(c).is_none());
        if pending.is_empty() {
            self.callee_codes = pending;
            return;
        }
        // Stamped 0: validated as any cached one before its first use in a stack.
        let entries: Vec<Option<_>> = match self.read_code_entries(&pending, 0) {
            Ok(entries) => entries.into_iter().map(Some).collect(),
            Err(_) => pending.iter().map(|_| None).collect(),
        };
        for (&a, entry) in pending.iter().zip(entries) {
            match entry {
                Some(Ok(entry)) => self.cache_code(a, entry),
                _ => {
                    if self.not_code.len() >= MAX_NOT_CODE {
                        self.not_code.remove(0);
                    }
                    self.not_code.push(a);
                }
            }
        }
        pending.clear();
        self.callee_codes = pending;
    }

    /// Drops every cached code object (and what was found to be none), with the threads'
    /// caches that refer to them.
    fn forget_codes(&mut self) {
        self.codes.clear();
        self.code_bytes = 0;
        self.prev_codes.clear();
        self.not_code.clear();
        self.threads.clear();
    }

    /// Caches a code object, the least recently used ones leaving first when the cache would
    /// hold more than [`MAX_CODE_CACHE_BYTES`] (or its entry count).
    fn cache_code(&mut self, addr: u64, entry: CodeEntry) {
        let size = entry_bytes(&entry);
        while self.code_bytes + size > MAX_CODE_CACHE_BYTES {
            match self.codes.pop_lru() {
                Some((_, old)) => {
                    self.code_bytes = self.code_bytes.saturating_sub(entry_bytes(&old))
                }
                None => break,
            }
        }
        self.code_bytes += size;
        if let Some((_, old)) = self.codes.push(addr, entry) {
            self.code_bytes = self.code_bytes.saturating_sub(entry_bytes(&old));
        }
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
            for (i, r) in raws[..top].iter().enumerate() {
                let id = if r.shim || r.code == 0 {
                    None
                } else if let Some(e) = self.codes.get(&r.code) {
                    // Pushed but not started (the interpreter's own shims are such frames,
                    // under the frame they run). Not the top frame: it runs, and the
                    // interpreter stores its instruction pointer only now and then.
                    if i > 0 && !r.generator && !e.info.started(r.code, adaptive, r.instr) {
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
            // Bytes read above the top for its next move (not the stack's own weight).
            let mut room = 0;
            if let Some(a) = anchor {
                let base = tc.chain[a].addr;
                let still = tc.last_top == top;
                room = if still { 0 } else { GROWTH };
                let growth = if still {
                    STILL_ROOM
                } else {
                    // The stack moves: room for its next top, read first (see `top_split`),
                    // so that a deeper top is in the first read.
                    GROWTH
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
                    let outermost_near = tc.chain[a..]
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| in_chunk(c.addr))
                        .take_while(|(_, c)| c.addr <= base && base - c.addr <= MARKER_SPAN)
                        .map(|(j, _)| a + j)
                        .last();
                    let j = if still {
                        Some(a)
                    } else if kept.is_some() {
                        kept
                    } else {
                        outermost_near
                    };
                    if let (Some(j), Some((m_now, seq_now))) = (j, w.ts.marker) {
                        let m = tc.chain[j].addr;
                        if m != m_now {
                            if let Some((off, _)) = self.layout.tstate.frame_marker {
                                // The thread state was read whole at `addr`, so this is in it.
                                // Written only while the field still holds what this sample
                                // read: a thread state freed since (its memory reused) is
                                // left alone.
                                // A write that fails costs the next sample a longer walk only.
                                let at = w.ts.addr.wrapping_add(off);
                                match self.mem.write_if(at, m_now, m) {
                                    Ok(true) => self.stats.marker_writes += 1,
                                    Ok(false) => {}
                                    Err(e) if e.is_process_gone() => return Err(e.into()),
                                    Err(_) => {}
                                }
                            }
                        }
                        tc.marker = Some((m, seq_now, j));
                        // From the outermost frame near the anchor whatever the marker: a top
                        // that looked still may have returned and been called again in
                        // between (a loop's call), taking the marker down with it to frames
                        // a read from the anchor alone would lack.
                        let low = outermost_near.map_or(base, |o| tc.chain[o].addr);
                        tc.regions.push((m.min(base).min(low), end));
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
            tc.heavy = heavy(&tc.regions, &tc.outside, w.raw.len(), room);
            tc.quiet = tc.last_top == top;
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

/// `FRAME_OWNED_BY_THREAD` and `FRAME_OWNED_BY_FRAME_OBJECT` on every supported version (a
/// thread's frame lives in its data stack, a frame object's in the object).
const OWNED_BY_THREAD: u8 = 0;
const OWNED_BY_FRAME_OBJECT: u8 = 2;
/// How far below a frame its caller is looked for when the entry frame between them is stale.
const MAX_CALLER_SCAN: u64 = 4096;
/// Most frames [`settle_top`] moves the top by.
const MAX_SETTLE: usize = 32;

/// The fields of a frame's header that tell where it is in its thread's stack.
#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    code: u64,
    previous: u64,
    instr: u64,
    /// Whether the frame is live (see [`Liveness`]; 3.11-3.13: runs, a frame waiting on its
    /// callee does not).
    running: bool,
    /// 3.14+: its stack pointer is at its first local (being cleared, unless it has none).
    emptied: bool,
    /// 3.11-3.13: `running` tells a frame that runs from one that waits on a callee (3.14+:
    /// both are live).
    tells_waiting: bool,
    shim: bool,
    owner: u8,
    /// 3.11: the first frame its eval loop ran (a C call into Python, or a generator).
    entry: bool,
}

impl FrameHeader {
    fn parse(f: &super::layout::FrameLayout, addr: u64, bytes: &[u8]) -> Option<FrameHeader> {
        let b = Bytes(bytes);
        let owner = b.u8(f.owner).ok()?;
        let code = b.u64(f.code).ok()? & !f.code_tag_mask;
        let emptied = match f.liveness {
            Liveness::ClearedCode(off) => b.u64(off).ok()? == addr.wrapping_add(f.localsplus),
            _ => false,
        };
        Some(FrameHeader {
            code,
            previous: b.u64(f.previous).ok()?,
            instr: b.u64(f.instr).ok()?,
            running: match f.liveness {
                Liveness::RunningStacktop(off) => b.i32(off).ok()? == -1,
                Liveness::ClearedCode(_) => code != 0 && !emptied,
            },
            emptied,
            tells_waiting: matches!(f.liveness, Liveness::RunningStacktop(_)),
            shim: f.shim_owners.contains(&owner),
            owner,
            entry: match f.is_entry {
                Some(off) => b.u8(off).ok()? != 0,
                None => false,
            },
        })
    }
}

/// The thread's top frame at the time its data stack was read, from the top frame at the
/// time its thread state was read (`hint`, a microsecond or so later, or earlier when the
/// frames were read again; frames say whether they are live, see [`Liveness`]). A thread's
/// frames in one chunk lie back to back, each right after its caller, so the frames read say
/// by themselves how the stack differs from the hint's (below, "since" the hint: the rules
/// are the same when the hint is the newer read, a frame pushed since the frames were read
/// then looks returned and one returned since looks pushed). "Runs" below is
/// [`FrameHeader::running`]: on 3.11-3.13 the frame the eval loop runs, on 3.14+ any live
/// frame.
///
/// - It grew: the frames after the hint (each `size_of` its caller further on) have started and
///   name the one before as their caller, or a frame outside the chunk (the entry frame of a C
///   call into Python, a generator's: read at other times, not followed here); the highest of
///   them that runs is the top. A frame that runs is live, and so is every frame below it in
///   the chunk (its callers).
/// - It shrank: the hint neither runs nor waits on a running callee (or lost its code object
///   when it returned, 3.14+), and the frame now at its caller's place runs: that frame (or
///   what it called since) is the top.
/// - The hint's bytes are another frame's now (a larger frame was pushed below it): the same
///   from the frames of the last sample below the hint (`anchors`, highest first), but only
///   when that proves the top: a running frame whose next frame was read and is no callee.
///
/// Only frames whose bytes were read and whose code objects are known are believed; whatever
/// does not hold together leaves the hint, which the walk then checks as before.
fn settle_top(
    hint: u64,
    anchors: impl Iterator<Item = u64> + Clone,
    header: impl Fn(u64) -> Option<FrameHeader>,
    size_of: impl Fn(&FrameHeader) -> Option<(u64, bool)>,
    is_code: impl Fn(u64) -> bool,
    in_chunk: impl Fn(u64) -> bool,
    in_older: impl Fn(u64) -> bool,
) -> u64 {
    // The top found up from a frame and whether it is proven, or None when the frame's bytes
    // are not a known frame's. `anchored`: `start` is a frame of the last sample, tried
    // because the hint's bytes are no frame's (its place was overwritten): a frame after
    // `start` that names a frame outside the chunk and has no code object is taken for such
    // leftovers too.
    let settle_from = |start: u64, anchored: bool| -> Option<(u64, bool)> {
        let first = header(start).filter(|h| !h.shim)?;
        size_of(&first)?;
        // The highest running frame up the chain of callees, and whether the frame after the
        // last of the chain was read and is no callee.
        let mut top = first.running.then_some(start);
        let mut looked = false;
        let (mut at, mut cur) = (start, first);
        for _ in 0..MAX_SETTLE {
            let Some((size, _)) = size_of(&cur) else {
                break;
            };
            let child = at.wrapping_add(size);
            let Some(c) = header(child).filter(|_| in_chunk(child)) else {
                break;
            };
            if c.shim || c.code == 0 {
                looked = true;
                break;
            }
            // Its caller: this frame (a call), or a frame elsewhere: the entry frame of a C
            // call into Python, a generator's (both read at other times than the chunk, so
            // not followed here). A frame right after this one that runs, or waits on one
            // that runs, was pushed on top of it: its way down leads here. One that names
            // another frame of the chunk is another frame's callee, which returned.
            if c.previous != at && in_chunk(c.previous) {
                looked = true;
                break;
            }
            if anchored && c.previous != at && size_of(&c).is_none() && !is_code(c.code) {
                looked = true;
                break;
            }
            // A frame that runs has no live callee of its own pushing: one that names it and
            // does not run returned (or is not yet its thread's current frame). But for a
            // callee of C code it called (3.11: such callees name it, and are entry frames),
            // which waits on a callee of its own as any frame does.
            if cur.running && c.previous == at && !c.running && !c.entry {
                looked = true;
                break;
            }
            // Its code object is new: what it calls, if anything, cannot be placed.
            let (known, resumed) = size_of(&c).map_or((false, true), |(_, r)| (true, r));
            // One that has not run past its `RESUME` is pushed but not yet its thread's
            // current frame, or a trampoline that waits on its own callee (the 3.13+ clean-up
            // frame of a class call, whose `__init__` runs on top of it): only what it calls
            // can be the top.
            if c.running && resumed {
                top = Some(child);
            }
            if !known {
                break;
            }
            at = child;
            cur = c;
        }
        Some(top.map_or((start, false), |t| (t, looked)))
    };
    // Down: a frame that does not run may have returned, with its callers: the top is found
    // from the first of them that proves it, short of a running one.
    let settle = |start: u64, anchored: bool| -> Option<(u64, bool)> {
        let mut first = settle_from(start, anchored);
        let mut at = start;
        for _ in 0..MAX_SETTLE {
            match settle_from(at, anchored) {
                Some((top, true)) => return Some((top, true)),
                Some((top, false)) if top != at => break,
                Some(_) => {}
                // A frame that returned and lost its code object (3.14+): its caller may run
                // again.
                None if header(at).is_some_and(|h| h.code == 0 && !h.shim) => {}
                None => break,
            }
            let Some(h) = header(at).filter(|h| !h.running) else {
                break;
            };
            at = match h.previous {
                p if in_chunk(p) && p < at => {
                    // Its caller's place holds another frame now (one that does not end where
                    // `at` begins): `at` returned with its caller, and that frame was pushed
                    // since. What `start` said is void: the top is found from that frame.
                    let size = header(p).and_then(|c| size_of(&c)).map(|(size, _)| size);
                    if size.is_some_and(|size| p.wrapping_add(size) != at) {
                        first = settle_from(p, anchored);
                    }
                    p
                }
                // Through a C call into Python only when the call's eval loop left `at`: it
                // went back to its entry frame (3.12/3.13: that frame runs; 3.14+: `at`, not
                // running, returned), or left it and its C stack was reused (the entry frame
                // is no frame now: not a shim, a generator's or one of an older chunk; the
                // caller is then the frame that ends where `at` begins).
                // A frame that does not run may still be live otherwise (in C code that
                // stored its stack pointer), and its C caller runs.
                // Called by a generator (its frame lives outside the chunk) read with the
                // chunk: when the generator runs (3.11-3.13), or lives while `at` lost its
                // code object or is being cleared (3.14+), `at` returned to it, and it is the
                // top.
                e => {
                    let gone_if_caller_runs = h.tells_waiting || h.code == 0 || h.emptied;
                    let caller = match header(e) {
                        Some(eh) if eh.shim => eh.running.then_some(eh.previous),
                        Some(eh)
                            if eh.owner == OWNED_BY_GENERATOR
                                && eh.running
                                && eh.code != 0
                                && gone_if_caller_runs =>
                        {
                            return Some((e, true));
                        }
                        Some(eh) if eh.owner == OWNED_BY_GENERATOR || in_older(e) => None,
                        Some(_) => caller_below(at, anchors.clone(), &in_chunk, |a| {
                            header(a)
                                .filter(|h| !h.shim)
                                .and_then(|h| size_of(&h))
                                .is_some_and(|(size, _)| a.wrapping_add(size) == at)
                        }),
                        None => None,
                    };
                    match caller {
                        Some(p) if in_chunk(p) && p < at => {
                            first = settle_from(p, anchored);
                            p
                        }
                        _ => break,
                    }
                }
            };
        }
        first.map(|(top, _)| (top, false))
    };
    // Bytes not read at all are read again by the walk, and a frame of a code object not yet
    // known is walked as it is; a hint of 0 (its C frame unread) tells nothing of what lies
    // above the anchors.
    if let Some((top, _)) = settle(hint, false) {
        return top;
    }
    let overwritten = hint != 0 && header(hint).is_some_and(|h| h.shim || !is_code(h.code));
    if hint != 0 && !overwritten {
        return hint;
    }
    anchors
        .clone()
        .take(4)
        .find_map(|a| settle(a, overwritten || hint == 0).filter(|&(_, proven)| proven))
        .map_or(hint, |(top, _)| top)
}

/// The frame of the chunk right before `callee` (it ends where `callee` begins, by `ends_at`):
/// among `known` frames (the last sample's), then word by word down to [`MAX_CALLER_SCAN`]
/// bytes below. Used when what links them (an entry frame on the C stack) is gone.
fn caller_below(
    callee: u64,
    known: impl Iterator<Item = u64>,
    in_chunk: impl Fn(u64) -> bool,
    ends_at: impl Fn(u64) -> bool,
) -> Option<u64> {
    known
        .chain((1..=MAX_CALLER_SCAN / 8).map(|k| callee.wrapping_sub(8 * k)))
        .find(|&a| in_chunk(a) && ends_at(a))
}

/// What a cached code object costs in memory (roughly: its strings and decoded line table).
fn entry_bytes(e: &CodeEntry) -> usize {
    let i = &e.info;
    std::mem::size_of::<CodeEntry>()
        + std::mem::size_of::<CodeInfo>()
        + i.name.len()
        + i.qualname.len()
        + i.filename.len()
        + i.lines.len() * std::mem::size_of::<crate::cpython::linetable::LineRange>()
}

/// Where a data-stack region is split so that its newest part (the frames just below the
/// last top, and the room above) is read first: the frames near the top change fastest, so
/// they are copied before anything else of the sample. The older part follows (it changes
/// only if the stack unwinds below it meanwhile). `None`: the last top is not in the region, or too near its start to matter.
fn top_split(start: u64, end: u64, last_top: u64) -> Option<u64> {
    let m = last_top.saturating_sub(TOP_BEHIND);
    (m > start.saturating_add(PAGE) && m < end).then_some(m)
}

/// The outside frames to prefetch next, into `recent` (the thread's own list, so that its
/// buffer stays with it): those just `found`, then up to [`MAX_RECENT_OUTSIDE`] of the
/// `recent` ones not among them, newest first. `found` is scratch.
fn remember(found: &mut Vec<u64>, recent: &mut Vec<u64>) {
    let limit = found.len() + MAX_RECENT_OUTSIDE;
    for &a in recent.iter() {
        if found.len() >= limit {
            break;
        }
        if !found.contains(&a) {
            found.push(a);
        }
    }
    recent.clear();
    recent.extend_from_slice(found);
}

/// Whether a thread whose next read is `regions` and frames at `outside`, after walking
/// `walked` frames (`room` bytes of the regions being room above the top), costs more to
/// read than a schedstat check (about 2 µs, two to three cold
/// iovecs): it spans more than two pages, or a page or more of bytes, or many frames to walk.
fn heavy(regions: &[(u64, u64)], outside: &[u64], walked: usize, room: u64) -> bool {
    let bytes: u64 = regions
        .iter()
        .map(|(s, e)| e.saturating_sub(*s))
        .sum::<u64>()
        .saturating_sub(room);
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

#[cfg(test)]
mod settle_tests {
    use super::*;

    const CHUNK: (u64, u64) = (0x1000, 0x2000);
    // Code objects and the bytes their frames take.
    const A: u64 = 0xa0;
    const B: u64 = 0xb0;
    const C: u64 = 0xc0;
    fn size(code: u64) -> Option<u64> {
        match code {
            A => Some(0x60),
            B => Some(0x80),
            C => Some(0x70),
            _ => None,
        }
    }
    /// The instruction pointer of a frame that has not run past its `RESUME`.
    const NOT_RESUMED: u64 = 1;
    fn frame(code: u64, previous: u64, running: bool) -> FrameHeader {
        FrameHeader {
            code,
            previous,
            instr: 0,
            running,
            emptied: false,
            tells_waiting: false,
            shim: false,
            owner: OWNED_BY_THREAD,
            entry: false,
        }
    }
    fn generator(code: u64, previous: u64, running: bool) -> FrameHeader {
        FrameHeader {
            owner: OWNED_BY_GENERATOR,
            ..frame(code, previous, running)
        }
    }

    #[test]
    fn a_callee_of_a_generator_that_runs_again_returned() {
        // A generator's frame (outside the chunk) called B and runs again: B returned.
        const G: u64 = 0x7fff_0000;
        // 3.14+: B lost its code object; the generator lives.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (G, generator(C, 0x1000, true)),
            (0x1060, frame(0, G, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), G);
        // 3.11-3.13: B does not run, the generator does.
        let waits = |h: FrameHeader| FrameHeader {
            tells_waiting: true,
            ..h
        };
        let frames = [
            (0x1000, waits(frame(A, 0, false))),
            (G, waits(generator(C, 0x1000, true))),
            (0x1060, waits(frame(B, G, false))),
        ];
        assert_eq!(settle(0x1060, &[], &frames), G);
        // 3.11-3.13: the generator waits (on B, which waits on its own callee): B stays.
        let frames = [
            (0x1000, waits(frame(A, 0, false))),
            (G, waits(generator(C, 0x1000, false))),
            (0x1060, waits(frame(B, G, false))),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // 3.14+: B is live (its code object known): the generator waits on it.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (G, generator(C, 0x1000, true)),
            (0x1060, frame(B, G, true)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // A generator whose frame was not read tells nothing.
        let frames = [(0x1000, frame(A, 0, true)), (0x1060, frame(0, G, false))];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
    }
    fn settle(hint: u64, anchors: &[u64], frames: &[(u64, FrameHeader)]) -> u64 {
        settle_top(
            hint,
            anchors.iter().copied(),
            |a| frames.iter().find(|(at, _)| *at == a).map(|(_, h)| *h),
            |h| size(h.code).map(|s| (s, h.instr != NOT_RESUMED)),
            |c| size(c).is_some(),
            |a| a >= CHUNK.0 && a < CHUNK.1,
            |_| false,
        )
    }

    #[test]
    fn the_top_moves_up_to_a_running_callee() {
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1000, true)),
            (0x10e0, frame(C, 0x1060, false)), // returned before
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1060);
        // Through an entry frame on the C stack (not followed).
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x7fff_0000, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1060);
    }

    #[test]
    fn a_cleared_hint_settles_to_its_live_caller() {
        // 3.14+: frames that returned lost their code objects (B called C; both returned).
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(0, 0x1000, false)),
            (0x10e0, frame(0, 0x1060, false)),
        ];
        assert_eq!(settle(0x10e0, &[], &frames), 0x1000);
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
        // A caller that names a frame above itself is no caller.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(0, 0x1100, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
    }

    #[test]
    fn a_callee_not_yet_resumed_is_passed_through_but_not_the_top() {
        let pushed = FrameHeader {
            instr: NOT_RESUMED,
            ..frame(B, 0x1000, true)
        };
        // Pushed, its arguments being bound: its caller is the top.
        let frames = [(0x1000, frame(A, 0, true)), (0x1060, pushed)];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // A trampoline (the clean-up frame of a class call) whose `__init__` runs on top.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, pushed),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x10e0);
    }

    #[test]
    fn a_callee_of_c_code_waits_on_its_own_callee() {
        // 3.11: A called C code that called B (an entry frame naming A); B waits on C, which
        // runs. A runs too (its eval loop is in the C call).
        let entry = |code, previous, running| FrameHeader {
            entry: true,
            ..frame(code, previous, running)
        };
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, entry(B, 0x1000, false)),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x10e0);
        // Not an entry frame: B returned, and what is above it is older still.
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
            (0x10e0, frame(C, 0x1060, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
    }

    #[test]
    fn a_callee_that_returned_is_not_the_top() {
        let frames = [
            (0x1000, frame(A, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // The hint itself returned: its caller runs again.
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
    }

    #[test]
    fn a_frame_in_the_place_of_the_hints_caller_is_found() {
        // The hint (B) returned, so did its caller; C now runs where its caller was (and has
        // no callee: nothing after it).
        let frames = [
            (0x1000, frame(C, 0, true)),
            (0x1060, frame(B, 0x1000, false)),
            (0x1070, frame(0, 0, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
        // The hint's bytes were overwritten: the last sample's frames prove the top.
        let frames = [
            (0x1000, frame(C, 0, true)),
            (0x1060, frame(0xdead, 0x5, false)),
            (0x1070, frame(0xbeef, 0x7fff_0000, true)),
        ];
        assert_eq!(settle(0x1060, &[0x1000], &frames), 0x1000);
    }

    #[test]
    fn a_hint_whose_callers_place_holds_another_frame_is_void() {
        // B returned, and so did its caller; C (called from C code: its caller is an entry
        // frame on the C stack) now runs where B's caller was, and ends below B.
        let frames = [
            (0x1000, frame(C, 0x7fff_0000, true)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1000);
    }

    #[test]
    fn a_returned_callee_of_a_c_call_gives_way_to_the_c_caller() {
        const ENTRY: u64 = 0x7fff_0000;
        let entry = |running: bool| FrameHeader {
            shim: true,
            owner: 3,
            ..frame(0x5, 0x1000, running)
        };
        // A called C code that called B; B returned, and the C call's eval loop went back to
        // its entry frame (which then runs).
        let with = |e: FrameHeader| {
            [
                (0x1000, frame(A, 0, true)),
                (0x1060, frame(B, ENTRY, false)),
                (ENTRY, e),
            ]
        };
        assert_eq!(settle(0x1060, &[], &with(entry(true))), 0x1000);
        // The entry frame does not run: B may still be live (in C code that stored its stack
        // pointer).
        assert_eq!(settle(0x1060, &[], &with(entry(false))), 0x1060);
        // The C call returned and its C stack was reused: the caller is the frame that ends
        // where B begins.
        let reused = frame(0x77, 0x4242, false);
        assert_eq!(settle(0x1060, &[], &with(reused)), 0x1000);
        // A generator's frame called B: it is not followed.
        let generator = FrameHeader {
            owner: OWNED_BY_GENERATOR,
            ..frame(C, 0, true)
        };
        assert_eq!(settle(0x1060, &[], &with(generator)), 0x1060);
    }

    #[test]
    fn what_does_not_hold_together_keeps_the_hint() {
        // Nothing runs: the hint stays (the walk checks it as before).
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1000, false)),
        ];
        assert_eq!(settle(0x1060, &[], &frames), 0x1060);
        // A frame after the hint that names another frame of the chunk is no callee.
        let frames = [
            (0x1000, frame(A, 0, false)),
            (0x1060, frame(B, 0x1800, true)),
        ];
        assert_eq!(settle(0x1000, &[], &frames), 0x1000);
        // Unknown bytes and no anchor that proves anything.
        assert_eq!(settle(0x1234, &[0x1000], &frames), 0x1234);
    }
}
