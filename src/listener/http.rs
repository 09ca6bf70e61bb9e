//! What every route of the listener uses: answers of plain text or of a content type, and
//! the query of a request for a window of samples (`seconds`, `pid`, `service`), checked.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use pyfleet_actors::PullFilter;

/// A query's `key=value` pairs.
fn pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// A value as an error shows it: bounded, defanged.
fn shown(value: &str) -> String {
    crate::output::for_terminal(value)
        .chars()
        .take(64)
        .collect()
}

/// The seconds (1 to `max`, else `default`) and the filter (`pid`, `service`) of a request
/// for a window of samples: a profile's or a flamegraph's.
pub fn window_request(query: &str, default: u64, max: u64) -> Result<(u64, PullFilter), String> {
    let mut seconds = default;
    for (key, value) in pairs(query) {
        if key == "seconds" {
            seconds = value
                .parse::<u64>()
                .ok()
                .filter(|s| (1..=max).contains(s))
                .ok_or_else(|| {
                    format!(
                        "seconds must be a whole number from 1 to {max} (got '{}')",
                        shown(value)
                    )
                })?;
        }
    }
    Ok((seconds, filter_request(query)?))
}

/// The filter (`pid`, `service`) of a request for part of a window already taken (a past
/// one's); other parameters are ignored.
pub fn filter_request(query: &str) -> Result<PullFilter, String> {
    let mut filter = PullFilter::default();
    for (key, value) in pairs(query) {
        match key {
            "pid" => {
                filter.pid = Some(
                    value
                        .parse::<i32>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| {
                            format!("pid must be a process id (got '{}')", shown(value))
                        })?,
                );
            }
            "service" => {
                let service = crate::discovery::labels::sanitise(value.as_bytes());
                if service.is_empty() || service != value {
                    return Err(format!(
                        "service must be a service label as `pyfleet list` shows it (got '{}')",
                        shown(value)
                    ));
                }
                filter.service = Some(service);
            }
            _ => {}
        }
    }
    Ok(filter)
}

pub fn with_type(
    status: StatusCode,
    body: impl Into<Bytes>,
    kind: &'static str,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

pub fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let kind = match status {
        StatusCode::OK => "text/plain; version=0.0.4",
        _ => "text/plain",
    };
    with_type(status, body.into_bytes(), kind)
}
