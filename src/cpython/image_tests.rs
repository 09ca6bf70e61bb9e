//! Unit tests on the in-memory image: `_Py_DebugOffsets` parsing and validation, and whole
//! walks over a synthetic 3.13-shaped runtime, sound and corrupted.

use super::debug_offsets::{self, DebugOffsets, FIELDS_313};
use super::layout::Version;
use super::synthetic::*;
use super::{UnwindError, Unwinder, UnwinderOptions};
use crate::memory::{MemoryImage, RemoteMemory};

#[test]
fn the_interning_table_is_bounded() {
    let (img, _) = runtime();
    let opts = UnwinderOptions {
        max_interned_stacks: 1,
        ..Default::default()
    };
    let mut u = unwinder_with(img, opts);
    let first: Vec<_> = u.sample().unwrap().iter().map(|t| t.stack).collect();
    let names = |u: &Unwinder<MemoryImage>, ids: &[u32]| -> Vec<Vec<String>> {
        ids.iter()
            .map(|&id| {
                u.stacks()
                    .resolve(id)
                    .into_iter()
                    .flatten()
                    .map(|f| format!("{}:{:?}", f.function.name, f.line))
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
                &*f.function.name,
                &*f.function.qualname,
                &*f.function.filename,
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
    // Found by fuzz/fuzz_targets/debug_offsets.rs: a size that overflows when the compact
    // header's extra bytes are added to it.
    let mut vals = offsets();
    vals.retain(|(n, _)| *n != "unicode_object.asciiobject_size");
    vals.push(("unicode_object.asciiobject_size", u64::MAX));
    assert!(parse(&vals).is_err());
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
    let (img, frames) = runtime();
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
    let (img, frames) = runtime();
    // The outermost frame points back at the innermost.
    img.poke(frames[3] + 0x08, &frames[0].to_le_bytes());
    let err = unwinder(img).snapshot().unwrap_err();
    // Found as a cycle, by the depth bound, or by the bound on frames outside a data stack
    // (this image has none): either way the walk ends with an error.
    assert!(
        matches!(
            err,
            UnwindError::Cycle("frame chain")
                | UnwindError::TooLong("frame chain", _)
                | UnwindError::Budget("frames outside the data stack")
        ),
        "{err}"
    );
}

/// The first interpreter's address (the runtime's `interpreters_head`).
fn first_interp(img: &MemoryImage) -> u64 {
    img.read_u64(RUNTIME + 0x800).unwrap()
}

/// Makes the first interpreter's thread list `n` thread states with no current frame.
fn empty_threads(img: &mut MemoryImage, n: u64) {
    const TS: u64 = 0x4000_0000;
    let interp = first_interp(img);
    let mut states = vec![0u8; (n * 0x100) as usize];
    for i in 0..n {
        let next = if i + 1 < n { TS + (i + 1) * 0x100 } else { 0 };
        let at = (i * 0x100) as usize;
        states[at + 0x08..at + 0x10].copy_from_slice(&next.to_le_bytes());
        states[at + 0x10..at + 0x18].copy_from_slice(&interp.to_le_bytes());
    }
    img.map(TS, states);
    img.poke(interp + 0x10, &TS.to_le_bytes());
}

#[test]
fn hostile_thread_and_interpreter_lists_end_with_an_error() {
    // 65,536 thread states in one list.
    let (mut img, _) = runtime();
    empty_threads(&mut img, 1 << 16);
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
    let (img, _) = runtime();
    let interp = first_interp(&img);
    img.poke(interp, &interp.to_le_bytes());
    let err = unwinder(img).sample().unwrap_err();
    assert!(
        matches!(err, UnwindError::Cycle("interpreter list")),
        "{err}"
    );
}

#[test]
fn a_thread_state_of_another_interpreter_is_not_believed() {
    // The list's second thread state names another interpreter: memory that is not (or no
    // longer) a thread state of this one. Nothing of it is believed.
    let (img, _) = runtime();
    let first = img.read_u64(first_interp(&img) + 0x10).unwrap();
    let second = img.read_u64(first + 0x08).unwrap();
    img.poke(second + 0x10, &0x5000_0000u64.to_le_bytes());
    let mut u = unwinder(img);
    let err = u.sample().unwrap_err();
    assert!(
        matches!(err, UnwindError::BadObject { addr, .. } if addr == second),
        "{err}"
    );
    assert_eq!(err.kind(), "inconsistent");
}

#[test]
fn a_slow_target_costs_a_sample_its_deadline_at_most() {
    // 2,000 thread states read one by one at 1 ms a read: two seconds without a deadline.
    let (mut img, _) = runtime();
    empty_threads(&mut img, 2_000);
    img.set_read_delay(std::time::Duration::from_millis(1));
    let mut u = unwinder(img);
    let start = std::time::Instant::now();
    let err = u.sample().unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, UnwindError::Budget("time for one sample")),
        "{err}"
    );
    // The deadline (250 ms) and the reads of the 64 threads between two checks: well under
    // the two seconds the whole list takes.
    assert!(
        took < std::time::Duration::from_millis(1000),
        "took {took:?}"
    );
}

#[test]
fn a_sample_has_a_budget() {
    // Five threads of 60,000 frames each, each thread under the depth bound: over the bound
    // on frames read outside a data stack (the synthetic image has none), and together over
    // the sample's frame budget.
    let (mut img, frames) = runtime();
    let code = img.read_u64(frames[0]).unwrap();
    const FRAMES: u64 = 0x6000_0000;
    const STATES: u64 = 0x7000_0000;
    let (threads, depth) = (5u64, 60_000u64);
    let mut mem = vec![0u8; (threads * depth * 0x50) as usize];
    let mut states = vec![0u8; (threads * 0x100) as usize];
    let interp = first_interp(&img);
    for t in 0..threads {
        for i in 0..depth {
            let at = FRAMES + (t * depth + i) * 0x50;
            let off = (at - FRAMES) as usize;
            let previous = if i + 1 < depth { at + 0x50 } else { 0 };
            // The outermost frame is the entry shim (owner 3).
            let owner = if i + 1 < depth { 0u8 } else { 3 };
            mem[off..off + 8].copy_from_slice(&code.to_le_bytes());
            mem[off + 8..off + 16].copy_from_slice(&previous.to_le_bytes());
            mem[off + 0x38..off + 0x40].copy_from_slice(&(code + 0xc0).to_le_bytes());
            mem[off + 0x46] = owner;
        }
        let ts = (t * 0x100) as usize;
        let next = if t + 1 < threads {
            STATES + (t + 1) * 0x100
        } else {
            0
        };
        states[ts + 0x08..ts + 0x10].copy_from_slice(&next.to_le_bytes());
        states[ts + 0x10..ts + 0x18].copy_from_slice(&interp.to_le_bytes());
        let top = FRAMES + t * depth * 0x50;
        states[ts + 0x20..ts + 0x28].copy_from_slice(&top.to_le_bytes());
    }
    img.map(FRAMES, mem);
    img.map(STATES, states);
    img.poke(interp + 0x10, &STATES.to_le_bytes());
    let err = unwinder(img).sample().unwrap_err();
    assert!(matches!(err, UnwindError::Budget(_)), "{err}");
    assert_eq!(err.kind(), "budget");
}

#[test]
fn garbage_strings_and_pointers_are_errors() {
    let (img, frames) = runtime();
    let code = img.read_u64(frames[1]).unwrap();
    let name = img.read_u64(code + 0x78).unwrap();
    img.poke(name + 0x10, &u64::MAX.to_le_bytes()); // absurd length
    assert!(matches!(
        unwinder(img).snapshot().unwrap_err(),
        UnwindError::BadObject { .. }
    ));

    let (img, frames) = runtime();
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
        let (img, frames) = runtime();
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

#[test]
fn a_captured_chain_decodes_to_the_stack_a_read_finds() {
    use crate::memory::capture_records::CapturedRecord;
    let (img, _) = runtime();
    let mut u = unwinder(img);
    let read: Vec<_> = u.sample().unwrap().to_vec();
    let threads = u.captured_threads();
    assert_eq!(threads.len(), 2);
    for t in threads {
        let bytes = captured_record(u.memory(), u.capture_layout(), 0, t.tid as u32, t.tstate);
        let record = CapturedRecord::parse(&bytes).expect("a whole record");
        let captured = u
            .sample_captured(t, record.frames(), record.truncated(), None, false)
            .expect("decodes");
        let same = read
            .iter()
            .find(|s| s.thread_id == captured.thread_id)
            .expect("the thread was read");
        assert_eq!(captured.stack, same.stack, "thread {}", t.tid);
        // Any frame cut off the end is a chain that stops early: a counted failure.
        let cut = &bytes[..bytes.len() - (16 + crate::memory::capture_records::FRAME_BYTES)];
        let mut head = cut.to_vec();
        let frames = u16::from_le_bytes([head[16], head[17]]) - 1;
        head[16..18].copy_from_slice(&frames.to_le_bytes());
        let record = CapturedRecord::parse(&head).expect("a whole record");
        assert!(u
            .sample_captured(t, record.frames(), false, None, false)
            .is_err());
    }
}

#[test]
fn a_chain_captured_while_the_collector_ran_shows_gc_above_the_frame_that_started_it() {
    use crate::memory::capture_records::CapturedRecord;
    let (img, _) = runtime();
    let mut u = unwinder(img);
    let read: Vec<_> = u.sample().unwrap().to_vec();
    let t = u.captured_threads()[0];
    let mut bytes = captured_record(u.memory(), u.capture_layout(), 0, t.tid as u32, t.tstate);
    let chain: Vec<u64> = CapturedRecord::parse(&bytes)
        .expect("a whole record")
        .frames()
        .map(|f| f.addr)
        .collect();
    let plain = read
        .iter()
        .find(|s| s.native_thread_id == t.tid as u64)
        .expect("the thread was read")
        .stack;
    let names = |u: &Unwinder<MemoryImage>, stack| -> Vec<String> {
        u.stacks()
            .resolve(stack)
            .into_iter()
            .flatten()
            .map(|f| f.function.name.to_string())
            .collect()
    };
    let before = names(&u, plain);
    assert!(before.len() >= 2, "{before:?}");
    // FLAG_COLLECTING, and the frame that started it: the thread's second frame (its first
    // two are Python functions').
    bytes[18..20].copy_from_slice(&1024u16.to_le_bytes());
    let started = chain[1];
    let gc_at = 32 + 32 + crate::memory::capture_records::TASK_NAME_BYTES;
    bytes[gc_at..gc_at + 8].copy_from_slice(&started.to_le_bytes());
    let record = CapturedRecord::parse(&bytes).expect("a whole record");
    assert_eq!(record.collecting, Some(started));
    let s = u
        .sample_captured(t, record.frames(), false, record.collecting, false)
        .expect("decodes");
    let mut expected = before.clone();
    expected.insert(1, crate::cpython::GC_FUNCTION.to_string());
    assert_eq!(names(&u, s.stack), expected);
    // Before 3.15 (no frame named): on top of the GIL's holder only.
    let s = u
        .sample_captured(t, record.frames(), false, Some(0), true)
        .expect("decodes");
    let mut on_top = vec![crate::cpython::GC_FUNCTION.to_string()];
    on_top.extend(before.iter().cloned());
    assert_eq!(names(&u, s.stack), on_top);
    let s = u
        .sample_captured(t, record.frames(), false, Some(0), false)
        .expect("decodes");
    assert_eq!(names(&u, s.stack), before);
}
