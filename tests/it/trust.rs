//! pyfleet as root beside users who are not (#52): each test plays the attacker, another local
//! user (here `nobody`, uid 65534) who plants what they can where they can write, and fails
//! on a build that lets them through.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// Makes `path` (a symbolic link itself, not what it points to) nobody's.
fn give_link_to_nobody(path: &Path) {
    std::os::unix::fs::lchown(path, Some(65534), Some(65534)).expect("lchown");
}

/// Files in `dir`, recursively (none when it cannot be read).
fn files_in(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(files_in(&path));
        } else {
            found.push(path.display().to_string());
        }
    }
    found
}

/// The daemon's `--out` must be its own and private: one owned by another user, one others
/// may write in, or one reached through a symbolic link another user owns is refused at
/// start with one line that says so, and nothing is written through the link.
#[test]
fn an_out_directory_another_user_owns_can_write_or_planted_is_refused() {
    let _machine = shared();
    if !is_root() {
        eprintln!("skipped: needs root (to play the other user)");
        return;
    }
    let dir = tempdir("pyfleet-trust-out-");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open_to_all = dir.path().join("open");
    fs::create_dir(&open_to_all).unwrap();
    fs::set_permissions(&open_to_all, fs::Permissions::from_mode(0o777)).unwrap();
    // Root's own directory, which the other user points a link of theirs at, from a directory
    // of theirs.
    let victim = dir.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    let planted = theirs.join("link");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    give_link_to_nobody(&planted);

    for (out, says) in [
        (theirs.clone(), "belongs to uid 65534"),
        (open_to_all.clone(), "other users may write in it"),
        (planted.clone(), "symbolic link owned by uid 65534"),
        (
            planted.join("snapshots"),
            "symbolic link owned by uid 65534",
        ),
    ] {
        let run = pyfleet(&[
            "run",
            "--out",
            out.to_str().unwrap(),
            "--duration",
            "1",
            "--match",
            "pyfleet-no-such-process",
        ]);
        assert_error_contract(&run, Some(says));
    }
    assert!(files_in(&victim).is_empty(), "{:?}", files_in(&victim));
}

/// `record -o` through a directory link another user planted on the way: refused with one
/// line, nothing written where it points (a root-only directory).
#[test]
fn record_writes_through_no_link_another_user_planted() {
    let _machine = shared();
    if !is_root() {
        eprintln!("skipped: needs root (to play the other user)");
        return;
    }
    let dir = tempdir("pyfleet-trust-record-");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let victim = dir.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    let planted = theirs.join("reports");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    give_link_to_nobody(&planted);
    let interp = any_interpreter();
    let mut target = Proc::python(&interp.label, &interp.path, "profiled.py", &["ready", "0"]);
    target.wait_for_file("ready", READY_TIMEOUT);
    let out = planted.join("profile.folded");
    let pid = target.pid().to_string();
    let run = pyfleet(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_error_contract(&run, Some("symbolic link owned by uid 65534"));
    assert!(files_in(&victim).is_empty(), "{:?}", files_in(&victim));
    // The same link, root's own: followed (only a link another user could plant is refused).
    let mine = dir.path().join("mine");
    std::os::unix::fs::symlink(&victim, &mine).unwrap();
    let out = mine.join("profile.folded");
    let run = pyfleet(&[
        "record",
        "--pid",
        &pid,
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(run.success(), "{}", run.describe());
    assert!(victim.join("profile.folded").is_file());
}

/// A web page that points a DNS name of its own at 127.0.0.1 (DNS rebinding) reaches the
/// loopback listener with that name as its `Host`: refused (421) on every route, the probes'
/// too, while the same requests naming an address, `localhost` or a `--listen-name` are
/// answered.
#[test]
fn a_rebound_host_name_gets_nothing_from_the_listener() {
    let _machine = shared();
    let dir = tempdir("pyfleet-trust-host-");
    let (port, health) = (free_port(), free_port());
    let out = dir.path().join("out");
    let daemon = start_pyfleet(&[
        "run",
        "--out",
        out.to_str().unwrap(),
        "--match",
        "pyfleet-no-such-process",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--health-addr",
        &format!("127.0.0.1:{health}"),
        "--listen-name",
        "pyfleet.internal.example",
    ]);
    wait_until(
        Duration::from_secs(30),
        "the daemon to answer",
        || http_get(port, "/healthz").is_some_and(|(status, _)| status == 200),
        String::new,
    );
    let status = |port: u16, path: &str, host: &str| {
        http_get_with_headers(port, path, &format!("Host: {host}\r\n")).map(|(s, _)| s)
    };
    for path in [
        "/api/fleet",
        "/debug/pprof/profile?seconds=1",
        "/metrics",
        "/",
        "/healthz",
    ] {
        for host in [
            "rebind.attacker.example",
            "rebind.attacker.example:80",
            "localhost.attacker.example",
        ] {
            assert_eq!(
                status(port, path, host),
                Some(421),
                "{path} with Host {host}"
            );
        }
    }
    assert_eq!(
        status(health, "/healthz", "rebind.attacker.example"),
        Some(421)
    );
    for host in [
        "127.0.0.1",
        "localhost",
        &format!("localhost:{port}"),
        "pyfleet.internal.example",
    ] {
        assert_eq!(status(port, "/metrics", host), Some(200), "Host {host}");
    }
    assert_eq!(status(health, "/healthz", "127.0.0.1"), Some(200));
    send_signal(daemon.pid(), libc::SIGTERM);
    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
}
