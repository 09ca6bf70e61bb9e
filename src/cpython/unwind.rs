//! Walking a target: every interpreter, every thread, every frame.
//!
//! The walker reads whole structs (one read per interpreter state, thread state and frame;
//! three per new code object) and trusts nothing it reads: every list walk is bounded and
//! checked for cycles, every object validated, so torn or garbage memory gives an
//! [`UnwindError`], never a panic or an endless loop.

use super::layout::{CurrentFrame, GilLayout, Layout};
use super::objects::{read_code, CodeInfo};
use super::UnwindError;
use crate::binary::RuntimeLocation;
use crate::memory::{Bytes, RemoteMemory};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most interpreters believed in one process.
pub const MAX_INTERPRETERS: usize = 4096;
/// Most threads believed in one interpreter.
pub const MAX_THREADS: usize = 1 << 16;
/// Deepest stack believed (frames). CPython's default recursion limit is 1000.
pub const MAX_DEPTH: usize = 1 << 16;

/// One Python frame of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub code: Arc<CodeInfo>,
    /// `None` where the instruction has no line (as `frame.f_lineno` gives None).
    pub line: Option<i32>,
}

/// One thread's stack, innermost frame first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStack {
    /// `threading.get_ident()` of the thread (its `pthread_t`).
    pub thread_id: u64,
    /// The kernel's thread id.
    pub native_thread_id: u64,
    pub holds_gil: bool,
    pub on_cpu: bool,
    pub frames: Vec<Frame>,
}

/// One interpreter's threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterStacks {
    /// 0 is the main interpreter.
    pub id: i64,
    pub threads: Vec<ThreadStack>,
}

/// A thread state as read, before its frames are walked.
struct ThreadState {
    addr: u64,
    thread_id: u64,
    native_thread_id: u64,
    current_frame: u64,
}

/// The remote unwinder of one target process: its memory, layout and caches.
pub struct Unwinder<M: RemoteMemory> {
    pid: i32,
    mem: M,
    layout: Layout,
    runtime: u64,
    code_type: Option<u64>,
    binary: PathBuf,
    codes: HashMap<u64, Arc<CodeInfo>>,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// An unwinder over `mem`, whose `_PyRuntime` is at `loc.runtime`.
    pub fn new(pid: i32, mem: M, layout: Layout, loc: &RuntimeLocation) -> Self {
        Unwinder {
            pid,
            mem,
            layout,
            runtime: loc.runtime,
            code_type: loc.code_type,
            binary: loc.path.clone(),
            codes: HashMap::new(),
        }
    }

    /// The file that holds the target's runtime (executable or libpython).
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Addresses of every interpreter state, from `_PyRuntime.interpreters.head`.
    fn interpreters(&self) -> Result<Vec<(u64, Vec<u8>)>, UnwindError> {
        let mut addr = self
            .mem
            .read_u64(self.runtime + self.layout.runtime_interpreters_head)?;
        let size = self.layout.interp_read_size() as usize;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        while addr != 0 {
            if !seen.insert(addr) {
                return Err(UnwindError::Cycle("interpreter list"));
            }
            if out.len() >= MAX_INTERPRETERS {
                return Err(UnwindError::TooLong("interpreter list", MAX_INTERPRETERS));
            }
            let buf = self.mem.read_vec(addr, size)?;
            let next = Bytes(&buf).u64(self.layout.interp.next)?;
            out.push((addr, buf));
            addr = next;
        }
        Ok(out)
    }

    /// Thread states that hold a GIL right now.
    fn gil_holders(&self, interps: &[(u64, Vec<u8>)]) -> Result<HashSet<u64>, UnwindError> {
        let mut holders = HashSet::new();
        let mut check = |base: u64, locked: u64, holder: u64| -> Result<(), UnwindError> {
            let lo = locked.min(holder);
            let buf = self
                .mem
                .read_vec(base + lo, (locked.max(holder) - lo + 8) as usize)?;
            let b = Bytes(&buf);
            if b.u32(locked - lo)? != 0 {
                holders.insert(b.u64(holder - lo)?);
            }
            Ok(())
        };
        match self.layout.gil {
            GilLayout::Runtime { locked, holder } => check(self.runtime, locked, holder)?,
            GilLayout::InterpPointer {
                ptr,
                locked,
                holder,
            } => {
                let mut gils = HashSet::new();
                for (_, buf) in interps {
                    let gil = Bytes(buf).u64(ptr)?;
                    if gil != 0 && gils.insert(gil) {
                        check(gil, locked, holder)?;
                    }
                }
            }
            GilLayout::InterpEmbedded { locked, holder } => {
                for (_, buf) in interps {
                    let b = Bytes(buf);
                    if b.u32(locked)? != 0 {
                        holders.insert(b.u64(holder)?);
                    }
                }
            }
        }
        holders.remove(&0);
        Ok(holders)
    }

    fn thread_states(&self, interp: &[u8]) -> Result<Vec<ThreadState>, UnwindError> {
        let t = &self.layout.tstate;
        let mut addr = Bytes(interp).u64(self.layout.interp.threads_head)?;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        while addr != 0 {
            if !seen.insert(addr) {
                return Err(UnwindError::Cycle("thread list"));
            }
            if out.len() >= MAX_THREADS {
                return Err(UnwindError::TooLong("thread list", MAX_THREADS));
            }
            let buf = self.mem.read_vec(addr, t.size as usize)?;
            let b = Bytes(&buf);
            let current_frame = match t.current_frame {
                CurrentFrame::Direct(off) => b.u64(off)?,
                CurrentFrame::ViaCFrame {
                    cframe,
                    current_frame,
                } => match b.u64(cframe)? {
                    0 => 0,
                    cf => self.mem.read_u64(cf + current_frame)?,
                },
            };
            out.push(ThreadState {
                addr,
                thread_id: b.u64(t.thread_id)?,
                native_thread_id: b.u64(t.native_thread_id)?,
                current_frame,
            });
            addr = b.u64(t.next)?;
        }
        Ok(out)
    }

    /// The code object at `addr`, from the cache or the target.
    fn code(&mut self, addr: u64) -> Result<Arc<CodeInfo>, UnwindError> {
        if let Some(c) = self.codes.get(&addr) {
            return Ok(c.clone());
        }
        let info = Arc::new(read_code(&self.mem, &self.layout, self.code_type, addr)?);
        self.codes.insert(addr, info.clone());
        Ok(info)
    }

    /// The Python frames from `frame` outwards, innermost first.
    fn frames(&mut self, mut frame: u64) -> Result<Vec<Frame>, UnwindError> {
        let f = self.layout.frame.clone();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        while frame != 0 {
            if !seen.insert(frame) {
                return Err(UnwindError::Cycle("frame chain"));
            }
            if seen.len() > MAX_DEPTH {
                return Err(UnwindError::TooLong("frame chain", MAX_DEPTH));
            }
            let buf = self.mem.read_vec(frame, f.size as usize)?;
            let b = Bytes(&buf);
            let previous = b.u64(f.previous)?;
            let owner = b.u8(f.owner)?;
            let code = b.u64(f.code)? & !f.code_tag_mask;
            if !f.shim_owners.contains(&owner) && code != 0 {
                match self.code(code) {
                    Ok(info) => {
                        let line =
                            info.line_at(code, self.layout.code.code_adaptive, b.u64(f.instr)?);
                        out.push(Frame { code: info, line });
                    }
                    // An executable that is not a code object (a shim's): not a Python frame.
                    Err(UnwindError::NotCode(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            frame = previous;
        }
        Ok(out)
    }

    /// Every interpreter, thread and frame of the target, main interpreter first.
    /// Threads with no Python frame (as `sys._current_frames()` leaves them out) are omitted.
    pub fn dump(&mut self) -> Result<Vec<InterpreterStacks>, UnwindError> {
        let interps = self.interpreters()?;
        let holders = self.gil_holders(&interps)?;
        let mut out = Vec::with_capacity(interps.len());
        for (_, buf) in &interps {
            let id = Bytes(buf).i64(self.layout.interp.id)?;
            let mut threads = Vec::new();
            // The list is newest first; show threads in the order they started.
            for ts in self.thread_states(buf)?.into_iter().rev() {
                let frames = self.frames(ts.current_frame)?;
                if frames.is_empty() {
                    continue;
                }
                let tid = i32::try_from(ts.native_thread_id).unwrap_or(-1);
                threads.push(ThreadStack {
                    thread_id: ts.thread_id,
                    native_thread_id: ts.native_thread_id,
                    holds_gil: holders.contains(&ts.addr),
                    on_cpu: crate::process::thread_on_cpu(self.pid, tid).unwrap_or(false),
                    frames,
                });
            }
            out.push(InterpreterStacks { id, threads });
        }
        out.sort_by_key(|i| i.id);
        Ok(out)
    }
}
