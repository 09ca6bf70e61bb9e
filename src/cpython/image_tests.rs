//! Unit tests on the in-memory image: `_Py_DebugOffsets` parsing and validation, and whole
//! walks over a synthetic 3.13-shaped runtime, sound and corrupted.

use super::debug_offsets::{self, DebugOffsets, FIELDS_313};
use super::layout::{Layout, Version};
use super::{Sampler, SamplerOptions, UnwindError};
use crate::binary::RuntimeLocation;
use crate::memory::{MemoryImage, RemoteMemory};
use std::path::PathBuf;

const V313: u64 = 0x030d_00f0;
const RUNTIME: u64 = 0x10_0000;
const HEAP: u64 = 0x20_0000;
const HEAP_SIZE: usize = 0x10_0000;

/// The debug-offsets values of the synthetic runtime (everything else is 0).
fn offsets() -> Vec<(&'static str, u64)> {
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
        ("unicode_object.size", 0x40),
        ("unicode_object.state", 0x20),
        ("unicode_object.length", 0x10),
        ("unicode_object.asciiobject_size", 0x28),
        ("bytes_object.size", 0x28),
        ("bytes_object.ob_size", 0x10),
        ("bytes_object.ob_sval", 0x20),
    ]
}

fn raw_offsets(values: &[(&str, u64)]) -> Vec<u8> {
    let mut raw = vec![0u8; FIELDS_313.len() * 8];
    raw[..8].copy_from_slice(b"xdebugpy");
    for (name, v) in values {
        let i = FIELDS_313.iter().position(|n| n == name).unwrap();
        raw[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    raw
}

fn layout() -> Layout {
    let d = DebugOffsets::parse(FIELDS_313, &raw_offsets(&offsets())).unwrap();
    debug_offsets::build(&d, Version::from_hex(V313)).unwrap()
}

/// Builds objects in a heap segment of an image.
struct Builder {
    heap: Vec<u8>,
    next: u64,
}

impl Builder {
    fn new() -> Self {
        Builder {
            heap: vec![0; HEAP_SIZE],
            next: HEAP,
        }
    }
    fn alloc(&mut self, size: usize) -> u64 {
        let at = self.next;
        self.next += (size as u64 + 15) & !15;
        at
    }
    fn put(&mut self, addr: u64, data: &[u8]) {
        let off = (addr - HEAP) as usize;
        self.heap[off..off + data.len()].copy_from_slice(data);
    }
    fn put_u64(&mut self, addr: u64, v: u64) {
        self.put(addr, &v.to_le_bytes());
    }
    /// A compact unicode object of the narrowest kind, as CPython makes them.
    fn string(&mut self, s: &str) -> u64 {
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
    fn bytes(&mut self, b: &[u8]) -> u64 {
        let at = self.alloc(0x20 + b.len() + 1);
        self.put_u64(at + 0x10, b.len() as u64);
        self.put(at + 0x20, b);
        at
    }
    /// A code object whose bytecode is `units` code units on consecutive lines from `first`.
    fn code(&mut self, name: &str, qualname: &str, file: &str, first: i32, units: u8) -> u64 {
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
    fn frame(&mut self, code: u64, unit: u64, previous: u64, owner: u8) -> u64 {
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
fn runtime() -> (MemoryImage, Vec<u64>) {
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

fn unwinder(img: MemoryImage) -> Sampler<MemoryImage> {
    unwinder_with(img, SamplerOptions::default())
}

fn unwinder_with(img: MemoryImage, opts: SamplerOptions) -> Sampler<MemoryImage> {
    let loc = RuntimeLocation {
        path: PathBuf::from("/synthetic"),
        bias: 0,
        runtime: RUNTIME,
        py_version: None,
        code_type: None,
        name_version: Some((3, 13)),
    };
    let layout = debug_offsets::layout(&img, RUNTIME, Version::from_hex(V313)).unwrap();
    assert_eq!(layout, self::layout());
    Sampler::new(0, img, layout, &loc, opts)
}

#[test]
fn the_interning_table_is_bounded() {
    let (img, _) = runtime();
    let opts = SamplerOptions {
        max_interned_stacks: 1,
        ..Default::default()
    };
    let mut u = unwinder_with(img, opts);
    let first: Vec<_> = u.sample().unwrap().iter().map(|t| t.stack).collect();
    let names = |u: &Sampler<MemoryImage>, ids: &[u32]| -> Vec<Vec<String>> {
        ids.iter()
            .map(|&id| {
                u.stacks()
                    .resolve(id)
                    .iter()
                    .map(|(c, l)| format!("{}:{l:?}", c.name))
                    .collect()
            })
            .collect()
    };
    let before = names(&u, &first);
    assert!(before.iter().all(|s| !s.is_empty()));
    // Two stacks are over the bound of one: the next sample starts a new table.
    let second: Vec<_> = u.sample().unwrap().iter().map(|t| t.stack).collect();
    assert_eq!(u.stats().table_resets, 1);
    assert!(first.iter().all(|id| !second.contains(id)), "ids reused");
    assert!(first
        .iter()
        .all(|&id| u.stacks().stack_frames(id).is_none()));
    assert_eq!(names(&u, &second), before, "same stacks after the reset");
}

#[test]
fn walks_a_synthetic_runtime() {
    let (img, _) = runtime();
    let mut u = unwinder(img);
    let interps = u.snapshot().unwrap();
    assert_eq!(interps.len(), 1);
    assert_eq!(interps[0].id, 0);
    let threads = &interps[0].threads;
    // Oldest first: the list head is the newest thread.
    assert_eq!(
        threads.iter().map(|t| t.thread_id).collect::<Vec<_>>(),
        [222, 111]
    );
    assert!(threads[0].holds_gil && !threads[1].holds_gil);
    let frames: Vec<(&str, &str, &str, Option<i32>)> = threads[1]
        .frames
        .iter()
        .map(|f| {
            (
                f.code.name.as_str(),
                f.code.qualname.as_str(),
                f.code.filename.as_str(),
                f.line,
            )
        })
        .collect();
    assert_eq!(
        frames,
        [
            ("𠀀𠀁", "𠀀𠀁", "/app/x.py", Some(2)),
            ("café", "Klass.café", "/app/módulo_名前.py", Some(105)),
            ("main", "main", "/app/main.py", Some(13)),
        ]
    );
    // A second dump resolves nothing new: the code objects are cached.
    let reads = u.memory().stats().reads();
    u.snapshot().unwrap();
    let again = u.memory().stats().reads() - reads;
    assert!(
        again < reads,
        "{again} reads the second time, {reads} the first"
    );
}

#[test]
fn rejects_bad_debug_offsets() {
    let parse = |vals: &[(&str, u64)]| {
        let d = DebugOffsets::parse(FIELDS_313, &raw_offsets(vals)).unwrap();
        debug_offsets::build(&d, Version::from_hex(V313))
    };
    let mut vals = offsets();
    assert!(parse(&vals).is_ok());
    // An offset outside its struct.
    vals.retain(|(n, _)| *n != "thread_state.thread_id");
    vals.push(("thread_state.thread_id", 0x100));
    assert!(parse(&vals).unwrap_err().contains("thread_state.thread_id"));
    // A table for another version.
    let mut vals = offsets();
    vals[0] = ("version", 0x030e_00f0);
    assert!(parse(&vals).is_err());
    // An absurd struct size.
    let mut vals = offsets();
    vals.retain(|(n, _)| *n != "code_object.size");
    assert!(parse(&vals).is_err());
    // Believable sizes, but the fields read lie far apart: every thread would cost 1 MiB.
    let mut vals = offsets();
    vals.retain(|(n, _)| !matches!(*n, "thread_state.size" | "thread_state.native_thread_id"));
    vals.push(("thread_state.size", 0x20_0000));
    vals.push(("thread_state.native_thread_id", 0x10_0000));
    assert!(parse(&vals)
        .unwrap_err()
        .contains("thread state fields span"));
    // No cookie; truncated.
    let mut raw = raw_offsets(&offsets());
    raw[0] = b'X';
    assert!(DebugOffsets::parse(FIELDS_313, &raw).is_err());
    assert!(DebugOffsets::parse(FIELDS_313, &raw_offsets(&offsets())[..64]).is_err());
}

#[test]
fn a_chain_that_does_not_end_in_an_entry_shim_was_read_torn() {
    // As if the outermost Python frame's caller link were read while being rewritten: the
    // chain ends at a Python frame, so the stack would be truncated. An error, not a sample.
    let (mut img, frames) = runtime();
    img.poke(frames[3] + 0x08, &0u64.to_le_bytes());
    let mut u = unwinder(img);
    let err = u.snapshot().unwrap_err();
    assert!(
        matches!(&err, UnwindError::BadObject { addr, .. } if *addr == frames[3]),
        "{err}"
    );
    assert_eq!(err.kind(), "inconsistent");
    assert_eq!(u.stats().errors, 1);
}

#[test]
fn cycles_end_the_walk_with_an_error() {
    let (mut img, frames) = runtime();
    // The outermost frame points back at the innermost.
    img.poke(frames[3] + 0x08, &frames[0].to_le_bytes());
    let err = unwinder(img).snapshot().unwrap_err();
    // Found as a cycle, or by the depth bound: either way the walk ends with an error.
    assert!(
        matches!(
            err,
            UnwindError::Cycle("frame chain") | UnwindError::TooLong("frame chain", _)
        ),
        "{err}"
    );
}

/// The first interpreter's address (the runtime's `interpreters_head`).
fn first_interp(img: &MemoryImage) -> u64 {
    img.read_u64(RUNTIME + 0x800).unwrap()
}

#[test]
fn hostile_thread_and_interpreter_lists_end_with_an_error() {
    // 65,536 thread states in one list (empty threads: no current frame).
    let (mut img, _) = runtime();
    const TS: u64 = 0x4000_0000;
    let n = 1u64 << 16;
    let mut states = vec![0u8; (n * 0x100) as usize];
    for i in 0..n {
        let next = if i + 1 < n { TS + (i + 1) * 0x100 } else { 0 };
        let at = (i * 0x100) as usize + 0x08;
        states[at..at + 8].copy_from_slice(&next.to_le_bytes());
    }
    img.map(TS, states);
    let interp = first_interp(&img);
    img.poke(interp + 0x10, &TS.to_le_bytes());
    let err = unwinder(img).sample().unwrap_err();
    assert!(
        matches!(err, UnwindError::TooLong("thread lists", _)),
        "{err}"
    );
    assert_eq!(err.kind(), "cycle");

    // A second interpreter that lists the first one's threads.
    let (mut img, _) = runtime();
    let interp = first_interp(&img);
    let second = 0x5000_0000u64;
    let mut state = vec![0u8; 0x200];
    state[0x08..0x10].copy_from_slice(&1u64.to_le_bytes()); // id 1
    let threads = img.read_u64(interp + 0x10).unwrap();
    state[0x10..0x18].copy_from_slice(&threads.to_le_bytes());
    img.map(second, state);
    img.poke(interp, &second.to_le_bytes()); // next interpreter
    let err = unwinder(img).sample().unwrap_err();
    assert!(matches!(err, UnwindError::Cycle("thread list")), "{err}");

    // An interpreter list that comes back to its start.
    let (mut img, _) = runtime();
    let interp = first_interp(&img);
    img.poke(interp, &interp.to_le_bytes());
    let err = unwinder(img).sample().unwrap_err();
    assert!(
        matches!(err, UnwindError::Cycle("interpreter list")),
        "{err}"
    );
}

#[test]
fn garbage_strings_and_pointers_are_errors() {
    let (mut img, frames) = runtime();
    let code = img.read_u64(frames[1]).unwrap();
    let name = img.read_u64(code + 0x78).unwrap();
    img.poke(name + 0x10, &u64::MAX.to_le_bytes()); // absurd length
    assert!(matches!(
        unwinder(img).snapshot().unwrap_err(),
        UnwindError::BadObject { .. }
    ));

    let (mut img, frames) = runtime();
    img.poke(frames[2] + 0x08, &0xdead_0000u64.to_le_bytes()); // unmapped previous
    assert!(matches!(
        unwinder(img).snapshot().unwrap_err(),
        UnwindError::Memory(_)
    ));
}

#[test]
fn random_corruption_never_panics() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..300 {
        let (mut img, frames) = runtime();
        for _ in 0..8 {
            // Half the time hit the frames and the objects near them, else anywhere.
            let at = if rand() % 2 == 0 {
                frames[(rand() % 4) as usize] + rand() % 0x50
            } else {
                // The objects sit in the first few KiB of the heap.
                HEAP + rand() % 0x2000
            };
            img.poke(at, &[rand() as u8]);
        }
        let _ = unwinder(img).snapshot();
    }
}
