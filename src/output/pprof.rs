//! pprof's profile format (google/pprof `proto/profile.proto`), gzipped, as `go tool pprof`,
//! Grafana Pyroscope and Parca read it.
//!
//! The messages below are the subset of profile.proto that pyfleet writes, declared by hand
//! with prost's derive (field numbers as in profile.proto; no code generation). A profile
//! holds:
//! - sample types: `samples`/`count` first (the default), then, when the rate is known,
//!   `<mode>`/`nanoseconds` (`wall`, `cpu` or `gil`: count times the period its process's
//!   samples were taken at over the window; the profile's period is the window's);
//! - one `Function` per (function, file) and one `Location` per (function, line), each with
//!   one `Line`; no mappings (Python frames have no binary addresses);
//! - one `Sample` per (process, status, stack), leaf first, with the labels `process` (name),
//!   `pid` (number) and `thread_status`: `holds_gil`, `waits_gil` (off its CPU, waiting to
//!   take the GIL) or `no_gil`, prefixed with `on_cpu+` when the thread was seen on CPU
//!   (which pyfleet looks at only in `cpu` mode), then the
//!   process's labels (`service`, `namespace`, `pod`, `pod_uid`, `container_id`, those it has),
//!   and with `--async` `task`: the task whose frames are innermost. The frames naming tasks
//!   are left out of the locations unless the context keeps them (`--group-by task`), so
//!   that the same code run by many tasks is one stack, told apart by the label.
//!
//! Stacks without a Python frame are left out, as in the folded output, so both hold the same
//! counts. Target strings are untrusted but protobuf strings are length-delimited: nothing to
//! escape. Must not do I/O beyond the in-memory gzip.

use super::render_context::RenderContext;
use super::views::TaskFrames;
use flate2::write::GzEncoder;
use prost::Message;
use pyfleet_actors::{FrameInfo, Labels, ProcessProfile, Snapshot, ThreadStatus};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `perftools.profiles.Profile` (the fields pyfleet writes).
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// `string_table[0]` is always "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: indices into the string table.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: locations leaf first, one value per sample type.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`: `str` or `num` (string-table indices for `key`, `str`, `num_unit`).
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `Location`: ids start at 1.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`: line 0 when the instruction has none.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`: ids start at 1.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The string table being built.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The `thread_status` label's value.
pub fn thread_status(s: ThreadStatus) -> &'static str {
    match (s.on_cpu, s.holds_gil) {
        (true, true) => "on_cpu+holds_gil",
        (true, false) => "on_cpu+no_gil",
        (false, true) => "holds_gil",
        (false, false) if s.waits_gil => "waits_gil",
        (false, false) => "no_gil",
    }
}

/// Builds the profile (not yet encoded).
pub fn build(snap: &Snapshot, ctx: &RenderContext) -> Profile {
    let ctx = &ctx.for_snapshot(snap);
    let mut strings = Strings::new();
    let samples_type = ValueType {
        r#type: strings.get("samples"),
        unit: strings.get("count"),
    };
    let mut sample_type = vec![samples_type.clone()];
    let period_ns = ctx
        .rate_hz
        .filter(|hz| hz.is_finite() && *hz > 0.0)
        .map(|hz| (1e9 / hz).round() as i64)
        .filter(|p| *p > 0);
    let time_type = period_ns.map(|_| ValueType {
        r#type: strings.get(ctx.mode.as_str()),
        unit: strings.get("nanoseconds"),
    });
    if let Some(t) = &time_type {
        sample_type.push(t.clone());
    }
    let (k_process, k_pid, k_status) = (
        strings.get("process"),
        strings.get("pid"),
        strings.get("thread_status"),
    );

    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<(&str, &str), u64> = HashMap::new();
    let mut locations: Vec<Location> = Vec::new();
    let mut location_ids: HashMap<(u64, i64), u64> = HashMap::new();
    // (process index, status, locations, task label) -> count, in first-seen order.
    let mut sample_ids: HashMap<(usize, ThreadStatus, Vec<u64>, i64), usize> = HashMap::new();
    // ((process index, status), locations, count, string of the `task` label or 0).
    type Counted = ((usize, ThreadStatus), Vec<u64>, u64, i64);
    let mut samples: Vec<Counted> = Vec::new();

    for (pi, p) in snap.processes.iter().enumerate() {
        for (status, frames, count) in &p.samples {
            if frames.is_empty() || *count == 0 {
                continue;
            }
            let mut locs = Vec::with_capacity(frames.len());
            // The frames naming tasks only as the context asks: the task is a label.
            let shown = frames
                .iter()
                .filter(|f| ctx.tasks == TaskFrames::Kept || !super::views::is_task_frame(f));
            for f in shown {
                let fid = *function_ids
                    .entry((&*f.function, &*f.file))
                    .or_insert_with(|| {
                        let name = strings.get(&f.function);
                        let id = functions.len() as u64 + 1;
                        // No system name: pprof readers would "demangle" a name equal
                        // to it (`<module>` simplified to nothing).
                        functions.push(Function {
                            id,
                            name,
                            system_name: 0,
                            filename: strings.get(&f.file),
                            start_line: 0,
                        });
                        id
                    });
                let line = i64::from(f.line.unwrap_or(0));
                let lid = *location_ids.entry((fid, line)).or_insert_with(|| {
                    let id = locations.len() as u64 + 1;
                    locations.push(Location {
                        id,
                        mapping_id: 0,
                        address: 0,
                        line: vec![Line {
                            function_id: fid,
                            line,
                        }],
                    });
                    id
                });
                locs.push(lid);
            }
            // Samples of different tasks stay apart, whatever frames are shown.
            let task = frames
                .iter()
                .find_map(|f| crate::cpython::named_task(&f.function, &f.file))
                .map_or(0, |t| strings.get(t));
            let key = (pi, *status, locs, task);
            match sample_ids.get(&key) {
                Some(&i) => samples[i].2 += count,
                None => {
                    sample_ids.insert(key.clone(), samples.len());
                    samples.push(((key.0, key.1), key.2, *count, key.3));
                }
            }
        }
    }

    // The time one sample of each process stands for: its own rate over the window, else the
    // window's.
    let process_period_ns: Vec<Option<f64>> = snap
        .processes
        .iter()
        .map(|p| match p.rate_hz() {
            Some(hz) if period_ns.is_some() => Some(1e9 / hz),
            _ => period_ns.map(|p| p as f64),
        })
        .collect();
    let mut process_labels: Vec<(i64, i64, Vec<Label>)> = Vec::with_capacity(snap.processes.len());
    for p in &snap.processes {
        let labels = p
            .labels
            .iter()
            .map(|(k, v)| Label {
                key: strings.get(k),
                str: strings.get(v),
                ..Default::default()
            })
            .collect();
        process_labels.push((strings.get(&p.name), i64::from(p.pid), labels));
    }
    let sample = samples
        .into_iter()
        .map(|((pi, status), location_id, count, task)| {
            let mut value = vec![i64::try_from(count).unwrap_or(i64::MAX)];
            if let Some(Some(each)) = process_period_ns.get(pi) {
                // Saturates at i64::MAX (`as` from f64).
                value.push((count as f64 * each).round() as i64);
            }
            let (name, pid, extra) = process_labels
                .get(pi)
                .map_or((0, 0, &[][..]), |(n, p, l)| (*n, *p, &l[..]));
            let mut label = vec![
                Label {
                    key: k_process,
                    str: name,
                    ..Default::default()
                },
                Label {
                    key: k_pid,
                    num: pid,
                    ..Default::default()
                },
                Label {
                    key: k_status,
                    str: strings.get(thread_status(status)),
                    ..Default::default()
                },
            ];
            label.extend_from_slice(extra);
            if task != 0 {
                label.push(Label {
                    key: strings.get("task"),
                    str: task,
                    ..Default::default()
                });
            }
            Sample {
                location_id,
                value,
                label,
            }
        })
        .collect();

    let duration_nanos = ctx
        .duration
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let end_nanos = snap
        .taken_at
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let comment = vec![strings.get(&ctx.title), strings.get(&ctx.describe())];
    Profile {
        sample_type,
        sample,
        location: locations,
        function: functions,
        time_nanos: end_nanos.saturating_sub(duration_nanos),
        duration_nanos,
        period_type: time_type,
        period: period_ns.unwrap_or(0),
        comment,
        default_sample_type: samples_type.r#type,
        string_table: strings.table,
    }
}

/// Renders the snapshot as a gzipped pprof profile.
pub fn render(snap: &Snapshot, ctx: &RenderContext) -> Result<Vec<u8>, String> {
    let raw = build(snap, ctx).encode_to_vec();
    let mut gz = GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        flate2::Compression::default(),
    );
    gz.write_all(&raw)
        .and_then(|()| gz.finish())
        .map_err(|e| format!("compressing the pprof profile failed: {e}"))
}

/// Reads a profile back (gzipped or not); for tests and tools.
pub fn decode(bytes: &[u8]) -> Result<Profile, String> {
    use std::io::Read;
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| format!("not gzip: {e}"))?;
        out
    } else {
        bytes.to_vec()
    };
    Profile::decode(raw.as_slice()).map_err(|e| format!("not a pprof profile: {e}"))
}

/// A profile read back as a snapshot (what `pyfleet top --connect` pulls, `diff`'s pprof
/// inputs): each sample under the process its `pid` and `process` labels name (pid 0 without
/// one), its status from `thread_status`, its first value as its count, its second (a time
/// in nanoseconds, when the profile has one) added to the time its process's samples stand
/// for, its frames from its locations' lines, innermost first. `took`: the window's length,
/// ending now.
pub fn snapshot(p: &Profile, took: Duration) -> Snapshot {
    let string = |i: i64| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map_or("", String::as_str)
    };
    let functions: HashMap<u64, &Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let locations: HashMap<u64, &Location> = p.location.iter().map(|l| (l.id, l)).collect();
    let timed = p
        .sample_type
        .get(1)
        .is_some_and(|t| string(t.unit) == "nanoseconds");
    let mut processes: BTreeMap<i32, ProcessProfile> = BTreeMap::new();
    for s in &p.sample {
        let Some(count) = s.value.first().and_then(|&v| u64::try_from(v).ok()) else {
            continue;
        };
        let ns = match timed {
            true => s
                .value
                .get(1)
                .and_then(|&v| u64::try_from(v).ok())
                .unwrap_or(0),
            false => 0,
        };
        let (mut pid, mut name, mut status) = (0i32, "", ThreadStatus::default());
        for l in &s.label {
            match string(l.key) {
                "pid" => pid = i32::try_from(l.num).unwrap_or(0),
                "process" => name = string(l.str),
                "thread_status" => {
                    let v = string(l.str);
                    status.on_cpu = v.starts_with("on_cpu+");
                    status.holds_gil = v.ends_with("holds_gil");
                    status.waits_gil = v.ends_with("waits_gil");
                }
                _ => {}
            }
        }
        // Leaf first, in pprof and in a snapshot alike; a location's lines innermost first.
        let frames: Vec<FrameInfo> = s
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .flat_map(|loc| loc.line.iter())
            .filter_map(|line| {
                let f = functions.get(&line.function_id)?;
                Some(FrameInfo::new(
                    string(f.name),
                    string(f.filename),
                    i32::try_from(line.line).ok().filter(|&l| l > 0),
                ))
            })
            .collect();
        let process = processes.entry(pid).or_insert_with(|| ProcessProfile {
            pid,
            name: name.to_string(),
            role: pyfleet_policies::Role::Single,
            labels: Labels::default(),
            samples: Vec::new(),
            sampled: Duration::ZERO,
        });
        process.samples.push((status, frames.into(), count));
        process.sampled = process.sampled.saturating_add(Duration::from_nanos(ns));
    }
    let now = SystemTime::now();
    Snapshot {
        started_at: now.checked_sub(took).unwrap_or(now),
        taken_at: now,
        processes: processes.into_values().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyfleet_actors::{FrameInfo, ProcessProfile};
    use pyfleet_policies::Mode;
    use std::time::Duration;

    #[test]
    fn a_task_stack_is_labelled_with_its_innermost_task() {
        let status = ThreadStatus::default();
        let task = |name: &str| FrameInfo::new(name, crate::cpython::TASK_FILE, None);
        let frames = vec![
            FrameInfo::new("handler", "/app.py", Some(3)),
            task("task child-1 (awaited by 2)"),
            FrameInfo::new("parent", "/app.py", Some(9)),
            task("task root"),
        ];
        let snap = crate::output::views::one_process(vec![
            (status, frames.into(), 2),
            (
                status,
                vec![FrameInfo::new("loop", "/a.py", Some(1))].into(),
                1,
            ),
        ]);
        let p = decode(&render(&snap, &RenderContext::default()).unwrap()).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let tasks: Vec<Option<&str>> = p
            .sample
            .iter()
            .map(|x| {
                x.label
                    .iter()
                    .find(|l| s(l.key) == "task")
                    .map(|l| s(l.str))
            })
            .collect();
        assert_eq!(tasks, [Some("child-1"), None]);
    }

    #[test]
    fn round_trip_with_labels_and_time() {
        let gil = ThreadStatus {
            on_cpu: true,
            holds_gil: true,
            waits_gil: false,
        };
        let leaf = FrameInfo::new("leaf\u{0}\n", "/ü.py", Some(3));
        let main = FrameInfo::new("main", "/a.py", None);
        let snap = Snapshot {
            started_at: UNIX_EPOCH + Duration::from_secs(90),
            taken_at: UNIX_EPOCH + Duration::from_secs(100),
            processes: vec![
                ProcessProfile {
                    pid: 7,
                    name: "app".into(),
                    role: pyfleet_policies::Role::Single,
                    labels: {
                        let mut l = pyfleet_actors::Labels::default();
                        l.set("service", "checkout".into());
                        l
                    },
                    samples: vec![
                        (gil, vec![leaf.clone(), main.clone()].into(), 2),
                        (
                            ThreadStatus::default(),
                            vec![leaf.clone(), main.clone()].into(),
                            3,
                        ),
                        (gil, vec![].into(), 9),
                    ],
                    sampled: std::time::Duration::ZERO,
                },
                ProcessProfile {
                    pid: 8,
                    name: "other".into(),
                    role: pyfleet_policies::Role::Single,
                    labels: Default::default(),
                    samples: vec![(gil, vec![main.clone()].into(), 4)],
                    sampled: std::time::Duration::ZERO,
                },
            ],
        };
        let ctx = RenderContext {
            rate_hz: Some(100.0),
            mode: Mode::Cpu,
            duration: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let bytes = render(&snap, &ctx).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzipped");
        let p = decode(&bytes).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, vec![("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(s(p.default_sample_type), "samples");
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.time_nanos, 90_000_000_000);
        assert_eq!(p.sample.len(), 3);
        let total: i64 = p.sample.iter().map(|x| x.value[0]).sum();
        assert_eq!(total, 9);
        let first = &p.sample[0];
        assert_eq!(first.value, vec![2, 20_000_000]);
        // Leaf first: the leaf's location names the leaf function, with its line.
        let loc = &p.location[(first.location_id[0] - 1) as usize];
        let f = &p.function[(loc.line[0].function_id - 1) as usize];
        assert_eq!(s(f.name), "leaf\u{0}\n");
        assert_eq!(s(f.filename), "/ü.py");
        assert_eq!(loc.line[0].line, 3);
        let labels: Vec<(&str, String)> = first
            .label
            .iter()
            .map(|l| {
                let v = if l.str != 0 {
                    s(l.str).to_string()
                } else {
                    l.num.to_string()
                };
                (s(l.key), v)
            })
            .collect();
        assert_eq!(
            labels,
            vec![
                ("process", "app".to_string()),
                ("pid", "7".to_string()),
                ("thread_status", "on_cpu+holds_gil".to_string()),
                ("service", "checkout".to_string())
            ]
        );
        // Counts only when the rate is not known.
        let counts = build(&snap, &RenderContext::default());
        assert_eq!(counts.sample_type.len(), 1);
        assert!(counts.sample.iter().all(|x| x.value.len() == 1));
        assert_eq!(counts.period_type, None);
    }

    #[test]
    fn a_daemons_profile_comes_back_as_its_processes_samples() {
        let status = ThreadStatus {
            on_cpu: true,
            holds_gil: false,
            waits_gil: false,
        };
        let snap = crate::output::views::one_process(vec![(
            status,
            vec![
                FrameInfo::new("leaf", "/app.py", Some(3)),
                FrameInfo::new("main", "/app.py", Some(1)),
            ]
            .into(),
            4,
        )]);
        let ctx = RenderContext::default();
        let bytes = render(&snap, &ctx).unwrap();
        let back = snapshot(&decode(&bytes).unwrap(), std::time::Duration::from_secs(1));
        assert_eq!(back.processes.len(), 1);
        let p = &back.processes[0];
        assert_eq!(
            (p.pid, p.name.as_str()),
            (snap.processes[0].pid, snap.processes[0].name.as_str())
        );
        assert_eq!(p.samples.len(), 1);
        let (s, frames, n) = &p.samples[0];
        assert_eq!((*s, *n), (status, 4));
        assert_eq!(&*frames[0].function, "leaf");
        assert_eq!(frames[1].line, Some(1));
    }
}
