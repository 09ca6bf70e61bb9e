//! Pushing profiles to Grafana Pyroscope's HTTP ingest API (`POST /ingest`, pprof bodies).
//!
//! Contract. [`Pusher`] is the fleet's [`WindowPusher`]: each push window (see
//! `pyfleet_actors::PushSchedule`) is queued and [`Pusher::push`] returns at once; sampling
//! never waits for the network. One task sends the queue in order: a window becomes one
//! request per distinct label set of its processes (`service` is the application name, the
//! other labels series labels in `name=service{k=v,...}`), with `from`/`until` (the window's
//! edges, whole seconds), `format=pprof`, `sampleRate`, `spyName=pyfleet`, `units=samples`,
//! `aggregationType=sum`, and the pprof as the multipart field `profile`. A request that
//! fails (no connection, a timeout, a 5xx or 429) is retried with backoff (1 s doubling to
//! [`MAX_BACKOFF`]) while later windows queue behind it; a 4xx other than 429 drops the
//! request (the store will never take it). The queue holds at most `queue` windows: when it
//! is full the oldest is dropped, so a store that is down for long costs the windows that
//! did not fit, and one that comes back gets the rest. Every outcome is counted
//! (`pyfleet_push_*`).
//!
//! HTTP or HTTPS (rustls: the server's certificate checked against a CA file or the system's
//! CAs, and its name against the URL's host). Whatever the store answers costs a bound: the
//! whole exchange at most [`REQUEST_TIMEOUT`], and of an answer's body at most
//! [`MAX_ANSWER_BYTES`] are read, within [`ANSWER_TIMEOUT`], and discarded (only the status
//! counts).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use pyfleet_actors::metric_names as m;
use pyfleet_actors::{ProcessProfile, Snapshot, WindowPusher};
use pyfleet_policies::Mode;
use tokio::sync::Notify;

use crate::output::format::RenderContext;

/// Longest wait between two tries of one request.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A request's whole time (connect, handshake, send, answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Most bytes of an answer's body read (then the connection is dropped).
pub const MAX_ANSWER_BYTES: usize = 4096;
/// Longest wait for an answer's body once its status came.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Windows held by default while the store does not take them.
pub const DEFAULT_QUEUE: usize = 64;
const BOUNDARY: &str = "pyfleet-profile-boundary-5f1d0c";

/// Where and how to push.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` to connect to.
    pub authority: String,
    /// The host alone (no brackets around an IPv6 address): the name a TLS server's
    /// certificate must carry.
    pub host: String,
    /// With TLS: the client configuration (`https://` URLs).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The path before `/ingest` (empty, or `/prefix`).
    pub prefix: String,
    /// The `Authorization` header's value, if any.
    pub authorization: Option<String>,
    /// `X-Scope-OrgID`, if any.
    pub tenant: Option<String>,
    https: bool,
}

impl Target {
    /// Parses `http[s]://host[:port][/prefix]`; a one-line error otherwise. An `https` target
    /// gets its TLS configuration from [`Target::with_tls`].
    pub fn parse(url: &str) -> Result<Target, String> {
        let bad = || format!("pyroscope url {url}: not http[s]://host[:port][/path]");
        let (rest, default_port) = match url.split_once("://") {
            Some(("http", rest)) => (rest, 80),
            Some(("https", rest)) => (rest, 443),
            _ => return Err(bad()),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let host_ok = !authority.is_empty()
            && authority
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        if !host_ok || path.contains(['?', '#', ' ']) {
            return Err(bad());
        }
        let (host, authority) = match authority.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() && !host.ends_with(':') => {
                (host, authority.to_string())
            }
            _ => (authority, format!("{authority}:{default_port}")),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Target {
            authority,
            host: host.to_string(),
            tls: None,
            https: default_port == 443,
            prefix: path.trim_end_matches('/').to_string(),
            authorization: None,
            tenant: None,
        })
    }

    /// Whether the URL was `https://`.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// Whether the host is this machine's (a name or address of loopback): credentials sent
    /// there in clear cross no network.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The TLS client configuration of an `https` target.
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Basic authentication from a file holding `user:password` (one line).
    pub fn with_basic_auth(mut self, credentials: &str) -> Self {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(credentials.trim());
        self.authorization = Some(format!("Basic {encoded}"));
        self
    }

    /// A bearer token (from a file).
    pub fn with_token(mut self, token: &str) -> Self {
        self.authorization = Some(format!("Bearer {}", token.trim()));
        self
    }

    pub fn with_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }
}

/// The queue the fleet pushes into and the sending task reads.
struct Queue {
    windows: Mutex<VecDeque<Snapshot>>,
    capacity: usize,
    ready: Notify,
    /// The sending task holds a window taken off the queue.
    sending: AtomicBool,
}

/// The fleet's [`WindowPusher`]; see the module documentation.
#[derive(Clone)]
pub struct Pusher {
    queue: Arc<Queue>,
}

impl WindowPusher for Pusher {
    fn push(&self, window: Snapshot) {
        let mut windows = self
            .queue
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if windows.len() >= self.queue.capacity {
            windows.pop_front();
            metrics::counter!(m::PUSH_DROPPED).increment(1);
        }
        windows.push_back(window);
        metrics::gauge!(m::PUSH_QUEUED).set(windows.len() as f64);
        drop(windows);
        self.queue.ready.notify_one();
    }
}

impl Pusher {
    /// Starts the sending task on the current tokio runtime.
    pub fn start(target: Target, queue: usize, mode: Mode, rate_hz: f64) -> Pusher {
        let queue = Arc::new(Queue {
            windows: Mutex::new(VecDeque::new()),
            capacity: queue.max(1),
            ready: Notify::new(),
            sending: AtomicBool::new(false),
        });
        let pusher = Pusher {
            queue: queue.clone(),
        };
        tokio::spawn(send_forever(queue, target, mode, rate_hz));
        pusher
    }

    /// Waits (at most `limit`) until every queued window was sent or dropped.
    pub async fn drain(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            let empty = self
                .queue
                .windows
                .lock()
                .map(|w| w.is_empty())
                .unwrap_or(true);
            if empty && !self.queue.sending.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn send_forever(queue: Arc<Queue>, target: Target, mode: Mode, rate_hz: f64) {
    loop {
        let next = {
            let mut windows = queue
                .windows
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let w = windows.pop_front();
            queue.sending.store(w.is_some(), Ordering::Relaxed);
            metrics::gauge!(m::PUSH_QUEUED).set(windows.len() as f64);
            w
        };
        let Some(window) = next else {
            queue.ready.notified().await;
            continue;
        };
        for request in requests(&window, mode, rate_hz) {
            send_with_retries(&target, &request).await;
        }
        queue.sending.store(false, Ordering::Relaxed);
    }
}

/// One request's parts: the query (without the path) and the pprof body.
#[derive(Debug)]
pub struct IngestRequest {
    pub query: String,
    pub profile: Vec<u8>,
}

/// A window's requests: one per distinct label set of its processes.
pub fn requests(window: &Snapshot, mode: Mode, rate_hz: f64) -> Vec<IngestRequest> {
    let mut groups: Vec<(String, Vec<&ProcessProfile>)> = Vec::new();
    for p in window.processes.iter().filter(|p| p.total() > 0) {
        let name = application_name(p);
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, ps)) => ps.push(p),
            None => groups.push((name, vec![p])),
        }
    }
    let secs = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let from = secs(window.started_at);
    let until = secs(window.taken_at).max(from + 1);
    let ctx = RenderContext {
        title: "pyfleet".to_string(),
        rate_hz: Some(rate_hz),
        asked_hz: None,
        mode,
        duration: window.taken_at.duration_since(window.started_at).ok(),
        ..Default::default()
    };
    groups
        .into_iter()
        .filter_map(|(name, processes)| {
            let part = Snapshot {
                started_at: window.started_at,
                taken_at: window.taken_at,
                processes: processes.into_iter().cloned().collect(),
            };
            let profile = crate::output::pprof::render(&part, &ctx).ok()?;
            // The rate its samples were taken at (the budget may have lowered it).
            let sample_rate = part.rate_hz().unwrap_or(rate_hz).round().max(1.0) as u64;
            Some(IngestRequest {
                query: format!(
                    "name={}&from={from}&until={until}&format=pprof&sampleRate={}&spyName=pyfleet\
                     &units=samples&aggregationType=sum",
                    percent_encode(&name),
                    sample_rate
                ),
                profile,
            })
        })
        .collect()
}

/// `service{key=value,...}`: the service label as the application, the others as series
/// labels (values are sanitised where found: `[A-Za-z0-9._:/-]`).
fn application_name(p: &ProcessProfile) -> String {
    let service = p.labels.get("service").unwrap_or(&p.name);
    let others: Vec<String> = p
        .labels
        .iter()
        .filter(|(k, _)| *k != "service")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{service}{{{}}}", others.join(","))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn send_with_retries(target: &Target, request: &IngestRequest) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match send(target, request).await {
            Ok(()) => {
                metrics::counter!(m::PUSH_REQUESTS, "result" => "sent").increment(1);
                metrics::counter!(m::PUSH_BYTES).increment(request.profile.len() as u64);
                return;
            }
            Err(Failure::Refused(status)) => {
                metrics::counter!(m::PUSH_REQUESTS, "result" => "failed").increment(1);
                metrics::counter!(m::PUSH_DROPPED).increment(1);
                tracing::warn!("pyroscope refused a profile ({status}): dropped");
                return;
            }
            Err(Failure::Retry(why)) => {
                metrics::counter!(m::PUSH_REQUESTS, "result" => "failed").increment(1);
                tracing::debug!("push failed ({why}); again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

enum Failure {
    /// The store answered that it will never take this request.
    Refused(u16),
    Retry(String),
}

async fn send(target: &Target, request: &IngestRequest) -> Result<(), Failure> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(target, request))
        .await
        .map_err(|_| Failure::Retry("timed out".to_string()))?
}

async fn exchange(target: &Target, request: &IngestRequest) -> Result<(), Failure> {
    let retry = |e: &dyn std::fmt::Display| Failure::Retry(e.to_string());
    let stream = tokio::net::TcpStream::connect(&target.authority)
        .await
        .map_err(|e| retry(&e))?;
    match (target.https, &target.tls) {
        (false, _) => exchange_on(stream, target, request).await,
        (true, Some(config)) => {
            let stream = crate::tls::connect(config, &target.host, stream)
                .await
                .map_err(|e| retry(&e))?;
            exchange_on(stream, target, request).await
        }
        // Config validation gives every https target its TLS configuration.
        (true, None) => Err(Failure::Retry("no TLS configuration".to_string())),
    }
}

/// One request on an open connection (plain or TLS), its answer's status.
async fn exchange_on<S>(stream: S, target: &Target, request: &IngestRequest) -> Result<(), Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let retry = |e: &dyn std::fmt::Display| Failure::Retry(e.to_string());
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| retry(&e))?;
    let connection = tokio::spawn(connection);
    let mut body = Vec::with_capacity(request.profile.len() + 256);
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"profile\"; \
             filename=\"profile.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(&request.profile);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let mut builder = Request::post(format!("{}/ingest?{}", target.prefix, request.query))
        .header(hyper::header::HOST, &target.authority)
        .header(
            hyper::header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .header(
            hyper::header::USER_AGENT,
            concat!("pyfleet/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(auth) = &target.authorization {
        builder = builder.header(hyper::header::AUTHORIZATION, auth);
    }
    if let Some(tenant) = &target.tenant {
        builder = builder.header("X-Scope-OrgID", tenant);
    }
    let req = builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| retry(&e))?;
    let response = sender.send_request(req).await.map_err(|e| retry(&e))?;
    let status = response.status();
    discard_answer(response.into_body()).await;
    connection.abort();
    match status.as_u16() {
        200..=299 => Ok(()),
        429 => Err(Failure::Retry("429 too many requests".to_string())),
        s @ 400..=499 => Err(Failure::Refused(s)),
        s => Err(Failure::Retry(format!("status {s}"))),
    }
}

/// Reads at most [`MAX_ANSWER_BYTES`] of an answer's body, for at most [`ANSWER_TIMEOUT`],
/// and drops them: a store that answers with megabytes, or never ends its answer, costs no
/// more.
async fn discard_answer(mut body: hyper::body::Incoming) {
    let read_some = async {
        let mut read = 0;
        while read < MAX_ANSWER_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, read_some).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https_with_a_port() {
        let t = Target::parse("http://pyroscope:4040").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.prefix.as_str(), t.host.as_str()),
            ("pyroscope:4040", "", "pyroscope")
        );
        assert!(!t.is_https() && !t.is_loopback());
        let t = Target::parse("http://10.0.0.1/pyro/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.prefix.as_str()),
            ("10.0.0.1:80", "/pyro")
        );
        let t = Target::parse("https://profiles.example.com").unwrap();
        assert_eq!(t.authority, "profiles.example.com:443");
        assert!(t.is_https());
        let t = Target::parse("https://[::1]:4040").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.host.as_str()),
            ("[::1]:4040", "::1")
        );
        assert!(t.is_loopback());
        let t = Target::parse("http://[::1]").unwrap();
        assert_eq!(t.authority, "[::1]:80");
        for local in ["http://localhost:4040", "http://127.0.0.2:4040"] {
            assert!(Target::parse(local).unwrap().is_loopback(), "{local}");
        }
        for bad in [
            "ftp://x",
            "pyroscope:4040",
            "http://",
            "http://a b",
            "http://x/?q",
        ] {
            let e = Target::parse(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
        let t = Target::parse("http://x:1")
            .unwrap()
            .with_basic_auth("user:pass\n");
        assert_eq!(t.authorization.as_deref(), Some("Basic dXNlcjpwYXNz"));
    }

    #[test]
    fn one_request_per_label_set_with_the_window_edges() {
        use pyfleet_actors::{FrameInfo, Labels, ThreadStatus};
        let profile = |pid: i32, service: &str, pod: &str| {
            let mut labels = Labels::default();
            labels.set("service", service.into());
            labels.set("pod", pod.into());
            ProcessProfile {
                pid,
                name: "app".into(),
                role: pyfleet_policies::Role::Single,
                labels,
                samples: vec![(
                    ThreadStatus::default(),
                    vec![FrameInfo::new("f", "a.py", Some(1))].into(),
                    5,
                )],
                sampled: std::time::Duration::ZERO,
            }
        };
        let window = Snapshot {
            started_at: UNIX_EPOCH + Duration::from_millis(100_500),
            taken_at: UNIX_EPOCH + Duration::from_millis(115_700),
            processes: vec![
                profile(1, "api", "a-1"),
                profile(2, "api", "a-1"),
                profile(3, "api", "a-2"),
            ],
        };
        let reqs = requests(&window, Mode::Cpu, 100.0);
        assert_eq!(reqs.len(), 2);
        assert!(
            reqs[0]
                .query
                .starts_with("name=api%7Bpod%3Da-1%7D&from=100&until=115&format=pprof"),
            "{}",
            reqs[0].query
        );
        let decoded = crate::output::pprof::decode(&reqs[0].profile).unwrap();
        let total: i64 = decoded.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 10);
    }
}
