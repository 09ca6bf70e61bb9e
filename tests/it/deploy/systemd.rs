//! The systemd unit: verified and hardened, its capabilities needed and enough, its system-call
//! filter and address families covering what the daemon does.

use super::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
pub(super) fn unit_conditioned_rules(unit: &str) -> (BTreeSet<String>, Vec<Value>) {
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
pub(super) fn unit_seccomp_profile(
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
pub(super) fn unit_allowed_syscalls(
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
pub(super) fn expand_syscalls(
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
pub(super) fn traced_syscalls(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
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
pub(super) fn profile_allowed_names(profile: &Value) -> BTreeSet<String> {
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
