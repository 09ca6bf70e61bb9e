//! Who kept a waiting thread waiting, as the samples say: the threads waiting for the GIL by
//! the function the holder ran (the frames `crate::gil_blame` adds), `record`'s summary of a
//! wall-mode recording.

use pyfleet_actors::Snapshot;
use std::collections::HashMap;

/// How the innermost frame naming the GIL's holder starts (`[GIL held by FUNCTION]`).
pub const GIL_HELD_BY: &str = "[GIL held by ";
/// How the innermost frame of a ready asyncio task naming what its loop ran meanwhile
/// starts (`[loop blocked by FUNCTION]`).
pub const LOOP_BLOCKED_BY: &str = "[loop blocked by ";
/// The innermost frame of a ready asyncio task when what its loop ran is not known (with
/// the kernel capture).
pub const READY_FOR_LOOP: &str = "[ready, waiting for the loop]";
/// The holder's name when it had no Python frame.
pub const NO_PYTHON_FRAME: &str = "a thread without a Python frame";
/// The holder's name when its thread was not sampled in the same call.
pub const NOT_SAMPLED: &str = "its thread, not sampled then";

/// Whether `f` is a frame pyfleet adds to name what kept a wait waiting (the GIL's holder,
/// a ready task's loop): not code the waiter runs.
pub fn is_blame_frame(f: &pyfleet_actors::FrameInfo) -> bool {
    is_blame_function(&f.function)
}

/// Whether a function of that name is a frame pyfleet adds to name what kept a wait waiting.
pub fn is_blame_function(name: &str) -> bool {
    name.starts_with(GIL_HELD_BY) || name.starts_with(LOOP_BLOCKED_BY) || name == READY_FOR_LOOP
}

/// The samples of threads waiting for the GIL, blamed or not.
pub fn gil_waits(snap: &Snapshot) -> u64 {
    snap.processes
        .iter()
        .flat_map(|p| &p.samples)
        .filter(|(status, _, _)| status.waits_gil)
        .map(|(_, _, n)| n)
        .sum()
}

/// The samples of threads waiting for the GIL while a known thread held it, by the holder's
/// function (`function (file)`, the file's last component), highest first, each with its
/// percent of them; and how many there were.
pub fn gil_holders(snap: &Snapshot) -> (Vec<(String, f64)>, u64) {
    let mut by_holder: HashMap<String, u64> = HashMap::new();
    let mut total = 0u64;
    for p in &snap.processes {
        for (status, frames, count) in &p.samples {
            let Some(leaf) = frames.first().filter(|_| status.waits_gil) else {
                continue;
            };
            let Some(held_by) = leaf
                .function
                .strip_prefix(GIL_HELD_BY)
                .and_then(|f| f.strip_suffix(']'))
            else {
                continue;
            };
            let label = match leaf.file.rsplit('/').next() {
                Some(base) if !base.is_empty() => format!("{held_by} ({base})"),
                _ => held_by.to_string(),
            };
            *by_holder.entry(label).or_default() += count;
            total += count;
        }
    }
    (by_share(by_holder, total), total)
}

/// Counts by label, highest first (then by label), each as its percent of `total`.
pub fn by_share(counts: HashMap<String, u64>, total: u64) -> Vec<(String, f64)> {
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked
        .into_iter()
        .map(|(l, n)| (l, 100.0 * n as f64 / total.max(1) as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::views::one_process;
    use pyfleet_actors::{FrameInfo, Frames, ThreadStatus};

    #[test]
    fn waiters_by_the_holders_function() {
        let waiting = ThreadStatus {
            on_cpu: false,
            holds_gil: false,
            waits_gil: true,
        };
        let stack = |leaf: &str| -> Frames {
            vec![
                FrameInfo::new(leaf, "/srv/app.py", Some(3)),
                FrameInfo::new("handle", "/srv/app.py", Some(9)),
            ]
            .into()
        };
        let snap = one_process(vec![
            (waiting, stack("[GIL held by alpha]"), 6),
            (waiting, stack("[GIL held by beta]"), 2),
            // Waiting, no holder known; and a holder's own sample.
            (waiting, stack("handle"), 5),
            (ThreadStatus::default(), stack("alpha"), 9),
        ]);
        let (ranked, total) = gil_holders(&snap);
        assert_eq!(total, 8);
        assert_eq!(
            ranked,
            [
                ("alpha (app.py)".to_string(), 75.0),
                ("beta (app.py)".to_string(), 25.0)
            ]
        );
    }
}
