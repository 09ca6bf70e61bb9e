//! Brendan Gregg's folded stacks: one line per distinct stack, frames root first separated
//! by `;`, then a space and the count. Frames read `function (file:line)`.
//!
//! Owns the text of a frame and of a folded line. Target strings are untrusted: a `;` would
//! split a frame and a newline would forge a line, so both (and every control character) are
//! replaced here. Must not do I/O: callers write the lines where they go.

use pyfleet_actors::{FrameInfo, ProcessProfile, Snapshot};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Appends one frame's label to `out`, defanged for the folded format.
pub fn push_frame(out: &mut String, f: &FrameInfo) {
    push_clean(out, &f.function);
    out.push_str(" (");
    push_clean(out, &f.file);
    if let Some(line) = f.line {
        let _ = write!(out, ":{line}");
    }
    out.push(')');
}

/// Appends `s` with `;` turned into `,` and control characters into `?`.
pub fn push_clean(out: &mut String, s: &str) {
    for c in s.chars() {
        out.push(match c {
            ';' => ',',
            c if c.is_control() => '?',
            c => c,
        });
    }
}

/// The folded stacks of one process, statuses merged, sorted by stack text (stable output),
/// each with `prefix` as its root frame when given. Stacks without a Python frame are left
/// out (a folded line needs at least one frame).
pub fn process_lines(p: &ProcessProfile, prefix: Option<&str>) -> Vec<(String, u64)> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    let mut line = String::new();
    for (_, frames, count) in &p.samples {
        if frames.is_empty() || *count == 0 {
            continue;
        }
        line.clear();
        if let Some(prefix) = prefix {
            push_clean(&mut line, prefix);
            line.push(';');
        }
        // Frames come innermost first; folded is root first.
        for (i, f) in frames.iter().rev().enumerate() {
            if i > 0 {
                line.push(';');
            }
            push_frame(&mut line, f);
        }
        *merged.entry(line.clone()).or_default() += count;
    }
    merged.into_iter().collect()
}

/// The root frame of a process in fleet-wide stacks and the stem of its snapshot file:
/// `<process>-<pid>`, or `<process>-master-<pid>` / `<process>-worker-<pid>` for a process
/// in a family (a master and its workers sort together and are told apart by name).
pub fn process_root(p: &ProcessProfile) -> String {
    match p.role {
        pyfleet_policies::Role::Single => format!("{}-{}", p.name, p.pid),
        role => format!("{}-{role}-{}", p.name, p.pid),
    }
}

/// The folded stacks of a whole snapshot, each rooted at its process's
/// [`process_root`] frame, sorted (a snapshot's `all.folded`).
pub fn fleet_lines(snap: &Snapshot) -> Vec<(String, u64)> {
    let mut all: BTreeMap<String, u64> = BTreeMap::new();
    for p in &snap.processes {
        for (line, n) in process_lines(p, Some(&process_root(p))) {
            *all.entry(line).or_default() += n;
        }
    }
    all.into_iter().collect()
}

/// Renders lines as the text of a `.folded` file.
pub fn render(lines: &[(String, u64)]) -> String {
    let mut out = String::with_capacity(lines.iter().map(|(l, _)| l.len() + 12).sum());
    for (l, n) in lines {
        let _ = writeln!(out, "{l} {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::ThreadStatus;

    #[test]
    fn root_first_merged_and_defanged() {
        let busy = ThreadStatus {
            on_cpu: true,
            holds_gil: true,
            waits_gil: false,
        };
        let p = ProcessProfile {
            pid: 7,
            name: "app".into(),
            role: pyfleet_policies::Role::Single,
            labels: Default::default(),
            samples: vec![
                (
                    busy,
                    vec![
                        FrameInfo::new("leaf", "/a.py", Some(3)),
                        FrameInfo::new("main", "/a.py", None),
                    ]
                    .into(),
                    2,
                ),
                (
                    ThreadStatus::default(),
                    vec![
                        FrameInfo::new("leaf", "/a.py", Some(3)),
                        FrameInfo::new("main", "/a.py", None),
                    ]
                    .into(),
                    3,
                ),
                (busy, vec![].into(), 9),
                (
                    busy,
                    vec![FrameInfo::new("evil;x\n1 2", "/b;c.py", Some(1))].into(),
                    1,
                ),
            ],
            sampled: std::time::Duration::ZERO,
        };
        let lines = process_lines(&p, None);
        assert_eq!(
            lines,
            vec![
                ("evil,x?1 2 (/b,c.py:1)".to_string(), 1),
                ("main (/a.py);leaf (/a.py:3)".to_string(), 5),
            ]
        );
        let all = process_lines(&p, Some("app-7"));
        assert_eq!(all[1].0, "app-7;main (/a.py);leaf (/a.py:3)");
        let text = render(&lines);
        assert_eq!(text.lines().count(), 2);
        // Every line ends in " <count>" and has no stray separator.
        for l in text.lines() {
            let (stack, n) = l.rsplit_once(' ').unwrap();
            assert!(n.parse::<u64>().is_ok(), "{l}");
            assert!(!stack.is_empty());
        }
    }

    #[test]
    fn a_family_member_is_named_by_its_role() {
        let mut p = ProcessProfile {
            pid: 12,
            name: "gunicorn".into(),
            role: pyfleet_policies::Role::Single,
            labels: Default::default(),
            samples: vec![],
            sampled: std::time::Duration::ZERO,
        };
        assert_eq!(process_root(&p), "gunicorn-12");
        p.role = pyfleet_policies::Role::Master;
        assert_eq!(process_root(&p), "gunicorn-master-12");
        p.role = pyfleet_policies::Role::Worker;
        assert_eq!(process_root(&p), "gunicorn-worker-12");
    }
}
