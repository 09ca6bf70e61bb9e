//! The fleet page's windows, each shown as a flamegraph and downloadable in every format.
//!
//! A live window is one the page asks for (`/api/window?seconds=N[&pid=P|&service=S]`): it is
//! sampled, kept in memory under an id (the last [`KEPT`] windows; an older id is gone) and
//! served as `/windows/ID/window.EXT`, so that what a download holds is what the page showed.
//! A past window is a snapshot directory read back (`output::snapshot_load`), served as
//! `/snapshots/NAME/window.EXT[?pid=P|?service=S]`. EXT is a format's extension (`folded`,
//! `svg`, `speedscope.json`, `pb.gz`): every format renders the same samples, through
//! `output::format::render`. Work per request: one window's rendering, or one snapshot read.

use crate::output::format::{self, Format, RenderContext};
use hyper::body::Bytes;
use pyfleet_actors::{PullFilter, Snapshot};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Live windows kept for their downloads.
pub const KEPT: usize = 8;

/// A window to render: its samples (already the fleet's, a service's or a process's) and
/// how they were taken.
#[derive(Debug)]
pub struct Window {
    pub snapshot: Snapshot,
    pub ctx: RenderContext,
    /// Its flamegraph once rendered: the page shows it, and may ask again and again.
    svg: std::sync::OnceLock<Result<Bytes, String>>,
}

impl Window {
    /// `snapshot` narrowed to `filter`'s processes, titled after what it shows.
    pub fn of(snapshot: Snapshot, filter: &PullFilter, mut ctx: RenderContext) -> Window {
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
        Window {
            snapshot,
            ctx,
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
/// `snapshot_dir::utc_name`), narrowed to `filter`. Blocking: reads the snapshot.
pub fn past(
    out: &crate::output::beneath::Beneath,
    name: &str,
    filter: &PullFilter,
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
    Ok(Window::of(loaded.snapshot, filter, loaded.ctx))
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
