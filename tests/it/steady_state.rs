//! A steady-state sample allocates nothing: once a sampler has seen a process's stacks, taking
//! more samples of it makes no heap allocation (the fleet samples every process 100 times a
//! second, so an allocation per sample is an allocation per 10 ms per process for ever).
//! On a target whose threads are all parked (tests/targets/stacks.py: many threads, deep and
//! shallow stacks, a generator and a coroutine), every thread read from memory each time
//! (`skip_idle: false`), with and without the 3.15 frame cache, on every version.

use crate::common::*;
use pyfleet::cpython::{self, UnwinderOptions};
use std::time::Duration;

const WARM_UP: usize = 20;
const MEASURED: usize = 200;

#[test]
fn a_steady_state_sample_allocates_nothing() {
    // Alone: the target's threads must stay parked (and read the same) for every sample.
    let _machine = alone();
    let mut failures = Vec::new();
    for interp in interpreters() {
        let label = &interp.label;
        let out = tempdir("steady");
        let mut target = Proc::python(
            label,
            &interp.path,
            "stacks.py",
            &[out.path().to_string_lossy().into_owned()],
        );
        target.wait_for_path(&out.path().join("expected.json"), Duration::from_secs(60));
        // The reporter thread parks itself after writing expected.json: wait until every
        // thread has been asleep for a while (a thread still running makes new reads).
        let pid = target.pid();
        let mut asleep = 0;
        wait_until(
            Duration::from_secs(30),
            "every thread of the target asleep",
            || {
                let all = thread_states(pid).iter().all(|(_, s)| *s == Some('S'));
                asleep = if all { asleep + 1 } else { 0 };
                std::thread::sleep(Duration::from_millis(50));
                asleep >= 6
            },
            || format!("{:?}", thread_states(pid)),
        );
        for (mode, frame_cache) in [("frame cache", true), ("no frame cache", false)] {
            let mut sampler = cpython::attach(
                target.pid(),
                UnwinderOptions {
                    frame_cache,
                    skip_idle: false,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("[{label}] attach: {e}"));
            for _ in 0..WARM_UP {
                sampler
                    .sample()
                    .unwrap_or_else(|e| panic!("[{label}, {mode}] warm-up sample: {e}"));
            }
            let before = sampler.stats();
            let mut threads = 0;
            let mut errors = Vec::new();
            let info = allocation_counter::measure(|| {
                for _ in 0..MEASURED {
                    match sampler.sample() {
                        Ok(s) => threads += s.len(),
                        Err(e) => errors.push(e),
                    }
                }
            });
            assert!(
                errors.is_empty(),
                "[{label}, {mode}] sample errors: {errors:?}"
            );
            let after = sampler.stats();
            // The samples really read the target: every thread, every time, from memory.
            assert!(
                threads >= 2 * MEASURED,
                "[{label}, {mode}] {threads} threads sampled"
            );
            assert!(
                after.remote_reads >= before.remote_reads + MEASURED as u64,
                "[{label}, {mode}] {} reads for {MEASURED} samples",
                after.remote_reads - before.remote_reads
            );
            assert_eq!(after.threads_unchanged, 0, "[{label}, {mode}] threads kept");
            if info.count_total != 0 {
                failures.push(format!(
                    "[{label}, {mode}] {} allocations ({} bytes) in {MEASURED} samples",
                    info.count_total, info.bytes_total
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
