//! Threads by name against real interpreters 3.11-3.15 (tests/targets/named_threads.py: a
//! busy thread, one sleeping in its own code, one waiting on an Event, an idle
//! ThreadPoolExecutor, each named at the OS level, and one that renames itself once started):
//! `dump` shows each thread's name as the threading module gives it and its kernel name;
//! `record --threads` roots each thread's stacks at a frame naming it (its threading name),
//! and never files one thread's stack under another; wall mode leaves the threads waiting for work out unless
//! `--idle`, by the kernel capture and by reads alike.

use crate::common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The threads of named_threads.py that wait for work, by their threading names.
const IDLE: [&str; 5] = [
    "MainThread",
    "waiter",
    "pool_0",
    "pool_1",
    "wörker-renamed-after-start",
];

fn named_threads(interp: &Interp) -> Proc {
    let mut p = Proc::python(&interp.label, &interp.path, "named_threads.py", &["ready"]);
    p.wait_for_file("ready", READY_TIMEOUT);
    p
}

/// Samples per thread name of a `--threads` folded profile, after checking that each line's
/// thread frame is second (under the process) and that its frames are that thread's own:
/// the function named after the thread (`cruncher`, `napper`, `waiter`) or, for the pool's
/// workers, the pool's `_worker`.
fn by_thread(folded: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut counts = BTreeMap::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').ok_or(format!("bad line {line:?}"))?;
        let n: u64 = n.parse().map_err(|_| format!("bad count in {line:?}"))?;
        let frames: Vec<&str> = stack.split(';').collect();
        let thread = frames
            .get(1)
            .and_then(|f| f.strip_prefix("thread "))
            .and_then(|f| f.split_once(" (tid "))
            .map(|(name, _)| name.to_string())
            .ok_or(format!("no thread frame second in {line:?}"))?;
        let own = match thread.as_str() {
            "cruncher" | "napper" | "waiter" => format!("{thread} ("),
            // Its kernel name: the one it set, or (3.14+) what CPython set from the new one.
            t if t.starts_with("renamer") || t.starts_with("wörker") => "renamer (".to_string(),
            t if t.starts_with("pool_") => "_worker (".to_string(),
            _ => "main (".to_string(),
        };
        if !frames.iter().skip(2).any(|f| f.starts_with(&own)) {
            return Err(format!("{thread}'s line without {own}..): {line}"));
        }
        *counts.entry(thread).or_default() += n;
    }
    Ok(counts)
}

/// A `--threads` folded recording of 2 s in wall mode, under way.
struct Recording {
    run: Running,
    out: PathBuf,
    extra: Vec<String>,
}

/// Starts recording `pid` with `extra` options into `out`; the recordings of one target run
/// at once (each sees the same threads doing the same things).
fn start_record(pid: i32, extra: &[&str], out: &Path) -> Recording {
    let pid = pid.to_string();
    let mut args = vec![
        "record",
        "--pid",
        &pid,
        "--mode",
        "wall",
        "--duration",
        "2",
        "--threads",
        "-f",
        "folded",
        "--force",
        "-o",
    ];
    let out_s = out.to_str().unwrap_or_default();
    args.push(out_s);
    args.extend_from_slice(extra);
    Recording {
        run: start_pyfleet(&args),
        out: out.to_path_buf(),
        extra: extra.iter().map(|e| e.to_string()).collect(),
    }
}

/// Samples per thread name of a recording (see [`by_thread`]), once it ended.
fn finish_record(recording: Recording) -> Result<BTreeMap<String, u64>, String> {
    let Recording { run, out, extra } = recording;
    let run = run.finish();
    if !run.success() {
        return Err(run.describe());
    }
    let text = fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    by_thread(&text).map_err(|e| format!("{extra:?}: {e}\n{}", run.describe()))
}

#[test]
fn threads_are_named_and_idle_ones_left_out_in_wall_mode() {
    let _machine = shared();
    let mut failures = Vec::new();
    for interp in interpreters() {
        let label = &interp.label;
        let target = named_threads(&interp);
        let pid = target.pid();
        let tmp = tempdir("pyfleet-threads-");

        // dump: every thread's threading name (the renamed one's new name; the main
        // thread's "MainThread") and kernel name.
        let dump = pyfleet(&["dump", "--pid", &pid.to_string(), "--json"]);
        let threads = serde_json::from_str::<Value>(&dump.stdout)
            .ok()
            .and_then(|v| v["interpreters"][0]["threads"].as_array().cloned())
            .unwrap_or_default();
        let field = |key: &str| -> BTreeSet<String> {
            threads
                .iter()
                .filter_map(|t| t[key].as_str().map(str::to_string))
                .collect()
        };
        let (names, os_names) = (field("name"), field("os_name"));
        let want_names = [
            "MainThread",
            "cruncher",
            "napper",
            "waiter",
            "pool_0",
            "pool_1",
            "wörker-renamed-after-start",
        ];
        if names != want_names.iter().map(|n| n.to_string()).collect() {
            failures.push(format!(
                "{label}: dump's thread names {names:?}\n{}",
                dump.describe()
            ));
        }
        for want in ["cruncher", "napper", "waiter", "pool_0", "pool_1"] {
            if !os_names.contains(want) {
                failures.push(format!(
                    "{label}: dump without kernel name {want}: {os_names:?}"
                ));
            }
        }

        // Wall mode, by default: the working threads, none of the idle ones; by the
        // capture (as root) and by reads. With --idle: every thread.
        let by_default: Vec<(&str, Recording)> = ["auto", "reads"]
            .into_iter()
            .map(|capture| {
                let out = tmp.path().join(format!("{capture}.folded"));
                (capture, start_record(pid, &["--capture", capture], &out))
            })
            .collect();
        let idle = start_record(pid, &["--idle"], &tmp.path().join("idle.folded"));
        for (capture, recording) in by_default {
            match finish_record(recording) {
                Err(e) => failures.push(format!("{label} {capture}: {e}")),
                Ok(counts) => {
                    for want in ["cruncher", "napper"] {
                        if counts.get(want).copied().unwrap_or(0) == 0 {
                            failures.push(format!("{label} {capture}: no {want}: {counts:?}"));
                        }
                    }
                    if counts.keys().any(|t| t != "cruncher" && t != "napper") {
                        failures.push(format!(
                            "{label} {capture}: threads waiting for work kept: {counts:?}"
                        ));
                    }
                }
            }
        }

        match finish_record(idle) {
            Err(e) => failures.push(format!("{label} --idle: {e}")),
            Ok(counts) => {
                for want in ["cruncher", "napper"].into_iter().chain(IDLE) {
                    if counts.get(want).copied().unwrap_or(0) == 0 {
                        failures.push(format!("{label} --idle: no {want}: {counts:?}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn idle_goes_with_wall_mode_only() {
    let _machine = shared();
    let tmp = tempdir("pyfleet-idle-");
    let out = tmp.path().join("p.svg");
    let out = out.to_str().unwrap_or_default();
    for (mode, flag) in [("cpu", "--idle"), ("gil", "--no-idle")] {
        let run = pyfleet(&["record", "--pid", "1", "--mode", mode, flag, "-o", out]);
        assert_error_contract(&run, Some(flag));
    }
    let run = pyfleet(&["run", "--mode", "cpu", "--idle", "--duration", "1"]);
    assert_error_contract(&run, Some("--idle"));
}
