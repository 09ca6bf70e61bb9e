//! Which stacks wait for work (`--no-idle`, wall mode's default): a thread off its CPU whose
//! innermost Python frame is one of the standard library's ways to wait for the next job
//! spends that time idle, not in the program's work, and py-spy's users expect such threads
//! left out. A thread waiting inside the program's own code (a socket read in a request
//! handler, a `time.sleep` in a loop) is not idle by this rule: its wait is what wall mode
//! is for.
//!
//! The waits: `threading` (`Condition.wait` under `Event.wait`, `Semaphore.acquire`,
//! `Barrier.wait` and the rest; `Thread.join`), `queue.Queue.get`, a `selectors` `select`
//! (an idle asyncio loop, `socketserver`'s `serve_forever`), `concurrent.futures` pool
//! workers waiting on their C queue, and `multiprocessing`'s pool and connection waits.

/// Whether a profile in `mode` leaves out the threads waiting for work, given `--idle` and
/// `--no-idle` (at most one of them): only wall mode counts threads off their CPU, and it
/// leaves them out unless `--idle`.
pub fn leave_out_idle(mode: crate::Mode, idle: bool, no_idle: bool) -> Result<bool, String> {
    match (mode, idle, no_idle) {
        (_, true, true) => Err("--idle and --no-idle contradict each other".into()),
        (crate::Mode::Wall, idle, _) => Ok(!idle),
        (_, false, false) => Ok(false),
        (mode, idle, _) => Err(format!(
            "{} goes with --mode wall: {mode} mode does not count threads that wait",
            if idle { "--idle" } else { "--no-idle" }
        )),
    }
}

/// `(file name, function names)`: a frame waits for work when its file's name (the last
/// path component) and its function (`co_name`) are listed together.
const WAITS: &[(&str, &[&str])] = &[
    (
        "threading.py",
        &["wait", "wait_for", "join", "_wait_for_tstate_lock"],
    ),
    ("queue.py", &["get"]),
    ("selectors.py", &["select"]),
    ("thread.py", &["_worker"]),
    (
        "connection.py",
        &[
            "wait",
            "_poll",
            "poll",
            "_recv",
            "_recv_bytes",
            "recv",
            "recv_bytes",
        ],
    ),
    (
        "pool.py",
        &[
            "worker",
            "_handle_workers",
            "_handle_tasks",
            "_handle_results",
        ],
    ),
];

/// The directory a listed file must sit in, when its name alone says too little.
fn parent_of(file_name: &str) -> Option<&'static str> {
    match file_name {
        "thread.py" => Some("futures"),
        "connection.py" | "pool.py" => Some("multiprocessing"),
        _ => None,
    }
}

/// Whether the innermost frame `function` of `file` waits for work.
pub fn waits_for_work(file: &str, function: &str) -> bool {
    let mut parts = file.rsplit(['/', '\\']);
    let name = parts.next().unwrap_or(file);
    let Some((_, functions)) = WAITS.iter().find(|(f, _)| *f == name) else {
        return false;
    };
    if let Some(dir) = parent_of(name) {
        if parts.next() != Some(dir) {
            return false;
        }
    }
    functions.contains(&function)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_librarys_waits_for_work() {
        let lib = "/usr/lib/python3.12";
        for (file, function) in [
            ("threading.py", "wait"),
            ("threading.py", "_wait_for_tstate_lock"),
            ("queue.py", "get"),
            ("selectors.py", "select"),
            ("concurrent/futures/thread.py", "_worker"),
            ("multiprocessing/connection.py", "wait"),
            ("multiprocessing/pool.py", "worker"),
        ] {
            assert!(
                waits_for_work(&format!("{lib}/{file}"), function),
                "{file} {function}"
            );
        }
    }

    #[test]
    fn wall_mode_leaves_idle_threads_out_unless_asked() {
        use crate::Mode;
        assert_eq!(leave_out_idle(Mode::Wall, false, false), Ok(true));
        assert_eq!(leave_out_idle(Mode::Wall, false, true), Ok(true));
        assert_eq!(leave_out_idle(Mode::Wall, true, false), Ok(false));
        assert_eq!(leave_out_idle(Mode::Cpu, false, false), Ok(false));
        assert_eq!(leave_out_idle(Mode::Gil, false, false), Ok(false));
        assert!(leave_out_idle(Mode::Cpu, true, false).is_err_and(|e| e.contains("--idle")));
        assert!(leave_out_idle(Mode::Gil, false, true).is_err_and(|e| e.contains("--no-idle")));
        assert!(leave_out_idle(Mode::Wall, true, true).is_err());
    }

    #[test]
    fn the_programs_own_waits_are_not_idle() {
        for (file, function) in [
            ("/srv/app/handlers.py", "wait"),
            ("/usr/lib/python3.12/threading.py", "run"),
            ("/usr/lib/python3.12/queue.py", "put"),
            ("/srv/app/thread.py", "_worker"),
            ("/usr/lib/python3.12/socket.py", "recv_into"),
            ("", ""),
        ] {
            assert!(!waits_for_work(file, function), "{file} {function}");
        }
    }
}
