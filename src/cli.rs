//! The command line: clap definitions and the one-shot commands (`dump`, `list`, `bench`;
//! `doctor` has its own module).

use crate::daemon;
use crate::record::{self, RecordOptions};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use pyfleet::config::RunOptions;
use pyfleet::cpython::{self, SampleKind};
use pyfleet::output::dump::{self, DumpHeader};
use pyfleet::output::for_terminal;
use pyfleet::process::Process;
use pyfleet_policies::MatchPolicy;

/// `println!` for command output: a reader that went away (`pyfleet dump | head`) ends pyfleet
/// quietly, any other write error in one line; never a panic.
macro_rules! outln {
    ($($t:tt)*) => {
        write_stdout(format_args!($($t)*))
    };
}

pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("pyfleet: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "pyfleet",
    version,
    about = "Always-on sampling profiler for fleets of CPython processes"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// With no command: `run` (so `pyfleet --match gunicorn` works as written).
    #[command(flatten)]
    pub run: RunOptions,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Profile matching Python processes continuously (the default command): snapshots on
    /// disk, metrics for Prometheus.
    Run(Box<RunOptions>),
    /// Profile processes for a while into one file (flamegraph SVG, folded stacks, speedscope
    /// or pprof), like `py-spy record`.
    Record(Box<RecordOptions>),
    /// Print every interpreter, thread and frame of one Python process, innermost frame first.
    Dump {
        /// The process to read.
        #[arg(long, short, value_name = "PID", required_unless_present = "bare_pid")]
        pid: Option<i32>,
        /// The process to read, as `pyfleet dump 1234` (the same as --pid).
        #[arg(value_name = "PID", conflicts_with = "pid")]
        bare_pid: Option<i32>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Read without pausing the target (by default a dump pauses every thread for the
        /// read, so that the stacks are one instant's).
        #[arg(long)]
        nonblocking: bool,
    },
    /// Sample one process back to back and report the cost per sample and the caches' work.
    /// Costly for the target: samples as fast as it can (tens of thousands a second), and on
    /// 3.15 writes the frame-cache marker each time; asks for --yes unless the target is a
    /// descendant of the shell that runs it.
    Bench {
        /// The process to sample (repeatable with `--floor --rate`: the fleet floor).
        #[arg(long, short, value_name = "PID", required_unless_present = "bare_pids")]
        pid: Vec<i32>,
        /// The same as --pid, as py-spy users type it: `pyfleet bench 4242`.
        #[arg(value_name = "PID", conflicts_with = "pid")]
        bare_pids: Vec<i32>,
        /// Pace the samples at this many a second, as the daemon does, instead of back to back
        /// (cheap for the target: what the daemon costs it). With --floor: pace the bare reads
        /// at this many rounds per second over every --pid and report CPU percent of one core
        /// (the floor of a fleet at that rate).
        #[arg(long, value_name = "HZ")]
        rate: Option<f64>,
        /// How long to sample (seconds, or 500ms, 10s, ...).
        #[arg(long, default_value = "5", value_parser = positive_seconds)]
        duration: f64,
        /// Benchmark a process even when it is not the shell's own child (production code):
        /// pyfleet samples it flat out for the whole duration.
        #[arg(long)]
        yes: bool,
        /// Do not use the 3.15 frame-cache marker.
        #[arg(long)]
        no_frame_cache: bool,
        /// Never write to the target (implies no frame-cache marker).
        #[arg(long)]
        read_only: bool,
        /// Read every thread every sample, even one the kernel says has not run since.
        #[arg(long)]
        no_skip_idle: bool,
        /// Pause the target for each sample (ptrace), as `record --blocking` does.
        #[arg(long)]
        blocking: bool,
        /// Tell idle threads by the kernel's log of context switches, as `record --switch-log`.
        #[arg(long)]
        switch_log: bool,
        /// Measure the floor instead: one bare 8-byte process_vm_readv per iteration.
        #[arg(long)]
        floor: bool,
        /// Print one flat JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check whether pyfleet can profile the Python processes of this host, and how: its
    /// privileges, ptrace scope, perf events, the kernel capture, the pid namespace, the
    /// Python processes it can see and read; each with what to fix. Exits 1 when it could
    /// profile nothing here.
    Doctor {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the Python processes on this host: pid, parent, version, the name pyfleet gives
    /// it (in file names and metric labels), its role (master, or worker of its parent), command line.
    List {
        /// Only processes whose command line or executable name matches this regex
        /// (repeatable: any may match).
        #[arg(long = "match", short = 'm', value_name = "REGEX")]
        matches: Vec<String>,
        /// Only processes whose label KEY matches REGEX, as KEY=REGEX (repeatable: every one
        /// must match).
        #[arg(long, value_name = "KEY=REGEX")]
        match_label: Vec<String>,
        /// Leave out processes whose label KEY matches REGEX (repeatable).
        #[arg(long, value_name = "KEY=REGEX")]
        exclude_label: Vec<String>,
        /// Also every Python descendant of a matched process, however it was started (as
        /// `record` and `run` take them in).
        #[arg(long)]
        subprocesses: bool,
    },
}

pub fn run(cli: Cli) -> Result<()> {
    let Some(command) = cli.command else {
        return daemon::run(cli.run);
    };
    match command {
        Command::Run(opts) => daemon::run(*opts),
        Command::Record(opts) => record::run(*opts),
        Command::Dump {
            pid,
            bare_pid,
            json,
            nonblocking,
        } => match pid.or(bare_pid) {
            Some(pid) => dump(pid, json, !nonblocking),
            None => anyhow::bail!("dump needs a process: `pyfleet dump PID`"),
        },
        Command::Doctor { json } => crate::doctor::run(json),
        Command::List {
            matches,
            match_label,
            exclude_label,
            subprocesses,
        } => list(&matches, &match_label, &exclude_label, subprocesses),
        Command::Bench {
            pid,
            bare_pids,
            rate,
            duration,
            no_frame_cache,
            read_only,
            no_skip_idle,
            blocking,
            switch_log,
            floor,
            json,
            yes,
        } => match ([pid, bare_pids].concat().as_slice(), rate) {
            (pids, Some(rate)) if floor => fleet_floor(pids, rate, duration, json),
            (_, Some(rate)) if !(rate.is_finite() && rate > 0.0) => {
                anyhow::bail!("--rate must be a positive number of samples a second")
            }
            ([pid], rate) => {
                if !yes && !floor && rate.is_none() {
                    bench_consent(*pid, duration)?;
                }
                let opts = cpython::UnwinderOptions {
                    frame_cache: !no_frame_cache,
                    read_only,
                    skip_idle: !no_skip_idle,
                    blocking,
                    ..Default::default()
                };
                bench(*pid, duration, rate, switch_log, opts, floor, json)
            }
            _ => anyhow::bail!("several --pid go with --floor --rate"),
        },
    }
}

/// Reads of a running process tried before `dump` reports the failure.
const DUMP_ATTEMPTS: u32 = 10;

fn dump(pid: i32, json: bool, blocking: bool) -> Result<()> {
    // A dump is one sample: it needs no frame cache, and must not write to the target.
    let opts = cpython::UnwinderOptions {
        frame_cache: false,
        read_only: true,
        cpu_status: true,
        blocking,
        ..Default::default()
    };
    let mut unwinder = cpython::attach(pid, opts)?;
    // A process that runs changes its stacks while they are read; a torn read (a frame freed
    // mid-walk) is worth a few immediate retries before it is reported. An exited process is
    // not.
    let mut attempt = 0;
    let stacks = loop {
        attempt += 1;
        match unwinder.snapshot() {
            Ok(s) => break s,
            Err(e) if !e.is_process_gone() && attempt < DUMP_ATTEMPTS => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading the stacks of process {pid} failed"))
            }
        }
    };
    // Names are read after the stacks: a thread that started or ended between has none.
    let names = unwinder.threading_names().unwrap_or_default();
    let mut stacks = stacks;
    for t in stacks.iter_mut().flat_map(|i| i.threads.iter_mut()) {
        t.name = names.get(&t.thread_id).cloned();
        t.os_name = pyfleet::process::thread_name(pid, t.native_thread_id);
    }
    let cmdline = Process::new(pid)
        .and_then(|p| p.cmdline())
        .map(|c| c.join(" "))
        .unwrap_or_default();
    let binary = unwinder.binary().display().to_string();
    let header = DumpHeader {
        pid,
        version: unwinder.layout().version,
        binary: &binary,
        cmdline: &cmdline,
    };
    let out = if json {
        dump::to_json(&header, &stacks)
    } else {
        dump::to_text(&header, &stacks)
    };
    outln!("{out}");
    Ok(())
}

fn list(
    matches: &[String],
    match_label: &[String],
    exclude_label: &[String],
    subprocesses: bool,
) -> Result<()> {
    use pyfleet_actors::Discovery;
    use pyfleet_policies::Role;
    let own = Some(std::process::id() as i32);
    let policy = MatchPolicy::new(matches, [] as [&str; 0], &[], own)?
        .with_label_rules(match_label, exclude_label)?;
    // The daemon's own scan: the same processes, names, roles and labels as it would list.
    let mut discovery =
        pyfleet::discovery::HostDiscovery::new(policy).with_subprocesses(subprocesses);
    let found = discovery.scan();
    let refused = pyfleet::discovery::refusal_line(&discovery.refused());
    outln!(
        "{:>7}  {:>7}  {:<9}  {:<24}  {:<6}  {:<20}  {:<24}  COMMAND",
        "PID",
        "PPID",
        "PYTHON",
        "NAME",
        "ROLE",
        "SERVICE",
        "LABELS"
    );
    for p in &found {
        // Of its parent (PPID) for a worker.
        let role = match p.role {
            Role::Single => "-",
            r => r.as_str(),
        };
        // Labels are sanitised where they are found; the container id as `docker ps`
        // shortens it.
        let others: Vec<String> = p
            .labels
            .iter()
            .filter(|(k, _)| *k != "service")
            .map(|(k, v)| match k {
                "container_id" => format!("container={}", v.get(..12).unwrap_or(v)),
                _ => format!("{k}={v}"),
            })
            .collect();
        let others = if others.is_empty() {
            "-".to_string()
        } else {
            others.join(",")
        };
        outln!(
            "{:>7}  {:>7}  {:<9}  {:<24}  {:<6}  {:<20}  {:<24}  {}",
            p.pid,
            p.ppid,
            for_terminal(&p.python_version),
            p.name,
            role,
            p.labels.get("service").unwrap_or("-"),
            others,
            for_terminal(&p.cmdline)
        );
    }
    // What could not be inspected is said, and with nothing else found it is the error: not
    // "nothing found" when permission was the reason.
    match (refused, found.is_empty()) {
        (Some(line), true) => anyhow::bail!("{line}"),
        (Some(line), false) => eprintln!("pyfleet: {line}"),
        (None, true) => eprintln!("pyfleet: no matching Python process found"),
        (None, false) => {}
    }
    Ok(())
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    let d = s
        .parse::<pyfleet::config::Seconds>()?
        .positive("duration")?;
    Ok(d.as_secs_f64())
}

/// How far up `bench_consent` follows a target's parents.
const MAX_ANCESTORS: usize = 16;

/// `bench` samples flat out: on a process that serves users, that is a cost to them. Without
/// `--yes`, only a target that descends from pyfleet's parent (the shell that started both, or
/// a script's own target) is benchmarked; anything else gets one line saying what it would
/// cost and how to go ahead.
fn bench_consent(pid: i32, duration: f64) -> Result<()> {
    let parent_of = |p: i32| pyfleet::process::parent_and_start(p).map(|(parent, _)| parent);
    let ours = std::os::unix::process::parent_id() as i32;
    // A descendant of pyfleet's parent (through `unshare`, `taskset`, a venv's launcher, ...).
    let mut p = pid;
    for _ in 0..MAX_ANCESTORS {
        match parent_of(p) {
            Some(q) if q == ours && ours > 1 => return Ok(()),
            Some(q) if q > 1 => p = q,
            _ => break,
        }
    }
    anyhow::bail!(
        "bench samples process {pid} as fast as it can for {duration} s (about a core of \
         pyfleet's CPU, tens of thousands of reads a second, and on 3.15 a write to the target \
         per sample); it was not started from this shell: give --yes to go ahead"
    )
}

fn bench(
    pid: i32,
    duration: f64,
    rate: Option<f64>,
    switch_log: bool,
    opts: cpython::UnwinderOptions,
    floor: bool,
    json: bool,
) -> Result<()> {
    use pyfleet::memory::RemoteMemory;
    use pyfleet::process::own_thread_cpu_ns;
    use std::time::{Duration, Instant};

    if switch_log {
        crate::daemon::start_switch_log();
    }
    let mut unwinder = cpython::attach(pid, opts)?;
    let version = unwinder.layout().version;
    let limit = Duration::from_secs_f64(duration);
    let (cpu0, start) = (own_thread_cpu_ns(), Instant::now());
    let mut iterations = 0u64;
    let mut threads = 0usize;
    let mut last_error = None;
    // Failed samples by reason (the message without its addresses), at most 32 reasons.
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    // Successful samples by kind (kept, checked, read: see `pyfleet_sample_kinds_total`),
    // with the wall time they took.
    let mut kinds = [(0u64, 0f64); 3];
    // Time inside samples (without the pauses of --rate).
    let mut sampling_secs = 0f64;
    if floor {
        let addr = unwinder.runtime_address();
        let mem = unwinder.memory();
        while start.elapsed() < limit {
            for _ in 0..64 {
                mem.read_u64(addr)
                    .with_context(|| format!("reading process {pid}"))?;
            }
            iterations += 64;
        }
    } else {
        let period = rate.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut next = start;
        while start.elapsed() < limit {
            if let Some(p) = period {
                next += p;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            let began = Instant::now();
            let result = unwinder.sample().map(|s| s.len());
            let took = began.elapsed().as_secs_f64();
            sampling_secs += took;
            if result.is_ok() {
                let k = match unwinder.last_kind() {
                    SampleKind::Kept => 0,
                    SampleKind::Checked => 1,
                    SampleKind::Read => 2,
                };
                kinds[k].0 += 1;
                kinds[k].1 += took;
            }
            match result {
                Ok(n) => threads = n,
                Err(e) if e.is_process_gone() => {
                    anyhow::bail!("process {pid} exited during the benchmark")
                }
                Err(e) => {
                    let msg = e.to_string();
                    let reason: String = msg
                        .split(' ')
                        .filter(|w| !w.starts_with("0x"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    if reasons.len() < 32 || reasons.contains_key(&reason) {
                        *reasons.entry(reason).or_default() += 1;
                    }
                    last_error = Some(msg);
                }
            }
            iterations += 1;
        }
    }
    let wall = start.elapsed();
    let cpu_ns = match (cpu0, own_thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let st = unwinder.stats();
    let n = iterations.max(1) as f64;
    let (functions, frames, stacks) = unwinder.stacks().len();
    let sample_kinds: serde_json::Map<String, serde_json::Value> = ["kept", "checked", "read"]
        .iter()
        .zip(kinds)
        .map(|(kind, (count, secs))| {
            let mean_us = if count == 0 {
                0.0
            } else {
                secs * 1e6 / count as f64
            };
            let v = serde_json::json!({ "samples": count, "mean_us": mean_us });
            (kind.to_string(), v)
        })
        .collect();
    let doc = serde_json::json!({
        "pid": pid,
        "python_version": version.to_string(),
        "mode": if floor { "floor" } else if opts.read_only { "read-only" }
                else if opts.frame_cache { "frame-cache" } else { "no-frame-cache" },
        "skip_idle": opts.skip_idle && !floor,
        "duration_s": wall.as_secs_f64(),
        "samples": if floor { iterations } else { st.samples },
        "errors": st.errors,
        "errors_by_reason": reasons,
        "mean_us": if floor { wall.as_secs_f64() } else { sampling_secs } * 1e6 / n,
        "cpu_us": cpu_ns as f64 / 1e3 / n,
        "threads": threads,
        "frame_cache_hits": st.frame_cache_hits,
        "frame_cache_partial_hits": st.frame_cache_partial_hits,
        "frame_cache_misses": st.frame_cache_misses,
        "frames_from_cache": st.frames_from_cache,
        "frames_from_memory": st.frames_from_memory,
        "code_cache_hits": st.code_cache_hits,
        "code_cache_misses": st.code_cache_misses,
        "stale_invalidations": st.stale_invalidations,
        "rereads": st.rereads,
        "resamples": st.resamples,
        "marker_writes": st.marker_writes,
        "table_resets": st.table_resets,
        "cache_drops": st.cache_drops,
        "threads_unchanged": st.threads_unchanged,
        "samples_unchanged": st.samples_unchanged,
        "sample_kinds": sample_kinds,
        "rate_hz": rate,
        "remote_reads": st.remote_reads,
        "remote_read_bytes": st.remote_read_bytes,
        "reads_per_sample": st.remote_reads as f64 / n,
        "functions": functions,
        "frames": frames,
        "stacks": stacks,
    });
    if json {
        outln!("{doc}");
    } else {
        outln!(
            "pyfleet bench: pid {pid}, Python {version}, {:.1} s",
            wall.as_secs_f64()
        );
        if let serde_json::Value::Object(map) = &doc {
            for (k, v) in map {
                outln!("  {k:<26} {v}");
            }
        }
        if !floor {
            let secs = wall.as_secs_f64();
            outln!(
                "what it cost: {} samples of process {pid} in {secs:.1} s ({:.0} a second), \
                 {:.0} MB read from its memory, {} writes to it (the 3.15 marker), {:.2} s of \
                 pyfleet's CPU. The target was never stopped, but reads back to back slow a \
                 busy one (measured: to about two thirds of its speed; README, \"What bench \
                 costs\")",
                st.samples,
                st.samples as f64 / secs.max(1e-9),
                st.remote_read_bytes as f64 / 1e6,
                st.marker_writes,
                cpu_ns as f64 / 1e9
            );
        }
    }
    if let Some(e) = last_error {
        eprintln!("pyfleet: last sampling error: {e}");
    }
    Ok(())
}

/// The fleet floor: one bare 8-byte `process_vm_readv` per target per round, rounds paced at
/// `rate` on one thread (as the daemon's sampling thread paces its samples). What any
/// profiler reading these targets at this rate must at least spend on this machine.
fn fleet_floor(pids: &[i32], rate: f64, duration: f64, json: bool) -> Result<()> {
    use pyfleet::memory::{ProcessMemory, RemoteMemory};
    use std::time::{Duration, Instant};
    if !(rate.is_finite() && rate > 0.0 && rate <= 10_000.0) {
        anyhow::bail!("--rate must be a positive number of rounds per second, at most 10000");
    }
    let mut targets = Vec::new();
    for &pid in pids {
        let unwinder = cpython::attach(
            pid,
            cpython::UnwinderOptions {
                read_only: true,
                ..Default::default()
            },
        )?;
        targets.push((ProcessMemory::new(pid), unwinder.runtime_address()));
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let limit = Duration::from_secs_f64(duration);
    let cpu0 = pyfleet::process::own_thread_cpu_ns();
    let start = Instant::now();
    let (mut next, mut rounds, mut reads) = (start, 0u64, 0u64);
    while start.elapsed() < limit {
        for (mem, addr) in &targets {
            if mem.read_u64(*addr).is_ok() {
                reads += 1;
            }
        }
        rounds += 1;
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu_ns = match (cpu0, pyfleet::process::own_thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let doc = serde_json::json!({
        "mode": "fleet-floor",
        "processes": targets.len(),
        "rate_hz": rate,
        "duration_s": wall,
        "rounds": rounds,
        "reads": reads,
        "cpu_percent_of_one_core": cpu_ns as f64 / 1e9 / wall * 100.0,
        "cpu_us_per_read": cpu_ns as f64 / 1e3 / reads.max(1) as f64,
    });
    if json {
        outln!("{doc}");
    } else {
        outln!(
            "fleet floor: {} processes at {rate} Hz: {:.2}% of one core ({:.2} µs per read)",
            targets.len(),
            doc["cpu_percent_of_one_core"].as_f64().unwrap_or(0.0),
            doc["cpu_us_per_read"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
