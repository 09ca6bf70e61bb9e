//! Other views of the same samples, made before rendering, in every format alike.
//!
//! [`by_function`] (`--function`): frames without their line numbers, so a function is one
//! box however many of its lines were sampled; equal stacks then merge, their counts summed.
//! The samples stay the same: only how finely they are told apart changes.

use pyfleet_actors::{FrameInfo, Frames, ProcessProfile, Snapshot, ThreadStatus};
use std::collections::HashMap;

/// `snap` with every frame's line dropped and equal stacks merged (highest count first).
pub fn by_function(snap: &Snapshot) -> Snapshot {
    let processes = snap
        .processes
        .iter()
        .map(|p| {
            let mut merged: HashMap<(ThreadStatus, Vec<FrameInfo>), u64> = HashMap::new();
            for (status, frames, count) in &p.samples {
                let key: Vec<FrameInfo> = frames
                    .iter()
                    .map(|f| FrameInfo {
                        line: None,
                        ..f.clone()
                    })
                    .collect();
                *merged.entry((*status, key)).or_insert(0) += count;
            }
            let mut samples: Vec<(ThreadStatus, Frames, u64)> = merged
                .into_iter()
                .map(|((status, frames), count)| (status, Frames::from(frames), count))
                .collect();
            samples.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
            ProcessProfile {
                samples,
                ..p.clone()
            }
        })
        .collect();
    Snapshot {
        processes,
        ..snap.clone()
    }
}

/// A one-second window of one process (pid 7, `app`) with `samples`: the formats' tests'.
#[cfg(test)]
pub(crate) fn one_process(samples: Vec<(ThreadStatus, Frames, u64)>) -> Snapshot {
    use std::time::{Duration, UNIX_EPOCH};
    Snapshot {
        started_at: UNIX_EPOCH,
        taken_at: UNIX_EPOCH + Duration::from_secs(1),
        processes: vec![ProcessProfile {
            pid: 7,
            name: "app".into(),
            role: pyfleet_policies::Role::Single,
            labels: Default::default(),
            samples,
            sampled: std::time::Duration::ZERO,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The function-level folds equal the line-level ones summed by function.
    #[test]
    fn function_level_is_the_line_level_summed_by_function() {
        let status = ThreadStatus::default();
        let stack = |lines: &[(&str, i32)]| -> Frames {
            lines
                .iter()
                .map(|&(f, l)| FrameInfo::new(f, "app.py", Some(l)))
                .collect::<Vec<_>>()
                .into()
        };
        let snap = one_process(vec![
            (status, stack(&[("build_report", 10), ("main", 3)]), 5),
            (status, stack(&[("build_report", 12), ("main", 3)]), 7),
            (status, stack(&[("build_report", 10), ("main", 4)]), 1),
            (status, stack(&[("render", 20), ("main", 5)]), 2),
        ]);
        let view = by_function(&snap);
        let p = &view.processes[0];
        let names = |frames: &Frames| -> Vec<String> {
            frames.iter().map(|f| f.function.to_string()).collect()
        };
        let got: Vec<(Vec<String>, u64)> =
            p.samples.iter().map(|(_, f, n)| (names(f), *n)).collect();
        assert_eq!(
            got,
            vec![
                (vec!["build_report".to_string(), "main".to_string()], 13),
                (vec!["render".to_string(), "main".to_string()], 2),
            ]
        );
        assert!(p
            .samples
            .iter()
            .all(|(_, f, _)| f.iter().all(|x| x.line.is_none())));
        assert_eq!(p.total(), snap.processes[0].total());
    }
}
