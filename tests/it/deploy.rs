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
        "DAC_READ_SEARCH" => 2,
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
        // The kernel capture's maps before Linux 5.11 (the kernel charges them to it).
        ("LimitMEMLOCK", "64M"),
    ] {
        assert_eq!(unit_value(&unit, key), value, "{key}=");
    }
    assert_eq!(
        unit_capabilities(&unit),
        words("CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_BPF CAP_PERFMON")
    );
    // A private user namespace would void CAP_SYS_PTRACE over the host's processes, and
    // ProtectProc= could hide them.
    for key in ["PrivateUsers", "ProtectProc", "User"] {
        assert!(
            !unit_assignments(&unit).iter().any(|(k, _)| k == key),
            "the unit must not set {key}="
        );
    }

    // The config the unit points at writes where StateDirectory= is, and samples threads on a
    // CPU with the kernel capture where it starts (capture = "auto", or no such key: auto is
    // the default).
    let config: toml::Table = toml::from_str(&read(&deploy("pyfleet.toml"))).unwrap();
    assert_eq!(config["out"].as_str(), Some("/var/lib/pyfleet"));
    assert_eq!(config["mode"].as_str(), Some("cpu"));
    // Every local user reaches 127.0.0.1: metrics and profiles need the token.
    assert_eq!(
        config["listen"]["token-file"].as_str(),
        Some("/etc/pyfleet/listen-token")
    );
    assert_eq!(config["listen"]["metrics-token"].as_bool(), Some(true));
    assert!(
        config
            .get("capture")
            .is_none_or(|c| c.as_str() == Some("auto")),
        "capture = {:?}",
        config.get("capture")
    );
}

#[test]
fn systemd_unit_capabilities_are_needed_and_enough() {
    let _machine = shared();
    let (Some(setpriv), Some(analyze)) = (deploy_tool("setpriv"), deploy_tool("systemd-analyze"))
    else {
        return;
    };
    let Some(helper) = seccomp_exec() else {
        return;
    };
    // The interpreter sits in a directory only root may enter, as a pyenv under /root or a
    // venv in a private home would. The target keeps a CPU busy (cpu mode samples threads on
    // a CPU only), for 60 s at most.
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
    let target = ready_target(&hidden, "profiled.py", &["60"]);
    let pid = target.pid().to_string();

    let unit = read(&deploy("pyfleet.service"));
    let caps: Vec<String> = unit_capabilities(&unit).into_iter().collect();
    // The unit's seccomp settings, as systemd would load them (systemd does not run here).
    let mut cache = BTreeMap::new();
    let profile = tmp.path().join("unit-seccomp.json");
    fs::write(
        &profile,
        unit_seccomp_profile(&analyze, &unit, &mut cache).to_string(),
    )
    .unwrap();
    // pyfleet as nobody with exactly these capabilities (ambient, as the unit gives them),
    // and, for the daemon, under the unit's seccomp settings.
    let with_caps = |caps: &[String], seccomp: bool, args: &[&str]| {
        let set = setpriv_caps(caps);
        let mut cmd = Command::new(&setpriv);
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &format!("--inh-caps={set}"),
            &format!("--ambient-caps={set}"),
            &format!("--bounding-set={set}"),
        ]);
        if seccomp {
            cmd.args(under_seccomp(&helper, &profile, &pyfleet_exe()));
        } else {
            cmd.arg(pyfleet_exe());
        }
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE");
        cmd
    };
    let without =
        |dropped: &str| -> Vec<String> { caps.iter().filter(|c| *c != dropped).cloned().collect() };

    // Enough: the daemon, as the unit runs it, profiles the target with the kernel capture.
    // Needed: without CAP_BPF or CAP_PERFMON it reads the target from outside instead, and
    // its first line says why. The three daemons run side by side, 2 s each.
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("the unit's capabilities", caps.clone(), WITH_CAPTURE),
        ("without CAP_BPF", without("CAP_BPF"), WITHOUT_PRIVILEGE),
        (
            "without CAP_PERFMON",
            without("CAP_PERFMON"),
            WITHOUT_PRIVILEGE,
        ),
    ];
    let token = listen_token(tmp.path());
    let runs: Vec<(PathBuf, Running)> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, caps, _))| {
            let out_dir = tmp.path().join(format!("out-{i}"));
            fs::create_dir(&out_dir).unwrap();
            std::os::unix::fs::chown(&out_dir, Some(65534), Some(65534)).unwrap();
            let cmd = with_caps(
                caps,
                true,
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
                    "--listen-token-file",
                    token.to_str().unwrap(),
                    "--duration",
                    "2",
                ],
            );
            (out_dir, Running::start(cmd, PYFLEET_TIMEOUT))
        })
        .collect();
    for ((what, _, says), (out_dir, running)) in cases.iter().zip(runs) {
        let out = running.finish();
        assert!(out.success(), "{what}: {}", out.describe());
        assert!(
            first_line(&out).contains(says),
            "{what}: the first line should say {says:?}\n{}",
            out.describe()
        );
        let all = last_snapshot(&out_dir, &out);
        assert!(
            all.contains("pyfleet_hot_leaf"),
            "{what}: the daemon has no stacks of the target:\n{}\n{}",
            truncate(&all, 2000),
            out.describe()
        );
    }

    // Needed: without CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH, pyfleet cannot read the target,
    // and says "permission denied" (without CAP_SYS_PTRACE but with CAP_PERFMON the kernel
    // lets pyfleet read /proc/PID/maps but not follow /proc/PID/exe: this interpreter, which
    // has no libpython, is refused, not "not Python").
    let dump = run(with_caps(&caps, false, &["dump", "--pid", &pid]));
    assert!(
        dump.success() && dump.stdout.contains("profiled.py"),
        "{}",
        dump.describe()
    );
    for dropped in ["CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"] {
        assert!(caps.iter().any(|c| c == dropped), "{caps:?}");
        let dump = run(with_caps(
            &without(dropped),
            false,
            &["dump", "--pid", &pid],
        ));
        assert!(
            !dump.success() && dump.stderr.contains("permission denied"),
            "pyfleet read the target without {dropped}: the capability is not needed\n{}",
            dump.describe()
        );
    }
}

/// The calls the unit's seccomp settings allow only under conditions, beside its
/// SystemCallFilter=: MemoryDenyWriteExecute= (no memory both writable and executable),
/// RestrictNamespaces= (clone without namespace flags; clone3, whose flags a filter cannot
/// see, ENOSYS, so that the C library uses clone; no unshare, no setns), LockPersonality=
/// (the personality asked or kept, never changed) and RestrictAddressFamilies= (socket() of
/// those families only), as systemd builds them; as rules of a seccomp profile (the OCI
/// format that Kubernetes' Localhost profiles and tests/tools/seccomp_exec.py take), without
/// comments. deploy/kubernetes/pyfleet-seccomp.json has exactly these.
fn unit_conditioned_rules(unit: &str) -> (BTreeSet<String>, Vec<Value>) {
    for key in [
        "MemoryDenyWriteExecute",
        "RestrictNamespaces",
        "LockPersonality",
    ] {
        assert_eq!(unit_value(unit, key), "yes", "{key}=");
    }
    let masked = |index: u32, mask: u64| json!({"index": index, "value": mask, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"});
    let eq = |index: u32, value: u64| json!({"index": index, "value": value, "valueTwo": 0, "op": "SCMP_CMP_EQ"});
    let allow = |names: &[&str], arg: Value| json!({"names": names, "action": "SCMP_ACT_ALLOW", "args": [arg]});
    let (exec, write) = (libc::PROT_EXEC as u64, libc::PROT_WRITE as u64);
    let clone_new = (libc::CLONE_NEWNS
        | libc::CLONE_NEWCGROUP
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET) as u64;
    let mut rules = vec![
        allow(&["mmap", "mmap2"], masked(2, exec)),
        allow(&["mmap", "mmap2"], masked(2, write)),
        allow(&["mprotect", "pkey_mprotect"], masked(2, exec)),
        allow(&["shmat"], masked(2, libc::SHM_EXEC as u64)),
        allow(&["clone"], masked(0, clone_new)),
        json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}),
        allow(&["personality"], eq(0, 0xffff_ffff)),
        // PER_LINUX
        allow(&["personality"], eq(0, 0)),
    ];
    for family in words(&unit_value(unit, "RestrictAddressFamilies")) {
        let number = match family.as_str() {
            "AF_UNIX" => libc::AF_UNIX,
            "AF_INET" => libc::AF_INET,
            "AF_INET6" => libc::AF_INET6,
            other => panic!("an address family this test does not know: {other}"),
        };
        rules.push(allow(&["socket"], eq(0, number as u64)));
    }
    let mut names: BTreeSet<String> = ["unshare", "setns"].map(String::from).into();
    for r in &rules {
        for n in r["names"].as_array().unwrap() {
            names.insert(n.as_str().unwrap().to_string());
        }
    }
    (names, rules)
}

/// The unit's seccomp settings as one seccomp profile: its SystemCallFilter= (as
/// systemd-analyze expands it), with SystemCallErrorNumber=, and the conditions of
/// `unit_conditioned_rules`. systemd loads these as several filters; one filter that allows
/// what all of them allow refuses the same calls.
fn unit_seccomp_profile(
    analyze: &Path,
    unit: &str,
    cache: &mut BTreeMap<String, BTreeSet<String>>,
) -> Value {
    let (conditioned, rules) = unit_conditioned_rules(unit);
    let plain: Vec<String> = unit_allowed_syscalls(analyze, unit, cache)
        .difference(&conditioned)
        .cloned()
        .collect();
    assert_eq!(unit_value(unit, "SystemCallErrorNumber"), "EPERM");
    let mut all = vec![json!({"names": plain, "action": "SCMP_ACT_ALLOW"})];
    all.extend(rules);
    json!({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": libc::EPERM, "syscalls": all})
}

/// The syscalls the unit's SystemCallFilter= lines allow, in order: the first is an allow
/// list, a `~` line removes, a later allow line adds.
fn unit_allowed_syscalls(
    analyze: &Path,
    unit: &str,
    cache: &mut BTreeMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    let mut allowed = BTreeSet::new();
    for (i, (_, value)) in unit_assignments(unit)
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
            let set = expand_syscalls(analyze, item, cache);
            if deny {
                allowed.retain(|s| !set.contains(s));
            } else {
                allowed.extend(set);
            }
        }
    }
    allowed
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

/// The syscalls (by name) and socket families an `strace -f` log shows.
fn traced_syscalls(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
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
    (used, used_families)
}

/// Every call a seccomp profile allows, under conditions or not, or answers with ENOSYS (the
/// C library then makes another: clone for clone3).
fn profile_allowed_names(profile: &Value) -> BTreeSet<String> {
    profile["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                || (r["action"] == "SCMP_ACT_ERRNO" && r["errnoRet"] == json!(libc::ENOSYS))
        })
        .flat_map(|r| r["names"].as_array().unwrap())
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
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
    let allowed = unit_allowed_syscalls(&analyze, &unit, &mut cache);
    let families = words(&unit_value(&unit, "RestrictAddressFamilies"));
    // The DaemonSet's seccomp profile too: what it allows, with or without conditions (the
    // daemon meets them: daemonset_capabilities_and_seccomp_profile_capture_a_gunicorn_fleet
    // runs it under the profile).
    let profile: Value =
        serde_json::from_str(&read(&deploy("kubernetes/pyfleet-seccomp.json"))).unwrap();
    let profile_allows = profile_allowed_names(&profile);

    // The daemon under strace, twice side by side on one busy 3.15 target: with the deployed
    // config (as root here: the kernel capture), and reading the target from outside
    // (`--capture reads`: what the deployed daemon does without the capture's capabilities
    // or kernel; on 3.15 one write). Each samples, writes snapshots and answers a scrape.
    let interp = python315_or_any();
    let target = ready_target(&interp, "profiled.py", &["60"]);
    let tmp = tempdir("pyfleet-strace-");
    let token = listen_token(tmp.path());
    let traced = |name: &str, extra: &[&str]| {
        let trace = tmp.path().join(format!("strace-{name}.txt"));
        let port = free_port();
        let mut cmd = Command::new(&strace);
        cmd.args(["-f", "-qq", "-o"])
            .arg(&trace)
            .arg(pyfleet_exe())
            .args(["run", "--config"])
            .arg(deploy("pyfleet.toml"))
            .args(["--pid", &target.pid().to_string(), "--out"])
            .arg(tmp.path().join(format!("out-{name}")))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .arg("--listen-token-file")
            .arg(&token)
            .args(["--duration", "4", "--snapshot-interval", "1"])
            .args(extra)
            .env_remove("RUST_LOG");
        (trace, port, Running::start(cmd, Duration::from_secs(40)))
    };
    let runs = [
        ("capture", traced("capture", &[])),
        ("reads", traced("reads", &["--capture", "reads"])),
    ];
    for (name, (_, port, _)) in &runs {
        wait_until(
            Duration::from_secs(20),
            &format!("the traced daemon ({name}) to serve /metrics with samples"),
            || metrics_page(*port).contains("pyfleet_samples_total"),
            String::new,
        );
    }
    let mut used = BTreeSet::new();
    let mut used_families = BTreeSet::new();
    for (name, (trace, _, running)) in runs {
        let out = running.finish();
        assert!(out.success(), "{}", out.describe());
        let (calls, families) = traced_syscalls(&read(&trace));
        match name {
            "capture" => {
                assert!(
                    first_line(&out).contains(WITH_CAPTURE),
                    "{}",
                    out.describe()
                );
                for expected in ["bpf", "perf_event_open"] {
                    assert!(
                        calls.contains(expected),
                        "strace saw no {expected} with the capture: {calls:?}"
                    );
                }
            }
            _ => {
                assert!(
                    first_line(&out).contains("stacks read from outside"),
                    "{}",
                    out.describe()
                );
                if interp.minor >= 15 {
                    // The marker: through /proc/PID/mem as root, process_vm_writev with the
                    // unit's capabilities only (see src/memory/process_vm.rs).
                    assert!(
                        calls.contains("pwrite64") || calls.contains("process_vm_writev"),
                        "{calls:?}"
                    );
                }
            }
        }
        used.extend(calls);
        used_families.extend(families);
    }
    for expected in ["process_vm_readv", "openat", "accept4"] {
        assert!(
            used.contains(expected),
            "strace saw no {expected}: {used:?}"
        );
    }
    let refused: Vec<&String> = used.difference(&allowed).collect();
    assert!(
        refused.is_empty(),
        "the daemon makes syscalls that the unit's SystemCallFilter refuses: {refused:?}"
    );
    let refused: Vec<&String> = used.difference(&profile_allows).collect();
    assert!(
        refused.is_empty(),
        "the daemon makes syscalls that deploy/kubernetes/pyfleet-seccomp.json refuses: \
         {refused:?}"
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
        [
            "Namespace",
            "ServiceAccount",
            "ConfigMap",
            "NetworkPolicy",
            "DaemonSet"
        ]
    );
    let secret_file = deploy("kubernetes/listen-token-secret.yaml");
    let secret = yaml_documents(&venv, &secret_file).remove(0);
    assert_eq!(secret["kind"], "Secret");
    for version in ["1.29.0", "1.33.0"] {
        let mut cmd = Command::new(&validate);
        cmd.args(["--strict", "--kubernetes-version", version])
            .arg(&file)
            .arg(&secret_file);
        let out = run(cmd);
        assert!(out.success(), "{}", out.describe());
        let all = format!("{}{}", out.stdout, out.stderr);
        let passed = all.lines().filter(|l| l.contains(" passed ")).count();
        assert_eq!(passed, kinds.len() + 1, "{}", out.describe());
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
    // No scrape annotations: a scrape needs the token, which annotations cannot carry.
    assert!(
        pod["metadata"]["annotations"].is_null(),
        "{}",
        pod["metadata"]
    );
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
    // The seccomp profile it names is the one beside it (installed on every node).
    assert_eq!(sc["seccompProfile"]["type"], json!("Localhost"));
    let localhost = sc["seccompProfile"]["localhostProfile"].as_str().unwrap();
    deploy(&format!("kubernetes/{localhost}"));
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
    // The probes on a listener of their own; the NetworkPolicy admits scrapers to `metrics`
    // only (the kubelet's probes come from the node, always admitted).
    assert!(
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "health" && p["containerPort"] == 9465),
        "{}",
        c["ports"]
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["--health-addr", "0.0.0.0:9465"]),
        "{args:?}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["port"], json!("health"), "{probe}");
        assert_eq!(c[probe]["httpGet"]["path"], json!(path), "{probe}");
    }
    let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        pod["metadata"]["labels"]
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .all(|r| !r["from"].as_array().unwrap().is_empty()
                && r["ports"] == json!([{"port": "metrics", "protocol": "TCP"}])),
        "{policy}"
    );
    // The token: the Secret's key, mounted where the config reads it, root's alone.
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "listen-token")
        .unwrap_or_else(|| panic!("no listen-token mount: {}", c["volumeMounts"]));
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "listen-token")
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"], secret["metadata"]["name"],
        "{volume}"
    );
    assert_eq!(volume["secret"]["defaultMode"], json!(0o400));
    assert_eq!(secret["metadata"]["namespace"], json!("pyfleet"));
    let key = secret["stringData"]
        .as_object()
        .and_then(|d| d.keys().next().cloned())
        .unwrap();
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
    assert_eq!(
        config["listen"]["token-file"].as_str().map(PathBuf::from),
        Some(Path::new(mount["mountPath"].as_str().unwrap()).join(&key))
    );
    assert_eq!(config["listen"]["metrics-token"].as_bool(), Some(true));
    // As shipped, the Secret holds no token: pyfleet would not start with it.
    let empty = tmp.path().join("empty-token");
    fs::write(&empty, secret["stringData"][&key].as_str().unwrap()).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let health = format!("127.0.0.1:{}", free_port());
    let out_dir = tmp.path().join("out");
    let mut pyfleet_args: Vec<String> = args
        .iter()
        .map(|a| match *a {
            "/etc/pyfleet/pyfleet.toml" => toml_path.display().to_string(),
            "0.0.0.0:9464" => metrics.clone(),
            "0.0.0.0:9465" => health.clone(),
            a => a.to_string(),
        })
        .collect();
    let mut refused = pyfleet_args.clone();
    refused.extend(["--listen-token-file".into(), empty.display().to_string()]);
    assert_error_contract(&pyfleet(&refused), Some("16 characters"));
    pyfleet_args.extend([
        "--listen-token-file".into(),
        listen_token(tmp.path()).display().to_string(),
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
        out.stderr.contains(&metrics)
            && first_line(&out).contains("at 100 Hz (cpu mode)")
            && first_line(&out).contains("(profiles need the token; /metrics the token)")
            && first_line(&out).contains(&format!("probes on http://{health}/healthz")),
        "{}",
        out.describe()
    );
}

/// The container's `securityContext` and the ConfigMap's pyfleet.toml of
/// deploy/kubernetes/daemonset.yaml.
fn daemonset_container_and_config(venv: &Path) -> (Value, String) {
    let docs = yaml_documents(venv, &deploy("kubernetes/daemonset.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    (
        ds["spec"]["template"]["spec"]["containers"][0].clone(),
        cm["data"]["pyfleet.toml"].as_str().unwrap().to_string(),
    )
}

/// deploy/kubernetes/pyfleet-seccomp.json is the systemd unit's seccomp settings (its
/// SystemCallFilter= as systemd-analyze expands it, the conditions of its
/// MemoryDenyWriteExecute=, RestrictNamespaces=, LockPersonality= and
/// RestrictAddressFamilies=), without the kernel keyring, which container runtimes refuse too;
/// with bpf and perf_event_open. When systemd's groups change, the test writes the profile as
/// it should be to its artifacts directory.
#[test]
fn daemonset_seccomp_profile_is_the_units_filter() {
    let _machine = shared();
    let Some(analyze) = deploy_tool("systemd-analyze") else {
        return;
    };
    let path = deploy("kubernetes/pyfleet-seccomp.json");
    let profile: Value = serde_json::from_str(&read(&path)).unwrap();
    let unit = read(&deploy("pyfleet.service"));
    let mut cache = BTreeMap::new();
    let of_unit = unit_seccomp_profile(&analyze, &unit, &mut cache);
    let keyring = expand_syscalls(&analyze, "@keyring", &mut cache);

    assert_eq!(profile["defaultAction"], of_unit["defaultAction"]);
    assert_eq!(profile["defaultErrnoRet"], of_unit["defaultErrnoRet"]);
    // Without conditions: the unit's calls but the keyring's.
    let rules = profile["syscalls"].as_array().unwrap();
    let unconditional = |rules: &[Value]| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
            .flat_map(|r| r["names"].as_array().unwrap())
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let shipped = unconditional(rules);
    let wanted: BTreeSet<String> = unconditional(of_unit["syscalls"].as_array().unwrap())
        .difference(&keyring)
        .cloned()
        .collect();
    for call in [
        "bpf",
        "perf_event_open",
        "process_vm_readv",
        "process_vm_writev",
    ] {
        assert!(wanted.contains(call), "the unit does not allow {call}");
    }
    if shipped != wanted {
        // The profile as it should be: its first rule's names are what the others leave.
        let mut fixed = profile.clone();
        let others = unconditional(&rules[1..]);
        fixed["syscalls"][0]["names"] = json!(wanted.difference(&others).collect::<Vec<_>>());
        let out = artifacts_dir("daemonset_seccomp_profile").join("pyfleet-seccomp.json");
        fs::write(&out, serde_json::to_string_pretty(&fixed).unwrap() + "\n").unwrap();
        panic!(
            "{} allows without conditions {:?} more and {:?} less than the unit; the profile \
             as it should be is {}",
            path.display(),
            shipped.difference(&wanted).collect::<Vec<_>>(),
            wanted.difference(&shipped).collect::<Vec<_>>(),
            out.display()
        );
    }
    // With conditions: the unit's, the same.
    let conditioned = |rules: &[Value]| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| !(r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none()))
            .map(|r| {
                let mut r = r.clone();
                r.as_object_mut().unwrap().remove("comment");
                r.to_string()
            })
            .collect()
    };
    assert_eq!(
        conditioned(rules),
        conditioned(of_unit["syscalls"].as_array().unwrap()),
        "the conditioned rules of {}",
        path.display()
    );
}

/// The pod as the DaemonSet makes it, on a gunicorn fleet: pyfleet as root with exactly the
/// container's capabilities (as a runtime gives them to a root container: bounding,
/// permitted and effective sets; none inheritable or ambient), no_new_privs
/// (allowPrivilegeEscalation: false) and its seccomp profile, with the ConfigMap's config,
/// profiles two gunicorn workers serving CPU-bound requests with the kernel capture: its
/// first line and pyfleet_capture_info say so, and each worker's snapshot file has the
/// handler's stacks.
#[test]
fn daemonset_capabilities_and_seccomp_profile_capture_a_gunicorn_fleet() {
    // Alone: busy workers under HTTP load.
    let _machine = alone();
    let (Some(setpriv), Some(venv), Some(gunicorn_python)) = (
        deploy_tool("setpriv"),
        deploy_tools_venv(),
        gunicorn_venv("gunicorn-3.15"),
    ) else {
        return;
    };
    let Some(helper) = seccomp_exec() else {
        return;
    };
    let (container, config) = daemonset_container_and_config(&venv);
    let sc = &container["securityContext"];
    assert_eq!(sc["runAsUser"], json!(0));
    let caps: Vec<String> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let mask = caps.iter().fold(0u64, |m, c| m | 1 << capability_number(c));
    let profile = deploy(&format!(
        "kubernetes/{}",
        sc["seccompProfile"]["localhostProfile"].as_str().unwrap()
    ));
    let tmp = tempdir("pyfleet-pod-");
    let config_path = tmp.path().join("pyfleet.toml");
    fs::write(&config_path, &config).unwrap();
    let out_dir = tmp.path().join("out");

    let port = free_port();
    let fleet = gunicorn("gunicorn 3.15", &gunicorn_python, port, 2);
    let workers = children(fleet.pid());
    assert_eq!(workers.len(), 2, "{workers:?}");

    // The container's command line, with the config and the listener moved to test places,
    // and the fleet's pids (not the whole host), for 4 s.
    let (metrics_port, health_port) = (free_port(), free_port());
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    for a in container["args"].as_array().unwrap() {
        args.push(match a.as_str().unwrap() {
            "/etc/pyfleet/pyfleet.toml" => config_path.clone().into(),
            "0.0.0.0:9464" => format!("127.0.0.1:{metrics_port}").into(),
            "0.0.0.0:9465" => format!("127.0.0.1:{health_port}").into(),
            a => a.into(),
        });
    }
    args.extend([
        "--listen-token-file".into(),
        listen_token(tmp.path()).into(),
    ]);
    for pid in std::iter::once(fleet.pid()).chain(workers.iter().copied()) {
        args.extend(["--pid".into(), pid.to_string().into()]);
    }
    args.extend(["--out".into(), out_dir.clone().into()]);
    args.extend(["--duration", "4"].map(Into::into));
    let set = setpriv_caps(&caps);
    let mut cmd = Command::new(&setpriv);
    cmd.args([
        "--reuid=0",
        "--regid=0",
        "--clear-groups",
        "--inh-caps=-all",
        &format!("--bounding-set={set}"),
    ])
    .args(under_seccomp(&helper, &profile, &pyfleet_exe()))
    .args(&args)
    .env_remove("RUST_LOG")
    .env_remove("RUST_BACKTRACE");
    let daemon = Running::start(cmd, Duration::from_secs(60));

    // Its capabilities, once it runs pyfleet: exactly the container's.
    let pid = daemon.pid();
    wait_for_pyfleet(pid);
    for key in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(
            status_caps(pid, key),
            Some(mask),
            "{key} of the daemon, for {caps:?}"
        );
    }
    for key in ["CapInh", "CapAmb"] {
        assert_eq!(status_caps(pid, key), Some(0), "{key} of the daemon");
    }
    assert_eq!(status_field(pid, "Uid").as_deref(), Some("0\t0\t0\t0"));
    assert_eq!(status_field(pid, "NoNewPrivs").as_deref(), Some("1"));
    assert_eq!(
        status_field(pid, "Seccomp").as_deref(),
        Some("2"),
        "a seccomp filter"
    );

    let page = || metrics_page(metrics_port);
    wait_until(
        Duration::from_secs(10),
        "pyfleet_capture_info{stacks=\"kernel\"} 1 on /metrics",
        || {
            page().lines().any(|l| {
                l.starts_with("pyfleet_capture_info{")
                    && l.contains("stacks=\"kernel\"")
                    && l.ends_with(" 1")
            })
        },
        || truncate(&page(), 4000),
    );
    // The kubelet's probes, as the container's spec makes them: answered on their own port,
    // without the token (ready once the fleet runs); the site asks the token of a scraper
    // without it.
    for probe in ["livenessProbe", "readinessProbe"] {
        let path = container[probe]["httpGet"]["path"].as_str().unwrap();
        let status = || http_get(health_port, path).map(|(s, _)| s);
        wait_until(
            Duration::from_secs(10),
            &format!("{probe} {path} to answer 200"),
            || status() == Some(200),
            || format!("{:?}", status()),
        );
    }
    assert_eq!(
        http_get(metrics_port, "/metrics").map(|(s, _)| s),
        Some(401)
    );
    let ticks_before: Vec<u64> = workers.iter().map(|w| cpu_ticks(*w)).collect();
    // Requests that burn CPU in the workers (fib_work under render_page), three at a time
    // for two workers, from the moment it samples until it is done, at most 1,200 of them
    // (about 3 s of both workers' time).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut served = 0;
                for _ in 0..400 {
                    if done.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    if http_get(port, "/expensive").is_some_and(|(s, _)| s == 200) {
                        served += 1;
                    }
                }
                served
            })
        })
        .collect();

    let out = daemon.finish();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: u32 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(out.success(), "{}", out.describe());
    assert!(
        first_line(&out).contains(WITH_CAPTURE),
        "{}",
        out.describe()
    );
    let last = snapshot_dirs(&out_dir)
        .pop()
        .unwrap_or_else(|| panic!("no snapshot written\n{}", out.describe()));
    // Every worker that ran the handler for 0.2 s of CPU or more has its stacks (about 20
    // samples at 100 Hz: none would be a broken capture, not chance); the gunicorn balances
    // the requests between its workers as it will, but one of them at least serves them.
    let mut busy = 0;
    for (worker, before) in workers.iter().zip(ticks_before) {
        let ticks = cpu_ticks(*worker).saturating_sub(before);
        if ticks < 20 {
            continue;
        }
        busy += 1;
        let file = fs::read_dir(&last)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(&format!("-{worker}.folded")))
            });
        let text = file.as_deref().map(read).unwrap_or_default();
        assert!(
            text.contains("render_page") && text.contains("fib_work"),
            "worker {worker} ({ticks} ticks of CPU): no stacks of the handler in {file:?} \
             ({served} requests served):\n{}\n{}",
            truncate(&text, 2000),
            out.describe()
        );
    }
    assert!(
        busy > 0,
        "no worker used 0.2 s of CPU ({served} requests served)"
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

    // promtool checks that the token file exists: a copy of the config, its token file in a
    // test place, beside the rules it loads.
    let tmp = tempdir("pyfleet-promtool-");
    let text = read(&config);
    assert!(text.contains(PROMETHEUS_TOKEN_FILE), "{text}");
    let token = listen_token(tmp.path());
    let checked = tmp.path().join("prometheus.yml");
    fs::write(
        &checked,
        text.replace(PROMETHEUS_TOKEN_FILE, token.to_str().unwrap()),
    )
    .unwrap();
    fs::copy(&rules, tmp.path().join("pyfleet.rules.yml")).unwrap();
    let mut cmd = Command::new(&promtool);
    cmd.args(["check", "config"]).arg(&checked);
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
    assert_eq!(
        job["authorization"],
        json!({"type": "Bearer", "credentials_file": PROMETHEUS_TOKEN_FILE})
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
    let token = listen_token(tmp.path());
    let mut args: Vec<String> = vec!["run".into(), "--config".into()];
    args.push(deploy("pyfleet.toml").display().to_string());
    args.extend(["--listen-token-file".into(), token.display().to_string()]);
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
            // Every thread, read from outside: the churning target's stacks change under
            // the reads (failed samples, which a panel shows), and the idle targets have
            // samples (the Parca pull). The config's capture copies each stack at one
            // instant and does not fail that way (the capture is checked by
            // daemonset_capabilities_and_seccomp_profile_capture_a_gunicorn_fleet).
            "--mode",
            "wall",
            "--capture",
            "reads",
        ]
        .map(String::from),
    );
    let daemon = Running::start(pyfleet_command(&args), Duration::from_secs(100));
    // A second host, as deployed (cpu mode, the kernel capture) with a busy target: the
    // capture's panels have its series (Prometheus scrapes both, as it would two nodes).
    let busy = ready_target(&any, "profiled.py", &[]);
    let capture_port = free_port();
    let capture_out = tmp.path().join("capture-snapshots");
    let capture_daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--config",
            deploy("pyfleet.toml").to_str().unwrap(),
            "--pid",
            &busy.pid().to_string(),
            "--out",
            capture_out.to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{capture_port}"),
            "--listen-token-file",
            token.to_str().unwrap(),
            "--duration",
            "85",
        ]),
        Duration::from_secs(100),
    );
    let page = || metrics_page(metrics_port);
    let capture_page = || metrics_page(capture_port);
    wait_until(
        Duration::from_secs(20),
        "the capturing pyfleet to export its capture",
        || {
            let p = capture_page();
            p.contains("pyfleet_capture_info{stacks=\"kernel\",why=\"\"} 1")
                && p.contains("pyfleet_capture_lost_samples_total{reason=\"ring_full\"}")
        },
        || truncate(&capture_page(), 4000),
    );
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
    job["static_configs"][0]["targets"] = json!([
        format!("127.0.0.1:{metrics_port}"),
        format!("127.0.0.1:{capture_port}")
    ]);
    // The config's token file, in a test place.
    assert_eq!(
        job["authorization"]["credentials_file"],
        json!(PROMETHEUS_TOKEN_FILE)
    );
    job["authorization"]["credentials_file"] = json!(token);
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
    assert_eq!(active.len(), 2, "{targets}");
    for target in active {
        assert_eq!(target["health"], "up", "{targets}");
        assert_eq!(target["labels"]["job"], "pyfleet", "{targets}");
    }
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
    send_signal(capture_daemon.pid(), libc::SIGTERM);
    let out = capture_daemon.finish();
    assert!(out.success(), "{}", out.describe());
    send_signal(daemon.pid(), libc::SIGTERM);
    let out = daemon.finish();
    assert!(out.success(), "{}", out.describe());
    assert!(out.stderr.contains("SIGTERM"), "{}", out.describe());
    assert!(!snapshot_dirs(&out_dir).is_empty(), "no snapshot");
}

/// What deploy/parca/parca.yaml makes Parca do, done against a live pyfleet: one scrape of
/// its CPU profile with the token its config names (Parca's rules: the timeout above the
/// interval, the Go-only types off). Without the token, the same request gets a 401.
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
    assert_eq!(
        job["authorization"],
        json!({"type": "Bearer", "credentials_file": "/etc/parca/pyfleet-listen-token"}),
        "{job}"
    );
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
    assert_eq!(http_get(metrics_port, &path).map(|(s, _)| s), Some(401));
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(timeout)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {LISTEN_TOKEN}\r\n\r\n"
    )
    .unwrap();
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
    let ports: Vec<String> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].to_string())
        .collect();
    assert_eq!(instruction("EXPOSE"), vec![ports.join(" ")]);
    // The image's own command serves what the DaemonSet's does.
    let cmd = instruction("CMD");
    for arg in container["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        assert!(
            cmd.iter().any(|c| c.contains(&format!("\"{arg}\""))),
            "{arg} not in the image's CMD {cmd:?}"
        );
    }
    // The build context leaves out what the build does not need.
    let ignored = read(&deploy("Dockerfile.dockerignore"));
    for p in ["target", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == p),
            "{p} not in the .dockerignore"
        );
    }
}
