//! speedscope's JSON file format (the one speedscope.app loads, described by its published
//! `file-format-schema.json`): one `sampled` profile per process, named as its folded root,
//! whose samples are stacks of indices into one shared frame table (root first), weighted by
//! their counts (unit `none`: the weights are sample counts, the same numbers as the folded
//! output's).
//!
//! Owns the mapping of a [`Snapshot`] onto that format. Frames are `function` with `file` and
//! `line` (when the instruction has one); statuses are merged as in the folded output, and
//! stacks without a Python frame are left out as there. Target strings are untrusted: serde_json
//! escapes them. Must not do I/O.

use super::folded::process_root;
use super::render_context::RenderContext;
use pyfleet_actors::{FrameInfo, Snapshot};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The `$schema` value speedscope recognises its files by.
pub const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<Profile>,
    name: &'a str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<Frame<'a>>,
}

#[derive(Serialize)]
struct Frame<'a> {
    name: &'a str,
    file: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<i32>,
}

#[derive(Serialize)]
struct Profile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// Renders the snapshot as a speedscope file.
pub fn render(snap: &Snapshot, ctx: &RenderContext) -> Result<Vec<u8>, String> {
    let mut frames: Vec<Frame<'_>> = Vec::new();
    let mut index: HashMap<&FrameInfo, usize> = HashMap::new();
    let mut profiles = Vec::with_capacity(snap.processes.len());
    for p in &snap.processes {
        let mut stacks: BTreeMap<Vec<usize>, u64> = BTreeMap::new();
        for (_, stack, count) in &p.samples {
            if stack.is_empty() || *count == 0 {
                continue;
            }
            // Innermost first in the snapshot; speedscope wants the root first.
            let ids: Vec<usize> = stack
                .iter()
                .rev()
                .map(|f| {
                    *index.entry(f).or_insert_with(|| {
                        frames.push(Frame {
                            name: &f.function,
                            file: &f.file,
                            line: f.line,
                        });
                        frames.len() - 1
                    })
                })
                .collect();
            *stacks.entry(ids).or_default() += count;
        }
        let total: u64 = stacks.values().sum();
        let (samples, weights) = stacks.into_iter().unzip();
        profiles.push(Profile {
            kind: "sampled",
            name: process_root(p),
            unit: "none",
            start_value: 0,
            end_value: total,
            samples,
            weights,
        });
    }
    // The process with the most samples opens first.
    let active_profile_index = profiles
        .iter()
        .enumerate()
        .max_by_key(|(i, p)| (p.end_value, std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let name = format!("{} ({})", ctx.title, ctx.describe());
    let file = File {
        schema: SCHEMA_URL,
        shared: Shared { frames },
        profiles,
        name: &name,
        active_profile_index,
        exporter: format!("pyfleet {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_vec(&file).map_err(|e| format!("rendering speedscope JSON failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::{ProcessProfile, ThreadStatus};
    use std::time::UNIX_EPOCH;

    #[test]
    fn one_profile_per_process_with_shared_frames() {
        let gil = ThreadStatus {
            on_cpu: false,
            holds_gil: true,
            waits_gil: false,
        };
        let leaf = FrameInfo::new("leaf\"</script>\n", "/a.py", Some(3));
        let main = FrameInfo::new("main", "/a.py", None);
        let snap = Snapshot {
            started_at: UNIX_EPOCH,
            taken_at: UNIX_EPOCH,
            processes: vec![
                ProcessProfile {
                    pid: 7,
                    name: "app".into(),
                    role: pyfleet_policies::Role::Single,
                    labels: Default::default(),
                    samples: vec![
                        (gil, vec![leaf.clone(), main.clone()].into(), 2),
                        (
                            ThreadStatus::default(),
                            vec![leaf.clone(), main.clone()].into(),
                            3,
                        ),
                        (gil, vec![main.clone()].into(), 1),
                        (gil, vec![].into(), 9),
                    ],
                    sampled: std::time::Duration::ZERO,
                },
                ProcessProfile {
                    pid: 8,
                    name: "idle".into(),
                    role: pyfleet_policies::Role::Single,
                    labels: Default::default(),
                    samples: vec![],
                    sampled: std::time::Duration::ZERO,
                },
            ],
        };
        let bytes = render(&snap, &RenderContext::default()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["$schema"], SCHEMA_URL);
        let frames = v["shared"]["frames"].as_array().unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0]["name"], "main");
        assert!(frames[0].get("line").is_none());
        assert_eq!(frames[1]["name"], "leaf\"</script>\n");
        assert_eq!(frames[1]["line"], 3);
        let p = &v["profiles"][0];
        assert_eq!(p["name"], "app-7");
        assert_eq!(p["type"], "sampled");
        assert_eq!(p["samples"], serde_json::json!([[0], [0, 1]]));
        assert_eq!(p["weights"], serde_json::json!([1, 5]));
        assert_eq!(p["endValue"], 6);
        assert_eq!(v["profiles"][1]["samples"], serde_json::json!([]));
        assert_eq!(v["activeProfileIndex"], 0);
    }
}
