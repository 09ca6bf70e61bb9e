//! `pyfleet record` against real Python targets: each format chosen by the output's
//! extension (and by --format), a target that exits mid-recording, Ctrl-C (SIGINT), --match
//! over two processes until both exit, an unwritable output (fails at once, before any
//! sampling), and the progress line on a terminal only.

use crate::common::*;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const HOT: &str = "pyfleet_hot_leaf";
const ABSENT: &str = "pyfleet_never_called";

/// A running profiled.py (SECONDS: 0 runs until killed) once it has written its ready file.
fn target(seconds: f64, token: &str) -> Proc {
    let py = any_interpreter();
    let ready = format!("ready-{token}");
    let mut p = Proc::python(
        &py.label,
        &py.path,
        "profiled.py",
        &[ready.clone(), seconds.to_string()],
    );
    p.wait_for_file(&ready, READY_TIMEOUT);
    p
}

/// The last line of stderr, which must be `pyfleet: wrote N thread samples of P process(es)
/// to PATH (FORMAT, cpu mode)...`; returns N and P.
fn final_line(out: &RunOutput, path: &Path, format: &str) -> (u64, u64) {
    let line = out.stderr.trim_end().lines().last().unwrap_or_default();
    let want = format!("to {} ({format}, cpu mode)", path.display());
    assert!(
        line.starts_with("pyfleet: wrote ") && line.contains(&want),
        "unexpected final line {line:?} (wanted {want:?}): {}",
        out.describe()
    );
    let words: Vec<&str> = line.split_whitespace().collect();
    let samples = words[2].parse().unwrap_or_else(|_| panic!("{line}"));
    assert_eq!(&words[3..5], ["thread", "samples"], "{line}");
    let processes = words[6].parse().unwrap_or_else(|_| panic!("{line}"));
    (samples, processes)
}

/// Checks that `path` holds a profile in `format` with the target's hot function.
fn check_file(path: &Path, format: &str) {
    let data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = String::from_utf8_lossy(&data);
    match format {
        "svg" => {
            assert!(
                text.starts_with("<?xml") && text.contains("<svg"),
                "not SVG"
            );
            assert!(text.contains(HOT) && !text.contains(ABSENT));
        }
        "folded" => {
            assert!(text.lines().any(|l| l.contains(HOT)), "{text}");
            for l in text.lines() {
                let (stack, n) = l.rsplit_once(' ').expect("no count");
                assert!(stack.starts_with("profiled-"), "{l}");
                assert!(n.parse::<u64>().is_ok(), "{l}");
            }
        }
        "speedscope" => {
            let v: serde_json::Value = serde_json::from_slice(&data).expect("not JSON");
            assert_eq!(
                v["$schema"],
                "https://www.speedscope.app/file-format-schema.json"
            );
            assert!(text.contains(HOT));
        }
        "pprof" => {
            let p = pyfleet::output::pprof::decode(&data).expect("not pprof");
            assert!(p.string_table.iter().any(|s| s == HOT));
            assert!(p.sample.iter().map(|s| s.value[0]).sum::<i64>() > 0);
        }
        other => panic!("unknown format {other}"),
    }
    assert!(!text.contains(ABSENT));
}

fn arg(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn writes_each_format_by_extension() {
    let _machine = shared();
    let token = unique_token("rec");
    let t = target(0.0, &token);
    let pid = t.pid().to_string();
    let dir = tempdir("pyfleet-record-");
    let cases: Vec<(PathBuf, Option<&str>, &str)> = vec![
        (dir.path().join("out.svg"), None, "svg"),
        (dir.path().join("out.folded"), None, "folded"),
        (dir.path().join("out.txt"), None, "folded"),
        (dir.path().join("out.speedscope.json"), None, "speedscope"),
        (dir.path().join("out.json"), None, "speedscope"),
        (dir.path().join("out.pb.gz"), None, "pprof"),
        (dir.path().join("out.pprof"), None, "pprof"),
        (dir.path().join("out.data"), Some("pprof"), "pprof"),
    ];
    // All at once, on the same target.
    let running: Vec<Running> = cases
        .iter()
        .map(|(path, format, _)| {
            let mut args = vec![
                "record".to_string(),
                "--pid".into(),
                pid.clone(),
                "--duration".into(),
                "1.5".into(),
                "-o".into(),
                arg(path),
            ];
            if let Some(f) = format {
                args.extend(["--format".to_string(), f.to_string()]);
            }
            start_pyfleet(&args)
        })
        .collect();
    for (r, (path, _, format)) in running.into_iter().zip(&cases) {
        let out = r.finish();
        assert!(out.success(), "{}", out.describe());
        // Not a terminal: no progress line; the first line (what is recorded, how stacks
        // are taken), the hottest functions (the target's hot leaf first, under a header)
        // and the final line, which names it too.
        let all: Vec<&str> = out.stderr.trim_end().lines().collect();
        assert!(
            all.first().is_some_and(|l| l.starts_with(&format!(
                "pyfleet: recording pid {pid} at 100 Hz (cpu mode); stacks "
            ))),
            "{}",
            out.describe()
        );
        let lines = &all[1..];
        assert!(lines.len() >= 3 && lines.len() <= 7, "{}", out.describe());
        assert!(
            lines[0].starts_with("pyfleet: highest own share (cpu mode: "),
            "{}",
            out.describe()
        );
        assert!(
            lines[1].starts_with("  ") && lines[1].contains(HOT),
            "{}",
            out.describe()
        );
        assert!(
            lines[1..lines.len() - 1]
                .iter()
                .all(|l| l.starts_with("  ") && l.ends_with(')')),
            "{}",
            out.describe()
        );
        assert!(
            lines[lines.len() - 1].contains(&format!("; hottest: {HOT} (profiled.py) ")),
            "{}",
            out.describe()
        );
        assert!(!out.stderr.contains('\r'), "{}", out.describe());
        let (samples, processes) = final_line(&out, path, format);
        assert!(samples > 0, "{}", out.describe());
        assert_eq!(processes, 1, "{}", out.describe());
        check_file(path, format);
    }

    // An extension that names no format, without --format: one line, before anything.
    let out = pyfleet(&[
        "record",
        "--pid",
        &pid,
        "-o",
        &arg(&dir.path().join("out.bin")),
    ]);
    assert_error_contract(&out, Some("--format"));
}

#[test]
fn a_target_that_exits_mid_recording() {
    let _machine = shared();
    let token = unique_token("rec");
    let t = target(2.5, &token);
    let pid = t.pid();
    let dir = tempdir("pyfleet-record-");
    let path = dir.path().join("out.folded");
    let started = Instant::now();
    let out = pyfleet(&[
        "record",
        "--pid",
        &pid.to_string(),
        "--duration",
        "25",
        "-o",
        &arg(&path),
    ]);
    assert!(out.success(), "{}", out.describe());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "record did not end when its target did: {}",
        out.describe()
    );
    let (samples, _) = final_line(&out, &path, "folded");
    assert!(samples > 0, "{}", out.describe());
    assert!(
        out.stderr
            .trim_end()
            .ends_with(&format!("process {pid} exited")),
        "{}",
        out.describe()
    );
    check_file(&path, "folded");
}

#[test]
fn ctrl_c_ends_the_recording_and_writes_it() {
    let _machine = shared();
    let token = unique_token("rec");
    let t = target(0.0, &token);
    let dir = tempdir("pyfleet-record-");
    let path = dir.path().join("out.svg");
    let r = start_pyfleet(&["record", "--pid", &t.pid().to_string(), "-o", &arg(&path)]);
    // Once pyfleet catches SIGINT (it is sampling by then), give it a moment to take samples.
    wait_until(
        Duration::from_secs(20),
        "pyfleet record to catch SIGINT",
        || catches(r.pid(), libc::SIGINT),
        || {
            format!(
                "/proc/{}/status: {:?}",
                r.pid(),
                fs::read_to_string(format!("/proc/{}/status", r.pid()))
            )
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    send_signal(r.pid(), libc::SIGINT);
    let out = r.finish();
    assert!(out.success(), "{}", out.describe());
    let (samples, _) = final_line(&out, &path, "svg");
    assert!(samples > 0, "{}", out.describe());
    assert!(
        out.stderr.contains("stopped by SIGINT"),
        "{}",
        out.describe()
    );
    check_file(&path, "svg");
}

/// Whether `pid` has a handler for `sig` (`SigCgt` in /proc/PID/status).
fn catches(pid: i32, sig: libc::c_int) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let mask = s.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

#[test]
fn match_records_every_process_until_they_exit() {
    let _machine = shared();
    let token = unique_token("recm");
    let a = target(3.0, &format!("{token}-a"));
    let b = target(3.0, &format!("{token}-b"));
    let dir = tempdir("pyfleet-record-");
    let path = dir.path().join("fleet.pb.gz");
    let out = run_with_timeout(
        pyfleet_command(&["record", "--match", &token, "-o", &arg(&path)]),
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.describe());
    let (samples, processes) = final_line(&out, &path, "pprof");
    assert!(samples > 0, "{}", out.describe());
    assert_eq!(processes, 2, "{}", out.describe());
    assert!(
        out.stderr.contains("every matching process exited"),
        "{}",
        out.describe()
    );
    let p = pyfleet::output::pprof::decode(&fs::read(&path).unwrap()).unwrap();
    let key = p.string_table.iter().position(|s| s == "pid").unwrap() as i64;
    let mut pids: Vec<i64> = p
        .sample
        .iter()
        .flat_map(|s| s.label.iter().filter(|l| l.key == key).map(|l| l.num))
        .collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids, vec![i64::from(a.pid()), i64::from(b.pid())]);
}

#[test]
fn unwritable_output_fails_at_once_before_sampling() {
    let _machine = shared();
    let token = unique_token("rec");
    let t = target(0.0, &token);
    let dir = tempdir("pyfleet-record-");
    let file = dir.path().join("a-file");
    fs::write(&file, "x").unwrap();
    let bad = file.join("out.svg");
    let out = pyfleet(&["record", "--pid", &t.pid().to_string(), "-o", &arg(&bad)]);
    assert_error_contract(&out, Some("cannot write the output"));
    assert!(out.elapsed < Duration::from_secs(3), "{}", out.describe());
    // The output is checked before anything else, even before the target: a pid that does
    // not exist is not what it reports.
    let out = pyfleet(&["record", "--pid", "999999999", "-o", &arg(&bad)]);
    assert_error_contract(&out, Some("cannot write the output"));
    assert!(!bad.exists());
    // And with a good output, a pid that does not exist is one line too, and nothing is
    // written.
    let good = dir.path().join("out.svg");
    let out = pyfleet(&["record", "--pid", "999999999", "-o", &arg(&good)]);
    assert_error_contract(&out, Some("999999999"));
    assert!(!good.exists());
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "a file was left"
    );
}

#[test]
fn progress_line_on_a_terminal() {
    let _machine = shared();
    // util-linux's script(1) runs the command on a pseudo-terminal.
    let Some(script) = tool("script", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let token = unique_token("rec");
    let t = target(0.0, &token);
    let dir = tempdir("pyfleet-record-");
    let path = dir.path().join("out.folded");
    let command = format!(
        "{} record --pid {} --duration 2 -o {}",
        pyfleet_exe().display(),
        t.pid(),
        path.display()
    );
    let mut cmd = Command::new(script);
    cmd.args(["-q", "-e", "-f", "-c", &command, "/dev/null"])
        .env_remove("RUST_LOG");
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    assert!(out.success(), "{}", out.describe());
    let screen = out.stdout.replace("\r\n", "\n");
    assert!(
        screen.contains(&format!("\r\x1b[2Krecording pid {} [", t.pid())),
        "no progress line: {screen:?}"
    );
    assert!(
        screen.contains("/2 s, ") && screen.contains(" samples, 0 errors, 1 process\r"),
        "{screen:?}"
    );
    let last = screen
        .trim_end()
        .rsplit(['\n', '\r'])
        .next()
        .unwrap_or_default();
    let last = last.trim_start_matches("\x1b[2K");
    assert!(
        last.starts_with("pyfleet: wrote ")
            && last.contains(&format!(
                "to {} (folded, cpu mode); hottest: ",
                path.display()
            )),
        "{screen:?}"
    );
    check_file(&path, "folded");
}

/// The mistakes of a first session: each gets one line and a non-zero exit, and creates or
/// overwrites nothing.
#[test]
fn first_mistakes_get_one_line_and_touch_nothing() {
    let _machine = shared();
    let token = unique_token("rec");
    let t = target(0.0, &token);
    let pid = t.pid().to_string();
    let dir = tempdir("pyfleet-record-");
    let source = dir.path().join("app.py");
    fs::write(&source, "print('my app')\n").unwrap();
    let missing = dir.path().join("no/such/out.svg");
    let cases: Vec<(Vec<String>, &str)> = vec![
        // Nothing to profile: said at once, not after the duration.
        (
            vec![
                "record",
                "--match",
                &format!("nosuch-{token}"),
                "--duration",
                "30",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "no Python process matches",
        ),
        (
            vec!["record", &pid, "-o", &arg(&missing)]
                .into_iter()
                .map(String::from)
                .collect(),
            "does not exist",
        ),
        (
            vec!["record", &pid, "--format", "folded", "-o", &arg(&source)]
                .into_iter()
                .map(String::from)
                .collect(),
            "--force",
        ),
        // A file name that says another format than --format (#34).
        (
            vec![
                "record",
                &pid,
                "-f",
                "svg",
                "-o",
                &arg(&dir.path().join("prof.pb.gz")),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            "is a pprof file's name but --format is svg",
        ),
        (
            vec!["record", &pid, "--durration", "5"]
                .into_iter()
                .map(String::from)
                .collect(),
            "did you mean '--duration'",
        ),
        (
            vec!["record", &pid, "--duration", "5 parsecs"]
                .into_iter()
                .map(String::from)
                .collect(),
            "30s, 5m, 1h",
        ),
        (
            vec!["--out", &arg(&dir.path().join("x/y")), "--duration", "1"]
                .into_iter()
                .map(String::from)
                .collect(),
            "does not exist",
        ),
        (
            vec!["--out", &arg(&source), "--duration", "1"]
                .into_iter()
                .map(String::from)
                .collect(),
            "is a file, not a directory",
        ),
    ];
    for (args, needle) in &cases {
        let out = pyfleet(args);
        assert_error_contract(&out, Some(needle));
        assert!(out.elapsed < Duration::from_secs(10), "{}", out.describe());
    }
    assert_eq!(fs::read_to_string(&source).unwrap(), "print('my app')\n");
    let left: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("app.py")],
        "created: {left:?}"
    );

    // bench asks before it samples a process this shell did not start (pid 1) flat out.
    let out = pyfleet(&["bench", "--pid", "1", "--duration", "1"]);
    assert_error_contract(&out, Some("--yes"));
    // On a process this test started (pyfleet's parent's descendant) it needs no --yes, takes
    // a bare pid, and says what it cost.
    let out = pyfleet(&["bench", &pid, "--duration", "0.3"]);
    assert!(
        out.success() && out.stdout.contains("what it cost: ") && out.stdout.contains(" MB read"),
        "{}",
        out.describe()
    );
    // dump takes a bare pid, as py-spy users type it.
    let out = pyfleet(&["dump", &pid]);
    assert!(
        out.success() && out.stdout.contains("pyfleet_sleeping_worker"),
        "{}",
        out.describe()
    );

    // What works: a bare pid, a duration with a unit, --force over the source file.
    let out = pyfleet(&[
        "record",
        &pid,
        "--duration",
        "1500ms",
        "--format",
        "folded",
        "--force",
        "-o",
        &arg(&source),
    ]);
    assert!(out.success(), "{}", out.describe());
    final_line(&out, &source, "folded");
    check_file(&source, "folded");
}

/// A cpu-mode recording of a process that never ran says why it is empty and what shows its
/// threads instead (#34), and still succeeds: an idle target is no error.
#[test]
fn an_empty_cpu_mode_recording_says_why() {
    let _machine = shared();
    let token = unique_token("idle");
    let target = idle_sleeper(&token);
    let dir = tempdir("pyfleet-record-idle-");
    let folded = dir.path().join("idle.folded");
    let out = pyfleet(&[
        "record",
        &target.pid().to_string(),
        "--duration",
        "1",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(
        out.success()
            && out.stderr.contains("wrote 0 thread samples")
            && out.stderr.contains("no thread ran on a CPU while recorded")
            && out.stderr.contains("--mode wall"),
        "{}",
        out.describe()
    );
    // In wall mode the same process has its samples, and no such note.
    let out = pyfleet(&[
        "record",
        &target.pid().to_string(),
        "--mode",
        "wall",
        "--duration",
        "1",
        "-o",
        folded.to_str().unwrap(),
        "--force",
    ]);
    assert!(
        out.success()
            && !out.stderr.contains("wrote 0 thread")
            && !out.stderr.contains("no thread ran"),
        "{}",
        out.describe()
    );
}

/// `record -- python launched.py` on every version 3.11-3.15 (#34): the program runs under
/// pyfleet from its start (its first half second, `early_work`, has its samples: at least 20 of
/// about 50 at 100 Hz, the rest allowing for the interpreter's start and a scan), until it
/// exits, and its exit status (3) is pyfleet's; with a multiprocessing pool (spawn), the
/// pool's workers are recorded too.
#[test]
fn record_starts_a_program_and_passes_its_exit_status_on() {
    let _machine = shared();
    let dir = tempdir("pyfleet-record-launch-");
    for (interp, pool) in launched_cases() {
        let out = dir.path().join(format!("{}.folded", interp.label));
        let mut args = vec![
            "record".to_string(),
            "-o".into(),
            out.display().to_string(),
            // Samples by time, not by CPU used: a busy machine does not thin them.
            "--mode".into(),
            "wall".into(),
        ];
        args.extend(launched_command(&interp, pool));
        let run = pyfleet(&args);
        assert_eq!(
            run.status.code(),
            Some(3),
            "[{}] the program's exit status: {}",
            interp.label,
            run.describe()
        );
        let text = fs::read_to_string(&out).unwrap_or_default();
        match check_launched_profile(&text, pool) {
            Ok((early, late)) => eprintln!(
                "[{}] early_work {early}, late_work {late} samples",
                interp.label
            ),
            Err(e) => panic!("[{}] {e}:\n{}", interp.label, run.describe()),
        }
    }

    // A program that is not Python, whose child is: a shell running the script (which
    // does not exec it: `; exit $?` follows). The child is recorded, its status passed on.
    let interp = any_interpreter();
    let out = dir.path().join("shell.folded");
    let script = target_script("launched.py");
    let run = pyfleet(&[
        "record".to_string(),
        "-o".into(),
        out.display().to_string(),
        "--mode".into(),
        "wall".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "'{}' '{}'; exit $?",
            interp.path.display(),
            script.display()
        ),
    ]);
    assert_eq!(run.status.code(), Some(3), "{}", run.describe());
    let text = fs::read_to_string(&out).unwrap_or_default();
    if let Err(e) = check_launched_profile(&text, false) {
        panic!("[a shell's child] {e}:\n{}", run.describe());
    }

    // A program that cannot be started: one line, nothing written.
    let out = dir.path().join("none.folded");
    let run = pyfleet(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        "/nonexistent/program",
    ]);
    assert_error_contract(&run, Some("cannot start /nonexistent/program"));
    assert!(!out.exists());
    // Processes and a program at once: one line.
    let run = pyfleet(&["record", "--pid", "1", "--", "true"]);
    assert_error_contract(&run, Some("not both"));
}

/// Ctrl-C at a terminal (SIGINT to the foreground process group) at any instant of
/// `record -- python ...` (#52), pyfleet leading a session of its own (`setsid`), with
/// 3.11-3.15 in turn beside two CPU hogs: 10 times just
/// after pyfleet started the program (0, 2, 10, 40 and 160 ms after its process appeared,
/// before it is released: each with the debug and the measured build, the release build in
/// CI), then at 10 instants from 0.3 to 3 s, while it starts and while it is recorded. Every
/// time pyfleet and the program both end, nothing they started is left running a moment
/// later, and pyfleet's status is a shell's for the interrupted program: 130 (or Python's own
/// 1 when the interrupt came while it was still starting, "KeyboardInterrupt" on stderr, as
/// it would without pyfleet). The interrupted programs never exit by themselves.
#[test]
fn ctrl_c_at_any_instant_ends_pyfleet_and_the_program_together() {
    let _machine = alone();
    let Some(setsid) = tool("setsid", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let cases = launched_cases();
    let hogs: Vec<Proc> = (0..2)
        .map(|i| {
            let py = &cases[0].0;
            Proc::spawn(&format!("hog-{i}"), &py.path, &["-c", "while True: pass"])
        })
        .collect();
    let dir = tempdir("pyfleet-record-ctrl-c-");
    let mut instants: Vec<(bool, Duration)> = [0, 0, 2, 2, 10, 10, 40, 40, 160, 160]
        .into_iter()
        .map(|ms| (true, Duration::from_millis(ms)))
        .collect();
    instants.extend((1..=10).map(|k| (false, Duration::from_millis(300 * k))));
    let mut failures = Vec::new();
    for (i, &(after_program, at)) in instants.iter().enumerate() {
        let interp = &cases[i % cases.len()].0;
        let exe = if i % 2 == 0 {
            pyfleet_exe()
        } else {
            measured_exe()
        };
        let out = dir.path().join(format!("{i}.folded"));
        // Its own session and process group, which pyfleet leads (setsid, not a group leader
        // here, does not fork): the program shares them. (In a group of a session pyfleet
        // does not lead, the kernel would send SIGHUP and SIGCONT to a program stopped in a
        // group pyfleet left orphaned: a weak build would go unseen.)
        let mut cmd = Command::new(&setsid);
        cmd.arg(&exe)
            .args(["record", "-o", out.to_str().unwrap(), "--"])
            .arg(&interp.path)
            .args(["-c", "import time\nwhile True: sum(range(10000))"])
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE");
        let running = Running::start(cmd, Duration::from_secs(60));
        let pid = running.pid();
        wait_until(
            Duration::from_secs(20),
            "setsid to make pyfleet a session leader",
            || session_of(pid) == Some(pid),
            String::new,
        );
        if after_program {
            wait_until(
                Duration::from_secs(20),
                "pyfleet to start the program",
                || {
                    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                        .is_ok_and(|c| !c.trim().is_empty())
                },
                String::new,
            );
        }
        std::thread::sleep(at);
        send_signal(-pid, libc::SIGINT);
        let run = running.finish();
        let status = match (run.status.code(), run.status.signal()) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            _ => -1,
        };
        let python_starting = status == 1 && run.stderr.contains("KeyboardInterrupt");
        if !(status == 130 || python_starting) || !run.left_behind.is_empty() {
            failures.push(format!(
                "[{} at {at:?}{}, {}] status {status}, left behind {:?}: {}",
                interp.label,
                if after_program {
                    " after the program appeared"
                } else {
                    ""
                },
                exe.display(),
                run.left_behind,
                run.describe()
            ));
        }
    }
    drop(hogs);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `sudo pyfleet record -- COMMAND` (#52): the program runs as the user who ran sudo
/// (`SUDO_UID`/`SUDO_GID`, here nobody), with that user's groups and home, never as root; the
/// recording is still made (pyfleet stays root) and handed to that user. Without sudo, the
/// program runs as pyfleet does.
#[test]
fn a_program_started_under_sudo_runs_as_the_user_who_ran_sudo() {
    let _machine = shared();
    if !is_root() {
        eprintln!("skipped: needs root (to play sudo's root)");
        return;
    }
    // Debian's: nobody may run it (pyenv's are under /root).
    let Some(interp) = interpreter("3.11-debian") else {
        return;
    };
    let dir = tempdir("pyfleet-record-sudo-");
    let out = dir.path().join("sudo.folded");
    let program = "import os, time\nt = time.time()\nwhile time.time() - t < 1: sum(range(1000))\n\
                   print('ids', os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.environ.get('HOME'))";
    let mut cmd = pyfleet_command(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--mode",
        "wall",
        "--",
    ]);
    cmd.arg(&interp.path)
        .args(["-c", program])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534");
    let run = run_with_timeout(cmd, PYFLEET_TIMEOUT);
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stdout
            .contains("ids 65534 65534 65534 [65534] /nonexistent"),
        "the program did not run as nobody: {}",
        run.describe()
    );
    let text = fs::read_to_string(&out).unwrap_or_default();
    assert!(
        text.contains("<module>"),
        "nothing recorded: {}",
        run.describe()
    );
    let owner = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&out).unwrap());
    assert_eq!(owner, 65534, "the recording is not nobody's");

    let run = run_with_timeout(
        {
            let mut cmd = pyfleet_command(&["record", "-o", out.to_str().unwrap(), "--"]);
            cmd.arg(&interp.path)
                .args(["-c", "import os; print('ids', os.getuid())"])
                .env_remove("SUDO_UID")
                .env_remove("SUDO_GID");
            cmd
        },
        PYFLEET_TIMEOUT,
    );
    assert!(run.stdout.contains("ids 0"), "{}", run.describe());
}

/// `--function` (#34): one box per function, without line numbers, in the file as in the
/// daemon's snapshots; the functions are the same ones.
#[test]
fn function_level_recordings_have_no_line_numbers() {
    let _machine = shared();
    let token = unique_token("fn");
    let t = target(0.0, &token);
    let pid = t.pid().to_string();
    let dir = tempdir("pyfleet-record-fn-");
    let folded = dir.path().join("fn.folded");
    let out = pyfleet(&[
        "record",
        &pid,
        "--function",
        "--duration",
        "1.5",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(out.success(), "{}", out.describe());
    let text = fs::read_to_string(&folded).unwrap_or_default();
    let frames: Vec<&str> = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .flat_map(|(stack, _)| stack.split(';').skip(1))
        .collect();
    assert!(
        frames.iter().any(|f| f.starts_with("pyfleet_hot_leaf (")),
        "{text}"
    );
    let with_line: Vec<&&str> = frames
        .iter()
        .filter(|f| {
            f.rsplit_once(':')
                .is_some_and(|(_, l)| l.trim_end_matches(')').parse::<u32>().is_ok())
        })
        .collect();
    assert!(with_line.is_empty(), "frames with a line: {with_line:?}");
    // Each stack once: merged, not repeated.
    let stacks: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| Some(l.rsplit_once(' ')?.0))
        .collect();
    assert_eq!(stacks.len(), text.lines().count(), "{text}");

    let out_dir = dir.path().join("snapshots");
    let run = pyfleet(&[
        "run",
        "--pid",
        &pid,
        "--function",
        "--duration",
        "1.5",
        "--snapshot-format",
        "folded",
        "--metrics-addr",
        "off",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(run.success(), "{}", run.describe());
    let all: String = snapshot_dirs(&out_dir)
        .iter()
        .map(|d| fs::read_to_string(d.join("all.folded")).unwrap_or_default())
        .collect();
    assert!(
        all.contains("pyfleet_hot_leaf (") && !all.contains(".py:"),
        "{all}"
    );
}
