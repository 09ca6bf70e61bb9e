//! `pyfleet list [--match REGEX]`: a header line, then one row per Python process:
//! `PID PPID VERSION NAME ROLE SERVICE LABELS COMMAND LINE...`.

use crate::common::*;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

struct Sleeper {
    proc: Proc,
    label: String,
    /// Like platform.python_version(), e.g. 3.12.1 or 3.15.0a1.
    version: String,
    marker: String,
}

/// Rows of `pyfleet list` output by pid (panics on a malformed output).
fn rows(out: &RunOutput) -> BTreeMap<i32, (String, String)> {
    assert!(out.success(), "`pyfleet list` failed\n{}", out.describe());
    let mut lines = out.stdout.lines();
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("`pyfleet list` printed nothing\n{}", out.describe()));
    let first = header.split_whitespace().next().unwrap_or("");
    assert!(
        !first.is_empty() && first.parse::<i64>().is_err(),
        "the first line of `pyfleet list` should be a header, not {header:?}\n{}",
        out.describe()
    );
    let mut rows = BTreeMap::new();
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let pid = parts.next().unwrap();
        let pid: i32 = pid.parse().unwrap_or_else(|_| {
            panic!("row {line:?} does not start with a pid\n{}", out.describe())
        });
        let ppid = parts.next().and_then(|p| p.parse::<i32>().ok());
        assert!(ppid.is_some(), "row {line:?} has no parent pid");
        let version = parts
            .next()
            .unwrap_or_else(|| panic!("row {line:?} has no version\n{}", out.describe()))
            .to_string();
        let (name, role) = (parts.next(), parts.next());
        assert!(
            name.is_some() && matches!(role, Some("-" | "master" | "worker")),
            "row {line:?} has no name and role\n{}",
            out.describe()
        );
        let rest = parts.collect::<Vec<_>>().join(" ");
        assert!(
            rows.insert(pid, (version, rest)).is_none(),
            "pid {pid} listed twice\n{}",
            out.describe()
        );
    }
    rows
}

fn version_matches(listed: &str, target_version: &str) -> bool {
    // Accept 3.15.0a1 (what the interpreter says) or 3.15.0 (major.minor.micro).
    let plain: String = {
        let mut parts = target_version.splitn(3, '.');
        let (a, b, c) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let micro: String = c.chars().take_while(|ch| ch.is_ascii_digit()).collect();
        format!("{a}.{b}.{micro}")
    };
    listed == target_version || listed == plain
}

#[test]
fn list_shows_python_processes() {
    let _machine = shared();
    let token = unique_token("pyfleetlist");
    let mut sleepers = Vec::new();
    for interp in interpreters() {
        let marker = format!("{token}-{}", interp.label);
        // Relative paths are relative to the process's own temporary directory.
        let mut proc = Proc::python(
            &interp.label,
            &interp.path,
            "sleeper.py",
            &["ready", marker.as_str()],
        );
        let ready = proc.wait_for_file("ready", READY_TIMEOUT);
        let version = std::fs::read_to_string(&ready).unwrap().trim().to_string();
        assert!(
            version.starts_with(&format!("3.{}.", interp.minor)),
            "{} reports version {version}",
            interp.path.display()
        );
        sleepers.push(Sleeper {
            proc,
            label: interp.label.clone(),
            version,
            marker,
        });
    }
    assert!(!sleepers.is_empty(), "no interpreters");

    // A non-Python process whose command line carries the marker too.
    let mut not_python = Proc::spawn_with("sleep 300", Path::new("/bin/sleep"), &["300"], |cmd| {
        cmd.arg0(format!("sleep-{token}-not-python"));
    });
    not_python.wait_for_exe("sleep", Duration::from_secs(10));

    let check_listed = |rows: &BTreeMap<i32, (String, String)>, out: &RunOutput, s: &Sleeper| {
        let pid = s.proc.pid();
        let (version, rest) = rows
            .get(&pid)
            .unwrap_or_else(|| panic!("{} (pid {pid}) is not listed\n{}", s.label, out.describe()));
        assert!(
            version_matches(version, &s.version),
            "{} (pid {pid}) listed with version {version:?}, expected {:?}\n{}",
            s.label,
            s.version,
            out.describe()
        );
        assert!(
            rest.contains("sleeper.py") && rest.contains(&s.marker),
            "{} (pid {pid}): command line {rest:?} should contain sleeper.py and {}\n{}",
            s.label,
            s.marker,
            out.describe()
        );
    };

    // --match with the run's token: exactly our Python processes.
    let out = pyfleet(&["list", "--match", &token]);
    let listed = rows(&out);
    for s in &sleepers {
        check_listed(&listed, &out, s);
    }
    let ours: Vec<i32> = sleepers.iter().map(|s| s.proc.pid()).collect();
    for pid in listed.keys() {
        assert!(
            ours.contains(pid),
            "`list --match {token}` lists pid {pid}, which is not one of ours {ours:?} (the non-Python \
             process is {})\n{}",
            not_python.pid(),
            out.describe()
        );
    }

    // A real regular expression: only the 3.12/3.13 pyenv sleepers.
    let regex = format!(r"{token}-3\.1[23]-pyenv\b");
    let out = pyfleet(&["list", "--match", &regex]);
    let listed = rows(&out);
    let want: Vec<i32> = sleepers
        .iter()
        .filter(|s| s.label == "3.12-pyenv" || s.label == "3.13-pyenv")
        .map(|s| s.proc.pid())
        .collect();
    let mut want = want;
    want.sort();
    let got: Vec<i32> = listed.keys().copied().collect();
    assert_eq!(
        got,
        want,
        "`list --match {regex}` should list exactly the 3.12/3.13 pyenv sleepers\n{}",
        out.describe()
    );

    // Without --match: ours are listed (among others), the non-Python process is not.
    let out = pyfleet(&["list"]);
    let listed = rows(&out);
    for s in &sleepers {
        check_listed(&listed, &out, s);
    }
    assert!(
        !listed.contains_key(&not_python.pid()),
        "`pyfleet list` lists the non-Python process {}\n{}",
        not_python.pid(),
        out.describe()
    );

    // A regex that matches none of ours.
    let out = pyfleet(&["list", "--match", &format!("{token}-nomatch")]);
    let listed = rows(&out);
    for pid in &ours {
        assert!(
            !listed.contains_key(pid),
            "`list --match {token}-nomatch` lists pid {pid}\n{}",
            out.describe()
        );
    }
}

/// Run as nobody (no capabilities) beside a root-owned Python process, each command says what
/// it could not inspect and which privilege would let it (#34): `list` and `record --match`
/// fail with that line, not "nothing found"; `run` warns with it; `record --pid` names it.
#[test]
fn without_privilege_each_command_says_what_it_could_not_inspect() {
    let _machine = shared();
    let Some(setpriv) = tool("setpriv", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let token = unique_token("unreadable");
    let target = idle_sleeper(&token);
    let pid = target.pid().to_string();
    let says_why = |out: &RunOutput| {
        out.stderr.contains("could not be inspected")
            && out.stderr.contains(&format!("pid {pid}"))
            && out.stderr.contains("CAP_SYS_PTRACE")
    };
    let as_nobody = |args: &[&str]| {
        run_with_timeout(
            as_nobody(&setpriv, &pyfleet_exe(), args),
            Duration::from_secs(60),
        )
    };

    let out = as_nobody(&["list", "--match", &token]);
    assert_error_contract(&out, Some("could not be inspected"));
    assert!(says_why(&out), "{}", out.describe());

    let dir = tempdir("pyfleet-unprivileged-");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let folded = dir.path().join("never.folded");
    let out = as_nobody(&[
        "record",
        "--match",
        &token,
        "--duration",
        "1",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert_error_contract(&out, Some("can be read"));
    assert!(says_why(&out), "{}", out.describe());
    assert!(!folded.exists());

    let out = as_nobody(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "1",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert_error_contract(&out, Some("CAP_SYS_PTRACE"));

    let snapshots = dir.path().join("snapshots");
    let out = as_nobody(&[
        "run",
        "--match",
        &token,
        "--duration",
        "2",
        "--metrics-addr",
        "off",
        "--out",
        snapshots.to_str().unwrap(),
    ]);
    assert!(
        out.success() && says_why(&out) && out.stderr.contains("warning:"),
        "{}",
        out.describe()
    );

    // As root the same process is listed, and nothing is said of refusals.
    let out = pyfleet(&["list", "--match", &token]);
    assert!(
        out.success()
            && out.stdout.contains(&pid)
            && !out.stderr.contains("could not be inspected"),
        "{}",
        out.describe()
    );
}
