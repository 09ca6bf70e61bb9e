//! `pyfleet diff` against real recordings (issue #37): a target whose hot function changed
//! between two records is shown to have grown by what it really grew, in the folded deltas,
//! the SVG's frame titles and the summary; inputs of any kind (folded, pprof, a snapshot
//! directory) and bad ones.

use crate::common::*;
use std::path::Path;
use std::time::Duration;

/// The target's own seconds in `alpha` and `beta` so far.
fn times(dir: &Path) -> (f64, f64) {
    let text = std::fs::read_to_string(dir.join("times")).unwrap();
    let mut v = text.split_whitespace().map(|x| x.parse::<f64>().unwrap());
    (v.next().unwrap(), v.next().unwrap())
}

fn arg(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// Records `secs` seconds of `pid` into `out`; returns alpha's share of the target's own
/// time over the record.
fn record(pid: i32, dir: &Path, secs: u32, out: &Path) -> f64 {
    let (a0, b0) = times(dir);
    let r = pyfleet(&[
        "record",
        "--pid",
        &pid.to_string(),
        "--rate",
        "173",
        "--duration",
        &secs.to_string(),
        "-o",
        &arg(out),
    ]);
    assert!(r.success(), "{}", r.describe());
    let (a1, b1) = times(dir);
    (a1 - a0) / ((a1 - a0) + (b1 - b0))
}

/// Points of the new profile's samples by which frames named `function` grew, summed over
/// the differential SVG's frame titles (`name (N samples, P%; +D%)`) of frames whose parent
/// is not `function` itself (the function's own frames, each counted once).
fn svg_growth(svg: &str, function: &str) -> f64 {
    let mut total = 0.0;
    for title in svg.split("<title>").skip(1) {
        let title = title.split("</title>").next().unwrap_or("");
        if !title.starts_with(&format!("{function} (")) {
            continue;
        }
        let Some(delta) = title.rsplit_once("; ").and_then(|(_, d)| {
            d.trim_end_matches(')')
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
        }) else {
            continue;
        };
        total += delta;
    }
    total
}

/// The diff of two records of one target whose time in `alpha` went from 25% to 75% (its own
/// timing says by how much exactly): alpha grew and beta shrank by that, within 8 points.
/// 173 Hz (a period of 5.8 ms) puts the samples all over the target's 20 ms cycle; 200 Hz
/// would see four fixed points of it. 5 s at 173 Hz are about 865 samples a record: a share's
/// standard error is at most 1.7 points, that of a difference of two 2.4, so 8 points are 3.3
/// of them (and the target's own timing, not the nominal 50, is the reference).
#[test]
fn diff_of_two_records_shows_the_function_that_grew() {
    // Alone: shares of a CPU-bound target against its own timing.
    let _machine = alone();
    let mut t = shifting("0.25");
    let dir = tempdir("pyfleet-diff-");
    let base = dir.path().join("base.folded");
    // The second as pprof: either kind is read, and their frames compare.
    let new = dir.path().join("new.pb.gz");
    std::thread::sleep(Duration::from_millis(500));
    let before = record(t.pid(), t.dir(), 5, &base);
    std::fs::write(t.dir().join("share"), "0.75\n").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let after = record(t.pid(), t.dir(), 5, &new);
    t.kill();
    let truth = 100.0 * (after - before);
    assert!(
        truth > 40.0,
        "the target's own shares: {before} then {after}"
    );

    let svg_path = dir.path().join("diff.svg");
    let out = pyfleet(&["diff", &arg(&base), &arg(&new), "-o", &arg(&svg_path)]);
    assert!(out.success(), "{}", out.describe());
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let (alpha, beta) = (svg_growth(&svg, "alpha"), svg_growth(&svg, "beta"));
    eprintln!(
        "alpha's share {before:.3} then {after:.3}; the SVG: alpha {alpha:+.1}, beta {beta:+.1}"
    );
    eprintln!("{}", out.stdout);
    assert!(
        (alpha - truth).abs() < 8.0 && (beta + truth).abs() < 8.0,
        "the SVG says alpha {alpha:+.1}, beta {beta:+.1} points; the target {truth:+.1}"
    );

    let folded_path = dir.path().join("diff.folded");
    let out2 = pyfleet(&["diff", &arg(&base), &arg(&new), "-o", &arg(&folded_path)]);
    assert!(out2.success(), "{}", out2.describe());
    let (mut a, mut total) = (0.0, 0.0);
    for line in std::fs::read_to_string(&folded_path).unwrap().lines() {
        let mut f = line.rsplitn(3, ' ');
        let (n, b, stack) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let (n, b): (f64, f64) = (n.parse().unwrap(), b.parse().unwrap());
        total += n;
        if stack.rsplit(';').next().unwrap().starts_with("alpha (") {
            a += n - b;
        }
    }
    let folded_alpha = 100.0 * a / total;
    assert!(
        (folded_alpha - truth).abs() < 8.0,
        "the deltas say alpha {folded_alpha:+.1} points; the target {truth:+.1}"
    );

    // The summary's first two rows are alpha (grown) and beta (shrunk), in either order (in
    // shares: the folded base does not say how it was sampled).
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| !l.contains("function (own share"))
        .skip(1)
        .take(2)
        .collect();
    let row = |f: &str| {
        rows.iter()
            .find(|r| r.contains(&format!("  {f} (")))
            .copied()
    };
    let change = |r: &str| r.split_whitespace().nth(2).unwrap().parse::<f64>().unwrap();
    match (row("alpha"), row("beta")) {
        (Some(a), Some(b)) => assert!(
            (change(a) - truth).abs() < 8.0 && (change(b) + truth).abs() < 8.0,
            "{}",
            out.stdout
        ),
        _ => panic!("alpha and beta should head the summary:\n{}", out.stdout),
    }
}

#[test]
fn diff_reads_snapshots_and_refuses_what_it_cannot_compare() {
    let _machine = shared();
    let dir = tempdir("pyfleet-diff-input-");
    let p = dir.path();
    // Two snapshot directories of one service whose worker was replaced between them: the
    // process frames differ, the stacks compare.
    for (name, pid, alpha, beta) in [("old", 41, 30, 70), ("new", 42, 60, 40)] {
        std::fs::create_dir(p.join(name)).unwrap();
        std::fs::write(
            p.join(name).join("all.folded"),
            format!(
                "web-{pid};main (app.py:1);alpha (app.py:5) {alpha}\n\
                 web-{pid};main (app.py:1);beta (app.py:9) {beta}\n"
            ),
        )
        .unwrap();
    }
    let out_path = p.join("d.folded");
    let out = pyfleet(&[
        "diff",
        &arg(&p.join("old")),
        &arg(&p.join("new")),
        "-o",
        &arg(&out_path),
    ]);
    assert!(out.success(), "{}", out.describe());
    let deltas = std::fs::read_to_string(&out_path).unwrap();
    // By function: frames without their lines.
    assert!(
        deltas.contains("main (app.py);alpha (app.py) 30 60"),
        "{deltas}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&out_path).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the owner's only by default");

    // Mistakes: one line each, non-zero, nothing written.
    std::fs::write(p.join("bad.folded"), "main 1\nnot folded\n").unwrap();
    std::fs::write(p.join("empty.folded"), "").unwrap();
    let old = arg(&p.join("old"));
    for (args, says) in [
        (
            vec![
                old.clone(),
                arg(&p.join("nope")),
                "-o".into(),
                arg(&p.join("x.svg")),
            ],
            "nope",
        ),
        (
            vec![
                old.clone(),
                arg(&p.join("bad.folded")),
                "-o".into(),
                arg(&p.join("x.svg")),
            ],
            "line 2",
        ),
        (
            vec![
                old.clone(),
                arg(&p.join("empty.folded")),
                "-o".into(),
                arg(&p.join("x.svg")),
            ],
            "no samples",
        ),
        (
            vec![old.clone(), old.clone(), "-o".into(), arg(&p.join("x.png"))],
            ".svg",
        ),
        (
            vec![old.clone(), arg(p), "-o".into(), arg(&p.join("x.svg"))],
            "not a snapshot directory",
        ),
        (
            vec![
                old.clone(),
                old.clone(),
                "-o".into(),
                arg(&p.join("no/such/x.svg")),
            ],
            "-o",
        ),
    ] {
        let mut all = vec!["diff".to_string()];
        all.extend(args);
        let out = pyfleet(&all);
        assert!(!out.success(), "{}", out.describe());
        let err = out.stderr.trim_end();
        assert!(
            !err.contains('\n') && err.starts_with("pyfleet: ") && err.contains(says),
            "{says}: {}",
            out.describe()
        );
        assert!(!p.join("x.svg").exists() && !p.join("x.png").exists());
    }
}

/// `handle`'s and `report`'s seconds so far and the target's clock, from tests/targets/paced.py.
fn paced_times(dir: &Path) -> (f64, f64, f64, f64) {
    let text = std::fs::read_to_string(dir.join("times")).unwrap();
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap())
        .collect();
    (v[0], v[1], v[2], v[3])
}

/// What the paced target did over one recording.
struct Paced {
    /// `report`'s and `handle`'s own seconds per second of the target's clock.
    report: f64,
    handle: f64,
    /// Requests served, and `report`'s milliseconds per request.
    requests: u64,
    report_ms: f64,
}

/// Records `secs` seconds of the paced target as pprof (which says how it was sampled);
/// returns what the target did meanwhile.
fn record_paced(pid: i32, dir: &Path, secs: u32, out: &Path) -> Paced {
    let (h0, r0, t0, c0) = paced_times(dir);
    let r = pyfleet(&[
        "record",
        "--pid",
        &pid.to_string(),
        "--duration",
        &secs.to_string(),
        "-o",
        &arg(out),
    ]);
    assert!(r.success(), "{}", r.describe());
    let (h1, r1, t1, c1) = paced_times(dir);
    Paced {
        report: (r1 - r0) / (t1 - t0),
        handle: (h1 - h0) / (t1 - t0),
        requests: (c1 - c0) as u64,
        report_ms: 1e3 * (r1 - r0) / (c1 - c0).max(1.0),
    }
}

/// A 5x speed-up of `report`, beside a `handle` that costs the same per request: in shares
/// `handle` grows from a sixth to a half, though it did not change at all; in seconds per
/// second `report` is the change, shrinking by what the target measured. Each request's work
/// is timed by the wall clock while it runs, as the kernel capture's CPU clock counts it.
#[test]
fn diff_in_seconds_names_the_function_that_really_changed() {
    let _machine = alone();
    let interp = any_interpreter();
    let mut t = Proc::python(
        &interp.label,
        &interp.path,
        "paced.py",
        &["ready", "cost", "times"],
    );
    std::fs::write(t.dir().join("cost"), "50\n").unwrap();
    t.wait_for_file("ready", READY_TIMEOUT);
    let dir = tempdir("pyfleet-diff-paced-");
    let (base, new) = (dir.path().join("base.pb.gz"), dir.path().join("new.pb.gz"));
    std::thread::sleep(Duration::from_millis(500));
    let before = record_paced(t.pid(), t.dir(), 6, &base);
    std::fs::write(t.dir().join("cost"), "10\n").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let after = record_paced(t.pid(), t.dir(), 6, &new);
    let (report_before, handle_before) = (before.report, before.handle);
    let (report_after, handle_after) = (after.report, after.handle);
    t.kill();
    let truth = report_after - report_before;
    assert!(
        truth < -0.25,
        "the target's report: {report_before:.3} then {report_after:.3} s/s"
    );

    let svg = dir.path().join("diff.svg");
    let out = pyfleet(&["diff", &arg(&base), &arg(&new), "-o", &arg(&svg)]);
    assert!(out.success(), "{}", out.describe());
    eprintln!(
        "report {report_before:.3} -> {report_after:.3} s/s, handle {handle_before:.3} -> \
         {handle_after:.3} s/s\n{}",
        out.stdout
    );
    // The first row after the header: report, shrinking, by what it shrank.
    let first = out
        .stdout
        .lines()
        .skip_while(|l| !l.contains("seconds per second"))
        .nth(1)
        .unwrap_or_else(|| panic!("no summary in seconds:\n{}", out.stdout));
    assert!(first.contains("  report ("), "{}", out.stdout);
    let change: f64 = first.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(
        (change - truth).abs() <= 0.15 * truth.abs(),
        "the diff says report changed by {change:+.3} s/s, the target measured {truth:+.3}"
    );
    // handle did not change: in seconds, not more than a tenth of report's change.
    let handle_row = out
        .stdout
        .lines()
        .find(|l| l.contains("  handle ("))
        .unwrap_or_else(|| panic!("no handle row:\n{}", out.stdout));
    let handle_change: f64 = handle_row
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        handle_change.abs() <= 0.1 * truth.abs(),
        "handle changed by {handle_change:+.3} s/s: {}",
        out.stdout
    );
    // Both sides drawn: the base's shape beside the new one.
    let base_side = std::fs::read_to_string(dir.path().join("diff.base.svg"))
        .unwrap_or_else(|e| panic!("diff.base.svg: {e}\n{}", out.stdout));
    assert!(
        base_side.contains("the base&apos;s shape") || base_side.contains("the base's shape"),
        "the other side says what it is"
    );

    // Per request: with the requests each window served, report's own milliseconds per
    // request, its change within 15% of what the target measured (the windows' requests are
    // counted over a little more than each window: a few percent of it).
    let requests = format!("{},{}", before.requests, after.requests);
    let folded = dir.path().join("diff.folded");
    let out = pyfleet(&[
        "diff",
        &arg(&base),
        &arg(&new),
        "-o",
        &arg(&folded),
        "--requests",
        &requests,
    ]);
    assert!(out.success(), "{}", out.describe());
    let row = out
        .stdout
        .lines()
        .skip_while(|l| !l.contains("milliseconds per request"))
        .find(|l| l.contains("  report ("))
        .unwrap_or_else(|| panic!("no report row per request:\n{}", out.stdout));
    let change_ms: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
    let truth_ms = after.report_ms - before.report_ms;
    eprintln!(
        "report {:.1} -> {:.1} ms per request; the diff says {change_ms:+.1}",
        before.report_ms, after.report_ms
    );
    assert!(
        (change_ms - truth_ms).abs() <= 0.15 * truth_ms.abs(),
        "the diff says report changed by {change_ms:+.2} ms per request, the target measured \
         {truth_ms:+.2}:\n{}",
        out.stdout
    );
    let bad = pyfleet(&[
        "diff",
        &arg(&base),
        &arg(&new),
        "-o",
        &arg(&folded),
        "--requests",
        "5",
    ]);
    assert_error_contract(&bad, Some("--requests"));
}
