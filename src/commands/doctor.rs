//! `pyfleet doctor`: what a user asks before deploying pyfleet on a host, answered by looking:
//! pyfleet's privileges, Yama's ptrace scope, perf_event_paranoid, the kernel and BPF (the
//! kernel capture is started for a moment), the pid namespace, and the Python processes it can
//! see and read. Each check says what it found, what that means for profiling, and how to fix
//! it. Exits non-zero when pyfleet could profile nothing here (Python processes run and none
//! can be read, or reading is shut off for every process).
//!
//! Reads procfs and the targets (read-only: no frame-cache marker) only; prints nothing a
//! target controls except versions pyfleet parsed.

use anyhow::Result;
use pyfleet::capture::kernel::{CaptureError, KernelCapture};
use pyfleet::host::{self, PidNamespace};
use std::collections::BTreeMap;

/// Most Python processes doctor tries to read (each attach reads its ELF files).
const MAX_READ_TRIES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's answer.
struct Check {
    name: &'static str,
    status: Status,
    /// What was found and what it means.
    finding: String,
    /// What to do about it (empty when nothing is to be done).
    fix: String,
}

impl Check {
    fn new(name: &'static str, status: Status, finding: String, fix: &str) -> Check {
        Check {
            name,
            status,
            finding,
            fix: fix.to_string(),
        }
    }
}

/// What doctor found of the Python processes.
#[derive(Default)]
struct Pythons {
    /// Readable, by pid, with their versions.
    readable: Vec<(i32, String)>,
    /// Found but not readable: pid and why.
    refused: Vec<(i32, String)>,
    /// Not tried (past MAX_READ_TRIES).
    untried: usize,
}

pub fn run(json: bool) -> Result<()> {
    let caps = host::effective_capabilities();
    let has = |c: u32| caps.is_some_and(|caps| caps & (1u64 << c) != 0);
    let ptrace = has(host::CAP_SYS_PTRACE);
    let yama = host::sysctl("kernel/yama/ptrace_scope");
    let mut checks = vec![
        privileges(caps, ptrace),
        ptrace_scope(yama, ptrace),
        perf_events(
            host::sysctl("kernel/perf_event_paranoid"),
            has(host::CAP_PERFMON),
        ),
    ];
    let capture = KernelCapture::start(1, false).map(|c| c.namespace().is_some());
    // Wall mode also needs the scheduler's switch tracepoint (tracefs).
    let off_cpu = capture
        .is_ok()
        .then(|| KernelCapture::start(1, true).map(|_| ()));
    checks.push(kernel(&capture, off_cpu.as_ref()));
    checks.push(namespace(PidNamespace::own(), capture.is_ok()));
    let pythons = pythons();
    checks.push(python_check(&pythons));

    let blocked = yama == Some(3) || (yama == Some(2) && !ptrace);
    let can_profile = !blocked && (pythons.refused.is_empty() || !pythons.readable.is_empty());
    let verdict = verdict(can_profile, &capture, off_cpu.as_ref(), &pythons);
    let report = if json {
        json_report(
            &checks,
            &capture,
            off_cpu.as_ref(),
            &pythons,
            can_profile,
            &verdict,
        )
    } else {
        text_report(&checks, &verdict)
    };
    super::write_stdout(format_args!("{report}"));
    if !can_profile {
        std::process::exit(1);
    }
    Ok(())
}

fn cap_names(caps: u64) -> Vec<&'static str> {
    [
        (host::CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (host::CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
        (host::CAP_BPF, "CAP_BPF"),
        (host::CAP_PERFMON, "CAP_PERFMON"),
        (host::CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(c, _)| caps & (1u64 << c) != 0)
    .map(|(_, n)| n)
    .collect()
}

fn privileges(caps: Option<u64>, ptrace: bool) -> Check {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_else(|| "?".into());
    let Some(caps) = caps else {
        return Check::new(
            "privileges",
            Status::Warn,
            format!("uid {uid}; /proc/self/status unreadable: capabilities unknown"),
            "",
        );
    };
    let named = cap_names(caps);
    let held = if named.is_empty() {
        "none of the capabilities pyfleet uses".to_string()
    } else {
        named.join(", ")
    };
    if ptrace {
        Check::new(
            "privileges",
            Status::Ok,
            format!("uid {uid}, holding {held}: other users' processes can be read"),
            "",
        )
    } else {
        Check::new(
            "privileges",
            Status::Warn,
            format!(
                "uid {uid}, holding {held}: without CAP_SYS_PTRACE only this user's own \
                 processes can be read"
            ),
            "run pyfleet as root, or grant it CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH \
             (deploy/pyfleet.service does)",
        )
    }
}

fn ptrace_scope(yama: Option<i64>, ptrace: bool) -> Check {
    let name = "ptrace scope";
    match (yama, ptrace) {
        (None, _) => Check::new(
            name,
            Status::Ok,
            "no Yama: the ordinary ptrace rules apply".into(),
            "",
        ),
        (Some(0), _) => Check::new(
            name,
            Status::Ok,
            "kernel.yama.ptrace_scope = 0: a process of the same user can be read".into(),
            "",
        ),
        (Some(s @ (1 | 2)), true) => Check::new(
            name,
            Status::Ok,
            format!("kernel.yama.ptrace_scope = {s}: CAP_SYS_PTRACE lets pyfleet read any process"),
            "",
        ),
        (Some(1), false) => Check::new(
            name,
            Status::Warn,
            "kernel.yama.ptrace_scope = 1: without CAP_SYS_PTRACE pyfleet reads only the \
             processes it starts"
                .into(),
            "run pyfleet as root or grant it CAP_SYS_PTRACE",
        ),
        (Some(2), false) => Check::new(
            name,
            Status::Fail,
            "kernel.yama.ptrace_scope = 2: only CAP_SYS_PTRACE may read another process, and \
             pyfleet does not hold it"
                .into(),
            "run pyfleet as root or grant it CAP_SYS_PTRACE",
        ),
        (Some(s), _) => Check::new(
            name,
            Status::Fail,
            format!("kernel.yama.ptrace_scope = {s}: no process can read another on this host"),
            "only a reboot lowers it (set kernel.yama.ptrace_scope = 1 at boot)",
        ),
    }
}

fn perf_events(paranoid: Option<i64>, perfmon: bool) -> Check {
    let name = "perf events";
    let setting = paranoid.map_or_else(
        || "kernel.perf_event_paranoid unreadable".to_string(),
        |p| format!("kernel.perf_event_paranoid = {p}"),
    );
    if perfmon {
        Check::new(
            name,
            Status::Ok,
            format!("{setting}; CAP_PERFMON lets pyfleet sample every CPU whatever it is"),
            "",
        )
    } else {
        Check::new(
            name,
            Status::Warn,
            format!(
                "{setting}; without CAP_PERFMON pyfleet cannot sample every CPU: no kernel \
                 capture, no --switch-log"
            ),
            "run pyfleet as root or grant it CAP_PERFMON (with CAP_BPF)",
        )
    }
}

fn kernel(
    capture: &Result<bool, CaptureError>,
    off_cpu: Option<&Result<(), CaptureError>>,
) -> Check {
    let release = host::kernel_release().unwrap_or_else(|| "?".into());
    match capture {
        Ok(_) => match off_cpu {
            Some(Err(e)) => Check::new(
                "kernel capture",
                Status::Warn,
                format!(
                    "Linux {release}: the capture starts for cpu mode (stacks copied by the \
                     kernel at each interrupt), not for wall and gil modes ({e}): they read"
                ),
                "wall and gil modes copy a thread's stack at the scheduler's switch tracepoint (a raw \
                 tracepoint, Linux 4.17+): check that the kernel allows BPF raw tracepoints",
            ),
            _ => Check::new(
                "kernel capture",
                Status::Ok,
                format!(
                    "Linux {release}: the capture starts; every mode's stacks are copied by \
                     the kernel, at each interrupt and as a thread leaves its CPU (exact, and \
                     cheaper than reading)"
                ),
                "",
            ),
        },
        Err(e) => {
            let fix = match e {
                CaptureError::NoPrivilege => {
                    "run pyfleet as root, or grant it CAP_BPF and CAP_PERFMON (a container: add \
                     both capabilities and allow bpf and perf_event_open in its seccomp profile)"
                }
                CaptureError::KernelTooOld { .. } => "run on Linux 5.8 or later",
                CaptureError::Denied(_) => {
                    "allow bpf and perf_event_open in pyfleet's seccomp filter (deploy/ has \
                     the unit's and the DaemonSet's), raise its locked-memory limit (Linux \
                     before 5.11: LimitMEMLOCK=64M), or lift the kernel's lockdown"
                }
                CaptureError::VerifierRefused(_) => {
                    "report it with this kernel's release: the capture's program does not pass \
                     its verifier"
                }
                _ => {
                    "check that BPF is enabled in this kernel (CONFIG_BPF_SYSCALL) and not \
                      locked down"
                }
            };
            Check::new(
                "kernel capture",
                Status::Warn,
                format!("Linux {release}: {e}; stacks are read from outside instead"),
                fix,
            )
        }
    }
}

fn namespace(own: Option<PidNamespace>, capture: bool) -> Check {
    match own {
        None => Check::new(
            "pid namespace",
            Status::Warn,
            "/proc/self/ns/pid unreadable: cannot tell".into(),
            "",
        ),
        Some(ns) if ns.is_host() => Check::new(
            "pid namespace",
            Status::Ok,
            "the host's: every process of the host can be seen".into(),
            "",
        ),
        Some(_) => Check::new(
            "pid namespace",
            Status::Warn,
            format!(
                "pyfleet runs in a pid namespace of its own (a container without hostPID, \
                 unshare -p): it sees only that namespace's processes{}",
                if capture {
                    "; the kernel capture covers them, not those of namespaces nested in it"
                } else {
                    ""
                }
            ),
            "to profile the host, run pyfleet in the host's pid namespace (hostPID: true)",
        ),
    }
}

/// Every Python process the host scan finds (each tried with a read-only attach), and those
/// that look like Python but cannot be probed (refused).
fn pythons() -> Pythons {
    use pyfleet_actors::Discovery;
    let own = std::process::id() as i32;
    let mut out = Pythons::default();
    let policy =
        match pyfleet_policies::MatchPolicy::new(&[] as &[String], [] as [&str; 0], &[], Some(own))
        {
            Ok(p) => p,
            Err(_) => return out,
        };
    let found = pyfleet::discovery::HostDiscovery::new(policy).scan();
    let listed: std::collections::HashSet<i32> = found.iter().map(|p| p.pid).collect();
    for p in &found {
        if out.readable.len() + out.refused.len() >= MAX_READ_TRIES {
            out.untried += 1;
            continue;
        }
        let opts = pyfleet::cpython::UnwinderOptions {
            frame_cache: false,
            read_only: true,
            ..Default::default()
        };
        match pyfleet::cpython::attach(p.pid, opts) {
            Ok(_) => out.readable.push((p.pid, p.python_version.clone())),
            Err(e) => out.refused.push((p.pid, e.to_string())),
        }
    }
    // Processes started as `python...` that the scan could not probe: refused.
    for pid in pyfleet::process::all_pids() {
        if pid == own || listed.contains(&pid) || !looks_like_python(pid) {
            continue;
        }
        if std::fs::read_link(format!("/proc/{pid}/exe")).is_err() {
            out.refused
                .push((pid, pyfleet::host::access::why_denied(pid)));
        }
    }
    out
}

/// Whether a process was started as a Python interpreter (its first argument's file name
/// begins with `python`).
fn looks_like_python(pid: i32) -> bool {
    pyfleet::process::cmdline(pid).is_ok_and(|args| {
        args.first().is_some_and(|a| {
            a.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with("python"))
        })
    })
}

fn python_check(p: &Pythons) -> Check {
    let name = "python processes";
    let mut versions: BTreeMap<String, usize> = BTreeMap::new();
    for (_, v) in &p.readable {
        let minor: String = v.split('.').take(2).collect::<Vec<_>>().join(".");
        *versions.entry(minor).or_default() += 1;
    }
    let versions = versions
        .iter()
        .map(|(v, n)| format!("{v} ({n})"))
        .collect::<Vec<_>>()
        .join(", ");
    let refused = p.refused.first().map(|(pid, why)| {
        let named = format!("pid {pid}");
        let why = match why.contains(&named) {
            true => why.clone(),
            false => format!("{named}: {why}"),
        };
        format!(
            "{} cannot be read ({})",
            p.refused.len(),
            pyfleet::output::for_terminal(&why)
        )
    });
    match (p.readable.len(), refused) {
        (0, None) => Check::new(
            name,
            Status::Warn,
            "none runs now: nothing to profile yet".into(),
            "start one, or check again where your services run",
        ),
        (0, Some(refused)) => Check::new(
            name,
            Status::Fail,
            format!("none can be read: {refused}"),
            "see the privileges and ptrace scope above",
        ),
        (n, refused) => Check::new(
            name,
            if refused.is_some() {
                Status::Warn
            } else {
                Status::Ok
            },
            format!(
                "{n} can be read: CPython {versions}{}{}",
                refused.map(|r| format!("; {r}")).unwrap_or_default(),
                if p.untried > 0 {
                    format!("; {} more not tried", p.untried)
                } else {
                    String::new()
                }
            ),
            "",
        ),
    }
}

fn verdict(
    can_profile: bool,
    capture: &Result<bool, CaptureError>,
    off_cpu: Option<&Result<(), CaptureError>>,
    p: &Pythons,
) -> String {
    if !can_profile {
        return "pyfleet cannot profile the Python processes of this host: see the checks \
                marked FAIL"
            .into();
    }
    let how = match (capture, off_cpu) {
        (Ok(_), Some(Ok(()))) => "every mode with the kernel capture",
        (Ok(_), _) => "cpu mode with the kernel capture (wall and gil modes read from outside)",
        (Err(_), _) => "every mode by reading from outside (no kernel capture)",
    };
    match p.readable.len() {
        0 => format!("pyfleet can profile here once Python runs: {how}"),
        n => format!(
            "pyfleet can profile {n} Python process{} here: {how}",
            if n == 1 { "" } else { "es" }
        ),
    }
}

fn text_report(checks: &[Check], verdict: &str) -> String {
    use std::fmt::Write;
    let mut out =
        String::from("pyfleet doctor: can pyfleet profile the Python processes of this host?\n");
    for c in checks {
        let _ = writeln!(
            out,
            "  {:<4}  {:<16}  {}",
            c.status.word(),
            c.name,
            c.finding
        );
        if !c.fix.is_empty() {
            let _ = writeln!(out, "  {:<4}  {:<16}  fix: {}", "", "", c.fix);
        }
    }
    out.push_str(verdict);
    out
}

fn json_report(
    checks: &[Check],
    capture: &Result<bool, CaptureError>,
    off_cpu: Option<&Result<(), CaptureError>>,
    p: &Pythons,
    can_profile: bool,
    verdict: &str,
) -> String {
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|c| {
            serde_json::json!({
                "check": c.name,
                "status": c.status.word().to_lowercase(),
                "finding": c.finding,
                "fix": c.fix,
            })
        })
        .collect();
    let capture = match capture {
        Ok(namespaced) => serde_json::json!({
            "available": true, "reason": null, "why": null, "namespaced": namespaced,
            "wall": off_cpu.is_some_and(|w| w.is_ok()),
            "gil": off_cpu.is_some_and(|w| w.is_ok()),
        }),
        Err(e) => serde_json::json!({
            "available": false, "reason": e.code(), "why": e.to_string(), "namespaced": false,
            "wall": false,
            "gil": false,
        }),
    };
    let doc = serde_json::json!({
        "can_profile": can_profile,
        "verdict": verdict,
        "capture": capture,
        "python": {
            "readable": p.readable.iter().map(|(pid, v)| serde_json::json!({"pid": pid, "version": v})).collect::<Vec<_>>(),
            "refused": p.refused.iter().map(|(pid, why)| serde_json::json!({"pid": pid, "why": why})).collect::<Vec<_>>(),
        },
        "checks": checks,
    });
    doc.to_string()
}
