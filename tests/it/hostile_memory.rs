//! Target memory is hostile input. A sampler whose reads come back torn or garbled (random
//! bytes flipped in a fraction of reads, some reads failing outright) on real targets of every
//! version must only ever return counted errors: no panic (overflow checks are on in tests),
//! no hang, no unbounded allocation; and once the reads are clean again it samples normally.

use crate::common::*;
use pyfleet::binary;
use pyfleet::cpython::locals::{FrameLocals, LocalsReader, MAX_LOCALS, MAX_VALUE_CHARS};
use pyfleet::cpython::{self, Unwinder, UnwinderOptions};
use pyfleet::memory::{MemoryError, ProcessMemory, ReadRequest, ReadStats, RemoteMemory};
use pyfleet::process::Process;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Samples taken from garbled memory per interpreter (about half of the sampler's reads come
/// back garbled, one in a hundred fails).
const GARBLED_SAMPLES: u32 = 1500;

/// Real memory, garbled on purpose while `on` is set.
struct Garbling {
    inner: ProcessMemory,
    seed: Cell<u64>,
    on: Cell<bool>,
}

impl Garbling {
    fn rand(&self) -> u64 {
        let mut s = self.seed.get();
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.seed.set(s);
        s
    }

    fn garble(&self, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        // Often enough that samples fail even though the sampler reads a torn thread or
        // sample again at once (up to 4 and 3 times): it must count them, not hide them.
        match self.rand() % 100 {
            // Flip a few bytes anywhere (pointers, lengths, kinds, offsets).
            0..=29 => {
                for _ in 0..1 + self.rand() % 4 {
                    let i = (self.rand() % buf.len() as u64) as usize;
                    buf[i] ^= self.rand() as u8 | 1;
                }
            }
            // A whole aligned word replaced by a wild value.
            30..=49 if buf.len() >= 8 => {
                let i = (self.rand() % (buf.len() as u64 / 8)) as usize * 8;
                let wild = match self.rand() % 3 {
                    0 => u64::MAX - (self.rand() % 64),
                    1 => self.rand(),
                    _ => 0,
                };
                buf[i..i + 8].copy_from_slice(&wild.to_le_bytes());
            }
            _ => {}
        }
    }
}

impl RemoteMemory for Garbling {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if self.on.get() && self.rand() % 100 == 0 {
            return Err(MemoryError::BadAddress {
                addr,
                len: buf.len(),
            });
        }
        self.inner.read(addr, buf)?;
        if self.on.get() {
            self.garble(buf);
        }
        Ok(())
    }

    fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), (usize, MemoryError)> {
        self.inner.read_many(reqs)?;
        if self.on.get() {
            for r in reqs.iter_mut() {
                self.garble(r.buf);
            }
        }
        Ok(())
    }

    fn write_if(&self, addr: u64, expected: u64, value: u64) -> Result<bool, MemoryError> {
        // Only the 3.15 marker is ever written; the interpreter only compares it, so a
        // garbled value cannot hurt the target.
        self.inner.write_if(addr, expected, value)
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn stats(&self) -> &ReadStats {
        self.inner.stats()
    }
}

fn garbling_sampler(pid: i32, seed: u64) -> Unwinder<Garbling> {
    let process = Process::new(pid).expect("target process");
    let loc = binary::locate_runtime(&process).expect("runtime");
    let mut mem = ProcessMemory::new(pid);
    let layout = cpython::detect_layout(&mem, &loc, pid).expect("layout");
    mem.bind_writes().expect("/proc/PID/mem");
    let mem = Garbling {
        inner: mem,
        seed: Cell::new(seed | 1),
        on: Cell::new(false),
    };
    Unwinder::new(pid, mem, layout, &loc, UnwinderOptions::default())
}

#[test]
fn garbled_reads_give_counted_errors_and_sampling_recovers() {
    let _machine = shared();
    for interp in interpreters() {
        let mut target = Proc::python(&interp.label, &interp.path, "changing.py", &[""; 0]);
        target.wait_for_path(&target.dir().join("ready"), Duration::from_secs(30));
        let mut sampler = garbling_sampler(target.pid(), 0x5eed ^ u64::from(interp.minor));
        let clean = (0..50).filter(|_| sampler.sample().is_ok()).count();
        assert!(clean > 0, "[{}] no clean sample", interp.label);

        let errors_before = sampler.stats().errors;
        sampler.memory().on.set(true);
        let (mut ok, mut failed) = (0u64, 0u64);
        let start = Instant::now();
        for _ in 0..GARBLED_SAMPLES {
            match sampler.sample() {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(!e.is_process_gone(), "[{}] {e}", interp.label);
                    failed += 1;
                }
            }
        }
        let garbled_time = start.elapsed();
        let st = sampler.stats();
        assert_eq!(
            st.errors - errors_before,
            failed,
            "[{}] errors not counted: {st:?}",
            interp.label
        );
        assert!(
            failed > 0,
            "[{}] garbling produced no error at all",
            interp.label
        );
        assert!(
            garbled_time < Duration::from_secs(60),
            "[{}] {GARBLED_SAMPLES} garbled samples took {garbled_time:?}",
            interp.label
        );

        // Clean reads again: the sampler must do as well as a fresh one. The target changes
        // its stacks all the time, so even clean reads fail now and then (a frame freed
        // mid-read); samples of the two alternate so that both see the same target.
        sampler.memory().on.set(false);
        let mut fresh = garbling_sampler(target.pid(), 1);
        let _ = (0..20).filter(|_| sampler.sample().is_ok()).count();
        let (mut recovered_ok, mut fresh_ok) = (0, 0);
        for _ in 0..300 {
            recovered_ok += usize::from(sampler.sample().is_ok());
            fresh_ok += usize::from(fresh.sample().is_ok());
        }
        eprintln!(
            "[{}] garbled: {ok} ok, {failed} failed in {garbled_time:?} (code cache dropped \
             {} times); then clean: {recovered_ok}/300 ok (a fresh sampler: {fresh_ok}/300)",
            interp.label,
            sampler.stats().cache_drops
        );
        assert!(
            recovered_ok + 45 >= fresh_ok,
            "[{}] after garbling only {recovered_ok}/300 clean samples succeed, a fresh \
             sampler's {fresh_ok}/300",
            interp.label
        );
        target.kill();
    }
}

/// Rounds of reading every frame's locals from garbled memory, per interpreter.
const GARBLED_LOCALS_ROUNDS: u32 = 1000;

/// `dump --locals` reads names, values and type names the target controls: from garbled
/// memory (pointers, lengths and kinds gone wild) each frame's read ends with variables that
/// stay within the bounds, or an error, in bounded time; never a panic or a hang.
#[test]
fn garbled_locals_are_bounded_values_or_errors() {
    let _machine = shared();
    for interp in interpreters() {
        let mut target = Proc::python(
            &interp.label,
            &interp.path,
            "locals.py",
            &["ready", "expected.json"],
        );
        target.wait_for_file("ready", READY_TIMEOUT);
        let mut sampler = garbling_sampler(target.pid(), 0x10ca1 ^ u64::from(interp.minor));
        assert!(
            (0..50).any(|_| sampler.sample().is_ok()),
            "[{}] no clean sample",
            interp.label
        );
        let frames: Vec<(u64, u64)> = sampler
            .sampled_frames()
            .into_iter()
            .flat_map(|t| t.frames)
            .collect();
        assert!(frames.len() >= 3, "[{}] {frames:?}", interp.label);
        sampler.memory().on.set(true);
        let reader = LocalsReader::new(sampler.memory(), sampler.layout(), sampler.builtin_types());
        // A value is at most its characters, each escaped to at most 10 (`\U0010ffff`), quoted,
        // and `...`; or a type's name of at most 64 bytes (each replaced by at most 3) and an
        // address.
        let longest_value = MAX_VALUE_CHARS * 10 + 8;
        let (mut read, mut failed, mut values) = (0u64, 0u64, 0u64);
        let start = Instant::now();
        for _ in 0..GARBLED_LOCALS_ROUNDS {
            for &(frame, code) in &frames {
                match reader.frame_locals(frame, code) {
                    Ok(FrameLocals::Read(vars)) => {
                        read += 1;
                        assert!(
                            vars.len() <= MAX_LOCALS,
                            "[{}] {}",
                            interp.label,
                            vars.len()
                        );
                        for v in vars {
                            values += 1;
                            assert!(
                                v.name.chars().count() <= MAX_VALUE_CHARS + 3,
                                "[{}] {v:?}",
                                interp.label
                            );
                            assert!(
                                v.value.chars().count() <= longest_value,
                                "[{}] {v:?}",
                                interp.label
                            );
                        }
                    }
                    Ok(_) | Err(_) => failed += 1,
                }
            }
        }
        let took = start.elapsed();
        eprintln!(
            "[{}] garbled locals: {read} frames read ({values} values), {failed} not, in {took:?}",
            interp.label
        );
        assert!(failed > 0, "[{}] garbling made no read fail", interp.label);
        assert!(read > 0, "[{}] no frame read at all", interp.label);
        assert!(
            took < Duration::from_secs(60),
            "[{}] {took:?}",
            interp.label
        );
        sampler.memory().on.set(false);
        target.kill();
    }
}

/// Real memory in which the interpreter's thread list starts at `fake`, an address whose
/// reads return the first thread state's bytes (at `real`): memory that looks like a thread
/// state in every field (a copy of one) but is not one, as a pointer read torn or a thread
/// state freed and reused may show. Records where the sampler asks to write.
struct Aliasing {
    inner: ProcessMemory,
    head_at: u64,
    real: u64,
    fake: u64,
    span: u64,
    writes: std::cell::RefCell<Vec<u64>>,
}

impl Aliasing {
    fn source(&self, addr: u64) -> u64 {
        match addr.checked_sub(self.fake) {
            Some(o) if o < self.span => self.real + o,
            _ => addr,
        }
    }

    /// The head pointer, wherever a read covers it, names `fake`.
    fn redirect(&self, addr: u64, buf: &mut [u8]) {
        if let Some(o) = self.head_at.checked_sub(addr) {
            if let Some(word) = buf.get_mut(o as usize..o as usize + 8) {
                word.copy_from_slice(&self.fake.to_le_bytes());
            }
        }
    }
}

impl RemoteMemory for Aliasing {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.inner.read(self.source(addr), buf)?;
        self.redirect(addr, buf);
        Ok(())
    }

    fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), (usize, MemoryError)> {
        for (i, r) in reqs.iter_mut().enumerate() {
            self.read(r.addr, r.buf).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    fn write_if(&self, addr: u64, expected: u64, value: u64) -> Result<bool, MemoryError> {
        self.writes.borrow_mut().push(addr);
        match self.source(addr) == addr {
            true => self.inner.write_if(addr, expected, value),
            // Never passed on: the test shows the sampler asked, without hurting the target.
            false => Ok(false),
        }
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn stats(&self) -> &ReadStats {
        self.inner.stats()
    }
}

/// The 3.15 marker is the one thing pyfleet writes to a target: never where memory only looks
/// like a thread state. The first thread state's address is swapped for another whose bytes
/// are a copy of it (interpreter, frames, marker and all): only its base frame, embedded in
/// the real one, tells. Every sample must fail with a counted error and ask no write there; a
/// build that believes the copy walks its stack and writes the marker into the target's
/// memory at the fake address.
#[test]
fn the_marker_is_never_written_where_memory_only_looks_like_a_thread_state() {
    let _machine = shared();
    let Some(interp) = interpreter("3.15") else {
        return;
    };
    let mut target = Proc::python(&interp.label, &interp.path, "changing.py", &[""; 0]);
    target.wait_for_path(&target.dir().join("ready"), Duration::from_secs(30));
    let process = Process::new(target.pid()).expect("target process");
    let loc = binary::locate_runtime(&process).expect("runtime");
    let mut mem = ProcessMemory::new(target.pid());
    let layout = cpython::detect_layout(&mem, &loc, target.pid()).expect("layout");
    mem.bind_writes().expect("/proc/PID/mem");
    let interp_at = mem
        .read_u64(loc.runtime + layout.runtime_interpreters_head)
        .expect("interpreters head");
    let head_at = interp_at + layout.interp.threads_head;
    let real = mem.read_u64(head_at).expect("threads head");
    // Far enough that no read of the real thread state reaches it.
    let span = 1 << 16;
    let mem = Aliasing {
        inner: mem,
        head_at,
        real,
        fake: real + span,
        span,
        writes: Default::default(),
    };
    let mut sampler = Unwinder::new(target.pid(), mem, layout.clone(), &loc, Default::default());
    let (mut failed, samples) = (0u64, 300);
    for _ in 0..samples {
        if let Err(e) = sampler.sample() {
            assert!(!e.is_process_gone(), "{e}");
            failed += 1;
        }
    }
    let fake = sampler.memory().fake;
    let asked_there: Vec<_> = sampler
        .memory()
        .writes
        .borrow()
        .iter()
        .filter(|&&a| a.wrapping_sub(fake) < span)
        .copied()
        .collect();
    assert!(
        asked_there.is_empty(),
        "the marker was to be written where the copy lies: {asked_there:x?}"
    );
    assert_eq!(failed, samples, "samples of the copy succeeded");
    assert_eq!(sampler.stats().errors, failed, "errors not counted");
    assert!(target.exited().is_none(), "the target died");
    target.kill();
}

/// Readers of asyncio tasks, each learning from garbled memory first, and rounds of reading
/// every task (which ones are ready among them) each makes from it.
const GARBLED_READERS: u32 = 10;
const GARBLED_TASK_ROUNDS: u32 = 40;

/// Which asyncio tasks are ready is read through the loop's queues, its handles and their
/// classes, all target memory: from garbled memory (3.14, 3.15, tests/targets/loop_ready.py
/// with its loop blocked) every read of the tasks ends in tasks or an error, in bounded time;
/// once the reads are clean again, the same tasks are ready as before (what was learnt from
/// garbled reads does not stick). Ten readers each learn from garbled reads first. (A build
/// that kept a class as read once, forever, still passed this in two runs: the garbled walks
/// rarely reach a class's first read with its name garbled.)
#[test]
fn garbled_loop_queues_are_bounded_and_forgotten() {
    let _machine = shared();
    for interp in interpreters().iter().filter(|i| i.minor >= 14) {
        let out_dir = tempdir("pyfleet-ready-garbled-");
        let mut target = Proc::python(
            &interp.label,
            &interp.path,
            "loop_ready.py",
            &[out_dir.path()],
        );
        target.wait_for_path(&out_dir.path().join("blocked"), READY_TIMEOUT);
        let mut sampler = garbling_sampler(target.pid(), 0x7ea5 ^ u64::from(interp.minor));
        let process = Process::new(target.pid()).expect("target process");
        let locate = |sampler: &Unwinder<Garbling>| {
            cpython::asyncio::locate(&process, sampler.memory(), sampler.layout())
                .expect("the task layout")
                .expect("asyncio is loaded")
        };
        let mut probe = locate(&sampler);
        let ready_names = |sampler: &mut Unwinder<Garbling>, tasks: &mut _| {
            sampler.sample_then(|u| u.tasks(tasks)).map(|interps| {
                let mut names: Vec<String> = interps
                    .iter()
                    .flat_map(|i| &i.tasks)
                    .filter(|t| t.ready)
                    .map(|t| t.name.clone())
                    .collect();
                names.sort();
                names
            })
        };
        let want = vec!["stepping", "threaded", "timer", "woken"];
        let clean = ready_names(&mut sampler, &mut probe).expect("a clean read of the tasks");
        assert_eq!(clean, want, "[{}] ready before garbling", interp.label);

        // Readers that learn the classes they meet from garbled reads first, each then read
        // clean until it finds the same tasks ready (what was learnt from a garbled class
        // is read twice, and a class of no kind wanted forgotten within `LOOK_AGAIN`).
        let (mut read, mut failed) = (0u64, 0u64);
        let start = Instant::now();
        for _ in 0..GARBLED_READERS {
            let mut tasks = locate(&sampler);
            sampler.memory().on.set(true);
            for _ in 0..GARBLED_TASK_ROUNDS {
                match ready_names(&mut sampler, &mut tasks) {
                    Ok(names) => {
                        read += 1;
                        let most = cpython::asyncio::walk::MAX_TASKS;
                        assert!(names.len() <= most, "[{}] {}", interp.label, names.len());
                    }
                    Err(_) => failed += 1,
                }
            }
            sampler.memory().on.set(false);
            // Read clean by a fresh sampler (how the unwinder's own caches recover from
            // garbling is `garbled_reads_give_counted_errors_and_sampling_recovers`'), with
            // the task reader that learnt from garbled reads.
            let mut clean = garbling_sampler(target.pid(), 1);
            let deadline = Instant::now() + cpython::asyncio::ready::LOOK_AGAIN * 3;
            let mut last = Err(String::from("not read"));
            while Instant::now() < deadline {
                last = ready_names(&mut clean, &mut tasks).map_err(|e| e.to_string());
                if last.as_ref().is_ok_and(|names| *names == want) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                last.as_ref().is_ok_and(|names| *names == want),
                "[{}] ready once the reads are clean again: {last:?}",
                interp.label
            );
        }
        let took = start.elapsed();
        eprintln!(
            "[{}] garbled task reads: {read} read, {failed} failed, in {took:?}",
            interp.label
        );
        assert!(failed > 0, "[{}] garbling made no read fail", interp.label);
        assert!(
            took < Duration::from_secs(120),
            "[{}] {took:?}",
            interp.label
        );
        target.kill();
    }
}
