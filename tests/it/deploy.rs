//! deploy/ checked with the real tools (scripts/setup-deploy-tools.sh installs them):
//! - the systemd unit: `systemd-analyze verify` and `security --offline`; its two capabilities
//!   are each needed and together enough (pyfleet as `nobody` with only them, via setpriv);
//!   every syscall and socket family the daemon uses passes its SystemCallFilter and
//!   RestrictAddressFamilies (the daemon under strace, filter groups from systemd-analyze);
//! - the DaemonSet: `kubernetes-validate --strict`, and its settings; its ConfigMap is a
//!   config the real binary accepts;
//! - Prometheus: `promtool check config`, `check rules`, `test rules`;
//! - end to end: a real pyfleet profiling real Python targets (one churning, so that samples
//!   fail; one killed, so that an exit is counted), `promtool check metrics` on its page, a real
//!   Prometheus scraping it with deploy/prometheus's config and rules, and every query of the
//!   Grafana dashboard answered with data by that Prometheus.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Tools and files
// ---------------------------------------------------------------------------------------------

fn deploy(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel);
    assert!(p.is_file(), "{} is missing", p.display());
    p
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

// ---------------------------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------------------------

#[test]
fn systemd_unit_verifies_and_is_hardened() {
    let _machine = shared();
    let Some(analyze) = deploy_tool("systemd-analyze") else {
        return;
    };
    let tmp = tempdir("pyfleet-unit-");
    let copy = unit_copy(tmp.path());

    let mut verify = Command::new(&analyze);
    verify.args(["verify", "--man=no"]).arg(&copy);
    let out = run(verify);
    assert!(out.success(), "{}", out.describe());
    // Unknown keys and bad values are warnings with exit 0: none may mention the unit.
    let complaints: Vec<&str> = out
        .stderr
        .lines()
        .chain(out.stdout.lines())
        .filter(|l| l.contains("pyfleet.service"))
        .collect();
    assert!(complaints.is_empty(), "{}", out.describe());

    // The exposure score (0 = locked down, 10 = nothing); 2.5 at most.
    let mut security = Command::new(&analyze);
    security
        .args(["security", "--offline=yes", "--threshold=25", "--no-pager"])
        .arg(&copy);
    let out = run(security);
    assert!(out.success(), "exposure above 2.5:\n{}", out.describe());

    let unit = read(&copy);
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "read-only"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "pyfleet"),
        ("Restart", "on-failure"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ] {
        assert_eq!(unit_value(&unit, key), value, "{key}=");
    }
    assert_eq!(
        unit_capabilities(&unit),
        words("CAP_SYS_PTRACE CAP_DAC_READ_SEARCH")
    );
    // A private user namespace would void CAP_SYS_PTRACE over the host's processes, and
    // ProtectProc= could hide them.
    for key in ["PrivateUsers", "ProtectProc", "User"] {
        assert!(
            !unit_assignments(&unit).iter().any(|(k, _)| k == key),
            "the unit must not set {key}="
        );
    }

    // The config the unit points at writes where StateDirectory= is.
    let config: toml::Table = toml::from_str(&read(&deploy("pyfleet.toml"))).unwrap();
    assert_eq!(config["out"].as_str(), Some("/var/lib/pyfleet"));
}

#[test]
fn systemd_unit_capabilities_are_needed_and_enough() {
    let _machine = shared();
    let Some(setpriv) = deploy_tool("setpriv") else {
        return;
    };
    // The interpreter sits in a directory only root may enter, as a pyenv under /root or a
    // venv in a private home would.
    let debian = interpreter("3.11-debian").unwrap_or_else(any_interpreter);
    let tmp = tempdir("pyfleet-caps-");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let private = tmp.path().join("private");
    fs::create_dir(&private).unwrap();
    let python = private.join(debian.path.file_name().unwrap());
    fs::copy(&debian.path, &python).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let hidden = Interp {
        path: python,
        ..debian
    };
    let target = ready_target(&hidden, "sleeper.py", &["pyfleet-caps-target"]);
    let pid = target.pid().to_string();

    let unit = read(&deploy("pyfleet.service"));
    let caps: Vec<String> = unit_capabilities(&unit)
        .iter()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    // pyfleet as nobody with exactly these capabilities (ambient, as the unit gives them).
    let with_caps = |caps: &[String], args: &[&str]| {
        let set = caps
            .iter()
            .fold("-all".to_string(), |s, c| format!("{s},+{c}"));
        let mut cmd = Command::new(&setpriv);
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps={set}"),
            &format!("--ambient-caps={set}"),
            &format!("--bounding-set={set}"),
        ])
        .arg(pyfleet_exe())
        .args(args);
        run(cmd)
    };

    // Enough: the daemon, as the unit runs it, profiles the target.
    let out_dir = tmp.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(65534), Some(65534)).unwrap();
    let run_out = with_caps(
        &caps,
        &[
            "run",
            "--config",
            deploy("pyfleet.toml").to_str().unwrap(),
            "--pid",
            &pid,
            "--out",
            out_dir.to_str().unwrap(),
            "--metrics-addr",
            "off",
            "--duration",
            "2",
        ],
    );
    assert!(run_out.success(), "{}", run_out.describe());
    let last = snapshot_dirs(&out_dir)
        .pop()
        .unwrap_or_else(|| panic!("no snapshot written\n{}", run_out.describe()));
    let all = read(&last.join("all.folded"));
    assert!(
        all.contains("sleeper.py"),
        "the daemon with the unit's capabilities has no stacks of the target:\n{all}\n{}",
        run_out.describe()
    );

    // Needed: without any one of them, pyfleet cannot read the target.
    let dump = with_caps(&caps, &["dump", "--pid", &pid]);
    assert!(
        dump.success() && dump.stdout.contains("sleeper.py"),
        "{}",
        dump.describe()
    );
    for dropped in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != dropped).cloned().collect();
        let dump = with_caps(&fewer, &["dump", "--pid", &pid]);
        assert!(
            !dump.success() && dump.stderr.contains("permission denied"),
            "pyfleet read the target without {dropped}: the capability is not needed\n{}",
            dump.describe()
        );
    }
}

/// The syscalls of a group (`@name`, nested groups expanded) or a single syscall.
fn expand_syscalls(
    analyze: &Path,
    item: &str,
    cache: &mut BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    if !item.starts_with('@') {
        return BTreeSet::from([item.to_string()]);
    }
    if let Some(s) = cache.get(item) {
        return s.clone();
    }
    let mut cmd = Command::new(analyze);
    cmd.args(["syscall-filter", "--no-pager", item]);
    let out = must(cmd);
    let mut set = BTreeSet::new();
    for line in out.stdout.lines().skip(1) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        set.extend(expand_syscalls(analyze, line, cache));
    }
    assert!(!set.is_empty(), "systemd-analyze knows no {item}");
    cache.insert(item.to_string(), set.clone());
    set
}

#[test]
fn systemd_unit_syscall_filter_and_address_families_cover_the_daemon() {
    let _machine = shared();
    let (Some(analyze), Some(strace)) = (deploy_tool("systemd-analyze"), deploy_tool("strace"))
    else {
        return;
    };
    let unit = read(&deploy("pyfleet.service"));
    let mut cache = BTreeMap::new();
    // SystemCallFilter= lines in order: the first is an allow list, `~` lines remove.
    let mut allowed = BTreeSet::new();
    for (i, (_, value)) in unit_assignments(&unit)
        .into_iter()
        .filter(|(k, _)| k == "SystemCallFilter")
        .enumerate()
    {
        let (deny, items) = match value.strip_prefix('~') {
            Some(rest) => (true, rest.to_string()),
            None => (false, value),
        };
        assert!(
            i > 0 || !deny,
            "the first SystemCallFilter= must be an allow list"
        );
        for item in items.split_whitespace() {
            let set = expand_syscalls(&analyze, item, &mut cache);
            if deny {
                allowed.retain(|s| !set.contains(s));
            } else {
                allowed.extend(set);
            }
        }
    }
    let families = words(&unit_value(&unit, "RestrictAddressFamilies"));

    // The daemon under strace: sampling (a 3.15 target: one write), snapshots, a scrape.
    let interp = python315_or_any();
    let target = ready_target(&interp, "sleeper.py", &["pyfleet-strace-target"]);
    let tmp = tempdir("pyfleet-strace-");
    let trace = tmp.path().join("strace.txt");
    let port = free_port();
    let mut cmd = Command::new(&strace);
    cmd.args(["-f", "-qq", "-o"])
        .arg(&trace)
        .arg(pyfleet_exe())
        .args(["run", "--config"])
        .arg(deploy("pyfleet.toml"))
        .args(["--pid", &target.pid().to_string(), "--out"])
        .arg(tmp.path().join("out"))
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--duration", "4", "--snapshot-interval", "1"])
        .env_remove("RUST_LOG");
    let daemon = Running::start(cmd, Duration::from_secs(40));
    wait_until(
        Duration::from_secs(20),
        "the traced daemon to serve /metrics with samples",
        || http_get(port, "/metrics").is_some_and(|(_, b)| b.contains("pyfleet_samples_total")),
        String::new,
    );
    let out = daemon.finish();
    assert!(out.success(), "{}", out.describe());

    let text = read(&trace);
    let mut used = BTreeSet::new();
    let mut used_families = BTreeSet::new();
    for line in text.lines() {
        // "PID name(args..." (a resumed call repeats no name)
        let Some((_, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || !rest[name.len()..].starts_with('(') {
            continue;
        }
        if name == "socket" || name == "socketpair" {
            let family: String = rest[name.len() + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used_families.insert(family);
        }
        used.insert(name);
    }
    for expected in ["process_vm_readv", "openat", "accept4"] {
        assert!(
            used.contains(expected),
            "strace saw no {expected}: {used:?}"
        );
    }
    if interp.minor >= 15 {
        // The marker: through /proc/PID/mem as root, process_vm_writev with the unit's
        // capabilities only (see src/memory/process_vm.rs).
        assert!(
            used.contains("pwrite64") || used.contains("process_vm_writev"),
            "{used:?}"
        );
    }
    let refused: Vec<&String> = used.difference(&allowed).collect();
    assert!(
        refused.is_empty(),
        "the daemon makes syscalls that the unit's SystemCallFilter refuses: {refused:?}"
    );
    let refused: Vec<&String> = used_families.difference(&families).collect();
    assert!(
        refused.is_empty(),
        "the daemon opens sockets of families RestrictAddressFamilies= refuses: {refused:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------------------------

#[test]
fn daemonset_validates_against_kubernetes_schemas() {
    let _machine = shared();
    let Some(venv) = deploy_tools_venv() else {
        return;
    };
    let file = deploy("kubernetes/daemonset.yaml");
    let validate = venv.join("bin/kubernetes-validate");
    let docs = yaml_documents(&venv, &file);
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"]
    );
    for version in ["1.29.0", "1.33.0"] {
        let mut cmd = Command::new(&validate);
        cmd.args(["--strict", "--kubernetes-version", version])
            .arg(&file);
        let out = run(cmd);
        assert!(out.success(), "{}", out.describe());
        let all = format!("{}{}", out.stdout, out.stderr);
        let passed = all.lines().filter(|l| l.contains(" passed ")).count();
        assert_eq!(passed, kinds.len(), "{}", out.describe());
        assert!(
            !all.contains("ERROR") && !all.contains("WARN"),
            "{}",
            out.describe()
        );
    }

    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["hostPID"], json!(true));
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], json!("true"));
    assert_eq!(annotations["prometheus.io/port"], json!("9464"));
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    let added: BTreeSet<String> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| format!("CAP_{}", v.as_str().unwrap()))
        .collect();
    assert_eq!(
        added,
        unit_capabilities(&read(&deploy("pyfleet.service"))),
        "the DaemonSet and the systemd unit should add the same capabilities"
    );
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false));
    assert_ne!(sc["privileged"], json!(true));
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--metrics-addr", "0.0.0.0:9464"]),
        "{args:?}"
    );
    assert!(
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == 9464),
        "{}",
        c["ports"]
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], json!("metrics"));
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                c["resources"][kind][resource].is_string(),
                "no {kind}.{resource}"
            );
        }
    }
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/var/lib/pyfleet"),
        "no volume at /var/lib/pyfleet"
    );

    // The ConfigMap's pyfleet.toml, with the container's arguments, is a config pyfleet runs
    // with (out and metrics-addr moved to test places; one pid, not the whole host).
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let tmp = tempdir("pyfleet-k8s-");
    let toml_path = tmp.path().join("pyfleet.toml");
    fs::write(&toml_path, cm["data"]["pyfleet.toml"].as_str().unwrap()).unwrap();
    let config: toml::Table = toml::from_str(&read(&toml_path)).unwrap();
    assert_eq!(config["out"].as_str(), Some("/var/lib/pyfleet"));
    let metrics = format!("127.0.0.1:{}", free_port());
    let out_dir = tmp.path().join("out");
    let mut pyfleet_args: Vec<String> = args
        .iter()
        .map(|a| match *a {
            "/etc/pyfleet/pyfleet.toml" => toml_path.display().to_string(),
            "0.0.0.0:9464" => metrics.clone(),
            a => a.to_string(),
        })
        .collect();
    pyfleet_args.extend([
        "--out".into(),
        out_dir.display().to_string(),
        "--pid".into(),
        std::process::id().to_string(),
        "--duration".into(),
        "1".into(),
    ]);
    let out = pyfleet(&pyfleet_args);
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stderr.contains(&metrics) && out.stderr.contains("100 Hz"),
        "{}",
        out.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// Prometheus
// ---------------------------------------------------------------------------------------------

#[test]
fn prometheus_config_and_rules_pass_promtool() {
    let _machine = shared();
    let (Some(promtool), Some(venv)) = (deploy_tool("promtool"), deploy_tools_venv()) else {
        return;
    };
    let config = deploy("prometheus/prometheus.yml");
    let rules = deploy("prometheus/pyfleet.rules.yml");
    let rule_tests = deploy("prometheus/pyfleet.rules.test.yml");

    let mut cmd = Command::new(&promtool);
    cmd.args(["check", "config"]).arg(&config);
    let out = must(cmd);
    assert!(
        out.stdout.contains("1 rule files found"),
        "{}",
        out.describe()
    );

    let mut cmd = Command::new(&promtool);
    cmd.args(["check", "rules"]).arg(&rules);
    must(cmd);

    let mut cmd = Command::new(&promtool);
    cmd.args(["test", "rules"])
        .arg(&rule_tests)
        .current_dir(rule_tests.parent().unwrap());
    let out = must(cmd);
    assert!(out.stdout.contains("SUCCESS"), "{}", out.describe());

    let cfg = &yaml_documents(&venv, &config)[0];
    assert_eq!(cfg["rule_files"], json!(["pyfleet.rules.yml"]));
    let job = cfg["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_name"] == "pyfleet")
        .expect("no job pyfleet");
    assert_eq!(
        job["static_configs"][0]["targets"],
        json!(["127.0.0.1:9464"])
    );

    let alerts: BTreeSet<String> = yaml_documents(&venv, &rules)[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    for name in [
        "PyfleetDown",
        "PyfleetHighErrorRate",
        "PyfleetOverCpuBudget",
        "PyfleetSamplerRestarting",
    ] {
        assert!(alerts.contains(name), "no alert {name}: {alerts:?}");
    }
    // Every alert has a unit test that fires it.
    let tests = read(&rule_tests);
    for name in &alerts {
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "no unit test for {name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: pyfleet -> Prometheus -> the dashboard's queries
// ---------------------------------------------------------------------------------------------

/// Grafana's variables, as a person with every host and process selected would have them.
fn substitute(expr: &str) -> String {
    let mut e = expr.to_string();
    for (var, value) in [
        ("$__rate_interval", "30s"),
        ("$__interval", "15s"),
        ("$__range", "5m"),
        ("${instance}", ".*"),
        ("$instance", ".*"),
        ("${process}", ".*"),
        ("$process", ".*"),
    ] {
        e = e.replace(var, value);
    }
    assert!(!e.contains('$'), "a variable the test does not know: {e}");
    e
}

/// (panel title or variable name, query)
type Queries = Vec<(String, String)>;

/// Every query of the dashboard: (panel title, expression); and its variables' queries.
fn dashboard_queries() -> (Queries, Queries) {
    let path = deploy("grafana/pyfleet-dashboard.json");
    let dash: Value = serde_json::from_str(&read(&path)).unwrap();
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion: {}",
        dash["schemaVersion"]
    );
    let mut panels: Vec<&Value> = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        panels.push(p);
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
    }
    let mut queries = Vec::new();
    for p in panels {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap().to_string();
        let targets = p["targets"].as_array();
        assert!(
            targets.is_some_and(|t| !t.is_empty()),
            "panel {title} has no query"
        );
        for t in targets.unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: no expr"));
            assert!(
                p["datasource"]["uid"] == "${datasource}"
                    || t["datasource"]["uid"] == "${datasource}",
                "{title}: not on the datasource variable"
            );
            queries.push((title.clone(), expr.to_string()));
        }
    }
    let mut variables = Vec::new();
    for v in dash["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap()
                .to_string();
            variables.push((v["name"].as_str().unwrap().to_string(), q));
        }
    }
    (queries, variables)
}

/// A Prometheus API answer's data, or why there is none.
fn api(port: u16, path: &str) -> Result<Value, String> {
    let (status, body) = http_get(port, path).ok_or("no answer")?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(v["data"].clone())
}

/// Whether an instant query has at least one series with a finite value; Err says why not.
fn query_has_data(port: u16, expr: &str) -> Result<(), String> {
    let data = api(port, &format!("/api/v1/query?query={}", url_encode(expr)))?;
    let result = data["result"].as_array().ok_or(format!("{data}"))?;
    if result.is_empty() {
        return Err("empty result".into());
    }
    let finite = result.iter().any(|r| {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    });
    if finite {
        Ok(())
    } else {
        Err(format!("no finite value: {data}"))
    }
}

/// `label_values(SELECTOR, LABEL)` through the label values API.
fn label_values_have_data(port: u16, query: &str) -> Result<(), String> {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values() query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    let data = api(
        port,
        &format!(
            "/api/v1/label/{}/values?match[]={}",
            label.trim(),
            url_encode(&substitute(selector.trim()))
        ),
    )?;
    match data.as_array() {
        Some(values) if !values.is_empty() => Ok(()),
        _ => Err(format!("no values: {data}")),
    }
}

/// `promtool check metrics` on a /metrics page.
fn promtool_check_metrics(promtool: &Path, page: &str, dir: &Path) {
    let file = dir.join("metrics.txt");
    fs::write(&file, page).unwrap();
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "exec \"$0\" check metrics < \"$1\""])
        .arg(promtool)
        .arg(&file);
    let out = run(cmd);
    assert!(
        out.success() && out.stdout.trim().is_empty() && out.stderr.trim().is_empty(),
        "promtool check metrics:\n{}\n--- page ---\n{}",
        out.describe(),
        truncate(page, 6000)
    );
}

#[test]
fn live_metrics_scraped_by_prometheus_answer_every_dashboard_query() {
    let _machine = shared();
    let (Some(prometheus), Some(promtool), Some(venv)) = (
        deploy_tool("prometheus"),
        deploy_tool("promtool"),
        deploy_tools_venv(),
    ) else {
        return;
    };
    let (queries, variables) = dashboard_queries();
    assert!(queries.len() >= 12, "{queries:?}");
    let tmp = tempdir("pyfleet-e2e-");

    // Targets: a churning one (its stacks change under the reads: sample errors), a steady
    // 3.15 one (frame-cache hits), and one that is killed (a process exit).
    let any = any_interpreter();
    let churn = ready_target(&any, "churn.py", &[]);
    let steady = ready_target(&python315_or_any(), "sleeper.py", &["pyfleet-e2e-steady"]);
    let mut doomed = ready_target(&any, "sleeper.py", &["pyfleet-e2e-doomed"]);

    let metrics_port = free_port();
    let out_dir = tmp.path().join("snapshots");
    let mut args: Vec<String> = vec!["run".into(), "--config".into()];
    args.push(deploy("pyfleet.toml").display().to_string());
    for p in [&churn, &steady, &doomed] {
        args.extend(["--pid".into(), p.pid().to_string()]);
    }
    args.extend(
        [
            "--out",
            out_dir.to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
            "--snapshot-interval",
            "3",
            "--duration",
            "85",
        ]
        .map(String::from),
    );
    let daemon = Running::start(pyfleet_command(&args), Duration::from_secs(100));
    let page = || {
        http_get(metrics_port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    wait_until(
        Duration::from_secs(20),
        "pyfleet to serve samples of its three targets",
        || {
            let p = page();
            [&churn, &steady, &doomed].iter().all(|t| {
                p.lines().any(|l| {
                    l.starts_with("pyfleet_samples_total{")
                        && l.contains(&format!("pid=\"{}\"", t.pid()))
                })
            })
        },
        || truncate(&page(), 4000),
    );

    // Prometheus with deploy/'s config: the target is this pyfleet, scrapes every second.
    let prom_dir = tmp.path().join("prometheus");
    fs::create_dir(&prom_dir).unwrap();
    let mut config = yaml_documents(&venv, &deploy("prometheus/prometheus.yml")).remove(0);
    config["global"]["scrape_interval"] = json!("1s");
    config["global"]["evaluation_interval"] = json!("1s");
    let jobs = config["scrape_configs"].as_array_mut().unwrap();
    let job = jobs
        .iter_mut()
        .find(|j| j["job_name"] == "pyfleet")
        .unwrap();
    job["static_configs"][0]["targets"] = json!([format!("127.0.0.1:{metrics_port}")]);
    // JSON is YAML; the rules file goes beside it, where the relative rule_files points.
    fs::write(prom_dir.join("prometheus.yml"), config.to_string()).unwrap();
    fs::copy(
        deploy("prometheus/pyfleet.rules.yml"),
        prom_dir.join("pyfleet.rules.yml"),
    )
    .unwrap();
    let prom_port = free_port();
    let mut prom = Proc::spawn(
        "prometheus",
        &prometheus,
        &[
            format!(
                "--config.file={}",
                prom_dir.join("prometheus.yml").display()
            ),
            format!("--storage.tsdb.path={}", prom_dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{prom_port}"),
            "--log.level=warn".into(),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(prom_port, "/-/ready").is_none_or(|(s, _)| s != 200) {
        assert!(
            prom.exited().is_none() && Instant::now() < deadline,
            "prometheus did not become ready:\n{}",
            prom.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A profiled process exits: pyfleet counts it.
    std::thread::sleep(Duration::from_secs(3));
    doomed.kill();
    wait_until(
        Duration::from_secs(20),
        "pyfleet_process_exits_total and pyfleet_sample_errors_total on /metrics",
        || {
            let p = page();
            p.contains("pyfleet_process_exits_total ")
                && p.contains("pyfleet_sample_errors_total{")
                && p.contains("pyfleet_sample_failure_ratio{")
        },
        || truncate(&page(), 6000),
    );
    promtool_check_metrics(&promtool, &page(), tmp.path());

    // Every dashboard query (and variable) answers with data once Prometheus has a few
    // scrapes of every series.
    let deadline = Instant::now() + Duration::from_secs(45);
    let failing = loop {
        let mut failing = Vec::new();
        for (title, expr) in &queries {
            let expr = substitute(expr);
            if let Err(why) = query_has_data(prom_port, &expr) {
                failing.push(format!("panel {title:?}: {expr}\n    -> {why}"));
            }
        }
        for (name, q) in &variables {
            if let Err(why) = label_values_have_data(prom_port, q) {
                failing.push(format!("variable {name}: {q}\n    -> {why}"));
            }
        }
        if failing.is_empty() || Instant::now() > deadline {
            break failing;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(
        failing.is_empty(),
        "dashboard queries without data:\n{}\n--- /metrics ---\n{}\n--- prometheus stderr ---\n{}",
        failing.join("\n"),
        truncate(&page(), 6000),
        truncate(&prom.stderr(), 3000)
    );

    // The scrape is healthy and the alerting rules evaluate on real data.
    let targets = api(prom_port, "/api/v1/targets").unwrap();
    let active = targets["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 1, "{targets}");
    assert_eq!(active[0]["health"], "up", "{targets}");
    assert_eq!(active[0]["labels"]["job"], "pyfleet", "{targets}");
    let rules = api(prom_port, "/api/v1/rules").unwrap();
    let all_rules: Vec<&Value> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert!(all_rules.len() >= 4, "{rules}");
    for r in &all_rules {
        assert_eq!(r["health"], "ok", "rule {}: {r}", r["name"]);
    }
    promtool_check_metrics(&promtool, &page(), tmp.path());

    // deploy/parca/parca.yaml: Parca pulls what it says, as Parca asks (the path with
    // `seconds` = its scrape interval, here shortened as Prometheus's was), within its
    // timeout, and gets a pprof whose samples carry each process's pid.
    check_parca_pull(&venv, metrics_port, &[steady.pid(), churn.pid()]);

    // SIGTERM: a final snapshot, exit 0.
    send_signal(daemon.pid(), libc::SIGTERM);
    let out = daemon.finish();
    assert!(out.success(), "{}", out.describe());
    assert!(out.stderr.contains("SIGTERM"), "{}", out.describe());
    assert!(!snapshot_dirs(&out_dir).is_empty(), "no snapshot");
}

/// What deploy/parca/parca.yaml makes Parca do, done against a live pyfleet: one scrape of
/// its CPU profile (Parca's rules: the timeout above the interval, the Go-only types off).
fn check_parca_pull(venv: &Path, metrics_port: u16, pids: &[i32]) {
    let config = yaml_documents(venv, &deploy("parca/parca.yaml")).remove(0);
    let job = config["scrape_configs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["job_name"] == "pyfleet"))
        .unwrap_or_else(|| panic!("no pyfleet job: {config}"));
    let seconds = |v: &Value| -> u64 {
        v.as_str()
            .and_then(|s| s.strip_suffix('s'))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a duration in seconds: {v}"))
    };
    let (interval, timeout) = (
        seconds(&job["scrape_interval"]),
        seconds(&job["scrape_timeout"]),
    );
    assert!(
        timeout > interval,
        "Parca wants scrape_timeout above scrape_interval: {job}"
    );
    assert_eq!(
        job["static_configs"][0]["targets"],
        json!(["127.0.0.1:9464"]),
        "{job}"
    );
    let pprof = &job["profiling_config"]["pprof_config"];
    assert_eq!(
        pprof["process_cpu"]["path"], "/debug/pprof/profile",
        "{job}"
    );
    assert_eq!(pprof["process_cpu"]["delta"], true, "{job}");
    for go_only in ["memory", "block", "goroutine", "mutex"] {
        assert_eq!(
            pprof[go_only]["enabled"], false,
            "{go_only} should be off: {job}"
        );
    }
    // One scrape, 2 s instead of the interval (the test's time), read raw: the body is binary.
    let path = format!(
        "{}?seconds=2",
        pprof["process_cpu"]["path"].as_str().unwrap_or("")
    );
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(timeout)))
        .unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(timeout),
        "slower than Parca's timeout"
    );
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]);
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    let profile = pyfleet::output::pprof::decode(&raw[split + 4..]).unwrap();
    let s = |i: i64| profile.string_table[i as usize].as_str();
    let labelled: BTreeSet<i64> = profile
        .sample
        .iter()
        .flat_map(|x| x.label.iter())
        .filter(|l| s(l.key) == "pid")
        .map(|l| l.num)
        .collect();
    for pid in pids {
        assert!(
            labelled.contains(&i64::from(*pid)),
            "no sample of pid {pid}: {labelled:?}"
        );
    }
}

/// deploy/Dockerfile passes hadolint (no finding at any level), and the image is the one the
/// DaemonSet expects: the binary where its `command` runs it, the port it names, and a
/// non-root default user that the DaemonSet overrides with uid 0 (added capabilities are
/// given to root only). No Docker engine runs here: the build itself is not exercised.
#[test]
fn dockerfile_passes_hadolint_and_fits_the_daemonset() {
    let _machine = shared();
    let (Some(hadolint), Some(venv)) = (
        provided(
            "hadolint",
            venvs_dir().join("hadolint/bin/hadolint"),
            SETUP_DEPLOY_TOOLS,
        ),
        deploy_tools_venv(),
    ) else {
        return;
    };
    let dockerfile = deploy("Dockerfile");
    let mut cmd = Command::new(&hadolint);
    cmd.args(["--failure-threshold", "style", "--format", "tty"])
        .arg(&dockerfile);
    let out = run(cmd);
    assert!(out.success(), "hadolint:\n{}", out.describe());

    let text = read(&dockerfile);
    let instruction = |name: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::to_string)
            .collect()
    };
    let froms = instruction("FROM");
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(
        instruction("COPY")
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with(" /usr/local/bin/pyfleet")),
        "the runtime stage holds the built binary at /usr/local/bin/pyfleet"
    );
    let user = instruction("USER");
    assert!(
        user.last()
            .is_some_and(|u| !u.starts_with('0') && !u.starts_with("root")),
        "the image's default user is not root: {user:?}"
    );
    let ds = yaml_documents(&venv, &deploy("kubernetes/daemonset.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["command"], json!(["/usr/local/bin/pyfleet"]));
    assert_eq!(container["securityContext"]["runAsUser"], 0);
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert_eq!(instruction("EXPOSE"), vec![port.to_string()]);
    // The build context leaves out what the build does not need.
    let ignored = read(&deploy("Dockerfile.dockerignore"));
    for p in ["target", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == p),
            "{p} not in the .dockerignore"
        );
    }
}
