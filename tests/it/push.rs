//! Pushing to Grafana Pyroscope. No Pyroscope server can be installed from the registries
//! reachable here, so a conformance server of this test's own checks every request against
//! Pyroscope's documented HTTP ingest API (`POST /ingest`; query `name` = application and
//! `{labels}`, `from` < `until` in Unix seconds, `format=pprof`, `sampleRate`, `spyName`,
//! `units`, `aggregationType`; the pprof in the multipart field `profile`; `Authorization`
//! and `X-Scope-OrgID` as configured) and decodes each body. The daemon pushes on the
//! snapshot schedule, so each push is one snapshot window: its counts must be the folded
//! snapshot's. The server is down for a while mid-run and comes back on the same port: what
//! was retried, dropped and counted is checked, and sampling kept its rate throughout.
//!
//! Over TLS (a test CA's certificate, the CA given as `ca-file`), the same checks hold; then
//! the server answers each push with a 10 MB body, then with a body that never ends: the
//! pusher reads a few KiB of each, drops it within its bound, and pushes on.

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TENANT: &str = "team-a";
const CREDENTIALS: &str = "pyfleet:s3cret";

/// One request the server took: the application name and its labels, the window, and the
/// decoded profile's counts by pid.
#[derive(Debug, Clone)]
struct Ingest {
    application: String,
    labels: BTreeMap<String, String>,
    from: u64,
    until: u64,
    by_pid: BTreeMap<i64, i64>,
}

/// How the server answers a request that conforms.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// 200 and an empty body.
    Conform,
    /// 200 and a body of [`HUGE_BODY`] bytes.
    Huge,
    /// 200 and a chunked body, a chunk every 100 ms, until the client goes away.
    Endless,
}

/// The body of [`Answer::Huge`].
const HUGE_BODY: usize = 10 << 20;

/// What the server logs of each connection: the request's verdict, and how long the
/// answer's body lasted before it was done or the client went away.
type Log = Arc<Mutex<Vec<(Result<Ingest, String>, Duration)>>>;

/// The conformance server: accepts on `port` until stopped, over TLS when given a config.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Plain HTTP, conforming answers.
    fn start(port: u16, log: Log) -> Server {
        Server::serve(port, None, Answer::Conform, log)
    }

    fn serve(
        port: u16,
        tls: Option<Arc<rustls::ServerConfig>>,
        answer: Answer,
        log: Log,
    ) -> Server {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("conformance server port");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).ok();
                        stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
                        stream.set_write_timeout(Some(Duration::from_secs(30))).ok();
                        let entry = match &tls {
                            None => handle(stream, answer),
                            Some(config) => match rustls::ServerConnection::new(config.clone()) {
                                Ok(conn) => handle(rustls::StreamOwned::new(conn, stream), answer),
                                Err(e) => (Err(format!("TLS: {e}")), Duration::ZERO),
                            },
                        };
                        log.lock().unwrap().push(entry);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Server {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one request, checks it against the documented API, answers 200 as `answer` says (or
/// 400 saying why), and returns what it carried and how long the answer's body lasted.
fn handle<S: Read + Write>(mut stream: S, answer: Answer) -> (Result<Ingest, String>, Duration) {
    let verdict = read_and_check(&mut stream);
    let started = Instant::now();
    let head = |length: &str| format!("HTTP/1.1 200 OK\r\n{length}\r\nConnection: close\r\n\r\n");
    let _ = match (&verdict, answer) {
        (Err(why), _) => write!(
            stream,
            "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{why}",
            why.len()
        ),
        (Ok(_), Answer::Conform) => stream.write_all(head("Content-Length: 0").as_bytes()),
        (Ok(_), Answer::Huge) => (|| {
            stream.write_all(head(&format!("Content-Length: {HUGE_BODY}")).as_bytes())?;
            let block = vec![b'x'; 65536];
            for _ in 0..HUGE_BODY / block.len() {
                stream.write_all(&block)?;
            }
            Ok(())
        })(),
        (Ok(_), Answer::Endless) => (|| {
            stream.write_all(head("Transfer-Encoding: chunked").as_bytes())?;
            // Until the client goes away (or a minute, the test's bound).
            while started.elapsed() < Duration::from_secs(60) {
                stream.write_all(b"400\r\n")?;
                stream.write_all(&[b'y'; 0x400])?;
                stream.write_all(b"\r\n")?;
                stream.flush()?;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })(),
    };
    let _ = stream.flush();
    (verdict, started.elapsed())
}

fn read_and_check<S: Read>(stream: &mut S) -> Result<Ingest, String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        let n = stream.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed before the head".into());
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .ok_or("no Content-Length")?;
    let mut body = raw[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream
            .read(&mut buf)
            .map_err(|e| format!("read body: {e}"))?;
        if n == 0 {
            return Err("body shorter than Content-Length".into());
        }
        body.extend_from_slice(&buf[..n]);
    }
    let mut parts = request_line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "POST" {
        return Err(format!("method {method}, not POST"));
    }
    let (path, query) = target.split_once('?').ok_or("no query")?;
    if path != "/ingest" {
        return Err(format!("path {path}, not /ingest"));
    }
    let params: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect();
    let param = |k: &str| params.get(k).cloned().ok_or(format!("no {k} parameter"));
    // name: application{k=v,...}
    let name = param("name")?;
    let (application, labels) = name
        .strip_suffix('}')
        .and_then(|n| n.split_once('{'))
        .ok_or(format!("name {name} is not application{{labels}}"))?;
    let legal = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
    };
    if !legal(application) {
        return Err(format!("application name {application:?}"));
    }
    let mut label_map = BTreeMap::new();
    for kv in labels.split(',').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or(format!("label {kv:?}"))?;
        if !legal(k) || !legal(v) || k.contains(':') {
            return Err(format!("label {kv:?}"));
        }
        label_map.insert(k.to_string(), v.to_string());
    }
    let from: u64 = param("from")?.parse().map_err(|_| "from not a number")?;
    let until: u64 = param("until")?.parse().map_err(|_| "until not a number")?;
    if from >= until || from < 1_600_000_000 {
        return Err(format!("window {from}..{until}"));
    }
    for (k, want) in [
        ("format", "pprof"),
        ("spyName", "pyfleet"),
        ("units", "samples"),
        ("aggregationType", "sum"),
    ] {
        if param(k)? != want {
            return Err(format!("{k}={}", param(k)?));
        }
    }
    let rate: u64 = param("sampleRate")?
        .parse()
        .map_err(|_| "sampleRate not a number")?;
    if rate == 0 {
        return Err("sampleRate 0".into());
    }
    // Headers.
    let want_auth = {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(CREDENTIALS)
        )
    };
    if headers.get("authorization") != Some(&want_auth) {
        return Err(format!("authorization {:?}", headers.get("authorization")));
    }
    if headers.get("x-scope-orgid").map(String::as_str) != Some(TENANT) {
        return Err(format!("x-scope-orgid {:?}", headers.get("x-scope-orgid")));
    }
    let content_type = headers.get("content-type").ok_or("no Content-Type")?;
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .ok_or(format!("content-type {content_type}"))?;
    // The multipart body: the part named `profile`.
    let delimiter = format!("--{boundary}");
    let text_positions: Vec<usize> = body
        .windows(delimiter.len())
        .enumerate()
        .filter(|(_, w)| *w == delimiter.as_bytes())
        .map(|(i, _)| i)
        .collect();
    if text_positions.len() < 2
        || !body[text_positions[text_positions.len() - 1]..]
            .starts_with(format!("{delimiter}--").as_bytes())
    {
        return Err("multipart body without its closing delimiter".into());
    }
    let part = &body[text_positions[0] + delimiter.len()..text_positions[1]];
    let part_head_end = part
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("part without a head")?;
    let part_head = String::from_utf8_lossy(&part[..part_head_end]);
    if !part_head.contains("name=\"profile\"") {
        return Err(format!("first part is not `profile`: {part_head}"));
    }
    let content = part[part_head_end + 4..]
        .strip_suffix(b"\r\n")
        .ok_or("part not ended by CRLF")?;
    let profile = pyfleet::output::pprof::decode(content).map_err(|e| format!("pprof: {e}"))?;
    let s = |i: i64| profile.string_table[i as usize].as_str();
    let mut by_pid = BTreeMap::new();
    for sample in &profile.sample {
        let pid = sample
            .label
            .iter()
            .find(|l| s(l.key) == "pid")
            .map(|l| l.num)
            .ok_or("a sample without a pid label")?;
        *by_pid.entry(pid).or_insert(0) += sample.value[0];
    }
    Ok(Ingest {
        application: application.to_string(),
        labels: label_map,
        from,
        until,
        by_pid,
    })
}

/// Unix seconds of an RFC 3339 UTC time as snapshots write it (`2026-11-26T14:05:01.123Z`).
fn unix_secs(t: &str) -> u64 {
    let num = |a: usize, b: usize| -> i64 { t[a..b].parse().unwrap() };
    let (y, m, d) = (num(0, 4), num(5, 7), num(8, 10));
    let (hh, mm, ss) = (num(11, 13), num(14, 16), num(17, 19));
    // Days from civil (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + hh * 3600 + mm * 60 + ss) as u64
}

/// Counts by pid in each snapshot's folded files, with the window's edges in seconds.
fn snapshot_windows(out: &Path) -> Vec<(u64, u64, BTreeMap<i64, i64>, f64)> {
    snapshot_dirs(out)
        .into_iter()
        .map(|d| {
            let meta: serde_json::Value =
                serde_json::from_slice(&fs::read(d.join("metadata.json")).unwrap()).unwrap();
            let mut by_pid = BTreeMap::new();
            for e in fs::read_dir(&d).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_suffix(".folded")
                    .and_then(|n| n.rsplit('-').next())
                    .and_then(|p| p.parse::<i64>().ok())
                else {
                    continue;
                };
                let total: i64 = fs::read_to_string(e.path())
                    .unwrap()
                    .lines()
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<i64>().ok())
                    .sum();
                by_pid.insert(pid, total);
            }
            (
                unix_secs(meta["window_start"].as_str().unwrap()),
                unix_secs(meta["window_end"].as_str().unwrap()),
                by_pid,
                meta["window_seconds"].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

/// A push's counts are those of the snapshot window with its edges.
fn assert_push_is_its_window(p: &Ingest, windows: &[(u64, u64, BTreeMap<i64, i64>, f64)]) {
    let (_, _, counts, _) = windows
        .iter()
        .find(|(from, until, ..)| *from == p.from && (*until).max(from + 1) == p.until)
        .unwrap_or_else(|| panic!("push {}..{} matches no snapshot window", p.from, p.until));
    for (pid, n) in &p.by_pid {
        assert_eq!(
            counts.get(pid),
            Some(n),
            "pid {pid} in window {}..{}",
            p.from,
            p.until
        );
    }
}

fn metric(page: &str, line_start: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn pushes_conform_to_the_ingest_api_and_survive_a_store_outage() {
    // Alone: it holds the spinner's samples to the rate (180 a second for two threads), which
    // CPU-bound tests beside it on two cores take away (a fresh clone's run: 1,810 in 14 s,
    // pyfleet far under its CPU budget).
    let _machine = alone();
    let any = any_interpreter();
    let token = unique_token("pyfleetpush");
    let mut checkout = Proc::spawn_with(
        "spinner [checkout]",
        &any.path,
        &[
            target_script("gil_busy.py").display().to_string(),
            ".".to_string(),
            format!("{token}-checkout"),
        ],
        |c| {
            c.env("OTEL_SERVICE_NAME", "checkout");
        },
    );
    let mut plain = Proc::python(
        &any.label,
        &any.path,
        "sleeper.py",
        &["ready", &format!("{token}-plain")],
    );
    plain.wait_for_file("ready", READY_TIMEOUT);
    checkout.wait_for_file("threads.json", READY_TIMEOUT);
    assert!(checkout.exited().is_none(), "{}", checkout.stderr());

    let dir = tempdir("pyfleet-push-");
    let auth = dir.path().join("auth");
    fs::write(&auth, format!("{CREDENTIALS}\n")).unwrap();
    let store_port = free_port();
    let config = dir.path().join("pyfleet.toml");
    fs::write(
        &config,
        format!(
            "[pyroscope]\nurl = \"http://127.0.0.1:{store_port}\"\nbasic-auth-file = \"{}\"\n\
             tenant = \"{TENANT}\"\nqueue = 1\n",
            auth.display()
        ),
    )
    .unwrap();
    let log: Log = Arc::default();
    let mut server = Some(Server::start(store_port, log.clone()));
    let out = dir.path().join("snapshots");
    let metrics_port = free_port();
    let started = Instant::now();
    let daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--config",
            &config.display().to_string(),
            "--match",
            &token,
            "--mode",
            "wall",
            // Both of the spinner's threads, the one waiting on an Event too.
            "--idle",
            "--snapshot-interval",
            "2",
            "--push-interval",
            "2",
            "--snapshot-format",
            "folded",
            "--duration",
            "16",
            "--out",
            &out.display().to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
        ]),
        Duration::from_secs(60),
    );
    // The store goes down from about 5 s to about 11 s (three windows: one being retried,
    // one held by the queue of one, one dropped), then comes back on the same port.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    drop(server.take());
    std::thread::sleep(Duration::from_secs(11).saturating_sub(started.elapsed()));
    let page_down = http_get(metrics_port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    server = Some(Server::start(store_port, log.clone()));
    std::thread::sleep(Duration::from_secs(15).saturating_sub(started.elapsed()));
    let page = http_get(metrics_port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr.contains("pushing to pyroscope"),
        "{}",
        run.stderr
    );
    drop(server.take());

    let received = std::mem::take(&mut *log.lock().unwrap());
    let (ok, bad): (Vec<_>, Vec<_>) = received
        .into_iter()
        .map(|(verdict, _)| verdict)
        .partition(Result::is_ok);
    assert!(bad.is_empty(), "requests against the API: {bad:?}");
    let pushes: Vec<Ingest> = ok.into_iter().map(Result::unwrap).collect();
    let windows = snapshot_windows(&out);
    assert!(windows.len() >= 7, "{} snapshots", windows.len());

    // Each push is one snapshot window of one label set: its counts are the folded files'.
    let (checkout_pid, plain_pid) = (i64::from(checkout.pid()), i64::from(plain.pid()));
    for p in &pushes {
        assert_push_is_its_window(p, &windows);
        if p.by_pid.contains_key(&checkout_pid) {
            assert_eq!(p.application, "checkout", "{p:?}");
            assert!(
                !p.by_pid.contains_key(&plain_pid),
                "one request per label set: {p:?}"
            );
        } else {
            assert_eq!(p.application, "sleeper", "{p:?}");
        }
        assert!(
            p.labels.is_empty() || !p.labels.contains_key("service"),
            "{p:?}"
        );
    }
    // Every window with samples was pushed, but those the outage dropped.
    let pushed_windows: std::collections::BTreeSet<u64> = pushes.iter().map(|p| p.from).collect();
    let missing: Vec<u64> = windows
        .iter()
        .filter(|(_, _, counts, _)| counts.values().any(|&n| n > 0))
        .map(|(from, ..)| *from)
        .filter(|from| !pushed_windows.contains(from))
        .collect();
    let dropped = metric(&page, "pyfleet_push_windows_dropped_total");
    let failed = metric(&page_down, "pyfleet_push_requests_total{result=\"failed\"}");
    let sent = metric(&page, "pyfleet_push_requests_total{result=\"sent\"}");
    // What happened, for the log of a failing run.
    eprintln!(
        "push: {} requests received, {} snapshot windows, {} not pushed, dropped {dropped}, \
         failed {failed}, sent {sent}",
        pushes.len(),
        windows.len(),
        missing.len()
    );
    assert!(
        failed >= 1.0,
        "no failed request while the store was down:\n{}",
        truncate(&page_down, 3000)
    );
    assert!(
        dropped >= 1.0,
        "the queue of one dropped nothing over three windows down"
    );
    assert!(
        missing.len() as f64 <= dropped,
        "{} windows never arrived, {dropped} counted dropped",
        missing.len()
    );
    assert!(
        missing.len() < windows.len() / 2,
        "the windows retried after the outage did not arrive: {missing:?}"
    );
    assert!(
        sent >= 1.0 && (pushes.len() as f64) >= sent,
        "sent {sent}, received {}",
        pushes.len()
    );
    assert!(metric(&page, "pyfleet_push_bytes_total") > 0.0);

    // Sampling kept its rate: both threads of the spinner's process were sampled about 100
    // times a second each in every window, outage or not (180 a second allows for the
    // window edges).
    let (samples, seconds) =
        windows
            .iter()
            .skip(1)
            .fold((0i64, 0f64), |(n, s), (_, _, counts, secs)| {
                (
                    n + counts.get(&checkout_pid).copied().unwrap_or(0),
                    s + secs,
                )
            });
    assert!(
        samples as f64 >= 180.0 * seconds,
        "{samples} samples of the spinner in {seconds:.1} s"
    );
}

/// pyfleet's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Over TLS: conforming requests whose counts are the snapshots' (as over plain HTTP), then
/// answers of 10 MB and answers that never end, each read to a few KiB and dropped within
/// the pusher's bounds while it pushes on.
#[test]
fn pushes_over_tls_conform_and_bad_answers_cost_a_bound() {
    let _machine = shared();
    let dir = tempdir("pyfleet-push-tls-");
    let Some(ca) = TestCa::make(dir.path()) else {
        return;
    };
    let token = unique_token("pyfleetpushtls");
    let target = idle_sleeper(&token);
    let server_config = pyfleet::tls::server_config(&pyfleet::tls::ServerFiles {
        cert: ca.server_cert.clone(),
        key: ca.server_key.clone(),
        client_ca: None,
    })
    .unwrap();
    let auth = dir.path().join("auth");
    fs::write(&auth, format!("{CREDENTIALS}\n")).unwrap();
    let port = free_port();
    let config = dir.path().join("pyfleet.toml");
    fs::write(
        &config,
        format!(
            "[pyroscope]\nurl = \"https://127.0.0.1:{port}\"\nca-file = \"{}\"\n\
             basic-auth-file = \"{}\"\ntenant = \"{TENANT}\"\n",
            ca.ca.display(),
            auth.display()
        ),
    )
    .unwrap();
    let phases = [
        (Answer::Conform, Duration::from_secs(5)),
        (Answer::Huge, Duration::from_secs(5)),
        (Answer::Endless, Duration::from_secs(7)),
    ];
    let logs: Vec<Log> = phases.iter().map(|_| Log::default()).collect();
    let mut server = Some(Server::serve(
        port,
        Some(server_config.clone()),
        phases[0].0,
        logs[0].clone(),
    ));
    let out = dir.path().join("snapshots");
    let metrics_port = free_port();
    let daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--config",
            &config.display().to_string(),
            "--match",
            &token,
            "--mode",
            "wall",
            "--capture",
            "reads",
            "--snapshot-interval",
            "1",
            "--push-interval",
            "1",
            "--snapshot-format",
            "folded",
            "--duration",
            "20",
            "--out",
            &out.display().to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
        ]),
        Duration::from_secs(60),
    );
    let mut peak_before_bad_answers = 0;
    for (i, (answer, length)) in phases.iter().enumerate() {
        if i > 0 {
            drop(server.take());
            if *answer == Answer::Huge {
                peak_before_bad_answers = peak_rss_kib(daemon.pid());
            }
            server = Some(Server::serve(
                port,
                Some(server_config.clone()),
                *answer,
                logs[i].clone(),
            ));
        }
        std::thread::sleep(*length);
    }
    let peak_after = peak_rss_kib(daemon.pid());
    let page = http_get(metrics_port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    drop(server.take());
    send_signal(daemon.pid(), libc::SIGTERM);
    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr
            .contains(&format!("pushing to pyroscope at 127.0.0.1:{port}")),
        "{}",
        run.stderr
    );

    let windows = snapshot_windows(&out);
    let taken: Vec<Vec<(Result<Ingest, String>, Duration)>> = logs
        .iter()
        .map(|l| std::mem::take(&mut *l.lock().unwrap()))
        .collect();
    for (entries, (answer, _)) in taken.iter().zip(&phases) {
        let lasted: Vec<String> = entries
            .iter()
            .map(|(_, d)| format!("{:.1}", d.as_secs_f64()))
            .collect();
        eprintln!(
            "{answer:?}: {} requests, answers lasted {lasted:?} s",
            entries.len()
        );
    }
    // Conforming: every request is one snapshot window, as over plain HTTP.
    for (entries, (answer, _)) in taken.iter().zip(&phases) {
        assert!(
            entries.len() >= 2,
            "{answer:?}: {} requests over TLS in its seconds",
            entries.len()
        );
        for (verdict, _) in entries {
            match verdict {
                Ok(p) => assert_push_is_its_window(p, &windows),
                Err(why) => panic!("{answer:?}: a request against the API: {why}"),
            }
        }
    }
    // An answer that never ends is dropped after the pusher's answer timeout (2 s), far
    // within its request timeout (20 s): the server sees its writes fail.
    for (_, lasted) in &taken[2] {
        assert!(
            *lasted < Duration::from_secs(6),
            "an endless answer was read for {lasted:?}"
        );
    }
    // 10 MB answers, and endless ones, are not kept: the pusher's peak memory grew by far
    // less than one of them.
    let grew_kib = peak_after.saturating_sub(peak_before_bad_answers);
    eprintln!("peak resident memory: {peak_before_bad_answers} KiB before the bad answers, {peak_after} KiB after");
    assert!(
        peak_before_bad_answers > 0 && grew_kib < 4096,
        "peak resident memory grew by {grew_kib} KiB over the bad answers"
    );
    let sent = metric(&page, "pyfleet_push_requests_total{result=\"sent\"}");
    let received: usize = taken.iter().map(Vec::len).sum();
    assert!(
        sent >= 6.0 && sent <= received as f64,
        "sent {sent}, received {received}"
    );
    drop(target);
}
