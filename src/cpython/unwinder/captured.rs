//! Stacks from the kernel capture (`memory::capture_records`, loaded by `capture::kernel`): a thread's frame chain copied at
//! one sampling interrupt, decoded with the version's frame layout and interned as a paused
//! thread's walk is (the chain is one instant's: nothing moved while it was copied, so there
//! is no top to settle and nothing to read again).
//!
//! Contract: the threads the capture may watch are those a full sample read
//! ([`Unwinder::captured_threads`], kept by the caller until the next full sample that
//! succeeds); a captured chain must start at the thread's current frame
//! and end at its outermost (a truncated or unreadable one is a failed sample, never a
//! shortened stack). A frame's code object is the one the kernel saw when the cached entry's
//! fingerprint is the one captured with the frame (no read); else it is loaded, and the
//! sample fails unless what is loaded has the captured fingerprint (the object changed
//! since the interrupt), whatever the version.

use super::*;
use crate::cpython::objects::fingerprint_span;
use crate::memory::capture_records::{CaptureLayout, CapturedFrame, CollectorAt, FRAME_BYTES};

/// A thread the capture may watch: the host's id and its thread state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapturedThread {
    pub tid: i32,
    pub tstate: u64,
    /// Where the capture finds whether it holds the GIL (`NotAsked` when the read did not
    /// find the GIL).
    pub gil: GilAt,
    /// Where the capture finds whether its interpreter's collector runs.
    pub collector: CollectorAt,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// What the kernel needs of this version's layout to copy a chain (see
    /// [`CaptureLayout`]).
    pub fn capture_layout(&self) -> CaptureLayout {
        let (first, in_cframe, root_cframe) = match self.layout.tstate.current_frame {
            CurrentFrame::Direct(off) => (off, None, 0),
            CurrentFrame::ViaCFrame {
                cframe,
                current_frame,
                root,
                ..
            } => (cframe, Some(current_frame), root),
        };
        let (fingerprint_at, fingerprint_bytes) = fingerprint_span(&self.layout);
        CaptureLayout {
            first,
            in_cframe,
            previous: self.layout.frame.previous,
            code: self.layout.frame.code,
            instr: self.layout.frame.instr,
            root_cframe,
            code_tag_mask: self.layout.frame.code_tag_mask,
            fingerprint_at,
            fingerprint_bytes: fingerprint_bytes as u64,
            chunk: self.layout.tstate.datastack_chunk,
            tasks: None,
        }
    }

    /// The threads the last full sample read (each with its host thread id), for the capture
    /// to watch.
    pub fn captured_threads(&self) -> Vec<CapturedThread> {
        let mut v: Vec<CapturedThread> = self
            .threads
            .iter()
            .filter(|(_, tc)| tc.tid > 0)
            .map(|(&tstate, tc)| CapturedThread {
                tid: tc.tid,
                tstate,
                gil: tc.gil,
                collector: match tc.interp {
                    0 => CollectorAt::default(),
                    ia => CollectorAt {
                        collecting: ia.wrapping_add(self.layout.interp.gc_collecting),
                        frame: self
                            .layout
                            .interp
                            .gc_frame
                            .map_or(0, |f| ia.wrapping_add(f)),
                    },
                },
            })
            .collect();
        v.sort_unstable_by_key(|t| t.tid);
        v
    }

    /// One thread's sample from a chain captured of `thread` (as [`Unwinder::captured_threads`]
    /// listed it; `frames` newest first, as copied). `truncated`: the chain went on past what
    /// was copied. `collecting`: its interpreter's collector ran, started at that frame (0:
    /// not known), and `holds_gil`: it held the GIL (see [`Unwinder::with_gc_frame`]).
    pub fn sample_captured<'a>(
        &mut self,
        thread: CapturedThread,
        frames: impl Iterator<Item = CapturedFrame<'a>>,
        truncated: bool,
        collecting: Option<u64>,
        holds_gil: bool,
    ) -> Result<ThreadSample, UnwindError> {
        let r = self
            .captured(thread, frames, truncated)
            .map(|mut s| match collecting {
                Some(started_at) => {
                    s.stack = self.with_gc_frame(thread.tstate, started_at, holds_gil, s.stack);
                    s
                }
                None => s,
            });
        match &r {
            Ok(_) => self.stats.samples += 1,
            Err(_) => self.stats.errors += 1,
        }
        r
    }

    /// Counts a chain the kernel could not copy whole (`why`) as a failed sample.
    pub fn captured_failure(&mut self, why: &'static str) -> Result<ThreadSample, UnwindError> {
        self.stats.errors += 1;
        Err(UnwindError::Capture(why))
    }

    fn captured<'a>(
        &mut self,
        thread: CapturedThread,
        frames: impl Iterator<Item = CapturedFrame<'a>>,
        truncated: bool,
    ) -> Result<ThreadSample, UnwindError> {
        if truncated {
            return Err(UnwindError::Capture(
                "a chain deeper than the capture copies",
            ));
        }
        let CapturedThread { tid, tstate, .. } = thread;
        let last = self
            .out
            .iter()
            .find(|s| s.native_thread_id == tid as u64)
            .copied();
        // Each captured sample has the budget of a sample of its own.
        self.budget.begin(self.mem.stats().reads());
        let f = self.layout.frame.clone();
        let fsize = (f.size as usize).min(FRAME_BYTES);
        self.spare.raws.clear();
        let mut fingerprints = std::mem::take(&mut self.spare.captured_fingerprints);
        fingerprints.clear();
        let mut expected: Option<u64> = None;
        for CapturedFrame {
            addr,
            code_fingerprint,
            bytes,
        } in frames
        {
            if self.spare.raws.len() >= MAX_DEPTH {
                return Err(UnwindError::TooLong("frame chain", MAX_DEPTH));
            }
            // The kernel followed `previous`: a frame must be where its callee said.
            if expected.is_some_and(|e| e != addr) {
                return Err(UnwindError::Capture(
                    "a chain that does not follow its links",
                ));
            }
            let h = bytes
                .get(..fsize)
                .and_then(|b| FrameHeader::parse(&f, addr, b))
                .ok_or(UnwindError::Capture("a frame shorter than its layout"))?;
            let raw = RawFrame {
                addr,
                code: h.code,
                previous: h.previous,
                instr: h.instr,
                shim: h.shim,
                generator: h.owner == OWNED_BY_GENERATOR,
                entry: h.entry,
                waits: h.tells_waiting && !h.running,
            };
            if raw.code == 0 && !raw.shim {
                return Err(UnwindError::BadObject {
                    addr,
                    what: "a frame without its code object".into(),
                });
            }
            self.spare.raws.push(raw);
            fingerprints.push(code_fingerprint);
            expected = Some(h.previous);
        }
        if expected.is_some_and(|e| e != 0) {
            return Err(UnwindError::Capture(
                "a chain that stops before its outermost frame",
            ));
        }
        // Entry frames alone: an eval loop entered or left at the interrupt. But for the
        // thread's base frame alone, in its thread state (3.15): no Python code runs on it.
        let base_alone = self.spare.raws.len() == 1
            && self.spare.raws[0].addr.wrapping_sub(tstate) < self.layout.tstate.size.max(4096);
        if !self.spare.raws.is_empty() && !base_alone && self.spare.raws.iter().all(|r| r.shim) {
            return Err(UnwindError::Capture(
                "entry frames only (an eval loop entered or left at the interrupt)",
            ));
        }
        let resolved = self.resolve_captured_codes(&fingerprints);
        self.spare.captured_fingerprints = fingerprints;
        resolved?;
        let ts = Tstate {
            addr: tstate,
            order: 0,
            interp: 0,
            keep: false,
            interp_id: last.map_or(0, |s| s.interpreter_id),
            thread_id: last.map_or(0, |s| s.thread_id),
            native_thread_id: last.map_or(tid as u64, |s| {
                s.namespace_thread_id.unwrap_or(s.native_thread_id)
            }),
            host_tid: tid,
            current_frame: self.spare.raws.first().map_or(0, |r| r.addr),
            top_unread: false,
            entry_link: EntryLink::Unchecked,
            base_frame: 0,
            chunk: 0,
            marker: None,
            holds_gil: None,
            waits_gil: None,
            gil: GilAt::NotAsked,
            running_task: None,
        };
        let w = Work {
            ts,
            raw: 0..self.spare.raws.len(),
            tail: None,
            holds_gil: last.is_some_and(|s| s.holds_gil),
            gil_held_elsewhere: false,
        };
        let stack = self.intern_stack(&w);
        Ok(ThreadSample {
            interpreter_id: w.ts.interp_id,
            thread_id: w.ts.thread_id,
            native_thread_id: tid as u64,
            namespace_thread_id: last.and_then(|s| s.namespace_thread_id),
            holds_gil: w.holds_gil,
            // On its CPU: not waiting.
            waits_gil: false,
            // Captured at an interrupt of the thread's CPU: it was running.
            on_cpu: Some(true),
            stack,
        })
    }

    /// Makes sure every code object of the chain in `raws` is cached and is the one the
    /// kernel saw (`fingerprints`: captured with each frame): entries with the captured
    /// fingerprint are used as they are; the others are loaded in one batch, and must then
    /// have it.
    fn resolve_captured_codes(&mut self, fingerprints: &[u64]) -> Result<(), UnwindError> {
        self.codes.changed = false;
        let mut wanted = std::mem::take(&mut self.spare.captured_codes);
        wanted.clear();
        for (r, &fp) in self.spare.raws.iter().zip(fingerprints) {
            if r.shim || r.code == 0 {
                continue;
            }
            if fp == 0 {
                return Err(UnwindError::Capture(
                    "a code object not resident at the interrupt",
                ));
            }
            wanted.push((r.code, fp));
        }
        wanted.sort_unstable();
        wanted.dedup();
        let mut load = std::mem::take(&mut self.spare.load);
        load.clear();
        let mut result = Ok(());
        for (i, &(addr, fp)) in wanted.iter().enumerate() {
            if i > 0 && wanted[i - 1].0 == addr {
                result = Err(UnwindError::Capture(
                    "a code object that changed while its chain was copied",
                ));
                break;
            }
            match self.codes.peek(&addr).map(|e| e.fingerprint) {
                Some(cached) if cached == fp => self.stats.code_cache_hits += 1,
                Some(_) => {
                    self.stats.stale_invalidations += 1;
                    self.codes.invalidate(addr);
                    load.push(addr);
                }
                None => load.push(addr),
            }
        }
        if result.is_ok() && !load.is_empty() {
            self.stats.code_cache_misses += load.len() as u64;
            result = self.check_budget().and_then(|()| {
                // Stamped 0: a sample that reads the process validates them again.
                let entries = self.read_code_entries(&load, 0)?;
                let mut changed = false;
                for (&addr, entry) in load.iter().zip(entries) {
                    let entry = entry?;
                    let captured = wanted
                        .binary_search_by_key(&addr, |&(a, _)| a)
                        .ok()
                        .map(|i| wanted[i].1);
                    changed |= captured != Some(entry.fingerprint);
                    self.codes.insert(addr, entry);
                }
                match changed {
                    true => Err(UnwindError::Capture(
                        "a code object that changed since the interrupt",
                    )),
                    false => Ok(()),
                }
            });
        }
        self.spare.captured_codes = wanted;
        self.spare.load = load;
        result
    }
}
