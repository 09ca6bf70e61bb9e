//! `pyfleet dump --locals` must show each frame's variables as the target itself describes
//! them (tests/targets/locals.py computes what should be shown from the values, with
//! `repr()` and `id()`), on every supported interpreter, without running anything of the
//! target (a `__repr__` that would kill it) and without letting its strings reach the
//! terminal raw.

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;

#[test]
fn locals_are_shown_as_the_target_describes_them() {
    let _machine = shared();
    for interp in interpreters() {
        check_locals(&interp);
    }
}

fn check_locals(interp: &Interp) {
    let label = &interp.label;
    let mut target = Proc::python(
        label,
        &interp.path,
        "locals.py",
        &["ready", "expected.json"],
    );
    target.wait_for_file("ready", READY_TIMEOUT);
    let expected: Value =
        serde_json::from_str(&fs::read_to_string(target.dir().join("expected.json")).unwrap())
            .unwrap();
    let expected: BTreeMap<String, String> = expected["holder"]
        .as_object()
        .unwrap_or_else(|| panic!("[{label}] no expectations: {expected}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    // Every kind of value the module documents is among them.
    for name in [
        "big",
        "hostile",
        "raw",
        "opaque",
        "captured",
        "tiny",
        "long_text",
    ] {
        assert!(
            expected.contains_key(name),
            "[{label}] {name}: {expected:?}"
        );
    }
    let pid = target.pid().to_string();

    let out = pyfleet(&["dump", "--locals", "--json", &pid]);
    assert!(out.success(), "[{label}] {}", out.describe());
    let doc: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("[{label}] not JSON ({e}): {}", out.stdout));
    let frames: Vec<&Value> = doc["interpreters"][0]["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["frames"].as_array().into_iter().flatten())
        .collect();
    let holder = frames
        .iter()
        .find(|f| f["function"] == "holder")
        .unwrap_or_else(|| panic!("[{label}] no frame of holder: {}", out.stdout));
    let shown: BTreeMap<String, String> = holder["locals"]
        .as_array()
        .unwrap_or_else(|| panic!("[{label}] holder without locals: {holder}"))
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap_or_default().to_string(),
                l["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    // Equal as maps: every bound local (and not `unbound`, assigned after the park), each as
    // the target's repr() or type and id() give it.
    assert_eq!(shown, expected, "[{label}]");
    // Every frame of the thread has its locals, or says why not.
    for f in &frames {
        assert!(
            f.get("locals").is_some() || f.get("locals_not_read").is_some(),
            "[{label}] a frame with neither: {f}"
        );
    }

    let text = pyfleet(&["dump", "--locals", &pid]);
    assert!(text.success(), "[{label}] {}", text.describe());
    assert!(
        text.stdout.contains("        small = 42\n"),
        "[{label}] {}",
        text.stdout
    );
    // The target's control characters are escaped as repr() escapes them, and nothing else of
    // the target's reaches the terminal raw.
    assert!(
        text.stdout.contains(r"hostile = '\x1b[31mred\n\ttabé中'"),
        "[{label}] {}",
        text.stdout
    );
    assert!(
        !text.stdout.chars().any(|c| c == '\x1b'),
        "[{label}] {}",
        text.stdout
    );
    // Opaque.__repr__ exits the target with status 99: it must not have run.
    assert!(target.exited().is_none(), "[{label}] the target exited");
    target.kill();
}
