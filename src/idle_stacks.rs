//! `--no-idle`, wall mode's default: samples of a thread off its CPU in a stack that waits
//! for work (`pyfleet_policies::waits_for_work` of its innermost frame) are left out of the
//! profile, as py-spy leaves idle threads out, and so are the samples of waiting asyncio
//! tasks that wait for work (`pyfleet_policies::task_waits_for_work`); `--idle` keeps them.
//! Only the view changes: the sample was taken, and the process's sample counts include it.
//! The samples left out are counted ([`IdleStacks::left_out`]), for the line that says so.

use crate::output::blame::is_blame_function;
use crate::stacks::{StackId, StackTable};
use pyfleet_actors::SampledThread;
use rustc_hash::FxHashMap;

/// Most stacks whose verdict is remembered; past it they are all judged again.
const MAX_JUDGED: usize = 1 << 16;

/// The verdicts on one process's stacks.
#[derive(Default)]
pub struct IdleStacks {
    waits: FxHashMap<StackId, bool>,
    task_waits: FxHashMap<StackId, bool>,
    left_out: u64,
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
                self.left_out += u64::from(out.swap_remove(i).samples);
            } else {
                i += 1;
            }
        }
    }

    /// Removes from `out[from..]`, the samples of waiting asyncio tasks, those of tasks that
    /// wait for work.
    pub fn leave_out_tasks(
        &mut self,
        table: &StackTable,
        out: &mut Vec<SampledThread>,
        from: usize,
    ) {
        let mut i = from;
        while i < out.len() {
            let idle = u32::try_from(out[i].stack).is_ok_and(|stack| {
                judged(&mut self.task_waits, stack, || {
                    table.resolve(stack).is_some_and(|frames| {
                        // A ready idle task is still idle: its blame frame is not its code.
                        pyfleet_policies::task_waits_for_work(
                            frames
                                .filter(|f| !is_blame_function(&f.function.name))
                                .map(|f| (&*f.function.filename, &*f.function.name)),
                        )
                    })
                })
            });
            if idle {
                self.left_out += u64::from(out.swap_remove(i).samples);
            } else {
                i += 1;
            }
        }
    }

    /// Samples left out so far.
    pub fn left_out(&self) -> u64 {
        self.left_out
    }

    fn waits(&mut self, table: &StackTable, stack: StackId) -> bool {
        judged(&mut self.waits, stack, || {
            table
                .resolve(stack)
                .and_then(|mut frames| frames.next())
                .is_some_and(|f| {
                    pyfleet_policies::waits_for_work(&f.function.filename, &f.function.name)
                })
        })
    }
}

/// The verdict on `stack` in `verdicts`, judged by `judge` when not there (the whole map
/// forgotten once it holds [`MAX_JUDGED`]).
fn judged(
    verdicts: &mut FxHashMap<StackId, bool>,
    stack: StackId,
    judge: impl FnOnce() -> bool,
) -> bool {
    if let Some(&w) = verdicts.get(&stack) {
        return w;
    }
    if verdicts.len() >= MAX_JUDGED {
        verdicts.clear();
    }
    let w = judge();
    verdicts.insert(stack, w);
    w
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
        let mut idle = IdleStacks::default();
        idle.leave_out(&table, &mut out, 1);
        let mut kept: Vec<u64> = out.iter().map(|t| t.tid).collect();
        kept.sort();
        assert_eq!(kept, [2, 3, 9]);
        assert_eq!(idle.left_out(), 1);
    }

    #[test]
    fn waiting_tasks_awaiting_work_are_left_out_and_counted() {
        let mut table = StackTable::new();
        let handler = function(&mut table, "orders", "/srv/app.py");
        let get = function(&mut table, "get", "/usr/lib/python3.14/asyncio/queues.py");
        let sleep = function(&mut table, "sleep", "/usr/lib/python3.14/asyncio/tasks.py");
        let consuming = u64::from(table.stack(&[get, handler]));
        let sleeping = u64::from(table.stack(&[sleep, handler]));
        let task = |tid, stack, samples| SampledThread {
            tid,
            status: ThreadStatus::default(),
            stack,
            samples,
        };
        let mut out = vec![
            task(1, consuming, 1),
            task(2, consuming, 3),
            task(3, sleeping, 2),
        ];
        let mut idle = IdleStacks::default();
        idle.leave_out_tasks(&table, &mut out, 1);
        let kept: Vec<u64> = out.iter().map(|t| t.tid).collect();
        assert_eq!(
            kept,
            [1, 3],
            "before `from` stays; a request's own sleep stays"
        );
        assert_eq!(idle.left_out(), 3, "samples, not entries");
    }
}
