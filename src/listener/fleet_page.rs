//! The fleet page: `GET /` (one HTML document with its style and script, no remote resource:
//! it works offline), `GET /api/fleet` (what the page's table shows, as JSON) and the form a
//! browser signs in with when the listener wants a token (`/login`, see `access`). The page's
//! flamegraphs and downloads are windows (see `windows`): live ones of 1 to
//! [`MAX_FLAME_SECONDS`], and past ones from the snapshots (`snapshot_files`).
//!
//! `/api/fleet` lists the processes the supervisor tracks (pid, name, role, labels, Python
//! version, state)
//! with their counters as the exporter holds them (samples, failed samples, cache hits and
//! misses, thread samples by state; the page turns them into rates and shares between two
//! polls), so that the page and `/metrics` never disagree. Bounded work per request: one
//! rendering of the exporter and one status call.
//! Target strings (names, labels, frames) reach the page as JSON strings the script sets as
//! text, or inside the SVG, which inferno escapes: never as markup.

use pyfleet_actors::{FleetStatus, ProcessState};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Longest live window the page may ask for.
pub const MAX_FLAME_SECONDS: u64 = 60;

/// The page itself.
pub const PAGE: &str = include_str!("fleet_page.html");

/// The form a browser gives the token in (see `access`).
const LOGIN: &str = include_str!("login.html");

/// The login form with `why` (pyfleet's own words, never a target's) above it.
pub fn login_page(
    status: hyper::StatusCode,
    why: &str,
) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let body = LOGIN.replace("WHY", &why.replace(['<', '>', '&'], " "));
    let mut response = hyper::Response::new(http_body_util::Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

/// One process's row.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct ProcessRow {
    pub pid: i32,
    pub name: String,
    pub role: String,
    pub labels: BTreeMap<String, String>,
    pub python_version: String,
    pub state: &'static str,
    /// Counters since its sampler started (the exporter's).
    pub samples: u64,
    pub errors: u64,
    pub frame_cache_hits: u64,
    pub frame_cache_misses: u64,
    pub code_cache_hits: u64,
    pub code_cache_misses: u64,
    /// `pyfleet_thread_samples_total` by state.
    pub thread_states: BTreeMap<String, u64>,
}

/// `/api/fleet`'s answer.
#[derive(Debug, Serialize)]
pub struct FleetView {
    pub mode: &'static str,
    /// The rate samples are taken at now: the kernel capture's, else the sampling threads'
    /// (which the CPU budget may have lowered).
    pub rate_hz: f64,
    /// How stacks are taken (`pyfleet_capture_info`'s `stacks`: kernel, reads, paused).
    pub stacks: String,
    pub processes: Vec<ProcessRow>,
}

fn state_name(s: ProcessState) -> &'static str {
    match s {
        ProcessState::Starting => "starting",
        ProcessState::Sampling => "sampling",
        ProcessState::RestartPending => "restarting",
        ProcessState::GivenUp => "given up",
        ProcessState::Exited => "exited",
    }
}

/// The per-process counters of the exporter's rendering `metrics` that the table shows, by
/// pid: for each series of one of [`TABLE_COUNTERS`] with a `pid` label, (metric name, its
/// `state` label or "") and the value. Other series (most of a large fleet's rendering: its
/// histograms) are passed over by name.
pub fn counters_by_pid(metrics: &str) -> HashMap<i32, HashMap<(String, String), u64>> {
    let mut out: HashMap<i32, HashMap<(String, String), u64>> = HashMap::new();
    for line in metrics.lines() {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        if !TABLE_COUNTERS.contains(&name) {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(pid) = label(labels, "pid").and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let state = label(labels, "state").unwrap_or_default();
        *out.entry(pid)
            .or_default()
            .entry((name.to_string(), state.to_string()))
            .or_default() += value.max(0.0) as u64;
    }
    out
}

/// The counters the table shows.
const TABLE_COUNTERS: [&str; 8] = {
    use pyfleet_actors::metric_names as m;
    [
        m::SAMPLES,
        m::SAMPLE_ERRORS,
        m::FRAME_CACHE_HITS,
        m::FRAME_CACHE_PARTIAL_HITS,
        m::FRAME_CACHE_MISSES,
        m::CODE_CACHE_HITS,
        m::CODE_CACHE_MISSES,
        m::THREAD_SAMPLES,
    ]
};

/// The value of label `key` in a series' labels (`a="x",b="y"`), for values without quotes
/// or backslashes (pids and states).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some(at) = rest.find(&format!("{key}=\"")) {
        let boundary = at == 0 || rest.as_bytes()[at - 1] == b',';
        let value = &rest[at + key.len() + 2..];
        if boundary {
            return value.split('"').next();
        }
        rest = value;
    }
    None
}

/// `/api/fleet` from the supervisor's status and the exporter's rendering.
pub fn fleet_view(status: &FleetStatus, metrics: &str, mode: &'static str) -> FleetView {
    use pyfleet_actors::metric_names as m;
    let counters = counters_by_pid(metrics);
    let empty = HashMap::new();
    let processes = status
        .processes
        .iter()
        .map(|p| {
            let c = counters.get(&p.pid).unwrap_or(&empty);
            let get = |name: &str| {
                c.get(&(name.to_string(), String::new()))
                    .copied()
                    .unwrap_or(0)
            };
            let errors = c
                .iter()
                .filter(|((n, _), _)| n == m::SAMPLE_ERRORS)
                .map(|(_, v)| v)
                .sum();
            let thread_states = c
                .iter()
                .filter(|((n, s), _)| n == m::THREAD_SAMPLES && !s.is_empty())
                .map(|((_, s), v)| (s.clone(), *v))
                .collect();
            ProcessRow {
                pid: p.pid,
                name: p.name.clone(),
                role: p.role.as_str().to_string(),
                python_version: p.python_version.clone(),
                labels: p
                    .labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                state: state_name(p.state),
                samples: get(m::SAMPLES),
                errors,
                frame_cache_hits: get(m::FRAME_CACHE_HITS) + get(m::FRAME_CACHE_PARTIAL_HITS),
                frame_cache_misses: get(m::FRAME_CACHE_MISSES),
                code_cache_hits: get(m::CODE_CACHE_HITS),
                code_cache_misses: get(m::CODE_CACHE_MISSES),
                thread_states,
            }
        })
        .collect();
    let stacks = metrics
        .lines()
        .filter(|l| l.starts_with("pyfleet_capture_info{"))
        .find_map(|l| label(l.split_once('{')?.1, "stacks"))
        .unwrap_or_default()
        .to_string();
    // With the kernel capture, samples are taken at its rate, not the sampling threads'.
    let capture_rate = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pyfleet_capture_rate_hz "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|hz| stacks == "kernel" && *hz > 0.0);
    FleetView {
        mode,
        rate_hz: capture_rate.unwrap_or(status.rate_hz),
        stacks,
        processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::ProcessStatus;

    #[test]
    fn the_table_takes_each_processs_counters_from_the_exporter() {
        let metrics = "\
# TYPE pyfleet_samples_total counter
pyfleet_samples_total{process=\"web\",role=\"worker\",pid=\"42\",service=\"api\"} 120
pyfleet_sample_errors_total{process=\"web\",role=\"worker\",pid=\"42\",kind=\"read\"} 2
pyfleet_sample_errors_total{process=\"web\",role=\"worker\",pid=\"42\",kind=\"cycle\"} 1
pyfleet_frame_cache_hits_total{process=\"web\",role=\"worker\",pid=\"42\"} 90
pyfleet_frame_cache_partial_hits_total{process=\"web\",role=\"worker\",pid=\"42\"} 5
pyfleet_thread_samples_total{process=\"x\\\"pid=\\\"7\",role=\"worker\",pid=\"42\",state=\"holds_gil\"} 60
pyfleet_thread_samples_total{process=\"web\",role=\"worker\",pid=\"42\",state=\"waits_gil\"} 40
pyfleet_samples_total{process=\"job\",role=\"single\",pid=\"7\"} 3
pyfleet_processes 2
pyfleet_capture_info{stacks=\"kernel\",why=\"\"} 1
";
        let status = FleetStatus {
            rate_hz: 100.0,
            processes: vec![ProcessStatus {
                pid: 42,
                name: "web".into(),
                role: pyfleet_policies::Role::Worker,
                labels: Default::default(),
                python_version: "3.13.1".into(),
                state: ProcessState::Sampling,
                failures_in_window: 0,
            }],
            exits: 0,
            restarts: 0,
        };
        let view = fleet_view(&status, metrics, "cpu");
        assert_eq!(view.stacks, "kernel");
        assert_eq!(view.processes.len(), 1);
        let p = &view.processes[0];
        assert_eq!((p.samples, p.errors, p.frame_cache_hits), (120, 3, 95));
        assert_eq!(p.thread_states["holds_gil"], 60);
        assert_eq!(p.thread_states["waits_gil"], 40);
        assert_eq!((p.role.as_str(), p.state), ("worker", "sampling"));
    }
}
