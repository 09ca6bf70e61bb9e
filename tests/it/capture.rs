//! The kernel capture (`--capture kernel`) end to end, on every version: `record` and the
//! daemon sample a spinning thread of a target in its own pid namespace (the BPF program sees
//! host thread ids, which the capture must watch), the waiting thread never shows (it is not
//! on a CPU), threads that start after the capture did are learnt within a tick or two, and
//! what the capture cannot do is refused with one line. Its exactness on real code is
//! `real_code::real_libraries_read_and_captured_match_stop_the_world`.

use crate::common::*;
use crate::namespace::contained;
use std::path::Path;
use std::time::Duration;

/// Whether this host can use the kernel capture (`doctor --json` says so: it starts the
/// capture for a moment); when it cannot (no privilege, no BPF), the tests are left out unless
/// they must run (`CI` or `PYFLEET_REQUIRE_ALL`).
pub fn kernel_capture_available(exe: &Path) -> bool {
    let out = std::process::Command::new(exe)
        .args(["doctor", "--json"])
        .output()
        .expect("run pyfleet doctor");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let available = doc["capture"]["available"] == true;
    if !available {
        let why = doc["capture"]["why"]
            .as_str()
            .unwrap_or("doctor said nothing");
        let must =
            std::env::var_os("CI").is_some() || std::env::var_os("PYFLEET_REQUIRE_ALL").is_some();
        assert!(!must, "the kernel capture is not available: {why}");
        eprintln!("left out: the kernel capture is not available: {why}");
    }
    available
}

/// Samples of `spin (` and of `wait (` in folded text.
pub fn spin_and_wait(text: &str) -> (u64, u64) {
    let count = |needle: &str| -> u64 {
        text.lines()
            .filter(|s| s.contains(needle))
            .filter_map(|s| s.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    (count("spin ("), count("wait ("))
}

#[test]
fn captured_samples_of_a_contained_target_from_record_and_the_daemon() {
    // Alone: it counts the samples the spinner gets.
    let _machine = alone();
    if !kernel_capture_available(&pyfleet_exe()) {
        return;
    }
    let Some(unshare) = tool("unshare", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let mut failures = Vec::new();
    for interp in interpreters() {
        let l = &interp.label;
        let dir = tempdir("pyfleet-capture-");
        let out_dir = dir.path().display().to_string();
        let mut t = contained(&unshare, l, &interp.path, "gil_busy.py", &[&out_dir]);
        t.unshare
            .wait_for_path(&dir.path().join("threads.json"), Duration::from_secs(30));
        let pid = t.pid;
        let p = pid.to_string();

        // record: 2 s at 100 Hz of a thread on a CPU all the time, about 200 samples.
        let folded = dir.path().join("cpu.folded");
        let out = pyfleet(&[
            "record",
            "--pid",
            &p,
            "--duration",
            "2",
            "--capture",
            "kernel",
            "-o",
            folded.to_str().unwrap(),
        ]);
        let text = std::fs::read_to_string(&folded).unwrap_or_default();
        let (spin, wait) = spin_and_wait(&text);
        if !out.success() || spin < 100 || wait > 0 {
            failures.push(format!(
                "[{l}] record --capture kernel: {spin} samples of the spinner, {wait} of the \
                 waiting thread; {}\n{}",
                out.describe(),
                truncate(&text, 600)
            ));
        }

        // The daemon: one snapshot at the end of its 3 s.
        let snapshots = dir.path().join("snapshots");
        let out = pyfleet(&[
            "run",
            "--pid",
            &p,
            "--duration",
            "3",
            "--capture",
            "kernel",
            "--metrics-addr",
            "off",
            "--snapshot-format",
            "folded",
            "--out",
            snapshots.to_str().unwrap(),
        ]);
        let text: String = snapshot_dirs(&snapshots)
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .filter(|e| e.path().extension().is_some_and(|x| x == "folded"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        let (spin, wait) = spin_and_wait(&text);
        if !out.success() || spin < 100 || wait > 0 {
            failures.push(format!(
                "[{l}] run --capture kernel: {spin} samples of the spinner, {wait} of the \
                 waiting thread; {}\n{}",
                out.describe(),
                truncate(&text, 600)
            ));
        }
        t.unshare.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The samples and failed samples `record`'s end line reports.
fn written_and_failed(stderr: &str) -> (u64, u64) {
    let number_before = |needle: &str| -> u64 {
        stderr
            .lines()
            .filter_map(|l| l.split(needle).next()?.rsplit(' ').next()?.parse().ok())
            .next()
            .unwrap_or(0)
    };
    (
        number_before(" thread samples"),
        number_before(" failed sample"),
    )
}

#[test]
fn threads_that_start_later_are_learnt_within_a_tick() {
    // Alone: it compares the samples with the target's CPU time.
    let _machine = alone();
    if !kernel_capture_available(&pyfleet_exe()) {
        return;
    }
    let mut failures = Vec::new();
    for interp in interpreters() {
        let l = &interp.label;
        let mut t = Proc::python(l, &interp.path, "thread_per_task.py", &["ready"]);
        t.wait_for_file("ready", Duration::from_secs(30));
        let pid = t.pid();
        let p = pid.to_string();
        let folded = t.dir().join("tasks.folded");
        // 4 s at 100 Hz: eight threads of 0.5 s each, each new to pyfleet when it starts.
        let before = cpu_ticks(pid);
        let out = pyfleet(&[
            "record",
            "--pid",
            &p,
            "--duration",
            "4",
            "--capture",
            "kernel",
            "-o",
            folded.to_str().unwrap(),
        ]);
        // Clock ticks are 10 ms, a sample at 100 Hz: the target's CPU time in samples.
        let on_cpu = cpu_ticks(pid).saturating_sub(before);
        let text = std::fs::read_to_string(&folded).unwrap_or_default();
        let count = |needle: &str| -> u64 {
            text.lines()
                .filter(|s| s.contains(needle))
                .filter_map(|s| s.rsplit(' ').next()?.parse::<u64>().ok())
                .sum()
        };
        let (tasks, waits) = (count("task_body ("), count("wait_for_task ("));
        let (written, failed) = written_and_failed(&out.stderr);
        // A thread is learnt at the first tick (every 100 ms) after it first runs: each
        // thread loses about 50 ms of its 500 ms, as failed samples. Half the CPU time
        // captured is far below that and far above what listing threads once a second got
        // (about a quarter); captured and failed together account for all of it but what
        // the scheduler's and the recording's edges blur (a quarter either way).
        let whole = tasks + failed;
        // The waiting thread runs only for the moments between two tasks.
        if !out.success()
            || waits * 50 > whole
            || tasks * 2 < on_cpu
            || whole * 4 < on_cpu * 3
            || whole * 4 > on_cpu * 5
            || written < tasks
        {
            failures.push(format!(
                "[{l}] {tasks} samples of the task threads and {failed} failed, {waits} of the \
                 waiting thread, {written} written, for {on_cpu} ticks of CPU time; {}\n{}",
                out.describe(),
                truncate(&text, 600)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn what_the_capture_cannot_do_is_one_line() {
    let _machine = shared();
    let dir = tempdir("pyfleet-capture-errors-");
    let out_file = dir.path().join("x.folded");
    let out_file = out_file.to_str().unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["record", "--pid", "1", "--capture", "kernel", "--blocking"],
            "does not go with --blocking",
        ),
        (
            &["record", "--pid", "1", "--capture", "bpf"],
            "--capture must be auto, reads or kernel",
        ),
        (
            &["run", "--pid", "1", "--capture", "everything"],
            "capture must be auto, reads or kernel",
        ),
    ];
    for (args, says) in cases {
        let mut all: Vec<&str> = args.to_vec();
        if args[0] == "record" {
            all.extend(["-o", out_file]);
        }
        let out = pyfleet(&all);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert!(
            !out.success() && lines.len() == 1 && lines[0].contains(says),
            "pyfleet {all:?} must fail with one line saying {says:?}: {}",
            out.describe()
        );
        assert!(
            !Path::new(out_file).exists(),
            "pyfleet {all:?} wrote {out_file}"
        );
    }
}

/// Seconds of recording in [`record_phases`].
const PHASES_SECONDS: u32 = 4;

/// One `record` of a phases target (`script`, which logs each phase it goes through with its
/// start and end on CLOCK_MONOTONIC) on `interp`, [`PHASES_SECONDS`] at 200 Hz with `args`:
/// per phase, the seconds the target spent in it while recorded and the samples whose stack
/// (from `<module>`) names it; and the samples naming `other` (a function of another thread).
/// While recorded: from pyfleet's first line (said once the capture runs, as the duration
/// starts) for the duration; the phases are cut at its edges. `Err`: the run failed.
fn record_phases(
    dir: &Path,
    interp: &Interp,
    script: &str,
    args: &[&str],
    phases: &[&str],
    other: &str,
) -> Result<(Vec<f64>, Vec<u64>, u64), String> {
    let log = dir.join(format!("{}-{script}.log", interp.label));
    let arg = log.to_str().unwrap().to_string();
    let mut target = Proc::python(&interp.label, &interp.path, script, &[&arg, "120"]);
    target.wait_for_path(&log, READY_TIMEOUT);
    let out = dir.join(format!("{}-{script}.folded", interp.label));
    let stderr = dir.join(format!("{}-{script}.stderr", interp.label));
    let mut cmd = std::process::Command::new(measured_exe());
    cmd.args(record_args(target.pid(), args, 200, PHASES_SECONDS, &out))
        .env_remove("RUST_LOG");
    let mut from = 0.0;
    let (status, said) =
        run_marking_first_line(cmd, &stderr, PYFLEET_TIMEOUT, || from = seconds_now());
    match status {
        None => return Err(format!("[{}] pyfleet did not finish: {said}", interp.label)),
        Some(status) if !status.success() => {
            return Err(format!(
                "[{}] pyfleet failed ({status}): {said}",
                interp.label
            ))
        }
        Some(_) => {}
    }
    let until = from + f64::from(PHASES_SECONDS);
    // The target flushes its log every 0.05 s: wait for a phase that ends past the window.
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let ends_after = |text: &str| {
        text.lines()
            .rev()
            .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .is_some_and(|end| end > until)
    };
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    while !ends_after(&logged()) {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "[{}] the target's log stops before the window's end",
                interp.label
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    target.kill();
    let mut time = vec![0.0; phases.len()];
    for line in logged().lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let [name, start, end] = parts[..] else {
            continue;
        };
        let (Ok(start), Ok(end)) = (start.parse::<f64>(), end.parse::<f64>()) else {
            continue;
        };
        if let Some(i) = phases.iter().position(|p| *p == name) {
            time[i] += (end.min(until) - start.max(from)).max(0.0);
        }
    }
    let (mut samples, mut others) = (vec![0u64; phases.len()], 0);
    for line in std::fs::read_to_string(&out).unwrap_or_default().lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n = n.parse::<u64>().unwrap_or(0);
        let names: Vec<&str> = stack
            .split(';')
            .skip(1)
            .map(|f| f.split(" (").next().unwrap_or(""))
            .collect();
        if names.contains(&other) {
            others += n;
        }
        if names.first() != Some(&"<module>") {
            continue;
        }
        if let Some(i) = phases.iter().position(|p| names.contains(p)) {
            samples[i] += n;
        }
    }
    Ok((time, samples, others))
}

/// CLOCK_MONOTONIC now, in seconds (the targets' `time.monotonic()`).
fn seconds_now() -> f64 {
    pyfleet::capture::wall_time::now_ns() as f64 / 1e9
}

/// Each phase's share of the samples against its share of `time` (seconds that count in the
/// mode), within `points`; a line per interpreter, failures into `failures`.
fn compare_shares(
    label: &str,
    phases: &[&str],
    time: &[f64],
    samples: &[u64],
    points: f64,
    failures: &mut Vec<String>,
) {
    let (total_time, total_samples) = (time.iter().sum::<f64>(), samples.iter().sum::<u64>());
    let mut said = Vec::new();
    for (i, phase) in phases.iter().enumerate() {
        let by_time = 100.0 * time[i] / total_time.max(1e-9);
        let by_samples = 100.0 * samples[i] as f64 / total_samples.max(1) as f64;
        said.push(format!("{phase} {by_time:.1}% / {by_samples:.1}%"));
        if (by_time - by_samples).abs() > points {
            failures.push(format!(
                "[{label}] {phase}: {by_samples:.1}% of the samples, {by_time:.1}% of the time"
            ));
        }
    }
    eprintln!(
        "[{label}] {total_samples} samples in the phases (time / samples): {}",
        said.join(", ")
    );
    // 4 s at 200 Hz: about 800 samples of the main thread's time in wall mode, 530 in gil.
    if total_samples < 400 {
        failures.push(format!(
            "[{label}] only {total_samples} samples of the phases"
        ));
    }
}

/// Wall mode from the capture (issue #32): tests/targets/phases.py's main thread spends known
/// times computing, asleep, waiting for a lock another thread holds and blocked on a pipe,
/// beside two spinning threads, and logs each phase's start and end. Recorded in wall mode
/// with the capture on every version, each phase's share of the main thread's samples in the
/// four phases must be within 2 points of its share of their time in the recorded window.
/// Sizing: 4 s at 200 Hz, about 700 samples of the phases; time off the CPU is counted, not
/// drawn (from the switches the kernel reports), and on the CPU the capture samples each CPU
/// at its interrupt, so the error is a phase's on-CPU part quantised to the period and the
/// window's edges (pyfleet's first line stands for the start, within a few milliseconds):
/// measured 0.0-0.9 points, 0.3 typical (a window cut at whole cycles, as this test did
/// before, gave up to 3.2).
#[test]
fn wall_mode_from_the_capture_matches_the_targets_own_timing() {
    let _machine = shared();
    if !kernel_capture_available(&measured_exe()) {
        return;
    }
    const PHASES: [&str; 4] = ["compute", "nap", "locked", "piped"];
    let dir = tempdir("pyfleet-wall-phases-");
    let mut failures = Vec::new();
    for interp in interpreters() {
        if !(11..=15).contains(&interp.minor) {
            continue;
        }
        let args = ["--mode", "wall", "--capture", "kernel"];
        match record_phases(dir.path(), &interp, "phases.py", &args, &PHASES, "") {
            Ok((time, samples, _)) => {
                compare_shares(&interp.label, &PHASES, &time, &samples, 2.0, &mut failures)
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// gil mode from the capture: the GIL holder's stack, on its CPU (a busy loop) or off it (a C
/// call made holding the GIL), and nothing of time without it (a sleep; a thread waiting all
/// along). Shares within 2 points of the target's own timing, as wall mode's; the phase
/// without the GIL and the waiting thread at most 1% of the samples (a handful of samples
/// at the edges of a phase, as the GIL changes hands).
#[test]
fn gil_mode_from_the_capture_follows_the_holder_on_and_off_its_cpu() {
    let _machine = shared();
    if !kernel_capture_available(&measured_exe()) {
        return;
    }
    const PHASES: [&str; 3] = ["compute", "blocked", "nap"];
    let dir = tempdir("pyfleet-gil-phases-");
    let mut failures = Vec::new();
    for interp in interpreters() {
        if !(11..=15).contains(&interp.minor) {
            continue;
        }
        let args = ["--mode", "gil", "--capture", "kernel"];
        let (mut time, samples, idle) =
            match record_phases(dir.path(), &interp, "gil_phases.py", &args, &PHASES, "idle") {
                Ok(r) => r,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
        let label = &interp.label;
        // The nap does not hold the GIL: none of its time counts.
        time[2] = 0.0;
        compare_shares(label, &PHASES, &time, &samples, 2.0, &mut failures);
        let total: u64 = samples.iter().sum::<u64>() + idle;
        let without = samples[2] + idle;
        if without as f64 > 0.01 * total as f64 {
            failures.push(format!(
                "[{label}] {without} of {total} samples without the GIL (nap {}, idle {idle})",
                samples[2]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
