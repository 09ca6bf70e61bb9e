//! Error handling of `pyfleet dump` / `pyfleet list`: one clean line on stderr, a non-zero exit
//! that is not a panic, for every way a target can be unusable, including a target that is
//! killed while it is being read.

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A pid that certainly belonged to a process that no longer exists (a reaped child).
fn dead_pid() -> i32 {
    for _ in 0..10 {
        let mut child = Command::new("true").spawn().expect("cannot spawn `true`");
        let pid = child.id() as i32;
        child.wait().expect("cannot reap `true`");
        if !pid_exists(pid) {
            return pid;
        }
    }
    panic!("could not find a pid that stays unused");
}

#[test]
fn nonexistent_pid() {
    let _machine = shared();
    let pid = dead_pid();
    let out = pyfleet(&["dump", "--pid", &pid.to_string(), "--json"]);
    assert_error_contract(&out, Some("no such process"));
    let out = pyfleet(&["dump", "--pid", &pid.to_string()]);
    assert_error_contract(&out, Some("no such process"));
}

#[test]
fn not_a_python_process() {
    let _machine = shared();
    let mut sleep = Proc::spawn("sleep 300", Path::new("/bin/sleep"), &["300"]);
    sleep.wait_for_exe("sleep", Duration::from_secs(10));
    let out = pyfleet(&["dump", "--pid", &sleep.pid().to_string(), "--json"]);
    assert_error_contract(&out, Some("not a python process"));
}

#[test]
fn unsupported_python_version() {
    let _machine = shared();
    let Some(python) = require_python310() else {
        return;
    };
    let mut target = Proc::python(
        "3.10-pyenv",
        &python,
        "sleeper.py",
        &["ready", "pyfleet-unsupported"],
    );
    let ready = target.wait_for_file("ready", READY_TIMEOUT);
    let version = std::fs::read_to_string(&ready).unwrap();
    assert!(
        version.starts_with("3.10."),
        "{} is not 3.10 but {version}",
        python.display()
    );
    let out = pyfleet(&["dump", "--pid", &target.pid().to_string(), "--json"]);
    assert_error_contract(&out, Some("unsupported python version 3.10"));
    assert!(
        out.stderr.contains("pyfleet supports 3.11 to 3.15"),
        "the message names what is supported: {}",
        out.describe()
    );
}

#[test]
fn permission_denied() {
    let _machine = shared();
    assert!(
        is_root(),
        "this test must run as root (it drops to user nobody with setpriv)"
    );
    let Some(setpriv) = tool("setpriv", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let interp = any_interpreter();
    let mut target = Proc::python(
        &interp.label,
        &interp.path,
        "sleeper.py",
        &["ready", "pyfleet-perm"],
    );
    target.wait_for_file("ready", READY_TIMEOUT);

    // Make sure that nobody can run pyfleet at all: otherwise setpriv's own "Permission
    // denied" would pass for pyfleet's.
    let exe = pyfleet_exe();
    let probe = run_with_timeout(
        as_nobody(
            &setpriv,
            Path::new("/usr/bin/test"),
            &[std::ffi::OsStr::new("-x"), exe.as_os_str()],
        ),
        Duration::from_secs(10),
    );
    assert!(
        probe.success(),
        "user nobody cannot execute {} (check the permissions of it and its directories)\n{}",
        exe.display(),
        probe.describe()
    );

    let pid = target.pid().to_string();
    let out = run_with_timeout(
        as_nobody(&setpriv, &exe, &["dump", "--pid", &pid, "--json"]),
        PYFLEET_TIMEOUT,
    );
    assert!(
        !out.stderr.starts_with("setpriv"),
        "setpriv failed:\n{}",
        out.describe()
    );
    assert_error_contract(&out, Some("permission denied"));
}

#[test]
fn pid_not_a_number() {
    let _machine = shared();
    let out = pyfleet(&["dump", "--pid", "notanumber"]);
    assert_error_contract(&out, None);
    let out = pyfleet(&["dump", "--pid", "notanumber", "--json"]);
    assert_error_contract(&out, None);
}

#[test]
fn invalid_regex() {
    let _machine = shared();
    let out = pyfleet(&["list", "--match", "("]);
    assert_error_contract(&out, Some("regex"));
}

/// What one dump of a target that may be dying produced.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok,
    CleanError,
}

/// A dump of a (possibly dying) target must either succeed with a well-formed dump of that
/// pid or fail cleanly.  Returns the outcome or a description of the violation.
fn judge(out: &RunOutput, pid: i32) -> Result<Outcome, String> {
    if out.success() {
        let v: Value = serde_json::from_str(&out.stdout).map_err(|e| {
            format!(
                "exit 0 but stdout is not one JSON value ({e})\n{}",
                out.describe()
            )
        })?;
        if v.get("pid").and_then(Value::as_i64) != Some(pid as i64) {
            return Err(format!(
                "exit 0 but the dump is not of pid {pid}\n{}",
                out.describe()
            ));
        }
        let interps = v
            .get("interpreters")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("exit 0 but no interpreters array\n{}", out.describe()))?;
        for it in interps {
            let threads = it
                .get("threads")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("interpreter without threads array\n{}", out.describe()))?;
            for t in threads {
                let frames = t
                    .get("frames")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("thread without frames array\n{}", out.describe()))?;
                for f in frames {
                    // `line` is null where the instruction has no line, as CPython's own
                    // `f_lineno` says (cleanup code of a coroutine, say).
                    let line_ok = f
                        .get("line")
                        .is_some_and(|l| l.is_null() || l.as_i64().is_some_and(|n| n > 0));
                    if f.get("function").and_then(Value::as_str).is_none() || !line_ok {
                        return Err(format!("malformed frame {f}\n{}", out.describe()));
                    }
                }
            }
        }
        Ok(Outcome::Ok)
    } else {
        let bad = error_contract_violations(out, None);
        if bad.is_empty() {
            Ok(Outcome::CleanError)
        } else {
            Err(format!("{}\n{}", bad.join("; "), out.describe()))
        }
    }
}

fn killed_while_read(interp: &Interp) -> Vec<String> {
    let label = &interp.label;
    let mut errors = Vec::new();
    let mut target = Proc::python(label, &interp.path, "churn.py", &["ready"]);
    target.wait_for_file("ready", READY_TIMEOUT);
    let pid = target.pid();
    let pid_s = pid.to_string();
    let args = ["dump", "--pid", pid_s.as_str(), "--json"];

    // At least 5 dumps of the live, churning process, and more (up to 15) until one succeeds:
    // reading a process that runs is racy, but pyfleet must manage it sometimes.
    let mut successes = 0;
    let mut live = 0u32;
    let mut total_time = Duration::ZERO;
    while live < 5 || (successes == 0 && live < 15) {
        let out = pyfleet(&args);
        total_time += out.elapsed;
        match judge(&out, pid) {
            Ok(Outcome::Ok) => successes += 1,
            Ok(Outcome::CleanError) => {}
            Err(e) => errors.push(format!("{label}: live dump #{live}: {e}")),
        }
        live += 1;
    }
    if successes == 0 {
        errors.push(format!(
            "{label}: none of {live} dumps of a live churning process succeeded"
        ));
    }
    if let Some(status) = target.exited() {
        errors.push(format!(
            "{label}: churn.py died during the live dumps ({status}):\n{}",
            target.stderr()
        ));
        return errors;
    }

    // 5 dumps started a quarter of a mean dump duration apart, then SIGKILL: the kill lands
    // in a different phase of each of them (the pauses spread them out; they synchronise
    // nothing).
    let mean = total_time / live;
    let mut racing = Vec::new();
    for _ in 0..5 {
        racing.push(start_pyfleet(&args));
        std::thread::sleep(mean / 4);
    }
    target.kill_no_reap();
    let mut racing_outcomes = Vec::new();
    for (i, run) in racing.into_iter().enumerate() {
        let out = run.finish();
        match judge(&out, pid) {
            Ok(o) => racing_outcomes.push(o),
            Err(e) => errors.push(format!("{label}: dump #{i} racing with SIGKILL: {e}")),
        }
    }
    eprintln!(
        "{label}: {successes}/{live} live dumps succeeded (mean {mean:?}); racing with SIGKILL: {racing_outcomes:?}"
    );

    // The target is a zombie now: no memory to read.
    wait_until(
        Duration::from_secs(10),
        &format!("{label}: killed churn.py (pid {pid}) to become a zombie"),
        || process_state(pid) == Some('Z'),
        || format!("state {:?}", process_state(pid)),
    );
    for i in 0..5 {
        let out = pyfleet(&args);
        match judge(&out, pid) {
            Ok(Outcome::CleanError) => {}
            Ok(Outcome::Ok) => errors.push(format!(
                "{label}: dump #{i} of a zombie succeeded\n{}",
                out.describe()
            )),
            Err(e) => errors.push(format!("{label}: dump #{i} of a zombie: {e}")),
        }
    }

    // Reaped: the pid no longer exists.
    target.reap();
    assert!(
        !pid_exists(pid),
        "{label}: pid {pid} still exists after reaping"
    );
    for i in 0..5 {
        let out = pyfleet(&args);
        let bad = error_contract_violations(&out, Some("no such process"));
        if !bad.is_empty() {
            errors.push(format!(
                "{label}: dump #{i} of the dead pid: {}\n{}",
                bad.join("; "),
                out.describe()
            ));
        }
    }
    errors
}

#[test]
fn target_killed_while_being_read() {
    let _machine = shared();
    let mut errors = Vec::new();
    for interp in interpreters() {
        errors.extend(killed_while_read(&interp));
    }
    assert!(
        errors.is_empty(),
        "{} problems:\n\n{}",
        errors.len(),
        errors.join("\n\n")
    );
}

/// `pyfleet dump | head`: a reader that goes away ends pyfleet quietly (exit 0), no panic.
#[test]
fn a_reader_that_goes_away_ends_dump_quietly() {
    let _machine = shared();
    let interp = any_interpreter();
    let mut target = Proc::python(&interp.label, &interp.path, "gil_busy.py", &["."]);
    target.wait_for_file("threads.json", READY_TIMEOUT);
    let mut child = pyfleet_command(&["dump", "--pid", &target.pid().to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before pyfleet has attached and written anything.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    target.kill();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
