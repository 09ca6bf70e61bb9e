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
//!
//! An asyncio task that waits (`--async-mode all`) is idle by the same measure
//! ([`task_waits_for_work`]): awaiting the next item of an `asyncio.Queue` (a consumer, an
//! ASGI server's lifespan task), an `asyncio.Event` or `Condition`, `serve_forever`, or
//! sleeping in a server's own ticker loop (uvicorn's `main_loop`, aiohttp's `_run_app`). A
//! task awaiting anything else, a sleep in the program's code included, is not idle.

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

/// `(directory, file name, function names)`: an asyncio task whose innermost frame is one of
/// these waits for work.
const TASK_WAITS: &[(&str, &str, &[&str])] = &[
    ("asyncio", "queues.py", &["get"]),
    ("asyncio", "locks.py", &["wait"]),
    ("asyncio", "base_events.py", &["serve_forever"]),
];

/// `(directory, file name, function names)`: servers' loops that sleep between looks at
/// their state (an asyncio task sleeping directly in one waits for work).
const TICKERS: &[(&str, &str, &[&str])] = &[
    ("uvicorn", "server.py", &["main_loop"]),
    ("aiohttp", "web.py", &["_run_app"]),
];

/// Whether `function` of `file` is listed in `table`.
fn listed(table: &[(&str, &str, &[&str])], file: &str, function: &str) -> bool {
    let mut parts = file.rsplit(['/', '\\']);
    let name = parts.next().unwrap_or(file);
    let dir = parts.next();
    table
        .iter()
        .any(|(d, f, functions)| *f == name && dir == Some(*d) && functions.contains(&function))
}

/// Whether a waiting asyncio task's stack, given as `(file, function)` of each frame innermost
/// first, waits for work (see the module documentation).
pub fn task_waits_for_work<'a>(mut frames: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
    let Some((file, function)) = frames.next() else {
        return false;
    };
    if listed(TASK_WAITS, file, function) {
        return true;
    }
    if !listed(&[("asyncio", "tasks.py", &["sleep"])], file, function) {
        return false;
    }
    frames
        .next()
        .is_some_and(|(file, function)| listed(TICKERS, file, function))
}

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
    fn asyncio_tasks_waiting_for_work_and_servers_tickers() {
        let lib = "/usr/lib/python3.14/asyncio";
        let site = "/srv/venv/lib/python3.14/site-packages";
        let idle: &[&[(&str, &str)]] = &[
            &[
                (&format!("{lib}/queues.py"), "get"),
                ("/srv/app.py", "consume"),
            ],
            &[(&format!("{lib}/locks.py"), "wait")],
            &[(&format!("{lib}/base_events.py"), "serve_forever")],
            &[
                (&format!("{lib}/tasks.py"), "sleep"),
                (&format!("{site}/uvicorn/server.py"), "main_loop"),
            ],
            &[
                (&format!("{lib}/tasks.py"), "sleep"),
                (&format!("{site}/aiohttp/web.py"), "_run_app"),
            ],
        ];
        for frames in idle {
            assert!(task_waits_for_work(frames.iter().copied()), "{frames:?}");
        }
        let busy: &[&[(&str, &str)]] = &[
            // A request's own sleep, or a server's sleep elsewhere.
            &[
                (&format!("{lib}/tasks.py"), "sleep"),
                ("/srv/app.py", "fetch_orders"),
            ],
            &[
                (&format!("{lib}/tasks.py"), "sleep"),
                (&format!("{site}/uvicorn/protocols/http.py"), "main_loop"),
            ],
            &[(&format!("{lib}/tasks.py"), "sleep")],
            &[(&format!("{lib}/threads.py"), "to_thread")],
            &[("/srv/asyncio/queues.py", "put")],
            &[("/srv/queues.py", "get")],
            &[],
        ];
        for frames in busy {
            assert!(!task_waits_for_work(frames.iter().copied()), "{frames:?}");
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
