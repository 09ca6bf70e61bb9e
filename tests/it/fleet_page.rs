//! The daemon's fleet page (issue #37) in a real headless Chromium, driven through the
//! DevTools protocol (puppeteer-core, tests/web/fleet_page.cjs): with a real gunicorn fleet
//! under load profiled, the table lists every worker, and clicking one shows its flamegraph
//! with the WSGI handler, and in each view of the samples (on a CPU, holding the GIL, by entry
//! into the program's code); a function named with markup shows as text; a live and a past
//! window download in every format; two past windows of a service compare. The daemon wants a
//! token: the browser signs in at `/login` (a wrong token refused) and holds a cookie its
//! scripts cannot read. The screenshots stay in
//! `$CARGO_TARGET_TMPDIR/fleet-page/`.

use crate::common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn the_fleet_page_lists_the_workers_and_shows_a_workers_flamegraph() {
    // Alone: HTTP load on a gunicorn fleet, a daemon and a browser.
    let _machine = alone();
    let (Some(chromium), Some(node), Some(venv)) = (
        tool("chromium", SETUP_FORMAT_TOOLS),
        tool("node", SETUP_FORMAT_TOOLS),
        gunicorn_venv("gunicorn-3.15"),
    ) else {
        return;
    };
    let Some(package) = provided(
        "puppeteer-core",
        format_tools_dir().join("puppeteer/node_modules/puppeteer-core/package.json"),
        SETUP_FORMAT_TOOLS,
    ) else {
        return;
    };
    // node_modules, for NODE_PATH.
    let modules = package
        .parent()
        .and_then(|p| p.parent())
        .unwrap()
        .to_path_buf();
    let (port, page_port) = (free_port(), free_port());
    let g = gunicorn("gunicorn 3.15", &venv, port, 2);
    let workers: Vec<i32> = children(g.pid()).into_iter().collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let interp = any_interpreter();
    let mut hostile = Proc::python(&interp.label, &interp.path, "hostile_names.py", &["ready"]);
    hostile.wait_for_file("ready", Duration::from_secs(30));
    let out = tempdir("pyfleet-page-");
    // The daemon wants a token: the browser signs in with it at /login.
    let token = "fleet-page-token-0123456789abcdef";
    let token_file = out.path().join("token");
    write_token_file(&token_file, token);
    let daemon = Running::start(
        pyfleet_command(&[
            "run",
            "--pid",
            &g.pid().to_string(),
            "--subprocesses",
            "--pid",
            &hostile.pid().to_string(),
            "--mode",
            "wall",
            // The budget of a core: a debug build under this load would lower the rate
            // (to 7 Hz in one run), and windows would hold a few samples.
            "--max-cpu",
            "100",
            "--snapshot-interval",
            "3s",
            "--out",
            out.path().join("snapshots").to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{page_port}"),
            "--listen-token-file",
            token_file.to_str().unwrap(),
        ]),
        Duration::from_secs(120),
    );
    // Two phases of load: requests that sleep in `sleep_page`, then requests that compute in
    // `render_page`: snapshots of each, to compare.
    let load = |seconds: &str, path: &str| {
        Proc::spawn(
            "load",
            &interp.path,
            &[
                target_script("load.py").display().to_string(),
                "127.0.0.1".into(),
                port.to_string(),
                seconds.into(),
                "4".into(),
                path.into(),
            ],
        )
    };
    let mut sleeping = load("8", "/sleep");
    wait_until(
        Duration::from_secs(30),
        "the first phase's load to end",
        || sleeping.exited().is_some(),
        || "still loading".into(),
    );
    let _computing = load("180", "/");
    std::thread::sleep(Duration::from_secs(8));
    let snapshots = out.path().join("snapshots");
    let holding = |name: &str, f: &str| {
        std::fs::read_to_string(snapshots.join(name).join("all.folded"))
            .is_ok_and(|t| t.contains(f))
    };
    let mut names: Vec<String> = std::fs::read_dir(&snapshots)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let base = names
        .iter()
        .find(|n| holding(n, "sleep_page (") && !holding(n, "render_page ("))
        .cloned()
        .unwrap_or_else(|| panic!("no window of the first phase alone: {names:?}"));
    let new = names
        .iter()
        .rev()
        .find(|n| holding(n, "render_page (") && !holding(n, "sleep_page ("))
        .cloned()
        .unwrap_or_else(|| panic!("no window of the second phase alone: {names:?}"));
    // Each row: pid, process, Python, role, service, state, samples/s, ...
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-page");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let pids: Vec<String> = workers.iter().map(i32::to_string).collect();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/fleet_page.cjs");
    let mut cmd = Command::new(node);
    cmd.arg(script)
        .arg(&chromium)
        .arg(format!("http://127.0.0.1:{page_port}/"))
        .arg(&shots)
        .arg(pids.join(","))
        .arg("fib_work")
        .arg(hostile.pid().to_string())
        .arg("<img src=x onerror=")
        .arg(&base)
        .arg(&new)
        .arg("render_page")
        .arg(token)
        .env("NODE_PATH", &modules);
    // Without the token or its cookie, nothing of the page's data is served.
    for path in [
        "/api/fleet",
        "/api/snapshots",
        "/api/window?seconds=1",
        "/windows/1/window.svg",
    ] {
        let answer = http_get(page_port, path).map(|(status, _)| status);
        assert_eq!(answer, Some(401), "{path}");
    }
    let browsed = run_with_timeout(cmd, Duration::from_secs(240));
    send_signal(daemon.pid(), libc::SIGTERM);
    let ran = daemon.finish();
    assert!(
        browsed.success(),
        "{}\n{}",
        browsed.describe(),
        ran.describe()
    );
    let seen: serde_json::Value = serde_json::from_str(browsed.stdout.trim()).unwrap();
    let rows = seen["rows"].as_array().unwrap();
    for pid in &pids {
        assert!(
            rows.iter().any(|r| r[0] == pid.as_str()
                && r[2].as_str().is_some_and(|v| v.starts_with("3.15"))
                && r[3] == "worker"),
            "worker {pid} not listed as one: {rows:?}"
        );
    }
    assert!(seen["wrong_token_refused"] == true, "{seen}");
    assert!(seen["cookie_hidden"] == true, "{seen}");
    assert_eq!(seen["injected"], 0, "{seen}");
    assert!(seen["flamegraph_has_function"] == true, "{seen}");
    assert!(
        seen["process_row_visible"] == true,
        "the clicked process's row shows in the pane without scrolling: {seen}"
    );
    assert!(seen["title"].as_str().unwrap().contains(&pids[0]), "{seen}");
    // Each view of the always-on samples, without a restart: titled after it, said what it
    // shows in the daemon's mode; by entry, every stack through the app's handler starts at
    // it (the server's frames above it cut).
    for (view, described) in [
        ("cpu", "on a CPU"),
        ("gil", "holding the GIL"),
        ("entry", "by entry into the program's code"),
    ] {
        let v = &seen["views"][view];
        assert!(
            v["title"]
                .as_str()
                .is_some_and(|t| t.ends_with(&format!(", {described}"))),
            "{view}: {v}"
        );
        assert!(
            v["note"].as_str().is_some_and(|n| !n.is_empty()),
            "{view}: {v}"
        );
    }
    let entry = &seen["views"]["entry"];
    assert!(entry["handler_lines"].as_u64() > Some(0), "{entry}");
    assert_eq!(
        entry["rooted_at_handler"], entry["handler_lines"],
        "{entry}"
    );
    // Under the process's root in every other view: the server's frames come first.
    assert!(
        seen["views"]["cpu"]["rooted_at_handler"] == 0,
        "{}",
        seen["views"]["cpu"]
    );
    assert_eq!(seen["service_view"], "service gunicorn", "{seen}");
    assert!(seen["hostile_shown_as_text"] == true, "{seen}");
    assert_eq!(seen["hostile_elements"], 0, "{seen}");
    assert_eq!(seen["page_title"], "pyfleet", "{seen}");
    // The worker's live window and the service's past window, each downloaded in every
    // format: what the format is, with the function shown.
    for which in ["live_downloads", "past_downloads"] {
        let d = &seen[which];
        for format in ["folded", "svg", "speedscope", "pprof"] {
            assert_eq!(d[format]["status"], 200, "{which} {format}: {d}");
            assert!(
                d[format]["size"].as_u64() > Some(100),
                "{which} {format}: {d}"
            );
        }
        assert!(d["folded"]["has_function"] == true, "{which}: {d}");
        assert!(
            d["svg"]["svg"] == true && d["svg"]["has_function"] == true,
            "{which}: {d}"
        );
        assert!(
            d["speedscope"]["schema"]
                .as_str()
                .is_some_and(|s| s.contains("speedscope"))
                && d["speedscope"]["has_function"] == true,
            "{which}: {d}"
        );
        assert!(d["pprof"]["gzip"] == true, "{which}: {d}");
    }
    assert!(
        seen["past_title"]
            .as_str()
            .is_some_and(|t| t.starts_with("service gunicorn, ") && t.ends_with(new.as_str())),
        "{seen}"
    );
    // The differential view: the handler that computes grew, the one that sleeps shrank.
    let titles: Vec<&str> = seen["diff_titles"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    // A frame's change is its own samples' (inferno's): the computing handler's work, all of
    // it in `fib_work` frames, grew by its share of the new window.
    let grown: f64 = titles
        .iter()
        .filter(|t| t.starts_with("fib_work ("))
        .filter_map(|t| {
            t.rsplit_once("; ")?
                .1
                .trim_end_matches(')')
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
        })
        .sum();
    assert!(
        grown > 10.0,
        "the computing handler should have grown ({grown:+.1} points): {titles:?}"
    );
    for shot in [
        "table.png",
        "flamegraph.png",
        "service.png",
        "hostile.png",
        "past.png",
        "diff.png",
        "view-cpu.png",
        "view-gil.png",
        "view-entry.png",
    ] {
        let bytes = std::fs::metadata(shots.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(bytes > 1000, "{shot}: {bytes} bytes");
    }
}
