//! Target memory is hostile input. A sampler whose reads come back torn or garbled (random
//! bytes flipped in a fraction of reads, some reads failing outright) on real targets of every
//! version must only ever return counted errors: no panic (overflow checks are on in tests),
//! no hang, no unbounded allocation; and once the reads are clean again it samples normally.

use crate::common::*;
use pyfleet::binary;
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
