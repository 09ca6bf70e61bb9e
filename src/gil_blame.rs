//! Wall mode's blame for the GIL: a thread waiting to take the GIL is charged to the function
//! the GIL's holder runs at that instant. Its stack gets one more frame, innermost,
//! `[GIL held by FUNCTION]` in the holder's file and line, so that in every format the wait
//! shows both where the waiter waits and what it waits for; `record` ranks the holders
//! (`output::blame`).
//!
//! Contract: only within one call's samples, which by reads are one instant's, and only when
//! exactly one of them holds the GIL (several holders are interpreters with GILs of their own,
//! which the samples do not tell apart). A holder without a Python frame is named as such.
//! The frame's names come from the target: formats sanitise them like any other.

use crate::output::blame::{GIL_HELD_BY, NO_PYTHON_FRAME};
use crate::stacks::{FrameId, Function, StackTable};
use pyfleet_actors::SampledThread;
use std::sync::Arc;

/// The blame of one process's samples.
#[derive(Default)]
pub struct GilBlame {
    scratch: Vec<FrameId>,
}

impl GilBlame {
    /// Adds the frame naming the GIL's holder to the stack of each thread of `samples` (one
    /// call's) that waits for the GIL.
    pub fn apply(&mut self, table: &mut StackTable, samples: &mut [SampledThread]) {
        if !samples.iter().any(|t| t.status.waits_gil) {
            return;
        }
        let mut holders = samples.iter().filter(|t| t.status.holds_gil);
        let (Some(holder), None) = (holders.next(), holders.next()) else {
            return;
        };
        let Ok(holder_stack) = u32::try_from(holder.stack) else {
            return;
        };
        let leaf = table
            .resolve(holder_stack)
            .and_then(|mut frames| frames.next())
            .map(|f| (f.function.clone(), f.line));
        let (function, line) = match leaf {
            Some((f, line)) => (
                Function {
                    name: format!("{GIL_HELD_BY}{}]", f.name).into(),
                    qualname: format!("{GIL_HELD_BY}{}]", f.qualname).into(),
                    filename: f.filename,
                    first_line: f.first_line,
                },
                line,
            ),
            None => {
                let name: Arc<str> = format!("{GIL_HELD_BY}{NO_PYTHON_FRAME}]").into();
                let function = Function {
                    name: name.clone(),
                    qualname: name,
                    filename: "".into(),
                    first_line: 0,
                };
                (function, None)
            }
        };
        let function = table.function(function);
        let frame = table.frame(function, line);
        for t in samples.iter_mut().filter(|t| t.status.waits_gil) {
            if let Some(stack) = u32::try_from(t.stack)
                .ok()
                .and_then(|s| table.with_innermost(s, frame, &mut self.scratch))
            {
                t.stack = u64::from(stack);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::ThreadStatus;

    fn function(table: &mut StackTable, name: &str) -> FrameId {
        let f = table.function(Function {
            name: name.into(),
            qualname: name.into(),
            filename: "/srv/app.py".into(),
            first_line: 1,
        });
        table.frame(f, Some(7))
    }

    fn thread(tid: u64, stack: u32, holds_gil: bool, waits_gil: bool) -> SampledThread {
        SampledThread {
            tid,
            status: ThreadStatus {
                on_cpu: holds_gil,
                holds_gil,
                waits_gil,
            },
            stack: u64::from(stack),
            samples: 1,
        }
    }

    fn names(table: &StackTable, stack: u64) -> Vec<String> {
        table
            .resolve(stack as u32)
            .unwrap()
            .map(|f| f.function.qualname.to_string())
            .collect()
    }

    /// The waiter's stack gains the holder's function innermost; the holder's and a
    /// sleeper's stay; two holders (two GILs) blame nobody.
    #[test]
    fn a_waiter_is_charged_to_the_holders_function() {
        let mut table = StackTable::new();
        let (build, main, wants) = (
            function(&mut table, "build_report"),
            function(&mut table, "main"),
            function(&mut table, "handle"),
        );
        let holding = table.stack(&[build, main]);
        let waiting = table.stack(&[wants, main]);
        let mut samples = vec![
            thread(1, holding, true, false),
            thread(2, waiting, false, true),
            thread(3, waiting, false, false),
        ];
        GilBlame::default().apply(&mut table, &mut samples);
        assert_eq!(names(&table, samples[0].stack), ["build_report", "main"]);
        assert_eq!(
            names(&table, samples[1].stack),
            ["[GIL held by build_report]", "handle", "main"]
        );
        assert_eq!(samples[2].stack, u64::from(waiting));
        let mut two = vec![
            thread(1, holding, true, false),
            thread(4, holding, true, false),
            thread(2, waiting, false, true),
        ];
        GilBlame::default().apply(&mut table, &mut two);
        assert_eq!(two[2].stack, u64::from(waiting));
    }
}
