//! The daemon's listeners as a security reviewer of a root agent reads them (issue #33).
//!
//! - Off loopback, profiles need a credential: a daemon bound to 0.0.0.0 in a network
//!   namespace the test makes (nothing outside it reaches the daemon; clients run in it through
//!   `nsenter`) answers 401 and one line without the token and with a wrong one, and with the
//!   right one a profile `go tool pprof` reads; over TLS with client certificates from a test
//!   CA, a client with a certificate gets a profile `go tool pprof` reads and a client without
//!   one, or with another CA's, gets no answer. Started wide without a credential, it refuses with
//!   one line.
//! - Probes cannot be starved: 64 slow clients from one address hold what they may of the site
//!   and of the probes' listener (8 and 4 slots), and the health endpoint, readiness and
//!   `/metrics` for a well-behaved scraper still answer within a second.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TOKEN: &str = "3f1c9a7e5b2d4c6a8e0f1b3d5a7c9e1f";

/// A daemon listening on 0.0.0.0 in a network namespace of its own: its site on `port`
/// (`scheme`), its probes' listener on `health`.
struct Isolated {
    daemon: Running,
    port: u16,
    scheme: &'static str,
}

impl Isolated {
    /// `pyfleet run ARGS --metrics-addr 0.0.0.0:PORT --health-addr 0.0.0.0:HEALTH` in a new
    /// network namespace (its loopback up), once its probes' listener answers.
    fn start(args: &[&str]) -> Option<Isolated> {
        let unshare = tool("unshare", SETUP_DEPLOY_TOOLS)?;
        tool("ip", SETUP_DEPLOY_TOOLS)?;
        tool("nsenter", SETUP_DEPLOY_TOOLS)?;
        tool("curl", SETUP_DEPLOY_TOOLS)?;
        // Free here; the namespace has every port free.
        let (port, health) = (free_port(), free_port());
        let mut cmd = Command::new(unshare);
        cmd.args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
            .arg(pyfleet_exe())
            .arg("run")
            .args(args)
            .args(["--metrics-addr", &format!("0.0.0.0:{port}")])
            .args(["--health-addr", &format!("0.0.0.0:{health}")])
            .env_remove("RUST_LOG");
        let scheme = match args.contains(&"--listen-tls-cert") {
            true => "https",
            false => "http",
        };
        let isolated = Isolated {
            daemon: Running::start(cmd, Duration::from_secs(90)),
            port,
            scheme,
        };
        // `unshare` and `sh` exec in place: the daemon keeps the spawned pid.
        let url = format!("http://127.0.0.1:{health}/readyz");
        let ready = || {
            let mut cmd = isolated.command(Path::new("curl"));
            cmd.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &url]);
            run_with_timeout(cmd, Duration::from_secs(10)).stdout.trim() == "200"
        };
        wait_until(
            Duration::from_secs(20),
            "the isolated daemon's readiness",
            ready,
            String::new,
        );
        Some(isolated)
    }

    /// `PROGRAM` run in the daemon's network namespace.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.daemon.pid().to_string(), "-n"])
            .arg(program);
        cmd
    }

    /// `curl ARGS URL` for `path` on the site, in the namespace: (stdout, whether curl
    /// succeeded).
    fn curl(&self, args: &[&str], path: &str) -> (String, bool) {
        let mut cmd = self.command(Path::new("curl"));
        cmd.args(args)
            .arg(format!("{}://127.0.0.1:{}{path}", self.scheme, self.port));
        let out = run_with_timeout(cmd, Duration::from_secs(30));
        (out.stdout.trim().to_string(), out.success())
    }

    /// The status code of `GET path` on the site by curl with `extra` arguments (000 when no
    /// answer came), and whether curl succeeded.
    fn status(&self, extra: &[&str], path: &str) -> (String, bool) {
        let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}"];
        args.extend_from_slice(extra);
        self.curl(&args, path)
    }

    fn stop(self) -> RunOutput {
        send_signal(self.daemon.pid(), libc::SIGTERM);
        self.daemon.finish()
    }
}

/// A target busy in known functions (profiled.py), running once it wrote its file in `dir`.
fn busy_target(dir: &Path) -> Proc {
    let interp = any_interpreter();
    let ready = dir.join("target-ready");
    let mut target = Proc::python(&interp.label, &interp.path, "profiled.py", &[&ready]);
    target.wait_for_path(&ready, Duration::from_secs(30));
    target
}

/// `go tool pprof -raw FILE`: what it printed, or why it failed.
fn pprof_raw(go: &Path, file: &Path, home: &Path) -> RunOutput {
    let mut cmd = Command::new(go);
    cmd.args(["tool", "pprof", "-raw"])
        .arg(file)
        .env("PPROF_TMPDIR", home)
        .env("HOME", home);
    run_with_timeout(cmd, Duration::from_secs(60))
}

#[test]
fn profiles_off_loopback_need_a_credential() {
    let _machine = shared();
    let Some(go) = tool("go", SETUP_FORMAT_TOOLS) else {
        return;
    };
    let dir = tempdir("pyfleet-listener-");
    let token_file = dir.path().join("token");
    write_token_file(&token_file, TOKEN);
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap();

    // Wide and unguarded: refused before anything starts.
    let refused = pyfleet(&[
        "run",
        "--metrics-addr",
        "0.0.0.0:9",
        "--duration",
        "1",
        "--out",
        out_arg,
    ]);
    assert_error_contract(&refused, Some("--insecure-listen"));
    let short = dir.path().join("short");
    std::fs::write(&short, "secret\n").unwrap();
    let weak = pyfleet(&[
        "run",
        "--metrics-addr",
        "0.0.0.0:9",
        "--listen-token-file",
        short.to_str().unwrap(),
        "--out",
        out_arg,
    ]);
    assert_error_contract(&weak, Some("32 characters"));
    // A good token, but in the clear off loopback: refused unless asked for.
    let clear = pyfleet(&[
        "run",
        "--metrics-addr",
        "0.0.0.0:9",
        "--listen-token-file",
        token_file.to_str().unwrap(),
        "--out",
        out_arg,
    ]);
    assert_error_contract(&clear, Some("--listen-tls-cert"));
    assert!(!out.exists(), "a refused start created {}", out.display());

    let target = busy_target(dir.path());
    let pid = target.pid().to_string();
    // Plain HTTP, as asked (the network namespace is the trusted network).
    let Some(daemon) = Isolated::start(&[
        "--pid",
        &pid,
        "--listen-token-file",
        token_file.to_str().unwrap(),
        "--listen-token-over-http",
        "--listen-metrics-token",
        "--duration",
        "60",
        "--out",
        out_arg,
    ]) else {
        return;
    };
    let profile = "/debug/pprof/profile?seconds=1";
    let status = |args: &[&str], path: &str| -> (String, String) {
        let body = dir.path().join("body");
        let _ = std::fs::remove_file(&body);
        let mut all = vec!["-s", "-o", body.to_str().unwrap(), "-w", "%{http_code}"];
        all.extend_from_slice(args);
        let (code, _) = daemon.curl(&all, path);
        (code, std::fs::read_to_string(&body).unwrap_or_default())
    };
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    let one_line = |body: &str| body.trim().lines().count() == 1 && body.ends_with('\n');
    for (what, header) in [
        ("no credential", None),
        ("a wrong token", Some(bearer(&format!("{}0", &TOKEN[1..])))),
        (
            "the token with a byte more",
            Some(bearer(&format!("{TOKEN}0"))),
        ),
        (
            "the token as basic",
            Some(format!("Authorization: Basic {TOKEN}")),
        ),
        (
            "the token as the session cookie",
            Some(format!("Cookie: pyfleet_session={TOKEN}")),
        ),
    ] {
        // The fleet page and what it fetches name processes and show stacks: the same rule.
        for path in [
            profile,
            "/metrics",
            "/",
            "/api/fleet",
            "/flamegraph.svg?seconds=1",
            "/api/snapshots",
            "/diff.svg?base=a&new=b",
            "/snapshots/2026-11-28T10-00-00Z/all.folded",
            "/snapshots/2026-11-28T10-00-00Z/window.pb.gz",
            "/api/window?seconds=1",
            "/windows/1/window.folded",
        ] {
            let args: Vec<&str> = header.iter().flat_map(|h| ["-H", h.as_str()]).collect();
            let (code, body) = status(&args, path);
            // The page itself: the form a browser signs in with.
            let refusal = match path {
                "/" => body.contains("action=\"/login\"") && !body.contains("<table"),
                _ => one_line(&body),
            };
            assert!(
                code == "401" && refusal,
                "{path} with {what}: {code} {body:?}"
            );
        }
    }
    // Signing in at /login: a wrong token is refused, the right one answered with a cookie
    // that is not the token and opens the page's data.
    let login = |given: &str| {
        let headers = dir.path().join("headers");
        let form = format!("token={given}\r\n");
        let (code, _) = status(
            &[
                "-D",
                headers.to_str().unwrap(),
                "-H",
                "Content-Type: text/plain",
                "--data-binary",
                &form,
            ],
            "/login",
        );
        (code, std::fs::read_to_string(&headers).unwrap_or_default())
    };
    let (code, headers) = login(&format!("{TOKEN}0"));
    assert!(
        code == "401" && !headers.to_ascii_lowercase().contains("set-cookie"),
        "{code} {headers}"
    );
    let (code, headers) = login(TOKEN);
    let cookie = headers
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or(l.strip_prefix("Set-Cookie: "))
        })
        .and_then(|c| c.split(';').next())
        .unwrap_or_default()
        .to_string();
    assert!(
        code == "303" && cookie.starts_with("pyfleet_session=") && !cookie.contains(TOKEN),
        "{code} {headers}"
    );
    // The page's own request carries its header; another page's (an <img>, a link, a form)
    // cannot.
    let (code, body) = status(
        &[
            "-H",
            &format!("Cookie: {cookie}"),
            "-H",
            "X-Pyfleet-Page: 1",
        ],
        "/api/fleet",
    );
    assert!(
        code == "200" && body.contains("\"processes\""),
        "/api/fleet with the session cookie: {code} {body}"
    );
    let (code, _) = status(&["-H", &format!("Cookie: {cookie}")], "/api/fleet");
    assert_eq!(
        code, "401",
        "/api/fleet with the cookie but not the page's header"
    );
    // Health says nothing of the targets: open.
    assert_eq!(status(&[], "/healthz").0, "200");
    let right = bearer(TOKEN);
    let (code, body) = status(&["-H", &right], "/metrics");
    assert!(
        code == "200" && body.contains("pyfleet_samples_total"),
        "/metrics with the token: {code}"
    );
    let (code, body) = status(&["-H", &right], "/api/fleet");
    assert!(
        code == "200" && body.contains("\"processes\""),
        "/api/fleet with the token: {code} {body}"
    );

    // The right token: a profile `go tool pprof` reads (fetched by curl: pprof sends no
    // headers of its own).
    let pulled = dir.path().join("pulled.pb.gz");
    let (code, _) = daemon.curl(
        &[
            "-s",
            "-o",
            pulled.to_str().unwrap(),
            "-w",
            "%{http_code}",
            "-H",
            &right,
        ],
        "/debug/pprof/profile?seconds=2",
    );
    assert_eq!(code, "200");
    let read = pprof_raw(&go, &pulled, dir.path());
    assert!(
        read.success() && read.stdout.contains("pyfleet_hot_leaf"),
        "{}",
        read.describe()
    );

    // A wrong token costs what a missing one does: no early exit, no penalty. Medians of 15
    // requests of each kind, taken in turn (curl's own timing of the exchange, not its
    // start-up; a busy machine slows the three kinds alike).
    let near = bearer(&format!("{}0", &TOKEN[..TOKEN.len() - 1]));
    let far = bearer("0000000000000000000000000000000000");
    let kinds = [None, Some(near.as_str()), Some(far.as_str())];
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..15 {
        for (kind, header) in kinds.iter().enumerate() {
            let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{time_total}"];
            if let Some(h) = header {
                args.extend(["-H", *h]);
            }
            let took = daemon.curl(&args, profile).0.parse().unwrap_or(f64::MAX);
            times[kind].push(took);
        }
    }
    let [t_none, t_near, t_far] = times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    eprintln!("401 medians: none {t_none:.4} s, near {t_near:.4} s, far {t_far:.4} s");
    assert!(
        (t_near - t_far).abs() < 0.005 && (t_near - t_none).abs() < 0.005,
        "401s took different times: none {t_none} s, a token one byte off {t_near} s, \
         a token all wrong {t_far} s"
    );
    let run = daemon.stop();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr
            .contains("(profiles need the token; /metrics the token)"),
        "the startup line should say what the listener asks:\n{}",
        run.stderr
    );
    drop(target);
}

#[test]
fn profiles_over_tls_need_a_client_certificate() {
    let _machine = shared();
    let Some(go) = tool("go", SETUP_FORMAT_TOOLS) else {
        return;
    };
    let dir = tempdir("pyfleet-listener-tls-");
    let Some(ca) = TestCa::make(dir.path()) else {
        return;
    };
    let target = busy_target(dir.path());
    let pid = target.pid().to_string();
    let out = dir.path().join("out");
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let Some(daemon) = Isolated::start(&[
        "--pid",
        &pid,
        "--listen-tls-cert",
        &s(&ca.server_cert),
        "--listen-tls-key",
        &s(&ca.server_key),
        "--listen-client-ca",
        &s(&ca.ca),
        "--duration",
        "60",
        "--out",
        out.to_str().unwrap(),
    ]) else {
        return;
    };
    let profile = "/debug/pprof/profile?seconds=1";
    let cacert = s(&ca.ca);
    // No client certificate, or one of another CA: the handshake fails, nothing is served.
    let rogue = [
        "--cert",
        ca.rogue_cert.to_str().unwrap(),
        "--key",
        ca.rogue_key.to_str().unwrap(),
    ];
    for (what, extra) in [
        ("no client certificate", &[][..]),
        ("another CA's certificate", &rogue),
    ] {
        let mut args = vec!["--cacert", cacert.as_str()];
        args.extend_from_slice(extra);
        let (code, ok) = daemon.status(&args, profile);
        assert!(!ok && code == "000", "{what}: curl got {code}");
    }
    // The CA's client certificate gets past the handshake.
    let client = [
        "--cert",
        ca.client_cert.to_str().unwrap(),
        "--key",
        ca.client_key.to_str().unwrap(),
    ];
    let mut args = vec!["--cacert", cacert.as_str()];
    args.extend(client);
    assert_eq!(daemon.status(&args, "/metrics"), ("200".to_string(), true));

    // A profile pulled with the client certificate, which `go tool pprof` reads (Debian's Go
    // 1.19 `go tool pprof` presents no client certificate: its fetcher ignores -tls_cert).
    let pulled = dir.path().join("pulled.pb.gz");
    let mut args = vec!["-s", "-o", pulled.to_str().unwrap(), "-w", "%{http_code}"];
    args.extend(["--cacert", &cacert]);
    args.extend(client);
    assert_eq!(
        daemon.curl(&args, "/debug/pprof/profile?seconds=2"),
        ("200".to_string(), true)
    );
    let got = pprof_raw(&go, &pulled, dir.path());
    assert!(
        got.success() && got.stdout.contains("pyfleet_hot_leaf"),
        "{}",
        got.describe()
    );
    let run = daemon.stop();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr.contains("on https://0.0.0.0:")
            && run
                .stderr
                .contains("(profiles need a client certificate; /metrics a client certificate)"),
        "{}",
        run.stderr
    );
    drop(target);
}

#[test]
fn probes_and_scrapes_are_served_beside_64_slow_clients() {
    let _machine = shared();
    let dir = tempdir("pyfleet-listener-slow-");
    let target = busy_target(dir.path());
    let (site, health) = (free_port(), free_port());
    let daemon = start_pyfleet(&[
        "run",
        "--pid",
        &target.pid().to_string(),
        "--metrics-addr",
        &format!("127.0.0.1:{site}"),
        "--health-addr",
        &format!("127.0.0.1:{health}"),
        "--duration",
        "60",
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    wait_until(
        Duration::from_secs(20),
        "the daemon's readiness",
        || http_get(health, "/readyz").is_some_and(|(s, _)| s == 200),
        String::new,
    );
    let python = any_interpreter().path;
    let script = targets_dir().join("../tools/slow_clients.py");
    // 64 slow clients on each listener, each group from one address of its own.
    let mut groups = Vec::new();
    for (port, source, name) in [(site, "127.0.0.5", "site"), (health, "127.0.0.6", "health")] {
        let counted = dir.path().join(name);
        let args = [
            script.to_str().unwrap(),
            &port.to_string(),
            source,
            "64",
            counted.to_str().unwrap(),
            "30",
        ];
        groups.push((Proc::spawn(name, &python, &args), counted));
    }
    let held: Vec<u32> = groups
        .iter_mut()
        .map(|(proc, counted)| {
            proc.wait_for_path(counted, Duration::from_secs(20));
            std::fs::read_to_string(&*counted)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    // Each listener keeps what one peer may hold, and closes the rest at once.
    assert_eq!(
        held,
        vec![8, 4],
        "slow connections held by the site and the probes' listener"
    );
    for (port, path, what) in [
        (health, "/healthz", "health"),
        (health, "/readyz", "readiness"),
        (site, "/metrics", "a scrape"),
        (site, "/healthz", "health on the site"),
    ] {
        let asked = Instant::now();
        let answer = http_get(port, path);
        let took = asked.elapsed();
        assert!(
            answer.as_ref().is_some_and(|(s, _)| *s == 200) && took < Duration::from_secs(1),
            "{what} beside 64 slow clients: {answer:?} after {took:?}"
        );
    }
    drop(groups);
    send_signal(daemon.pid(), libc::SIGTERM);
    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
    assert!(
        run.stderr
            .contains(&format!("probes on http://127.0.0.1:{health}/healthz")),
        "{}",
        run.stderr
    );
    drop(target);
}
