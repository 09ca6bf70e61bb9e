//! `pyfleet top` in a real terminal (tmux) against a real busy target (issue #37): what it
//! shows against a `record` of the same seconds, a key that sorts, `q` that quits and leaves
//! the terminal as it was.

use crate::common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux server of the test's own (its own socket), killed when dropped, and the `pyfleet
/// top` it runs, killed when dropped if it is still there (a failed test leaves no load).
struct Tmux {
    exe: std::path::PathBuf,
    socket: String,
    top: Option<i32>,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.exe)
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pane(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// The pid of the `pyfleet top` the pane's shell started, once it runs.
    fn find_top(&self) -> Option<i32> {
        let shell: i32 = self
            .run(&["display", "-p", "-t", "top", "#{pane_pid}"])
            .trim()
            .parse()
            .ok()?;
        wait_for(|| {
            let children =
                std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
                .find(|&c| is_top(c))
        })
    }

    fn kill_server(&self) {
        let _ = Command::new(&self.exe)
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.kill_server();
        if let Some(top) = self.top {
            if wait_for(|| (!is_top(top)).then_some(())).is_none() {
                send_signal(top, libc::SIGKILL);
            }
        }
    }
}

/// Whether `pid` is a `pyfleet top` that has not ended (a zombie has).
fn is_top(pid: i32) -> bool {
    let running = process_state(pid).is_some_and(|state| state != 'Z' && state != 'X');
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut args = cmdline.split(|&b| b == 0);
    let exe = args.next().unwrap_or_default();
    running && exe == pyfleet_exe().as_os_str().as_encoded_bytes() && args.next() == Some(b"top")
}

/// `pyfleet top ARGS` started in a 120x30 tmux pane of a server of the test's own (session
/// `top`); its exit status goes to `exit_file` when it ends.
fn top_in_tmux(exe: std::path::PathBuf, args: &str, exit_file: &Path) -> Tmux {
    static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmux = Tmux {
        exe,
        socket: format!("pyfleet-top-{}-{n}", std::process::id()),
        top: None,
    };
    // The tests' state directory, as every pyfleet they start has it: `--connect` reads the
    // daemon's token there.
    let command = format!(
        "STATE_DIRECTORY='{}' '{}' top {args}; echo $? > '{}'; sleep 600",
        harness_state_dir().display(),
        pyfleet_exe().display(),
        exit_file.display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "120",
        "-y",
        "30",
        &command,
    ]);
    tmux.top = tmux.find_top();
    tmux
}

/// The first row of top's table: (%Own, label).
fn first_row(pane: &str) -> Option<(f64, String)> {
    let mut lines = pane
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("%Own"));
    lines.next()?;
    let row = lines.next()?;
    let mut f = row.split_whitespace();
    let own: f64 = f.next()?.parse().ok()?;
    let label: Vec<&str> = f.skip(3).collect();
    (!label.is_empty()).then(|| (own, label.join(" ")))
}

/// alpha's own share (%) in a folded record.
fn folded_own_share(path: &Path, function: &str) -> f64 {
    let (mut own, mut all) = (0u64, 0u64);
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        all += n;
        if stack
            .rsplit(';')
            .next()
            .unwrap()
            .starts_with(&format!("{function} ("))
        {
            own += n;
        }
    }
    100.0 * own as f64 / all.max(1) as f64
}

/// Within three seconds `top` shows the target's hottest function first, with a share within
/// 10 points of a `record` of the same seconds; `t` sorts by total (the module's frame comes
/// first); `q` exits 0 and the terminal leaves the alternate screen with its cursor shown.
///
/// Both sample at 173 Hz: the target splits every 20 ms, and a period that does not divide it
/// (5.8 ms) puts the samples all over that cycle. At 100 Hz each profiler saw two points of
/// the cycle only, drifting slowly, and the two disagreed by up to 15 points on a 70% split.
/// Here each takes up to about 500 samples of a function at 70%: the standard error of the
/// difference is about 3 points, so 10 are more than 3 of them.
#[test]
fn top_in_a_terminal_shows_what_record_shows_and_quits_clean() {
    // Alone: shares of a CPU-bound target, and two profilers of it at once.
    let _machine = alone();
    let Some(exe) = tool("tmux", SETUP_FORMAT_TOOLS) else {
        return;
    };
    let mut t = shifting("0.7");
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempdir("pyfleet-top-");
    let exit_file = dir.path().join("exit");
    let recorded = dir.path().join("same-seconds.folded");
    let started = Instant::now();
    let tmux = top_in_tmux(exe, &format!("--pid {} --rate 173", t.pid()), &exit_file);
    let record = Running::start(
        pyfleet_command(&[
            "record",
            "--pid",
            &t.pid().to_string(),
            "--rate",
            "173",
            "--duration",
            "3",
            "-o",
            recorded.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    // The first rows within three seconds; the shares read at three.
    let mut first_at = None;
    while started.elapsed() < Duration::from_secs(3) {
        if first_row(&tmux.pane()).is_some() {
            first_at.get_or_insert(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pane = tmux.pane();
    let out = record.finish();
    assert!(out.success(), "{}", out.describe());
    let Some(first_at) = first_at else {
        panic!("no rows within 3 s:\n{pane}");
    };
    let (own, label) = first_row(&pane).expect("rows");
    let recorded_share = folded_own_share(&recorded, "alpha");
    eprintln!(
        "first rows after {first_at:?}; top: {label} {own}%; record: alpha {recorded_share:.1}%"
    );
    assert!(
        label.starts_with("alpha ("),
        "the hottest function first:\n{pane}"
    );
    assert!(
        (own - recorded_share).abs() <= 10.0,
        "top says {own}%, record {recorded_share:.1}%:\n{pane}"
    );

    tmux.run(&["send-keys", "-t", "top", "t"]);
    let sorted = wait_for(|| {
        let pane = tmux.pane();
        first_row(&pane)
            .is_some_and(|(_, l)| l.starts_with("<module> ("))
            .then_some(pane)
    });
    assert!(sorted.is_some(), "t should sort by total:\n{}", tmux.pane());

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let code = wait_for(|| std::fs::read_to_string(&exit_file).ok());
    t.kill();
    assert_eq!(code.as_deref().map(str::trim), Some("0"), "{}", tmux.pane());
    let terminal = tmux.run(&[
        "display",
        "-p",
        "-t",
        "top",
        "#{alternate_on} #{cursor_flag}",
    ]);
    assert_eq!(terminal.trim(), "0 1", "the terminal as it was");
    assert!(
        !tmux.pane().contains("%Own"),
        "the screen before top came back:\n{}",
        tmux.pane()
    );
}

/// `f`'s first `Some` within 5 s.
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// A terminal that goes away (its tmux server killed: the pane's terminal hangs up) ends top
/// within seconds. crossterm's reader alone spins at a whole core on a hung-up terminal, for
/// ever, and a SIGTERM did not end it.
#[test]
fn top_ends_when_its_terminal_hangs_up() {
    let _machine = shared();
    let Some(exe) = tool("tmux", SETUP_FORMAT_TOOLS) else {
        return;
    };
    let sleeper = idle_sleeper("pyfleet-top-hang-up");
    let dir = tempdir("pyfleet-top-hang-up-");
    let exit_file = dir.path().join("exit");
    let tmux = top_in_tmux(exe, &format!("--pid {}", sleeper.pid()), &exit_file);
    let drawn = wait_for(|| tmux.pane().contains("%Own").then_some(()));
    assert!(drawn.is_some(), "top's screen:\n{}", tmux.pane());
    let top = tmux.top.expect("top's pid");
    tmux.kill_server();
    // The screen notices within a key wait (0.1 s), then stops its fleet (well within 5 s).
    let ended = wait_for(|| (!is_top(top)).then_some(()));
    assert!(
        ended.is_some(),
        "top (pid {top}) still runs 5 s after its terminal hung up (state {:?})",
        process_state(top)
    );
}

#[test]
fn top_without_a_terminal_or_with_a_bad_address_is_one_line() {
    let _machine = shared();
    let sleeper = idle_sleeper("pyfleet-top-no-terminal");
    let pid = sleeper.pid().to_string();
    for (args, says) in [
        (vec!["top", "--pid", pid.as_str()], "terminal"),
        (vec!["top", "--pid", "1"], "cannot show process 1"),
        (
            vec!["top", "--connect", "ftp://localhost:9464"],
            "http or https",
        ),
        (
            vec![
                "top",
                "--connect",
                "localhost:9464",
                "--ca-file",
                "/etc/hostname",
            ],
            "--ca-file goes with --connect https://",
        ),
        // No process named: every Python process of the host, which needs a terminal too.
        (vec!["top"], "terminal"),
    ] {
        let out = pyfleet(&args);
        assert!(!out.success(), "{}", out.describe());
        let err = out.stderr.trim_end();
        assert!(
            !err.contains('\n') && err.starts_with("pyfleet: ") && err.contains(says),
            "{args:?}: {}",
            out.describe()
        );
    }
}

/// `top --connect` shows what a running daemon samples: the busy target's hottest function
/// first, pulled a second at a time from the daemon's listener, over plain HTTP (with the
/// token the daemon keeps in its state directory, which top reads itself) and over TLS (the
/// listener's certificate verified against `--ca-file`; another CA's is refused, and said).
#[test]
fn top_connected_to_a_daemon_shows_its_samples() {
    // Alone: a busy target and a daemon sampling it.
    let _machine = alone();
    let Some(exe) = tool("tmux", SETUP_FORMAT_TOOLS) else {
        return;
    };
    let mut t = shifting("0.8");
    let dir = tempdir("pyfleet-top-connect-");
    let Some(ca) = TestCa::make(dir.path()) else {
        return;
    };
    let (cert, key, rogue) = (
        ca.server_cert.to_str().unwrap(),
        ca.server_key.to_str().unwrap(),
        ca.rogue_cert.to_str().unwrap(),
    );
    let cases: [(&str, &[&str], String, bool); 3] = [
        ("http", &[], String::new(), true),
        (
            "https",
            &["--listen-tls-cert", cert, "--listen-tls-key", key],
            format!(" --ca-file '{}'", ca.ca.display()),
            true,
        ),
        (
            "https",
            &["--listen-tls-cert", cert, "--listen-tls-key", key],
            format!(" --ca-file '{rogue}'"),
            false,
        ),
    ];
    for (i, (scheme, listen, trust, trusted)) in cases.iter().enumerate() {
        let port = free_port();
        let mut args = vec![
            "run".to_string(),
            "--pid".into(),
            t.pid().to_string(),
            "--out".into(),
            dir.path()
                .join(format!("snapshots-{i}"))
                .display()
                .to_string(),
            "--metrics-addr".into(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(listen.iter().map(|a| a.to_string()));
        let daemon = Running::start(pyfleet_command(&args), Duration::from_secs(120));
        let exit_file = dir.path().join(format!("exit-{i}"));
        let connect = format!("--connect {scheme}://127.0.0.1:{port}{trust}");
        let tmux = top_in_tmux(exe.clone(), &connect, &exit_file);
        let shown = (0..100).find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let pane = tmux.pane();
            let found = match trusted {
                true => first_row(&pane)
                    .is_some_and(|(own, label)| label.starts_with("alpha (") && own > 50.0),
                false => pane.contains("last pull failed") && pane.contains("invalid peer"),
            };
            found.then_some(pane)
        });
        let pane = tmux.pane();
        tmux.run(&["send-keys", "-t", "top", "q"]);
        let code = wait_for(|| std::fs::read_to_string(&exit_file).ok());
        send_signal(daemon.pid(), libc::SIGTERM);
        let out = daemon.finish();
        assert!(
            shown.is_some(),
            "{connect}: the daemon's hottest function (or, another CA's, the refused \
             certificate) within 10 s:\n{pane}\n{}",
            out.describe()
        );
        assert!(pane.contains("the daemon at 127.0.0.1:"), "{pane}");
        assert_eq!(code.as_deref().map(str::trim), Some("0"), "{}", tmux.pane());
    }
    t.kill();
}
