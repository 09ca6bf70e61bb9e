//! `pyfleet dump` must reproduce, frame for frame, the stacks that CPython itself reports for
//! a process whose threads are all parked (tests/targets/stacks.py), on every supported
//! interpreter, with and without sub-interpreters.

use crate::common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// (interpreter label, with sub-interpreters)
const CASES: &[(&str, bool)] = &[
    ("3.11-debian", false),
    ("3.11-pyenv", false),
    ("3.12-pyenv", false),
    ("3.12-pyenv", true),
    ("3.13-pyenv", false),
    ("3.13-pyenv", true),
    ("3.14", false),
    ("3.14", true),
    ("3.15", false),
    ("3.15", true),
];

macro_rules! exact_tests {
    ($($name:ident => $label:expr, $subinterp:expr;)*) => {
        $(
            #[test]
            fn $name() {
                let _machine = shared();
                assert!(CASES.contains(&($label, $subinterp)));
                check_exact($label, $subinterp);
            }
        )*
    };
}

exact_tests! {
    exact_3_11_debian => "3.11-debian", false;
    exact_3_11_pyenv => "3.11-pyenv", false;
    exact_3_12_pyenv => "3.12-pyenv", false;
    exact_3_12_pyenv_subinterpreters => "3.12-pyenv", true;
    exact_3_13_pyenv => "3.13-pyenv", false;
    exact_3_13_pyenv_subinterpreters => "3.13-pyenv", true;
    exact_3_14 => "3.14", false;
    exact_3_14_subinterpreters => "3.14", true;
    exact_3_15 => "3.15", false;
    exact_3_15_subinterpreters => "3.15", true;
}

/// Every interpreter of the common list has test cases here (with sub-interpreters from 3.12).
#[test]
fn every_interpreter_is_covered() {
    let _machine = shared();
    for interp in interpreters() {
        assert!(
            CASES.contains(&(interp.label.as_str(), false)),
            "no exactness test for interpreter {}",
            interp.label
        );
        if interp.minor >= 12 {
            assert!(
                CASES.contains(&(interp.label.as_str(), true)),
                "no sub-interpreter exactness test for interpreter {}",
                interp.label
            );
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    function: String,
    qualname: String,
    file: String,
    line: i64,
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} [{}] {}:{}",
            self.qualname, self.function, self.file, self.line
        )
    }
}

struct ExpectedInterp {
    exclude: BTreeSet<u64>,
    threads: BTreeMap<u64, Vec<Frame>>,
    names: BTreeMap<u64, String>,
    native_ids: BTreeMap<u64, i64>,
}

struct Expected {
    pid: i64,
    version: (u64, u64, u64),
    version_string: String,
    interpreters: BTreeMap<u64, ExpectedInterp>,
}

fn field<'a>(v: &'a Value, key: &str, ctx: &str) -> Result<&'a Value, String> {
    v.get(key).ok_or_else(|| {
        format!(
            "{ctx}: missing key {key:?} in {}",
            truncate(&v.to_string(), 300)
        )
    })
}

fn as_str<'a>(v: &'a Value, key: &str, ctx: &str) -> Result<&'a str, String> {
    field(v, key, ctx)?
        .as_str()
        .ok_or_else(|| format!("{ctx}: {key:?} is not a string: {}", v[key]))
}

fn as_i64(v: &Value, key: &str, ctx: &str) -> Result<i64, String> {
    field(v, key, ctx)?
        .as_i64()
        .ok_or_else(|| format!("{ctx}: {key:?} is not an integer: {}", v[key]))
}

fn as_u64(v: &Value, key: &str, ctx: &str) -> Result<u64, String> {
    field(v, key, ctx)?
        .as_u64()
        .ok_or_else(|| format!("{ctx}: {key:?} is not a non-negative integer: {}", v[key]))
}

fn as_bool(v: &Value, key: &str, ctx: &str) -> Result<bool, String> {
    field(v, key, ctx)?
        .as_bool()
        .ok_or_else(|| format!("{ctx}: {key:?} is not a boolean: {}", v[key]))
}

fn as_array<'a>(v: &'a Value, key: &str, ctx: &str) -> Result<&'a Vec<Value>, String> {
    field(v, key, ctx)?
        .as_array()
        .ok_or_else(|| format!("{ctx}: {key:?} is not an array"))
}

fn parse_frames(v: &Value, ctx: &str) -> Result<Vec<Frame>, String> {
    let arr = v
        .as_array()
        .ok_or_else(|| format!("{ctx}: frames is not an array"))?;
    arr.iter()
        .enumerate()
        .map(|(i, f)| {
            let ctx = format!("{ctx} frame #{i}");
            Ok(Frame {
                function: as_str(f, "function", &ctx)?.to_string(),
                qualname: as_str(f, "qualname", &ctx)?.to_string(),
                file: as_str(f, "file", &ctx)?.to_string(),
                line: as_i64(f, "line", &ctx)?,
            })
        })
        .collect()
}

fn parse_ident(s: &str, ctx: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("{ctx}: thread ident {s:?} is not an integer"))
}

fn parse_expected(path: &Path) -> Expected {
    let text = fs::read_to_string(path).unwrap();
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: bad JSON: {e}", path.display()));
    let ctx = "expected.json";
    let version: Vec<u64> = as_array(&v, "version", ctx)
        .unwrap()
        .iter()
        .map(|x| x.as_u64().expect("version component"))
        .collect();
    let mut interpreters = BTreeMap::new();
    for (id, it) in field(&v, "interpreters", ctx)
        .unwrap()
        .as_object()
        .expect("interpreters object")
    {
        let ctx = format!("expected.json interpreter {id}");
        let exclude = as_array(it, "exclude", &ctx)
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let mut threads = BTreeMap::new();
        for (ident, frames) in field(it, "threads", &ctx).unwrap().as_object().unwrap() {
            let frames = parse_frames(frames, &format!("{ctx} thread {ident}")).unwrap();
            assert!(!frames.is_empty(), "{ctx}: thread {ident} has no frames");
            threads.insert(parse_ident(ident, &ctx), frames);
        }
        let names = field(it, "names", &ctx)
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, n)| (parse_ident(k, &ctx), n.as_str().unwrap().to_string()))
            .collect();
        let native_ids = field(it, "native_ids", &ctx)
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, n)| (parse_ident(k, &ctx), n.as_i64().unwrap()))
            .collect();
        interpreters.insert(
            id.parse::<u64>().expect("interpreter id"),
            ExpectedInterp {
                exclude,
                threads,
                names,
                native_ids,
            },
        );
    }
    Expected {
        pid: as_i64(&v, "pid", ctx).unwrap(),
        version: (version[0], version[1], version[2]),
        version_string: as_str(&v, "version_string", ctx).unwrap().to_string(),
        interpreters,
    }
}

struct DumpThread {
    native_thread_id: i64,
    holds_gil: bool,
    on_cpu: bool,
    frames: Vec<Frame>,
}

/// Parses the dump, checking its shape; returns interpreter id -> thread id -> thread.
fn parse_dump(v: &Value, errors: &mut Vec<String>) -> BTreeMap<u64, BTreeMap<u64, DumpThread>> {
    let mut out = BTreeMap::new();
    let interps = match as_array(v, "interpreters", "dump") {
        Ok(a) => a,
        Err(e) => {
            errors.push(e);
            return out;
        }
    };
    for (i, it) in interps.iter().enumerate() {
        let ctx = format!("dump interpreters[{i}]");
        let id = match as_u64(it, "id", &ctx) {
            Ok(id) => id,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let ctx = format!("dump interpreter {id}");
        let mut threads = BTreeMap::new();
        let arr = match as_array(it, "threads", &ctx) {
            Ok(a) => a,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for (j, t) in arr.iter().enumerate() {
            let tctx = format!("{ctx} threads[{j}]");
            let parsed = (|| -> Result<(u64, DumpThread), String> {
                let tid = as_u64(t, "thread_id", &tctx)?;
                let tctx = format!("{ctx} thread {tid}");
                Ok((
                    tid,
                    DumpThread {
                        native_thread_id: as_i64(t, "native_thread_id", &tctx)?,
                        holds_gil: as_bool(t, "holds_gil", &tctx)?,
                        on_cpu: as_bool(t, "on_cpu", &tctx)?,
                        frames: parse_frames(field(t, "frames", &tctx)?, &tctx)?,
                    },
                ))
            })();
            match parsed {
                Ok((tid, thread)) => {
                    if thread.native_thread_id <= 0 {
                        errors.push(format!(
                            "{ctx} thread {tid}: native_thread_id {} is not > 0",
                            thread.native_thread_id
                        ));
                    }
                    if threads.insert(tid, thread).is_some() {
                        errors.push(format!("{ctx}: thread_id {tid} appears more than once"));
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if out.insert(id, threads).is_some() {
            errors.push(format!("dump: interpreter id {id} appears more than once"));
        }
    }
    out
}

/// A readable frame-by-frame comparison (innermost first); `!` marks differing rows.
fn frame_diff(expected: &[Frame], actual: &[Frame]) -> String {
    let mut s = format!(
        "  expected {} frames, dump has {} frames\n",
        expected.len(),
        actual.len()
    );
    let n = expected.len().max(actual.len());
    let differs = |i: usize| expected.get(i) != actual.get(i);
    let mut shown = 0;
    let mut last_shown: Option<usize> = None;
    for i in 0..n {
        // Show differing rows with 2 rows of context, at most 40 rows.
        let near = (i.saturating_sub(2)..=(i + 2).min(n - 1)).any(differs);
        if !near {
            continue;
        }
        if shown >= 40 {
            s.push_str("  ... (more differences)\n");
            break;
        }
        if last_shown.map_or(i > 0, |l| i > l + 1) {
            s.push_str("  ...\n");
        }
        let e = expected
            .get(i)
            .map_or("<none>".to_string(), |f| f.to_string());
        let a = actual
            .get(i)
            .map_or("<none>".to_string(), |f| f.to_string());
        let mark = if differs(i) { '!' } else { ' ' };
        let _ = writeln!(
            s,
            "{mark} #{i:<4} expected: {e}\n{mark}        dump:     {a}"
        );
        shown += 1;
        last_shown = Some(i);
    }
    s
}

fn compare(expected: &Expected, dump: &Value, minor: u32) -> Vec<String> {
    let mut errors = Vec::new();
    match dump.get("pid").and_then(Value::as_i64) {
        Some(pid) if pid == expected.pid => {}
        other => errors.push(format!("dump pid is {other:?}, expected {}", expected.pid)),
    }
    let (maj, min, micro) = expected.version;
    assert_eq!(
        (maj, min),
        (3, minor as u64),
        "target reports an unexpected version"
    );
    let plain = format!("{maj}.{min}.{micro}");
    match dump.get("python_version").and_then(Value::as_str) {
        Some(v)
            if v.starts_with(&format!("3.{minor}."))
                && (v == plain || v == expected.version_string) => {}
        other => errors.push(format!(
            "dump python_version is {other:?}, expected {plain:?} (or {:?})",
            expected.version_string
        )),
    }
    let got = parse_dump(dump, &mut errors);
    for (id, exp) in &expected.interpreters {
        let Some(threads) = got.get(id) else {
            errors.push(format!(
                "interpreter {id} is missing from the dump (dump has {:?})",
                got.keys().collect::<Vec<_>>()
            ));
            continue;
        };
        for (tid, exp_frames) in &exp.threads {
            let name = exp.names.get(tid).map_or("?", String::as_str);
            let Some(t) = threads.get(tid) else {
                errors.push(format!(
                    "interpreter {id}: thread {tid} ({name}) is missing from the dump"
                ));
                continue;
            };
            if &t.frames != exp_frames {
                errors.push(format!(
                    "interpreter {id}: thread {tid} ({name}): frames differ\n{}",
                    frame_diff(exp_frames, &t.frames)
                ));
            }
            if let Some(native) = exp.native_ids.get(tid) {
                if t.native_thread_id != *native {
                    errors.push(format!(
                        "interpreter {id}: thread {tid} ({name}): native_thread_id {}, expected {native}",
                        t.native_thread_id
                    ));
                }
            }
            // Every parked thread is blocked in a lock acquire with the GIL released, and the
            // whole process is SIGSTOPped.
            if t.holds_gil {
                errors.push(format!(
                    "interpreter {id}: thread {tid} ({name}) is parked but holds_gil is true"
                ));
            }
            if t.on_cpu {
                errors.push(format!(
                    "interpreter {id}: thread {tid} ({name}) is parked but on_cpu is true"
                ));
            }
        }
        for tid in threads.keys() {
            if !exp.threads.contains_key(tid) && !exp.exclude.contains(tid) {
                errors.push(format!(
                    "interpreter {id}: the dump has thread {tid}, which is neither expected nor excluded \
                     (expected {:?}, excluded {:?})",
                    exp.threads.keys().collect::<Vec<_>>(),
                    exp.exclude
                ));
            }
        }
    }
    for id in got.keys() {
        if !expected.interpreters.contains_key(id) {
            errors.push(format!(
                "the dump has interpreter {id}, which the target does not have"
            ));
        }
    }
    errors
}

fn check_exact(label: &str, subinterp: bool) {
    let Some(interp) = interpreter(label) else {
        return;
    };
    assert!(
        !subinterp || interp.minor >= 12,
        "sub-interpreter cases need 3.12+"
    );
    let case = format!("{label}{}", if subinterp { " --subinterp" } else { "" });

    let out_dir = tempdir("pyfleet-stacks-");
    let out_arg = out_dir.path().as_os_str().to_os_string();
    let mut args = vec![out_arg];
    if subinterp {
        args.push("--subinterp".into());
    }
    let mut target = Proc::python(label, &interp.path, "stacks.py", &args);
    let pid = target.pid();

    let expected_path = out_dir.path().join("expected.json");
    target.wait_for_path(&expected_path, READY_TIMEOUT);
    let expected = parse_expected(&expected_path);
    assert_eq!(
        expected.pid, pid as i64,
        "{case}: expected.json is from another process"
    );
    let n_interps = expected.interpreters.len();
    assert_eq!(
        n_interps,
        if subinterp { 3 } else { 1 },
        "{case}: unexpected interpreter count in expected.json"
    );
    let n_threads: usize = expected
        .interpreters
        .values()
        .map(|i| i.threads.len())
        .sum();
    assert!(
        n_threads >= 6,
        "{case}: expected.json has only {n_threads} threads"
    );

    let (json_out, text_out) = {
        let _stopped = Stopped::new(pid);
        let json_out = pyfleet(&["dump", "--pid", &pid.to_string(), "--json"]);
        let text_out = if subinterp {
            None
        } else {
            Some(pyfleet(&["dump", "--pid", &pid.to_string()]))
        };
        (json_out, text_out)
    };
    if let Some(status) = target.exited() {
        panic!(
            "{case}: the target died ({status}) during the dump\n{}",
            target.stderr()
        );
    }
    target.kill();

    let artifacts = artifacts_dir(&format!("dump_exact/{}", case.replace(' ', "")));
    fs::copy(&expected_path, artifacts.join("expected.json")).unwrap();
    fs::write(artifacts.join("dump.json"), &json_out.stdout).unwrap();
    fs::write(artifacts.join("dump.stderr"), &json_out.stderr).unwrap();

    assert!(
        json_out.success(),
        "{case}: `pyfleet dump --json` failed (pid {pid})\n{}",
        json_out.describe()
    );
    let dump: Value = serde_json::from_str(&json_out.stdout).unwrap_or_else(|e| {
        panic!(
            "{case}: stdout of `pyfleet dump --json` is not exactly one JSON value: {e}\n{}",
            json_out.describe()
        )
    });
    let mut errors = compare(&expected, &dump, interp.minor);

    if let Some(text) = &text_out {
        fs::write(artifacts.join("dump.txt"), &text.stdout).unwrap();
        if !text.success() {
            errors.push(format!(
                "`pyfleet dump` (text) failed:\n{}",
                text.describe()
            ));
        } else {
            if !text.stdout.contains("Thread") {
                errors.push("text dump does not contain \"Thread\"".to_string());
            }
            let names: BTreeSet<&str> = expected
                .interpreters
                .values()
                .flat_map(|i| i.threads.values().flatten().map(|f| f.function.as_str()))
                .collect();
            for name in names {
                if !text.stdout.contains(name) {
                    errors.push(format!("text dump does not contain function name {name:?}"));
                }
            }
        }
    }

    if !errors.is_empty() {
        panic!(
            "{case}: pyfleet dump does not match what CPython reports ({} problems; files in {}):\n\n{}",
            errors.len(),
            artifacts.display(),
            errors.join("\n\n")
        );
    }
}
