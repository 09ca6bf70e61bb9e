//! What the kernel capture copies of a target, and by what: the layout a watched thread's
//! chain is copied by ([`CaptureLayout`], [`GilAt`], and [`ThreadInfo`], the program's map
//! value they become), and the records its ring holds ([`CapturedRecord`], [`frames_in`]):
//! each a thread's chain at one instant, newest frame first, each frame's address, its first
//! [`FRAME_BYTES`] bytes and its code object's fingerprint. The constants and struct layouts
//! are `bpf/capture.bpf.c`'s, checked against it by a unit test; the program's loader and ring
//! are `capture::kernel`'s.
//!
//! Records come from the kernel: parsing one never reads past it (a record shorter than its
//! head says is refused), and what the program could not copy is said by its flags.

use aya::Pod;

/// Most frames one record holds (`MAX_FRAMES` in `bpf/capture.bpf.c`).
pub const MAX_FRAMES: usize = 256;
/// Bytes copied from the start of each frame (`FRAME_BYTES`): every field pyfleet reads of a
/// frame lies in the first 80 bytes on 3.11-3.15.
pub const FRAME_BYTES: usize = 80;
/// Most threads watched at once (`MAX_THREADS`).
pub const MAX_WATCHED: usize = 16384;
/// Most processes watched at once (`MAX_PROCESSES`).
pub const MAX_WATCHED_PROCESSES: usize = 16384;

// `struct record`'s head: where each field lies, and its size (the frames follow it).
const PID_AT: usize = 0;
const TID_AT: usize = 4;
const TIME_AT: usize = 8;
const FRAMES_AT: usize = 16;
const FLAGS_AT: usize = 18;
const SWITCHED_IN_AT: usize = 24;
const TASK_AT: usize = 32;
// `struct task_copy`: the task's address, its name object, coroutine and awaiter, the name
// object's first bytes.
const TASK_NAME_AT: usize = 8;
const TASK_CORO_AT: usize = 16;
const TASK_AWAITED_BY_AT: usize = 24;
const TASK_NAME_HEAD_AT: usize = 32;
/// Bytes of a running task's name object copied with its chain (`TASK_NAME_BYTES`).
pub const TASK_NAME_BYTES: usize = 96;
const TASK_COPY_BYTES: usize = TASK_NAME_HEAD_AT + TASK_NAME_BYTES;
const GC_FRAME_AT: usize = TASK_AT + TASK_COPY_BYTES;
const HEAD_BYTES: usize = GC_FRAME_AT + 8;
// `struct frame_copy`: the frame's address, its code object's fingerprint, its first bytes.
const ADDR_AT: usize = 0;
const FINGERPRINT_AT: usize = 8;
const BYTES_AT: usize = 16;
const FRAME_COPY_BYTES: usize = BYTES_AT + FRAME_BYTES;
const NO_INDIRECTION: u64 = u64::MAX;
const FLAG_POINTER_UNREADABLE: u16 = 1;
const FLAG_FRAME_UNREADABLE: u16 = 2;
const FLAG_TRUNCATED: u16 = 4;
const FLAG_UNKNOWN_THREAD: u16 = 8;
const FLAG_SWITCHED_OUT: u16 = 16;
const FLAG_UNCHANGED: u16 = 64;
const FLAG_ENTERING: u16 = 128;
const FLAG_HOLDS_GIL: u16 = 256;
const FLAG_WAITS_GIL: u16 = 512;
const FLAG_COLLECTING: u16 = 1024;

/// Most bytes of a code object its fingerprint covers (`MAX_FINGERPRINT_BYTES`).
pub const MAX_FINGERPRINT_BYTES: u64 = 64;

/// What the program needs of a version's layout to copy a chain: where a thread's
/// current-frame pointer lies, from its thread state (the layout's `CurrentFrame`), where a
/// frame names its caller and its code object, and which bytes of a code object its
/// fingerprint covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLayout {
    /// Offset in the thread state of the current frame's address (3.13+), or of a pointer
    /// to the C frame holding it (3.11, 3.12: then `in_cframe` is that offset in it).
    pub first: u64,
    pub in_cframe: Option<u64>,
    /// Offset of `previous` in a frame (below [`FRAME_BYTES`] - 8).
    pub previous: u64,
    /// Offset of the code object's pointer in a frame (below [`FRAME_BYTES`] - 8), and the
    /// tag bits to clear from it.
    pub code: u64,
    /// Offset of the instruction pointer in a frame (below [`FRAME_BYTES`] - 8).
    pub instr: u64,
    /// 3.11, 3.12: offset in the thread state of its own C frame (see `CurrentFrame`).
    pub root_cframe: u64,
    pub code_tag_mask: u64,
    /// The fingerprint's bytes in a code object: `fingerprint_bytes` (a multiple of 8, at
    /// most [`MAX_FINGERPRINT_BYTES`]) at `fingerprint_at`.
    pub fingerprint_at: u64,
    pub fingerprint_bytes: u64,
    /// Offset in the thread state of its current data-stack chunk's address: the program
    /// reads the chunk below the top frame at once (none: frame by frame).
    pub chunk: Option<u64>,
    /// `--async` (3.14+): every record then carries the task the thread runs, with what
    /// names it and what it awaits.
    pub tasks: Option<TaskOffsets>,
}

/// Where the program finds the asyncio task a thread runs (offsets in the thread state) and
/// what it copies of it (offsets in the task object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskOffsets {
    pub running_loop: u64,
    pub running_task: u64,
    pub name: u64,
    pub coro: u64,
    pub awaited_by: u64,
}

/// Where the program finds whether a thread holds the GIL, read with each chain, and whether
/// a thread leaving its CPU waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GilAt {
    /// Not known: every record says it neither holds nor waits.
    #[default]
    NotAsked,
    /// The thread's own `int`s (3.15+), nonzero while it holds the GIL (`holds_gil`) and
    /// while it waits to take it (`gil_requested`; 0: none).
    OwnFlags { holds: u64, requested: u64 },
    /// The GIL's `locked` `int` and its holder's thread-state pointer: the thread holds it
    /// when it is locked and the holder is the thread's state. A thread waiting for it sleeps
    /// in futex(2) on a word at most `GIL_WAIT_SPAN` bytes past `locked`.
    Holder { locked: u64, holder: u64 },
}

/// A watched thread as the program's `threads` map holds it (`struct thread_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ThreadInfo {
    pid: u32,
    pad: u32,
    tstate: u64,
    first: u64,
    second: u64,
    previous: u64,
    code: u64,
    code_tag_mask: u64,
    fingerprint_at: u64,
    fingerprint_bytes: u64,
    /// The hash of the chain last sent as the thread left its CPU (the switch program's; 0
    /// when watched).
    last_chain: u64,
    instr: u64,
    root_cframe: u64,
    /// The GIL's `locked` word (0: not asked) and holder pointer (0: the word is the
    /// thread's own), see [`GilAt`].
    gil_locked: u64,
    gil_holder: u64,
    /// See [`CaptureLayout::chunk`] (0: none).
    chunk: u64,
    /// The program's: when the thread was last switched in (0 when watched).
    switched_in_at: u64,
    /// See [`CaptureLayout::tasks`] (all 0: not asked).
    running_loop: u64,
    running_task: u64,
    task_name: u64,
    task_coro: u64,
    task_awaited_by: u64,
    /// The thread's own `gil_requested` (0: none), see [`GilAt::OwnFlags`].
    gil_requested: u64,
    /// See [`CollectorAt`] (0: not asked, none).
    gc_collecting: u64,
    gc_frame: u64,
}

/// Where the program finds whether a thread's interpreter collects garbage, read with each
/// chain: its `gc.collecting` (an `int`) and (3.15+) `gc.frame`, the frame that started the
/// collection (0: not asked, none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CollectorAt {
    pub collecting: u64,
    pub frame: u64,
}

// SAFETY: two u32 then twenty-three u64 fields, `repr(C)`, no padding: every bit pattern is a valid value, which
// is what `Pod` asks of types copied to and from BPF maps.
unsafe impl Pod for ThreadInfo {}

impl ThreadInfo {
    /// Thread of process `pid` whose thread state is at `tstate`, its chain copied as
    /// `layout` says and its hold on the GIL told as `gil` says (the program's own fields
    /// start at 0).
    pub fn new(
        pid: u32,
        tstate: u64,
        layout: CaptureLayout,
        gil: GilAt,
        collector: CollectorAt,
    ) -> ThreadInfo {
        ThreadInfo {
            pid,
            pad: 0,
            tstate,
            first: layout.first,
            second: layout.in_cframe.unwrap_or(NO_INDIRECTION),
            previous: layout.previous,
            code: layout.code,
            code_tag_mask: layout.code_tag_mask,
            fingerprint_at: layout.fingerprint_at,
            fingerprint_bytes: layout.fingerprint_bytes,
            last_chain: 0,
            instr: layout.instr,
            root_cframe: layout.root_cframe,
            gil_locked: match gil {
                GilAt::NotAsked => 0,
                GilAt::OwnFlags { holds: at, .. } | GilAt::Holder { locked: at, .. } => at,
            },
            gil_holder: match gil {
                GilAt::Holder { holder, .. } => holder,
                _ => 0,
            },
            chunk: layout.chunk.unwrap_or(0),
            switched_in_at: 0,
            running_loop: layout.tasks.map_or(0, |t| t.running_loop),
            running_task: layout.tasks.map_or(0, |t| t.running_task),
            task_name: layout.tasks.map_or(0, |t| t.name),
            task_coro: layout.tasks.map_or(0, |t| t.coro),
            task_awaited_by: layout.tasks.map_or(0, |t| t.awaited_by),
            gil_requested: match gil {
                GilAt::OwnFlags { requested, .. } => requested,
                _ => 0,
            },
            gc_collecting: collector.collecting,
            gc_frame: collector.frame,
        }
    }
}

impl CaptureLayout {
    /// That the program can follow this layout (it checks again, and reads nothing where a
    /// value is out of its bounds).
    pub fn check(&self) -> Result<(), String> {
        let in_frame = (FRAME_BYTES - 8) as u64;
        if self.previous > in_frame || self.code > in_frame || self.instr > in_frame {
            return Err(format!(
                "`previous` at {}, the code object at {} or the instruction pointer at {}, \
                 past the {FRAME_BYTES} bytes copied of a frame",
                self.previous, self.code, self.instr
            ));
        }
        if let Some(t) = self.tasks {
            if t.running_loop == 0
                || t.running_task == 0
                || t.running_loop > 65536
                || t.running_task > 65536
            {
                return Err(format!(
                    "asyncio's running loop at {} or task at {}, outside a thread state",
                    t.running_loop, t.running_task
                ));
            }
            if t.name == 0 || [t.name, t.coro, t.awaited_by].iter().any(|&o| o >= 4096) {
                return Err(format!(
                    "a task's name at {}, coroutine at {} or awaiter at {}, outside a task",
                    t.name, t.coro, t.awaited_by
                ));
            }
        }
        if self.fingerprint_bytes == 0
            || self.fingerprint_bytes % 8 != 0
            || self.fingerprint_bytes > MAX_FINGERPRINT_BYTES
        {
            return Err(format!(
                "a code object's fingerprint of {} bytes (whole words, at most \
                 {MAX_FINGERPRINT_BYTES})",
                self.fingerprint_bytes
            ));
        }
        Ok(())
    }
}

/// The frames of a record's [`CapturedRecord::frame_bytes`], newest first.
pub fn frames_in(bytes: &[u8]) -> impl Iterator<Item = CapturedFrame<'_>> + '_ {
    bytes.chunks_exact(FRAME_COPY_BYTES).map(|c| {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[at..at + 8]);
            u64::from_le_bytes(w)
        };
        CapturedFrame {
            addr: word(ADDR_AT),
            code_fingerprint: word(FINGERPRINT_AT),
            bytes: &c[BYTES_AT..],
        }
    })
}

/// One frame of a record.
#[derive(Debug, Clone, Copy)]
pub struct CapturedFrame<'a> {
    pub addr: u64,
    /// The fingerprint of the code object the frame named at the interrupt (over
    /// [`CaptureLayout`]'s bytes, as `cpython::objects::fingerprint` computes it); 0 when the
    /// frame names none or its bytes could not be read without a page fault.
    pub code_fingerprint: u64,
    /// Its first [`FRAME_BYTES`] bytes.
    pub bytes: &'a [u8],
}

/// One record of the ring: a thread's frame chain at one interrupt.
#[derive(Debug, Clone, Copy)]
pub struct CapturedRecord<'a> {
    pub pid: u32,
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds of the interrupt.
    pub time_ns: u64,
    flags: u16,
    switched_in_ns: u64,
    /// The asyncio task the thread ran, as copied with the chain (none, or not asked).
    pub task: Option<CapturedTask>,
    /// Its interpreter's collector ran: with the frame that started it (0: not known).
    pub collecting: Option<u64>,
    frames: &'a [u8],
}

/// The asyncio task a thread ran at the interrupt, copied with its chain (`struct task_copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapturedTask {
    pub addr: u64,
    /// Its name object (0: its bytes could not be copied).
    pub name: u64,
    /// Its coroutine and what it was awaited by (0: none).
    pub coro: u64,
    pub awaited_by: u64,
    /// The name object's first bytes.
    pub name_head: [u8; TASK_NAME_BYTES],
}

impl<'a> CapturedRecord<'a> {
    /// A record as the ring holds it (`struct record` of the program, with only the frames it
    /// holds); `None` when it is shorter than its head says.
    pub fn parse(bytes: &'a [u8]) -> Option<CapturedRecord<'a>> {
        let head = bytes.get(..HEAD_BYTES)?;
        let u32_at = |o: usize| Some(u32::from_le_bytes(head.get(o..o + 4)?.try_into().ok()?));
        let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
        let n = usize::from(u16_at(FRAMES_AT)?).min(MAX_FRAMES);
        let frames = bytes.get(HEAD_BYTES..HEAD_BYTES + n * FRAME_COPY_BYTES)?;
        Some(CapturedRecord {
            pid: u32_at(PID_AT)?,
            tid: u32_at(TID_AT)?,
            time_ns: u64::from_le_bytes(head.get(TIME_AT..TIME_AT + 8)?.try_into().ok()?),
            flags: u16_at(FLAGS_AT)?,
            switched_in_ns: u64::from_le_bytes(
                head.get(SWITCHED_IN_AT..SWITCHED_IN_AT + 8)?
                    .try_into()
                    .ok()?,
            ),
            task: {
                let t = head.get(TASK_AT..TASK_AT + TASK_COPY_BYTES)?;
                let word = |o: usize| Some(u64::from_le_bytes(t.get(o..o + 8)?.try_into().ok()?));
                match word(0)? {
                    0 => None,
                    addr => Some(CapturedTask {
                        addr,
                        name: word(TASK_NAME_AT)?,
                        coro: word(TASK_CORO_AT)?,
                        awaited_by: word(TASK_AWAITED_BY_AT)?,
                        name_head: t.get(TASK_NAME_HEAD_AT..)?.try_into().ok()?,
                    }),
                }
            },
            collecting: match u16_at(FLAGS_AT)? & FLAG_COLLECTING {
                0 => None,
                _ => Some(u64::from_le_bytes(
                    head.get(GC_FRAME_AT..GC_FRAME_AT + 8)?.try_into().ok()?,
                )),
            },
            frames,
        })
    }

    /// The frames, newest first.
    pub fn frames(&self) -> impl Iterator<Item = CapturedFrame<'a>> + 'a {
        frames_in(self.frames)
    }

    /// The frames as the ring holds them (for [`frames_in`] once copied out).
    pub fn frame_bytes(&self) -> &'a [u8] {
        self.frames
    }

    /// A thread of a watched process that is not watched itself: no frames (see the module
    /// documentation).
    pub fn unknown_thread(&self) -> bool {
        self.flags & FLAG_UNKNOWN_THREAD != 0
    }

    /// Copied as the thread left its CPU (its stack until it runs again), not at an
    /// interrupt.
    pub fn switched_out(&self) -> bool {
        self.flags & FLAG_SWITCHED_OUT != 0
    }

    /// Switched out with the chain last sent as the thread left its CPU (interrupts' chains
    /// do not count): no frames, the stack is that chain's.
    pub fn unchanged(&self) -> bool {
        self.flags & FLAG_UNCHANGED != 0
    }

    /// When the thread was last switched in (`CLOCK_MONOTONIC` nanoseconds; 0: not known,
    /// the capture not following threads off their CPU, or not since it was watched).
    pub fn switched_in_ns(&self) -> u64 {
        self.switched_in_ns
    }

    /// The thread held the GIL (as of the record; always false unless it was watched with
    /// [`GilAt`] other than `NotAsked`).
    pub fn holds_gil(&self) -> bool {
        self.flags & FLAG_HOLDS_GIL != 0
    }

    /// The thread left its CPU to wait for the GIL (only a switch-out record says so; always
    /// false unless it was watched with [`GilAt`] other than `NotAsked`).
    pub fn waits_gil(&self) -> bool {
        self.flags & FLAG_WAITS_GIL != 0
    }

    /// The chain is deeper than [`MAX_FRAMES`]: the oldest frames are missing.
    pub fn truncated(&self) -> bool {
        self.flags & FLAG_TRUNCATED != 0
    }

    /// Why the kernel could not copy the chain, if it could not: the pointer to the current
    /// frame or a frame was not readable without a page fault at the interrupt.
    pub fn unreadable(&self) -> Option<&'static str> {
        if self.flags & FLAG_POINTER_UNREADABLE != 0 {
            Some("the current-frame pointer was not resident at the interrupt")
        } else if self.flags & FLAG_FRAME_UNREADABLE != 0 {
            Some("a frame was not resident at the interrupt")
        } else if self.flags & FLAG_ENTERING != 0 {
            Some("an eval loop was being entered at the interrupt (its current frame not set)")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, tid: u32, flags: u16, frames: &[(u64, u8)]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(pid.to_le_bytes());
        v.extend(tid.to_le_bytes());
        v.extend(7u64.to_le_bytes());
        v.extend((frames.len() as u16).to_le_bytes());
        v.extend(flags.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend(5u64.to_le_bytes());
        // The task: at 9, named at 0x90 (its first bytes 3s), coroutine 0x91, no awaiter.
        v.extend(9u64.to_le_bytes());
        v.extend(0x90u64.to_le_bytes());
        v.extend(0x91u64.to_le_bytes());
        v.extend(0u64.to_le_bytes());
        v.extend([3u8; TASK_NAME_BYTES]);
        // The frame that started a collection (read with FLAG_COLLECTING only).
        v.extend(0x77u64.to_le_bytes());
        for &(addr, fill) in frames {
            v.extend(addr.to_le_bytes());
            v.extend((addr + 1).to_le_bytes());
            v.extend([fill; FRAME_BYTES]);
        }
        v
    }

    /// The program's constants and struct layouts, as a host C compiler lays out
    /// `bpf/capture.bpf.c` (the same LP64 rules as the BPF target): `NAME VALUE` lines.
    fn program_layout() -> std::collections::HashMap<String, u64> {
        let dir = std::env::temp_dir().join(format!("pyfleet-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/capture.bpf.c");
        let probe = dir.join("layout.c");
        let mut c = format!("#include <stdio.h>\n#include <stddef.h>\n#include \"{source}\"\n");
        c.push_str("#define SHOW(name, v) printf(\"%s %llu\\n\", name, (unsigned long long)(v))\n");
        c.push_str("#define AT(s, f) SHOW(#s \".\" #f, offsetof(struct s, f))\n");
        c.push_str("#define SIZE(s) SHOW(#s, sizeof(struct s))\n");
        c.push_str("#define CONST(n) SHOW(#n, n)\nint main(void) {\n");
        for line in [
            "CONST(MAX_FRAMES); CONST(FRAME_BYTES); CONST(MAX_FINGERPRINT_BYTES);",
            "CONST(MAX_THREADS); CONST(MAX_PROCESSES); CONST(NO_INDIRECTION);",
            "CONST(FLAG_POINTER_UNREADABLE); CONST(FLAG_FRAME_UNREADABLE);",
            "CONST(FLAG_TRUNCATED); CONST(FLAG_UNKNOWN_THREAD); CONST(FLAG_SWITCHED_OUT);",
            "CONST(FLAG_UNCHANGED); CONST(FLAG_ENTERING);",
            "CONST(FLAG_HOLDS_GIL); CONST(FLAG_WAITS_GIL); CONST(TASK_NAME_BYTES);",
            "CONST(GIL_WAIT_SPAN); AT(thread_info, gil_requested);",
            "AT(task_copy, name); AT(task_copy, coro); AT(task_copy, awaited_by);",
            "AT(task_copy, name_head); SIZE(task_copy);",
            "AT(thread_info, task_name); AT(thread_info, task_coro);",
            "AT(thread_info, task_awaited_by);",
            "AT(record, pid); AT(record, tid); AT(record, time); AT(record, frames);",
            "AT(record, flags); AT(record, switched_in); AT(record, task); AT(record, frame);",
            "AT(thread_info, switched_in_at);",
            "AT(frame_copy, addr); AT(frame_copy, code_fingerprint); AT(frame_copy, bytes);",
            "SIZE(frame_copy); SIZE(thread_info);",
            "AT(thread_info, pid); AT(thread_info, tstate); AT(thread_info, first);",
            "AT(thread_info, second); AT(thread_info, previous); AT(thread_info, code);",
            "AT(thread_info, code_tag_mask); AT(thread_info, fingerprint_at);",
            "AT(thread_info, fingerprint_bytes); AT(thread_info, last_chain);",
            "AT(thread_info, instr); AT(thread_info, root_cframe);",
            "AT(thread_info, gil_locked); AT(thread_info, gil_holder);",
            "AT(thread_info, chunk); CONST(CHUNK_HEAD);",
            "AT(thread_info, running_loop); AT(thread_info, running_task);",
            "CONST(FLAG_COLLECTING); AT(record, gc_frame);",
            "AT(thread_info, gc_collecting); AT(thread_info, gc_frame);",
        ] {
            c.push_str(line);
            c.push('\n');
        }
        c.push_str("return 0; }\n");
        std::fs::write(&probe, c).unwrap();
        let exe = dir.join("layout");
        let built = std::process::Command::new("cc")
            .arg("-w")
            .arg(&probe)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("cc (the host C compiler) runs");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (name, v) = l.split_once(' ').unwrap();
                (name.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_program_and_the_decoder_agree_on_layouts_and_constants() {
        let c = program_layout();
        let rust: &[(&str, u64)] = &[
            ("MAX_FRAMES", MAX_FRAMES as u64),
            ("FRAME_BYTES", FRAME_BYTES as u64),
            ("MAX_FINGERPRINT_BYTES", MAX_FINGERPRINT_BYTES),
            ("MAX_THREADS", MAX_WATCHED as u64),
            ("MAX_PROCESSES", MAX_WATCHED_PROCESSES as u64),
            ("NO_INDIRECTION", NO_INDIRECTION),
            (
                "FLAG_POINTER_UNREADABLE",
                u64::from(FLAG_POINTER_UNREADABLE),
            ),
            ("FLAG_FRAME_UNREADABLE", u64::from(FLAG_FRAME_UNREADABLE)),
            ("FLAG_TRUNCATED", u64::from(FLAG_TRUNCATED)),
            ("FLAG_UNKNOWN_THREAD", u64::from(FLAG_UNKNOWN_THREAD)),
            ("FLAG_SWITCHED_OUT", u64::from(FLAG_SWITCHED_OUT)),
            ("FLAG_UNCHANGED", u64::from(FLAG_UNCHANGED)),
            ("FLAG_ENTERING", u64::from(FLAG_ENTERING)),
            ("FLAG_HOLDS_GIL", u64::from(FLAG_HOLDS_GIL)),
            ("FLAG_WAITS_GIL", u64::from(FLAG_WAITS_GIL)),
            ("FLAG_COLLECTING", u64::from(FLAG_COLLECTING)),
            ("record.gc_frame", GC_FRAME_AT as u64),
            (
                "thread_info.gc_collecting",
                std::mem::offset_of!(ThreadInfo, gc_collecting) as u64,
            ),
            (
                "thread_info.gc_frame",
                std::mem::offset_of!(ThreadInfo, gc_frame) as u64,
            ),
            ("GIL_WAIT_SPAN", crate::cpython::layout::GIL_WAIT_SPAN),
            (
                "thread_info.gil_requested",
                std::mem::offset_of!(ThreadInfo, gil_requested) as u64,
            ),
            ("record.pid", PID_AT as u64),
            ("record.tid", TID_AT as u64),
            ("record.time", TIME_AT as u64),
            ("record.frames", FRAMES_AT as u64),
            ("record.flags", FLAGS_AT as u64),
            ("record.switched_in", SWITCHED_IN_AT as u64),
            ("record.task", TASK_AT as u64),
            ("TASK_NAME_BYTES", TASK_NAME_BYTES as u64),
            ("task_copy.name", TASK_NAME_AT as u64),
            ("task_copy.coro", TASK_CORO_AT as u64),
            ("task_copy.awaited_by", TASK_AWAITED_BY_AT as u64),
            ("task_copy.name_head", TASK_NAME_HEAD_AT as u64),
            ("task_copy", TASK_COPY_BYTES as u64),
            ("record.frame", HEAD_BYTES as u64),
            ("frame_copy.addr", ADDR_AT as u64),
            ("frame_copy.code_fingerprint", FINGERPRINT_AT as u64),
            ("frame_copy.bytes", BYTES_AT as u64),
            ("frame_copy", FRAME_COPY_BYTES as u64),
            ("thread_info", std::mem::size_of::<ThreadInfo>() as u64),
            (
                "thread_info.pid",
                std::mem::offset_of!(ThreadInfo, pid) as u64,
            ),
            (
                "thread_info.tstate",
                std::mem::offset_of!(ThreadInfo, tstate) as u64,
            ),
            (
                "thread_info.first",
                std::mem::offset_of!(ThreadInfo, first) as u64,
            ),
            (
                "thread_info.second",
                std::mem::offset_of!(ThreadInfo, second) as u64,
            ),
            (
                "thread_info.previous",
                std::mem::offset_of!(ThreadInfo, previous) as u64,
            ),
            (
                "thread_info.code",
                std::mem::offset_of!(ThreadInfo, code) as u64,
            ),
            (
                "thread_info.code_tag_mask",
                std::mem::offset_of!(ThreadInfo, code_tag_mask) as u64,
            ),
            (
                "thread_info.fingerprint_at",
                std::mem::offset_of!(ThreadInfo, fingerprint_at) as u64,
            ),
            (
                "thread_info.fingerprint_bytes",
                std::mem::offset_of!(ThreadInfo, fingerprint_bytes) as u64,
            ),
            (
                "thread_info.last_chain",
                std::mem::offset_of!(ThreadInfo, last_chain) as u64,
            ),
            (
                "thread_info.instr",
                std::mem::offset_of!(ThreadInfo, instr) as u64,
            ),
            (
                "thread_info.root_cframe",
                std::mem::offset_of!(ThreadInfo, root_cframe) as u64,
            ),
            (
                "thread_info.gil_locked",
                std::mem::offset_of!(ThreadInfo, gil_locked) as u64,
            ),
            (
                "thread_info.gil_holder",
                std::mem::offset_of!(ThreadInfo, gil_holder) as u64,
            ),
            (
                "thread_info.chunk",
                std::mem::offset_of!(ThreadInfo, chunk) as u64,
            ),
            (
                "thread_info.switched_in_at",
                std::mem::offset_of!(ThreadInfo, switched_in_at) as u64,
            ),
            (
                "thread_info.running_loop",
                std::mem::offset_of!(ThreadInfo, running_loop) as u64,
            ),
            (
                "thread_info.running_task",
                std::mem::offset_of!(ThreadInfo, running_task) as u64,
            ),
            (
                "thread_info.task_name",
                std::mem::offset_of!(ThreadInfo, task_name) as u64,
            ),
            (
                "thread_info.task_coro",
                std::mem::offset_of!(ThreadInfo, task_coro) as u64,
            ),
            (
                "thread_info.task_awaited_by",
                std::mem::offset_of!(ThreadInfo, task_awaited_by) as u64,
            ),
            ("CHUNK_HEAD", crate::cpython::layout::CHUNK_DATA),
        ];
        for (name, value) in rust {
            assert_eq!(
                c.get(*name),
                Some(value),
                "{name}: C says {:?}",
                c.get(*name)
            );
        }
        assert_eq!(
            c.len(),
            rust.len(),
            "a constant of the probe is not compared"
        );
    }

    #[test]
    fn records_parse_into_their_frames() {
        let bytes = record(10, 11, FLAG_TRUNCATED, &[(0x1000, 1), (0x2000, 2)]);
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert_eq!(
            (r.pid, r.tid, r.time_ns, r.switched_in_ns()),
            (10, 11, 7, 5)
        );
        assert_eq!(r.collecting, None);
        let collecting = record(10, 11, FLAG_COLLECTING, &[]);
        assert_eq!(
            CapturedRecord::parse(&collecting).map(|r| r.collecting),
            Some(Some(0x77))
        );
        let task = r.task.expect("a task");
        assert_eq!(
            (task.addr, task.name, task.coro, task.awaited_by),
            (9, 0x90, 0x91, 0)
        );
        assert!(task.name_head.iter().all(|&b| b == 3));
        assert!(r.truncated());
        assert_eq!(r.unreadable(), None);
        let frames: Vec<_> = r.frames().collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].addr, 0x2000);
        assert_eq!(frames[1].code_fingerprint, 0x2001);
        assert_eq!(frames[1].bytes.len(), FRAME_BYTES);
        assert!(frames[1].bytes.iter().all(|&b| b == 2));
    }

    #[test]
    fn a_layout_past_what_the_program_copies_is_refused() {
        let fits = CaptureLayout {
            first: 16,
            in_cframe: None,
            previous: 0,
            code: FRAME_BYTES as u64 - 8,
            instr: 56,
            root_cframe: 0,
            code_tag_mask: 1,
            fingerprint_at: 96,
            fingerprint_bytes: 32,
            chunk: Some(200),
            tasks: Some(TaskOffsets {
                running_loop: 0x360,
                running_task: 0x368,
                name: 0x40,
                coro: 0x48,
                awaited_by: 0x50,
            }),
        };
        assert!(fits.check().is_ok());
        let refused = [
            CaptureLayout {
                tasks: fits.tasks.map(|t| TaskOffsets {
                    running_task: 1 << 20,
                    ..t
                }),
                ..fits
            },
            CaptureLayout {
                tasks: fits.tasks.map(|t| TaskOffsets { coro: 4096, ..t }),
                ..fits
            },
            CaptureLayout {
                previous: FRAME_BYTES as u64 - 7,
                ..fits
            },
            CaptureLayout {
                code: FRAME_BYTES as u64,
                ..fits
            },
            CaptureLayout {
                instr: FRAME_BYTES as u64,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: 0,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: 20,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: MAX_FINGERPRINT_BYTES + 8,
                ..fits
            },
        ];
        for layout in refused {
            assert!(layout.check().is_err(), "{layout:?}");
        }
    }

    #[test]
    fn a_short_record_is_refused_not_read_past() {
        let bytes = record(1, 2, FLAG_FRAME_UNREADABLE, &[(0x1000, 1), (0x2000, 2)]);
        assert!(CapturedRecord::parse(&bytes[..bytes.len() - 1]).is_none());
        assert!(CapturedRecord::parse(&bytes[..10]).is_none());
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert!(r.unreadable().is_some());
    }

    #[test]
    fn a_record_of_a_thread_not_watched_has_no_frames_and_says_so() {
        let bytes = record(1, 3, FLAG_UNKNOWN_THREAD, &[]);
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert!(r.unknown_thread());
        assert_eq!((r.pid, r.tid, r.frames().count()), (1, 3, 0));
        assert!(r.unreadable().is_none() && !r.truncated());
        let chain = record(1, 2, 0, &[(0x1000, 1)]);
        assert!(!CapturedRecord::parse(&chain)
            .expect("parses")
            .unknown_thread());
    }
}
