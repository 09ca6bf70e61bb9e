//! `--blocking`: pyfleet pauses every thread of a real CPython target for a read and never
//! leaves it paused: not when the guard is dropped, not when the pausing thread dies, not
//! when pyfleet is killed mid-sample; a signal that arrives during a pause is delivered after
//! it; a target already traced is refused. Then: blocking reads on every version.
//!
//! Every test here has the machine alone (`alone()`): each tells that its target runs again by
//! the CPU time its spinner gets within a few seconds.

use crate::common::*;
use pyfleet::memory::{MemoryError, Pauser};
use std::time::{Duration, Instant};

fn pausable() -> Proc {
    let interp = any_interpreter();
    let mut t = Proc::python(&interp.label, &interp.path, "pausable.py", &["."]);
    let ready = t.dir().join("ready");
    t.wait_for_path(&ready, READY_TIMEOUT);
    t
}

fn traced_threads(pid: i32) -> Vec<String> {
    thread_states(pid)
        .into_iter()
        .filter(|(_, s)| *s == Some('t'))
        .map(|(tid, _)| tid)
        .collect()
}

/// The target runs again: no thread in a tracing stop, and it uses CPU (its spinner).
fn assert_running(pid: i32, what: &str) {
    wait_until(
        Duration::from_secs(5),
        &format!("{what}: no thread of the target left stopped"),
        || traced_threads(pid).is_empty(),
        || format!("stopped threads {:?}", traced_threads(pid)),
    );
    let before = cpu_ticks(pid);
    wait_until(
        Duration::from_secs(5),
        &format!("{what}: the target's spinner to use CPU again"),
        || cpu_ticks(pid) > before + 2,
        || format!("CPU ticks {before} -> {}", cpu_ticks(pid)),
    );
}

#[test]
fn a_pause_stops_every_thread_and_the_guard_resumes_them() {
    let _machine = alone();
    let mut t = pausable();
    let pid = t.pid();
    for round in 0..20 {
        let paused = Pauser::new(pid).pause().expect("pause");
        let threads = thread_states(pid);
        assert!(
            threads.iter().all(|(_, s)| *s == Some('t')),
            "round {round}: not every thread stopped: {threads:?}"
        );
        assert_eq!(paused.threads(), threads.len());
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            cpu_ticks(pid),
            before,
            "round {round}: the target ran while paused"
        );
        drop(paused);
        assert_running(pid, &format!("round {round}"));
    }
    t.kill();
}

#[test]
fn a_pausing_thread_that_dies_leaves_the_target_running() {
    let _machine = alone();
    let mut t = pausable();
    let pid = t.pid();
    // The tracer is a thread: when it exits holding the pause (as when pyfleet dies), the
    // kernel detaches its tracees.
    std::thread::spawn(move || {
        let paused = Pauser::new(pid).pause().expect("pause");
        assert!(!traced_threads(pid).is_empty());
        std::mem::forget(paused);
    })
    .join()
    .unwrap();
    assert_running(pid, "after the pausing thread exited");
    t.kill();
}

#[test]
fn killing_pyfleet_mid_record_never_leaves_the_target_paused() {
    let _machine = alone();
    let mut t = pausable();
    let pid = t.pid().to_string();
    let dir = tempdir("pyfleet-blocking-kill-");
    // Kill times spread over the first half second of recording: some land mid-sample.
    for i in 0..15u64 {
        let out = dir.path().join(format!("{i}.folded"));
        let mut cmd = pyfleet_command(&[
            "record",
            "--pid",
            &pid,
            "--blocking",
            "--rate",
            "1000",
            "-o",
            out.to_str().unwrap(),
        ]);
        cmd.stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().expect("spawn pyfleet");
        std::thread::sleep(Duration::from_millis(150 + 23 * i));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_running(t.pid(), &format!("after SIGKILL #{i}"));
    }
    t.kill();
}

#[test]
fn a_signal_sent_during_a_pause_is_delivered_after_it() {
    let _machine = alone();
    let mut t = pausable();
    let pid = t.pid();
    let file = t.dir().join("usr1");
    let paused = Pauser::new(pid).pause().expect("pause");
    send_signal(pid, libc::SIGUSR1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !file.exists(),
        "the handler ran while the target was paused"
    );
    drop(paused);
    let start = Instant::now();
    while !file.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(file.exists(), "SIGUSR1 sent during the pause was lost");
    assert_running(pid, "after the signal");
    t.kill();
}

#[test]
fn a_target_traced_by_another_is_refused_and_left_alone() {
    let _machine = alone();
    let mut t = pausable();
    let pid = t.pid();
    // Another tracer: a thread of ours holding a pause (as a debugger would hold it).
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let paused = Pauser::new(pid).pause().expect("pause");
        ready_tx.send(()).unwrap();
        rx.recv().ok();
        drop(paused);
    });
    ready_rx.recv().unwrap();
    match Pauser::new(pid).pause() {
        Err(MemoryError::AlreadyTraced(p)) => assert_eq!(p, pid),
        other => panic!("expected AlreadyTraced, got {other:?}"),
    }
    // The dump says so in one line.
    let out = pyfleet(&["dump", "--pid", &pid.to_string()]);
    assert_error_contract(&out, Some("traced by another process"));
    tx.send(()).unwrap();
    holder.join().unwrap();
    assert_running(pid, "after the other tracer let go");
    t.kill();
}

/// Blocking reads are consistent by construction: on every version, a target whose stack
/// moves all the time (a loop of short calls) is read without a single failed sample.
#[test]
fn blocking_reads_of_a_busy_target_never_fail() {
    let _machine = alone();
    let mut failures = Vec::new();
    for interp in interpreters() {
        let mut t = Proc::python(&interp.label, &interp.path, "pausable.py", &["."]);
        t.wait_for_path(&t.dir().join("ready"), READY_TIMEOUT);
        let out = pyfleet(&[
            "bench",
            "--pid",
            &t.pid().to_string(),
            "--blocking",
            "--duration",
            "1",
            "--json",
        ]);
        let doc: serde_json::Value =
            serde_json::from_str(&out.stdout).unwrap_or(serde_json::Value::Null);
        let (samples, errors) = (doc["samples"].as_u64(), doc["errors"].as_u64());
        if !out.success() || samples.unwrap_or(0) < 20 || errors != Some(0) {
            failures.push(format!(
                "[{}] {samples:?} samples, {errors:?} errors: {}",
                interp.label,
                out.describe()
            ));
        }
        assert_running(t.pid(), &interp.label);
        t.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
