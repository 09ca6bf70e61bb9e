//! Real code from PyPI (SymPy, Jinja2, pyparsing; pure Python, many short calls, C calling
//! back into Python), on every version 3.11-3.15: pyfleet's non-blocking samples against its
//! own `--blocking` ones (every thread paused for each read: one instant by construction),
//! recorded over the same seconds of the same process.
//!
//! What must hold, per version and library (issue #12):
//! - failed samples at most [`MAX_FAILED_PERCENT`] (1%) of those attempted, non-blocking
//!   (beyond chance: [`Z`] binomial standard errors, about 0.65 points at 3,750 attempts);
//! - no sample shortened: the target has one busy thread, so every sample written must hold
//!   Python frames (none may lack them) and end at the script's `<module>` (at most
//!   [`MAX_SHORT_PERCENT`] non-blocking, [`MAX_REFERENCE_SHORT_PERCENT`] blocking);
//! - every function's self share within [`SELF_GOAL`] (2) points and its total share within
//!   [`TOTAL_GOAL`] (3) points of the blocking reference, as a statistical test (below). The
//!   kernel capture (`--capture kernel`, at [`KERNEL_RATE`], in cpu and in wall mode) is held
//!   to the goals themselves; the default sampler, reading the running target from outside, to
//!   the goals plus [`SELF_ALLOWANCE`] and [`TOTAL_ALLOWANCE`] (its bias, measured in
//!   BENCHMARKS.md). Both print how far each cell is from the goals themselves.
//!
//! Sizing. A share measured from `n` samples differs from the share of the same seconds by
//! chance; two recorders of the same seconds differ by about `se = sqrt(p (1 - p) (1/n1 +
//! 1/n2))` (p the pooled share), less where both see the same long phases (the concurrent
//! recording cancels what the workload does slowly, so this binomial figure is an upper
//! bound; `PYFLEET_REAL_CODE_NULL=1` replaces the blocking reference by a second non-blocking
//! recorder to show chance alone). A function fails only when its gap exceeds its bound (the
//! goal, plus an allowance while the goal is not met) by more than [`Z`] (4) times `se`: a
//! function whose true gap is the bound fails by chance less than once in 30,000. With
//! [`SECONDS`] (15) at 250 Hz non-blocking and 487 Hz blocking (about 3,750 and 7,300
//! samples), `se` is 0.60 points for a 10% share and 1.0 for a 50% one, so against the goals
//! alone the test would fail a self gap of about 4.4 points and a total gap of about 7.0 at
//! those shares; the gaps themselves, and how far past the goals, are printed for every cell.
//! The kernel capture records the same seconds at [`KERNEL_RATE`] (500 Hz), in cpu and in
//! wall mode, beside the reads and against the same reference (about 7,400 samples a side:
//! `se` 0.49 and 0.82 points at those shares, failing gaps of about 4.0 and 6.3).
//!
//! All recorders of a cell run at once, against one reference: the test spends each cell's
//! seconds once, not once per sampler. The capture costs the target a few microseconds per
//! sample in its interrupt and needs no read, so it does not change what the reads see; the
//! reads pause nothing, so they do not change what the capture sees.
//!
//! `PYFLEET_REAL_CODE_SECONDS` and `PYFLEET_REAL_CODE_ONLY` (`3.12:parser,3.15:jinja`) are
//! for measuring by hand; CI sets neither.
//!
//! The targets run on CPU 0 and pyfleet on CPU 1 when the machine has two (`taskset`): then
//! the target runs while it is read, the hard case. The tests have the machine alone
//! (`alone()`): another test's processes on those CPUs would change what is measured.
//!
//! The binary measured is `PYFLEET_EXACTNESS_BIN` when set (scripts/test.sh sets it to the
//! release build, which users run: how far a thread moves while it is read depends on how
//! fast pyfleet gets through a read, and a debug build is several times slower), else the
//! debug build `cargo test` made.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Workloads: tests/targets/real_<name>.py.
const WORKLOADS: &[&str] = &["sympy", "jinja", "parser"];
/// The non-blocking recorder's rate (the short-calls test's too).
const RATE: u32 = 250;
/// The stop-the-world reference's rate. Not a multiple of [`RATE`]: at the same rate both
/// recorders tick in a fixed phase (on one CPU, the non-blocking one reading right after each
/// pause of the other), which biased the non-blocking side in some runs by up to 20 points on
/// short_calls.py; at a rate that is not a multiple the phase sweeps the whole interval. A
/// blocking sample stops the target about 0.2 ms: at 487 Hz it is stopped about 10% of the
/// time (a non-blocking sample that lands then reads a still stack).
const BLOCKING_RATE: u32 = 487;
/// The short-calls test's reference rate (see [`BLOCKING_RATE`]).
const SHORT_CALLS_BLOCKING_RATE: u32 = 243;
/// Seconds each real-library cell records (`PYFLEET_REAL_CODE_SECONDS` overrides).
const SECONDS: u32 = 15;
/// The kernel capture's rate: a sample costs the target a few microseconds of its interrupt
/// and pyfleet no read, so it samples at twice the reads' rate, for more samples in the same
/// seconds.
const KERNEL_RATE: u32 = 500;
/// Seconds each short-calls recording takes.
const SHORT_CALLS_SECONDS: u32 = 6;
const MAX_FAILED_PERCENT: f64 = 1.0;
/// Samples written without a Python frame or not ending at `<module>`: torn reads the checks
/// do not catch.
const MAX_SHORT_PERCENT: f64 = 1.0;
/// The same for the stop-the-world reference, whose stacks are the truth: 0.1%. Not zero: a
/// fresh clone's run had one of 7,303 `--blocking` samples of 3.11 SymPy not ending at
/// `<module>` (and one of 12,800 of the kernel capture beside it), as a thread stopped between
/// 3.11 publishing a new C frame and setting its current frame would show; issue #32 finds
/// the cause and removes it.
const MAX_REFERENCE_SHORT_PERCENT: f64 = 0.1;
/// Issue #12's goals, points of share.
const SELF_GOAL: f64 = 2.0;
const TOTAL_GOAL: f64 = 3.0;
/// What the goals are not met by yet (issue #12 is open): the test fails a gap past its goal
/// plus this allowance (plus chance, [`Z`]). Largest gaps measured on this design (release
/// build, 30 s): self +7.5 points (3.15 Jinja2 `Environment.getattr`), total +8.0 (3.14
/// pyparsing `_skipIgnorables`). The largest self gaps vary from run to run far beyond the
/// binomial error (3.15 Jinja2 `Environment.getattr` +4.6 to +7.5 over three runs, 3.15
/// pyparsing `Regex.parseImpl` +4.7 to +7.0 over seven), which the allowance covers; why
/// they vary is not known yet. Each cell's gaps are printed, and how far past the goal.
const SELF_ALLOWANCE: f64 = 5.0;
const TOTAL_ALLOWANCE: f64 = 8.0;
/// Standard errors a gap must exceed its bound by to fail (see the module doc).
const Z: f64 = 4.0;

/// `${PYFLEET_VENVS:-~/.cache/pyfleet/venvs}/libs-3.X/bin/python` (scripts/setup-libs.sh),
/// once the script has finished it (`.ready`). None only when it is missing and
/// PYFLEET_ALLOW_MISSING=1: the test leaves that version out (see `skip_or_fail`).
#[track_caller]
fn libs_python(minor: u32) -> Option<PathBuf> {
    let venv = venvs_dir().join(format!("libs-3.{minor}"));
    let py = venv.join("bin/python");
    if venv.join(".ready").exists() && py.exists() {
        return Some(py);
    }
    skip_or_fail(&[Missing {
        what: format!("venv libs-3.{minor} ({})", venv.display()),
        setup: SETUP_LIBS.to_string(),
        part: Some(format!("3.{minor}")),
    }]);
    None
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
    gaps(a, na, b, nb)
        .into_iter()
        .map(|g| (g.points.abs(), g.function))
        .fold(
            (0.0, String::new()),
            |best, x| if x.0 > best.0 { x } else { best },
        )
}

/// One function's share in two profiles: the difference (points, first minus second) and the
/// standard error of that difference by chance alone (points; see the module doc).
struct Gap {
    function: String,
    points: f64,
    se: f64,
}

impl Gap {
    /// Standard errors by which the gap exceeds `goal` (negative: within it).
    fn excess(&self, goal: f64) -> f64 {
        (self.points.abs() - goal) / self.se.max(1e-9)
    }
}

fn gaps(a: &BTreeMap<String, u64>, na: u64, b: &BTreeMap<String, u64>, nb: u64) -> Vec<Gap> {
    let (na, nb) = (na.max(1) as f64, nb.max(1) as f64);
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let (ka, kb) = (
                *a.get(k).unwrap_or(&0) as f64,
                *b.get(k).unwrap_or(&0) as f64,
            );
            let pooled = (ka + kb) / (na + nb);
            Gap {
                function: k.clone(),
                points: 100.0 * (ka / na - kb / nb),
                se: 100.0 * (pooled * (1.0 - pooled) * (1.0 / na + 1.0 / nb)).sqrt(),
            }
        })
        .collect()
}

/// The gap of largest size, and the one that exceeds `goal` by most standard errors.
fn worst(gaps: &[Gap], goal: f64) -> (&Gap, &Gap) {
    let largest = gaps
        .iter()
        .max_by(|x, y| x.points.abs().total_cmp(&y.points.abs()));
    let most_excess = gaps
        .iter()
        .max_by(|x, y| x.excess(goal).total_cmp(&y.excess(goal)));
    match (largest, most_excess) {
        (Some(l), Some(m)) => (l, m),
        _ => panic!("no function in either profile"),
    }
}

/// `+2.65 ± 0.91 (+0.7 se past 2) ABCMeta.__instancecheck__ (abc)`: the function with its
/// file's last component.
fn describe_gap(g: &Gap, goal: f64) -> String {
    let function = match g.function.rsplit_once(" (") {
        Some((name, file)) => {
            let file = file.rsplit('/').next().unwrap_or(file);
            format!("{name} ({file})")
        }
        None => g.function.clone(),
    };
    format!(
        "{:+.2} ± {:.2} ({:+.1} se past {goal}) {function}",
        g.points,
        g.se,
        g.excess(goal),
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

/// How the recording compared with the stop-the-world reference takes its samples.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sampler {
    /// pyfleet reads the running target's memory at each tick (the default).
    Reads,
    /// `--capture kernel`: the kernel copies the frames at the CPU's sampling interrupt.
    Kernel,
    /// The same in wall mode: on the CPU at the interrupts, off it in the stack the thread
    /// left with (recorded beside `Kernel`, against the same reference).
    KernelWall,
}

impl Sampler {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Sampler::Reads => &["--capture", "reads"],
            Sampler::Kernel => &["--capture", "kernel"],
            Sampler::KernelWall => &["--capture", "kernel", "--mode", "wall"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sampler::Reads => "reads",
            Sampler::Kernel => "kernel",
            Sampler::KernelWall => "kernel wall",
        }
    }

    fn rate(self) -> u32 {
        match self {
            Sampler::Reads => RATE,
            Sampler::Kernel | Sampler::KernelWall => KERNEL_RATE,
        }
    }

    /// What the gaps may exceed the goals by: nothing for the kernel capture; the reads'
    /// allowance while their goal is not met (see the module documentation).
    fn allowance(self) -> (f64, f64) {
        match self {
            Sampler::Reads => (SELF_ALLOWANCE, TOTAL_ALLOWANCE),
            Sampler::Kernel | Sampler::KernelWall => (0.0, 0.0),
        }
    }
}

/// How a target is recorded both ways.
#[derive(Clone, Copy)]
struct Plan<'a> {
    /// The recorders that do not stop the target, all at once, against the same reference.
    samplers: &'a [Sampler],
    seconds: u32,
    blocking_rate: u32,
    /// The reference is a second non-blocking recorder (`--read-only`, so that two samplers
    /// do not share the 3.15 marker): chance alone, for measuring by hand.
    null: bool,
}

/// What one recorder without stopping the target gave: its sampler, output and file.
type Recorded = (Sampler, RunOutput, PathBuf);

/// What [`record_both`] gave: the non-blocking records, the reference's file, and the CPU
/// seconds the target used from before the recorders started until they all ended.
struct Recordings {
    non_blocking: Vec<Recorded>,
    reference: PathBuf,
    target_cpu_seconds: f64,
}

/// Records `target` without stopping it (with each of the plan's samplers at once) and with
/// `--blocking` over the same seconds, into `dir/STEM-nb.folded` (`-nb2`, `-nb3` for the
/// others) and `dir/STEM-b.folded`, then stops it. Returns the recordings, or what went wrong.
fn record_both(target: Target, dir: &Path, stem: &str, plan: Plan) -> Result<Recordings, String> {
    let pid = target.0.id() as i32;
    let cpu_before = cpu_ticks(pid);
    let b_file = dir.join(format!("{stem}-b.folded"));
    let running: Vec<(Sampler, Running, PathBuf)> = plan
        .samplers
        .iter()
        .enumerate()
        .map(|(i, &sampler)| {
            let suffix = match i {
                0 => String::new(),
                i => (i + 1).to_string(),
            };
            let file = dir.join(format!("{stem}-nb{suffix}.folded"));
            let r = record(pid, &file, sampler.rate(), sampler.flags(), plan.seconds);
            (sampler, r, file)
        })
        .collect();
    let reference: &[&str] = match plan.null {
        true => &["--read-only"],
        false => &["--blocking"],
    };
    let b = record(pid, &b_file, plan.blocking_rate, reference, plan.seconds);
    let done: Vec<Recorded> = running
        .into_iter()
        .map(|(sampler, r, file)| (sampler, r.finish(), file))
        .collect();
    let b = b.finish();
    let target_cpu_seconds = cpu_ticks(pid).saturating_sub(cpu_before) as f64 / CLOCK_TICKS;
    drop(target);
    let failed: Vec<String> = done
        .iter()
        .map(|d| &d.1)
        .chain([&b])
        .filter(|r| !r.success())
        .map(RunOutput::describe)
        .collect();
    match failed.is_empty() {
        true => Ok(Recordings {
            non_blocking: done,
            reference: b_file,
            target_cpu_seconds,
        }),
        false => Err(failed.join(" / ")),
    }
}

fn record(pid: i32, out: &Path, rate: u32, flags: &[&str], seconds: u32) -> Running {
    let mut cmd = pinned(1, &measured_exe());
    cmd.args(["record", "--pid", &pid.to_string()])
        .args([
            "--rate",
            &rate.to_string(),
            "--duration",
            &seconds.to_string(),
        ])
        .args(flags)
        .arg("-o")
        .arg(out);
    Running::start(cmd, Duration::from_secs(u64::from(seconds) + 60))
}

/// The real-library plan for `samplers`, and which cells to run: CI's unless the environment
/// says otherwise (see the module doc).
fn real_code_plan(samplers: &[Sampler]) -> (Plan<'_>, Option<Vec<String>>) {
    let seconds = std::env::var("PYFLEET_REAL_CODE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS);
    let only = std::env::var("PYFLEET_REAL_CODE_ONLY")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let null = std::env::var("PYFLEET_REAL_CODE_NULL").is_ok_and(|v| v == "1");
    let plan = Plan {
        samplers,
        seconds,
        blocking_rate: match null {
            true => RATE - 7,
            false => BLOCKING_RATE,
        },
        null,
    };
    (plan, only)
}

/// The reads (`--capture reads`) and, where this machine has it, the kernel capture
/// (`--capture kernel`) against the same reference. The capture is held to the goals
/// themselves (no allowance): each of its samples is one instant's chain, copied while the
/// thread was interrupted. Its wall mode (issue #32) is held to the same: the workload's one
/// thread runs nearly all the time, so its wall profile is its cpu profile, plus the
/// reference's pauses counted where they stopped it.
#[test]
fn real_libraries_read_and_captured_match_stop_the_world() {
    let _machine = alone();
    let samplers: &[Sampler] = match crate::capture::kernel_capture_available(&measured_exe()) {
        true => &[Sampler::Reads, Sampler::Kernel, Sampler::KernelWall],
        false => &[Sampler::Reads],
    };
    compare_with_stop_the_world(samplers);
}

/// Records every cell with each of `samplers` and with `--blocking` over the same seconds, and
/// checks them against each other (see the module documentation). The caller has the machine
/// alone.
fn compare_with_stop_the_world(samplers: &[Sampler]) {
    let dir = tempdir("pyfleet-real-code-");
    let (plan, only) = real_code_plan(samplers);
    let mut failures = Vec::new();
    let mut done = Vec::new();
    let mut left_out = Vec::new();
    for interp in interpreters() {
        if done.contains(&interp.minor) || left_out.contains(&interp.minor) {
            continue; // one run per minor version (3.11 has two interpreters)
        }
        let Some(python) = libs_python(interp.minor) else {
            left_out.push(interp.minor);
            continue;
        };
        done.push(interp.minor);
        for &workload in WORKLOADS {
            let cell = format!("3.{}:{workload}", interp.minor);
            if only.as_ref().is_some_and(|o| !o.contains(&cell)) {
                continue;
            }
            let what = format!("[{cell}]");
            let target = start(&python, workload);
            let stem = format!("{}-{workload}", interp.minor);
            let recordings = match record_both(target, dir.path(), &stem, plan) {
                Ok(done) => done,
                Err(e) => {
                    failures.push(format!("{what} record failed: {e}"));
                    continue;
                }
            };
            let pb = profile(&recordings.reference);
            let cpu_seconds = recordings.target_cpu_seconds;
            for (sampler, nb, nb_file) in recordings.non_blocking {
                let what = format!("[{cell} {}]", sampler.name());
                let recording = Recording {
                    sampler,
                    output: &nb,
                    file: &nb_file,
                };
                judge(&what, plan, recording, &pb, cpu_seconds, &mut failures);
            }
        }
    }
    assert!(
        !done.is_empty() || !left_out.is_empty(),
        "no 3.11-3.15 interpreter found"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One non-blocking recording: who took it, what it printed, where it wrote.
struct Recording<'a> {
    sampler: Sampler,
    output: &'a RunOutput,
    file: &'a Path,
}

/// Checks one recording against the reference (see the module documentation), pushing what
/// misses into `failures`. `cpu_seconds` is what the target used over the recordings.
fn judge(
    what: &str,
    plan: Plan,
    recording: Recording,
    pb: &Profile,
    cpu_seconds: f64,
    failures: &mut Vec<String>,
) {
    let Recording {
        sampler,
        output: nb,
        file: nb_file,
    } = recording;
    let (self_allowance, total_allowance) = sampler.allowance();
    let (nb_written, nb_failed) = counts(&nb.stderr);
    let failed_pct = 100.0 * nb_failed as f64 / (nb_written + nb_failed).max(1) as f64;
    let pn = profile(nb_file);
    let short = nb_written.saturating_sub(pn.samples) + pn.unrooted;
    let short_pct = 100.0 * short as f64 / nb_written.max(1) as f64;
    let self_gaps = gaps(&pn.leaf, pn.samples, &pb.leaf, pb.samples);
    let total_gaps = gaps(&pn.anywhere, pn.samples, &pb.anywhere, pb.samples);
    let (self_largest, self_worst) = worst(&self_gaps, SELF_GOAL);
    let (total_largest, total_worst) = worst(&total_gaps, TOTAL_GOAL);
    eprintln!(
        "{what} {} samples, {failed_pct:.2}% failed, {short} shortened; reference {} \
         samples; the target ran {cpu_seconds:.1} s\n  self: largest {}; most past the goal {}\n  total: largest {}; \
         most past the goal {}",
        pn.samples,
        pb.samples,
        describe_gap(self_largest, SELF_GOAL),
        describe_gap(self_worst, SELF_GOAL),
        describe_gap(total_largest, TOTAL_GOAL),
        describe_gap(total_worst, TOTAL_GOAL),
    );
    // Cpu-mode samples follow the CPU the target used, which a busy machine takes from it
    // (CI once gave the target a third of CPU 0 for minutes): the expected counts are the
    // rates times those seconds, at most the recording's. Wall mode samples every tick.
    let running_seconds = cpu_seconds.min(f64::from(plan.seconds));
    let expected = match sampler {
        Sampler::Reads | Sampler::Kernel => f64::from(sampler.rate()) * running_seconds,
        Sampler::KernelWall => f64::from(sampler.rate() * plan.seconds),
    };
    let expected_reference = f64::from(plan.blocking_rate) * running_seconds;
    if (pn.samples as f64) < expected / 2.0 || (pb.samples as f64) < expected_reference / 2.0 {
        failures.push(format!(
            "{what} too few samples: {} / {} (the target ran {cpu_seconds:.1} s of {} s)",
            pn.samples, pb.samples, plan.seconds
        ));
    }
    // Failures come in bursts (a phase of the workload that moves fast): failed by
    // more than [`Z`] binomial standard errors past the goal.
    let attempts = (nb_written + nb_failed).max(1) as f64;
    let failed_se = 100.0 * (0.01 * 0.99 / attempts).sqrt();
    if failed_pct > MAX_FAILED_PERCENT + Z * failed_se {
        failures.push(format!(
            "{what} {failed_pct:.2}% of samples failed: {}",
            nb.stderr.trim()
        ));
    }
    // A sample without frames is no instant of a thread that runs Python (issue #32:
    // a read in the moment an eval loop is entered): none may be written.
    let frameless = nb_written.saturating_sub(pn.samples);
    if frameless > 0 {
        failures.push(format!(
            "{what} {frameless} of {nb_written} samples written without frames"
        ));
    }
    let reference_short_pct = 100.0 * pb.unrooted as f64 / pb.samples.max(1) as f64;
    if short_pct > MAX_SHORT_PERCENT || reference_short_pct > MAX_REFERENCE_SHORT_PERCENT {
        failures.push(format!(
            "{what} shortened samples: {} written, {} with frames; not ending at \
             <module>: {} non-blocking, {} reference",
            nb_written, pn.samples, pn.unrooted, pb.unrooted
        ));
    }
    for (gaps, bound, kind) in [
        (&self_gaps, SELF_GOAL + self_allowance, "self"),
        (&total_gaps, TOTAL_GOAL + total_allowance, "total"),
    ] {
        let (_, worst) = worst(gaps, bound);
        if worst.excess(bound) > Z {
            failures.push(format!(
                "{what} a {kind} share differs from the reference by more than \
                 {bound} points beyond chance: {}",
                describe_gap(worst, bound)
            ));
        }
    }
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
    let _machine = alone();
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
    let plan = Plan {
        samplers: &[Sampler::Reads],
        seconds: SHORT_CALLS_SECONDS,
        blocking_rate: SHORT_CALLS_BLOCKING_RATE,
        null: false,
    };
    let Recordings {
        non_blocking,
        reference: b_file,
        target_cpu_seconds,
    } = record_both(target, dir, &stem, plan).map_err(|e| format!("{what} record failed: {e}"))?;
    let nb_file = non_blocking
        .into_iter()
        .next()
        .map(|(_, _, file)| file)
        .ok_or_else(|| format!("{what} nothing recorded"))?;
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
    // As in `judge`: cpu-mode samples follow the CPU the target got.
    let running_seconds = target_cpu_seconds.min(f64::from(SHORT_CALLS_SECONDS));
    let expected = f64::from(RATE) * running_seconds;
    if (pn.samples as f64) < expected / 2.0 || (pb.samples as f64) < expected / 4.0 {
        missed.push(format!(
            "{what} too few samples: {} / {} (the target ran {target_cpu_seconds:.1} s of \
             {SHORT_CALLS_SECONDS} s)",
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
