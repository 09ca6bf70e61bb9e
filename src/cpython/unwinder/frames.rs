//! Frame walking: one thread's frames from its top to its entry frame, from the bytes the
//! sample read where they hold them, reading again what they lack (at most [`MAX_READS`]
//! reads of a thread per sample). The top is the frame the frames show as running
//! ([`settle_top`]), not the pointer read a moment before; a walk that does not hold
//! together is read again or fails, never spliced.

use super::*;

/// Room read above the top frame when a thread is read again because its stack moved: it
/// keeps moving during the microseconds until that read.
pub(super) const REREAD_GROWTH: u64 = 8192;

/// Most reads of one thread per sample (see `Unwinder::walk_consistent`).
pub(super) const MAX_READS: u32 = 4;

/// Most frames of one thread outside its data stack (generators', entry frames on the C
/// stack; each may cost a read of its own): real stacks have a few dozen.
pub(super) const MAX_OUTSIDE_FRAMES: usize = 1024;

/// Most frames outside the data stack (generators, coroutines) prefetched per thread.
pub(super) const MAX_OUTSIDE: usize = 64;

/// Frames outside the data stack met by earlier reads, and not by the last one, prefetched.
pub(super) const MAX_RECENT_OUTSIDE: usize = 16;

/// What a thread's read lacked (see `Unwinder::walk`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Missing {
    /// This range of the current data-stack chunk.
    pub(super) chunk: Option<(u64, u64)>,
    /// The used parts of the older chunks.
    pub(super) older: bool,
}

impl Missing {
    pub(super) fn any(&self) -> bool {
        self.chunk.is_some() || self.older
    }
}

/// A frame walked (read from the target) this sample.
#[derive(Clone, Copy)]
pub(super) struct RawFrame {
    pub(super) addr: u64,
    pub(super) code: u64,
    pub(super) previous: u64,
    pub(super) instr: u64,
    pub(super) shim: bool,
    pub(super) generator: bool,
    /// 3.11: the frame's `is_entry` (false on later versions).
    pub(super) entry: bool,
    /// 3.11-3.13: its stack pointer is saved (it waits on a Python callee of its own eval
    /// loop, or returned); false on later versions.
    pub(super) waits: bool,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// Walks one thread's frames from one read of it: first the sample's batch; when the
    /// stack is not all in it (it moved since the prediction) or does not hold together (it
    /// moved during the read), the thread's state and every range its stack needs are read
    /// again at once, in one syscall, at most [`MAX_READS`] times in all. Returns the thread
    /// state the stack was read with.
    pub(super) fn walk_consistent(
        &mut self,
        b: &ReadPlan,
        mut ts: Tstate,
    ) -> Result<(Tstate, Option<usize>), (u64, UnwindError)> {
        let start = self.spare.raws.len();
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
            self.spare.raws.truncate(start);
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
            self.budget.add_bytes(planned).map_err(|e| (addr, e))?;
            o.fetch(&self.mem);
            // Which thread holds the GIL, and where, was read with the interpreter.
            let (interp, order, holds_gil, waits_gil, gil) = (
                (ts.interp, ts.interp_id),
                ts.order,
                ts.holds_gil,
                ts.waits_gil,
                ts.gil,
            );
            ts = match self.tstate(&o, addr, interp, order, false) {
                Ok((t, _)) => Tstate {
                    holds_gil,
                    waits_gil,
                    gil,
                    ..t
                },
                Err(e) => return Err((addr, e)),
            };
            own = Some(o);
        }
    }

    /// Walks one thread's frames into `self.spare.raws`; returns the cached chain index from which
    /// the rest of the stack is unchanged (3.15 marker), if any, and the top frame walked
    /// from (see [`settle_top`]).
    pub(super) fn walk(
        &mut self,
        b: &ReadPlan,
        ts: &Tstate,
    ) -> Result<(Option<usize>, u64), UnwindError> {
        if ts.entry_link == EntryLink::Unknown {
            return Err(UnwindError::Moved(
                "the C frame of the current one's caller",
            ));
        }
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
        let tells_waiting = matches!(f.liveness, Liveness::RunningStacktop(_));
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
            // stack, nor a generator's or a frame object's); or a new eval loop at the same
            // depth published its C frame, whose pointer still names the last one's entry
            // frame, being written again (its code object set before its owner). Either way
            // the thread runs, or will, in the entry frame's caller: the top is settled from
            // there.
            let in_older = |a: u64| older.iter().any(|&(s, e)| a >= s && a < e);
            if !unread && addr != 0 && !in_chunk(addr) {
                if let Some(h) = header(addr).filter(|h| {
                    h.shim
                        || (h.owner != OWNED_BY_GENERATOR
                            && h.owner != OWNED_BY_FRAME_OBJECT
                            && !in_older(addr)
                            && h.previous != 0)
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
            !self.codes.is_not_code(*c)
                && !self.codes.callees.contains(c)
                && self.codes.callees.len() < MAX_CALLEE_CODES
        }) {
            self.codes.callees.push(code);
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
        let walked_from = self.spare.raws.len();
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
            if self.spare.raws.len() >= MAX_SAMPLE_FRAMES {
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
            let from = self.spare.raws[walked_from..].last().map(|r| r.addr);
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
                    self.codes.forget(code);
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
                waits: match f.liveness {
                    Liveness::RunningStacktop(off) => fb.i32(off)? != -1,
                    Liveness::ClearedCode(_) => false,
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
            // 3.11: a frame that called out of its eval loop (into C, which ran the entry frame
            // just walked) runs, its stack pointer taken; one that waits called a Python
            // function of its own loop instead. The entry frame (a generator's, read at another
            // time than the chunk) was its callee at another instant than the one its
            // instruction pointer shows.
            // 3.11-3.13: a frame that called a Python function in its own eval loop saved its
            // stack pointer first (it waits) and takes it back once the callee returned: one
            // that runs below such a callee was read after the callee returned (the part of
            // the data stack above it was read first).
            let callee = self.spare.raws[walked_from..]
                .last()
                .filter(|c| c.previous == addr)
                .copied();
            if tells_waiting
                && !raw.shim
                && !raw.waits
                && callee.is_some_and(|c| !c.entry && !c.shim && in_chunk(c.addr))
            {
                return Err(UnwindError::BadObject {
                    addr,
                    what: "a frame that runs below its callee (read while it changed)".into(),
                });
            }
            if raw.waits && callee.is_some_and(|c| c.entry) {
                return Err(UnwindError::BadObject {
                    addr,
                    what: "the caller of an entry frame waits on another callee (read while it \
                           changed)"
                        .into(),
                });
            }
            if previous == addr {
                return Err(UnwindError::Cycle("frame chain"));
            }
            self.spare.raws.push(raw);
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
            self.spare.raws.truncate(walked_from);
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
        let walked = &self.spare.raws[walked_from..];
        // Entry frames alone: an eval loop was being entered or left (the thread's current
        // frame its entry frame for an instant). Not a stack of the thread: no Python frame.
        // But for the thread's base frame alone (3.15): no Python code runs on it.
        let base_alone = walked.len() == 1 && ts.base_frame != 0 && walked[0].addr == ts.base_frame;
        if tail.is_none() && !walked.is_empty() && !base_alone && walked.iter().all(|r| r.shim) {
            return Err(UnwindError::BadObject {
                addr: top,
                what: "entry frames only (an eval loop entered or left while read)".into(),
            });
        }
        if let (EntryLink::Expect(caller), None) = (ts.entry_link, tail) {
            let linked = walked.first().is_some_and(|r| r.addr == caller)
                || walked
                    .iter()
                    .any(|r| (r.shim || r.entry) && r.previous == caller);
            if !linked {
                return Err(UnwindError::BadObject {
                    addr: top,
                    what: "a stack that misses the entry frame of the eval loop that named its \
                           top (read while it changed)"
                        .into(),
                });
            }
        }
        // 3.11: a thread's first frame lies at the start of its first chunk (its second word:
        // the first is kept so that the chunk is never freed); a chain that ends elsewhere in
        // the data stack ends at a frame whose link was not written yet.
        if let Some(last) = walked.last().filter(|r| {
            tail.is_none()
                && f.is_entry.is_some()
                && older.is_empty()
                && !r.generator
                && r.previous == 0
                && in_chunk(r.addr)
        }) {
            if last.addr != chunk_lo + 8 {
                return Err(UnwindError::BadObject {
                    addr: last.addr,
                    what: "a first frame that is not at the start of the data stack (read while \
                           it changed)"
                        .into(),
                });
            }
        }
        // 3.15+: every chain ends at the thread's base frame, in its thread state; one that
        // ends at an entry frame on the C stack read it half written or reused.
        if let (Some(last), None) = (walked.last(), tail) {
            if ts.base_frame != 0 && last.addr != ts.base_frame {
                return Err(UnwindError::BadObject {
                    addr: last.addr,
                    what: "a stack that does not end at the thread's base frame (read while it \
                           changed)"
                        .into(),
                });
            }
        }
        if tail.is_none() && (!f.shim_owners.is_empty() || f.is_entry.is_some()) {
            if let Some(last) = self.spare.raws[walked_from..]
                .last()
                .filter(|r| !r.shim && (!r.entry || r.generator))
            {
                return Err(UnwindError::BadObject {
                    addr: last.addr,
                    what: "the stack does not end at an entry frame (read while it changed)".into(),
                });
            }
        }
        self.stats.frames_from_memory += (self.spare.raws.len() - walked_from) as u64;
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
}

/// The outside frames to prefetch next, into `recent` (the thread's own list, so that its
/// buffer stays with it): those just `found`, then up to [`MAX_RECENT_OUTSIDE`] of the
/// `recent` ones not among them, newest first. `found` is scratch.
pub(super) fn remember(found: &mut Vec<u64>, recent: &mut Vec<u64>) {
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
