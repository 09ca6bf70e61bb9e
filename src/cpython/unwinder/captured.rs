//! Stacks from the kernel capture (`memory::kernel_capture`): a thread's frame chain copied at
//! one sampling interrupt, decoded with the version's frame layout and interned as a paused
//! thread's walk is (the chain is one instant's: nothing moved while it was copied, so there
//! is no top to settle and nothing to read again).
//!
//! Contract: the threads the capture may watch are those a full sample read
//! ([`Unwinder::captured_threads`], kept by the caller until the next full sample that
//! succeeds); a captured chain must start at the thread's current frame
//! and end at its outermost (a truncated or unreadable one is a failed sample, never a
//! shortened stack); code objects are validated by fingerprint once per batch
//! ([`Unwinder::begin_captured_batch`]), whatever the version.

use super::*;
use crate::memory::kernel_capture::{FramePointerPath, FRAME_BYTES};

/// A thread the capture may watch: the host's id and its thread state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapturedThread {
    pub tid: i32,
    pub tstate: u64,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// Where the kernel finds a thread's current frame from its thread state, and where a
    /// frame names its caller.
    pub fn frame_pointer_path(&self) -> FramePointerPath {
        let (first, in_cframe) = match self.layout.tstate.current_frame {
            CurrentFrame::Direct(off) => (off, None),
            CurrentFrame::ViaCFrame {
                cframe,
                current_frame,
            } => (cframe, Some(current_frame)),
        };
        FramePointerPath {
            first,
            in_cframe,
            previous: self.layout.frame.previous,
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
            })
            .collect();
        v.sort_unstable_by_key(|t| t.tid);
        v
    }

    /// Starts a batch of captured samples (one drain of the capture): the code objects they
    /// name are validated again once for the batch.
    pub fn begin_captured_batch(&mut self) {
        self.epoch += 1;
    }

    /// One thread's sample from a chain captured of `thread` (as [`Unwinder::captured_threads`]
    /// listed it; `frames` newest first, as copied). `truncated`: the chain went on past what
    /// was copied.
    pub fn sample_captured<'a>(
        &mut self,
        thread: CapturedThread,
        frames: impl Iterator<Item = (u64, &'a [u8])>,
        truncated: bool,
    ) -> Result<ThreadSample, UnwindError> {
        let r = self.captured(thread, frames, truncated);
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
        frames: impl Iterator<Item = (u64, &'a [u8])>,
        truncated: bool,
    ) -> Result<ThreadSample, UnwindError> {
        if truncated {
            return Err(UnwindError::Capture(
                "a chain deeper than the capture copies",
            ));
        }
        let CapturedThread { tid, tstate } = thread;
        let last = self
            .out
            .iter()
            .find(|s| s.native_thread_id == tid as u64)
            .copied();
        // Each captured sample has the budget of a sample of its own.
        self.sample_started.set(None);
        self.syscalls_before = self.mem.stats().reads();
        let f = self.layout.frame.clone();
        let fsize = (f.size as usize).min(FRAME_BYTES);
        self.raws.clear();
        let mut expected: Option<u64> = None;
        for (addr, bytes) in frames {
            if self.raws.len() >= MAX_DEPTH {
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
            };
            if raw.code == 0 && !raw.shim {
                return Err(UnwindError::BadObject {
                    addr,
                    what: "a frame without its code object".into(),
                });
            }
            self.raws.push(raw);
            expected = Some(h.previous);
        }
        if expected.is_some_and(|e| e != 0) {
            return Err(UnwindError::Capture(
                "a chain that stops before its outermost frame",
            ));
        }
        self.resolve_codes(&ReadPlan::default(), None)?;
        let ts = Tstate {
            addr: tstate,
            order: 0,
            keep: false,
            interp_id: last.map_or(0, |s| s.interpreter_id),
            thread_id: last.map_or(0, |s| s.thread_id),
            native_thread_id: last.map_or(tid as u64, |s| {
                s.namespace_thread_id.unwrap_or(s.native_thread_id)
            }),
            host_tid: tid,
            current_frame: self.raws.first().map_or(0, |r| r.addr),
            top_unread: false,
            chunk: 0,
            marker: None,
            holds_gil: None,
        };
        let w = Work {
            ts,
            raw: 0..self.raws.len(),
            tail: None,
            holds_gil: last.is_some_and(|s| s.holds_gil),
        };
        let stack = self.intern_stack(&w);
        Ok(ThreadSample {
            interpreter_id: w.ts.interp_id,
            thread_id: w.ts.thread_id,
            native_thread_id: tid as u64,
            namespace_thread_id: last.and_then(|s| s.namespace_thread_id),
            holds_gil: w.holds_gil,
            // Captured at an interrupt of the thread's CPU: it was running.
            on_cpu: Some(true),
            stack,
        })
    }
}
