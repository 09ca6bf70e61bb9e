//! The first fifteen minutes with real programs: a gunicorn app with a CPU-heavy and a
//! sleeping endpoint under load, recorded with the defaults (cpu mode ranks the CPU-heavy
//! handler first, and every output says so); `list` and `--exclude-role` telling the master
//! from its workers; a multiprocessing job with each start method, whose workers
//! `--subprocesses` finds and names after the script.
//!
//! Both tests have the machine alone: the multiprocessing job's nine busy workers saturate its
//! cores, and in cpu mode a thread waiting for a core counts as on CPU (the kernel reports both
//! as runnable), which is not what the gunicorn test measures.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Kills the processes when dropped (the multiprocessing job's workers outlive their parent).
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            try_signal(pid, libc::SIGKILL);
        }
    }
}

/// A child killed and waited for when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests `path` on `port` in a loop until `stop`.
fn load(port: u16, path: &'static str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            if http_get(port, path).is_some() {
                n += 1;
            }
        }
        n
    })
}

/// The pids at the roots of folded stacks (`<name>-<pid>;...`, `<name>-<role>-<pid>;...`),
/// with the rest of the root (`<name>` or `<name>-<role>`).
fn roots(folded: &str) -> BTreeMap<i32, String> {
    folded
        .lines()
        .filter_map(|l| {
            let root = l.split(';').next()?;
            let (name, pid) = root.rsplit_once('-')?;
            Some((pid.parse().ok()?, name.to_string()))
        })
        .collect()
}

#[test]
fn gunicorn_with_the_defaults_and_its_roles() {
    let _machine = alone();
    let Some(venv) = gunicorn_venv("gunicorn-3.15") else {
        return;
    };
    let port = free_port();
    let g = gunicorn("gunicorn 3.15", &venv, port, 2);
    let workers = children(g.pid());
    assert_eq!(workers.len(), 2);
    let stop = Arc::new(AtomicBool::new(false));
    // One client per endpoint, each waiting for its answer: the machine's two cores are not
    // saturated, so a thread the kernel calls runnable is running, not waiting for a core.
    let loaders: Vec<_> = ["/expensive", "/sleep"]
        .into_iter()
        .map(|p| load(port, p, stop.clone()))
        .collect();
    let bind = format!("127.0.0.1:{port}");
    let dir = tempdir("pyfleet-who-");

    // `list` tells the master from its workers.
    let out = pyfleet(&["list", "--match", &bind]);
    assert!(out.success(), "{}", out.describe());
    let mut roles = BTreeMap::new();
    for line in out.stdout.lines().skip(1) {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [pid, ppid, _, name, role, ..] = w[..] {
            roles.insert(
                pid.parse::<i32>().unwrap(),
                (ppid.to_string(), name.to_string(), role),
            );
        }
    }
    assert_eq!(roles.len(), 3, "{}", out.stdout);
    assert_eq!(roles[&g.pid()].2, "master", "{}", out.stdout);
    for w in &workers {
        let (ppid, name, role) = &roles[w];
        assert_eq!(
            (ppid.as_str(), name.as_str(), *role),
            (g.pid().to_string().as_str(), "gunicorn", "worker"),
            "{}",
            out.stdout
        );
    }

    // The defaults answer "where does the CPU go?".
    let svg = dir.path().join("rec.svg");
    let out = pyfleet(&[
        "record",
        "--match",
        &bind,
        "--duration",
        "4s",
        "-o",
        &svg.display().to_string(),
    ]);
    assert!(out.success(), "{}", out.describe());
    let last = out
        .stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.contains("(svg, cpu mode); hottest: fib_work (wsgi_app.py) "),
        "{}",
        out.describe()
    );
    let text = fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("cpu mode (threads on a CPU), 100 Hz"),
        "the SVG says its mode"
    );

    // Without the master, in wall mode (where its idle threads would show).
    let folded = dir.path().join("workers.folded");
    let out = pyfleet(&[
        "record",
        "--match",
        &bind,
        "--exclude-role",
        "master",
        "--mode",
        "wall",
        "--duration",
        "2",
        "-o",
        &folded.display().to_string(),
    ]);
    assert!(out.success(), "{}", out.describe());
    let seen = roots(&fs::read_to_string(&folded).unwrap());
    let seen_pids: BTreeSet<i32> = seen.keys().copied().collect();
    assert_eq!(seen_pids, workers, "{}", out.describe());
    assert!(
        seen.values().all(|name| name == "gunicorn-worker"),
        "workers are named by their role: {seen:?}"
    );

    stop.store(true, Ordering::Relaxed);
    let served: u64 = loaders.into_iter().map(|l| l.join().unwrap()).sum();
    assert!(served > 0);
}

#[test]
fn multiprocessing_workers_of_every_start_method() {
    let _machine = alone();
    let mut burners = KillOnDrop(Vec::new());
    let token = unique_token("mp");
    let py = any_interpreter();
    let dir = tempdir("pyfleet-mp-");
    let mut jobs = Vec::new();
    for method in ["fork", "spawn", "forkserver"] {
        let ready = format!("ready-{token}-{method}");
        let mut job = Proc::python(
            &py.label,
            &py.path,
            "mpjob.py",
            &[ready.as_str(), method, "8"],
        );
        let pids_file = job.wait_for_file(&ready, Duration::from_secs(60));
        let workers: BTreeSet<i32> = fs::read_to_string(&pids_file)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert_eq!(workers.len(), 3);
        burners.0.extend(workers.iter().copied());
        let out = dir.path().join(format!("{method}.folded"));
        let rec = start_pyfleet(&[
            "record",
            "--match",
            &format!("{ready} {method}"),
            "--subprocesses",
            "--duration",
            "3",
            "-o",
            &out.display().to_string(),
        ]);
        jobs.push((method, job, workers, out, rec));
    }
    // Without --subprocesses, spawn's workers (`python -c "from multiprocessing..."`) match
    // by the command line of the program they work for (#34), as its workers; its resource
    // tracker is its helper.
    let (_, _, spawned, _, _) = &jobs[1];
    let alone = dir.path().join("alone.folded");
    let out = pyfleet(&[
        "record",
        "--match",
        &format!("ready-{token}-spawn spawn"),
        "--duration",
        "1",
        "-o",
        &alone.display().to_string(),
    ]);
    assert!(out.success(), "{}", out.describe());
    let seen = roots(&fs::read_to_string(&alone).unwrap_or_default());
    for w in spawned {
        assert_eq!(
            seen.get(w).map(String::as_str),
            Some("mpjob-worker"),
            "[spawn, no --subprocesses] worker {w}: {seen:?}\n{}",
            out.describe()
        );
    }
    let listed = pyfleet(&["list", "--match", &format!("ready-{token}-spawn spawn")]);
    assert!(listed.success(), "{}", listed.describe());
    let helpers: Vec<&str> = listed
        .stdout
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some("helper"))
        .collect();
    assert!(
        helpers.len() == 1 && helpers[0].contains("resource_tracker"),
        "the spawn job's resource tracker should be its one helper:\n{}",
        listed.stdout
    );
    for w in spawned {
        assert!(
            listed.stdout.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.first() == Some(&w.to_string().as_str()) && f.get(4) == Some(&"worker")
            }),
            "worker {w} not listed as a worker:\n{}",
            listed.stdout
        );
    }
    for (method, _job, workers, out, rec) in jobs {
        let run = rec.finish();
        assert!(run.success(), "[{method}] {}", run.describe());
        let seen = roots(&fs::read_to_string(&out).unwrap_or_default());
        for w in &workers {
            assert_eq!(
                seen.get(w).map(String::as_str),
                Some("mpjob-worker"),
                "[{method}] worker {w} not sampled as mpjob: {seen:?}\n{}",
                run.describe()
            );
        }
    }
}

#[test]
fn python_a_wrapper_execs_after_it_settled_is_found() {
    // An entry script that sets things up, then execs the server (as containers start): the
    // scan has long settled that the wrapper is no Python process (5 s) when the same pid
    // becomes one; its new command name tells the scan to look at it again.
    let _machine = shared();
    let Some(interp) = interpreters().into_iter().next() else {
        return;
    };
    let token = format!("exec-later-{}", std::process::id());
    let wrapper = format!(
        "sleep 6; exec {} -c 'while True: sum(range(1000))' {token}",
        interp.path.display()
    );
    let child = Reaped(
        std::process::Command::new("/bin/sh")
            .args(["-c", &wrapper])
            .spawn()
            .expect("sh starts"),
    );
    let pid = child.0.id() as i32;
    let dir = tempdir("pyfleet-exec-");
    let out = pyfleet(&[
        "run",
        "--match",
        &token,
        "--duration",
        "10",
        "--metrics-addr",
        "off",
        "--snapshot-format",
        "folded",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    drop(child);
    let folded: String = snapshot_dirs(dir.path())
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_name() == "all.folded")
        .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let samples: u64 = folded
        .lines()
        .filter(|l| roots(l).contains_key(&pid))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    // About 3 s of the busy loop at 100 Hz after the exec (300 samples); 50 leaves room for
    // a loaded machine and a slow first probe.
    assert!(
        out.success() && samples >= 50,
        "{samples} samples of the exec'd process {pid} [{}]; {}\n{}",
        interp.label,
        out.describe(),
        truncate(&folded, 600)
    );
}

/// A real uvicorn app with two workers (multiprocessing's spawn: `python -c "from
/// multiprocessing.spawn..."`): `list --match uvicorn` shows the master, both workers by the
/// master's name and the resource tracker as the master's helper, with and without
/// `--subprocesses` (#34).
#[test]
fn uvicorn_workers_are_matched_and_its_resource_tracker_is_a_helper() {
    let _machine = shared();
    let Some(python) = gunicorn_venv("gunicorn-3.15") else {
        return;
    };
    let port = free_port();
    let port_arg = port.to_string();
    let targets = targets_dir();
    // Gunicorn's guard kills the master and its children alike.
    let server = Gunicorn(Proc::spawn(
        "uvicorn",
        &python,
        &[
            "-m",
            "uvicorn",
            "asgi_app:app",
            "--app-dir",
            targets.to_str().unwrap(),
            "--workers",
            "2",
            "--port",
            &port_arg,
        ],
    ));
    let master = server.pid();
    wait_until(
        Duration::from_secs(60),
        "uvicorn to serve with two workers and its resource tracker",
        || http_get(port, "/").is_some_and(|(s, _)| s == 200) && children(master).len() == 3,
        || server.0.stderr(),
    );
    let kids = children(master);
    let role_of = |out: &RunOutput, pid: i32| -> Option<(String, String)> {
        out.stdout.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.first()? != &pid.to_string().as_str() {
                return None;
            }
            Some((f.get(3)?.to_string(), f.get(4)?.to_string()))
        })
    };
    for extra in [&[][..], &["--subprocesses"][..]] {
        let mut args = vec!["list", "--match", "uvicorn asgi_app:app"];
        args.extend_from_slice(extra);
        let out = pyfleet(&args);
        assert!(out.success(), "{}", out.describe());
        assert_eq!(
            role_of(&out, master),
            Some(("uvicorn".into(), "master".into())),
            "{extra:?}\n{}",
            out.stdout
        );
        let mut roles: Vec<String> = Vec::new();
        for &kid in &kids {
            let (name, role) = role_of(&out, kid)
                .unwrap_or_else(|| panic!("{extra:?}: child {kid} not listed\n{}", out.stdout));
            assert_eq!(name, "uvicorn", "{extra:?}\n{}", out.stdout);
            let cmdline = fs::read_to_string(format!("/proc/{kid}/cmdline")).unwrap_or_default();
            let expected = match cmdline.contains("resource_tracker") {
                true => "helper",
                false => "worker",
            };
            assert_eq!(role, expected, "{extra:?} child {kid}\n{}", out.stdout);
            roles.push(role);
        }
        roles.sort();
        assert_eq!(roles, ["helper", "worker", "worker"], "{}", out.stdout);
    }
    drop(server);
}
