//! `holds_gil` and `on_cpu` against real interpreters: a thread spinning in Python holds the
//! GIL and is on CPU in most dumps; a thread waiting on an Event never is.

use crate::common::*;
use std::time::Duration;

const DUMPS: usize = 20;

fn thread(dump: &serde_json::Value, ident: u64) -> Option<&serde_json::Value> {
    dump["interpreters"][0]["threads"]
        .as_array()?
        .iter()
        .find(|t| t["thread_id"].as_u64() == Some(ident))
}

#[test]
fn gil_holder_and_cpu_state_follow_the_target() {
    // Alone: it counts the dumps that find the spinner on CPU and the waiting thread asleep.
    let _machine = alone();
    let mut failures = Vec::new();
    for interp in interpreters() {
        // The target runs in its own directory and writes threads.json there.
        let mut target = Proc::python(&interp.label, &interp.path, "gil_busy.py", &["."]);
        let file = target.dir().join("threads.json");
        target.wait_for_path(&file, Duration::from_secs(30));
        let ids: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let (busy, idle) = (ids["busy"].as_u64().unwrap(), ids["idle"].as_u64().unwrap());
        // The main thread writes the file and then waits; on a loaded machine it may still be
        // on its way to `wait()` when the file appears. Dump once it sleeps (the main
        // thread's tid is the pid).
        let pid = target.pid();
        wait_until(
            Duration::from_secs(10),
            &format!("[{}] the waiting thread to sleep", interp.label),
            || process_state(pid) == Some('S'),
            || format!("state {:?}", process_state(pid)),
        );

        let (mut busy_gil, mut busy_cpu) = (0, 0);
        for _ in 0..DUMPS {
            // `dump` pauses the target (ptrace): the waiting thread leaves its wait for the
            // pause and goes back to it after; it is runnable until then.
            wait_until(
                Duration::from_secs(10),
                &format!("[{}] the waiting thread to sleep again", interp.label),
                || asleep_for(pid, Duration::from_millis(30)),
                || format!("state {:?}", process_state(pid)),
            );
            let pid = target.pid().to_string();
            let out = pyfleet(&["dump", "--pid", &pid, "--json"]);
            assert!(out.success(), "[{}] {}", interp.label, out.describe());
            let dump: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            let holders = dump["interpreters"][0]["threads"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["holds_gil"] == true)
                .count();
            if holders > 1 {
                failures.push(format!("[{}] {holders} threads hold the GIL", interp.label));
            }
            let Some(b) = thread(&dump, busy) else {
                failures.push(format!("[{}] busy thread missing", interp.label));
                continue;
            };
            busy_gil += usize::from(b["holds_gil"] == true);
            busy_cpu += usize::from(b["on_cpu"] == true);
            if let Some(i) = thread(&dump, idle) {
                if i["holds_gil"] == true || i["on_cpu"] == true {
                    failures.push(format!("[{}] waiting thread shown busy: {i}", interp.label));
                }
            } else {
                failures.push(format!("[{}] waiting thread missing", interp.label));
            }
        }
        // The spinner only lets go of the GIL at switch intervals nobody asks for, and never
        // sleeps: it should be seen with both in nearly every dump, even on a loaded machine.
        if busy_gil < DUMPS / 2 || busy_cpu < DUMPS / 2 {
            failures.push(format!(
                "[{}] busy thread held the GIL in {busy_gil}/{DUMPS} dumps, on CPU in {busy_cpu}/{DUMPS}",
                interp.label
            ));
        }
        target.kill();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
