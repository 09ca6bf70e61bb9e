//! Thread collection: the interpreters of the runtime, their thread states (bounded in
//! number), which thread holds the GIL, and each thread's data-stack chunks. Produces one
//! [`Work`] per thread, its frames walked by [`frames`](super::frames).

use super::*;

/// Most interpreters and threads followed per sample.
pub(super) const MAX_INTERPRETERS: usize = 256;

/// Most threads read in one sample, all interpreters together.
pub(super) const MAX_THREADS: usize = 8192;

/// 3.11/3.12: widest stretch of a thread's C stack over which the C frames of its eval loops
/// are followed and prefetched (see [`grow_cstack`]).
pub(super) const MAX_CSTACK_SPAN: u64 = 24 * 1024;

/// Most data-stack chunks followed per thread.
pub(super) const MAX_CHUNKS: usize = 64;

/// Largest data-stack chunk believed (bytes). CPython's chunks are 16 KiB unless one frame
/// needs more; a larger size read from the target is garbage.
pub(super) const MAX_CHUNK_SIZE: u64 = 1 << 24;

/// Most bytes of older chunks read per thread (a 2^16-frame stack fits).
pub(super) const MAX_OLDER_BYTES: u64 = 1 << 25;

/// A thread state as read this sample.
pub(super) struct Tstate {
    pub(super) addr: u64,
    /// Position in the interpreters' thread lists as walked (newest thread first).
    pub(super) order: usize,
    /// The interpreter whose thread list holds it, as the thread state also says (0: not
    /// read from the list, the kernel capture's).
    pub(super) interp: u64,
    /// The thread has not run since its stack was read, and its state agrees: the stack is
    /// kept, nothing of it is read.
    pub(super) keep: bool,
    pub(super) interp_id: i64,
    pub(super) thread_id: u64,
    /// As the target's namespace sees it, and as we do (0: not found).
    pub(super) native_thread_id: u64,
    pub(super) host_tid: i32,
    pub(super) current_frame: u64,
    /// 3.11/3.12: the C frame holding the current frame's pointer was not in the read.
    pub(super) top_unread: bool,
    /// 3.11/3.12: what the thread's innermost entry frame must link to (see [`EntryLink`]).
    pub(super) entry_link: EntryLink,
    /// 3.15+: the thread's base frame, where every chain ends (0: not known).
    pub(super) base_frame: u64,
    pub(super) chunk: u64,
    pub(super) marker: Option<(u64, u64)>,
    pub(super) holds_gil: Option<bool>,
    /// 3.15+: the thread's own flag, set while it waits to take the GIL.
    pub(super) waits_gil: Option<bool>,
    /// Where the kernel capture finds whether it holds the GIL.
    pub(super) gil: GilAt,
    /// The asyncio task it ran as its state was read (0: none, or no loop running), when
    /// the unwinder reads it with the state (see `Unwinder::running_task_fields`).
    pub(super) running_task: Option<u64>,
}

impl Tstate {
    /// The thread's id as pyfleet sees it, else as the target does.
    pub(super) fn native(&self) -> u64 {
        match self.host_tid {
            0 => self.native_thread_id,
            t => t as u64,
        }
    }
}

/// 3.11/3.12: what the walk from the top must meet. An eval loop's C frame names its
/// current frame and the C frame of the loop that called it through C (`previous`), whose
/// current frame, the caller, holds still while the inner loop runs. The inner loop's entry
/// frame (3.11: `is_entry`; 3.12: the shim on the C stack) links to that caller. A walk that
/// meets no entry frame linking to it, and does not start at the caller itself (the inner
/// loop being entered or left), went another way: the pointer to the top was read while a
/// loop was entered (stale) or a frame was half written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EntryLink {
    /// 3.13+, a kept stack, or a C frame without a caller's.
    Unchecked,
    /// The caller's frame (0: the thread's first eval loop, called from its own C frame).
    Expect(u64),
    /// The caller's C frame was not in the read: the thread is read again with it.
    Unknown,
}

/// Grows a thread's C-stack extent (where its eval loops' C frames were met, see
/// [`ThreadCache::cstack`]) to hold `lo..hi`, the pointers of one more C frame. The new C
/// frame is always held; wider than [`MAX_CSTACK_SPAN`], the extent keeps as much of its high
/// end as it can: the outermost eval loops' C frames, which stay while inner ones come and go
/// below them. (A thread state reused by a new thread names a C stack elsewhere: the extent
/// moves there.)
pub(super) fn grow_cstack(extent: &mut Option<(u64, u64)>, lo: u64, hi: u64) {
    let (s, e) = match *extent {
        Some((s, e)) => (s.min(lo), e.max(hi)),
        None => (lo, hi),
    };
    let e = e.min(lo.saturating_add(MAX_CSTACK_SPAN)).max(hi);
    *extent = Some((s.max(e.saturating_sub(MAX_CSTACK_SPAN)), e));
}

/// Per-thread work of one sample.
pub(super) struct Work {
    pub(super) ts: Tstate,
    pub(super) raw: std::ops::Range<usize>,
    /// Cached chain index from which the rest of the stack is reused.
    pub(super) tail: Option<usize>,
    pub(super) holds_gil: bool,
    /// Another thread held a GIL at the read (3.11-3.14: the GIL structs read say so): this
    /// one may be waiting for it.
    pub(super) gil_held_elsewhere: bool,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// Reads interpreters and threads, and walks every thread's frames.
    pub(super) fn collect(
        &mut self,
        b: &ReadPlan,
        work: &mut Vec<Work>,
    ) -> Result<u64, UnwindError> {
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
        self.spare.collecting.clear();
        holders.clear();
        gils.clear();
        tstates.clear();
        let mut seen_tstates = std::mem::take(&mut self.spare.seen_tstates);
        seen_tstates.clear();
        interp_ids.clear();

        // The GIL the threads of the interpreter walked use.
        let mut gil_at = GilAt::NotAsked;
        if let (GilLayout::Runtime { locked, holder }, true) = (l.gil, gil_struct) {
            gil_at = GilAt::Holder {
                locked: self.runtime + locked,
                holder: self.runtime + holder,
            };
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
            // The `int` is the word's low half.
            if self.word(b, ia.wrapping_add(l.interp.gc_collecting))? as u32 != 0 {
                let started_at = match l.interp.gc_frame {
                    Some(f) => Some(self.word(b, ia.wrapping_add(f))?),
                    None => None,
                };
                self.spare.collecting.push((ia, started_at));
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
                gil_at = match gp {
                    0 => GilAt::NotAsked,
                    gp => GilAt::Holder {
                        locked: gp.wrapping_add(locked),
                        holder: gp.wrapping_add(holder),
                    },
                };
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
                let (mut ts, next) = self.tstate(b, ta, (ia, interp_id), tstates.len(), true)?;
                if ts.gil == GilAt::NotAsked {
                    ts.gil = gil_at;
                }
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
            let start = self.spare.raws.len();
            let holds_gil = ts.holds_gil.unwrap_or_else(|| holders.contains(&ts.addr));
            let gil_held_elsewhere = holders.iter().any(|&h| h != ts.addr);
            if ts.keep {
                self.threads.entry(ts.addr).or_default().seen = self.epoch;
                work.push(Work {
                    raw: start..start,
                    tail: None,
                    holds_gil,
                    gil_held_elsewhere,
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
                    // knows where they are). Where its C frames are is kept: the C stack
                    // is read whole there and its words are believed only as the thread
                    // state names them. The other threads' caches stay (a torn read of one
                    // thread says nothing about the others, and re-learning every thread
                    // of a busy process costs a syscall each).
                    if !matches!(e, UnwindError::Moved(_)) {
                        if let Some(tc) = self.threads.get_mut(&addr) {
                            *tc = ThreadCache {
                                cstack: tc.cstack,
                                ..ThreadCache::default()
                            };
                        }
                    }
                    return Err(e);
                }
            };
            work.push(Work {
                raw: start..self.spare.raws.len(),
                tail,
                holds_gil,
                gil_held_elsewhere,
                ts,
            });
        }
        self.spare.tstates = tstates;
        self.spare.seen_tstates = seen_tstates;
        self.spare.holders = holders;
        Ok(generation)
    }

    /// Parses the thread state at `ta` of the interpreter at `interp` (address, id) from `b`
    /// (reading what `b` lacks); returns it and the next thread state's address. `may_keep`:
    /// the thread's last stack may be kept.
    ///
    /// Memory that does not name `interp` as its interpreter, or (3.15+) whose base frame is
    /// not its own, is not a live thread state of it (a pointer read torn, or a thread state
    /// freed and reused): an error, so that nothing is believed of it and, above all, the
    /// 3.15 marker is never written there.
    pub(super) fn tstate(
        &mut self,
        b: &ReadPlan,
        ta: u64,
        (interp, interp_id): (u64, i64),
        order: usize,
        may_keep: bool,
    ) -> Result<(Tstate, u64), UnwindError> {
        let l = &self.layout;
        let tb = self.bytes(b, Key::Tstate(ta), ta, self.tstate_read_len())?;
        let t = Bytes(&tb);
        let not_a_tstate = |what: &str| UnwindError::BadObject {
            addr: ta,
            what: format!("not a thread state of this interpreter: {what}"),
        };
        if t.u64(l.tstate.interp)? != interp {
            return Err(not_a_tstate("its interpreter is another"));
        }
        let base_frame = match l.tstate.base_frame {
            Some(bf) => {
                let named = t.u64(bf.pointer)?;
                if named != ta.wrapping_add(bf.embedded) {
                    return Err(not_a_tstate("its base frame is not its own"));
                }
                named
            }
            None => 0,
        };
        let mut top_unread = false;
        let mut entry_link = EntryLink::Unchecked;
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
                previous,
                root,
            } => {
                let cf = t.u64(cframe)?;
                let root_cf = ta.wrapping_add(root);
                let (lo, len) = l.tstate.current_frame.cframe_span().unwrap_or((0, 8));
                match kept {
                    // The C frame holding the pointer is the idle thread's own.
                    Some((c, top, _)) if c == cf && cf != 0 => top,
                    _ => {
                        // The C frame's pointers: from the thread state (its own C frame), or
                        // the C stack this read prefetched: the thread's extent, or (3.12) the
                        // C stack around its innermost entry frame, where an eval loop's C
                        // frame mostly lies too (a local of the same C function; read after
                        // the frames, which then tell whether the top moved: `settle_top`).
                        let tsize = l.tstate.size;
                        let entries = self.threads.get(&ta).and_then(|t| t.entries);
                        let in_read = |c: u64| {
                            let at = c.wrapping_add(lo);
                            match at
                                .checked_sub(ta)
                                .filter(|o| o.saturating_add(len as u64) <= tsize)
                            {
                                Some(o) => tb.get(o as usize..o as usize + len),
                                None => b
                                    .within(Key::CStack(ta), at, len)
                                    .or_else(|| b.within(Key::Entries(entries?), at, len)),
                            }
                        };
                        let tc = self.threads.entry(ta).or_default();
                        tc.cframe = cf;
                        // Where the thread's eval loops keep their C frames (a generator's eval
                        // loop comes and goes: its C frame and its caller's take turns). An
                        // extent that could not be read spans memory no stack holds now (a
                        // thread state reused by a thread whose stack lies elsewhere): it
                        // starts afresh.
                        if b.unread(Key::CStack(ta)) {
                            tc.cstack = None;
                        }
                        if cf != 0 && cf != root_cf {
                            let at = cf.wrapping_add(lo);
                            grow_cstack(&mut tc.cstack, at, at.saturating_add(len as u64));
                        }
                        let field = |bytes: &[u8], at: u64| Bytes(bytes).u64(at - lo);
                        match in_read(cf) {
                            _ if cf == 0 => 0,
                            // The thread state's own C frame: no eval loop runs.
                            Some(c) if cf == root_cf => field(c, current_frame)?,
                            Some(c) => match (field(c, current_frame)?, field(c, previous)?) {
                                // An eval loop's C frame, published before its current frame
                                // was set: a frame is being entered, not known yet.
                                (0, _) => {
                                    top_unread = true;
                                    0
                                }
                                (top, caller_cf) => {
                                    entry_link = match caller_cf {
                                        0 => EntryLink::Unchecked,
                                        c if c == root_cf => EntryLink::Expect(0),
                                        c => match in_read(c) {
                                            Some(cb) => {
                                                EntryLink::Expect(field(cb, current_frame)?)
                                            }
                                            None => {
                                                // Believed as a place of the C stack only
                                                // above the current C frame and near it (a
                                                // C frame read torn may point anywhere).
                                                if c > cf && c - cf <= MAX_CSTACK_SPAN {
                                                    let tc = self.threads.entry(ta).or_default();
                                                    let at = c.wrapping_add(lo);
                                                    grow_cstack(
                                                        &mut tc.cstack,
                                                        at,
                                                        at.saturating_add(len as u64),
                                                    );
                                                }
                                                EntryLink::Unknown
                                            }
                                        },
                                    };
                                    top
                                }
                            },
                            // A C frame the prediction did not know: read later, its pointer
                            // could be anything (the C frame may be gone). The thread is
                            // read again with it.
                            None => {
                                top_unread = true;
                                0
                            }
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
            interp,
            interp_id,
            thread_id: t.u64(l.tstate.thread_id)?,
            native_thread_id,
            host_tid,
            keep: !top_unread
                && kept.is_some_and(|(_, top, tid)| top == current_frame && tid == host_tid),
            current_frame,
            top_unread,
            entry_link,
            base_frame,
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
            waits_gil: match l.tstate.gil_requested {
                Some(off) => Some(t.i32(off)? != 0),
                None => None,
            },
            gil: match l.tstate.holds_gil {
                Some(off) => GilAt::OwnFlags {
                    holds: ta.wrapping_add(off),
                    requested: l.tstate.gil_requested.map_or(0, |r| ta.wrapping_add(r)),
                },
                None => GilAt::NotAsked,
            },
            running_task: match self.running_task_fields {
                Some((running_loop, task)) => Some(match t.u64(running_loop)? {
                    0 => 0,
                    _ => t.u64(task)? & !crate::cpython::asyncio::walk::TAG_BITS,
                }),
                None => None,
            },
        };
        Ok((ts, t.u64(l.tstate.next)?))
    }

    /// Refreshes what we know of a thread's data-stack chunks when its current chunk changed.
    pub(super) fn chunks(&mut self, ts: &Tstate) -> Result<(), UnwindError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cstack_extent_holds_the_c_frame_met_last_and_as_much_of_its_high_end_as_fits() {
        let mut extent = None;
        grow_cstack(&mut extent, 0x7000_8000, 0x7000_8010);
        assert_eq!(extent, Some((0x7000_8000, 0x7000_8010)));
        // A deeper eval loop's C frame, then an outer one: both held.
        grow_cstack(&mut extent, 0x7000_6000, 0x7000_6010);
        grow_cstack(&mut extent, 0x7000_9000, 0x7000_9010);
        assert_eq!(extent, Some((0x7000_6000, 0x7000_9010)));
        // Deeper than the span allows: the new C frame and as much above it as fits.
        grow_cstack(
            &mut extent,
            0x7000_9010 - MAX_CSTACK_SPAN - 0x100,
            0x7000_9010 - MAX_CSTACK_SPAN - 0xf0,
        );
        assert_eq!(
            extent,
            Some((0x7000_9010 - MAX_CSTACK_SPAN - 0x100, 0x7000_9010 - 0x100))
        );
        // The outermost one again: the high end comes back, the low end gives way.
        grow_cstack(&mut extent, 0x7000_9000, 0x7000_9010);
        assert_eq!(extent, Some((0x7000_9010 - MAX_CSTACK_SPAN, 0x7000_9010)));
        // A C frame far below or far above (a new thread's stack): the extent moves there.
        grow_cstack(&mut extent, 0x6000_0000, 0x6000_0010);
        assert_eq!(extent, Some((0x6000_0000, 0x6000_0000 + MAX_CSTACK_SPAN)));
        grow_cstack(&mut extent, 0x7100_0000, 0x7100_0010);
        assert_eq!(extent, Some((0x7100_0010 - MAX_CSTACK_SPAN, 0x7100_0010)));
    }
}
