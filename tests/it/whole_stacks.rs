//! Reads that never cut or empty a stack (issue #32): a worker started by `threading.Thread`
//! (tests/targets/entries.py) whose work enters the eval loop anew in every way it can
//! (through `*args, **kwargs`, C calling back into Python, a generator resumed from C), read
//! from outside (`--capture reads`) in cpu and wall modes on every interpreter 3.11-3.15.
//! Every sample must hold frames and start where its thread starts (`<module>` or
//! `Thread._bootstrap`); every sample of the worker must hold `work` with only the functions
//! `work` calls above it. Not a statistical check: a cut or empty stack is a defect at any
//! rate, so the bound is zero (before the fix, 3.11 cut 6-31% of the worker's samples at
//! `Thread.run`). The binary is the measured one (`PYFLEET_EXACTNESS_BIN`): how far a thread
//! moves during a read depends on how fast the build reads.

use crate::common::*;

const SECONDS: u32 = 2;
const RATE: u32 = 250;
/// Fewest samples of the worker for a run to count (see where it is checked).
const MIN_WORKER_SAMPLES: u64 = 200;
/// What `work` calls (the worker's frames above it), by qualified name.
const ABOVE_WORK: &[&str] = &[
    "leaf",
    "by_kwargs",
    "recurse",
    "keyed",
    "work.<locals>.<genexpr>",
];

/// What is wrong with one folded profile of entries.py, and its worker's sample count.
fn defects(folded: &str) -> (Vec<String>, u64) {
    let mut bad = Vec::new();
    let mut worker = 0u64;
    for line in folded.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            bad.push(format!("not a folded line: {line:?}"));
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        // The first part names the process.
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        let name = |f: &str| f.split(" (").next().unwrap_or("").to_string();
        let names: Vec<String> = frames.iter().map(|f| name(f)).collect();
        let ok = match names.first().map(String::as_str) {
            Some("<module>") => names.get(1).is_some_and(|f| f == "main"),
            Some("Thread._bootstrap") => {
                worker += n;
                names
                    .iter()
                    .position(|f| f == "work")
                    .is_some_and(|w| names[w + 1..].iter().all(|f| ABOVE_WORK.contains(&&**f)))
            }
            _ => false,
        };
        if !ok {
            bad.push(format!("{n} x {stack}"));
        }
    }
    (bad, worker)
}

#[test]
fn threads_started_by_threading_are_read_whole_on_every_version() {
    let _machine = shared();
    let dir = tempdir("pyfleet-whole-stacks-");
    let mut failures = Vec::new();
    let mut done = 0;
    for interp in interpreters() {
        if !(11..=15).contains(&interp.minor) {
            continue;
        }
        done += 1;
        let mut target = Proc::python(&interp.label, &interp.path, "entries.py", &["120"]);
        wait_until(
            READY_TIMEOUT,
            "entries.py to print ready",
            || target.stdout().contains("ready"),
            || target.stderr(),
        );
        for mode in ["cpu", "wall"] {
            let out = dir.path().join(format!("{}-{mode}.folded", interp.label));
            let mut cmd = std::process::Command::new(measured_exe());
            let args = ["--capture", "reads", "--mode", mode];
            cmd.args(record_args(target.pid(), &args, RATE, SECONDS, &out))
                .env_remove("RUST_LOG");
            let run = run_with_timeout(cmd, PYFLEET_TIMEOUT);
            if !run.success() {
                failures.push(format!("[{} {mode}] {}", interp.label, run.describe()));
                continue;
            }
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            let (bad, worker) = defects(&text);
            let cut: u64 = bad
                .iter()
                .filter_map(|b| b.split(" x ").next()?.parse::<u64>().ok())
                .sum();
            eprintln!(
                "[{} {mode}] {worker} samples of the worker, {cut} cut or empty",
                interp.label
            );
            if !bad.is_empty() {
                failures.push(format!(
                    "[{} {mode}] stacks cut or empty:\n  {}",
                    interp.label,
                    bad.join("\n  ")
                ));
            }
            // Enough samples that a cut at the old rate (6% and more) could not hide: with 200,
            // none would be cut with probability 0.94^200 = 4e-6. (In cpu mode the worker shares
            // the GIL with the main thread: 240-340 of its 500 ticks were seen.)
            if worker < MIN_WORKER_SAMPLES {
                failures.push(format!(
                    "[{} {mode}] only {worker} samples of the worker",
                    interp.label
                ));
            }
        }
        target.kill();
    }
    assert!(done > 0, "no 3.11-3.15 interpreter found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_cut_or_empty_stack_is_reported() {
    let _machine = shared();
    let cut = "entries-1;Thread._bootstrap (t.py:1);Thread._bootstrap_inner (t.py:2);\
               Thread.run (t.py:3) 5\n";
    let whole = "entries-1;Thread._bootstrap (t.py:1);Thread.run (t.py:3);work (e.py:4);\
                 keyed (e.py:5);leaf (e.py:6) 7\nentries-1;<module> (e.py:9);main (e.py:8) 2\n";
    assert_eq!(defects(whole), (vec![], 7));
    assert_eq!(defects(cut).0.len(), 1);
    assert_eq!(defects("entries-1 3\n").0.len(), 1);
}
