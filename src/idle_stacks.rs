//! `--no-idle`, wall mode's default: samples of a thread off its CPU in a stack that waits
//! for work (`pyfleet_policies::waits_for_work` of its innermost frame) are left out of the
//! profile, as py-spy leaves idle threads out; `--idle` keeps them. Only the view changes:
//! the sample was taken, and the process's sample counts include it.

use crate::stacks::{StackId, StackTable};
use pyfleet_actors::SampledThread;
use rustc_hash::FxHashMap;

/// Most stacks whose verdict is remembered; past it they are all judged again.
const MAX_JUDGED: usize = 1 << 16;

/// The verdicts on one process's stacks.
#[derive(Default)]
pub struct IdleStacks {
    waits: FxHashMap<StackId, bool>,
}

impl IdleStacks {
    /// Removes from `out[from..]` the threads off their CPU in a stack that waits for work.
    pub fn leave_out(&mut self, table: &StackTable, out: &mut Vec<SampledThread>, from: usize) {
        let mut i = from;
        while i < out.len() {
            let t = &out[i];
            let idle = !t.status.on_cpu
                && u32::try_from(t.stack).is_ok_and(|stack| self.waits(table, stack));
            if idle {
                out.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    fn waits(&mut self, table: &StackTable, stack: StackId) -> bool {
        if let Some(&w) = self.waits.get(&stack) {
            return w;
        }
        if self.waits.len() >= MAX_JUDGED {
            self.waits.clear();
        }
        let w = table
            .resolve(stack)
            .and_then(|mut frames| frames.next())
            .is_some_and(|f| {
                pyfleet_policies::waits_for_work(&f.function.filename, &f.function.name)
            });
        self.waits.insert(stack, w);
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::Function;
    use pyfleet_actors::ThreadStatus;

    fn function(table: &mut StackTable, name: &str, file: &str) -> u32 {
        let f = table.function(Function {
            name: name.into(),
            qualname: name.into(),
            filename: file.into(),
            first_line: 1,
        });
        table.frame(f, Some(2))
    }

    #[test]
    fn only_threads_off_their_cpu_waiting_for_work_are_left_out() {
        let mut table = StackTable::new();
        let run = function(&mut table, "run", "/srv/app.py");
        let wait = function(&mut table, "wait", "/usr/lib/python3.12/threading.py");
        let recv = function(&mut table, "fetch", "/srv/app.py");
        let waiting = u64::from(table.stack(&[wait, run]));
        let working = u64::from(table.stack(&[recv, run]));
        let thread = |tid, stack, on_cpu| SampledThread {
            tid,
            status: ThreadStatus {
                on_cpu,
                holds_gil: false,
                waits_gil: false,
            },
            stack,
            samples: 1,
        };
        let mut out = vec![
            thread(9, working, false),
            thread(1, waiting, false),
            thread(2, working, false),
            thread(3, waiting, true),
        ];
        IdleStacks::default().leave_out(&table, &mut out, 1);
        let mut kept: Vec<u64> = out.iter().map(|t| t.tid).collect();
        kept.sort();
        assert_eq!(kept, [2, 3, 9]);
    }
}
