//! Targets in their own pid (and mount) namespace, as in every container: CPython records its
//! threads' ids as the namespace sees them (1, 2, ...). On every version, `dump` must show
//! the host's ids and the namespace's, tell the spinning thread from the waiting one, `record
//! --mode cpu` must sample the spinner, and the idle skip must work as outside a namespace.

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const DUMPS: usize = 10;

/// A target started under `unshare -p -f --mount-proc`; `pid` is the Python process as we
/// see it (unshare's child).
pub struct Contained {
    pub unshare: Proc,
    pub pid: i32,
}

/// `unshare` is util-linux's (`tool("unshare", SETUP_DEPLOY_TOOLS)`).
pub fn contained(
    unshare: &Path,
    label: &str,
    python: &Path,
    script: &str,
    args: &[&str],
) -> Contained {
    let mut all = vec![
        "-p".to_string(),
        "-f".into(),
        "--mount-proc".into(),
        "--kill-child".into(),
        python.display().to_string(),
        target_script(script).display().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    let proc = Proc::spawn(
        &format!("{script} [{label}] in a pid namespace"),
        unshare,
        &all,
    );
    let outer = proc.pid();
    let mut pid = 0;
    wait_until(
        Duration::from_secs(30),
        &format!("[{label}] unshare to start the target"),
        || {
            pid = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            pid > 0
        },
        || format!("unshare's stderr: {}", proc.stderr()),
    );
    Contained { unshare: proc, pid }
}

fn host_tids(pid: i32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn threads_of_a_contained_target_are_the_hosts() {
    // Alone: it counts the dumps and samples that find the spinner on CPU.
    let _machine = alone();
    let Some(unshare) = tool("unshare", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let mut failures = Vec::new();
    for interp in interpreters() {
        let l = &interp.label;
        let mut t = contained(&unshare, l, &interp.path, "gil_busy.py", &["."]);
        let file = t.unshare.dir().join("threads.json");
        t.unshare.wait_for_path(&file, Duration::from_secs(30));
        let ids: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let (busy, idle) = (ids["busy"].as_u64().unwrap(), ids["idle"].as_u64().unwrap());
        let pid = t.pid;
        // A blocking dump stops every thread, which wakes the waiting one for a moment: it
        // is asleep again before each dump.
        let asleep = || {
            wait_until(
                Duration::from_secs(10),
                &format!("[{l}] the waiting thread to sleep"),
                || asleep_for(pid, Duration::from_millis(30)),
                || format!("state {:?}", process_state(pid)),
            )
        };
        let tids = host_tids(pid);
        for mode in ["--blocking", "--nonblocking"] {
            let mut busy_cpu = 0;
            for _ in 0..DUMPS {
                asleep();
                let mut args = vec!["dump", "--json"];
                let p = pid.to_string();
                args.extend(["--pid", &p]);
                if mode == "--nonblocking" {
                    args.push(mode);
                }
                let out = pyfleet(&args);
                if !out.success() {
                    failures.push(format!("[{l}] dump {mode}: {}", out.describe()));
                    continue;
                }
                let dump: Value = serde_json::from_str(&out.stdout).unwrap();
                let threads = dump["interpreters"][0]["threads"].as_array().unwrap();
                for th in threads {
                    let native = th["native_thread_id"].as_u64().unwrap_or(0);
                    let inner = th["namespace_thread_id"].as_u64();
                    if !tids.contains(&native) || inner.is_none() || inner == Some(native) {
                        failures.push(format!(
                            "[{l}] {mode}: thread ids native {native} (host tasks {tids:?}), \
                             namespace {inner:?}"
                        ));
                    }
                    let ident = th["thread_id"].as_u64();
                    if ident == Some(idle) {
                        if inner != Some(1) || native != pid as u64 {
                            failures.push(format!("[{l}] {mode}: main thread shown as {th}"));
                        }
                        if th["on_cpu"] == true {
                            failures.push(format!("[{l}] {mode}: waiting thread on CPU"));
                        }
                    }
                    if ident == Some(busy) && th["on_cpu"] == true {
                        busy_cpu += 1;
                    }
                }
            }
            // Outside a namespace the spinner is on CPU in nearly every dump
            // (thread_status.rs); with the namespace's ids taken for the host's it never was.
            if busy_cpu < DUMPS / 2 {
                failures.push(format!(
                    "[{l}] {mode}: spinning thread on CPU in {busy_cpu}/{DUMPS} dumps"
                ));
            }
        }

        // CPU mode samples the spinner (it wrote none: every thread looked off CPU).
        let out_dir = tempdir("pyfleet-ns-record-");
        let folded = out_dir.path().join("cpu.folded");
        let out = pyfleet(&[
            "record",
            "--pid",
            &pid.to_string(),
            "--duration",
            "2",
            "--mode",
            "cpu",
            "-o",
            folded.to_str().unwrap(),
        ]);
        let text = std::fs::read_to_string(&folded).unwrap_or_default();
        let spin: u64 = text
            .lines()
            .filter(|s| s.contains("spin ("))
            .filter_map(|s| s.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        // 2 s at 100 Hz: about 200 samples of a thread that spins all the time.
        if !out.success() || spin < 50 || text.contains("wait (") {
            failures.push(format!(
                "[{l}] record --mode cpu: {spin} samples of the spinner; {}\n{}",
                out.describe(),
                truncate(&text, 600)
            ));
        }
        t.unshare.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn idle_skip_works_in_a_namespace() {
    let _machine = shared();
    let Some(unshare) = tool("unshare", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let mut failures = Vec::new();
    for interp in interpreters() {
        let l = &interp.label;
        let mut t = contained(&unshare, l, &interp.path, "sleeper.py", &["ready"]);
        t.unshare
            .wait_for_path(&t.unshare.dir().join("ready"), Duration::from_secs(30));
        let out = pyfleet(&[
            "bench",
            "--pid",
            &t.pid.to_string(),
            "--duration",
            "1",
            "--json",
        ]);
        let doc: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        let samples = doc["samples"].as_u64().unwrap_or(0);
        let kept = doc["samples_unchanged"].as_u64().unwrap_or(0);
        // The process sleeps: after the first reads, the kernel says no thread ran, and all
        // but one sample in MAX_KEPT (1000) are kept whole. Without the host's thread ids no
        // thread can be watched and none is.
        if !out.success() || samples == 0 || kept * 2 < samples {
            failures.push(format!(
                "[{l}] {kept} of {samples} samples kept whole; {}",
                out.describe()
            ));
        }
        t.unshare.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
