//! What the listeners answer. `GET /metrics`: the Prometheus exporter's rendering and
//! `pyfleet_cpu_seconds_total` (read at the scrape, in fractional seconds: the metrics
//! facade's counters are integers). `GET /debug/pprof/profile?seconds=N[&pid=P][&service=S]`:
//! after N seconds (1 to [`MAX_PROFILE_SECONDS`]), a gzipped pprof of what the running daemon
//! sampled meanwhile (as Go's `net/http/pprof` does, for `go tool pprof` and Parca's scraper; no
//! sampler of its own: see `pyfleet_actors::Profiler`), a bad parameter a 400 and one line; at
//! most `pyfleet_actors::MAX_TAPS` profiles at once (503 beyond). `GET /healthz`: 200 while the
//! daemon answers; `GET /readyz`: 200 once the fleet runs, 503 before. `GET /`, `/api/fleet`,
//! `/flamegraph.svg`, `/api/window`, `/windows/...`, `/api/snapshots`, `/snapshots/...` and
//! `/diff.svg`: the fleet page and its windows (`fleet_page`, `windows`, `snapshot_files`),
//! under the profiles' credential rules.
//! A request the listener's
//! [`Access`] refuses gets 401 and one line; anything else a 404 (405 for another method).

use super::access::{Access, Page};
use super::http::{text, window_request, with_type};
use super::windows::{self, KeptWindows, Window};
use crate::output::format::{Format, RenderContext};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use pyfleet_actors::{Profiler, PullFilter};
use pyfleet_policies::Mode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
    /// How asyncio tasks show in the profiles it renders (`--group-by task`).
    pub tasks: crate::output::views::TaskFrames,
    /// Where the daemon writes its snapshots (`--out`, held open), for the page's past
    /// windows.
    pub snapshots: Option<Arc<crate::output::beneath::Beneath>>,
    /// The page's last live windows, for their downloads.
    pub windows: KeptWindows,
}

impl Pull {
    /// How a live window of `seconds` is sampled.
    fn context(&self, seconds: u64) -> RenderContext {
        RenderContext {
            title: String::new(),
            rate_hz: Some(self.rate_hz),
            asked_hz: None,
            mode: self.mode,
            duration: Some(Duration::from_secs(seconds)),
            tasks: self.tasks,
            icicle: false,
        }
    }
}

/// The exporter's handle, and when it last rendered (for a scrape or to tidy up).
#[derive(Clone)]
pub struct Exporter {
    handle: PrometheusHandle,
    since: Instant,
    /// Milliseconds after `since` of the last rendering.
    rendered_ms: Arc<AtomicU64>,
    /// The fleet page's last rendering and when it was made, shared by its viewers.
    for_page: Arc<std::sync::Mutex<Option<Rendering>>>,
}

/// A rendering of the exporter and when it was made.
type Rendering = (Instant, Arc<String>);

/// Longest a rendering serves the fleet page's polls (they come every 2 s per viewer).
const PAGE_RENDERING_AGE: Duration = Duration::from_millis(1500);

impl Exporter {
    pub fn new(handle: PrometheusHandle) -> Exporter {
        Exporter {
            handle,
            since: Instant::now(),
            rendered_ms: Arc::new(AtomicU64::new(0)),
            for_page: Arc::default(),
        }
    }

    /// A rendering at most [`PAGE_RENDERING_AGE`] old, for the fleet page: however many
    /// viewers poll, the exporter renders for them at most once in that time. Blocking.
    fn for_page(&self) -> Arc<String> {
        let mut last = self.for_page.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((at, text)) if at.elapsed() < PAGE_RENDERING_AGE => text.clone(),
            _ => {
                let text = Arc::new(self.render());
                *last = Some((Instant::now(), text.clone()));
                text
            }
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

/// What one listener serves.
#[derive(Clone)]
pub enum Pages {
    /// The daemon's own listener (`--metrics-addr`): metrics, profiles, health and readiness.
    Site {
        exporter: Exporter,
        pull: Pull,
        access: Access,
    },
    /// The probes' listener (`--health-addr`): health and readiness only. `ready` is the
    /// fleet's profiler, set once the fleet runs.
    Health { ready: Arc<OnceLock<Profiler>> },
}

impl Pages {
    fn ready(&self) -> bool {
        match self {
            Pages::Site { pull, .. } => pull.profiler.get().is_some(),
            Pages::Health { ready } => ready.get().is_some(),
        }
    }
}

/// The answer to `req`, with the headers every response carries (`headers`). A profile
/// request stores its seconds in `granted` (the connection is kept that much longer).
pub async fn respond(
    pages: &Pages,
    granted: &AtomicU64,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let response = answer(pages, granted, req).await;
    let (parts, body) = response.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut response = Response::from_parts(parts, Full::new(bytes.clone()));
    super::headers::secure(&mut response, &bytes);
    response
}

async fn answer(
    pages: &Pages,
    granted: &AtomicU64,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (method, path) = (req.method(), req.uri().path());
    let page = match path {
        "/metrics" => Page::Metrics,
        // The form that takes the token: it shows nothing of the targets.
        "/login" => Page::Open,
        // What takes samples or lists the fleet.
        p if p.starts_with("/debug/pprof/") => Page::Api,
        "/api/fleet" | "/api/window" | "/flamegraph.svg" | "/api/snapshots" => Page::Api,
        // The fleet page names processes and shows their stacks.
        "/" | "/diff.svg" => Page::Stacks,
        p if p.starts_with("/snapshots/") || p.starts_with("/windows/") => Page::Stacks,
        _ => Page::Open,
    };
    // A Host that is not this listener's: a page that pointed a name of its own at it.
    let names = match pages {
        Pages::Site { access, .. } => access.names.as_slice(),
        Pages::Health { .. } => &[],
    };
    let host = req.headers().get(hyper::header::HOST).map(|h| h.as_bytes());
    if !super::access::host_is_allowed(host, names) {
        return text(
            StatusCode::MISDIRECTED_REQUEST,
            "this listener answers to its IP addresses, localhost and the names given with \
             --listen-name only\n"
                .to_string(),
        );
    }
    let site = match pages {
        Pages::Site {
            exporter,
            pull,
            access,
        } => Some((exporter, pull, access)),
        Pages::Health { .. } => None,
    };
    if let Some((_, _, access)) = site {
        if path == "/login" {
            return login(access, req).await;
        }
        if let Err(refused) = access.admit(page, req.headers()) {
            let mut response = match path {
                // A browser at the page: the form that takes the token.
                "/" => {
                    super::fleet_page::login_page(StatusCode::UNAUTHORIZED, refused.to_browser())
                }
                _ => text(StatusCode::UNAUTHORIZED, format!("{refused}\n")),
            };
            response.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"pyfleet\""),
            );
            return response;
        }
    }
    match (method, path, site) {
        (&Method::GET, "/healthz", _) => text(StatusCode::OK, "ok\n".to_string()),
        (&Method::GET, "/readyz", _) => match pages.ready() {
            true => text(StatusCode::OK, "ready\n".to_string()),
            false => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the fleet is starting\n".to_string(),
            ),
        },
        (&Method::GET, "/metrics", Some((exporter, _, _))) => {
            text(StatusCode::OK, render(exporter))
        }
        (&Method::GET, "/debug/pprof/profile", Some((_, pull, _))) => {
            match profile_request(req.uri().query().unwrap_or("")) {
                Ok((seconds, filter)) => {
                    granted.store(seconds, Ordering::Relaxed);
                    profile(pull, seconds, filter).await
                }
                Err(why) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
            }
        }
        (&Method::GET, "/", Some(_)) => with_type(
            StatusCode::OK,
            super::fleet_page::PAGE.as_bytes().to_vec(),
            "text/html; charset=utf-8",
        ),
        (&Method::GET, "/api/fleet", Some((exporter, pull, _))) => fleet(exporter, pull).await,
        (&Method::GET, "/flamegraph.svg" | "/api/window", Some((_, pull, _))) => {
            let query = req.uri().query().unwrap_or("");
            let asked = window_request(query, 5, super::fleet_page::MAX_FLAME_SECONDS)
                .and_then(|(s, f)| Ok((s, f, windows::view_request(query)?)));
            match asked {
                Ok((seconds, filter, view)) => {
                    granted.store(seconds, Ordering::Relaxed);
                    match take_window(pull, seconds, filter, view).await {
                        Ok(w) if path == "/flamegraph.svg" => {
                            rendered(Arc::new(w), Format::Svg).await
                        }
                        Ok(w) => kept(pull, w),
                        Err(refused) => refused,
                    }
                }
                Err(why) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
            }
        }
        (&Method::GET, p, Some((_, pull, _))) if p.starts_with("/windows/") => {
            let window = p["/windows/".len()..]
                .split_once('/')
                .and_then(|(id, file)| Some((id.parse::<u64>().ok()?, windows::format_of(file)?)))
                .and_then(|(id, format)| Some((pull.windows.get(id)?, format)));
            match window {
                Some((w, format)) => rendered(w, format).await,
                None => text(
                    StatusCode::NOT_FOUND,
                    "no such window: the page keeps its last few\n".into(),
                ),
            }
        }
        (&Method::GET, p, Some((_, pull, _)))
            if p == "/api/snapshots" || p == "/diff.svg" || p.starts_with("/snapshots/") =>
        {
            let query = req.uri().query().unwrap_or("");
            super::snapshot_files::respond(pull.snapshots.clone(), p, query).await
        }
        (_, "/healthz" | "/readyz", _)
        | (
            _,
            "/metrics"
            | "/debug/pprof/profile"
            | "/"
            | "/api/fleet"
            | "/flamegraph.svg"
            | "/api/window"
            | "/api/snapshots"
            | "/diff.svg",
            Some(_),
        ) => text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string()),
        (_, _, Some(_)) => text(
            StatusCode::NOT_FOUND,
            "not found: try /, /metrics or /debug/pprof/profile?seconds=30\n".to_string(),
        ),
        (_, _, None) => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz or /readyz\n".to_string(),
        ),
    }
}

/// The seconds and the filter of a profile request's query (`seconds` 1 to
/// [`MAX_PROFILE_SECONDS`], default 30 as Go's; `pid`; `service`); other parameters are
/// ignored, as Go's handler does.
fn profile_request(query: &str) -> Result<(u64, PullFilter), String> {
    window_request(query, 30, MAX_PROFILE_SECONDS)
}

/// Most bytes of a `/login` request's body.
const MAX_LOGIN_BYTES: usize = 8192;
/// Time a `/login` request's body has to arrive (a slow one would hold its connection).
pub const LOGIN_BODY_TIMEOUT: Duration = Duration::from_secs(2);

/// `/login`: the form (GET), or the token it sent (POST, `text/plain`: `token=<token>`); the
/// right token is answered with the session cookie and a way back to the page.
async fn login(access: &Access, req: Request<Incoming>) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt;
    let Some(token) = access.token.current() else {
        // Nothing to sign in to.
        return see_other("/", None);
    };
    match *req.method() {
        Method::GET => super::fleet_page::login_page(StatusCode::OK, ""),
        Method::POST => {
            let body = http_body_util::Limited::new(req.into_body(), MAX_LOGIN_BYTES).collect();
            let body = match tokio::time::timeout(LOGIN_BODY_TIMEOUT, body).await {
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(_)) => {
                    return text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "a login is one short form\n".into(),
                    )
                }
                Err(_) => {
                    return text(
                        StatusCode::REQUEST_TIMEOUT,
                        "a login's form is sent at once\n".into(),
                    )
                }
            };
            let given = body
                .strip_prefix(b"token=")
                .map(|t| t.trim_ascii_end())
                .unwrap_or(b"");
            if !access.logins.take() {
                return text(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many sign-in attempts: try again in a second\n".into(),
                );
            }
            match token.is(given) {
                true => see_other("/", Some(access.session_cookie(&token))),
                false => super::fleet_page::login_page(
                    StatusCode::UNAUTHORIZED,
                    "That is not this daemon's token.",
                ),
            }
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or POST\n".into()),
    }
}

/// A 303 to `to`, setting `cookie` when given.
fn see_other(to: &'static str, cookie: Option<String>) -> Response<Full<Bytes>> {
    let mut response = text(StatusCode::SEE_OTHER, format!("see {to}\n"));
    let headers = response.headers_mut();
    headers.insert(hyper::header::LOCATION, HeaderValue::from_static(to));
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(hyper::header::SET_COOKIE, value);
    }
    response
}

/// Takes the profile and answers with it, gzipped pprof.
async fn profile(pull: &Pull, seconds: u64, filter: PullFilter) -> Response<Full<Bytes>> {
    let window = match take_window(pull, seconds, filter, windows::View::All).await {
        Ok(w) => w,
        Err(refused) => return refused,
    };
    let mut response = rendered(Arc::new(window), Format::Pprof).await;
    if response.status() == StatusCode::OK {
        response.headers_mut().insert(
            hyper::header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment; filename=\"profile\""),
        );
    }
    response
}

/// Samples the next `seconds` of the fleet, a service or a process; a refusal is the answer.
async fn take_window(
    pull: &Pull,
    seconds: u64,
    filter: PullFilter,
    view: windows::View,
) -> Result<Window, Response<Full<Bytes>>> {
    let Some(profiler) = pull.profiler.get() else {
        return Err(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the fleet is starting\n".into(),
        ));
    };
    match profiler
        .profile(Duration::from_secs(seconds), filter.clone())
        .await
    {
        Ok(snapshot) => Ok(Window::viewed(
            snapshot,
            &filter,
            pull.context(seconds),
            view,
        )),
        Err(e @ pyfleet_actors::PullError::NotProfiled(_)) => {
            Err(text(StatusCode::NOT_FOUND, format!("{e}\n")))
        }
        // Too many at once, or the fleet is stopping.
        Err(e) => Err(text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"))),
    }
}

/// `/api/window`'s answer: the window kept, and its id, title, view, samples, the rate they
/// were taken at and the seconds they stand for, as JSON.
fn kept(pull: &Pull, window: Window) -> Response<Full<Bytes>> {
    let (title, samples, view) = (window.ctx.title.clone(), window.samples(), window.view);
    let rate_hz = window.snapshot.rate_hz().or(window.ctx.rate_hz);
    let seconds = rate_hz.filter(|hz| *hz > 0.0).map(|hz| samples as f64 / hz);
    let id = pull.windows.keep(window);
    let body = serde_json::json!({
        "id": id,
        "title": title,
        "view": view.name(),
        "samples": samples,
        "rate_hz": rate_hz,
        "seconds": seconds,
    });
    with_type(
        StatusCode::OK,
        body.to_string().into_bytes(),
        "application/json",
    )
}

/// Renderings (CPU work, seconds for a large window) running at once, off the runtime's
/// workers (see [`rendered`]).
pub const RENDERINGS: usize = 2;

/// What may render now: at most [`RENDERINGS`], in all (the listener's windows and the past
/// windows of `snapshot_files` alike).
pub static RENDERING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(RENDERINGS);

/// The answer of a request that wants a rendering when [`RENDERING`] has no room: 503, to be
/// asked again.
pub fn busy_rendering() -> Response<Full<Bytes>> {
    let mut response = text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{RENDERINGS} renderings are under way: ask again in a moment\n"),
    );
    response
        .headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `window` in `format`: kept already, or rendered on the blocking pool behind [`RENDERING`]
/// (503 when it is full), so that the runtime's workers stay free for probes and scrapes.
async fn rendered(window: Arc<Window>, format: Format) -> Response<Full<Bytes>> {
    let answer = |r: Result<Bytes, String>| match r {
        Ok(body) => with_type(StatusCode::OK, body, windows::content_type(format)),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    if let Some(kept) = window.rendered(format) {
        return answer(kept);
    }
    let Ok(permit) = RENDERING.try_acquire() else {
        return busy_rendering();
    };
    let done = tokio::task::spawn_blocking(move || {
        let r = window.render(format);
        drop(permit);
        r
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    answer(done)
}

/// `/api/fleet`: the supervisor's processes with the exporter's counters, as JSON.
async fn fleet(exporter: &Exporter, pull: &Pull) -> Response<Full<Bytes>> {
    let Some(profiler) = pull.profiler.get() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the fleet is starting\n".into(),
        );
    };
    let status = match profiler.status().await {
        Ok(s) => s,
        Err(e) => return text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    };
    // Rendering the exporter takes milliseconds on a large fleet: off the async workers.
    let (exporter, mode) = (exporter.clone(), pull.mode.as_str());
    let view = tokio::task::spawn_blocking(move || {
        super::fleet_page::fleet_view(&status, &exporter.for_page(), mode)
    })
    .await;
    let Ok(view) = view else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the page's view failed\n".into(),
        );
    };
    match serde_json::to_vec(&view) {
        Ok(body) => with_type(StatusCode::OK, body, "application/json"),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_queries_are_bounded() {
        assert_eq!(profile_request("").unwrap().0, 30);
        assert_eq!(window_request("", 5, 60).unwrap().0, 5);
        assert!(window_request("seconds=61", 5, 60).is_err());
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
            assert!(window_request(bad, 5, 60).is_err(), "{bad}");
            assert!(!e.contains('\n') && e.len() < 200, "{bad}: {e}");
        }
    }
}
