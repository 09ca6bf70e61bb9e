//! pyfleet beside hostile processes (issue #13), real processes only:
//! - a process that maps a file named like a libpython, deletes it and plants a FIFO where
//!   /proc/PID/maps points (`tests/targets/trap_fifo.py`): `list`, `dump` and the daemon must
//!   neither block on it nor miss a normal Python process beside it, and the daemon must stop at
//!   `--duration` and within two seconds of SIGTERM;
//! - the same trap with a symlink to /dev/zero and a 1 TiB sparse file in the FIFO's place;
//! - a Python process whose 300 code objects, all on the stack, share one 1,000,000-character
//!   name (`tests/targets/name_bomb.py`, 4 MB of text): `record` keeps every sample, names are
//!   cut to 256 characters, and its peak RSS stays under 64 MiB;
//! - a mapping whose path is `/SYSV` plus a few characters (procfs 0.18's maps parser panics
//!   on it): a process mapping it is listed and sampled like any other;
//! - clients of the metrics listener that connect and say nothing: turned away past the
//!   connection limit, dropped after the header timeout, scrapes served again after.
//!
//! Deadlines here are generous for a loaded machine (the point is "returns", not "fast"): the
//! FIFO blocked forever before.

use crate::common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Peak RSS allowed to `record` beside the name bomb (issue #13: the daemon's bound).
const MAX_RSS_KIB: u64 = 64 << 10;

/// A Python target that spins in a thread (and so is sampled), with `token` in its argv.
fn busy(interp: &Interp, token: &str) -> Proc {
    let mut p = Proc::python(&interp.label, &interp.path, "gil_busy.py", &[".", token]);
    p.wait_for_file("threads.json", READY_TIMEOUT);
    p
}

fn trap(interp: &Interp, token: &str) -> Proc {
    trap_of(interp, token, "fifo")
}

/// `tests/targets/trap_fifo.py` planting `mode` (fifo, zero, sparse) at its mapped path.
fn trap_of(interp: &Interp, token: &str, mode: &str) -> Proc {
    let mut p = Proc::python(&interp.label, &interp.path, "trap_fifo.py", &[token, mode]);
    p.wait_for_file("ready", READY_TIMEOUT);
    p
}

/// `list` returns and lists both the trap and the normal process; `dump` of the trap returns.
fn list_and_dump_beside(trap: &Proc, normal: &Proc, mode: &str) {
    let out = run_with_timeout(pyfleet_command(&["list"]), Duration::from_secs(20));
    assert!(out.success(), "[{mode}] list: {}", out.describe());
    for p in [normal, trap] {
        assert!(
            out.stdout.contains(&p.pid().to_string()),
            "[{mode}] list misses pid {} ({}):\n{}",
            p.pid(),
            p.what,
            out.stdout
        );
    }
    let dump = run_with_timeout(
        pyfleet_command(&["dump", "--pid", &trap.pid().to_string()]),
        Duration::from_secs(20),
    );
    assert!(
        dump.success(),
        "[{mode}] dump of the trap: {}",
        dump.describe()
    );
}

/// The same trap with endless or huge contents instead of a FIFO: a symlink to /dev/zero and
/// a 1 TiB sparse file at the mapped path. `list` and `dump` answer within their deadlines
/// and still list the normal process beside it (files named by a target are read through
/// /proc/PID/map_files, regular files only, sizes capped).
#[test]
fn endless_or_huge_files_at_a_mapped_path_blind_nothing() {
    let _machine = shared();
    let interp = any_interpreter();
    for mode in ["zero", "sparse"] {
        let token = unique_token(&format!("{mode}trap"));
        let mut trap = trap_of(&interp, &token, mode);
        let mut normal = busy(&interp, &token);
        let planted = trap.dir().join("libpython3.12.so.1.0 (deleted)");
        assert!(
            std::fs::symlink_metadata(&planted).is_ok(),
            "[{mode}] the trap's file is in place"
        );
        let started = Instant::now();
        list_and_dump_beside(&trap, &normal, mode);
        let dump = run_with_timeout(
            pyfleet_command(&["dump", "--pid", &normal.pid().to_string()]),
            Duration::from_secs(20),
        );
        assert!(
            dump.success(),
            "[{mode}] dump beside the trap: {}",
            dump.describe()
        );
        assert!(
            dump.stdout.contains("spin"),
            "[{mode}] dump beside the trap: {}",
            dump.describe()
        );
        eprintln!("[{mode}] list and dumps in {:?}", started.elapsed());
        trap.kill();
        normal.kill();
    }
}

#[test]
fn a_fifo_planted_at_a_mapped_path_blinds_nothing() {
    // Alone: the daemon must stop within 4 s of --duration and 2 s of SIGTERM.
    let _machine = alone();
    let interp = any_interpreter();
    let token = unique_token("fifotrap");
    let mut trap = trap(&interp, &token);
    let mut normal = busy(&interp, &token);
    let fifo = trap.dir().join("libpython3.12.so.1.0 (deleted)");
    assert!(fifo.exists(), "the trap's FIFO is in place");

    list_and_dump_beside(&trap, &normal, "fifo");

    // The daemon: samples the normal process and stops at --duration.
    let dir = tempdir("pyfleet-fifotrap-");
    let snapshots = dir.path().join("out");
    let started = Instant::now();
    let run = run_with_timeout(
        pyfleet_command(&[
            "--match",
            &token,
            "--duration",
            "3",
            "--out",
            snapshots.to_str().unwrap(),
        ]),
        Duration::from_secs(20),
    );
    assert!(run.success(), "daemon: {}", run.describe());
    assert!(
        started.elapsed() < Duration::from_secs(3 + 4),
        "the daemon took {:?} to stop at --duration 3",
        started.elapsed()
    );
    let files: Vec<String> = snapshot_dirs(&snapshots)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(&format!("-{}.folded", normal.pid()))),
        "no snapshot file of the normal process {}: {files:?}",
        normal.pid()
    );

    // SIGTERM ends it within two seconds, the final snapshot written.
    let daemon = start_pyfleet(&[
        "--match",
        &token,
        "--duration",
        "600",
        "--out",
        snapshots.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    send_signal(daemon.pid(), libc::SIGTERM);
    let end = daemon.finish();
    assert!(end.success(), "daemon after SIGTERM: {}", end.describe());
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "SIGTERM took {:?} to end the daemon",
        asked.elapsed()
    );
    assert!(end.stderr.contains("last snapshot"), "{}", end.describe());
    trap.kill();
    normal.kill();
}

/// The highest VmHWM (KiB) seen in /proc/PID/status while `pid` runs.
fn watch_peak_rss(pid: i32, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until && pid_exists(pid) && process_state(pid) != Some('Z') {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kib) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    peak
}

#[test]
fn a_name_bomb_costs_pyfleet_names_of_256_characters() {
    let _machine = shared();
    for interp in interpreters() {
        let mut bomb = Proc::python(&interp.label, &interp.path, "name_bomb.py", &[] as &[&str]);
        bomb.wait_for_file("ready", READY_TIMEOUT);
        let dir = tempdir("pyfleet-namebomb-");
        let folded = dir.path().join("bomb.folded");
        let rec = start_pyfleet(&[
            "record",
            "--pid",
            &bomb.pid().to_string(),
            "--duration",
            "3",
            "--rate",
            "100",
            // Every tick counts, however much CPU the spinning bomb gets beside other tests
            // (cpu mode counts the CPU it used).
            "--mode",
            "wall",
            "-o",
            folded.to_str().unwrap(),
        ]);
        let peak = watch_peak_rss(rec.pid(), Instant::now() + Duration::from_secs(30));
        let out = rec.finish();
        bomb.kill();
        assert!(out.success(), "[{}] {}", interp.label, out.describe());
        let written: u64 = std::fs::read_to_string(&folded)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum();
        assert!(
            written >= 240,
            "[{}] {written} samples of about 300 kept: {}",
            interp.label,
            out.stderr
        );
        assert!(
            peak <= MAX_RSS_KIB,
            "[{}] record's peak RSS {peak} KiB over {MAX_RSS_KIB} KiB",
            interp.label
        );
        let text = std::fs::read_to_string(&folded).unwrap_or_default();
        let line = text.lines().next().unwrap_or_default();
        let frames: Vec<&str> = line.split(';').collect();
        let cut: Vec<&&str> = frames.iter().filter(|f| f.contains('…')).collect();
        assert!(
            cut.len() >= 300,
            "[{}] expected 300 frames with cut names, got {} in {} frames",
            interp.label,
            cut.len(),
            frames.len()
        );
        // `link (file:line)`: the name is 256 characters and `…`, as is the file.
        let name = cut[0].split(" (").next().unwrap_or_default();
        assert_eq!(name.chars().count(), 257, "[{}] {name:.40}", interp.label);
    }
}

#[test]
fn a_sysv_named_mapping_breaks_no_scan() {
    let _machine = shared();
    if !is_root() {
        eprintln!("skipped: creating /SYSV... needs root");
        return;
    }
    // Shorter than the 13 bytes of a real `/SYSVxxxxxxxx` segment name.
    let path = format!("/SYSV{:04x}", std::process::id() & 0xffff);
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    struct Remove<'a>(&'a str);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&path);
    let interp = any_interpreter();
    let token = unique_token("sysv");
    let mut p = Proc::python(&interp.label, &interp.path, "gil_busy.py", &[".", &token]);
    p.wait_for_file("threads.json", READY_TIMEOUT);
    // The target maps the file through Python's mmap, from a second process's view.
    let mut mapper = Proc::spawn_with(
        "sysv mapper",
        &interp.path,
        &[
            "-c",
            &format!(
                "import mmap, time, sys\nf = open({path:?}, 'rb')\nm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\nopen('ready', 'w').write('1')\ntime.sleep(600)\n# {token}"
            ),
        ],
        |_| {},
    );
    mapper.wait_for_file("ready", READY_TIMEOUT);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", mapper.pid())).unwrap();
    assert!(maps.contains(&path), "the mapping shows: {maps}");
    let out = run_with_timeout(pyfleet_command(&["list"]), Duration::from_secs(20));
    assert!(out.success(), "list: {}", out.describe());
    for pid in [p.pid(), mapper.pid()] {
        assert!(
            out.stdout.contains(&pid.to_string()),
            "list misses {pid}: {}",
            out.stdout
        );
    }
    let dump = pyfleet(&["dump", "--pid", &mapper.pid().to_string()]);
    assert!(dump.success(), "{}", dump.describe());
    assert!(Path::new(&path).exists());
    p.kill();
    mapper.kill();
}

#[test]
fn the_metrics_listener_bounds_its_clients() {
    // Alone: the listener must have turned clients away within half a second.
    let _machine = alone();
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempdir("pyfleet-listener-");
    let addr = format!("127.0.0.1:{port}");
    let daemon = start_pyfleet(&[
        "--match",
        &unique_token("nothing"),
        "--duration",
        "20",
        "--out",
        dir.path().join("out").to_str().unwrap(),
        "--metrics-addr",
        &addr,
    ]);
    let get = |path: &str| -> Option<String> {
        let mut s = TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    };
    wait_until(
        Duration::from_secs(10),
        "the listener",
        || get("/metrics").is_some_and(|t| t.starts_with("HTTP/1.1 200")),
        String::new,
    );
    assert!(get("/nothing").is_some_and(|t| t.starts_with("HTTP/1.1 404")));
    // Silent clients: past the limit they are turned away at once, and none is kept past the
    // header timeout.
    let silent: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let closed = |s: &TcpStream| {
        let mut s = s.try_clone().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        match s.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    let turned_away = silent.iter().filter(|s| closed(s)).count();
    assert!(
        turned_away >= 40 - 32,
        "only {turned_away} of 40 silent connections closed at once"
    );
    std::thread::sleep(Duration::from_secs(6));
    let kept = silent.iter().filter(|s| !closed(s)).count();
    assert_eq!(kept, 0, "silent connections kept past the header timeout");
    assert!(get("/metrics").is_some_and(|t| t.starts_with("HTTP/1.1 200")));
    drop(daemon);
}

#[test]
fn a_write_handle_bound_at_attach_never_reaches_the_program_exec_ran() {
    let _machine = shared();
    use pyfleet::memory::{ProcessMemory, RemoteMemory};
    let interp = any_interpreter();
    let mut p = Proc::spawn_with(
        "exec target",
        &interp.path,
        &[
            "-c",
            "import os, time\nopen('ready', 'w').write('1')\ntime.sleep(1)\nos.execv('/bin/sleep', ['sleep', '600'])",
        ],
        |_| {},
    );
    p.wait_for_file("ready", READY_TIMEOUT);
    let pid = p.pid();
    let mut bound = ProcessMemory::new(pid);
    bound.bind_writes().expect("/proc/PID/mem");
    wait_until(
        Duration::from_secs(20),
        "the target to exec sleep",
        || {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|e| e.to_string_lossy().contains("sleep"))
        },
        String::new,
    );
    // A writable address of the new program: the start of its stack.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let stack = maps
        .lines()
        .find(|l| l.ends_with("[stack]"))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .expect("a stack mapping");
    let before = bound.read_u64(stack).expect("reads go by pid");
    assert!(
        !matches!(bound.write_if(stack, before, before), Ok(true)),
        "a handle bound before exec wrote into the new program"
    );
    // The same write through a handle bound now is made (the check above can fail).
    let mut fresh = ProcessMemory::new(pid);
    fresh.bind_writes().unwrap();
    assert_eq!(fresh.write_if(stack, before, before), Ok(true));
    p.kill();
}

/// With only the capabilities the systemd unit gives (CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, no
/// CAP_DAC_OVERRIDE: /proc/PID/mem opens read-only), the 3.15 marker is still placed: checked
/// through the read-only handle, written with process_vm_writev.
#[test]
fn the_marker_is_placed_with_the_units_capabilities_only() {
    let _machine = shared();
    if !is_root() {
        eprintln!("skipped: needs root to drop to nobody with capabilities");
        return;
    }
    let Some(setpriv) = tool("setpriv", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let Some(interp) = interpreter("3.15") else {
        return;
    };
    let mut target = Proc::python(&interp.label, &interp.path, "gil_busy.py", &["."]);
    target.wait_for_file("threads.json", READY_TIMEOUT);
    let mut cmd = Command::new(setpriv);
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all,+sys_ptrace,+dac_read_search",
        "--ambient-caps=-all,+sys_ptrace,+dac_read_search",
    ])
    .arg(pyfleet_exe())
    .args([
        "bench",
        "--pid",
        &target.pid().to_string(),
        "--duration",
        "1",
        "--json",
    ]);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    target.kill();
    assert!(out.success(), "{}", out.describe());
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(
        json["marker_writes"].as_u64().unwrap_or(0) > 0,
        "no marker written: {}",
        out.stdout
    );
    assert!(
        json["frame_cache_hits"].as_u64().unwrap_or(0) > 0,
        "{}",
        out.stdout
    );
}
