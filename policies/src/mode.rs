//! Which thread samples count, per profiling mode (`--mode`).
//!
//! Owns the mode names and the filter, the same as CPython 3.15's own sampler
//! (`profiling.sampling`, `_remote_debugging` with `skip_non_matching_threads`): `wall` counts
//! every thread, `cpu` only threads the kernel reports running, `gil` only the thread holding
//! the GIL. It must not find out a thread's status itself: the sampler reads that from the
//! target and passes it in. A thread whose CPU status could not be read is passed as not on
//! CPU, so `cpu` mode does not count it, as CPython does.

use std::fmt;
use std::str::FromStr;

/// A profiling mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Wall-clock time: every thread, running or waiting.
    Wall,
    /// CPU time: only threads running on a CPU. The default: "where does the CPU go?" is the
    /// first question, and idle threads (a server's acceptor, a pool's waiting workers) would
    /// otherwise fill the profile.
    #[default]
    Cpu,
    /// GIL time: only the thread holding the GIL.
    Gil,
}

/// `--mode` was given a name that is not a mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {input:?}: expected one of wall, cpu, gil")]
pub struct ModeError {
    pub input: String,
}

impl Mode {
    /// Every mode, in the order the CLI lists them.
    pub const ALL: [Mode; 3] = [Mode::Wall, Mode::Cpu, Mode::Gil];

    /// The mode's name as the CLI spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Wall => "wall",
            Mode::Cpu => "cpu",
            Mode::Gil => "gil",
        }
    }

    /// Whether a sample of a thread in this state counts in this mode.
    pub fn counts(self, on_cpu: bool, holds_gil: bool) -> bool {
        match self {
            Mode::Wall => true,
            Mode::Cpu => on_cpu,
            Mode::Gil => holds_gil,
        }
    }

    /// Whether the sampler must find out if each thread is on CPU. That costs a read from
    /// procfs per thread, so the sampler should skip it when the mode does not need it.
    pub fn needs_cpu_status(self) -> bool {
        matches!(self, Mode::Cpu)
    }
}

impl FromStr for Mode {
    type Err = ModeError;

    /// Accepts `wall`, `cpu` and `gil` in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ModeError {
                input: s.to_string(),
            })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_wall() {
        assert_eq!(Mode::default(), Mode::Cpu);
    }

    #[test]
    fn parse_any_case() {
        for (s, m) in [
            ("wall", Mode::Wall),
            ("WALL", Mode::Wall),
            ("Wall", Mode::Wall),
            ("cpu", Mode::Cpu),
            ("CPU", Mode::Cpu),
            ("cPu", Mode::Cpu),
            ("gil", Mode::Gil),
            ("GIL", Mode::Gil),
        ] {
            assert_eq!(s.parse::<Mode>(), Ok(m), "{s}");
        }
    }

    #[test]
    fn parse_rejects_others_in_one_line() {
        for s in [
            "",
            " wall",
            "wall ",
            "walls",
            "cpu-time",
            "all",
            "exception",
            "gil\n",
            "ẁall",
        ] {
            let e = s.parse::<Mode>().unwrap_err();
            assert_eq!(e.input, s);
            let msg = e.to_string();
            assert_eq!(msg.lines().count(), 1, "{msg}");
            assert!(msg.ends_with("expected one of wall, cpu, gil"), "{msg}");
        }
        assert_eq!(
            "x".parse::<Mode>().unwrap_err().to_string(),
            "unknown mode \"x\": expected one of wall, cpu, gil"
        );
    }

    #[test]
    fn display_round_trips() {
        for m in Mode::ALL {
            assert_eq!(m.to_string(), m.as_str());
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
        }
        assert_eq!(Mode::Gil.to_string(), "gil");
    }

    #[test]
    fn counts_truth_table() {
        // (mode, on_cpu, holds_gil, counts)
        let table = [
            (Mode::Wall, false, false, true),
            (Mode::Wall, true, false, true),
            (Mode::Wall, false, true, true),
            (Mode::Wall, true, true, true),
            (Mode::Cpu, false, false, false),
            (Mode::Cpu, true, false, true),
            (Mode::Cpu, false, true, false),
            (Mode::Cpu, true, true, true),
            (Mode::Gil, false, false, false),
            (Mode::Gil, true, false, false),
            (Mode::Gil, false, true, true),
            (Mode::Gil, true, true, true),
        ];
        for (mode, on_cpu, holds_gil, want) in table {
            assert_eq!(
                mode.counts(on_cpu, holds_gil),
                want,
                "{mode} on_cpu={on_cpu} holds_gil={holds_gil}"
            );
        }
    }

    #[test]
    fn only_cpu_mode_needs_cpu_status() {
        assert!(!Mode::Wall.needs_cpu_status());
        assert!(Mode::Cpu.needs_cpu_status());
        assert!(!Mode::Gil.needs_cpu_status());
    }
}
