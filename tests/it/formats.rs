//! The output formats checked with real tools (scripts/setup-format-tools.sh installs them):
//! one fleet daemon run over two real Python targets writes every format into one snapshot
//! (the same `Snapshot` rendered four times), then
//! - Debian's chromium opens `flamegraph.svg` headless and the DOM after inferno's script ran
//!   (`--dump-dom`) shows the profiled functions: a search through the page's own script
//!   (`?s=NAME`) matches them and a wide frame's label, fitted by the script, starts with its
//!   function's name; a function the program never calls is found nowhere;
//! - `go tool pprof -raw` reads `profile.pb.gz` back: the same stacks with the same counts
//!   as `all.folded`, with the process, pid and thread-status labels;
//! - `profile.speedscope.json` validates against speedscope's published file-format schema
//!   (Python's jsonschema; a broken copy must fail) and holds the same stacks and counts as
//!   `all.folded`.

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);
const HOT: &str = "pyfleet_hot_leaf";
const WIDE: &str = "pyfleet_hot_outer";
const ABSENT: &str = "pyfleet_never_called";

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
}

/// A program on PATH that scripts/setup-format-tools.sh installs; None (the test returns) only
/// when it is missing and PYFLEET_ALLOW_MISSING=1.
#[track_caller]
fn format_tool(name: &str) -> Option<PathBuf> {
    tool(name, SETUP_FORMAT_TOOLS)
}

/// speedscope's schema, and the python of the venv with jsonschema, which
/// scripts/setup-format-tools.sh provides; None (the test returns) only when one is missing and
/// PYFLEET_ALLOW_MISSING=1.
#[track_caller]
fn speedscope_validator() -> Option<Validator> {
    let tools = format_tools_dir();
    let schema = provided(
        "speedscope's schema",
        tools.join("speedscope/file-format-schema.json"),
        SETUP_FORMAT_TOOLS,
    );
    let python = provided(
        "jsonschema's venv",
        venvs_dir().join("format-tools/bin/python"),
        SETUP_FORMAT_TOOLS,
    );
    Some(Validator {
        schema: schema?,
        python: python?,
    })
}

/// What validates a speedscope file against its schema.
struct Validator {
    schema: PathBuf,
    python: PathBuf,
}

/// The snapshot directory of one daemon run writing every format, made once per test binary.
fn snapshot() -> &'static Path {
    static SNAP: OnceLock<PathBuf> = OnceLock::new();
    SNAP.get_or_init(|| {
        let py = any_interpreter();
        let token = unique_token("fmt");
        let mut targets: Vec<Proc> = (0..2)
            .map(|i| {
                Proc::python(
                    &py.label,
                    &py.path,
                    "profiled.py",
                    &[format!("ready-{i}-{token}")],
                )
            })
            .collect();
        for (i, t) in targets.iter_mut().enumerate() {
            t.wait_for_file(&format!("ready-{i}-{token}"), READY_TIMEOUT);
        }
        let out = artifacts_dir("formats").join(&token);
        let out_arg = out.display().to_string();
        let mut args = vec![
            "run",
            "--duration",
            "3",
            "--snapshot-format",
            "folded,svg",
            "--snapshot-format",
            "speedscope",
            "--snapshot-format",
            "pprof",
            "--metrics-addr",
            "off",
            "--out",
            &out_arg,
        ];
        let pids: Vec<String> = targets.iter().map(|t| t.pid().to_string()).collect();
        for p in &pids {
            args.extend(["--pid", p.as_str()]);
        }
        let run = pyfleet(&args);
        assert!(run.success(), "{}", run.describe());
        assert!(
            run.stderr
                .contains("snapshots (folded, svg, speedscope, pprof)"),
            "{}",
            run.describe()
        );
        let mut dirs: Vec<PathBuf> = fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        let snap = dirs.pop().expect("no snapshot written");
        for name in [
            "all.folded",
            "flamegraph.svg",
            "profile.speedscope.json",
            "profile.pb.gz",
        ] {
            assert!(
                snap.join(name).is_file(),
                "{name} missing in {}",
                snap.display()
            );
        }
        for p in &pids {
            assert!(
                snap.join(format!("profiled-{p}.folded")).is_file(),
                "no per-process folded file for {p} in {}",
                snap.display()
            );
        }
        snap
    })
}

/// `all.folded` as a map from stack to count.
fn folded_counts(snap: &Path) -> BTreeMap<String, u64> {
    let text = fs::read_to_string(snap.join("all.folded")).unwrap();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').expect("folded line without a count");
        *counts.entry(stack.to_string()).or_default() += n.parse::<u64>().unwrap();
    }
    assert!(!counts.is_empty(), "all.folded is empty");
    assert!(
        counts.keys().any(|s| s.contains(HOT)),
        "{HOT} not in all.folded: {counts:?}"
    );
    counts
}

/// The folded text of one frame, as `output::folded` writes it.
fn frame_text(function: &str, file: &str, line: Option<i64>) -> String {
    match line {
        Some(l) => format!("{function} ({file}:{l})"),
        None => format!("{function} ({file})"),
    }
}

// ---------------------------------------------------------------------------------------------
// SVG in a real browser
// ---------------------------------------------------------------------------------------------

/// One frame of the flamegraph as the page's DOM holds it.
#[derive(Debug, Default)]
struct DomFrame {
    title: String,
    text: String,
    fill: String,
    width_percent: f64,
}

/// The page after its script ran, as Chromium serialises it.
struct Page {
    dom: String,
    frames: Vec<DomFrame>,
    matched: String,
}

fn open_in_chromium(chromium: &Path, svg: &Path, search: &str) -> Page {
    let profile = tempdir("pyfleet-chromium-");
    let url = format!("file://{}?s={search}", svg.display());
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg("--dump-dom")
    .arg(&url);
    let out = run_with_timeout(cmd, TOOL_TIMEOUT);
    assert!(out.success(), "chromium failed: {}", out.describe());
    let dom = out.stdout;
    assert!(
        dom.contains("<svg"),
        "no SVG in the DOM of {url}: {}",
        truncate(&dom, 2000)
    );
    let (frames, matched) = parse_dom(&dom);
    Page {
        dom,
        frames,
        matched,
    }
}

/// The frames (`<g>` with title, rect, text under `<g id="frames">`) and the text of the
/// `matched` element.
fn parse_dom(dom: &str) -> (Vec<DomFrame>, String) {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(dom);
    let mut frames = Vec::new();
    let mut matched = String::new();
    let mut current: Option<DomFrame> = None;
    // Which element's text is being read: "title", "text" or "matched".
    let mut reading: Option<&str> = None;
    loop {
        let event = reader
            .read_event()
            .unwrap_or_else(|e| panic!("the DOM is not well-formed XML: {e}"));
        match event {
            Event::Eof => break,
            Event::Start(e) | Event::Empty(e) => {
                let attr = |name: &str| {
                    e.attributes()
                        .flatten()
                        .find(|a| a.key.as_ref() == name.as_bytes())
                        .map(|a| String::from_utf8_lossy(&a.value).into_owned())
                };
                match e.name().as_ref() {
                    b"g" if attr("id").is_none() && attr("class").is_none_or(|c| c != "hide") => {
                        current = Some(DomFrame::default());
                    }
                    b"title" if current.is_some() => reading = Some("title"),
                    b"text" if attr("id").as_deref() == Some("matched") => {
                        reading = Some("matched")
                    }
                    b"text" if current.is_some() => reading = Some("text"),
                    b"rect" => {
                        if let Some(f) = current.as_mut() {
                            f.fill = attr("fill").unwrap_or_default();
                            f.width_percent = attr("width")
                                .and_then(|w| w.trim_end_matches('%').parse().ok())
                                .unwrap_or(0.0);
                        }
                    }
                    _ => {}
                }
            }
            Event::Text(_) | Event::GeneralRef(_) => {
                let s = match &event {
                    Event::Text(t) => t.decode().map(|c| c.into_owned()).unwrap_or_default(),
                    Event::GeneralRef(r) => match r.resolve_char_ref() {
                        Ok(Some(c)) => c.to_string(),
                        _ => {
                            let name = r.decode().map(|c| c.into_owned()).unwrap_or_default();
                            quick_xml::escape::resolve_predefined_entity(&name)
                                .map(str::to_string)
                                .unwrap_or(format!("&{name};"))
                        }
                    },
                    _ => String::new(),
                };
                match (reading, current.as_mut()) {
                    (Some("title"), Some(f)) => f.title.push_str(&s),
                    (Some("text"), Some(f)) => f.text.push_str(&s),
                    (Some("matched"), _) => matched.push_str(&s),
                    _ => {}
                }
            }
            Event::End(e) => match e.name().as_ref() {
                b"g" => {
                    if let Some(f) = current.take() {
                        if !f.title.is_empty() {
                            frames.push(f);
                        }
                    }
                }
                b"title" | b"text" => reading = None,
                _ => {}
            },
            _ => {}
        }
    }
    (frames, matched)
}

#[test]
fn flamegraph_svg_renders_the_program_in_chromium() {
    let _machine = shared();
    let Some(chromium) = format_tool("chromium") else {
        return;
    };
    let svg = snapshot().join("flamegraph.svg");
    let page = open_in_chromium(&chromium, &svg, HOT);
    let describe = || {
        page.frames
            .iter()
            .map(|f| {
                format!(
                    "{:?} -> {:?} ({}%, {})",
                    f.title, f.text, f.width_percent, f.fill
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(page.frames.len() >= 5, "too few frames:\n{}", describe());
    // inferno's script ran its search over the rendered frames: the result is only ever
    // written by the script, and the matching frames are painted in its search colour.
    let pct: f64 = page
        .matched
        .trim()
        .strip_prefix("Matched: ")
        .and_then(|p| p.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no search result for {HOT}: {:?}\n{}",
                page.matched,
                describe()
            )
        });
    assert!(pct >= 5.0, "{HOT} matched only {pct}%");
    let searched = "rgb(230,0,230)";
    assert!(
        page.frames
            .iter()
            .any(|f| f.title.starts_with(&format!("{HOT} (")) && f.fill == searched),
        "no {HOT} frame painted by the search:\n{}",
        describe()
    );
    // The widest pyfleet_hot_outer frame is labelled with its function's name (the script
    // fitted the label to the frame: the frame's text, not only its tooltip).
    let wide = page
        .frames
        .iter()
        .filter(|f| f.title.starts_with(&format!("{WIDE} (")))
        .max_by(|a, b| a.width_percent.total_cmp(&b.width_percent))
        .unwrap_or_else(|| panic!("no {WIDE} frame:\n{}", describe()));
    assert!(wide.width_percent > 10.0, "{WIDE} is narrow: {wide:?}");
    assert!(
        wide.text.starts_with(WIDE),
        "the wide {WIDE} frame shows {:?}:\n{}",
        wide.text,
        describe()
    );
    // Every process is a root frame of its own.
    assert!(
        page.frames
            .iter()
            .filter(|f| f.text.starts_with("profiled-"))
            .count()
            >= 2,
        "the two processes' root frames are not labelled:\n{}",
        describe()
    );

    // The check can fail: a function the program never calls is found nowhere.
    assert!(!page.dom.contains(ABSENT), "{ABSENT} is in the page");
    let absent = open_in_chromium(&chromium, &svg, ABSENT);
    assert!(
        absent.matched.trim().is_empty(),
        "the search for {ABSENT} matched: {:?}",
        absent.matched
    );
    assert!(absent.frames.iter().all(|f| f.fill != searched));
    assert!(absent
        .frames
        .iter()
        .all(|f| !f.title.contains(ABSENT) && !f.text.contains(ABSENT)));
    assert_eq!(absent.frames.len(), page.frames.len());
}

// ---------------------------------------------------------------------------------------------
// pprof, read by go tool pprof
// ---------------------------------------------------------------------------------------------

/// One sample of `go tool pprof -raw`.
#[derive(Debug)]
struct RawSample {
    values: Vec<u64>,
    locations: Vec<u64>,
    labels: BTreeMap<String, String>,
}

/// Parses `go tool pprof -raw`: sample types, samples (values, location ids leaf first,
/// labels) and locations (id -> folded frame text).
fn parse_pprof_raw(text: &str) -> (String, Vec<RawSample>, BTreeMap<u64, String>) {
    #[derive(PartialEq)]
    enum Part {
        Head,
        Samples,
        Locations,
        Tail,
    }
    let mut part = Part::Head;
    let mut types = String::new();
    let mut samples: Vec<RawSample> = Vec::new();
    let mut locations = BTreeMap::new();
    for line in text.lines() {
        let t = line.trim();
        match t {
            "Samples:" => {
                part = Part::Samples;
                continue;
            }
            "Locations" => {
                part = Part::Locations;
                continue;
            }
            "Mappings" => {
                part = Part::Tail;
                continue;
            }
            _ => {}
        }
        match part {
            Part::Samples if types.is_empty() => types = t.to_string(),
            Part::Samples if t.contains(":[") => {
                // Labels: `key:[value] key:[value]`.
                let s = samples.last_mut().expect("labels before any sample");
                let mut rest = t;
                while let Some(open) = rest.find(":[") {
                    let key = rest[..open].trim().to_string();
                    let after = &rest[open + 2..];
                    let close = after.find(']').expect("unclosed label");
                    s.labels.insert(key, after[..close].to_string());
                    rest = &after[close + 1..];
                }
            }
            Part::Samples if !t.is_empty() => {
                let (values, locs) = t.split_once(':').expect("sample line without ':'");
                samples.push(RawSample {
                    values: values
                        .split_whitespace()
                        .map(|v| v.parse().unwrap())
                        .collect(),
                    locations: locs
                        .split_whitespace()
                        .map(|v| v.parse().unwrap())
                        .collect(),
                    labels: BTreeMap::new(),
                });
            }
            Part::Locations if !t.is_empty() => {
                // `1: 0x0 M=1 function /file.py:12 s=0()`
                let (id, rest) = t.split_once(':').unwrap();
                let rest = rest.trim();
                let rest = rest.split_once(' ').unwrap().1; // address
                let rest = rest.split_once(' ').unwrap().1; // mapping
                let (func_file, _) = rest.rsplit_once(" s=").expect("no s= in a location");
                let (function, file_line) = func_file.rsplit_once(' ').unwrap();
                let (file, line) = file_line.rsplit_once(':').unwrap();
                let line: i64 = line.parse().unwrap();
                let frame = frame_text(function, file, (line != 0).then_some(line));
                locations.insert(id.trim().parse().unwrap(), frame);
            }
            _ => {}
        }
    }
    (types, samples, locations)
}

#[test]
fn pprof_is_read_by_go_pprof_with_the_folded_counts() {
    let _machine = shared();
    let Some(go) = format_tool("go") else {
        return;
    };
    let snap = snapshot();
    let folded = folded_counts(snap);
    let mut cmd = Command::new(go);
    cmd.args(["tool", "pprof", "-raw"])
        .arg(snap.join("profile.pb.gz"))
        .env("HOME", home());
    let out = run_with_timeout(cmd, TOOL_TIMEOUT);
    assert!(out.success(), "go tool pprof failed: {}", out.describe());
    let (types, samples, locations) = parse_pprof_raw(&out.stdout);
    assert!(
        types.starts_with("samples/count"),
        "sample types: {types:?}"
    );
    assert!(!samples.is_empty(), "no samples:\n{}", out.stdout);
    let mut from_pprof: BTreeMap<String, u64> = BTreeMap::new();
    for s in &samples {
        let process = s.labels.get("process").expect("no process label");
        let pid = s.labels.get("pid").expect("no pid label");
        let status = s
            .labels
            .get("thread_status")
            .expect("no thread_status label");
        assert!(
            ["holds_gil", "no_gil", "on_cpu+holds_gil", "on_cpu+no_gil"].contains(&status.as_str()),
            "thread_status {status}"
        );
        let mut stack = vec![format!("{process}-{pid}")];
        // Leaf first in pprof, root first in folded.
        for id in s.locations.iter().rev() {
            stack.push(
                locations
                    .get(id)
                    .unwrap_or_else(|| panic!("unknown location {id}"))
                    .clone(),
            );
        }
        *from_pprof.entry(stack.join(";")).or_default() += s.values[0];
    }
    assert_eq!(
        from_pprof, folded,
        "go tool pprof's stacks and counts differ from all.folded"
    );
    assert!(!out.stdout.contains(ABSENT));
}

// ---------------------------------------------------------------------------------------------
// speedscope, validated against its schema
// ---------------------------------------------------------------------------------------------

const VALIDATE: &str = r#"
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
doc = json.load(open(sys.argv[2]))
jsonschema.Draft7Validator.check_schema(schema)
errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
for e in errors[:5]:
    print("invalid:", list(e.absolute_path), e.message[:200])
sys.exit(1 if errors else 0)
"#;

fn validate_speedscope(validator: &Validator, file: &Path) -> RunOutput {
    let mut cmd = Command::new(&validator.python);
    cmd.arg("-c").arg(VALIDATE).arg(&validator.schema).arg(file);
    run_with_timeout(cmd, TOOL_TIMEOUT)
}

#[test]
fn speedscope_validates_against_its_schema_with_the_folded_counts() {
    let _machine = shared();
    let Some(validator) = speedscope_validator() else {
        return;
    };
    let snap = snapshot();
    let file = snap.join("profile.speedscope.json");
    let out = validate_speedscope(&validator, &file);
    assert!(
        out.success(),
        "schema validation failed: {}",
        out.describe()
    );

    // The check can fail: the same file without a required field is rejected.
    let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    let broken = tempdir("pyfleet-speedscope-");
    let mut bad = doc.clone();
    bad["profiles"][0]
        .as_object_mut()
        .expect("no profile")
        .remove("weights");
    let bad_file = broken.path().join("bad.json");
    fs::write(&bad_file, serde_json::to_vec(&bad).unwrap()).unwrap();
    let out = validate_speedscope(&validator, &bad_file);
    assert!(
        out.status.code() == Some(1) && out.stdout.contains("invalid: ['profiles', 0]"),
        "a profile without weights passed: {}",
        out.describe()
    );

    // Same stacks, same counts as all.folded.
    let folded = folded_counts(snap);
    let frames: Vec<String> = doc["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            frame_text(
                f["name"].as_str().unwrap(),
                f["file"].as_str().unwrap(),
                f["line"].as_i64(),
            )
        })
        .collect();
    let mut from_speedscope: BTreeMap<String, u64> = BTreeMap::new();
    let profiles = doc["profiles"].as_array_mut().unwrap();
    assert_eq!(profiles.len(), 2, "one profile per process");
    for p in profiles.iter() {
        let name = p["name"].as_str().unwrap();
        let samples = p["samples"].as_array().unwrap();
        let weights = p["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        let total: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
        assert_eq!(p["endValue"].as_u64(), Some(total));
        for (stack, w) in samples.iter().zip(weights) {
            let mut parts = vec![name.to_string()];
            for i in stack.as_array().unwrap() {
                parts.push(frames[i.as_u64().unwrap() as usize].clone());
            }
            *from_speedscope.entry(parts.join(";")).or_default() += w.as_u64().unwrap();
        }
    }
    assert_eq!(
        from_speedscope, folded,
        "speedscope's stacks and counts differ from all.folded"
    );
}
