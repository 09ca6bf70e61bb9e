//! Other views of the same samples, made before rendering. The samples stay the same: only
//! how finely they are told apart changes, equal stacks merging, their counts summed.
//!
//! - [`by_function`] (`--function`): frames without their line numbers, so a function is one
//!   box however many of its lines were sampled (applied as windows are taken).
//! - [`without_task_frames`] (the default of [`TaskFrames`]): asyncio tasks' stacks without
//!   the frames naming each task (`task NAME`), so every task running the same coroutines
//!   merges: all requests to one endpoint are one tower. Applied at rendering (every format
//!   but pprof, which drops the frames itself and keeps the task as a label), so that the
//!   samples kept (a recording, the daemon's windows) can still be shown by task.

use pyfleet_actors::{FrameInfo, Frames, ProcessProfile, Snapshot, ThreadStatus};
use std::borrow::Cow;
use std::collections::HashMap;

/// How asyncio tasks show in a rendered profile (`--group-by task` keeps their frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskFrames {
    /// A task's stack is its coroutines' frames under those of the tasks awaiting it, with no
    /// frame naming a task: tasks running the same code merge (pprof labels each sample with
    /// its task).
    #[default]
    Merged,
    /// Each task's frames topped by a frame naming it (`task NAME`, file `<asyncio task>`).
    Kept,
}

/// Whether `frame` is one naming an asyncio task (see `cpython::named_task`).
pub fn is_task_frame(frame: &FrameInfo) -> bool {
    crate::cpython::named_task(&frame.function, &frame.file).is_some()
}

/// `snap` as `tasks` asks: unchanged (borrowed) when it keeps task frames or `snap` has none.
pub fn with_task_frames(snap: &Snapshot, tasks: TaskFrames) -> Cow<'_, Snapshot> {
    let has_tasks = || {
        snap.processes.iter().any(|p| {
            p.samples
                .iter()
                .any(|(_, f, _)| f.iter().any(is_task_frame))
        })
    };
    match tasks {
        TaskFrames::Merged if has_tasks() => Cow::Owned(without_task_frames(snap)),
        _ => Cow::Borrowed(snap),
    }
}

/// `snap` without the frames naming asyncio tasks, equal stacks merged (highest count first).
pub fn without_task_frames(snap: &Snapshot) -> Snapshot {
    refold(snap, |frames| {
        frames
            .iter()
            .filter(|f| !is_task_frame(f))
            .cloned()
            .collect()
    })
}

/// `snap` with every frame's line dropped and equal stacks merged (highest count first).
pub fn by_function(snap: &Snapshot) -> Snapshot {
    refold(snap, |frames| {
        frames
            .iter()
            .map(|f| FrameInfo {
                line: None,
                ..f.clone()
            })
            .collect()
    })
}

/// `snap` with each stack's frames replaced by `view` of them, equal stacks merged (highest
/// count first, then by frames).
fn refold(snap: &Snapshot, view: impl Fn(&Frames) -> Vec<FrameInfo>) -> Snapshot {
    let processes = snap
        .processes
        .iter()
        .map(|p| {
            let mut merged: HashMap<(ThreadStatus, Vec<FrameInfo>), u64> = HashMap::new();
            for (status, frames, count) in &p.samples {
                *merged.entry((*status, view(frames))).or_insert(0) += count;
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

    /// Two requests' tasks running the same handler merge into one stack once the frames
    /// naming them go; kept, they stay apart; a snapshot without tasks is not copied.
    #[test]
    fn tasks_running_the_same_code_merge() {
        let status = ThreadStatus::default();
        let task = |name: &str| FrameInfo::new(format!("task {name}"), "<asyncio task>", None);
        let code = |f: &str, l: i32| FrameInfo::new(f, "app.py", Some(l));
        let request = |name: &str, n| {
            let frames = vec![
                code("fetch", 9),
                code("orders", 4),
                task(name),
                code("run", 1),
            ];
            (status, Frames::from(frames), n)
        };
        let snap = one_process(vec![
            request("Task-7", 3),
            request("Task-9 (awaited by 2)", 4),
        ]);
        let merged = with_task_frames(&snap, TaskFrames::Merged);
        let p = &merged.processes[0];
        assert_eq!(p.samples.len(), 1, "{:?}", p.samples);
        assert_eq!(p.samples[0].2, 7);
        let names: Vec<&str> = p.samples[0].1.iter().map(|f| &*f.function).collect();
        assert_eq!(names, ["fetch", "orders", "run"]);
        assert_eq!(
            with_task_frames(&snap, TaskFrames::Kept).processes[0]
                .samples
                .len(),
            2
        );
        let plain = one_process(vec![(status, Frames::from(vec![code("main", 1)]), 1)]);
        assert!(matches!(
            with_task_frames(&plain, TaskFrames::Merged),
            Cow::Borrowed(_)
        ));
    }
}
