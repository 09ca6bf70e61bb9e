//! Real code from PyPI (SymPy, Jinja2, pyparsing; pure Python, many short calls, C calling
//! back into Python), on every version 3.11-3.15: pyfleet's non-blocking samples against its
//! own `--blocking` ones (every thread paused for each read: one instant by construction),
//! recorded over the same seconds of the same process.
//!
//! What must hold, per version and library:
//! - failed samples at most [`MAX_FAILED_PERCENT`] of those attempted, non-blocking (the
//!   issue's goal is 1%; measured 0-1.9% on CI, SymPy on 3.11 and 3.12 the highest);
//! - samples shortened or empty (the target has one busy thread, so every sample written must
//!   hold Python frames and end at the script's `<module>`) at most [`MAX_SHORT_PERCENT`]
//!   non-blocking, none blocking;
//! - every function's self and total share within the workload's bounds ([`WORKLOADS`]) of
//!   the blocking reference.
//!
//! Sizing: each side takes about `RATE * SECONDS` = 1500 samples. Two samplers of the same
//! seconds differ by chance by about sqrt(2 p (1 - p) / 1500): under 1.1 points for a self
//! share (p at most 10% here) and under 1.8 for a total share (p up to 50%); samples close in
//! time are correlated, which the concurrent recording mostly cancels (both see the same
//! phases); the largest of some hundred functions by chance alone stays under about 4.5
//! points (self) in the README's measurements.
//!
//! The share bounds are NOT the 2 and 3 points issue #12 asks for; they sit above what is
//! measured so that this test guards failures, shortened samples and the size of the bias
//! against regressions while that work goes on. SymPy and pyparsing: self gaps measured up to
//! 8.9 points, total up to 17.5. Jinja2: self up to 22 points before the top was told by the
//! frames (README, "Exactness on real code"), the time of macros and of `Markup.__new__` (C
//! calling back into Python, calls shorter than a microsecond) counted to their callers
//! (`Context.call`, `escape`); now 1.3-5.5 on every version (3.11 since a callee of C code,
//! waiting on its own callee, is no longer taken for a frame that returned).
//!
//! The targets run on CPU 0 and pyfleet on CPU 1 when the machine has two (`taskset`): then
//! the target runs while it is read, the hard case.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Workloads (tests/targets/real_<name>.py) and their bounds on the largest self and total
/// share gap, in points.
const WORKLOADS: &[(&str, f64, f64)] = &[
    ("sympy", 12.0, 25.0),
    ("jinja", 12.0, 25.0),
    ("parser", 12.0, 25.0),
];
const RATE: u32 = 250;
/// The stop-the-world reference samples at a slightly different rate: at the same rate both
/// recorders tick in a fixed phase (on one CPU, the non-blocking one reading right after each
/// pause of the other), which biased the non-blocking side in some runs by up to 20 points on
/// short_calls.py (3.12, measured with the code before and after issue #12's work alike); at
/// 243 Hz the phase sweeps all of 4 ms every 35 samples and such runs did not recur.
const BLOCKING_RATE: u32 = 243;
const SECONDS: u32 = 6;
const MAX_FAILED_PERCENT: f64 = 3.0;
/// Measured up to 4.7% (CI, 3.12 Jinja2; 0-3.8% elsewhere): samples written without a Python
/// frame, torn reads the checks do not yet catch (issue #12).
const MAX_SHORT_PERCENT: f64 = 6.0;

/// `${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}/libs-3.X/bin/python` (scripts/setup-libs.sh).
fn venv_python(minor: u32) -> Option<PathBuf> {
    let base = match std::env::var_os("PYFLEET_VENVS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/pyfleet/venvs"),
    };
    let py = base.join(format!("libs-3.{minor}/bin/python"));
    (base.join(format!("libs-3.{minor}/.ready")).exists() && py.exists()).then_some(py)
}

/// `taskset -c CPU` when this machine has at least two CPUs and taskset exists.
fn pinned(cpu: u32, program: &Path) -> Command {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match on_path("taskset") {
        Some(taskset) if cpus >= 2 => {
            let mut c = Command::new(taskset);
            c.arg("-c").arg(cpu.to_string()).arg(program);
            c
        }
        _ => Command::new(program),
    }
}

/// A workload target: killed and reaped on drop; its stdin stays open while it lives (it
/// exits when stdin closes).
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(python: &Path, workload: &str) -> Target {
    start_script(python, &format!("real_{workload}.py"), &["1"])
}

fn start_script(python: &Path, script: &str, args: &[&str]) -> Target {
    let workload = script;
    let mut cmd = pinned(0, python);
    cmd.arg(target_script(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let mut child = cmd.spawn().expect("spawn workload");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(READY_TIMEOUT).unwrap_or_default();
    assert_eq!(
        line.trim(),
        "ready",
        "{workload} ({}) did not start",
        python.display()
    );
    Target(child)
}

/// Per function (name and file): samples where it is the leaf, and where it is anywhere.
struct Profile {
    samples: u64,
    leaf: BTreeMap<String, u64>,
    anywhere: BTreeMap<String, u64>,
    /// Samples whose outermost frame is not the script's `<module>`.
    unrooted: u64,
}

fn profile(folded: &Path) -> Profile {
    let text = std::fs::read_to_string(folded).unwrap_or_default();
    let mut p = Profile {
        samples: 0,
        leaf: BTreeMap::new(),
        anywhere: BTreeMap::new(),
        unrooted: 0,
    };
    for line in text.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        // `<process>-<pid>;root;...;leaf`, frames `function (file:line)`: keep name and file.
        let frames: Vec<String> = stack
            .split(';')
            .skip(1)
            .map(|f| match f.rsplit_once(':') {
                Some((head, _line)) => head.to_string(),
                None => f.to_string(),
            })
            .collect();
        p.samples += n;
        if !frames.first().is_some_and(|f| f.starts_with("<module> (")) {
            p.unrooted += n;
        }
        if let Some(leaf) = frames.last() {
            *p.leaf.entry(leaf.clone()).or_default() += n;
        }
        for f in frames.iter().collect::<BTreeSet<_>>() {
            *p.anywhere.entry(f.clone()).or_default() += n;
        }
    }
    p
}

/// The largest difference in share (points) between two profiles, and of which function.
fn largest_gap(
    a: &BTreeMap<String, u64>,
    na: u64,
    b: &BTreeMap<String, u64>,
    nb: u64,
) -> (f64, String) {
    let share = |m: &BTreeMap<String, u64>, n: u64, k: &str| {
        100.0 * *m.get(k).unwrap_or(&0) as f64 / n.max(1) as f64
    };
    a.keys()
        .chain(b.keys())
        .map(|k| ((share(a, na, k) - share(b, nb, k)).abs(), k.clone()))
        .fold(
            (0.0, String::new()),
            |best, x| if x.0 > best.0 { x } else { best },
        )
}

/// (samples written, failed samples) from record's last line.
fn counts(stderr: &str) -> (u64, u64) {
    let number_before = |needle: &str| {
        stderr
            .split(needle)
            .next()
            .and_then(|head| head.split_whitespace().last())
            .and_then(|w| w.parse::<u64>().ok())
    };
    let written = stderr
        .split("wrote ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    let failed = if stderr.contains(" failed sample") {
        number_before(" failed sample").unwrap_or(u64::MAX)
    } else {
        0
    };
    (written, failed)
}

/// Records `target` without stopping it and with `--blocking` over the same seconds, into
/// `dir/STEM-nb.folded` and `dir/STEM-b.folded`, then stops it. Returns the non-blocking
/// record's output and both files, or what went wrong.
fn record_both(
    target: Target,
    dir: &Path,
    stem: &str,
) -> Result<(RunOutput, PathBuf, PathBuf), String> {
    let pid = target.0.id() as i32;
    let nb_file = dir.join(format!("{stem}-nb.folded"));
    let b_file = dir.join(format!("{stem}-b.folded"));
    let nb = record(pid, &nb_file, false);
    let b = record(pid, &b_file, true);
    let (nb, b) = (nb.finish(), b.finish());
    drop(target);
    match nb.success() && b.success() {
        true => Ok((nb, nb_file, b_file)),
        false => Err(format!("{} / {}", nb.describe(), b.describe())),
    }
}

fn record(pid: i32, out: &Path, blocking: bool) -> Running {
    let mut cmd = pinned(1, &pyfleet_exe());
    let rate = match blocking {
        true => BLOCKING_RATE,
        false => RATE,
    };
    cmd.args(["record", "--pid", &pid.to_string()])
        .args([
            "--rate",
            &rate.to_string(),
            "--duration",
            &SECONDS.to_string(),
        ])
        .arg("-o")
        .arg(out);
    if blocking {
        cmd.arg("--blocking");
    }
    Running::start(cmd, Duration::from_secs(u64::from(SECONDS) + 60))
}

#[test]
fn real_libraries_sampled_without_stopping_match_stop_the_world() {
    let dir = tempdir("pyfleet-real-code-");
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for interp in interpreters() {
        let Some(python) = venv_python(interp.minor) else {
            if std::env::var("PYFLEET_ALLOW_MISSING").is_ok_and(|v| v == "1") {
                eprintln!(
                    "PYFLEET_ALLOW_MISSING=1: no libs venv for 3.{}",
                    interp.minor
                );
                continue;
            }
            panic!(
                "no venv libs-3.{} (run scripts/setup-libs.sh)",
                interp.minor
            );
        };
        if report
            .iter()
            .any(|(v, ..): &(u32, String, String)| *v == interp.minor)
        {
            continue; // one run per minor version (3.11 has two interpreters)
        }
        for &(workload, max_self, max_total) in WORKLOADS {
            let what = format!("[3.{} {workload}]", interp.minor);
            let target = start(&python, workload);
            let stem = format!("{}-{workload}", interp.minor);
            let (nb, nb_file, b_file) = match record_both(target, dir.path(), &stem) {
                Ok(done) => done,
                Err(e) => {
                    failures.push(format!("{what} record failed: {e}"));
                    continue;
                }
            };
            let (nb_written, nb_failed) = counts(&nb.stderr);
            let failed_pct = 100.0 * nb_failed as f64 / (nb_written + nb_failed).max(1) as f64;
            let (pn, pb) = (profile(&nb_file), profile(&b_file));
            let (self_gap, self_fn) = largest_gap(&pn.leaf, pn.samples, &pb.leaf, pb.samples);
            let (total_gap, total_fn) =
                largest_gap(&pn.anywhere, pn.samples, &pb.anywhere, pb.samples);
            report.push((
                interp.minor,
                workload.to_string(),
                format!(
                    "{what} {} samples, {failed_pct:.2}% failed, {} shortened; blocking {} \
                     samples; largest self gap {self_gap:.2} ({self_fn}), total gap \
                     {total_gap:.2} ({total_fn})",
                    pn.samples,
                    nb_written.saturating_sub(pn.samples) + pn.unrooted,
                    pb.samples
                ),
            ));
            if pn.samples < u64::from(RATE * SECONDS) / 2
                || pb.samples < u64::from(RATE * SECONDS) / 4
            {
                failures.push(format!(
                    "{what} too few samples: {} / {}",
                    pn.samples, pb.samples
                ));
            }
            if failed_pct > MAX_FAILED_PERCENT {
                failures.push(format!(
                    "{what} {failed_pct:.2}% of samples failed: {}",
                    nb.stderr.trim()
                ));
            }
            let short = nb_written.saturating_sub(pn.samples) + pn.unrooted;
            let short_pct = 100.0 * short as f64 / nb_written.max(1) as f64;
            if short_pct > MAX_SHORT_PERCENT || pb.unrooted > 0 {
                failures.push(format!(
                    "{what} shortened samples: {} written, {} with frames; not ending at \
                     <module>: {} non-blocking, {} blocking",
                    nb_written, pn.samples, pn.unrooted, pb.unrooted
                ));
            }
            if self_gap > max_self || total_gap > max_total {
                failures.push(format!(
                    "{what} shares differ from the blocking reference: self {self_gap:.2} \
                     points ({self_fn}), total {total_gap:.2} points ({total_fn})"
                ));
            }
        }
    }
    for (.., line) in &report {
        eprintln!("{line}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Calls shorter than a read of a stack (tests/targets/short_calls.py: `caller` calls `inner`,
/// then the loop runs `plain`, about 1.7 µs in all), on every version (their frames say
/// whether they are live; see `Liveness`): the top frame is found from the frames as read, not
/// from a pointer read a microsecond earlier, so `caller` (1-2% as the leaf stop-the-world) is
/// not counted for `inner`, and `inner` shows on top of `plain` (which never calls it) in
/// under 1% of samples (measured 0-0.5%). Before: `caller` 30-40% as the leaf (3.14, 3.15:
/// 27%).
///
/// Sizing: about 1500 samples a side; `inner` and `plain` near 50% differ by chance by about
/// 1.8 points (one standard deviation of the difference), so 8 points is over four of them;
/// `caller` near 1% by about 0.4 by chance, but it keeps a bias of up to 4.1 points (CI: 4.7%
/// against 0.6%): 8 points guards it (before this work: 30-40). Leaf gaps measured up to 6.0
/// (3.11-3.15), but in about one run in 25 a gap of 10-20 points on one version, with the code
/// before this work too (the machine is shared; not chance: four standard deviations is
/// 1 in 15,000): a version that misses is recorded once more and judged by that run.
#[test]
fn calls_shorter_than_a_read_are_counted_where_they_run() {
    let dir = tempdir("pyfleet-short-calls-");
    let mut failures = Vec::new();
    let mut done = Vec::new();
    for interp in interpreters() {
        if !(11..=15).contains(&interp.minor) || done.contains(&interp.minor) {
            continue;
        }
        done.push(interp.minor);
        // A second recording when the first misses: see the sizing above.
        let first = short_calls_once(&interp, dir.path(), "a");
        if let Err(first) = first {
            eprintln!("{first}\n(recorded again)");
            if let Err(second) = short_calls_once(&interp, dir.path(), "b") {
                failures.push(format!("{first}\nagain: {second}"));
            }
        }
    }
    assert!(!done.is_empty(), "no 3.11-3.15 interpreter found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One recording of short_calls.py each way; `Err` says what missed.
fn short_calls_once(interp: &Interp, dir: &Path, attempt: &str) -> Result<(), String> {
    let what = format!("[{}]", interp.label);
    let target = start_script(&interp.path, "short_calls.py", &[]);
    let stem = format!("{}-{attempt}", interp.minor);
    let (_, nb_file, b_file) =
        record_both(target, dir, &stem).map_err(|e| format!("{what} record failed: {e}"))?;
    let (pn, pb) = (profile(&nb_file), profile(&b_file));
    let share = |p: &Profile, name: &str| {
        let n: u64 = p
            .leaf
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name} (")))
            .map(|(_, v)| v)
            .sum();
        100.0 * n as f64 / p.samples.max(1) as f64
    };
    let (gap, worst) = largest_gap(&pn.leaf, pn.samples, &pb.leaf, pb.samples);
    let caller = (share(&pn, "caller"), share(&pb, "caller"));
    // Stacks with `inner` right above `plain`.
    let text = std::fs::read_to_string(&nb_file).unwrap_or_default();
    let spliced: u64 = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(stack, _)| {
            let frames: Vec<&str> = stack.split(';').collect();
            frames
                .windows(2)
                .any(|w| w[0].starts_with("plain (") && w[1].starts_with("inner ("))
        })
        .map(|(_, n)| n.parse::<u64>().unwrap_or(0))
        .sum();
    eprintln!(
        "{what} {} samples (blocking {}): caller {:.1}% (blocking {:.1}%), largest leaf gap \
         {gap:.1} ({worst}), {spliced} spliced",
        pn.samples, pb.samples, caller.0, caller.1
    );
    let mut missed = Vec::new();
    if pn.samples < u64::from(RATE * SECONDS) / 2 || pb.samples < u64::from(RATE * SECONDS) / 4 {
        missed.push(format!(
            "{what} too few samples: {} / {}",
            pn.samples, pb.samples
        ));
    }
    if caller.0 > caller.1 + 8.0 || gap > 8.0 {
        missed.push(format!(
            "{what} caller {:.1}% against {:.1}% stop-the-world; largest leaf gap {gap:.1} \
             points ({worst})",
            caller.0, caller.1
        ));
    }
    if spliced * 100 > pn.samples {
        missed.push(format!(
            "{what} {spliced} of {} samples show inner above plain",
            pn.samples
        ));
    }
    match missed.is_empty() {
        true => Ok(()),
        false => Err(missed.join("\n")),
    }
}
