//! The kernel capture as pyfleet samples with it, in one room: `--capture` resolved and
//! started ([`Capture`], [`HowStacks`]); the ring shared by a fleet's sources, filed by process
//! (`shared.rs`, [`SharedCapture`]); each process's link to it and the rules by which a
//! captured chain becomes a sample or a counted failure, decided in one place
//! (`link.rs`, [`CaptureLink::sample`]); and wall and gil modes' time off the CPU
//! ([`wall_time`]); the BPF program loaded, fed the threads to watch and its ring drained
//! (`kernel.rs`, [`kernel::KernelCapture`]). What a record holds and the layout a chain is
//! copied by are `memory::capture_records` (the cpython decoder reads them too, and the map
//! value is `unsafe`'s, which lives in `memory` only); `stack_source` is the actors' adapter
//! over this and the reads.
//!
//! [`Capture`] is `--capture`: which way, resolved for the mode, and starting the kernel capture
//! (or, for `auto`, falling back to reads). With a [`SharedCapture`] (the kernel capture), a source
//! reads its process in full only to learn its threads: at its first tick, when the kernel tells of
//! a thread of it that runs and is not yet known (a thread it found not to run Python is asked
//! about again after [`CAPTURE_RECHECK`]), and every [`CAPTURE_FULL_REFRESH`]. Samples of a thread
//! before it is learnt are counted failures. Its samples are the chains the kernel copied at
//! interrupts of those threads since the last tick, as many per tick as there were (each one thread
//! on a CPU at one instant); a process that ended hands out what was captured before, then reports
//! its end. In wall and gil modes ([`crate::stack_source::UnwinderFactory::off_cpu`]) the kernel
//! also copies a thread's chain as it leaves its CPU and tells when it comes back, and a call adds
//! each thread's time off its CPU since the last (see [`wall_time`]); the slot calls it before each
//! batch (`StackSource::counts_at_batch`), so that a process whose threads sleep costs a call a
//! batch, not one a tick. A capturing source is due (`StackSource::due`) only when records that
//! make it due wait for it (all but a switch-out with the chain last sent at one, which waits for
//! the next call: `PendingRecord::prompt` in `shared.rs`), or when its full read is due (while
//! full reads fail, every [`CAPTURE_RETRY`]): an idle process costs a tick a look at the ring and
//! its queue. Records with frames are decoded at the first tick after they were taken, no later:
//! a code object first seen in a record is read then, and the longer it waited the likelier it is
//! gone (a failed sample). The capture is one for the whole fleet: the source that drains it files
//! every record under its pid, and each source takes its own (at most [`MAX_PENDING`] waiting per
//! process; older ones are dropped and counted).

pub mod kernel;
mod link;
mod shared;
pub mod wall_time;

pub use link::CaptureLink;
pub use shared::{CaptureLosses, SharedCapture, MAX_PENDING};

use crate::capture::kernel::KernelCapture;
use std::sync::Arc;
use std::time::Duration;

/// How long a thread found not to run Python is not asked about again (it may have been
/// starting: its thread state not made yet).
pub const CAPTURE_RECHECK: Duration = Duration::from_secs(1);

/// How often a capturing source reads its process in full though no new thread ran (plus up
/// to 2 s, by pid): to forget threads that ended and learn thread states replaced under a
/// known thread.
pub const CAPTURE_FULL_REFRESH: Duration = Duration::from_secs(10);

/// How often a capturing source whose full read failed (not because its process ended) tries
/// again, records or not.
pub const CAPTURE_RETRY: Duration = Duration::from_secs(1);

/// How stacks are taken (`--capture`, `capture =`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// pyfleet reads each target at each tick.
    Reads,
    /// The kernel capture; failing to start it is an error.
    Kernel,
    /// The kernel capture where it can be used (neither `--blocking` nor `--switch-log`, and
    /// it starts: CAP_BPF and CAP_PERFMON, Linux 5.8; in wall and gil mode it must follow
    /// threads off their CPU too), else reads.
    Auto,
    /// What [`Capture::resolve`] makes of `Auto` (or of `Reads` with `--blocking`) where the
    /// capture does not apply: reads, for this reason.
    ReadsWhere(NotApplicable),
}

/// Why the kernel capture does not apply to a profile, whatever the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotApplicable {
    /// `--blocking`: targets are paused and read.
    Blocking,
    /// `--switch-log` goes with reads.
    SwitchLog,
}

/// How a profile's stacks are taken, and when not by the kernel capture, why not: what
/// `record` and `run` say in their first line and the daemon exports
/// (`pyfleet_capture_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HowStacks {
    /// Copied by the kernel at interrupts; `namespaced`: pyfleet runs in a pid namespace not
    /// the host's, whose processes alone can be captured (others are read from outside).
    Kernel { namespaced: bool },
    /// Read from outside (each target paused for it with `--blocking`), for this reason.
    Reads(WhyReads),
}

/// Why stacks are read from outside rather than captured by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WhyReads {
    /// `--capture reads` / `capture = "reads"`.
    Asked,
    /// The capture does not apply to this profile.
    NotApplicable(NotApplicable),
    /// It could not start on this host: the reason's fixed code (`CaptureError::code`) and
    /// its words.
    CannotStart { code: &'static str, why: String },
}

impl HowStacks {
    /// A fixed short name of how (`kernel`, `paused`, `reads`) and why not the capture
    /// (empty for the capture): bounded values for metrics labels and JSON.
    pub fn codes(&self) -> (&'static str, &'static str) {
        match self {
            HowStacks::Kernel { .. } => ("kernel", ""),
            HowStacks::Reads(WhyReads::Asked) => ("reads", "asked"),
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking)) => {
                ("paused", "blocking")
            }
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::SwitchLog)) => {
                ("reads", "switch_log")
            }
            HowStacks::Reads(WhyReads::CannotStart { code, .. }) => ("reads", code),
        }
    }
}

impl std::fmt::Display for HowStacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HowStacks::Kernel { namespaced: false } => {
                f.write_str("stacks from the kernel capture")
            }
            HowStacks::Kernel { namespaced: true } => f.write_str(
                "stacks from the kernel capture, in pyfleet's pid namespace (processes of \
                 other namespaces are read from outside)",
            ),
            HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking)) => {
                f.write_str("stacks read from outside, each target paused (--blocking)")
            }
            HowStacks::Reads(why) => {
                f.write_str("stacks read from outside: ")?;
                match why {
                    WhyReads::Asked => f.write_str("reads were asked for (capture: reads)"),
                    WhyReads::NotApplicable(_) => {
                        f.write_str("the context-switch log (--switch-log) goes with reads")
                    }
                    WhyReads::CannotStart { why, .. } => f.write_str(why),
                }
            }
        }
    }
}

impl std::str::FromStr for Capture {
    type Err = String;

    fn from_str(s: &str) -> Result<Capture, String> {
        match s {
            "reads" => Ok(Capture::Reads),
            "kernel" => Ok(Capture::Kernel),
            "auto" => Ok(Capture::Auto),
            other => Err(format!("must be auto, reads or kernel (got {other:?})")),
        }
    }
}

impl Capture {
    /// What `self` comes to for a profile with or without pausing targets or the
    /// context-switch log: `Auto` is reads where the capture does not apply. An explicit
    /// `Kernel` where it does not apply is an error, in words for `flag` (the command line's
    /// `--capture` or the config file's `capture`).
    pub fn resolve(self, blocking: bool, switch_log: bool, flag: &str) -> Result<Capture, String> {
        let option = |name: &str| match flag.starts_with("--") {
            true => format!("--{name}"),
            false => name.to_string(),
        };
        match self {
            Capture::Kernel if blocking => Err(format!(
                "{flag} kernel never stops the target: it does not go with {}",
                option("blocking")
            )),
            Capture::Auto | Capture::Reads if blocking => {
                Ok(Capture::ReadsWhere(NotApplicable::Blocking))
            }
            Capture::Auto if switch_log => Ok(Capture::ReadsWhere(NotApplicable::SwitchLog)),
            other => Ok(other),
        }
    }

    /// Starts the kernel capture at `rate_hz` when `self` (resolved) asks for it (with
    /// `off_cpu`, wall and gil modes: threads off their CPU too), and says how stacks will be
    /// taken.
    /// `Kernel` fails with the reason; `Auto` falls back to reads and the second value says
    /// why.
    pub fn start(
        self,
        rate_hz: f64,
        off_cpu: bool,
    ) -> Result<(Option<Arc<SharedCapture>>, HowStacks), String> {
        let reads = |why| Ok((None, HowStacks::Reads(why)));
        match self {
            Capture::Reads => return reads(WhyReads::Asked),
            Capture::ReadsWhere(n) => return reads(WhyReads::NotApplicable(n)),
            Capture::Kernel | Capture::Auto => {}
        }
        let hz = rate_hz.round().clamp(1.0, f64::from(u32::MAX)) as u32;
        match KernelCapture::start(hz, off_cpu) {
            Ok(c) => {
                let namespaced = c.namespace().is_some();
                Ok((
                    Some(Arc::new(SharedCapture::new(c))),
                    HowStacks::Kernel { namespaced },
                ))
            }
            Err(e) if self == Capture::Kernel => Err(format!("--capture kernel: {e}")),
            Err(e) => reads(WhyReads::CannotStart {
                code: e.code(),
                why: e.to_string(),
            }),
        }
    }
}

/// How a capturing source counts threads off their CPU (wall and gil modes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffCpu {
    /// gil mode: the capture reads with each chain whether the thread holds the GIL, and
    /// only the holder's time counts (on its CPU or off it).
    pub gil_holder_only: bool,
}

impl OffCpu {
    /// What `mode` needs (time off the CPU counts at the capture's rate): nothing in cpu
    /// mode.
    pub fn for_mode(mode: pyfleet_policies::Mode) -> Option<OffCpu> {
        use pyfleet_policies::Mode;
        match mode {
            Mode::Cpu => None,
            Mode::Wall | Mode::Gil => Some(OffCpu {
                gil_holder_only: mode == Mode::Gil,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Capture, HowStacks, NotApplicable, WhyReads};

    #[test]
    fn auto_is_the_kernel_capture_only_where_it_applies() {
        let auto: Capture = "auto".parse().expect("parses");
        // Neither blocking nor the switch log, in any mode.
        assert_eq!(auto.resolve(false, false, "--capture"), Ok(Capture::Auto));
        for (blocking, switch_log, why) in [
            (true, false, NotApplicable::Blocking),
            (false, true, NotApplicable::SwitchLog),
        ] {
            assert_eq!(
                auto.resolve(blocking, switch_log, "--capture"),
                Ok(Capture::ReadsWhere(why))
            );
        }
        assert_eq!(
            Capture::Reads.resolve(true, false, "--capture"),
            Ok(Capture::ReadsWhere(NotApplicable::Blocking))
        );
        let kernel: Capture = "kernel".parse().expect("parses");
        assert_eq!(
            kernel.resolve(false, false, "--capture"),
            Ok(Capture::Kernel)
        );
        let paused = kernel.resolve(true, false, "capture");
        assert!(paused.is_err_and(|e| e.contains("does not go with blocking")));
        assert!("bpf".parse::<Capture>().is_err());
    }

    #[test]
    fn how_stacks_are_taken_is_said_with_one_reason() {
        let said = |how: HowStacks| (how.to_string(), how.codes());
        let (text, codes) = said(HowStacks::Kernel { namespaced: false });
        assert_eq!(
            (text.as_str(), codes),
            ("stacks from the kernel capture", ("kernel", ""))
        );
        let (text, _) = said(HowStacks::Kernel { namespaced: true });
        assert!(text.contains("pid namespace"), "{text}");
        for (how, code, words) in [
            (HowStacks::Reads(WhyReads::Asked), "asked", "asked for"),
            (
                HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::SwitchLog)),
                "switch_log",
                "--switch-log",
            ),
            (
                HowStacks::Reads(WhyReads::CannotStart {
                    code: "no_privilege",
                    why: "needs CAP_BPF".into(),
                }),
                "no_privilege",
                "needs CAP_BPF",
            ),
        ] {
            let (text, codes) = said(how);
            assert_eq!(codes, ("reads", code));
            assert!(text.starts_with("stacks read from outside: ") && text.contains(words));
        }
        let paused = HowStacks::Reads(WhyReads::NotApplicable(NotApplicable::Blocking));
        assert_eq!(paused.codes(), ("paused", "blocking"));
    }
}
