//! `pyfleet dump`: every interpreter, thread and frame of one process, as text or JSON.

use super::for_terminal;
use crate::cpython::locals::FrameLocals;
use crate::cpython::{Frame, InterpreterStacks, InterpreterTasks, Version};
use serde::Serialize;
use std::fmt::Write;

/// What a dump shows about the process besides its stacks.
pub struct DumpHeader<'a> {
    pub pid: i32,
    pub version: Version,
    pub binary: &'a str,
    pub cmdline: &'a str,
}

#[derive(Serialize)]
struct JsonDump<'a> {
    pid: i32,
    python_version: String,
    interpreters: Vec<JsonInterpreter<'a>>,
}

#[derive(Serialize)]
struct JsonInterpreter<'a> {
    id: i64,
    threads: Vec<JsonThread<'a>>,
    /// With `--async` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<JsonTask<'a>>>,
}

#[derive(Serialize)]
struct JsonTask<'a> {
    id: u64,
    name: &'a str,
    thread_id: Option<u64>,
    state: &'static str,
    frames: Vec<JsonFrame<'a>>,
    awaited_by: &'a [u64],
}

#[derive(Serialize)]
struct JsonThread<'a> {
    thread_id: u64,
    native_thread_id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace_thread_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    os_name: Option<&'a str>,
    holds_gil: bool,
    on_cpu: bool,
    frames: Vec<JsonFrame<'a>>,
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    function: &'a str,
    qualname: &'a str,
    file: &'a str,
    line: Option<i32>,
    /// With `--locals`: the frame's variables, or why they are not shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    locals: Option<Vec<JsonLocal<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    locals_not_read: Option<String>,
}

#[derive(Serialize)]
struct JsonLocal<'a> {
    name: &'a str,
    value: &'a str,
}

/// The dump as one JSON object (the format documented in docs/reference.md); `tasks`: each
/// interpreter's asyncio tasks, with `--async`.
pub fn to_json(
    h: &DumpHeader<'_>,
    interps: &[InterpreterStacks],
    tasks: Option<&[InterpreterTasks]>,
) -> String {
    let doc = JsonDump {
        pid: h.pid,
        python_version: h.version.to_string(),
        interpreters: interps
            .iter()
            .map(|i| JsonInterpreter {
                id: i.id,
                threads: i
                    .threads
                    .iter()
                    .map(|t| JsonThread {
                        thread_id: t.thread_id,
                        native_thread_id: t.native_thread_id,
                        namespace_thread_id: t.namespace_thread_id,
                        name: t.name.as_deref(),
                        os_name: t.os_name.as_deref(),
                        holds_gil: t.holds_gil,
                        on_cpu: t.on_cpu,
                        frames: json_frames(&t.frames, t.locals.as_deref()),
                    })
                    .collect(),
                tasks: tasks.map(|all| {
                    tasks_of(all, i.id)
                        .iter()
                        .map(|t| JsonTask {
                            id: t.id,
                            name: &t.name,
                            thread_id: t.thread_id,
                            state: task_state(t),
                            frames: json_frames(&t.frames, None),
                            awaited_by: &t.awaited_by,
                        })
                        .collect()
                }),
            })
            .collect(),
    };
    // Serialising plain structs of strings and numbers cannot fail.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

fn json_frames<'a>(frames: &'a [Frame], locals: Option<&'a [FrameLocals]>) -> Vec<JsonFrame<'a>> {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let l = locals.and_then(|l| l.get(i));
            JsonFrame {
                function: &f.function.name,
                qualname: &f.function.qualname,
                file: &f.function.filename,
                line: f.line,
                locals: match l {
                    Some(FrameLocals::Read(vars)) => Some(
                        vars.iter()
                            .map(|v| JsonLocal {
                                name: &v.name,
                                value: &v.value,
                            })
                            .collect(),
                    ),
                    _ => None,
                },
                locals_not_read: l.and_then(not_read),
            }
        })
        .collect()
}

/// Why a frame's locals are not shown, if they are not.
fn not_read(l: &FrameLocals) -> Option<String> {
    match l {
        FrameLocals::Read(_) => None,
        FrameLocals::Gone => Some("the frame returned before its locals were read".into()),
        FrameLocals::Unreadable(why) => Some(why.clone()),
    }
}

/// The tasks of interpreter `id` (none when it has no entry).
fn tasks_of(all: &[InterpreterTasks], id: i64) -> &[crate::cpython::Task] {
    all.iter()
        .find(|t| t.id == id)
        .map(|t| t.tasks.as_slice())
        .unwrap_or_default()
}

/// The dump as text for a person at a terminal; `tasks` as for [`to_json`].
pub fn to_text(
    h: &DumpHeader<'_>,
    interps: &[InterpreterStacks],
    tasks: Option<&[InterpreterTasks]>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Process {}: {}", h.pid, for_terminal(h.cmdline));
    let _ = writeln!(s, "Python {} ({})", h.version, for_terminal(h.binary));
    for i in interps {
        let _ = writeln!(
            s,
            "\nInterpreter {}{}",
            i.id,
            if i.id == 0 { " (main)" } else { "" }
        );
        if i.threads.is_empty() {
            let _ = writeln!(s, "  (no thread running Python code)");
        }
        for t in &i.threads {
            let mut status = Vec::new();
            if t.on_cpu {
                status.push("on CPU");
            }
            if t.holds_gil {
                status.push("holds GIL");
            }
            if status.is_empty() {
                status.push("idle");
            }
            let ns = t
                .namespace_thread_id
                .map(|n| format!(", {n} in its namespace"))
                .unwrap_or_default();
            // The threading module's name, and the kernel's where it says something else.
            let name = t
                .name
                .as_deref()
                .map(|n| format!(" \"{}\"", for_terminal(n)))
                .unwrap_or_default();
            let os_name = t
                .os_name
                .as_deref()
                .filter(|os| t.name.as_deref() != Some(*os))
                .map(|n| format!(", named \"{}\" by the kernel", for_terminal(n)))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  Thread {}{name} (native {}{ns}{os_name}) [{}]",
                t.thread_id,
                t.native_thread_id,
                status.join(", ")
            );
            text_frames(&mut s, &t.frames, t.locals.as_deref());
        }
        if let Some(all) = tasks {
            text_tasks(&mut s, tasks_of(all, i.id));
        }
    }
    s
}

fn text_frames(s: &mut String, frames: &[Frame], locals: Option<&[FrameLocals]>) {
    for (i, f) in frames.iter().enumerate() {
        let line = f.line.map_or("?".to_string(), |l| l.to_string());
        let _ = writeln!(
            s,
            "    {} ({}:{})",
            for_terminal(&f.function.qualname),
            for_terminal(&f.function.filename),
            line
        );
        match locals.and_then(|l| l.get(i)) {
            Some(FrameLocals::Read(vars)) => {
                for v in vars {
                    let _ = writeln!(
                        s,
                        "        {} = {}",
                        for_terminal(&v.name),
                        for_terminal(&v.value)
                    );
                }
            }
            Some(other) => {
                let why = not_read(other).unwrap_or_default();
                let _ = writeln!(s, "        (locals not shown: {})", for_terminal(&why));
            }
            None => {}
        }
    }
}

/// A task's state as the dump names it: running, ready (pending, its loop will resume it
/// once it gets to it) or pending.
fn task_state(t: &crate::cpython::Task) -> &'static str {
    match (t.running, t.ready) {
        (true, _) => "running",
        (false, true) => "ready, waiting for the loop",
        (false, false) => "pending",
    }
}

/// Each task with its frames and the tasks awaiting it (by name and id).
fn text_tasks(s: &mut String, tasks: &[crate::cpython::Task]) {
    let _ = writeln!(s, "  asyncio tasks:");
    if tasks.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for t in tasks {
        let thread = t.thread_id.map_or("a thread that ended".to_string(), |id| {
            format!("thread {id}")
        });
        let state = task_state(t);
        let _ = writeln!(
            s,
            "  Task \"{}\" ({:#x}, {thread}) [{state}]",
            for_terminal(&t.name),
            t.id
        );
        text_frames(s, &t.frames, None);
        if !t.awaited_by.is_empty() {
            let names: Vec<String> = t
                .awaited_by
                .iter()
                .map(|id| match tasks.iter().find(|o| o.id == *id) {
                    Some(o) => format!("\"{}\" ({id:#x})", for_terminal(&o.name)),
                    None => format!("{id:#x}"),
                })
                .collect();
            let _ = writeln!(s, "    awaited by {}", names.join(", "));
        }
    }
}
