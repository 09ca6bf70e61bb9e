//! The DaemonSet: valid against Kubernetes' schemas, its seccomp profile the unit's filter,
//! and pyfleet as the pod runs it profiling a gunicorn fleet with the kernel capture.

use super::systemd::*;
use super::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
    let tls_secret_file = deploy("kubernetes/listen-tls-secret.yaml");
    let tls_secret = yaml_documents(&venv, &tls_secret_file).remove(0);
    assert_eq!(tls_secret["type"], "kubernetes.io/tls");
    for version in ["1.29.0", "1.33.0"] {
        let mut cmd = Command::new(&validate);
        cmd.args(["--strict", "--kubernetes-version", version])
            .arg(&file)
            .arg(&secret_file)
            .arg(&tls_secret_file);
        let out = run(cmd);
        assert!(out.success(), "{}", out.describe());
        let all = format!("{}{}", out.stdout, out.stderr);
        let passed = all.lines().filter(|l| l.contains(" passed ")).count();
        assert_eq!(passed, kinds.len() + 2, "{}", out.describe());
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
    // The unit's four, and the three of the drop at start (the unit starts pyfleet as its
    // user instead).
    let mut expected = unit_capabilities(&read(&deploy("pyfleet.service")));
    expected.extend(DROP_CAPABILITIES.map(String::from));
    assert_eq!(
        added, expected,
        "the DaemonSet should add the unit's capabilities and those of the drop to its user"
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
    let (mount, volume) = mount_and_volume(c, spec, "listen-token");
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
    // Snapshots in a directory the daemon makes for its user, in the hostPath.
    assert_eq!(config["out"].as_str(), Some("/var/lib/pyfleet/snapshots"));
    assert_eq!(config["user"].as_str(), Some(DAEMONSET_UID));
    assert_eq!(
        config["listen"]["token-file"].as_str().map(PathBuf::from),
        Some(Path::new(mount["mountPath"].as_str().unwrap()).join(&key))
    );
    assert_eq!(config["listen"]["metrics-token"].as_bool(), Some(true));
    // TLS from the kubernetes.io/tls Secret, mounted root's alone where the config reads it:
    // off loopback pyfleet takes its token over TLS only.
    let (tls_mount, tls_volume) = mount_and_volume(c, spec, "listen-tls");
    assert_eq!(
        tls_volume["secret"]["secretName"],
        tls_secret["metadata"]["name"]
    );
    assert_eq!(tls_volume["secret"]["defaultMode"], json!(0o400));
    for (key, file) in [("tls-cert", "tls.crt"), ("tls-key", "tls.key")] {
        assert!(tls_secret["stringData"].get(file).is_some(), "{tls_secret}");
        assert_eq!(
            config["listen"][key].as_str().map(PathBuf::from),
            Some(Path::new(tls_mount["mountPath"].as_str().unwrap()).join(file))
        );
    }
    let Some(ca) = TestCa::make(tmp.path()) else {
        return;
    };
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
    assert_error_contract(&pyfleet(&refused), Some("32 characters"));
    pyfleet_args.extend([
        "--listen-token-file".into(),
        listen_token(tmp.path()).display().to_string(),
        "--listen-tls-cert".into(),
        ca.server_cert.display().to_string(),
        "--listen-tls-key".into(),
        ca.server_key.display().to_string(),
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
            && first_line(&out).contains(&format!("metrics on https://{metrics}/metrics"))
            && first_line(&out).contains("(profiles need the token; /metrics the token)")
            && first_line(&out).contains(&format!("probes on http://{health}/healthz")),
        "{}",
        out.describe()
    );
}

/// The capabilities the DaemonSet adds for the drop to its user at start, besides the unit's.
const DROP_CAPABILITIES: [&str; 4] = ["CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"];
/// The user the DaemonSet's daemon becomes (the ConfigMap's `user`).
const DAEMONSET_UID: &str = "65532";

/// The container's mount of volume `name` and the pod's volume of that name.
#[track_caller]
fn mount_and_volume<'a>(
    container: &'a Value,
    pod: &'a Value,
    name: &str,
) -> (&'a Value, &'a Value) {
    let named = |list: &'a Value| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {list}"))
    };
    (named(&container["volumeMounts"]), named(&pod["volumes"]))
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

/// deploy/kubernetes/pyfleet-seccomp.json allows what the daemon calls and no more: its first
/// rule is what scripts/trace-daemon-syscalls.sh saw the daemon call in every mode (the strace
/// test in systemd.rs checks the daemon's calls against it again), its second the calls no
/// trace sees (each with why), then the kernel capture's two and the systemd unit's
/// conditions (MemoryDenyWriteExecute=, RestrictNamespaces=, LockPersonality=,
/// RestrictAddressFamilies=). Nothing it allows is refused by the unit, and none of the calls
/// an attacker inside the daemon would want (io_uring, userfaultfd, the keyring, ...) is
/// allowed.
#[test]
fn daemonset_seccomp_profile_allows_what_the_daemon_calls() {
    let _machine = shared();
    let Some(analyze) = deploy_tool("systemd-analyze") else {
        return;
    };
    let path = deploy("kubernetes/pyfleet-seccomp.json");
    let profile: Value = serde_json::from_str(&read(&path)).unwrap();
    let unit = read(&deploy("pyfleet.service"));
    let mut cache = BTreeMap::new();
    let of_unit = unit_seccomp_profile(&analyze, &unit, &mut cache);

    assert_eq!(profile["defaultAction"], of_unit["defaultAction"]);
    assert_eq!(profile["defaultErrnoRet"], of_unit["defaultErrnoRet"]);
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
    let units = unconditional(of_unit["syscalls"].as_array().unwrap());
    // The drop to the DaemonSet's user at start, which the unit does by DynamicUser=.
    let drop: BTreeSet<String> = ["fchown", "setgroups", "setresgid", "setresuid"]
        .map(String::from)
        .into();
    let beyond_the_unit: Vec<&String> = shipped
        .difference(&units)
        .filter(|c| !drop.contains(*c))
        .collect();
    assert!(
        beyond_the_unit.is_empty(),
        "{} allows what the unit refuses: {beyond_the_unit:?}",
        path.display()
    );
    for call in [
        "bpf",
        "perf_event_open",
        "process_vm_readv",
        "process_vm_writev",
        "capset",
    ] {
        assert!(shipped.contains(call), "the profile does not allow {call}");
    }
    // A list of the daemon's own, not a group: a fifth of @system-service's.
    assert!(shipped.len() < 100, "{} calls: {shipped:?}", shipped.len());
    let allowed = profile_allowed_names(&profile);
    for refused in [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "userfaultfd",
        "kcmp",
        "name_to_handle_at",
        "open_by_handle_at",
        "keyctl",
        "add_key",
        "request_key",
        "execveat",
        "ptrace",
        "process_madvise",
        "memfd_create",
        "unshare",
        "setns",
        "mount",
        "chroot",
        "setuid",
        "setreuid",
        "init_module",
        "finit_module",
        "kexec_load",
        "fanotify_init",
    ] {
        assert!(
            !allowed.contains(refused),
            "{} allows {refused}",
            path.display()
        );
    }
    // The second rule's calls each say why no trace sees them.
    let untraced = &rules[1];
    for name in untraced["names"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        assert!(
            untraced["comment"]
                .as_str()
                .unwrap()
                .contains(&format!("{name}: ")),
            "{name}: no reason given"
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
    // The pod's Secrets, as files of this test: the token, and TLS from a test CA.
    let (Some(ca), Some(curl)) = (TestCa::make(tmp.path()), deploy_tool("curl")) else {
        return;
    };
    args.extend([
        "--listen-token-file".into(),
        listen_token(tmp.path()).into(),
        "--listen-tls-cert".into(),
        ca.server_cert.clone().into(),
        "--listen-tls-key".into(),
        ca.server_key.clone().into(),
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

    let pid = daemon.pid();
    wait_for_pyfleet(pid);

    // `GET path` over TLS, trusting the test CA, with `token` when given: (status, body).
    let https = |path: &str, token: Option<&str>| {
        let mut cmd = Command::new(&curl);
        cmd.args(["-s", "-w", "\n%{http_code}", "--cacert"])
            .arg(&ca.ca)
            .args(
                token
                    .map(|t| ["-H".to_string(), format!("Authorization: Bearer {t}")])
                    .into_iter()
                    .flatten(),
            )
            .arg(format!("https://127.0.0.1:{metrics_port}{path}"));
        let out = run_with_timeout(cmd, Duration::from_secs(20)).stdout;
        let (body, status) = out.rsplit_once('\n').unwrap_or(("", "000"));
        (status.trim().to_string(), body.to_string())
    };
    let page = || https("/metrics", Some(LISTEN_TOKEN)).1;
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
    // Its privileges once it runs (the drop comes before its first thread): in every thread
    // the container's capabilities but the drop's, nothing inheritable, ambient or in the
    // bounding set, the DaemonSet's user, no_new_privs and the seccomp filter.
    let drop_mask = DROP_CAPABILITIES
        .iter()
        .fold(0u64, |m, c| m | 1 << capability_number(c));
    let used = mask & !drop_mask;
    assert_eq!(used.count_ones(), 4, "{caps:?}");
    let uid = [DAEMONSET_UID; 4].join("\t");
    let tasks: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect();
    assert!(tasks.len() >= 3, "{tasks:?}");
    for tid in tasks {
        for (key, bits) in [
            ("CapEff", used),
            ("CapPrm", used),
            ("CapBnd", 0),
            ("CapInh", 0),
            ("CapAmb", 0),
        ] {
            assert_eq!(
                status_caps(tid, key),
                Some(bits),
                "{key} of thread {tid}, for {caps:?}"
            );
        }
        assert_eq!(
            status_field(tid, "Uid").as_deref(),
            Some(uid.as_str()),
            "thread {tid}"
        );
        assert_eq!(status_field(tid, "NoNewPrivs").as_deref(), Some("1"));
        assert_eq!(
            status_field(tid, "Seccomp").as_deref(),
            Some("2"),
            "a seccomp filter"
        );
    }
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
    assert_eq!(https("/metrics", None).0, "401");
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
