//! Where the garbage collector ran, as the samples say: the samples holding a `<GC>` frame
//! (`cpython::Unwinder::with_gc_frame` adds it), by the function whose frame started the
//! collection (the frame right under `<GC>`), `record`'s summary.

use crate::cpython::{GC_FILE, GC_FUNCTION};
use pyfleet_actors::Snapshot;
use std::collections::HashMap;

/// What started collections when no Python frame is under `<GC>`.
pub const NO_PYTHON_FRAME: &str = "(no Python frame)";

/// The samples in which the collector ran, by the function that started the collection
/// (`function (file)`, the file's last component), highest first, each with its percent of
/// them; and how many there were.
pub fn collections(snap: &Snapshot) -> (Vec<(String, f64)>, u64) {
    let mut by_starter: HashMap<String, u64> = HashMap::new();
    let mut total = 0u64;
    for p in &snap.processes {
        for (_, frames, count) in &p.samples {
            // Innermost first: the frame that started it is the one after `<GC>`.
            let Some(at) = frames
                .iter()
                .position(|f| &*f.function == GC_FUNCTION && &*f.file == GC_FILE)
            else {
                continue;
            };
            let label = match frames.get(at + 1) {
                Some(f) => {
                    let base = f.file.rsplit('/').next().unwrap_or(&f.file);
                    format!("{} ({base})", f.function)
                }
                None => NO_PYTHON_FRAME.to_string(),
            };
            *by_starter.entry(label).or_default() += count;
            total += count;
        }
    }
    (super::blame::by_share(by_starter, total), total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::views::one_process;
    use pyfleet_actors::{FrameInfo, Frames, ThreadStatus};

    #[test]
    fn collections_by_the_function_that_started_them() {
        let stack = |frames: &[(&str, &str)]| -> Frames {
            frames
                .iter()
                .map(|(f, file)| FrameInfo::new(*f, *file, Some(1)))
                .collect::<Vec<_>>()
                .into()
        };
        let gc = (GC_FUNCTION, GC_FILE);
        let snap = one_process(vec![
            (
                ThreadStatus::default(),
                stack(&[gc, ("cleanup", "/srv/app.py")]),
                3,
            ),
            // A finalizer the collector called runs above <GC>.
            (
                ThreadStatus::default(),
                stack(&[("__del__", "/srv/res.py"), gc, ("cleanup", "/srv/app.py")]),
                1,
            ),
            (ThreadStatus::default(), stack(&[gc]), 1),
            (
                ThreadStatus::default(),
                stack(&[("cleanup", "/srv/app.py")]),
                5,
            ),
        ]);
        let (ranked, total) = collections(&snap);
        assert_eq!(total, 5);
        assert_eq!(
            ranked,
            [
                ("cleanup (app.py)".to_string(), 80.0),
                (NO_PYTHON_FRAME.to_string(), 20.0)
            ]
        );
    }
}
