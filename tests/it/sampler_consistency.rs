//! The frame cache must never change what is sampled: on targets whose stacks change between
//! samples, a sampler with the 3.15 frame cache, one without it, a read-only one and a fresh
//! one must give the same frames at the same instant (the target stopped, and the samplers
//! told so: `target_stopped`), sample after sample, on every version.

use crate::common::*;
use pyfleet::cpython::{self, InterpreterStacks, UnwinderOptions};
use std::collections::BTreeMap;
use std::time::Duration;

const ROUNDS: usize = 60;

type Frames = Vec<(String, String, String, Option<i32>)>;

/// (interpreter id, thread id) -> frames, innermost first.
fn flatten(interps: &[InterpreterStacks]) -> BTreeMap<(i64, u64), Frames> {
    interps
        .iter()
        .flat_map(|i| {
            i.threads.iter().map(move |t| {
                let frames = t
                    .frames
                    .iter()
                    .map(|f| {
                        (
                            f.function.name.to_string(),
                            f.function.qualname.to_string(),
                            f.function.filename.to_string(),
                            f.line,
                        )
                    })
                    .collect();
                ((i.id, t.thread_id), frames)
            })
        })
        .collect()
}

/// A sampler that reads everything every time, with no cache of any kind to trust: the truth.
fn full_reader(pid: i32, label: &str) -> cpython::Unwinder<pyfleet::memory::ProcessMemory> {
    cpython::attach(
        pid,
        UnwinderOptions {
            frame_cache: false,
            read_only: true,
            skip_idle: false,
            target_stopped: true,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("[{label}] attach: {e}"))
}

#[test]
fn frame_cache_and_read_only_give_the_same_frames() {
    let _machine = shared();
    let mut failures = Vec::new();
    for interp in interpreters() {
        let mut target = Proc::python(&interp.label, &interp.path, "changing.py", &[""; 0]);
        let ready = target.dir().join("ready");
        target.wait_for_path(&ready, Duration::from_secs(30));
        let pid = target.pid();
        let attach = |frame_cache, read_only| {
            cpython::attach(
                pid,
                UnwinderOptions {
                    frame_cache,
                    read_only,
                    // Every round reads the target stopped: the top is the pointer's.
                    target_stopped: true,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("[{}] attach: {e}", interp.label))
        };
        let mut cached = attach(true, false);
        let mut uncached = attach(false, false);
        let mut read_only = attach(true, true);
        let mut compared = 0;
        let mut unreadable = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..ROUNDS {
            let stopped = Stopped::new(pid);
            let mut fresh = full_reader(pid, &interp.label);
            let results = [
                ("frame cache", cached.snapshot()),
                ("no frame cache", uncached.snapshot()),
                ("read-only", read_only.snapshot()),
                ("fresh", fresh.snapshot()),
            ];
            drop(stopped);
            let truth = match &results[3].1 {
                Ok(s) => flatten(s),
                // SIGSTOP can catch a thread in the middle of pushing or popping a frame;
                // then even a full read of the stopped target fails, and there is no truth
                // to compare with this round.
                Err(e) => {
                    unreadable.push(format!(
                        "[{}] round {round}: fresh sampler: {e}",
                        interp.label
                    ));
                    continue;
                }
            };
            if truth.len() < 4 {
                failures.push(format!(
                    "[{}] round {round}: only {} threads sampled",
                    interp.label,
                    truth.len()
                ));
            }
            for (name, r) in &results[..3] {
                match r {
                    Ok(s) if flatten(s) == truth => {}
                    Ok(s) => failures.push(format!(
                        "[{}] round {round}: {name} differs:\n  got  {:?}\n  want {:?}",
                        interp.label,
                        flatten(s),
                        truth
                    )),
                    Err(e) => {
                        failures.push(format!("[{}] round {round}: {name}: {e}", interp.label))
                    }
                }
            }
            compared += 1;
            // Let the target move on for 1 to 15 ms.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            std::thread::sleep(Duration::from_millis(1 + seed % 15));
        }
        // The frame cache was really used where the version has it.
        let st = cached.stats();
        if interp.minor >= 15 && st.frame_cache_hits + st.frame_cache_partial_hits == 0 {
            failures.push(format!("[{}] frame cache never hit: {st:?}", interp.label));
        }
        if read_only.stats().marker_writes != 0 || uncached.stats().marker_writes != 0 {
            failures.push(format!(
                "[{}] wrote the marker when it must not",
                interp.label
            ));
        }
        assert!(
            compared >= ROUNDS * 9 / 10,
            "[{}] only {compared}/{ROUNDS} rounds could be compared:\n{}",
            interp.label,
            unreadable.join("\n")
        );
        for u in &unreadable {
            eprintln!("{u}");
        }
        target.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A sampler on a target that is killed mid-sampling: samples succeed or fail with counted
/// errors, and once the target is gone every sample says so, quickly; never a panic or hang.
#[test]
fn a_target_killed_while_sampled_ends_with_counted_errors() {
    let _machine = shared();
    use std::time::Instant;
    for interp in interpreters() {
        let mut target = Proc::python(&interp.label, &interp.path, "churn.py", &["ready"]);
        target.wait_for_path(&target.dir().join("ready"), Duration::from_secs(30));
        let pid = target.pid();
        let mut sampler = cpython::attach(pid, UnwinderOptions::default())
            .unwrap_or_else(|e| panic!("[{}] attach: {e}", interp.label));
        let start = Instant::now();
        let (mut ok, mut failed, mut killed_at) = (0u64, 0u64, None);
        loop {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "[{}] sampling did not end after the target was killed",
                interp.label
            );
            match sampler.sample() {
                Ok(threads) => {
                    assert!(killed_at.is_none() || !threads.is_empty() || ok > 0);
                    ok += 1;
                }
                Err(e) if e.is_process_gone() => break,
                Err(_) => failed += 1,
            }
            if ok + failed == 500 && killed_at.is_none() {
                // Killed, not reaped: a zombie whose memory is gone.
                target.kill_no_reap();
                killed_at = Some(ok + failed);
            }
        }
        let st = sampler.stats();
        assert!(
            killed_at.is_some(),
            "[{}] ended before the kill",
            interp.label
        );
        assert!(
            ok > 0,
            "[{}] no sample of the live target succeeded",
            interp.label
        );
        assert_eq!(st.samples, ok, "[{}] {st:?}", interp.label);
        assert_eq!(
            st.errors,
            failed + 1,
            "[{}] errors not counted: {st:?}",
            interp.label
        );
        // The zombie is still there: every further sample reports it gone.
        assert!(sampler.sample().is_err_and(|e| e.is_process_gone()));
        target.reap();
    }
}

/// Steps of tests/targets/steps.py walked through.
const STEPS: usize = 5;

/// A thread that has not run keeps its last stack without being read (`skip_idle`, the
/// default), and the first sample after it ran shows where it went: on a target whose only
/// changes are steps the test makes, every sample of a skipping sampler equals a fresh
/// full read, and the skipping really happened.
#[test]
fn idle_threads_keep_their_stacks_exactly_until_they_run() {
    let _machine = shared();
    let can_tell = pyfleet::process::runstate::available();
    let mut failures = Vec::new();
    for interp in interpreters() {
        let mut target = Proc::python(&interp.label, &interp.path, "steps.py", &[""; 0]);
        let pid = target.pid();
        target.wait_for_file("step-0", Duration::from_secs(30));
        let mut skipping = cpython::attach(pid, UnwinderOptions::default())
            .unwrap_or_else(|e| panic!("[{}] attach: {e}", interp.label));
        for n in 0..STEPS {
            target.wait_for_file(&format!("step-{n}"), Duration::from_secs(30));
            wait_until(
                Duration::from_secs(10),
                "every thread of the target to block",
                || thread_states(pid).iter().all(|(_, s)| *s == Some('S')),
                || format!("{:?}", thread_states(pid)),
            );
            let mut full = full_reader(pid, &interp.label);
            let truth = match full.snapshot() {
                Ok(s) => flatten(&s),
                Err(e) => panic!("[{}] step {n}: full read: {e}", interp.label),
            };
            let steps = truth
                .values()
                .map(|f| f.iter().filter(|(name, ..)| name == "step").count())
                .max();
            assert_eq!(steps, Some(n + 1), "[{}] step {n}: {truth:?}", interp.label);
            for round in 0..8 {
                match skipping.snapshot() {
                    Ok(s) if flatten(&s) == truth => {}
                    Ok(s) => failures.push(format!(
                        "[{}] step {n}, sample {round}: got {:?}\n  want {truth:?}",
                        interp.label,
                        flatten(&s)
                    )),
                    Err(e) => failures.push(format!("[{}] step {n}: {e}", interp.label)),
                }
                // Past two scheduler ticks, so that the kernel's counts can tell.
                std::thread::sleep(Duration::from_millis(12));
            }
            std::fs::write(target.dir().join("go"), b"x").expect("write to the FIFO");
        }
        let st = skipping.stats();
        eprintln!("[{}] {st:?}", interp.label);
        if can_tell && (st.samples_unchanged == 0 || st.threads_unchanged == 0) {
            failures.push(format!(
                "[{}] nothing was kept though the target was idle: {st:?}",
                interp.label
            ));
        }
        target.kill();
    }
    assert!(
        can_tell,
        "this kernel cannot tell idle threads (schedstat, nohz_full)"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Threads that wake briefly between samples (sleep 45 ms in one function, wake, sleep 15 ms
/// in another) are sampled where they are, by the unwinder as the daemon drives it: 100 Hz,
/// each tick at a random point of its period, idle threads kept after a check rather than
/// read. Twice: checked through schedstat, then through the kernel's context-switch log (as
/// the daemon does when it may open it). The shares of the two functions as leaves match the
/// target's own timing within 2 points on every version, and most thread samples were kept,
/// not read (so the check is what is tested). Sized not to flake: 6 threads for 12 s give
/// about 7,200 thread samples; the standard error of a share near 75% is then about 0.5
/// points (stratified sampling of a periodic target does no worse than independent draws),
/// so 2 points is nearly four of them.
#[test]
fn brief_wakes_between_samples_are_sampled_where_they_sleep() {
    let _machine = shared();
    assert!(
        pyfleet::process::runstate::available(),
        "this kernel cannot tell idle threads (schedstat, nohz_full)"
    );
    let interps = interpreters();
    let mut failures = brief_wakes_at_once(interps.iter(), "schedstat");
    if pyfleet::process::switches::start() {
        // The log sees OS threads, whatever the version: the oldest and the newest suffice.
        let ends = interps.first().into_iter().chain(interps.last());
        failures.extend(brief_wakes_at_once(ends, "context-switch log"));
    } else {
        eprintln!("no context-switch log here (no CAP_PERFMON?): its half is not run");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`brief_wakes`] on each of `interps` at the same time (each target sleeps nearly all the
/// time and each unwinder wakes 100 times a second: they do not crowd each other); the failures
/// they found.
fn brief_wakes_at_once<'a>(interps: impl Iterator<Item = &'a Interp>, how: &str) -> Vec<String> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = interps
            .map(|interp| scope.spawn(move || brief_wakes(interp, how)))
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// One version's half of the test above; the failures it found.
fn brief_wakes(interp: &Interp, how: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let mut target = Proc::python(&interp.label, &interp.path, "wakes.py", &[""; 0]);
    let pid = target.pid();
    target.wait_for_file("ready", Duration::from_secs(30));
    let mut unwinder = cpython::attach(pid, UnwinderOptions::default())
        .unwrap_or_else(|e| panic!("[{}] attach: {e}", interp.label));
    let mut leaves: BTreeMap<String, u64> = BTreeMap::new();
    let mut thread_samples = 0u64;
    let period = Duration::from_millis(10);
    let start = std::time::Instant::now();
    let mut ticks = 0u32;
    let mut seed = u64::from(pid.unsigned_abs()) | 1;
    while start.elapsed() < Duration::from_secs(12) {
        // A random point of each period, as the sampling thread ticks.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let offset = period.mul_f64((seed % 1000) as f64 / 1000.0);
        let due = start + period * ticks + offset;
        ticks += 1;
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        let Ok(samples) = unwinder.sample() else {
            continue;
        };
        thread_samples += samples.len() as u64;
        let threads = samples.to_vec();
        for s in threads {
            let leaf = unwinder
                .stacks()
                .resolve(s.stack)
                .and_then(|mut frames| frames.next().map(|f| f.function.qualname.to_string()));
            if let Some(leaf) = leaf {
                *leaves.entry(leaf).or_default() += 1;
            }
        }
    }
    let st = unwinder.stats();
    let own: serde_json::Value = serde_json::from_slice(
        &std::fs::read(target.dir().join("shares.json")).expect("shares.json"),
    )
    .expect("shares.json is JSON");
    target.kill();
    let (own_long, own_short) = (
        own["long_nap"].as_f64().unwrap_or(0.0),
        own["short_nap"].as_f64().unwrap_or(0.0),
    );
    let truth = 100.0 * own_long / (own_long + own_short);
    let long = leaves.get("long_nap").copied().unwrap_or(0);
    let short = leaves.get("short_nap").copied().unwrap_or(0);
    let n = long + short;
    let sampled = 100.0 * long as f64 / n.max(1) as f64;
    let kept = st.threads_unchanged as f64 / thread_samples.max(1) as f64;
    let label = format!("{}, {how}", interp.label);
    eprintln!(
        "[{label}] long_nap {sampled:.1}% of {n} thread samples, its own timing {truth:.1}%; \
         {:.0}% of thread samples kept; {st:?}",
        100.0 * kept
    );
    if n < 5000 || (sampled - truth).abs() > 2.0 {
        failures.push(format!(
            "[{label}] long_nap {sampled:.1}% of {n} thread samples against {truth:.1}% of the \
             target's own time; leaves {leaves:?}"
        ));
    }
    if kept < 0.3 {
        failures.push(format!(
            "[{label}] only {:.0}% of thread samples were kept: the check did not engage; {st:?}",
            100.0 * kept
        ));
    }
    failures
}
