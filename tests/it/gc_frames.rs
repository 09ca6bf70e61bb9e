//! While the garbage collector runs, the thread it runs on shows a `<GC>` frame above the
//! frame that started the collection, on every supported interpreter, by reads and with the
//! kernel capture, in the share of samples the target itself measures its collector to take
//! (tests/targets/gc_heavy.py times every collection through `gc.callbacks`).

use crate::common::*;
use serde_json::Value;
use std::fs;
use std::time::Duration;

/// Points the `<GC>` share may be off the target's own. About 400 samples at a share near
/// 45% have a standard deviation of 2.5 points; 10 is four of them (measured: within 4).
const GC_SHARE_POINTS: f64 = 10.0;

#[test]
fn the_collector_shows_as_a_gc_frame_in_the_share_it_takes() {
    let _machine = shared();
    for interp in interpreters() {
        for capture in ["kernel", "reads"] {
            check_gc(&interp, capture);
        }
    }
}

/// (seconds in the collector, seconds elapsed) as the target last wrote them.
fn gc_stats(path: &std::path::Path) -> (f64, f64) {
    let v: Value = serde_json::from_str(&fs::read_to_string(path).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (
        v["gc"].as_f64().unwrap_or(f64::NAN),
        v["elapsed"].as_f64().unwrap_or(f64::NAN),
    )
}

fn check_gc(interp: &Interp, capture: &str) {
    let label = &format!("{} {capture}", interp.label);
    let mut target = Proc::python(label, &interp.path, "gc_heavy.py", &["ready", "stats.json"]);
    target.wait_for_file("ready", READY_TIMEOUT);
    let stats = target.wait_for_file("stats.json", READY_TIMEOUT);
    let dir = tempdir("pyfleet-gc-");
    let out_path = dir.path().join("gc.folded");
    let before = gc_stats(&stats);
    let out = run_with_timeout(
        measured_command(&[
            "record",
            "--pid",
            &target.pid().to_string(),
            "--capture",
            capture,
            "--duration",
            "4s",
            "-o",
            out_path.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    // The stats file is rewritten every second: wait for one written after the recording.
    std::thread::sleep(Duration::from_millis(1100));
    let after = gc_stats(&stats);
    target.kill();
    assert!(out.success(), "[{label}] {}", out.describe());
    let folded = fs::read_to_string(&out_path).unwrap();
    let (mut total, mut in_gc, mut under_collect) = (0u64, 0u64, 0u64);
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let n: u64 = n.parse().unwrap_or(0);
        total += n;
        let frames: Vec<&str> = stack.split(';').collect();
        if let Some(at) = frames.iter().position(|f| f.starts_with("<GC>")) {
            in_gc += n;
            // Folded stacks are outermost first: the frame that started it is just before.
            if at > 0 && frames[at - 1].starts_with("collect_them ") {
                under_collect += n;
            }
        }
    }
    let shown = 100.0 * in_gc as f64 / total.max(1) as f64;
    let measured = 100.0 * (after.0 - before.0) / (after.1 - before.1);
    eprintln!(
        "[{label}] <GC>: {shown:.1}% of {total} samples, {under_collect} of {in_gc} above \
         collect_them; the target measured {measured:.1}%"
    );
    assert!(total >= 100, "[{label}] {total} samples: {folded}");
    assert!(
        (shown - measured).abs() <= GC_SHARE_POINTS,
        "[{label}] <GC> {shown:.1}% against {measured:.1}% measured"
    );
    // Only collect_them starts collections (automatic ones are off); a sample read as the
    // collection starts or ends may show the flag with the frame of its callback.
    assert!(
        under_collect * 100 >= in_gc * 95,
        "[{label}] {under_collect} of {in_gc} <GC> samples above collect_them: {folded}"
    );
    // record says it in one command: how much the collector ran, and what started it.
    let said = out
        .stderr
        .lines()
        .skip_while(|l| !l.starts_with("pyfleet: the garbage collector ran in "))
        .take(2)
        .collect::<Vec<_>>();
    assert!(
        said.first()
            .is_some_and(|l| l.contains(&format!("ran in {in_gc} samples ("))),
        "[{label}] {said:?}: {}",
        out.stderr
    );
    assert!(
        said.get(1)
            .is_some_and(|l| l.ends_with("%  collect_them (gc_heavy.py)")),
        "[{label}] {said:?}"
    );
}
