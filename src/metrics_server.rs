//! The daemon's HTTP listener: `GET /metrics` answers with the Prometheus exporter's
//! rendering and `pyfleet_cpu_seconds_total` (read at the scrape, in fractional seconds: the
//! metrics facade's counters are integers); `GET /debug/pprof/profile?seconds=N[&pid=P]
//! [&service=S]` answers after N seconds (1 to [`MAX_PROFILE_SECONDS`]) with a gzipped pprof of
//! what the running daemon sampled meanwhile (as Go's `net/http/pprof` does, for `go tool pprof`
//! and Parca's scraper; no sampler of its own: see `pyfleet_actors::Profiler`), a bad parameter
//! with a 400 and one line; anything else is a 404 (405 for another method).
//!
//! Bounded whatever its clients do: at most [`MAX_CONNECTIONS`] at once (a connection past
//! that is closed at once), a request's head must arrive within [`HEADER_TIMEOUT`], and a
//! connection lives at most [`CONNECTION_TIMEOUT`] (and the profile's seconds, for a profile
//! request); one request per connection; at most `pyfleet_actors::MAX_TAPS` profiles at once
//! (503 beyond).

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use pyfleet_actors::{Profiler, PullFilter};
use pyfleet_policies::Mode;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// Time a client has to send its request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection is kept, whatever it does (beyond a profile's own seconds).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest profile a request may ask for.
pub const MAX_PROFILE_SECONDS: u64 = 300;

/// What `/debug/pprof/profile` needs: the fleet's profiler (set once the fleet runs) and how
/// it samples.
#[derive(Clone)]
pub struct Pull {
    pub profiler: Arc<OnceLock<Profiler>>,
    pub mode: Mode,
    /// The daemon's base rate (pprof's period; the budget may lower the rate).
    pub rate_hz: f64,
}

/// The exporter's handle, and when it last rendered (for a scrape or to tidy up).
#[derive(Clone)]
pub struct Exporter {
    handle: PrometheusHandle,
    since: Instant,
    /// Milliseconds after `since` of the last rendering.
    rendered_ms: Arc<AtomicU64>,
}

impl Exporter {
    pub fn new(handle: PrometheusHandle) -> Exporter {
        Exporter {
            handle,
            since: Instant::now(),
            rendered_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn render(&self) -> String {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.rendered_ms.store(ms, Ordering::Relaxed);
        self.handle.render()
    }

    fn since_rendered(&self) -> Duration {
        let at = Duration::from_millis(self.rendered_ms.load(Ordering::Relaxed));
        self.since.elapsed().saturating_sub(at)
    }

    /// Renders whenever nothing did for `every`, forever: the exporter drops idle series (an
    /// exited process's) only while it renders, so a daemon nobody scrapes would keep them
    /// all, and one that is scraped needs no rendering of its own.
    pub async fn keep_tidy(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if self.since_rendered() >= every {
                drop(self.render());
            }
        }
    }
}

/// Serves `listener` until the runtime ends.
pub async fn serve(listener: TcpListener, handle: Exporter, pull: Pull) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: wait, do not spin.
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let handle = handle.clone();
        let pull = pull.clone();
        tokio::spawn(async move {
            // Seconds a profile request adds to the connection's time.
            let extra = Arc::new(AtomicU64::new(0));
            let granted = extra.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (handle, pull, granted) = (handle.clone(), pull.clone(), granted.clone());
                async move {
                    let response = respond(&handle, &pull, &granted, &req).await;
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let started = tokio::time::Instant::now();
            loop {
                let seconds = extra.load(Ordering::Relaxed);
                let until = started + CONNECTION_TIMEOUT + Duration::from_secs(seconds);
                match tokio::time::timeout_at(until, connection.as_mut()).await {
                    Ok(_) => break,
                    // A profile request lengthened the connection meanwhile: wait on.
                    Err(_) if extra.load(Ordering::Relaxed) != seconds => continue,
                    Err(_) => break,
                }
            }
            drop(slot);
        });
    }
}

/// The exporter's rendering, pyfleet's own CPU time and the time of each kind of sample
/// (fractional seconds, which the exporter's integer counters cannot carry).
fn render(handle: &Exporter) -> String {
    use pyfleet_actors::metric_names::{
        CPU_SECONDS, CPU_SECONDS_HELP, SAMPLE_KIND_SECONDS, SAMPLE_KIND_SECONDS_HELP,
    };
    let mut text = handle.render();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if let Ok(cpu) = pyfleet_actors::own_cpu_time() {
        text.push_str(&format!(
            "# HELP {CPU_SECONDS} {CPU_SECONDS_HELP}\n# TYPE {CPU_SECONDS} counter\n\
             {CPU_SECONDS} {:.6}\n",
            cpu.as_secs_f64()
        ));
    }
    text.push_str(&format!(
        "# HELP {SAMPLE_KIND_SECONDS} {SAMPLE_KIND_SECONDS_HELP}\n\
         # TYPE {SAMPLE_KIND_SECONDS} counter\n"
    ));
    for (kind, seconds) in pyfleet_actors::sample_kind_seconds() {
        text.push_str(&format!(
            "{SAMPLE_KIND_SECONDS}{{kind=\"{kind}\"}} {seconds:.6}\n"
        ));
    }
    text
}

async fn respond(
    handle: &Exporter,
    pull: &Pull,
    granted: &AtomicU64,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (method, path) = (req.method(), req.uri().path());
    match (method, path) {
        (&Method::GET, "/metrics") => text(StatusCode::OK, render(handle)),
        (&Method::GET, "/debug/pprof/profile") => {
            match profile_request(req.uri().query().unwrap_or("")) {
                Ok((seconds, filter)) => {
                    granted.store(seconds, Ordering::Relaxed);
                    profile(pull, seconds, filter).await
                }
                Err(why) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
            }
        }
        (_, "/metrics" | "/debug/pprof/profile") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string())
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /debug/pprof/profile?seconds=30\n".to_string(),
        ),
    }
}

/// The seconds and the filter of a profile request's query (`seconds` 1 to
/// [`MAX_PROFILE_SECONDS`], default 30 as Go's; `pid`; `service`); other parameters are
/// ignored, as Go's handler does.
fn profile_request(query: &str) -> Result<(u64, PullFilter), String> {
    let mut seconds = 30;
    let mut filter = PullFilter::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let shown = || {
            crate::output::for_terminal(value)
                .chars()
                .take(64)
                .collect::<String>()
        };
        match key {
            "seconds" => {
                seconds = value
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_PROFILE_SECONDS).contains(s))
                    .ok_or_else(|| {
                        format!("seconds must be a whole number from 1 to {MAX_PROFILE_SECONDS} (got '{}')", shown())
                    })?;
            }
            "pid" => {
                filter.pid = Some(
                    value
                        .parse::<i32>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("pid must be a process id (got '{}')", shown()))?,
                );
            }
            "service" => {
                let service = crate::discovery::labels::sanitise(value.as_bytes());
                if service.is_empty() || service != value {
                    return Err(format!(
                        "service must be a service label as `pyfleet list` shows it (got '{}')",
                        shown()
                    ));
                }
                filter.service = Some(service);
            }
            _ => {}
        }
    }
    Ok((seconds, filter))
}

/// Takes the profile and answers with it, gzipped pprof.
async fn profile(pull: &Pull, seconds: u64, filter: PullFilter) -> Response<Full<Bytes>> {
    let Some(profiler) = pull.profiler.get() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the fleet is starting\n".into(),
        );
    };
    let snapshot = match profiler.profile(Duration::from_secs(seconds), filter).await {
        Ok(s) => s,
        // Too many at once, or the fleet is stopping.
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    };
    let ctx = crate::output::format::RenderContext {
        title: format!("pyfleet {seconds} s"),
        rate_hz: Some(pull.rate_hz),
        mode: pull.mode,
        duration: Some(Duration::from_secs(seconds)),
    };
    match crate::output::pprof::render(&snapshot, &ctx) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            let headers = response.headers_mut();
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(
                hyper::header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let kind = match status {
        StatusCode::OK => "text/plain; version=0.0.4",
        _ => "text/plain",
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_queries_are_bounded() {
        assert_eq!(profile_request("").unwrap().0, 30);
        let (seconds, filter) = profile_request("seconds=3&pid=42&service=api&debug=1").unwrap();
        assert_eq!(
            (seconds, filter.pid, filter.service.as_deref()),
            (3, Some(42), Some("api"))
        );
        for bad in [
            "seconds=0",
            "seconds=100000",
            "seconds=-1",
            "seconds=1.5",
            "pid=abc",
            "pid=0",
            "service=a%20b",
            "service=",
        ] {
            let e = profile_request(bad).unwrap_err();
            assert!(!e.contains('\n') && e.len() < 200, "{bad}: {e}");
        }
    }
}
