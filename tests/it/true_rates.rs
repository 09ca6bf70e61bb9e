//! Seconds are true when the CPU budget lowers the rate: every output says the rate the
//! samples were taken at (not the rate asked), and the seconds it gives are the target's.
//!
//! The target's one spinning thread wants a CPU all the time (the test runs alone), so in cpu
//! mode the seconds its samples stand for are the windows' length times the share of a CPU it
//! got over the run, whatever the rate: its threads' run time (schedstat, what cpu mode
//! counts by; a virtual machine's stolen time is not in it) over the run's wall time.
//! Windows take the batches that arrive in them, so a run of windows may differ from that by
//! one batch interval and one tick of the lowest rate at each end: the bound below. A budget of 0.01% of a core is far under what
//! any build costs at 100 Hz: the rate comes down to a few Hz within the first window, and a
//! build that divides by the rate asked is off by more than tenfold.

use crate::common::*;
use std::time::Duration;

/// The daemon's batch interval (`FleetConfig::batch_interval`).
const BATCH_INTERVAL_S: f64 = 1.0;
/// How far outputs of one window may disagree (rounding only).
const CONSISTENT_WITHIN: f64 = 0.02;

/// The run time of every thread of `pid` so far (ns, their schedstat's first field).
fn run_ns(pid: i32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn close(a: f64, b: f64, within: f64) -> bool {
    (a - b).abs() <= within * b.abs().max(1e-9)
}

#[test]
fn a_lowered_rate_is_said_everywhere_and_seconds_stay_true() {
    let _machine = alone();
    let any = any_interpreter();
    let mut spinner = Proc::python(&any.label, &any.path, "gil_busy.py", &["."]);
    spinner.wait_for_file("threads.json", READY_TIMEOUT);
    let dir = tempdir("pyfleet-rates-");
    let out = dir.path().join("snapshots");
    let port = free_port();
    let daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--pid",
            &spinner.pid().to_string(),
            "--mode",
            "cpu",
            // The sampling threads' rate is the one the budget lowers.
            "--capture",
            "reads",
            "--rate",
            "100",
            // A budget no build holds at 100 Hz: the rate comes down within seconds.
            "--max-cpu",
            "0.01",
            "--snapshot-interval",
            "4",
            "--snapshot-format",
            "folded,pprof",
            "--duration",
            "30",
            "--out",
            &out.display().to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]),
        Duration::from_secs(90),
    );
    let (cpu_before, wall_before) = (run_ns(spinner.pid()), std::time::Instant::now());
    // A live window from the page's API, once the rate came down.
    std::thread::sleep(Duration::from_secs(12));
    let (status, body) = http_get(port, "/api/window?seconds=4").expect("an answer");
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ran = daemon.finish();
    let share =
        (run_ns(spinner.pid()) - cpu_before) as f64 / 1e9 / wall_before.elapsed().as_secs_f64();
    spinner.kill();
    assert!(ran.status.success(), "{}", ran.describe());

    let (page_rate, page_seconds) = (
        page["rate_hz"].as_f64().expect("the window's rate"),
        page["seconds"].as_f64().expect("the window's seconds"),
    );
    let page_samples = page["samples"].as_u64().unwrap();
    assert!(page_rate < 50.0, "the page's window says {page_rate} Hz");
    assert!(
        close(
            page_seconds,
            page_samples as f64 / page_rate,
            CONSISTENT_WITHIN
        ),
        "{page}"
    );
    // A tap holds the batches that arrive while it is open (one batch interval and one tick
    // either way).
    assert!(
        (page_seconds - 4.0 * share.min(1.0)).abs() <= BATCH_INTERVAL_S + 1.0 / page_rate,
        "the page's 4 s window stands for {page_seconds} s, the spinner on a CPU {:.0}% of the \
         time: {page}",
        100.0 * share
    );

    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("metadata.json").is_file())
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    let (mut said_seconds, mut window_seconds, mut lowered) = (0.0, 0.0, 0);
    let mut lowest = f64::MAX;
    // The first window holds the attach; the last may be cut short by the stop.
    for snap in &names[1..names.len() - 1] {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(snap.join("metadata.json")).unwrap()).unwrap();
        let rate = meta["rate_hz"].as_f64().expect("rate_hz");
        let samples = meta["samples"].as_u64().unwrap() as f64;
        let window = meta["window_seconds"].as_f64().unwrap();
        assert_eq!(meta["rate_hz_asked"].as_f64(), Some(100.0), "{meta}");
        if rate < 50.0 {
            lowered += 1;
        }
        lowest = lowest.min(rate);
        let sampled: f64 = meta["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["sampled_seconds"].as_f64().unwrap())
            .sum();
        assert!(close(samples / rate, sampled, CONSISTENT_WITHIN), "{meta}");
        said_seconds += samples / rate;
        window_seconds += window;

        // pprof: the period is the rate's, the time values add up to the same seconds, the
        // duration is the window's.
        let p = pyfleet::output::pprof::decode(&std::fs::read(snap.join("profile.pb.gz")).unwrap())
            .unwrap();
        assert!(
            close(p.period as f64, 1e9 / rate, CONSISTENT_WITHIN),
            "period {} ns at {rate} Hz",
            p.period
        );
        let counts: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        let nanos: i64 = p.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(counts as f64, samples);
        assert!(
            close(nanos as f64 / 1e9, samples / rate, CONSISTENT_WITHIN),
            "pprof says {nanos} ns, metadata {samples} samples at {rate} Hz"
        );
        assert!(close(p.duration_nanos as f64 / 1e9, window, 0.001));
        let comment: Vec<&str> = p
            .comment
            .iter()
            .map(|&i| p.string_table[i as usize].as_str())
            .collect();
        assert!(
            comment.iter().any(|c| c.contains("Hz asked")) || rate >= 99.0,
            "{comment:?} at {rate} Hz"
        );
    }
    eprintln!(
        "{lowered} windows lowered; samples stand for {said_seconds:.2} s over windows of \
         {window_seconds:.2} s, the spinner on a CPU {:.1}% of the run; the page's {page_samples} samples at {page_rate:.1} Hz: \
         {page_seconds:.2} s of 4",
        100.0 * share
    );
    assert!(lowered > 0, "the budget never lowered the rate");
    let bound = 2.0 * (BATCH_INTERVAL_S + 1.0 / lowest);
    let on_cpu = window_seconds * share.min(1.0);
    assert!(
        (said_seconds - on_cpu).abs() <= bound,
        "the windows' samples stand for {said_seconds:.2} s of a spinner on a CPU \
         {on_cpu:.2} s of their {window_seconds:.2} s (at most {bound:.1} s apart at \
         {lowest:.1} Hz)"
    );
}
