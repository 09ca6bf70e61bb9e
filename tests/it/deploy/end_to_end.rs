//! End to end: a real pyfleet scraped by a real Prometheus with deploy/prometheus's config,
//! every query of the Grafana dashboard answered, and Parca's pull.

use super::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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
    // An asyncio service (3.15) sampled with --async: the task counts' panel.
    let tasks = ready_target(&python315_or_any(), "task_churn.py", &[]);

    let metrics_port = free_port();
    let out_dir = tmp.path().join("snapshots");
    let token = listen_token(tmp.path());
    let mut args: Vec<String> = vec!["run".into(), "--config".into()];
    args.push(deploy("pyfleet.toml").display().to_string());
    args.extend(["--listen-token-file".into(), token.display().to_string()]);
    for p in [&churn, &steady, &doomed, &tasks] {
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
            "--async",
        ]
        .map(String::from),
    );
    // The build users run (the release build under scripts/test.sh): a debug build reads the
    // churning target's seven deep threads in about 5 ms a sample, the slot's slow-sample
    // threshold, so it skips up to 64 ticks at a time and a 2 s pull can hold none of them.
    let daemon = Running::start(measured_command(&args), Duration::from_secs(100));
    // A second host, as deployed (cpu mode, the kernel capture) with a busy target: the
    // capture's panels have its series (Prometheus scrapes both, as it would two nodes).
    let busy = ready_target(&any, "profiled.py", &[]);
    let capture_port = free_port();
    let capture_out = tmp.path().join("capture-snapshots");
    let capture_daemon = Running::start(
        measured_command(&[
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
