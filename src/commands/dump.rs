//! `pyfleet dump`: every thread's stack of one process, once, as text or JSON.

use anyhow::{Context, Result};
use pyfleet::cpython;
use pyfleet::cpython::locals::{FrameLocals, LocalsReader};
use pyfleet::output::dump::{self, DumpHeader};
use pyfleet::process::Process;

/// Reads of a running process tried before `dump` reports the failure.
const DUMP_ATTEMPTS: u32 = 10;

/// `tasks`: also every asyncio task (`--async`, 3.14+), and `locals`: each frame's local
/// variables (`--locals`), each read right after the stacks (in the same pause when
/// blocking).
pub fn run(pid: i32, json: bool, blocking: bool, tasks: bool, locals: bool) -> Result<()> {
    // A dump is one sample: it needs no frame cache, and must not write to the target.
    let opts = cpython::UnwinderOptions {
        frame_cache: false,
        read_only: true,
        cpu_status: true,
        blocking,
        ..Default::default()
    };
    let mut unwinder = cpython::attach(pid, opts)?;
    // The task layout, when asked: `None` inside when the target has not loaded `_asyncio`
    // (it has no task).
    let mut task_layout = match tasks {
        true => Some(cpython::asyncio::locate(
            &Process::new(pid)?,
            unwinder.memory(),
            unwinder.layout(),
        )?),
        false => None,
    };
    // A process that runs changes its stacks while they are read; a torn read (a frame freed
    // mid-walk) is worth a few immediate retries before it is reported. An exited process is
    // not.
    let mut attempt = 0;
    let (mut stacks, (tasks, frame_locals)) = loop {
        attempt += 1;
        let read = unwinder.snapshot_then(|u| {
            let tasks = match &mut task_layout {
                Some(Some(layouts)) => Some(u.tasks(layouts)?),
                Some(None) => Some(Vec::new()),
                None => None,
            };
            Ok((tasks, locals.then(|| read_locals(u))))
        });
        match read {
            Ok(read) => break read,
            Err(e) if !e.is_process_gone() && attempt < DUMP_ATTEMPTS => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading the stacks of process {pid} failed"))
            }
        }
    };
    // Names are read after the stacks: a thread that started or ended between has none.
    let names = unwinder.threading_names().unwrap_or_default();
    for i in stacks.iter_mut() {
        for t in i.threads.iter_mut() {
            t.name = names.get(&t.thread_id).cloned();
            t.os_name = pyfleet::process::thread_name(pid, t.native_thread_id);
            t.locals = frame_locals.as_ref().map(|all| {
                all.iter()
                    .find(|(id, thread, _)| *id == i.id && *thread == t.thread_id)
                    .map(|(_, _, frames)| frames.clone())
                    // A thread whose frames were not all read: none shown rather than
                    // locals put against the wrong frames.
                    .filter(|frames| frames.len() == t.frames.len())
                    .unwrap_or_default()
            });
        }
    }
    let cmdline = Process::new(pid)
        .and_then(|p| p.cmdline())
        .map(|c| c.join(" "))
        .unwrap_or_default();
    let binary = unwinder.binary().display().to_string();
    let header = DumpHeader {
        pid,
        version: unwinder.layout().version,
        binary: &binary,
        cmdline: &cmdline,
    };
    let out = if json {
        dump::to_json(&header, &stacks, tasks.as_deref())
    } else {
        dump::to_text(&header, &stacks, tasks.as_deref())
    };
    outln!("{out}");
    Ok(())
}

/// Each sampled thread's frames' locals: (interpreter id, thread id, one per frame). A frame
/// whose locals cannot be read shows why instead (a failure is the frame's, not the dump's).
fn read_locals(
    u: &cpython::Unwinder<pyfleet::memory::ProcessMemory>,
) -> Vec<(i64, u64, Vec<FrameLocals>)> {
    let reader = LocalsReader::new(u.memory(), u.layout(), u.builtin_types());
    u.sampled_frames()
        .into_iter()
        .map(|t| {
            let frames = t
                .frames
                .iter()
                .map(|&(frame, code)| {
                    reader
                        .frame_locals(frame, code)
                        .unwrap_or_else(|e| FrameLocals::Unreadable(e.to_string()))
                })
                .collect();
            (t.interpreter_id, t.thread_id, frames)
        })
        .collect()
}
