//! Saying what runs: `pyfleet doctor` as root and as an unprivileged user, the first line of
//! `record` with each reason it can give (the kernel capture; reads because of the mode, the
//! missing privilege; the capture in pyfleet's own pid namespace, sampling a target there),
//! and builds without clang (the build script and `cargo install`) that have the capture.

use crate::common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `doctor --json` run by `cmd`'s program: its exit code and its document.
fn doctor(mut cmd: Command) -> (Option<i32>, Value) {
    cmd.arg("doctor").arg("--json");
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    let doc = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("doctor --json is not JSON ({e}): {}", out.describe()));
    (out.status.code(), doc)
}

fn pids_in(doc: &Value, list: &str) -> Vec<i64> {
    doc["python"][list]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_i64()).collect())
        .unwrap_or_default()
}

/// The spinning target's script, in a directory every user may read.
fn public_script(dir: &Path) -> PathBuf {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.join("gil_busy.py");
    fs::copy(target_script("gil_busy.py"), &script).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let out = dir.join("out");
    fs::create_dir(&out).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
    script
}

/// `record` for 1 s: its output, and its first line.
fn record_first_line(mut cmd: Command, out: &Path) -> (RunOutput, String) {
    cmd.args(["--duration", "1", "-o"]).arg(out);
    let run = run_with_timeout(cmd, Duration::from_secs(60));
    let first = run.stderr.lines().next().unwrap_or_default().to_string();
    (run, first)
}

#[test]
fn doctor_and_the_first_line_say_how_stacks_are_taken() {
    let _machine = shared();
    let Some(setpriv) = tool("setpriv", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    // Debian's 3.11: an interpreter any user may run.
    let debian = interpreter("3.11-debian").unwrap_or_else(any_interpreter);
    let tmp = tempdir("pyfleet-doctor-");
    let script = public_script(tmp.path());
    let out = tmp.path().join("out");
    let mut root_target = Proc::spawn("gil_busy.py as root", &debian.path, &[&script, &out]);
    root_target.wait_for_path(&out.join("threads.json"), Duration::from_secs(30));
    let root_pid = root_target.pid();

    // Root: the capture is available, the target readable, exit 0.
    let (code, doc) = doctor(Command::new(pyfleet_exe()));
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["capture"]["available"], true, "{doc}");
    assert_eq!(doc["can_profile"], true, "{doc}");
    assert!(
        pids_in(&doc, "readable").contains(&i64::from(root_pid)),
        "{doc}"
    );
    let checks: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["check"].as_str())
        .collect();
    for name in [
        "privileges",
        "ptrace scope",
        "perf events",
        "kernel capture",
        "pid namespace",
        "python processes",
    ] {
        assert!(checks.contains(&name), "no {name} check: {doc}");
    }

    // Root's record: the capture, said first, in every mode.
    let p = root_pid.to_string();
    let folded = tmp.path().join("root.folded");
    let (run, first) = record_first_line(pyfleet_command(&["record", "--pid", &p]), &folded);
    assert!(run.success(), "{}", run.describe());
    assert!(
        first.starts_with("pyfleet: recording pid")
            && first.ends_with("stacks from the kernel capture"),
        "{}",
        run.describe()
    );
    let (run, first) = record_first_line(
        pyfleet_command(&["record", "--pid", &p, "--mode", "wall"]),
        &folded,
    );
    assert!(run.success(), "{}", run.describe());
    assert!(
        first.contains("(wall mode); stacks from the kernel capture"),
        "{}",
        run.describe()
    );
    let (run, first) = record_first_line(
        pyfleet_command(&["record", "--pid", &p, "--mode", "gil"]),
        &folded,
    );
    assert!(run.success(), "{}", run.describe());
    assert!(
        first.contains("(gil mode); stacks from the kernel capture"),
        "{}",
        run.describe()
    );

    // Nobody, without capabilities: no capture (no privilege), root's target refused, exit 1.
    let (code, doc) = doctor(as_nobody(&setpriv, &pyfleet_exe(), &[] as &[&str]));
    assert_eq!(code, Some(1), "{doc}");
    assert_eq!(doc["capture"]["available"], false, "{doc}");
    assert_eq!(doc["capture"]["reason"], "no_privilege", "{doc}");
    assert_eq!(doc["can_profile"], false, "{doc}");
    assert!(
        pids_in(&doc, "refused").contains(&i64::from(root_pid)),
        "{doc}"
    );

    // Nobody's record of its own target: reads, and the missing privilege named first.
    let nobody_out = out.join("nobody");
    fs::create_dir(&nobody_out).unwrap();
    fs::set_permissions(&nobody_out, fs::Permissions::from_mode(0o777)).unwrap();
    // setpriv execs the interpreter: the process is the target.
    let mut own_target = Proc::spawn(
        "gil_busy.py as nobody",
        &setpriv,
        &[
            "--reuid=65534".as_ref(),
            "--regid=65534".as_ref(),
            "--clear-groups".as_ref(),
            debian.path.as_os_str(),
            script.as_os_str(),
            nobody_out.as_os_str(),
        ],
    );
    own_target.wait_for_path(&nobody_out.join("threads.json"), Duration::from_secs(30));
    let own = own_target.pid().to_string();
    let folded = out.join("nobody.folded");
    let (run, first) = record_first_line(
        as_nobody(&setpriv, &pyfleet_exe(), &["record", "--pid", &own]),
        &folded,
    );
    assert!(run.success(), "{}", run.describe());
    assert!(
        first
            .contains("stacks read from outside: the kernel capture needs CAP_BPF and CAP_PERFMON"),
        "{}",
        run.describe()
    );
    assert!(
        fs::read_to_string(&folded)
            .unwrap_or_default()
            .contains("spin ("),
        "nobody's record has no stacks of its spinner: {}",
        run.describe()
    );
}

/// The samples of `spin (` in folded text.
fn spin_samples(text: &str) -> u64 {
    crate::capture::spin_and_wait(text).0
}

#[test]
fn the_capture_in_pyfleets_own_pid_namespace_samples_a_target_there() {
    let _machine = shared();
    let Some(unshare) = tool("unshare", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let debian = interpreter("3.11-debian").unwrap_or_else(any_interpreter);
    let tmp = tempdir("pyfleet-ns-capture-");
    let script = public_script(tmp.path());
    let out = tmp.path().join("out");
    let folded = tmp.path().join("ns.folded");
    // pyfleet and its target both in a new pid namespace (pyfleet is not its pid 1); the
    // target's CPU time (utime + stime, in clock ticks) before and after the record. A second
    // target in a namespace nested in that one: read from outside, with a warning.
    let nested = out.join("nested");
    fs::create_dir(&nested).unwrap();
    let shell = format!(
        "{py} {script} {out} & t=$!; \
         {unshare} -p -f --mount-proc --kill-child {py} {script} {nested} & n=$!; \
         while [ ! -e {out}/threads.json ] || [ ! -e {nested}/threads.json ]; do sleep 0.1; done; \
         echo target $t; echo cpu-before $(cut -d' ' -f14,15 /proc/$t/stat); \
         {pyfleet} record --match gil_busy --duration 2 -o {folded}; rc=$?; \
         echo cpu-after $(cut -d' ' -f14,15 /proc/$t/stat) $(getconf CLK_TCK); \
         kill $t $n; exit $rc",
        py = debian.path.display(),
        script = script.display(),
        out = out.display(),
        nested = nested.display(),
        unshare = unshare.display(),
        pyfleet = pyfleet_exe().display(),
        folded = folded.display(),
    );
    let mut cmd = Command::new(&unshare);
    cmd.args([
        "-p",
        "-f",
        "--mount-proc",
        "--kill-child",
        "sh",
        "-c",
        &shell,
    ]);
    let run = run_with_timeout(cmd, Duration::from_secs(90));
    assert!(run.success(), "{}", run.describe());
    let first = run.stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("stacks from the kernel capture, in pyfleet's pid namespace"),
        "{}",
        run.describe()
    );
    let numbers = |tag: &str| -> Vec<f64> {
        run.stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (before, after) = (numbers("cpu-before"), numbers("cpu-after"));
    assert!(before.len() == 2 && after.len() == 3, "{}", run.describe());
    let cpu_seconds = (after[0] + after[1] - before[0] - before[1]) / after[2];
    // cpu-mode samples follow CPU used: 100 Hz of what the spinner ran (about 2 s when the
    // machine is free, less under load). Half of it allows for the record's start and end
    // inside the window the CPU time spans; none at all would be the capture missing them.
    let text = fs::read_to_string(&folded).unwrap_or_default();
    let target = numbers("target");
    assert_eq!(target.len(), 1, "{}", run.describe());
    let own_prefix = format!("gil_busy-{};", target[0]);
    let (own, nested): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.starts_with(&own_prefix));
    let samples = spin_samples(&own.join("\n"));
    assert!(
        samples > 0 && samples as f64 >= cpu_seconds * 100.0 / 2.0,
        "the capture in a pid namespace took {samples} samples of a spinner that ran \
         {cpu_seconds:.2} s: {}\n{}",
        run.describe(),
        truncate(&text, 600)
    );
    // The nested namespace's target: read, and said so.
    assert!(
        spin_samples(&nested.join("\n")) > 0
            && run
                .stderr
                .contains("in another pid namespace than pyfleet's, which the kernel capture"),
        "the target of a nested namespace was not read from outside with a warning: {}\n{}",
        run.describe(),
        truncate(&text, 600)
    );
}

/// The newest compiled build script of the root package in `target/debug`.
fn build_script() -> Option<PathBuf> {
    let dir = repo().join("target/debug/build");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pyfleet-"))
        .map(|e| e.path().join("build-script-build"))
        .filter(|p| p.is_file())
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
}

#[test]
fn builds_without_clang_have_the_kernel_capture() {
    let _machine = shared();
    let without = repo().join("scripts/without-clang.sh");
    let script = build_script().expect("the root package's compiled build script");

    // The build script with no clang: it embeds the kept object, says nothing.
    let out_dir = tempdir("pyfleet-build-script-");
    let mut cmd = Command::new(&without);
    cmd.arg(&script)
        .current_dir(repo())
        .env("OUT_DIR", out_dir.path())
        .env_remove("PYFLEET_CLANG");
    let run = run_with_timeout(cmd, Duration::from_secs(60));
    assert!(run.success(), "{}", run.describe());
    assert!(!run.stdout.contains("cargo::warning"), "{}", run.describe());
    assert_eq!(
        fs::read(out_dir.path().join("capture.bpf.o")).unwrap(),
        fs::read(repo().join("bpf/capture.bpf.o")).unwrap(),
        "the build script did not embed the kept program"
    );

    // A source edited since the object was built needs clang: without it, the build fails
    // saying so; with it, it builds from source and says to commit the object.
    let edited = tempdir("pyfleet-edited-bpf-");
    for dir in ["bpf", "scripts"] {
        fs::create_dir(edited.path().join(dir)).unwrap();
    }
    for file in [
        "bpf/capture.bpf.o",
        "bpf/capture.bpf.o.built-from",
        "scripts/build-bpf.sh",
    ] {
        fs::copy(repo().join(file), edited.path().join(file)).unwrap();
    }
    let mut source = fs::read_to_string(repo().join("bpf/capture.bpf.c")).unwrap();
    source.push_str("// an edit\n");
    fs::write(edited.path().join("bpf/capture.bpf.c"), source).unwrap();
    let mut cmd = Command::new(&without);
    cmd.arg(&script)
        .current_dir(edited.path())
        .env("OUT_DIR", out_dir.path())
        .env_remove("PYFLEET_CLANG");
    let run = run_with_timeout(cmd, Duration::from_secs(60));
    assert!(
        !run.success()
            && run
                .stderr
                .contains("changed since bpf/capture.bpf.o was built"),
        "{}",
        run.describe()
    );
    if on_path("clang").is_some() {
        let mut cmd = Command::new(&script);
        cmd.current_dir(edited.path())
            .env("OUT_DIR", out_dir.path())
            .env_remove("PYFLEET_CLANG");
        let run = run_with_timeout(cmd, Duration::from_secs(120));
        assert!(
            run.success() && run.stdout.contains("run scripts/build-bpf.sh and commit"),
            "{}",
            run.describe()
        );
    }

    // `cargo install --path .` with no clang (reusing the release build of this tree, as
    // scripts/test.sh builds it with clang hidden): a binary whose doctor finds the capture.
    // Without the variables cargo set for this test: build scripts that watch one (ring's
    // watches CARGO_MANIFEST_DIR) would see it changed and rebuild half the tree.
    let root = tempdir("pyfleet-install-");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&without);
    for (name, _) in std::env::vars_os() {
        let set_by_cargo_for_tests = name
            .to_str()
            .is_some_and(|n| (n.starts_with("CARGO_") && n != "CARGO_HOME") || n == "OUT_DIR");
        if set_by_cargo_for_tests {
            cmd.env_remove(name);
        }
    }
    cmd.arg(cargo)
        .args(["install", "--path", ".", "--locked", "--offline", "--root"])
        .arg(root.path())
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", repo().join("target"));
    let run = run_with_timeout(cmd, Duration::from_secs(600));
    assert!(run.success(), "{}", run.describe());
    let (code, doc) = doctor(Command::new(root.path().join("bin/pyfleet")));
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["capture"]["available"], true, "{doc}");
}

#[test]
fn a_capture_denied_though_privileged_is_told_from_a_missing_privilege() {
    let _machine = shared();
    // Debian's python3.11 runs tests/tools/seccomp_exec.py (libseccomp: setup-deploy-tools).
    let Some(debian) = interpreter("3.11-debian") else {
        return;
    };
    // Root, every capability, and a seccomp filter that refuses `bpf` with EPERM (as the
    // unit's filter did before it allowed the call).
    let tmp = tempdir("pyfleet-denied-");
    let profile = tmp.path().join("no-bpf.json");
    fs::write(
        &profile,
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}"#,
    )
    .unwrap();
    let mut cmd = Command::new(&debian.path);
    cmd.arg(repo().join("tests/tools/seccomp_exec.py"))
        .arg(&profile)
        .arg(pyfleet_exe());
    let (_, doc) = doctor(cmd);
    assert_eq!(doc["capture"]["available"], false, "{doc}");
    assert_eq!(doc["capture"]["reason"], "denied", "{doc}");
    assert!(
        doc["capture"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("though pyfleet holds CAP_BPF and CAP_PERFMON")),
        "{doc}"
    );
}

#[test]
fn the_daemon_keeps_saying_how_it_takes_stacks_past_the_exporters_idle_timeout() {
    let _machine = shared();
    // The exporter drops a series nothing touched for its idle timeout (at least 30 s): the
    // daemon must keep `pyfleet_capture_info` alive, not set it once at start.
    let any = any_interpreter();
    let mut target = Proc::python(&any.label, &any.path, "sleeper.py", &["ready"]);
    target.wait_for_file("ready", Duration::from_secs(30));
    let tmp = tempdir("pyfleet-info-");
    let port = free_port();
    let pid = target.pid().to_string();
    let daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--pid",
            &pid,
            "--out",
            tmp.path().join("snapshots").to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]),
        Duration::from_secs(120),
    );
    let info = || {
        http_get(port, "/metrics")
            .map(|(_, page)| {
                page.lines()
                    .filter(|l| l.starts_with("pyfleet_capture_info{"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    wait_until(
        Duration::from_secs(20),
        "pyfleet_capture_info on /metrics",
        || !info().is_empty(),
        || "no pyfleet_capture_info".into(),
    );
    let first = info();
    // Rendered once at 5 s (above) and again past the idle timeout: still there, the same.
    // The series is exported every second: one scrape may fall between a drop by the exporter
    // and the next export, so a few are asked for before it counts as gone.
    std::thread::sleep(Duration::from_secs(36));
    let mut later = info();
    for _ in 0..5 {
        if later == first {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        later = info();
    }
    // Ended by the test, after the last scrape: a duration could end it before, on a slow
    // start.
    send_signal(daemon.pid(), libc::SIGTERM);
    let out = daemon.finish();
    assert!(out.success(), "{}", out.describe());
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        later,
        first,
        "pyfleet_capture_info went away: {}",
        out.describe()
    );
}
