//! The fleet page's windows, each shown as a flamegraph and downloadable in every format.
//!
//! A live window is one the page asks for (`/api/window?seconds=N[&pid=P|&service=S]
//! [&view=V]`): it is sampled, shown as [`View`] V says, kept in memory under an id (the last
//! [`KEPT`] windows; an older id is gone) and served as `/windows/ID/window.EXT`, so that what
//! a download holds is what the page showed.
//! A past window is a snapshot directory read back (`output::snapshot_load`), served as
//! `/snapshots/NAME/window.EXT[?pid=P|?service=S]`. EXT is a format's extension (`folded`,
//! `svg`, `speedscope.json`, `pb.gz`): every format renders the same samples, through
//! `output::format::render`. Work per request: one window's rendering, or one snapshot read.

use crate::output::format::{self, Format, RenderContext};
use hyper::body::Bytes;
use pyfleet_actors::{PullFilter, Snapshot};
use pyfleet_policies::Mode;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Live windows kept for their downloads.
pub const KEPT: usize = 8;

/// What a live window shows of the samples the daemon takes in its mode, without a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// Every sample the mode counts (wall mode: the threads' wall time).
    #[default]
    All,
    /// The samples of threads on a CPU (in cpu mode, all of them).
    OnCpu,
    /// The samples of threads holding the GIL.
    HoldingGil,
    /// Every sample from its entry into the program's own code inward (see
    /// `output::task_entries::from_entry`): an endpoint's requests are one tower.
    ByEntry,
}

impl View {
    pub const ALL: [View; 4] = [View::All, View::OnCpu, View::HoldingGil, View::ByEntry];

    /// Its name in a query (`view=`).
    pub fn name(self) -> &'static str {
        match self {
            View::All => "all",
            View::OnCpu => "cpu",
            View::HoldingGil => "gil",
            View::ByEntry => "entry",
        }
    }

    /// The view named `name` in a query.
    pub fn named(name: &str) -> Result<View, String> {
        View::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = View::ALL.iter().map(|v| v.name()).collect();
                format!("view must be one of {}", names.join(", "))
            })
    }

    /// What the title says of it (nothing for every sample).
    fn describe(self) -> Option<&'static str> {
        match self {
            View::All => None,
            View::OnCpu => Some("on a CPU"),
            View::HoldingGil => Some("holding the GIL"),
            View::ByEntry => Some("by entry into the program's code"),
        }
    }

    /// Keeps, or reshapes, the samples of `snapshot` taken in `mode` as the view says.
    fn apply(self, snapshot: &mut Snapshot, mode: Mode) {
        for p in &mut snapshot.processes {
            match self {
                View::All => {}
                // A cpu-mode sample is of a thread on a CPU whatever its status says (the
                // status is read only where the mode needs it).
                View::OnCpu if mode == Mode::Cpu => {}
                View::OnCpu => p.samples.retain(|(s, _, _)| s.on_cpu),
                View::HoldingGil => p.samples.retain(|(s, _, _)| s.holds_gil),
                View::ByEntry => {
                    for (_, frames, _) in &mut p.samples {
                        *frames = crate::output::task_entries::from_entry(frames).into();
                    }
                }
            }
        }
    }
}

/// The view a query asks for (`view=`; every sample when it says none).
pub fn view_request(query: &str) -> Result<View, String> {
    match query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == "view")
    {
        Some((_, v)) => View::named(v),
        None => Ok(View::All),
    }
}

/// A window to render: its samples (already the fleet's, a service's or a process's) and
/// how they were taken.
#[derive(Debug)]
pub struct Window {
    pub snapshot: Snapshot,
    pub ctx: RenderContext,
    pub view: View,
    /// Its flamegraph once rendered: the page shows it, and may ask again and again.
    svg: std::sync::OnceLock<Result<Bytes, String>>,
}

impl Window {
    /// `snapshot` narrowed to `filter`'s processes, titled after what it shows.
    pub fn of(snapshot: Snapshot, filter: &PullFilter, ctx: RenderContext) -> Window {
        Window::viewed(snapshot, filter, ctx, View::All)
    }

    /// [`Window::of`], shown as `view` says.
    pub fn viewed(
        snapshot: Snapshot,
        filter: &PullFilter,
        mut ctx: RenderContext,
        view: View,
    ) -> Window {
        // The page's pane shows the top of a tall graph first: its processes, as an icicle.
        ctx.icicle = true;
        let mut snapshot = snapshot;
        snapshot.processes.retain(|p| filter.admits_process(p));
        ctx.title = match (filter.pid, &filter.service) {
            (Some(pid), _) => match snapshot.processes.first() {
                Some(p) => format!("{} (pid {pid})", p.name),
                None => format!("pid {pid}"),
            },
            (None, Some(s)) => format!("service {s}"),
            (None, None) => "the fleet".to_string(),
        };
        view.apply(&mut snapshot, ctx.mode);
        if let Some(how) = view.describe() {
            ctx.title = format!("{}, {how}", ctx.title);
        }
        Window {
            snapshot,
            ctx,
            view,
            svg: std::sync::OnceLock::new(),
        }
    }

    pub fn samples(&self) -> u64 {
        self.snapshot.processes.iter().map(|p| p.total()).sum()
    }

    /// The window in `format`; the flamegraph rendered once, then kept. Blocking (CPU).
    pub fn render(&self, format: Format) -> Result<Bytes, String> {
        let render = || format::render(format, &self.snapshot, &self.ctx).map(Bytes::from);
        match format {
            Format::Svg => self.svg.get_or_init(render).clone(),
            _ => render(),
        }
    }

    /// The window in `format` if that costs nothing now (kept already).
    pub fn rendered(&self, format: Format) -> Option<Result<Bytes, String>> {
        match format {
            Format::Svg => self.svg.get().cloned(),
            _ => None,
        }
    }
}

/// Past window `name` of the snapshots in `out` (a snapshot's name, see
/// `snapshot_dir::utc_name`), narrowed to `filter`, shown as `view` says: a view by thread
/// status (on a CPU, holding the GIL) only of a snapshot whose samples keep it (written in
/// pprof alone; folded stacks keep none), or in cpu mode. Blocking: reads the snapshot.
pub fn past(
    out: &crate::output::beneath::Beneath,
    name: &str,
    filter: &PullFilter,
    view: View,
) -> Result<Window, String> {
    if !crate::output::snapshot_dir::is_snapshot_name(name) {
        return Err("no such snapshot (see /api/snapshots)".into());
    }
    let not_read = |_| format!("{name}: no such snapshot, or one that cannot be read back");
    let snapshot = out
        .subdirectory(std::path::Path::new(name))
        .map_err(not_read)?;
    let loaded = crate::output::snapshot_load::load(&snapshot)
        .map_err(|_| format!("{name}: no such snapshot, or one that cannot be read back"))?;
    let by_status = matches!(view, View::OnCpu | View::HoldingGil);
    if by_status && !loaded.statuses && !(view == View::OnCpu && loaded.ctx.mode == Mode::Cpu) {
        return Err(format!(
            "{name} was written as folded stacks, which keep no thread status: it shows every \
             sample, or by entry"
        ));
    }
    Ok(Window::viewed(loaded.snapshot, filter, loaded.ctx, view))
}

/// The format of a `window.EXT` file name.
pub fn format_of(file: &str) -> Option<Format> {
    let ext = file.strip_prefix("window.")?;
    Format::ALL.into_iter().find(|f| f.extension() == ext)
}

/// The content type a format is served with.
pub fn content_type(format: Format) -> &'static str {
    match format {
        Format::Folded => "text/plain; charset=utf-8",
        Format::Svg => "image/svg+xml",
        Format::Speedscope => "application/json",
        Format::Pprof => "application/octet-stream",
    }
}

/// The last [`KEPT`] live windows, by id.
#[derive(Debug, Clone, Default)]
pub struct KeptWindows {
    inner: Arc<Mutex<Kept>>,
}

#[derive(Debug, Default)]
struct Kept {
    next_id: u64,
    windows: VecDeque<(u64, Arc<Window>)>,
}

impl KeptWindows {
    /// Keeps `window` (dropping the oldest past [`KEPT`]); its id.
    pub fn keep(&self, window: Window) -> u64 {
        let mut kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        kept.next_id += 1;
        let id = kept.next_id;
        kept.windows.push_back((id, Arc::new(window)));
        while kept.windows.len() > KEPT {
            kept.windows.pop_front();
        }
        id
    }

    pub fn get(&self, id: u64) -> Option<Arc<Window>> {
        let kept = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        kept.windows
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, w)| w.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::{FrameInfo, Labels, ProcessProfile, ThreadStatus};
    use pyfleet_policies::Role;

    fn snapshot() -> Snapshot {
        let process = |pid: i32, service: &str, function: &str| {
            let mut labels = Labels::default();
            labels.set("service", service.to_string());
            ProcessProfile {
                pid,
                name: "web".into(),
                role: Role::Single,
                labels,
                samples: vec![(
                    ThreadStatus::default(),
                    vec![FrameInfo::new(function, "/a.py", Some(1))].into(),
                    pid as u64,
                )],
                sampled: std::time::Duration::ZERO,
            }
        };
        Snapshot {
            started_at: std::time::SystemTime::UNIX_EPOCH,
            taken_at: std::time::SystemTime::UNIX_EPOCH,
            processes: vec![
                process(3, "api", "alpha"),
                process(4, "api", "beta"),
                process(5, "jobs", "gamma"),
            ],
        }
    }

    #[test]
    fn a_window_is_narrowed_titled_and_rendered_in_every_format() {
        let by_pid = PullFilter {
            pid: Some(4),
            ..Default::default()
        };
        let w = Window::of(snapshot(), &by_pid, RenderContext::default());
        assert_eq!((w.ctx.title.as_str(), w.samples()), ("web (pid 4)", 4));
        let by_service = PullFilter {
            service: Some("api".into()),
            ..Default::default()
        };
        let w = Window::of(snapshot(), &by_service, RenderContext::default());
        assert_eq!((w.ctx.title.as_str(), w.samples()), ("service api", 7));
        let folded = String::from_utf8(w.render(Format::Folded).unwrap().to_vec()).unwrap();
        assert!(folded.contains("alpha") && folded.contains("beta") && !folded.contains("gamma"));
        for f in Format::ALL {
            let file = format!("window.{}", f.extension());
            assert_eq!(format_of(&file), Some(f));
            assert!(!w.render(f).unwrap().is_empty(), "{file}");
        }
        assert_eq!(format_of("window.exe"), None);
        assert_eq!(format_of("flamegraph.svg"), None);
    }

    #[test]
    fn views_keep_or_reshape_the_samples_of_the_mode() {
        let lib = "/venv/lib/python3.12/site-packages/starlette/routing.py";
        // Innermost first: a handler's call under the framework, and a framework-only stack.
        let request: Vec<FrameInfo> = vec![
            FrameInfo::new("query", "/srv/app/db.py", Some(9)),
            FrameInfo::new("orders", "/srv/app/app.py", Some(5)),
            FrameInfo::new("handle", lib, Some(70)),
            FrameInfo::new("<module>", "/srv/app/app.py", Some(1)),
        ];
        let idle = vec![FrameInfo::new("serve", lib, Some(3))];
        let status = |on_cpu, holds_gil| ThreadStatus {
            on_cpu,
            holds_gil,
            waits_gil: false,
        };
        let snap = || Snapshot {
            started_at: std::time::SystemTime::UNIX_EPOCH,
            taken_at: std::time::SystemTime::UNIX_EPOCH,
            processes: vec![ProcessProfile {
                pid: 7,
                name: "web".into(),
                role: Role::Single,
                labels: Labels::default(),
                samples: vec![
                    (status(true, true), request.clone().into(), 5),
                    (status(false, false), request.clone().into(), 3),
                    (status(false, false), idle.clone().into(), 2),
                ],
                sampled: std::time::Duration::ZERO,
            }],
        };
        let wall = RenderContext {
            mode: Mode::Wall,
            ..Default::default()
        };
        let shown = |view: View, ctx: &RenderContext| {
            Window::viewed(snap(), &PullFilter::default(), ctx.clone(), view)
        };
        assert_eq!(shown(View::All, &wall).samples(), 10);
        assert_eq!(shown(View::OnCpu, &wall).samples(), 5);
        assert_eq!(shown(View::HoldingGil, &wall).samples(), 5);
        let cpu = RenderContext::default();
        assert_eq!(cpu.mode, Mode::Cpu);
        assert_eq!(shown(View::OnCpu, &cpu).samples(), 10);
        let by_entry = shown(View::ByEntry, &wall);
        assert_eq!(by_entry.samples(), 10);
        assert_eq!(
            by_entry.ctx.title,
            "the fleet, by entry into the program's code"
        );
        let folded = String::from_utf8(by_entry.render(Format::Folded).unwrap().to_vec()).unwrap();
        // The first frame of the program's own code from the root is <module>: the request
        // roots there, the framework's frames under it kept; the framework-only stack under
        // a frame saying it has no own code.
        assert!(
            folded.contains("web-7;<module> (/srv/app/app.py:1);handle ("),
            "{folded}"
        );
        assert!(
            folded.contains("web-7;(no frame of the program's own code) (<pyfleet>);serve ("),
            "{folded}"
        );
        assert_eq!(view_request("seconds=5&view=gil"), Ok(View::HoldingGil));
        assert_eq!(view_request("seconds=5"), Ok(View::All));
        assert!(view_request("view=wall")
            .unwrap_err()
            .contains("all, cpu, gil, entry"));
    }

    #[test]
    fn only_the_last_windows_are_kept() {
        let kept = KeptWindows::default();
        let ids: Vec<u64> = (0..KEPT + 2)
            .map(|_| {
                kept.keep(Window::of(
                    snapshot(),
                    &PullFilter::default(),
                    RenderContext::default(),
                ))
            })
            .collect();
        assert!(kept.get(ids[0]).is_none() && kept.get(ids[1]).is_none());
        assert!(ids[2..].iter().all(|&id| kept.get(id).is_some()));
        assert!(kept.get(0).is_none() && kept.get(u64::MAX).is_none());
    }
}
