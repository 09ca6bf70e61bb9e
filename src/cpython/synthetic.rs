//! A synthetic 3.13-shaped runtime in an in-memory image: `_Py_DebugOffsets`, one
//! interpreter, two threads, frames and code objects built the way CPython lays them out.
//! For the unit tests (`image_tests`) and the fuzzer (`fuzz/`, built with `--cfg fuzzing`).

use super::debug_offsets::{self, DebugOffsets, FIELDS_313};
use super::layout::{Layout, Version};
use super::objects::fingerprint;
use super::{Unwinder, UnwinderOptions};
use crate::binary::RuntimeLocation;
use crate::memory::capture_records::{CaptureLayout, FRAME_BYTES, MAX_FRAMES, TASK_NAME_BYTES};
use crate::memory::{MemoryImage, RemoteMemory};
use std::path::PathBuf;

pub const V313: u64 = 0x030d_00f0;
pub const RUNTIME: u64 = 0x10_0000;
pub const HEAP: u64 = 0x20_0000;
pub const HEAP_SIZE: usize = 0x10_0000;

/// The debug-offsets values of the synthetic runtime (everything else is 0).
pub fn offsets() -> Vec<(&'static str, u64)> {
    vec![
        ("version", V313),
        ("runtime_state.size", 0x1000),
        ("runtime_state.interpreters_head", 0x800),
        ("interpreter_state.size", 0x200),
        ("interpreter_state.id", 0x08),
        ("interpreter_state.next", 0x00),
        ("interpreter_state.threads_head", 0x10),
        ("interpreter_state.ceval_gil", 0x40),
        ("interpreter_state.gil_runtime_state", 0x50),
        ("interpreter_state.gil_runtime_state_locked", 0x58),
        ("interpreter_state.gil_runtime_state_holder", 0x60),
        ("thread_state.size", 0x100),
        ("thread_state.next", 0x08),
        ("thread_state.interp", 0x10),
        ("thread_state.current_frame", 0x20),
        ("thread_state.thread_id", 0x28),
        ("thread_state.native_thread_id", 0x30),
        ("thread_state.datastack_chunk", 0x38),
        ("interpreter_frame.size", 0x50),
        ("interpreter_frame.previous", 0x08),
        ("interpreter_frame.executable", 0x00),
        ("interpreter_frame.instr_ptr", 0x38),
        ("interpreter_frame.localsplus", 0x48),
        ("interpreter_frame.owner", 0x46),
        ("code_object.size", 0xd0),
        ("code_object.filename", 0x70),
        ("code_object.name", 0x78),
        ("code_object.qualname", 0x80),
        ("code_object.linetable", 0x88),
        ("code_object.firstlineno", 0x44),
        ("code_object.co_code_adaptive", 0xc0),
        ("code_object.localsplusnames", 0x60),
        ("code_object.localspluskinds", 0x68),
        ("interpreter_state.gc", 0x100),
        ("gc.size", 0x40),
        ("gc.collecting", 0x10),
        ("tuple_object.size", 0x20),
        ("tuple_object.ob_item", 0x18),
        ("unicode_object.size", 0x40),
        ("unicode_object.state", 0x20),
        ("unicode_object.length", 0x10),
        ("unicode_object.asciiobject_size", 0x28),
        ("bytes_object.size", 0x28),
        ("bytes_object.ob_size", 0x10),
        ("bytes_object.ob_sval", 0x20),
    ]
}

pub fn raw_offsets(values: &[(&str, u64)]) -> Vec<u8> {
    let mut raw = vec![0u8; FIELDS_313.len() * 8];
    raw[..8].copy_from_slice(b"xdebugpy");
    for (name, v) in values {
        let i = FIELDS_313.iter().position(|n| n == name).unwrap();
        raw[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    raw
}

pub fn layout() -> Layout {
    let d = DebugOffsets::parse(FIELDS_313, &raw_offsets(&offsets())).unwrap();
    debug_offsets::build(&d, Version::from_hex(V313)).unwrap()
}

/// Builds objects in a heap segment of an image.
pub struct Builder {
    heap: Vec<u8>,
    next: u64,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            heap: vec![0; HEAP_SIZE],
            next: HEAP,
        }
    }
    pub fn alloc(&mut self, size: usize) -> u64 {
        let at = self.next;
        self.next += (size as u64 + 15) & !15;
        at
    }
    pub fn put(&mut self, addr: u64, data: &[u8]) {
        let off = (addr - HEAP) as usize;
        self.heap[off..off + data.len()].copy_from_slice(data);
    }
    pub fn put_u64(&mut self, addr: u64, v: u64) {
        self.put(addr, &v.to_le_bytes());
    }
    /// A compact unicode object of the narrowest kind, as CPython makes them.
    pub fn string(&mut self, s: &str) -> u64 {
        let max = s.chars().map(u32::from).max().unwrap_or(0);
        let (kind, ascii) = match max {
            0..=0x7f => (1u32, true),
            0x80..=0xff => (1, false),
            0x100..=0xffff => (2, false),
            _ => (4, false),
        };
        let data: Vec<u8> = match kind {
            1 => s.chars().map(|c| c as u8).collect(),
            2 => s.encode_utf16().flat_map(u16::to_le_bytes).collect(),
            _ => s.chars().flat_map(|c| u32::from(c).to_le_bytes()).collect(),
        };
        let header = if ascii { 0x28 } else { 0x38 };
        let at = self.alloc(header + data.len() + 4);
        self.put_u64(at + 0x10, s.chars().count() as u64);
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        self.put(at + 0x20, &state.to_le_bytes());
        self.put(at + header as u64, &data);
        at
    }
    pub fn bytes(&mut self, b: &[u8]) -> u64 {
        let at = self.alloc(0x20 + b.len() + 1);
        self.put_u64(at + 0x10, b.len() as u64);
        self.put(at + 0x20, b);
        at
    }
    /// A code object whose bytecode is `units` code units on consecutive lines from `first`.
    pub fn code(&mut self, name: &str, qualname: &str, file: &str, first: i32, units: u8) -> u64 {
        // One one-line entry per unit: code 11 (line + 1), except the first on `first`.
        let mut table = vec![0x80 | (10 << 3), 0, 0];
        for _ in 1..units {
            table.extend([0x80 | (11 << 3), 0, 0]);
        }
        let (n, q, f, t) = (
            self.string(name),
            self.string(qualname),
            self.string(file),
            self.bytes(&table),
        );
        let at = self.alloc(0xc0 + 2 * usize::from(units));
        self.put_u64(at + 0x78, n);
        self.put_u64(at + 0x80, q);
        self.put_u64(at + 0x70, f);
        self.put_u64(at + 0x88, t);
        self.put(at + 0x44, &first.to_le_bytes());
        at
    }
    /// A frame executing unit `unit` of `code`.
    pub fn frame(&mut self, code: u64, unit: u64, previous: u64, owner: u8) -> u64 {
        let at = self.alloc(0x50);
        self.put_u64(at, code);
        self.put_u64(at + 0x08, previous);
        self.put_u64(at + 0x38, code + 0xc0 + 2 * unit);
        self.put(at + 0x46, &[owner]);
        at
    }
}

/// A runtime with one interpreter (id 0) and two threads; returns the image and the frames of
/// the first thread (innermost first) for corruption tests.
pub fn runtime() -> (MemoryImage, Vec<u64>) {
    let mut b = Builder::new();
    let outer = b.code("main", "main", "/app/main.py", 10, 4);
    let inner = b.code("café", "Klass.café", "/app/módulo_名前.py", 100, 8);
    let deep = b.code("𠀀𠀁", "𠀀𠀁", "/app/x.py", 1, 2);
    // Every thread's chain ends in the entry shim the interpreter pushes (3.12+).
    let base = b.frame(outer, 0, 0, 3);
    let f3 = b.frame(outer, 3, base, 0);
    let shim = b.frame(outer, 0, f3, 3); // FRAME_OWNED_BY_CSTACK: skipped
    let f2 = b.frame(inner, 5, shim, 0);
    let f1 = b.frame(deep, 1, f2, 1);
    let g_base = b.frame(outer, 0, 0, 3);
    let g = b.frame(outer, 0, g_base, 0);

    let interp = b.alloc(0x200);
    let (t1, t2) = (b.alloc(0x100), b.alloc(0x100));
    for (t, next, frame, tid) in [(t1, t2, f1, 111u64), (t2, 0, g, 222)] {
        b.put_u64(t + 0x08, next);
        b.put_u64(t + 0x10, interp);
        b.put_u64(t + 0x20, frame);
        b.put_u64(t + 0x28, tid);
        b.put_u64(t + 0x30, tid + 1);
    }
    b.put_u64(interp + 0x10, t1);
    b.put_u64(interp + 0x40, interp + 0x50); // ceval.gil -> own _gil
    b.put(interp + 0x58, &1u32.to_le_bytes()); // locked
    b.put_u64(interp + 0x60, t2); // held by the second thread

    let mut rt = raw_offsets(&offsets());
    rt.resize(0x1000, 0);
    rt[0x800..0x808].copy_from_slice(&interp.to_le_bytes());
    let mut img = MemoryImage::new();
    img.map(RUNTIME, rt);
    img.map(HEAP, b.heap);
    (img, vec![f1, f2, shim, f3])
}

pub fn unwinder(img: MemoryImage) -> Unwinder<MemoryImage> {
    unwinder_with(img, UnwinderOptions::default())
}

pub fn unwinder_with(img: MemoryImage, opts: UnwinderOptions) -> Unwinder<MemoryImage> {
    let loc = RuntimeLocation {
        path: PathBuf::from("/synthetic"),
        bias: 0,
        runtime: RUNTIME,
        py_version: None,
        code_type: None,
        builtin_types: Default::default(),
        name_version: Some((3, 13)),
    };
    let layout = debug_offsets::layout(&img, RUNTIME, Version::from_hex(V313), FIELDS_313).unwrap();
    assert_eq!(layout, self::layout());
    Unwinder::new(0, img, layout, &loc, opts)
}

/// The ring record the kernel capture would send at an interrupt of the thread whose state is
/// at `tstate`: a model of `bpf/capture.bpf.c` over the image (the chain followed from the
/// current-frame pointer as `layout` says, each frame's first bytes and its code object's
/// fingerprint), encoded as the ring holds it (`capture_records::CapturedRecord::parse`).
pub fn captured_record(
    img: &MemoryImage,
    layout: CaptureLayout,
    pid: u32,
    tid: u32,
    tstate: u64,
) -> Vec<u8> {
    let word = |addr: u64| {
        let mut w = [0u8; 8];
        img.read(addr, &mut w).map(|()| u64::from_le_bytes(w)).ok()
    };
    let mut at = tstate + layout.first;
    if let Some(second) = layout.in_cframe {
        at = word(at).unwrap_or(0) + second;
    }
    let mut frame = word(at).unwrap_or(0);
    let mut frames = Vec::new();
    let mut n: u16 = 0;
    while frame != 0 && usize::from(n) < MAX_FRAMES {
        let mut bytes = [0u8; FRAME_BYTES];
        if img.read(frame, &mut bytes).is_err() {
            break;
        }
        let at_word = |o: u64| {
            let o = o as usize;
            u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]))
        };
        let code = at_word(layout.code) & !layout.code_tag_mask;
        let mut span = vec![0u8; layout.fingerprint_bytes as usize];
        let fp = match code != 0 && img.read(code + layout.fingerprint_at, &mut span).is_ok() {
            true => fingerprint(&span),
            false => 0,
        };
        frames.extend(frame.to_le_bytes());
        frames.extend(fp.to_le_bytes());
        frames.extend(bytes);
        n += 1;
        frame = at_word(layout.previous);
    }
    // The head: pid, tid, time, frames, flags, padding, last switch-in (not known), task,
    // the frame that started a collection.
    let mut record = Vec::with_capacity(32 + frames.len());
    record.extend(pid.to_le_bytes());
    record.extend(tid.to_le_bytes());
    record.extend(0u64.to_le_bytes());
    record.extend(n.to_le_bytes());
    record.extend(0u16.to_le_bytes());
    record.extend(0u32.to_le_bytes());
    record.extend(0u64.to_le_bytes());
    // No asyncio task (its copy is zeros), no collection.
    record.extend([0u8; 32 + TASK_NAME_BYTES]);
    record.extend(0u64.to_le_bytes());
    record.extend(frames);
    record
}
