//! What a renderer may want to know beyond the samples: the profile's title, rate, mode and
//! window, shared by every format (`format.rs` dispatches to them; each format reads this).

use pyfleet_policies::Mode;
use std::time::Duration;

/// What a renderer may want to know beyond the samples.
#[derive(Debug, Clone)]
pub struct RenderContext {
    /// The flamegraph's title, the speedscope file's name, a pprof comment.
    pub title: String,
    /// Samples per second per process, when it held for the whole window: pprof then carries
    /// a time value per sample (`wall` or `cpu` nanoseconds) beside the count. `None` (the
    /// rate changed under the CPU budget, or is unknown): counts only.
    pub rate_hz: Option<f64>,
    /// Which thread samples were counted.
    pub mode: Mode,
    /// The length of the window, when known (pprof's `duration_nanos`).
    pub duration: Option<Duration>,
}

impl Default for RenderContext {
    fn default() -> Self {
        RenderContext {
            title: "pyfleet".to_string(),
            rate_hz: None,
            mode: Mode::default(),
            duration: None,
        }
    }
}

impl RenderContext {
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
            Some(hz) => s.push_str(&format!(", {hz} Hz")),
            None => s.push_str(", rate varied"),
        }
        if let Some(d) = self.duration {
            s.push_str(&format!(", {:.1} s", d.as_secs_f64()));
        }
        s
    }
}
