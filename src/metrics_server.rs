//! The daemon's HTTP listener: `GET /metrics` answers with the Prometheus exporter's
//! rendering and `pyfleet_cpu_seconds_total` (read at the scrape, in fractional seconds: the
//! metrics facade's counters are integers); anything else is a 404 (405 for another method on
//! `/metrics`).
//!
//! Bounded whatever its clients do: at most [`MAX_CONNECTIONS`] at once (a connection past
//! that is closed at once), a request's head must arrive within [`HEADER_TIMEOUT`], and a
//! connection lives at most [`CONNECTION_TIMEOUT`]; one request per connection.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// Time a client has to send its request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection is kept, whatever it does.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `listener` until the runtime ends.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle) {
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
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = respond(&handle, req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            drop(slot);
        });
    }
}

/// The exporter's rendering, pyfleet's own CPU time and the time of each kind of sample
/// (fractional seconds, which the exporter's integer counters cannot carry).
fn render(handle: &PrometheusHandle) -> String {
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

fn respond(handle: &PrometheusHandle, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (status, body) = match (method, path) {
        (&Method::GET, "/metrics") => (StatusCode::OK, render(handle)),
        (_, "/metrics") => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string()),
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /metrics\n".to_string(),
        ),
    };
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
