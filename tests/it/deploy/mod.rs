//! deploy/ checked with the real tools (scripts/setup-deploy-tools.sh installs them):
//! - the systemd unit: `systemd-analyze verify` and `security --offline`; its four capabilities
//!   are each needed and together enough (pyfleet as `nobody` with only them, via setpriv, and
//!   under the unit's seccomp settings applied with libseccomp: the daemon samples with the
//!   kernel capture, and without CAP_BPF or CAP_PERFMON reads and says why); every syscall and
//!   socket family the daemon uses, with the capture and reading, passes its SystemCallFilter
//!   and RestrictAddressFamilies (the daemon under strace, filter groups from systemd-analyze);
//! - the DaemonSet: `kubernetes-validate --strict`, and its settings; its ConfigMap is a
//!   config the real binary accepts; its seccomp profile is the unit's filter; pyfleet as the
//!   pod runs it (root with only the container's capabilities, under that profile, with the
//!   ConfigMap's config) profiles a gunicorn fleet with the kernel capture;
//! - Prometheus: `promtool check config`, `check rules`, `test rules`;
//! - end to end: a real pyfleet profiling real Python targets (one churning, so that samples
//!   fail; one killed, so that an exit is counted), `promtool check metrics` on its page, a real
//!   Prometheus scraping it with deploy/prometheus's config and rules, and every query of the
//!   Grafana dashboard answered with data by that Prometheus.

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod docker;
mod end_to_end;
mod kubernetes;
mod prometheus;
mod systemd;

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

fn deploy(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel);
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

/// The token of daemons run with deploy/'s configs in these tests (their `[listen]
/// token-file` is the host's or the pod's; `--listen-token-file` wins).
const LISTEN_TOKEN: &str = "deploy-test-token-0123456789abcdef";

/// Writes [`LISTEN_TOKEN`] to `dir/listen-token` (0600, as deploy/README.md says) and returns
/// the file.
fn listen_token(dir: &Path) -> PathBuf {
    let file = dir.join("listen-token");
    fs::write(&file, format!("{LISTEN_TOKEN}\n")).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    file
}

/// Where deploy/prometheus/prometheus.yml reads pyfleet's token.
const PROMETHEUS_TOKEN_FILE: &str = "/etc/prometheus/pyfleet-listen-token";

/// `/metrics` of a daemon run with deploy/'s configs (with the token), or "".
fn metrics_page(port: u16) -> String {
    http_get_with_token(port, "/metrics", Some(LISTEN_TOKEN))
        .map(|(_, b)| b)
        .unwrap_or_default()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A program on PATH that scripts/setup-deploy-tools.sh installs; None (the test returns)
/// only when it is missing and PYFLEET_ALLOW_MISSING=1.
#[track_caller]
fn deploy_tool(name: &str) -> Option<PathBuf> {
    tool(name, SETUP_DEPLOY_TOOLS)
}

/// The venv with kubernetes-validate and PyYAML that scripts/setup-deploy-tools.sh makes; None
/// (the test returns) only when it is missing and PYFLEET_ALLOW_MISSING=1.
#[track_caller]
fn deploy_tools_venv() -> Option<PathBuf> {
    let venv = venvs_dir().join("deploy-tools");
    provided(
        "kubernetes-validate",
        venv.join("bin/kubernetes-validate"),
        SETUP_DEPLOY_TOOLS,
    )
    .map(|_| venv)
}

fn run(mut cmd: Command) -> RunOutput {
    cmd.env_remove("RUST_LOG").env_remove("RUST_BACKTRACE");
    run_with_timeout(cmd, TOOL_TIMEOUT)
}

fn must(cmd: Command) -> RunOutput {
    let out = run(cmd);
    assert!(out.success(), "{}", out.describe());
    out
}

/// Every document of a YAML file, as JSON (PyYAML from the deploy-tools venv).
fn yaml_documents(venv: &Path, path: &Path) -> Vec<Value> {
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args([
        "-c",
        "import json, sys, yaml\n\
         json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None], sys.stdout)",
    ])
    .arg(path);
    let out = must(cmd);
    match serde_json::from_str(&out.stdout) {
        Ok(Value::Array(docs)) => docs,
        other => panic!("{}: not a list of documents: {other:?}", path.display()),
    }
}

fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A systemd unit's `Key=value` assignments, in order.
fn unit_assignments(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The one value of `key` in the unit (panics if it is missing or set twice).
fn unit_value(text: &str, key: &str) -> String {
    let values: Vec<String> = unit_assignments(text)
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values.len(), 1, "{key}= in the unit: {values:?}");
    values.into_iter().next().unwrap()
}

fn words(s: &str) -> BTreeSet<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// The unit's capabilities (AmbientCapabilities, which must equal CapabilityBoundingSet).
fn unit_capabilities(unit: &str) -> BTreeSet<String> {
    let ambient = words(&unit_value(unit, "AmbientCapabilities"));
    let bounding = words(&unit_value(unit, "CapabilityBoundingSet"));
    assert_eq!(
        ambient, bounding,
        "ambient and bounding capabilities differ"
    );
    ambient
}

/// A copy of deploy/pyfleet.service in `dir` whose ExecStart runs the binary under test.
fn unit_copy(dir: &Path) -> PathBuf {
    let unit = read(&deploy("pyfleet.service"));
    let exec = unit_value(&unit, "ExecStart");
    assert_eq!(
        exec, "/usr/local/bin/pyfleet run --config /etc/pyfleet/pyfleet.toml",
        "the unit's ExecStart"
    );
    let copy = dir.join("pyfleet.service");
    let exe = pyfleet_exe();
    fs::write(
        &copy,
        unit.replace(
            "ExecStart=/usr/local/bin/pyfleet ",
            &format!("ExecStart={} ", exe.display()),
        ),
    )
    .unwrap();
    copy
}

/// A Python target from tests/targets that writes a ready file, started and awaited.
fn ready_target(interp: &Interp, script: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["ready"];
    args.extend_from_slice(extra);
    let mut p = Proc::python(&interp.label, &interp.path, script, &args);
    p.wait_for_file("ready", READY_TIMEOUT);
    p
}

/// Python 3.15 (frame cache, one write per process), or any interpreter when 3.15 is missing
/// and PYFLEET_ALLOW_MISSING=1.
fn python315_or_any() -> Interp {
    interpreter("3.15").unwrap_or_else(any_interpreter)
}

/// The first line pyfleet writes: how stacks are taken, and why not by the kernel capture.
fn first_line(out: &RunOutput) -> &str {
    out.stderr.lines().next().unwrap_or("")
}

/// What the daemon's first line says with the kernel capture, and without its capabilities.
const WITH_CAPTURE: &str = "stacks from the kernel capture;";
const WITHOUT_PRIVILEGE: &str = "stacks read from outside: the kernel capture needs CAP_BPF and \
                                 CAP_PERFMON (or root), which pyfleet does not hold";

/// The folded stacks of a daemon's last snapshot (`all.folded`).
#[track_caller]
fn last_snapshot(out_dir: &Path, run: &RunOutput) -> String {
    let last = snapshot_dirs(out_dir)
        .pop()
        .unwrap_or_else(|| panic!("no snapshot written\n{}", run.describe()));
    read(&last.join("all.folded"))
}

/// Linux's number of a capability (`CAP_SYS_PTRACE` or `SYS_PTRACE`), for those deploy/ uses.
fn capability_number(name: &str) -> u32 {
    match name.trim_start_matches("CAP_") {
        "CHOWN" => 0,
        "DAC_READ_SEARCH" => 2,
        "SETGID" => 6,
        "SETUID" => 7,
        "SETPCAP" => 8,
        "SYS_PTRACE" => 19,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("a capability this test does not know: {other}"),
    }
}

/// setpriv's `--*-caps` argument for exactly these capabilities (`CAP_BPF` or `BPF`).
fn setpriv_caps<S: AsRef<str>>(caps: &[S]) -> String {
    caps.iter().fold("-all".to_string(), |s, c| {
        let c = c.as_ref();
        format!("{s},+{}", c.trim_start_matches("CAP_").to_lowercase())
    })
}

/// A field of /proc/PID/status (`CapEff`, `NoNewPrivs`, ...).
fn status_field(pid: i32, key: &str) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// A capability set of /proc/PID/status (`CapEff`, ...) as its bits.
fn status_caps(pid: i32, key: &str) -> Option<u64> {
    u64::from_str_radix(&status_field(pid, key)?, 16).ok()
}

/// Waits until `pid` runs pyfleet (after setpriv and the seccomp helper exec'd it).
fn wait_for_pyfleet(pid: i32) {
    let exe = fs::canonicalize(pyfleet_exe()).unwrap();
    wait_until(
        Duration::from_secs(10),
        &format!("pid {pid} to exec pyfleet"),
        || fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe),
        || format!("{:?}", fs::read_link(format!("/proc/{pid}/exe"))),
    );
}

/// tests/tools/seccomp_exec.py and the python to run it with: Debian's python3.11, which
/// `nobody` can run (pyenv's live under /root); it loads libseccomp.so.2, which
/// scripts/setup-deploy-tools.sh provides.
/// None (the test returns) only when it is missing and PYFLEET_ALLOW_MISSING=1.
#[track_caller]
fn seccomp_exec() -> Option<(PathBuf, PathBuf)> {
    let python = interpreter("3.11-debian")?.path;
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/seccomp_exec.py");
    assert!(helper.is_file(), "{} is missing", helper.display());
    Some((python, helper))
}

/// `program args` run under the seccomp profile at `profile` (tests/tools/seccomp_exec.py):
/// the arguments that follow setpriv's.
fn under_seccomp(
    helper: &(PathBuf, PathBuf),
    profile: &Path,
    program: &Path,
) -> Vec<std::ffi::OsString> {
    vec![
        helper.0.clone().into(),
        helper.1.clone().into(),
        profile.into(),
        program.into(),
    ]
}
