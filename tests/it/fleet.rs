//! The fleet daemon end to end: gunicorn (3 workers, Python 3.15) and a second gunicorn on
//! Python 3.11 under HTTP load, `pyfleet --match gunicorn` for a short --duration, a worker
//! killed with SIGKILL mid-run. Checks the snapshots (files, the WSGI handler's functions,
//! the replacement worker's pid, SVG well-formed), a scrape of /metrics, two profiles pulled
//! at once by `go tool pprof` from `/debug/pprof/profile`, and bad input. And `run -- COMMAND`:
//! a program the daemon starts itself, profiled until it exits.

use crate::common::*;
use std::collections::BTreeSet;
use std::fs;
use std::time::{Duration, Instant};

fn well_formed_xml(svg: &[u8]) -> Result<(), String> {
    let mut reader = quick_xml::Reader::from_reader(svg);
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(quick_xml::events::Event::Eof) => return Ok(()),
            Ok(_) => buf.clear(),
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[test]
fn gunicorn_fleet_under_load_with_a_killed_worker() {
    // Alone: HTTP load on four workers fills the cores; the replacement worker must be sampled
    // within two scan intervals; `--match gunicorn` would take in any other test's gunicorn.
    let _machine = alone();
    let (Some(venv15), Some(venv11)) = (
        gunicorn_venv("gunicorn-3.15"),
        gunicorn_venv("gunicorn-3.11"),
    ) else {
        return;
    };
    let (port15, port11, metrics_port) = (free_port(), free_port(), free_port());
    let g15 = gunicorn("gunicorn 3.15", &venv15, port15, 3);
    let g11 = gunicorn("gunicorn 3.11", &venv11, port11, 1);
    let workers15 = children(g15.pid());
    let workers11 = children(g11.pid());
    let load_py = any_interpreter().path;
    let _load15 = Proc::spawn(
        "load 3.15",
        &load_py,
        &[
            target_script("load.py").display().to_string(),
            "127.0.0.1".into(),
            port15.to_string(),
            "18".into(),
        ],
    );
    let _load11 = Proc::spawn(
        "load 3.11",
        &load_py,
        &[
            target_script("load.py").display().to_string(),
            "127.0.0.1".into(),
            port11.to_string(),
            "18".into(),
            "2".into(),
        ],
    );

    let out_dir = tempdir("pyfleet-fleet-");
    let out = out_dir.path().join("snapshots");
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let daemon = Running::start(
        pyfleet_command(&[
            "--match",
            "gunicorn",
            "--duration",
            "16s",
            "--scan-interval",
            "1",
            "--snapshot-interval",
            "4s",
            // Wall mode: the masters, idle, must have files too. Read from outside: the reads'
            // caches and sample kinds are what the metrics below check (wall mode from the
            // capture has its own tests in capture.rs).
            "--mode",
            "wall",
            "--capture",
            "reads",
            "--out",
            out.to_str().unwrap(),
            "--metrics-addr",
            &metrics_addr,
            // Go's pprof fetches the URL itself and sends no token (docs/reference.md): this
            // loopback listener serves without one, as asked.
            "--insecure-listen",
        ]),
        Duration::from_secs(60),
    );

    // Kill a 3.15 worker once sampling is under way; gunicorn replaces it.
    std::thread::sleep(Duration::from_secs(4));
    let victim = *workers15.iter().next().unwrap();
    send_signal(victim, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(20);
    let replacement = loop {
        let now = children(g15.pid());
        if let Some(&new) = now.difference(&workers15).next() {
            break new;
        }
        assert!(
            Instant::now() < deadline,
            "gunicorn did not replace worker {victim}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    // The replacement is sampled within two scan intervals (1 s each) of appearing.
    let appeared = Instant::now();
    let series = format!("pid=\"{replacement}\"");
    loop {
        let page = http_get(metrics_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        if page
            .lines()
            .any(|l| l.starts_with("pyfleet_samples_total") && l.contains(&series))
        {
            break;
        }
        assert!(
            appeared.elapsed() < Duration::from_millis(2000 + 500),
            "replacement worker {replacement} not sampled within two scan intervals"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Mid-run scrape: per-pid cache and sampling-time series of a live worker.
    std::thread::sleep(Duration::from_secs(2));
    let (_, page) = http_get(metrics_port, "/metrics").expect("no /metrics");
    let live = *workers15.iter().find(|&&w| w != victim).unwrap();
    for metric in [
        "pyfleet_frame_cache_hits_total",
        "pyfleet_code_cache_hits_total",
        "pyfleet_sample_duration_seconds",
        "pyfleet_samples_total",
    ] {
        assert!(
            page.lines()
                .any(|l| l.starts_with(metric) && l.contains(&format!("pid=\"{live}\""))),
            "/metrics has no {metric} for pid {live}:\n{}",
            truncate(&page, 6000)
        );
    }
    assert!(
        page.contains("process=\"gunicorn\""),
        "{}",
        truncate(&page, 4000)
    );
    // The role label tells the masters from their workers.
    for (pid, role) in [(g15.pid(), "master"), (live, "worker")] {
        assert!(
            page.lines().any(|l| l.starts_with("pyfleet_samples_total")
                && l.contains(&format!("role=\"{role}\""))
                && l.contains(&format!("pid=\"{pid}\""))),
            "no {role} series for pid {pid}:\n{}",
            truncate(&page, 6000)
        );
    }
    assert!(
        page.contains("pyfleet_processes"),
        "{}",
        truncate(&page, 4000)
    );
    // Samples by cost: the master sleeps in its arbiter loop between wakes, so most of its
    // samples are kept after a check instead of read; each kind says what it cost.
    let value = |line: &str| -> f64 {
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad line {line}"))
    };
    let kind_of = |pid: i32, kind: &str| -> f64 {
        page.lines()
            .filter(|l| {
                l.starts_with("pyfleet_sample_kinds_total{")
                    && l.contains(&format!("pid=\"{pid}\""))
                    && l.contains(&format!("kind=\"{kind}\""))
            })
            .map(value)
            .sum()
    };
    assert!(
        kind_of(g15.pid(), "kept") > kind_of(g15.pid(), "checked") + kind_of(g15.pid(), "read"),
        "the idle master's samples should be mostly kept:\n{}",
        truncate(&page, 6000)
    );
    for kind in ["kept", "checked", "read"] {
        assert!(
            page.lines().any(|l| l.starts_with(&format!(
                "pyfleet_sample_kind_seconds_total{{kind=\"{kind}\"}}"
            ))),
            "no time for {kind} samples:\n{}",
            truncate(&page, 6000)
        );
    }
    // pyfleet's own CPU time, in fractional seconds (a few seconds of sampling at most: whole
    // seconds would often read 0 or 1).
    let cpu: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("pyfleet_cpu_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pyfleet_cpu_seconds_total:\n{}", truncate(&page, 4000)));
    assert!(
        cpu > 0.0 && cpu.fract() != 0.0,
        "pyfleet_cpu_seconds_total {cpu}"
    );

    // Pulled as from a Go service: two `go tool pprof` at once, each a complete 3 s profile of
    // the running fleet with the WSGI handler, its process's labels on every sample.
    if let Some(go) = tool("go", SETUP_FORMAT_TOOLS) {
        // What the daemon sampled in all, by its own counter: the pulls' windows lie between
        // two readings of it.
        let sampled_so_far = || -> f64 {
            let page = http_get(metrics_port, "/metrics")
                .map(|(_, body)| body)
                .unwrap_or_default();
            page.lines()
                .filter(|l| l.starts_with("pyfleet_samples_total{"))
                .map(value)
                .sum()
        };
        let (before, started) = (sampled_so_far(), Instant::now());
        let pprof_tmp = tempdir("pyfleet-pull-");
        let url = format!("http://{metrics_addr}/debug/pprof/profile?seconds=3");
        let pulls: Vec<Running> = (0..2)
            .map(|_| {
                let mut cmd = std::process::Command::new(&go);
                cmd.args(["tool", "pprof", "-raw", &url])
                    .env("PPROF_TMPDIR", pprof_tmp.path())
                    .env("HOME", pprof_tmp.path());
                Running::start(cmd, Duration::from_secs(60))
            })
            .collect();
        let workers: BTreeSet<i32> = workers15
            .iter()
            .chain(&workers11)
            .chain([&replacement])
            .copied()
            .collect();
        let got: Vec<RunOutput> = pulls.into_iter().map(Running::finish).collect();
        let sampled_per_second =
            (sampled_so_far() - before) / started.elapsed().as_secs_f64().max(1.0);
        for got in got {
            assert!(got.success(), "{}", got.describe());
            // `-raw`: after "Samples:" and the sample types, a line per sample starting with
            // its count (its labels on the lines below), until "Locations".
            let samples: u64 = got
                .stdout
                .lines()
                .skip_while(|l| !l.starts_with("Samples:"))
                .skip(2)
                .take_while(|l| !l.starts_with("Locations"))
                .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                .sum();
            assert!(
                got.stdout.contains("handle_request") && got.stdout.contains("fib_work"),
                "the pulled profile has no WSGI handler:\n{}",
                truncate(&got.stdout, 4000)
            );
            assert!(
                got.stdout.contains("service:[gunicorn]"),
                "{}",
                truncate(&got.stdout, 4000)
            );
            assert!(
                workers
                    .iter()
                    .any(|w| got.stdout.contains(&format!("pid:[{w}]"))),
                "no worker's pid label:\n{}",
                truncate(&got.stdout, 4000)
            );
            // A whole 3 s window: at least half of what the daemon sampled in 3 s while the
            // pulls ran (the CPU budget lowers the rate of the six processes under load, and
            // more on a busy machine: 546 samples were seen, and 132), and the window's
            // length as pprof says it.
            let expected = 3.0 * sampled_per_second;
            eprintln!("pulled {samples} samples; the daemon took {expected:.0} in 3 s");
            assert!(
                expected > 0.0
                    && samples as f64 >= expected / 2.0
                    && got.stdout.contains("Duration: 3s"),
                "{samples} samples in 3 s, the daemon took {expected:.0}:\n{}",
                truncate(&got.stdout, 4000)
            );
        }
    }
    for bad in ["seconds=0", "seconds=100000", "pid=abc"] {
        let (status, body) = http_get(metrics_port, &format!("/debug/pprof/profile?{bad}"))
            .unwrap_or_else(|| panic!("no answer to {bad}"));
        assert!(
            status == 400 && body.trim().lines().count() == 1,
            "{bad}: {status} {body}"
        );
    }
    // A pid the daemon does not profile (#34): a 404 at once, not an empty profile later.
    let asked = Instant::now();
    let (status, body) = http_get(metrics_port, "/debug/pprof/profile?seconds=3&pid=1")
        .expect("no answer for pid 1");
    assert!(
        status == 404
            && body.trim() == "pid 1 is not profiled by this daemon"
            && asked.elapsed() < Duration::from_secs(2),
        "pid 1: {status} {body} after {:?}",
        asked.elapsed()
    );

    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr.contains("gunicorn") && run.stderr.contains(out.to_str().unwrap()),
        "the startup line should say what is matched and where output goes:\n{}",
        run.stderr
    );

    let dirs = snapshot_dirs(&out);
    assert!(
        dirs.len() >= 3,
        "expected periodic + final snapshots, got {dirs:?}"
    );
    // The duration (16 s) ends on a snapshot boundary (every 4 s): the last periodic
    // snapshot is left to the final one, which is no sliver (#34).
    for d in &dirs {
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(d.join("metadata.json")).unwrap()).unwrap();
        let seconds = meta["window_seconds"].as_f64().unwrap_or(0.0);
        assert!(
            seconds >= 0.4,
            "a snapshot of {seconds} s in {} (of {dirs:?})",
            d.display()
        );
    }
    let mut files_seen = BTreeSet::new();
    let mut handler_seen = false;
    for d in &dirs {
        for e in fs::read_dir(d).unwrap().flatten() {
            let len = e.metadata().unwrap().len();
            assert!(len > 0, "{} is empty", e.path().display());
            files_seen.insert(e.file_name().to_string_lossy().into_owned());
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(d.join("metadata.json")).unwrap()).unwrap();
        assert_eq!(meta["mode"], "wall", "{}", d.display());
        for p in meta["processes"].as_array().unwrap() {
            let role = if p["pid"] == g15.pid() || p["pid"] == g11.pid() {
                "master"
            } else {
                "worker"
            };
            assert_eq!(p["role"], role, "{p}");
        }
        assert!(
            meta["window_start"].as_str() < meta["window_end"].as_str(),
            "{meta}"
        );
        let all = fs::read_to_string(d.join("all.folded")).unwrap();
        for line in all.lines() {
            let (stack, n) = line.rsplit_once(' ').expect("folded line without a count");
            assert!(n.parse::<u64>().is_ok(), "bad count in {line}");
            assert!(
                stack.starts_with("gunicorn-"),
                "fleet stacks start with process-pid: {line}"
            );
        }
        handler_seen |= all.contains("handle_request (") && all.contains("fib_work (");
        let svg = fs::read(d.join("flamegraph.svg")).unwrap();
        well_formed_xml(&svg).unwrap_or_else(|e| panic!("{}: not XML: {e}", d.display()));
    }
    assert!(
        handler_seen,
        "no snapshot shows the WSGI handler's functions"
    );
    // Each process's file says its role: a master and its workers are told apart by name.
    let masters = [g15.pid(), g11.pid()];
    let worker_pids = workers15.iter().chain(&workers11).chain([&replacement]);
    let named = worker_pids
        .map(|pid| (*pid, "worker"))
        .chain(masters.iter().map(|pid| (*pid, "master")));
    for (pid, role) in named {
        assert!(
            files_seen.contains(&format!("gunicorn-{role}-{pid}.folded")),
            "no snapshot of gunicorn {role} {pid} (replacement {replacement}, killed {victim}): {files_seen:?}"
        );
    }
    // Both Python versions' workers were sampled (their folded files have stacks).
    let last_with = |pid: i32| {
        dirs.iter()
            .rev()
            .find_map(|d| fs::read_to_string(d.join(format!("gunicorn-worker-{pid}.folded"))).ok())
    };
    let w11 = *workers11.iter().next().unwrap();
    assert!(
        last_with(w11).is_some_and(|t| t.contains("wsgi_app.py")),
        "3.11 worker {w11} has no handler stacks"
    );
}

#[test]
fn bad_daemon_input_fails_before_starting() {
    let _machine = shared();
    let tmp = tempdir("pyfleet-bad-");
    let file = tmp.path().join("file");
    fs::write(&file, "x").unwrap();
    let not_dir = file.join("out");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--match", "("], "invalid regex"),
        (vec!["--rate", "0"], "--rate"),
        (
            vec!["--metrics-addr", "localhost:notaport"],
            "--metrics-addr",
        ),
        (vec!["--out", not_dir.to_str().unwrap()], "--out"),
        (vec!["--mode", "fast"], "mode"),
    ];
    for (args, needle) in cases {
        let mut all = args.clone();
        all.extend(["--duration", "5"]);
        let out = pyfleet(&all);
        assert_error_contract(&out, Some(needle));
        assert!(
            out.elapsed < Duration::from_secs(3),
            "slow to fail: {}",
            out.describe()
        );
    }
}

/// `run -- python launched.py` on every version 3.11-3.15 (#34), as `record -- ...`: the
/// program is profiled from its start (its first half second, `early_work`: at least 20 of
/// about 50 samples at 100 Hz) until it exits; the daemon then writes its final snapshot and
/// exits with the program's status (3); with a multiprocessing pool (spawn) on one version,
/// both workers are profiled, named after the program. A program with processes to match
/// besides, or a duration, is refused in one line.
#[test]
fn run_starts_a_program_and_ends_with_it() {
    let _machine = shared();
    let dir = tempdir("pyfleet-run-launch-");
    for (interp, pool) in launched_cases() {
        let out = dir.path().join(&interp.label);
        let mut args = vec![
            "run".to_string(),
            // Samples by time, not by CPU used: a busy machine does not thin them.
            "--mode".into(),
            "wall".into(),
            "--out".into(),
            out.display().to_string(),
            "--metrics-addr".into(),
            "off".into(),
            "--snapshot-format".into(),
            "folded".into(),
        ];
        args.extend(launched_command(&interp, pool));
        let run = pyfleet(&args);
        let label = &interp.label;
        assert_eq!(run.status.code(), Some(3), "[{label}] {}", run.describe());
        // Every snapshot's stacks (one, unless a snapshot interval passed).
        let text: String = snapshot_dirs(&out)
            .iter()
            .map(|d| fs::read_to_string(d.join("all.folded")).unwrap_or_default())
            .collect();
        match check_launched_profile(&text, pool) {
            Ok((early, late)) => {
                eprintln!("[{label}] early_work {early}, late_work {late} samples")
            }
            Err(e) => panic!("[{label}] {e}:\n{}", run.describe()),
        }
    }

    let python = any_interpreter().path.display().to_string();
    for (extra, needle) in [
        (["--pid", "1"], "not both"),
        (["--match", "gunicorn"], "not both"),
        (["--duration", "5"], "--duration"),
    ] {
        let mut args = vec!["run", "--metrics-addr", "off"];
        args.extend(extra);
        args.extend(["--", python.as_str(), "-c", "pass"]);
        assert_error_contract(&pyfleet(&args), Some(needle));
    }
}
