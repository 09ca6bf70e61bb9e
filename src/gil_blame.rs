//! Blame frames: a wait charged to the function that kept it waiting ([`holder_frame`]).
//! Here wall mode's blame for the GIL; `task_stacks` charges ready asyncio tasks to what
//! their loop ran the same way. A thread waiting to take the GIL is charged to the function
//! the GIL's holder runs at that instant. Its stack gets one more frame, innermost,
//! `[GIL held by FUNCTION]` in the holder's file and line, so that in every format the wait
//! shows both where the waiter waits and what it waits for; `record` ranks the holders
//! (`output::blame`).
//!
//! Contract: only within one call's samples, which by reads are one instant's, and only when
//! exactly one of them holds the GIL (several holders are interpreters with GILs of their own,
//! which the samples do not tell apart). A holder without a Python frame is named as such.
//! The frame's names come from the target: formats sanitise them like any other.

use crate::output::blame::{GIL_HELD_BY, NOT_SAMPLED, NO_PYTHON_FRAME};
use crate::stacks::{FrameId, Function, StackTable};
use pyfleet_actors::{FrameInfo, SampledThread};
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
        let frame = holder_frame(table, GIL_HELD_BY, Some(holder_stack), None);
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

/// Chooses a frame among a stack's (innermost first), by its place.
pub type PickFrame = fn(&[FrameInfo]) -> Option<usize>;

/// The frame naming what the holder whose stack is `holder_stack` ran: `PREFIXFUNCTION]` in
/// the function's file and at its line, for the frame `pick` chooses among the stack's
/// frames (without `pick`, or when it chooses none: the innermost); `PREFIX` followed by
/// [`NO_PYTHON_FRAME`] for a stack without one, or by [`NOT_SAMPLED`] without a stack.
pub fn holder_frame(
    table: &mut StackTable,
    prefix: &str,
    holder_stack: Option<u32>,
    pick: Option<PickFrame>,
) -> FrameId {
    // The stack's frames as `FrameInfo`s only when something is to choose among them.
    let chosen = match (pick, holder_stack.and_then(|s| table.resolve(s))) {
        (Some(pick), Some(frames)) => {
            let infos: Vec<FrameInfo> = frames
                .map(|f| FrameInfo {
                    function: f.function.qualname.clone(),
                    file: f.function.filename.clone(),
                    line: f.line,
                })
                .collect();
            pick(&infos).unwrap_or(0)
        }
        _ => 0,
    };
    let holder = holder_stack
        .and_then(|s| table.resolve(s))
        .and_then(|mut frames| frames.nth(chosen))
        .map(|f| (f.function.clone(), f.line));
    let (function, line) = match holder {
        Some((f, line)) => (
            Function {
                name: format!("{prefix}{}]", f.name).into(),
                qualname: format!("{prefix}{}]", f.qualname).into(),
                filename: f.filename,
                first_line: f.first_line,
            },
            line,
        ),
        None => {
            let what = match holder_stack {
                Some(_) => NO_PYTHON_FRAME,
                None => NOT_SAMPLED,
            };
            let name: Arc<str> = format!("{prefix}{what}]").into();
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
    table.frame(function, line)
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
