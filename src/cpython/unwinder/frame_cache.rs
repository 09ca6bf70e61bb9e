//! The frame cache: what the unwinder keeps of each thread between samples (its chain of
//! frames with their ids, where its stack lay, the 3.15 marker as left) and turning a walk
//! into an interned stack, reusing the frames that did not change.

use super::*;

/// The 3.15 marker goes on the outermost frame at most this many bytes below the top frame,
/// so that calls and returns near the top do not move it.
pub(super) const MARKER_SPAN: u64 = 2048;

/// Room prefetched above a moving top frame for calls made before the next sample (none
/// above a top frame that held still): a stack read whole in the first read is a sample of
/// one instant, one that must be read again is a sample of a later one.
pub(super) const GROWTH: u64 = 8192;

/// Room prefetched above a top frame that held still: enough to see the frame it calls next
/// (see [`settle_top`]).
pub(super) const STILL_ROOM: u64 = 1024;

/// Longest single region read (bytes); deeper stacks are read in several regions.
pub(super) const MAX_REGION: u64 = 1 << 20;

/// A frame of the previous sample's chain (shims included: the marker moves through them).
#[derive(Debug, Clone, Copy)]
pub(super) struct ChainFrame {
    pub(super) addr: u64,
    pub(super) code: u64,
    pub(super) previous: u64,
    pub(super) instr: u64,
    pub(super) id: Option<FrameId>,
}

/// What the unwinder remembers about one thread between samples.
#[derive(Default)]
pub(super) struct ThreadCache {
    pub(super) chain: Vec<ChainFrame>,
    /// The marker as we left it: (frame address, sequence, index in `chain`).
    pub(super) marker: Option<(u64, u64, usize)>,
    pub(super) chunk: u64,
    /// Used ranges of the current chunk's data area bound and of older chunks.
    pub(super) chunk_end: u64,
    pub(super) older: Vec<(u64, u64)>,
    pub(super) regions: Vec<(u64, u64)>,
    pub(super) outside: Vec<u64>,
    /// 3.11/3.12: where `tstate->cframe` pointed.
    pub(super) cframe: u64,
    /// The stretch of C stack (start, end) that held the C frames of its eval loops met so
    /// far, at most [`MAX_CSTACK_SPAN`] wide (see [`grow_cstack`]): it is prefetched whole, so
    /// that whichever eval loop runs at the read, its C frame is in the read.
    pub(super) cstack: Option<(u64, u64)>,
    /// Its top frame was where the read before left it: it is read with the other quiet
    /// threads' (its ranges merge with theirs), not in a group of its own.
    pub(super) quiet: bool,
    /// 3.12+: the innermost entry frame on the C stack the last read met (C calls into
    /// Python push one there): the C stack around it is prefetched, since the next ones
    /// come and go near it.
    pub(super) entries: Option<u64>,
    pub(super) seen: u64,
    /// The previous sample's top frame, walked frame ids, stack id and cached-tail length:
    /// when nothing above the marker changed, the stack id is reused without hashing.
    pub(super) last_top: u64,
    pub(super) last_walked: Vec<FrameId>,
    pub(super) last_stack: Option<StackId>,
    pub(super) last_tail_len: usize,
    /// The thread's native id and the epoch its stack was last read (for `skip_idle`), and
    /// how many samples in a row kept it since.
    pub(super) tid: i32,
    /// Where the kernel capture finds whether it holds the GIL.
    pub(super) gil: GilAt,
    /// Its interpreter's address, as its last read found it (0: none yet).
    pub(super) interp: u64,
    /// It waited for the GIL when last read (kept with its stack while it does not run).
    pub(super) waits_gil: bool,
    pub(super) read_at: u64,
    pub(super) kept: u32,
    /// Reading this thread costs more than checking whether it ran (see [`RunWatch::watch`]).
    pub(super) heavy: bool,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// The stack of a thread whose frames were walked this sample: frame ids for the walked
    /// frames (reusing last sample's for frames that did not change), the cached rest of the
    /// chain after the marker, one interned stack id (last sample's when nothing changed).
    pub(super) fn intern_stack(&mut self, w: &Work) -> StackId {
        let adaptive = self.layout.code.code_adaptive;
        let mut chain_new = std::mem::take(&mut self.spare.chain_new);
        chain_new.clear();
        self.spare.ids.clear();
        let raws = &self.spare.raws[w.raw.clone()];
        // Without the 3.15 marker every frame is walked, but the outer ones rarely change:
        // frames identical to last sample's from the bottom up (same address, code object,
        // caller and instruction) keep their frame ids, so only the top is resolved. Not
        // after a code object was found stale this sample (its function may differ).
        let common = match (w.tail, self.codes.changed) {
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
                self.spare.ids.push(id);
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
        let walked_ids = self.spare.ids.len();
        let stack = match w.tail {
            Some(i) => {
                let tail_len = tc.chain.len() - (i + 1);
                self.stats.frames_from_cache += tail_len as u64;
                if w.raw.len() == 1 && i == 0 {
                    self.stats.frame_cache_hits += 1;
                } else {
                    self.stats.frame_cache_partial_hits += 1;
                }
                let unchanged = tc.last_tail_len == tail_len && tc.last_walked == self.spare.ids;
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
                        self.spare.ids.extend(rest.iter().filter_map(|c| c.id));
                        tc.last_tail_len = tail_len;
                        self.table.stack(&self.spare.ids)
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
                        self.spare.ids.extend(rest.iter().filter_map(|c| c.id));
                        self.table.stack(&self.spare.ids)
                    }
                }
            }
            None => {
                self.stats.frame_cache_misses += 1;
                std::mem::swap(&mut tc.chain, &mut chain_new);
                tc.last_tail_len = usize::MAX;
                self.table.stack(&self.spare.ids)
            }
        };
        tc.last_walked.clear();
        tc.last_walked
            .extend_from_slice(&self.spare.ids[..walked_ids]);
        tc.last_stack = Some(stack);
        tc.tid = w.ts.host_tid;
        tc.gil = w.ts.gil;
        if w.ts.interp != 0 {
            tc.interp = w.ts.interp;
        }
        tc.read_at = self.epoch;
        tc.kept = 0;
        self.spare.chain_new = chain_new;
        stack
    }
}
