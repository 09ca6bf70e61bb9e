//! `pyfleet dump --async` must give the asyncio tasks that CPython itself reports for a process
//! whose task graph holds still (tests/targets/tasks.py: a TaskGroup tree three levels deep,
//! tasks awaiting a gathered future, a deep coroutine chain, the running task, a second
//! thread's loop, a task of a thread that ended), on 3.14 and 3.15; and a one-line error
//! before 3.14.

use crate::common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;

#[test]
fn tasks_3_14() {
    let _machine = shared();
    check_tasks("3.14");
}

#[test]
fn tasks_3_15() {
    let _machine = shared();
    check_tasks("3.15");
}

/// Every interpreter from 3.14 on has a case here.
#[test]
fn every_interpreter_with_tasks_is_covered() {
    let _machine = shared();
    for interp in interpreters().iter().filter(|i| i.minor >= 14) {
        assert!(
            ["3.14", "3.15"].contains(&interp.label.as_str()),
            "no task test for interpreter {}",
            interp.label
        );
    }
}

/// Before 3.14 no layout is published: the one-line error says which version is needed.
#[test]
fn before_3_14_async_is_a_clear_error() {
    let _machine = shared();
    for interp in interpreters().iter().filter(|i| i.minor < 14) {
        let token = unique_token("async-before-314");
        let mut target = Proc::python(
            &interp.label,
            &interp.path,
            "sleeper.py",
            &["ready", &token],
        );
        target.wait_for_file("ready", READY_TIMEOUT);
        let out = pyfleet(&["dump", "--async", &target.pid().to_string()]);
        assert!(!out.success(), "{}: dump --async succeeded", interp.label);
        assert_error_contract(&out, Some("3.14"));
    }
}

/// A task as either side describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TaskView {
    name: String,
    thread_id: Option<u64>,
    state: String,
    frames: Vec<String>,
    awaited_by: BTreeSet<u64>,
}

fn frames_of(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    format!(
                        "{} [{}] {}:{}",
                        f["qualname"].as_str().unwrap_or("?"),
                        f["function"].as_str().unwrap_or("?"),
                        f["file"].as_str().unwrap_or("?"),
                        f["line"]
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn tasks_of(list: &Value) -> BTreeMap<u64, TaskView> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    (
                        t["id"].as_u64().expect("a task id"),
                        TaskView {
                            name: t["name"].as_str().unwrap_or("?").to_string(),
                            thread_id: t["thread_id"].as_u64(),
                            state: t["state"].as_str().unwrap_or("?").to_string(),
                            frames: frames_of(&t["frames"]),
                            awaited_by: t["awaited_by"]
                                .as_array()
                                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                                .unwrap_or_default(),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn check_tasks(label: &str) {
    let Some(interp) = interpreter(label) else {
        return;
    };
    let out_dir = tempdir("pyfleet-tasks-");
    let mut target = Proc::python(label, &interp.path, "tasks.py", &[out_dir.path()]);
    let pid = target.pid();
    let expected_path = out_dir.path().join("expected.json");
    target.wait_for_path(&expected_path, READY_TIMEOUT);
    let expected: Value = serde_json::from_str(&fs::read_to_string(&expected_path).unwrap())
        .expect("expected.json is JSON");
    assert_eq!(expected["pid"].as_i64(), Some(i64::from(pid)));

    let (json_out, text_out) = {
        let _stopped = Stopped::new(pid);
        (
            pyfleet(&["dump", "--async", "--json", &pid.to_string()]),
            pyfleet(&["dump", "--async", &pid.to_string()]),
        )
    };
    if let Some(status) = target.exited() {
        panic!("{label}: the target died ({status})\n{}", target.stderr());
    }
    target.kill();
    let artifacts = artifacts_dir(&format!("dump_tasks/{label}"));
    fs::copy(&expected_path, artifacts.join("expected.json")).unwrap();
    fs::write(artifacts.join("dump.json"), &json_out.stdout).unwrap();
    fs::write(artifacts.join("dump.txt"), &text_out.stdout).unwrap();
    assert!(json_out.success(), "{label}: {}", json_out.describe());
    assert!(text_out.success(), "{label}: {}", text_out.describe());

    let dump: Value = serde_json::from_str(&json_out.stdout).expect("dump --json is JSON");
    let interps = dump["interpreters"].as_array().expect("interpreters");
    let main = interps
        .iter()
        .find(|i| i["id"].as_i64() == Some(0))
        .expect("the main interpreter");
    let want = tasks_of(&expected["tasks"]);
    let got = tasks_of(&main["tasks"]);
    // The graph the target was built to have is there, on its own side.
    let names: BTreeSet<&str> = want.values().map(|t| t.name.as_str()).collect();
    for name in [
        "top", "middle", "leaf-1", "leaf-2", "leaf-3", "gatherer", "deep", "reporter", "side-1",
        "side-2", "orphan",
    ] {
        assert!(
            names.contains(name),
            "{label}: the target has no task {name}"
        );
    }
    assert_eq!(
        want.values().filter(|t| t.state == "running").count(),
        1,
        "{label}: the target reports one running task"
    );
    assert!(
        want.values().any(|t| t.name.starts_with("Task-")),
        "{label}: no unnamed task"
    );
    assert!(
        want.values().any(|t| t.thread_id.is_none()),
        "{label}: no task of a thread that ended"
    );

    let mut errors = Vec::new();
    for (id, w) in &want {
        match got.get(id) {
            None => errors.push(format!("task {id:#x} ({}) is missing", w.name)),
            Some(g) if g != w => errors.push(format!(
                "task {id:#x} ({}):\n  want {w:?}\n  got  {g:?}",
                w.name
            )),
            Some(_) => {}
        }
    }
    for (id, g) in &got {
        if !want.contains_key(id) {
            errors.push(format!("task {id:#x} ({}) is not the target's", g.name));
        }
    }
    for name in ["reporter", "leaf-1", "orphan", "deep"] {
        if !text_out.stdout.contains(&format!("Task \"{name}\"")) {
            errors.push(format!("the text dump does not show task {name}"));
        }
    }
    assert!(
        errors.is_empty(),
        "{label}: dump --async differs from the target's own view ({} tasks):\n{}",
        want.len(),
        errors.join("\n")
    );
}

/// Ready tasks (3.14, 3.15), tests/targets/loop_ready.py frozen with its loop blocked: a task
/// whose sleep is due, one whose `to_thread` call returned, one whose future is done and one
/// never run are `ready, waiting for the loop`; one awaiting a future nothing completes and
/// one sleeping an hour are pending. A wall recording by reads charges every sample of the
/// ready ones, and none of the others, to what the loop runs (`spin`); with the kernel
/// capture they are marked ready only.
#[test]
fn ready_tasks_are_told_from_pending_ones_and_charged_to_the_loop() {
    let _machine = shared();
    for label in ["3.14", "3.15"] {
        let Some(interp) = interpreter(label) else {
            continue;
        };
        let out_dir = tempdir("pyfleet-ready-");
        let mut target = Proc::python(label, &interp.path, "loop_ready.py", &[out_dir.path()]);
        target.wait_for_path(&out_dir.path().join("blocked"), READY_TIMEOUT);
        let pid = target.pid().to_string();
        let dump = pyfleet(&["dump", "--async", "--json", &pid]);
        assert!(dump.success(), "{label}: {}", dump.describe());
        let doc: Value = serde_json::from_str(&dump.stdout).expect("dump --json is JSON");
        let states: BTreeMap<String, String> = doc["interpreters"][0]["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or("?").to_string(),
                    t["state"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        let ready = ["timer", "threaded", "woken", "stepping"];
        let pending = ["forever", "later"];
        for name in ready {
            assert_eq!(
                states.get(name).map(String::as_str),
                Some("ready, waiting for the loop"),
                "{label}: task {name}: {states:?}"
            );
        }
        for name in pending {
            assert_eq!(
                states.get(name).map(String::as_str),
                Some("pending"),
                "{label}: task {name}: {states:?}"
            );
        }

        let mut captures = vec!["reads"];
        if crate::capture::kernel_capture_available(&pyfleet_exe()) {
            captures.push("kernel");
        }
        for capture in captures {
            let path = out_dir.path().join(format!("{capture}.folded"));
            let out = pyfleet(&[
                "record",
                "--pid",
                &pid,
                "--async",
                "--async-mode",
                "all",
                "--mode",
                "wall",
                "--idle",
                "--group-by",
                "task",
                "--capture",
                capture,
                "--duration",
                "2s",
                "-o",
                path.to_str().unwrap(),
            ]);
            assert!(out.success(), "{label} {capture}: {}", out.describe());
            let want = match capture {
                "reads" => "[loop blocked by spin] (",
                _ => "[ready, waiting for the loop] (",
            };
            let lines = crate::task_stacks::folded(&path);
            for name in ready.iter().chain(&pending) {
                let task = format!("task {name} (");
                let of_task: Vec<&(Vec<String>, u64)> = lines
                    .iter()
                    .filter(|(f, _)| f.iter().any(|x| x.starts_with(&task)))
                    .collect();
                let blamed: u64 = of_task
                    .iter()
                    .filter(|(f, _)| f.last().is_some_and(|x| x.starts_with(want)))
                    .map(|(_, n)| n)
                    .sum();
                let all: u64 = of_task.iter().map(|(_, n)| n).sum();
                assert!(all >= 50, "{label} {capture}: {all} samples of task {name}");
                let expected = if ready.contains(name) { all } else { 0 };
                assert_eq!(
                    blamed, expected,
                    "{label} {capture}: task {name}: {blamed} of {all} samples end in {want}"
                );
            }
        }
        target.kill();
    }
}
