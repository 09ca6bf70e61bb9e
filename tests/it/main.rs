//! pyfleet's integration tests against real CPython processes, compiled as one test binary
//! (`cargo test --test it`; one module per subject, `cargo test --test it deploy::` runs one).
//! The Python targets they start are data in `tests/targets/`.
//!
//! Tests of every module run concurrently (as many at once as `--test-threads`, by default one
//! per CPU). Each test takes the machine first, with `common::alone()` (a test that measures
//! something the others' load would change, or that loads the machine or matches processes
//! host-wide itself) or `common::shared()` (the rest); the `every_test_takes_the_machine`
//! check below fails a test that takes neither.

mod common;

mod blocking;
mod capture;
mod deploy;
mod diff;
mod doctor;
mod dump_errors;
mod dump_exact;
mod dump_locals;
mod dump_tasks;
mod file_modes;
mod fleet;
mod fleet_page;
mod formats;
mod gc_frames;
mod hostile_memory;
mod hostile_processes;
mod labels;
mod list;
mod listener;
mod log_output;
mod namespace;
mod push;
mod real_code;
mod record;
mod sampler_consistency;
mod steady_state;
mod task_stacks;
mod thread_status;
mod thread_views;
mod top;
mod true_rates;
mod trust;
mod who_is_who;
mod whole_stacks;

/// Every test of every module starts by taking the machine (`alone()` or `shared()`): one that
/// did not would run beside the tests that must run alone.
#[test]
fn every_test_takes_the_machine() {
    let _machine = common::shared();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut modules = 0;
    let mut bad = Vec::new();
    // The modules' files, those of a module split into a directory too (but the helpers').
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/it") {
        let path = entry.expect("tests/it").path();
        if path.is_dir() && !path.ends_with("common") {
            for inner in std::fs::read_dir(&path).expect("a test module's directory") {
                files.push(inner.expect("a test module's directory").path());
            }
        } else {
            files.push(path);
        }
    }
    for path in files {
        let name = path
            .strip_prefix(&dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        if !name.ends_with(".rs") || name == "main.rs" {
            continue;
        }
        modules += 1;
        let text = std::fs::read_to_string(&path).expect("a test module");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "#[test]" {
                continue;
            }
            // The first statement of the function that follows (comments before it are fine).
            let first = lines[i + 1..]
                .iter()
                .skip_while(|l| !l.trim_end().ends_with('{'))
                .skip(1)
                .map(|l| l.trim())
                .find(|l| !l.starts_with("//"))
                .unwrap_or("");
            if first != "let _machine = alone();" && first != "let _machine = shared();" {
                bad.push(format!("{name}:{}: {first:?}", i + 1));
            }
        }
    }
    assert!(modules >= 16, "{modules} modules in {}", dir.display());
    assert!(
        bad.is_empty(),
        "tests that do not start with `let _machine = alone();` or `shared();`:\n{}",
        bad.join("\n")
    );
}
