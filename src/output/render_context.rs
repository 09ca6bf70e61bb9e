//! What a renderer may want to know beyond the samples: the profile's title, rate, mode and
//! window, shared by every format (`format.rs` dispatches to them; each format reads this).

use super::views::TaskFrames;
use pyfleet_actors::Snapshot;
use pyfleet_policies::Mode;
use std::time::Duration;

/// What a renderer may want to know beyond the samples.
#[derive(Debug, Clone)]
pub struct RenderContext {
    /// The flamegraph's title, the speedscope file's name, a pprof comment.
    pub title: String,
    /// Samples per second per process: what turns counts into seconds. pprof then carries a
    /// time value per sample (`wall` or `cpu` nanoseconds) beside the count; `None` (not
    /// known): counts only. Set to the rate asked; [`RenderContext::for_snapshot`] (which
    /// every format's rendering applies) puts the rate the samples were taken at in its place.
    pub rate_hz: Option<f64>,
    /// The rate asked, when the samples were taken at another (the CPU budget lowered it):
    /// said beside it.
    pub asked_hz: Option<f64>,
    /// Which thread samples were counted.
    pub mode: Mode,
    /// The length of the window, when known (pprof's `duration_nanos`).
    pub duration: Option<Duration>,
    /// Whether asyncio tasks' frames naming them are drawn (`--group-by task`).
    pub tasks: TaskFrames,
    /// The SVG as an icicle graph, roots at the top (the fleet page's pane).
    pub icicle: bool,
}

impl Default for RenderContext {
    fn default() -> Self {
        RenderContext {
            title: "pyfleet".to_string(),
            rate_hz: None,
            asked_hz: None,
            mode: Mode::default(),
            duration: None,
            tasks: TaskFrames::default(),
            icicle: false,
        }
    }
}

/// How far the rate the samples were taken at may be from the rate asked before both are
/// said (a fraction of the asked rate: clock granularity and rounding stay under it).
const RATE_TOLERANCE: f64 = 0.01;

impl RenderContext {
    /// The context of `snap`: its rate the one its samples were taken at, when it knows the
    /// time they stand for (see `Snapshot::rate_hz`), the rate asked beside it when they
    /// differ. Applying it twice changes nothing.
    pub fn for_snapshot(&self, snap: &Snapshot) -> RenderContext {
        let mut ctx = self.clone();
        if let Some(hz) = snap.rate_hz() {
            ctx.rate_hz = Some(hz);
            ctx.asked_hz = self
                .asked_hz
                .or(self.rate_hz)
                .filter(|asked| *asked > 0.0 && (hz / asked - 1.0).abs() > RATE_TOLERANCE);
        }
        ctx
    }

    /// What the samples are, in one line for people: `cpu mode (threads on a CPU), 100 Hz,
    /// 15.0 s`. Every output carries it (the SVG's subtitle, speedscope's name, a pprof
    /// comment), so that a profile says how it was made.
    pub fn describe(&self) -> String {
        let what = match self.mode {
            Mode::Cpu => "threads on a CPU",
            Mode::Wall => "every thread, waiting or not",
            Mode::Gil => "the thread holding the GIL",
        };
        let mut s = format!("{} mode ({what})", self.mode.as_str());
        match self.rate_hz {
            Some(hz) => s.push_str(&format!(", {} Hz", shown_hz(hz))),
            None => s.push_str(", rate not known"),
        }
        if let Some(asked) = self.asked_hz {
            s.push_str(&format!(" ({} Hz asked)", shown_hz(asked)));
        }
        if let Some(d) = self.duration {
            s.push_str(&format!(", {:.1} s", d.as_secs_f64()));
        }
        s
    }
}

/// A rate for people: whole when it is (100), else to a tenth (66.1).
pub fn shown_hz(hz: f64) -> String {
    match (hz - hz.round()).abs() < 0.05 {
        true => format!("{}", hz.round()),
        false => format!("{hz:.1}"),
    }
}
