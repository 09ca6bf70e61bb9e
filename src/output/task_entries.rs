//! Where asyncio tasks spend their time, and what held their event loops ([`loop_holders`]),
//! by what they run for the program: each task sample
//! is filed under its stack's first frame of the program's own code from the root
//! (`pyfleet_policies::is_own_code`: an endpoint's handler, under the server's and the
//! framework's frames every request shares), and within it under the frame it called next
//! (a phase: the database call, `to_thread`, the serialisation), or the entry itself when it
//! ran its own lines. `record`'s summary of an `--async` recording.
//!
//! Only samples of tasks count (stacks holding a frame naming a task); shares are of those
//! samples (an entry's) and of its entry's samples (a phase's). Labels are `function (file)`,
//! the file's last component, from the target: the caller bounds and defangs them for its
//! output.

use super::blame::{is_blame_frame, LOOP_BLOCKED_BY, READY_FOR_LOOP};
use super::views::is_task_frame;
use pyfleet_actors::{FrameInfo, Snapshot};
use std::collections::HashMap;

/// The label of the phase of an entry that ran its own lines.
pub const ITSELF: &str = "(its own lines)";
/// What the loop ran while a ready task waited, when the samples do not say (the kernel
/// capture's).
pub const NOT_NAMED: &str = "(what the loop ran is not known with the kernel capture)";
/// The label of the entry of task samples without a frame of the program's own code.
pub const NO_OWN_CODE: &str = "(no frame of the program's own code)";

/// One entry into the program's own code, and what its samples called next.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `function (file)`, or [`NO_OWN_CODE`].
    pub label: String,
    /// Task samples filed under it.
    pub samples: u64,
    /// Percent of the task samples.
    pub share: f64,
    /// Its phases, highest first: `function (file)` (or [`ITSELF`]), percent of its samples.
    pub phases: Vec<(String, f64)>,
}

/// `function (file)` of a frame: the file's last component.
fn label(f: &FrameInfo) -> String {
    let base = f.file.rsplit('/').next().unwrap_or(&f.file);
    format!("{} ({base})", f.function)
}

/// The task samples of `snap` by entry, highest first, and how many task samples there were.
pub fn task_entries(snap: &Snapshot) -> (Vec<Entry>, u64) {
    by_entry(
        snap,
        |_, frames| frames.iter().any(is_task_frame),
        next_phase,
    )
}

/// What an entry's sample called next: the frame after the entry, or [`ITSELF`]; nothing
/// without an entry.
fn next_phase(_: &[FrameInfo], code: &[&FrameInfo], entry: Option<usize>) -> String {
    match entry {
        Some(i) => code.get(i + 1).map_or(ITSELF.to_string(), |f| label(f)),
        None => String::new(),
    }
}

/// The samples of ready tasks waiting for their loop (stacks whose innermost frame names
/// what the loop ran meanwhile, `[loop blocked by FUNCTION]`, or only that they were
/// ready), by the entry of the task that
/// waited, each entry's phases being what its loop ran (`function (file)`), highest first;
/// and how many there were.
pub fn loop_blockers(snap: &Snapshot) -> (Vec<Entry>, u64) {
    by_entry(
        snap,
        |_, frames| frames.first().is_some_and(|f| blocker(f).is_some()),
        |frames, _, _| frames.first().and_then(blocker).unwrap_or_default(),
    )
}

/// `function (file)` of what a `[loop blocked by FUNCTION]` frame names; [`NOT_NAMED`] for
/// a ready task's frame that names none.
fn blocker(f: &FrameInfo) -> Option<String> {
    if &*f.function == READY_FOR_LOOP {
        return Some(NOT_NAMED.to_string());
    }
    let function = f
        .function
        .strip_prefix(LOOP_BLOCKED_BY)?
        .strip_suffix(']')?;
    let base = f.file.rsplit('/').next().unwrap_or(&f.file);
    Some(match base {
        "" => function.to_string(),
        base => format!("{function} ({base})"),
    })
}

/// What held the event loops of `snap`: the samples of a loop's thread running Python (a
/// task, or a callback under the loop's `_run_once`) by entry, highest first, and how many
/// there were. While a loop runs one, every other task of that loop waits, ready or not.
/// A callback without a frame of the program's own code is filed under the function the
/// loop called (under `Handle._run`).
pub fn loop_holders(snap: &Snapshot) -> (Vec<Entry>, u64) {
    by_entry(
        snap,
        |status, frames| {
            (status.on_cpu || status.holds_gil)
                && (frames.iter().any(is_task_frame) || frames.iter().any(is_loop_run_once))
        },
        next_phase,
    )
}

/// Whether `f` is an asyncio loop's `_run_once` (its frames under every callback it runs).
fn is_loop_run_once(f: &FrameInfo) -> bool {
    f.function.ends_with("_run_once") && f.file.ends_with("asyncio/base_events.py")
}

/// Whether `f` is `Handle._run`, which calls a loop's callbacks.
fn is_handle_run(f: &FrameInfo) -> bool {
    f.function.ends_with("Handle._run") && f.file.ends_with("asyncio/events.py")
}

/// Where `code` (frames root first) enters the program's own code: its first frame of the
/// program's own code; in a loop's callback (above the loop's `Handle._run`: the frames below
/// are whoever runs the loop), the first one above it, or without one the function the loop
/// called. `None`: no such frame.
fn entry_of(code: &[&FrameInfo]) -> Option<usize> {
    let start = code
        .iter()
        .position(|f| is_handle_run(f))
        .map_or(0, |i| i + 1);
    code[start.min(code.len())..]
        .iter()
        .position(|f| pyfleet_policies::is_own_code(&f.file))
        .map(|i| i + start)
        .or((start > 0).then_some(start))
        .filter(|&i| i < code.len())
}

/// The frames of code of `frames` (innermost first), root first: without the frames naming
/// tasks or blaming a wait, each with its place in `frames`.
fn code_root_first(frames: &[FrameInfo]) -> (Vec<usize>, Vec<&FrameInfo>) {
    frames
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, f)| !is_task_frame(f) && !is_blame_frame(f))
        .unzip()
}

/// Where in `frames` (innermost first) the phase of their entry is: the frame the entry into
/// the program's own code called next, or the entry itself when it ran its own lines (see
/// [`entry_of`]); the innermost frame without an entry, `None` without frames. What a wait
/// blamed on a loop names (`task_stacks`).
pub fn phase_frame(frames: &[FrameInfo]) -> Option<usize> {
    let (at, code) = code_root_first(frames);
    match entry_of(&code) {
        Some(i) => Some(at[(i + 1).min(code.len() - 1)]),
        None => (!frames.is_empty()).then_some(0),
    }
}

/// `frames` (innermost first) from their entry into the program's own code inward (see
/// [`entry_of`]), under a root frame [`NO_OWN_CODE`] when they have no such entry: the
/// fleet page's view by entry, where the requests of one endpoint are one tower whatever
/// server and framework frames run them. Frames naming tasks are kept where they are, above
/// the entry.
pub fn from_entry(frames: &[FrameInfo]) -> Vec<FrameInfo> {
    let (at, code) = code_root_first(frames);
    match entry_of(&code) {
        Some(i) => frames[..=at[i]].to_vec(),
        None => {
            let mut v = frames.to_vec();
            v.push(FrameInfo::new(NO_OWN_CODE, "<pyfleet>", None));
            v
        }
    }
}

/// The samples `counts` keeps, by entry (see the module documentation), and within each
/// entry by the phase `phase_of` names (given the frames innermost first, the frames of code
/// root first, and the entry's place in them; an empty name counts in no phase).
fn by_entry(
    snap: &Snapshot,
    counts: impl Fn(&pyfleet_actors::ThreadStatus, &[FrameInfo]) -> bool,
    phase_of: impl Fn(&[FrameInfo], &[&FrameInfo], Option<usize>) -> String,
) -> (Vec<Entry>, u64) {
    let mut by_entry: HashMap<String, (u64, HashMap<String, u64>)> = HashMap::new();
    let mut total = 0u64;
    for p in &snap.processes {
        for (status, frames, count) in &p.samples {
            if *count == 0 || !counts(status, frames) {
                continue;
            }
            total += count;
            // Root first, without the frames naming tasks.
            let (_, code) = code_root_first(frames);
            let entry = entry_of(&code);
            let (entry, phase) = match entry {
                Some(i) => (label(code[i]), phase_of(frames, &code, Some(i))),
                None => (NO_OWN_CODE.to_string(), phase_of(frames, &code, None)),
            };
            let e = by_entry.entry(entry).or_default();
            e.0 += count;
            if !phase.is_empty() {
                *e.1.entry(phase).or_default() += count;
            }
        }
    }
    let share = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    let mut entries: Vec<Entry> = by_entry
        .into_iter()
        .map(|(label, (samples, phases))| {
            let mut phases: Vec<(String, u64)> = phases.into_iter().collect();
            phases.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            Entry {
                label,
                samples,
                share: share(samples, total),
                phases: phases
                    .into_iter()
                    .map(|(l, n)| (l, share(n, samples)))
                    .collect(),
            }
        })
        .collect();
    entries.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.label.cmp(&b.label))
    });
    (entries, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::views::one_process;
    use pyfleet_actors::{Frames, ThreadStatus};

    fn stack(frames: &[(&str, &str)]) -> Frames {
        frames
            .iter()
            .map(|&(f, file)| FrameInfo::new(f, file, Some(1)))
            .collect::<Vec<_>>()
            .into()
    }

    /// Requests of two endpoints through a server's frames: each under its handler, each
    /// handler's samples under what it called next; a thread's sample does not count.
    #[test]
    fn task_samples_by_their_entry_into_the_programs_code() {
        let lib = "/usr/lib/python3.14/asyncio";
        let site = "/venv/lib/python3.14/site-packages";
        let server = [
            ("task Task-1", "<asyncio task>"),
            ("run_asgi", &*format!("{site}/uvicorn/h11.py")),
            ("app", &*format!("{site}/starlette/routing.py")),
        ];
        let request = |inner: &[(&str, &str)]| {
            let mut frames: Vec<(&str, &str)> = inner.to_vec();
            frames.extend(server.iter().rev().copied());
            stack(&frames)
        };
        let s = ThreadStatus::default();
        let sleep = format!("{lib}/tasks.py");
        let threads = format!("{lib}/threads.py");
        let snap = one_process(vec![
            (
                s,
                request(&[
                    ("sleep", &sleep),
                    ("fetch", "/srv/app.py"),
                    ("orders", "/srv/app.py"),
                ]),
                6,
            ),
            (
                s,
                request(&[("to_thread", &threads), ("orders", "/srv/app.py")]),
                3,
            ),
            (s, request(&[("orders", "/srv/app.py")]), 1),
            (
                s,
                request(&[("build", "/srv/app.py"), ("report", "/srv/app.py")]),
                5,
            ),
            (
                s,
                request(&[("send", &*format!("{site}/uvicorn/h11.py"))]),
                5,
            ),
            (
                s,
                stack(&[("select", "/usr/lib/python3.14/selectors.py")]),
                100,
            ),
        ]);
        let (entries, total) = task_entries(&snap);
        assert_eq!(total, 20);
        let got: Vec<(&str, u64)> = entries.iter().map(|e| (&*e.label, e.samples)).collect();
        assert_eq!(
            got,
            [
                ("orders (app.py)", 10),
                (NO_OWN_CODE, 5),
                ("report (app.py)", 5)
            ]
        );
        assert_eq!(entries[0].share, 50.0);
        let phases: Vec<(&str, f64)> = entries[0].phases.iter().map(|(l, s)| (&**l, *s)).collect();
        assert_eq!(
            phases,
            [
                ("fetch (app.py)", 60.0),
                ("to_thread (threads.py)", 30.0),
                (ITSELF, 10.0)
            ]
        );
    }

    /// The loop's holders: running tasks (holding the GIL) by entry, and the loop's
    /// callbacks by the function it called; waiting tasks and an idle loop do not count.
    #[test]
    fn what_held_the_loop() {
        let lib = "/usr/lib/python3.14/asyncio";
        let (events, base) = (format!("{lib}/events.py"), format!("{lib}/base_events.py"));
        let running = ThreadStatus {
            on_cpu: false,
            holds_gil: true,
            waits_gil: false,
        };
        let task = |inner: &[(&str, &str)]| {
            let mut frames: Vec<(&str, &str)> = inner.to_vec();
            frames.push(("task Task-3", "<asyncio task>"));
            stack(&frames)
        };
        let h11 = "/venv/lib/python3.14/site-packages/uvicorn/h11.py";
        let callback = stack(&[
            ("H11Protocol.data_received", h11),
            ("Handle._run", &events),
            ("BaseEventLoop._run_once", &base),
            ("main", "/srv/app.py"),
        ]);
        let sleep = "/usr/lib/python3.14/asyncio/tasks.py";
        let snap = one_process(vec![
            (
                running,
                task(&[("build", "/srv/app.py"), ("report", "/srv/app.py")]),
                6,
            ),
            (running, callback, 2),
            (
                ThreadStatus::default(),
                task(&[("sleep", sleep), ("orders", "/srv/app.py")]),
                50,
            ),
            (running, stack(&[("other", "/srv/app.py")]), 9),
        ]);
        let (entries, total) = loop_holders(&snap);
        assert_eq!(total, 8);
        let got: Vec<(&str, u64)> = entries.iter().map(|e| (&*e.label, e.samples)).collect();
        assert_eq!(
            got,
            [
                ("report (app.py)", 6),
                ("H11Protocol.data_received (h11.py)", 2)
            ]
        );
    }
}
