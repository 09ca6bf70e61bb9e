//! The daemon's log as a journal or a log collector gets it (stderr a pipe, not a terminal):
//! plain text without one escape code, or with `--log-format json` one JSON object per line,
//! pyfleet's own warnings and tracing's alike. The run warns twice, once of each kind: a
//! `--pid` that is not Python (pyfleet's own warning) and a profile store that refuses every
//! push (tracing's, from the pusher).

use crate::common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A loopback "profile store" that answers every request 400, until dropped.
struct RefusingStore {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RefusingStore {
    fn start() -> RefusingStore {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                // The whole request (headers, then Content-Length bytes), so that the answer
                // is read rather than cut off by a reset.
                let mut raw = Vec::new();
                let mut buf = [0u8; 16384];
                let complete = |raw: &[u8]| {
                    let text = String::from_utf8_lossy(raw);
                    let Some(end) = text.find("\r\n\r\n") else {
                        return false;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    raw.len() >= end + 4 + length
                };
                while !complete(&raw) {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                }
                let why = "refused by the test";
                let _ = write!(
                    stream,
                    "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}",
                    why.len()
                );
            }
        });
        RefusingStore {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RefusingStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The daemon's stderr over a run that warns of both kinds, with `extra` arguments.
fn daemon_log(extra: &[&str]) -> String {
    let any = any_interpreter();
    let token = unique_token("pyfleetlog");
    let mut python = Proc::python(&any.label, &any.path, "sleeper.py", &["ready", &token]);
    python.wait_for_file("ready", READY_TIMEOUT);
    let mut not_python = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let store = RefusingStore::start();
    let dir = tempdir("pyfleet-log-");
    let out = dir.path().join("snapshots");
    let mut args: Vec<String> = [
        "run",
        "--pid",
        &python.pid().to_string(),
        "--pid",
        &not_python.id().to_string(),
        "--idle",
        "--mode",
        "wall",
        "--pyroscope",
        &format!("http://127.0.0.1:{}", store.port),
        "--push-interval",
        "1",
        "--snapshot-interval",
        "2",
        "--snapshot-format",
        "folded",
        "--duration",
        "5",
        "--out",
        &out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let run = Running::start(pyfleet_command(&args), Duration::from_secs(60)).finish();
    let _ = not_python.kill();
    let _ = not_python.wait();
    python.kill();
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.left_behind.is_empty(),
        "left behind: {:?}",
        run.left_behind
    );
    run.stderr
}

#[test]
fn the_log_off_a_terminal_is_plain_text_or_json_lines() {
    let _machine = shared();

    let text = daemon_log(&[]);
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log that is not a terminal's:\n{text}"
    );
    assert!(text.contains("pyfleet: profiling "), "{text}");
    assert!(
        text.contains("pyfleet: warning: pid ") && text.contains("is not a Python process"),
        "{text}"
    );
    assert!(text.contains("pyroscope refused a profile"), "{text}");

    let json = daemon_log(&["--log-format", "json"]);
    let mut events = Vec::new();
    for line in json.lines().filter(|l| !l.trim().is_empty()) {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{json}"));
        let level = event["level"].as_str().unwrap_or_default().to_string();
        let message = event["fields"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no fields.message: {line}"))
            .to_string();
        assert!(event["timestamp"].is_string(), "{line}");
        events.push((level, message));
    }
    let has = |level: &str, part: &str| events.iter().any(|(l, m)| l == level && m.contains(part));
    assert!(has("INFO", "profiling "), "{events:?}");
    assert!(has("WARN", "is not a Python process"), "{events:?}");
    assert!(has("WARN", "pyroscope refused a profile"), "{events:?}");
    assert!(!json.contains('\u{1b}'), "{json}");
}
