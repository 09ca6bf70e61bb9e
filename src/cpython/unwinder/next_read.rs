//! Planning the next read: where each thread's frames are expected (regions of its data
//! stack, frames outside it, C stack near its entry frames), which threads are kept without
//! a read, and where the 3.15 marker goes. A wrong plan costs reads, never a wrong stack.
//!
//! Idle threads (`skip_idle`, the default): a thread the kernel says has not run since it was
//! read keeps its last stack and nothing of it is read (only its thread state, for the
//! thread list); when no thread of the process ran, the whole last sample is kept. While
//! some thread of the process runs, only the threads that cost more to read than to check
//! (deep stacks, frames spread over several pages: [`heavy`]) are checked; the light ones
//! are read.
//!
//! With the 3.15 marker, the next read of a thread starts at its outermost frame near the top
//! whatever frame the marker is on: a loop's call that returns and is made again between two
//! samples leaves the top where it was but takes the marker down with it.

use super::*;

/// Bytes below the last top frame read first (see [`top_split`]), and how far the older part
/// reaches into them (at least a frame header).
pub(super) const TOP_BEHIND: u64 = 2048;

pub(super) const TOP_OVERLAP: u64 = 256;

/// 3.12+: bytes of C stack prefetched below a thread's innermost entry frame.
pub(super) const ENTRY_WINDOW: u64 = 8192;

/// 3.11/3.12: bytes of C stack prefetched below a thread's C-stack extent (see
/// [`ThreadCache::cstack`]), for an eval loop entered deeper than any met so far. Nothing is
/// read above it: the outermost C frame may lie near the top of the thread's stack mapping,
/// and a read past it fails whole.
pub(super) const CSTACK_BELOW: u64 = 2048;

/// What tells that threads, or a whole sample, may be kept unread (`skip_idle`): the
/// kernel's run watch of the process's threads, the epoch of the last sample read in full that
/// succeeded, and how many samples in a row were kept whole since it (a full read at least
/// every [`MAX_KEPT`]). Without a watch nothing is kept.
pub(super) struct Idle {
    pub(super) watch: Option<RunWatch>,
    last_full: Option<u64>,
    whole_kept: u32,
}

impl Idle {
    /// For process `pid`: its count of kept samples starts at a point of its own (from the
    /// pid), so that the forced reads of processes attached together fall on different ticks.
    pub(super) fn new(pid: i32, watch: Option<RunWatch>) -> Idle {
        Idle {
            watch,
            last_full: None,
            whole_kept: (pid as u32).wrapping_mul(0x9E37_79B1) % MAX_KEPT,
        }
    }

    /// At the start of the sample of `epoch`: whether the last sample read in full is still
    /// the truth (no thread ran since), and whether the check read the kernel's figures.
    pub(super) fn check(&mut self, epoch: u64) -> (bool, bool) {
        let Some(w) = self.watch.as_mut() else {
            return (false, false);
        };
        let still = w.check(epoch);
        let checked = w.last_check_read();
        let kept = still == Still::All
            && self.whole_kept < MAX_KEPT
            && self.last_full.is_some_and(|f| f >= w.newest_reference());
        match kept {
            true => self.whole_kept += 1,
            false => self.whole_kept = 0,
        }
        (kept, checked)
    }

    /// The sample of `epoch` was read in full: its threads (id, and whether it costs more to
    /// read than to check) are watched from now.
    pub(super) fn read_in_full(&mut self, epoch: u64, threads: impl Iterator<Item = (i32, bool)>) {
        self.last_full = Some(epoch);
        if let Some(w) = self.watch.as_mut() {
            w.was_read();
            for (tid, heavy) in threads {
                w.watch(tid, heavy);
            }
        }
    }

    /// Nothing read before may stand for now (a sample failed, or the interning started
    /// afresh).
    pub(super) fn forget(&mut self) {
        self.last_full = None;
    }
}

impl<M: RemoteMemory> Unwinder<M> {
    pub(super) fn predict(&self, b: &mut ReadPlan) {
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
            for g in std::iter::once(l.interp.gc_collecting).chain(l.interp.gc_frame) {
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
            for &a in &self.codes.previous {
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
    pub(super) fn predict_thread(&self, b: &mut ReadPlan, ta: u64, tc: &ThreadCache, keep: bool) {
        let l = &self.layout;
        if keep || tc.quiet {
            b.shared_group();
        } else {
            b.next_group();
        }
        b.push(Key::Tstate(ta), ta, self.tstate_read_len());
        if keep {
            return;
        }
        if let Some((s, e)) = tc.cstack {
            let lo = s.saturating_sub(CSTACK_BELOW);
            b.push(Key::CStack(ta), lo, (e - lo) as usize);
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
    pub(super) fn keeps(&self, tc: &ThreadCache) -> bool {
        tc.last_stack.is_some()
            && tc.kept < MAX_KEPT
            && self
                .idle
                .watch
                .as_ref()
                .and_then(|w| w.quiet_since(tc.tid))
                .is_some_and(|since| tc.read_at >= since)
    }

    /// The part of an interpreter state the unwinder reads: from the lowest to the highest of
    /// `next`, `id` and `threads_head` (they sit ~7 KiB into the struct on 3.13+).
    pub(super) fn interp_span(&self) -> (u64, usize) {
        let i = &self.layout.interp;
        let lo = i.next.min(i.id).min(i.threads_head);
        (lo, (i.next.max(i.id).max(i.threads_head) + 8 - lo) as usize)
    }

    /// Whether GIL holders come from the GIL struct (not from a per-thread flag).
    pub(super) fn gil_from_struct(&self) -> bool {
        self.layout.tstate.holds_gil.is_none()
    }

    /// After a thread's stack was interned: the 3.15 marker placed (written to the target only
    /// when it moves, only while the field holds what this sample read) and the regions the
    /// next sample reads for it first.
    pub(super) fn plan_next_read(&mut self, w: &Work) -> Result<(), UnwindError> {
        let fsize = self.layout.frame.size;
        let Some(tc) = self.threads.get_mut(&w.ts.addr) else {
            return Ok(());
        };
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
                // the anchor (then the next sample is a full hit), or keeps it on the
                // anchor's caller; otherwise the outermost frame of the current chunk within
                // MARKER_SPAN of the anchor, which calls and returns near the top leave alone.
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
                    // Or its caller: a loop's call that returns and is made again between
                    // samples takes the marker there at every round.
                    kept.filter(|&j| j <= a + 1).or(Some(a))
                } else if kept.is_some() {
                    kept
                } else {
                    outermost_near
                };
                if let (Some(j), Some((m_now, seq_now))) = (j, w.ts.marker) {
                    let m = tc.chain[j].addr;
                    if m != m_now {
                        if let Some((off, _)) = self.layout.tstate.frame_marker {
                            // The thread state was read whole at `addr`, so this is in it,
                            // and it is one (its interpreter and base frame say so, see
                            // `tstate`). Written only while the field still holds what this
                            // sample read: a thread state freed since (its memory reused) is
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
        Ok(())
    }
}

/// Where a data-stack region is split so that its newest part (the frames just below the
/// last top, and the room above) is read first: the frames near the top change fastest, so
/// they are copied before anything else of the sample. The older part follows (it changes
/// only if the stack unwinds below it meanwhile). `None`: the last top is not in the region, or too near its start to matter.
pub(super) fn top_split(start: u64, end: u64, last_top: u64) -> Option<u64> {
    let m = last_top.saturating_sub(TOP_BEHIND);
    (m > start.saturating_add(PAGE) && m < end).then_some(m)
}

/// Whether a thread whose next read is `regions` and frames at `outside`, after walking
/// `walked` frames (`room` bytes of the regions being room above the top), costs more to
/// read than a schedstat check (about 2 µs, two to three cold
/// iovecs): it spans more than two pages, or a page or more of bytes, or many frames to walk.
pub(super) fn heavy(regions: &[(u64, u64)], outside: &[u64], walked: usize, room: u64) -> bool {
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
