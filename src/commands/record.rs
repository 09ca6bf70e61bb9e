//! `pyfleet record`: profile some processes for a while into one file, like `py-spy record`,
//! on the fleet's own pipeline: the supervisor, the samplers and the shared sampling thread,
//! the aggregator and the snapshot sink of `pyfleet-actors`, with
//! [`RecordFile`](pyfleet::output::record_file::RecordFile) as the sink's writer.
//!
//! Validates everything before sampling (options, the output file, each `--pid`), then runs
//! until `--duration`, SIGINT/SIGTERM, or until every target has exited, and writes the file
//! (through the fleet's final snapshot, so every sample taken is in it). While it runs, and
//! only when stderr is a terminal, one line on stderr shows the progress. One line at the end
//! says what was written.
//!
//! The sink writes only the final snapshot in practice: the snapshot interval is longer than
//! the recording (or an hour when it has no end, the writer accumulating windows so that such
//! a checkpoint holds everything so far). No metrics exporter is installed (the metrics facade
//! then records nothing). The CPU budget is one whole core, so the rate is what was asked
//! unless sampling would need more.

use super::launched::{Launched, StopSignals};
use anyhow::{anyhow, bail, Context, Result};
use pyfleet::config::Seconds;
use pyfleet::cpython;
use pyfleet::output::format::{Format, RenderContext};
use pyfleet::output::record_file::RecordFile;
use pyfleet::output::snapshot_dir::utc_name;
use pyfleet::sampling_options::{Sampling, SamplingOptions};
use pyfleet::stack_source::{Counted, SampleCounters, UnwinderFactory};
use pyfleet_actors::{Fleet, FleetConfig, FleetStatus, ProcessState};
use pyfleet_policies::Mode;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `record`'s CPU budget: one core.
const RECORD_MAX_CPU_PERCENT: f64 = 100.0;
/// How often the end conditions are checked.
const POLL: Duration = Duration::from_millis(100);
/// How often `--wait` looks for a match.
const WAIT_POLL: Duration = Duration::from_millis(500);
/// Functions listed at the end, highest own share first.
const TOP_FUNCTIONS: usize = 5;
/// How often the progress line is redrawn.
const REDRAW: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, clap::Args)]
pub struct RecordOptions {
    /// Processes to record, as `pyfleet record 1234` (the same as --pid).
    #[arg(value_name = "PID")]
    pub bare_pids: Vec<i32>,
    /// Stop after this long (seconds, or 30s, 5m, 1h, ...) [default: at Ctrl-C, or when every
    /// target has exited].
    #[arg(long, short = 'd', value_name = "DURATION")]
    pub duration: Option<Seconds>,
    /// With --match: when nothing matches yet, wait for a match (the duration starts then)
    /// instead of failing.
    #[arg(long)]
    pub wait: bool,
    /// Output file [default: pyfleet-<UTC time>.<format's extension>].
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// folded, svg, speedscope or pprof [default: from the output's extension (.folded/.txt,
    /// .svg, .json/.speedscope.json, .pb.gz/.pprof), else svg].
    #[arg(long, short = 'f', value_name = "FORMAT")]
    pub format: Option<String>,
    /// Replace the output file even when it is not a profile (by default only a profile in
    /// the chosen format is replaced: never a source file by mistake).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub sampling: SamplingOptions,
}

/// Validated settings.
struct Plan {
    /// What to sample and how, as `run` takes it too.
    sampling: Sampling,
    duration: Option<Duration>,
    output: PathBuf,
    format: Format,
    force: bool,
    wait: bool,
}

fn plan(mut o: RecordOptions) -> Result<Plan> {
    o.sampling.pids.append(&mut o.bare_pids);
    if !o.sampling.command.is_empty() && (o.duration.is_some() || o.wait) {
        bail!("a program after -- is recorded until it exits: --duration and --wait go with processes");
    }
    if o.wait
        && o.sampling.matches.is_empty()
        && o.sampling.match_cmdline.is_empty()
        && o.sampling.match_label.is_empty()
    {
        bail!(
            "--wait goes with --match, --match-cmdline or --match-label (it waits for a \
             matching process to start)"
        );
    }
    let sampling = o
        .sampling
        .resolve(std::process::id() as i32, RECORD_MAX_CPU_PERCENT)
        .map_err(|e| anyhow!(e))?;
    let duration = o
        .duration
        .map(|d| d.positive("duration"))
        .transpose()
        .map_err(|e| anyhow!(e))?;
    let format = match (&o.format, &o.output) {
        (Some(f), out) => {
            let format = f.parse::<Format>().map_err(|e| anyhow!("--format: {e}"))?;
            // A name that says another format would mislead whoever opens the file.
            let named = out.as_deref().and_then(Format::from_path);
            if let (Some(named), Some(out)) = (named.filter(|n| *n != format), out) {
                return Err(anyhow!(
                    "--output {} is a {} file's name but --format is {}: give -o with .{}, or \
                     --format {}",
                    pyfleet::output::for_terminal(&out.display().to_string()),
                    named.name(),
                    format.name(),
                    format.extension(),
                    named.name()
                ));
            }
            format
        }
        (None, Some(out)) => Format::from_path(out).ok_or_else(|| {
            anyhow!(
                "cannot tell the format of {} from its extension (.folded, .txt, .svg, .json, \
                 .speedscope.json, .pb.gz, .pprof): give --format",
                out.display()
            )
        })?,
        (None, None) => Format::Svg,
    };
    let output = o.output.unwrap_or_else(|| {
        PathBuf::from(format!(
            "pyfleet-{}.{}",
            utc_name(std::time::SystemTime::now()),
            format.extension()
        ))
    });
    Ok(Plan {
        sampling,
        duration,
        output,
        format,
        force: o.force,
        wait: o.wait,
    })
}

/// One `--pid` target: its start time names it for its whole life.
struct Target {
    pid: i32,
    start: u64,
}

impl Target {
    /// Gone, a zombie, or its pid reused.
    fn exited(&self) -> bool {
        let state = std::fs::read(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                let close = stat.iter().rposition(|&b| b == b')')?;
                stat.get(close + 2).copied()
            });
        match state {
            None | Some(b'Z') | Some(b'X') | Some(b'x') => true,
            Some(_) => pyfleet::process::start_time(self.pid) != Some(self.start),
        }
    }
}

pub fn run(opts: RecordOptions) -> Result<()> {
    let mut plan = plan(opts)?;
    let what = match plan.sampling.command.is_empty() {
        true => describe_targets(&plan),
        false => pyfleet::output::for_terminal(&format!("`{}`", plan.sampling.command.join(" ")))
            .into_owned(),
    };
    let ctx = RenderContext {
        title: format!("pyfleet record: {what}"),
        rate_hz: Some(plan.sampling.rate.base_hz()),
        asked_hz: None,
        mode: plan.sampling.mode,
        duration: None,
        tasks: plan.sampling.task_frames,
        icicle: false,
    };
    // The output first: an unwritable file fails before anything else happens.
    let writer = RecordFile::open(
        &plan.output,
        plan.format,
        ctx,
        plan.force,
        plan.sampling.file_mode,
    )
    .map_err(|e| anyhow!(e))?
    .by_function(plan.sampling.by_function);
    let runtime = super::fleet_runtime::runtime()?;
    // A program to start: the signals that end a recording are taken first (so the program
    // gets them at their default), then it is started held at its gate (it runs once the
    // recorder is ready), and recorded by its pid and its Python descendants.
    let mut stop_signals = None;
    let mut launched = match plan.sampling.command.is_empty() {
        true => None,
        false => {
            let _in_runtime = runtime.enter();
            stop_signals = Some(StopSignals::install(true)?);
            let program = Launched::spawn(&plan.sampling.command)?;
            plan.sampling.policy = program.policy()?;
            Some(program)
        }
    };
    let what = match &launched {
        Some(program) => format!("{what} (pid {})", program.pid()),
        None => what,
    };
    // Each --pid must be a Python process we can read, now (one-line errors as `dump`'s).
    let mut targets = Vec::new();
    for &pid in &plan.sampling.pids {
        let unwinder = cpython::attach(
            pid,
            cpython::UnwinderOptions {
                frame_cache: false,
                read_only: true,
                ..Default::default()
            },
        )
        .with_context(|| format!("cannot record process {pid}"))?;
        if plan.sampling.tasks.is_some() && unwinder.layout().task_objects.is_none() {
            bail!(
                "cannot record process {pid} with --async: asyncio tasks can be read from \
                 Python 3.14 on, and it runs {}",
                unwinder.layout().version
            );
        }
        let start = pyfleet::process::start_time(pid)
            .ok_or_else(|| anyhow!("cannot record process {pid}: it exited"))?;
        targets.push(Target { pid, start });
    }
    // No match without --wait is an error before anything starts; with --wait, the first line
    // is said before waiting.
    let matched_now = !plan.by_rule() || matches_now(&plan)?;

    let config = FleetConfig {
        snapshot_interval: plan
            .duration
            .map(|d| d + Duration::from_secs(60))
            .unwrap_or(Duration::from_secs(3600)),
        // A program started here is looked for often: its first moments count.
        scan_interval: match launched {
            Some(_) => super::launched::SCAN,
            None => FleetConfig::default().scan_interval,
        },
        mode: plan.sampling.mode,
        rate: plan.sampling.rate.clone(),
        stop_timeout: super::fleet_runtime::STOP_GRACE,
        ..FleetConfig::default()
    };
    config.validate().map_err(|e| anyhow!("{e}"))?;
    let (capture, how) = plan
        .sampling
        .capture
        .start(
            plan.sampling.rate.base_hz(),
            plan.sampling.mode != Mode::Cpu,
        )
        .map_err(|e| anyhow!(e))?;
    pyfleet::logging::note(&format!(
        "recording {what} at {} Hz ({} mode{}); {how}",
        plan.sampling.rate.base_hz(),
        plan.sampling.mode.as_str(),
        if plan.sampling.read_only {
            ", read-only"
        } else {
            ""
        },
    ));
    if !matched_now {
        await_match(&plan);
    }
    let counters = Arc::new(SampleCounters::default());
    super::fleet_runtime::warn_without_ptrace("recorded");
    pyfleet::process::runstate::raise_open_file_limit();
    if plan.sampling.switch_log {
        super::fleet_runtime::start_switch_log();
    }
    let started = Instant::now();
    let progress = std::io::stderr().is_terminal();
    let why = runtime.block_on(async {
        let mut signals = match stop_signals.take() {
            Some(signals) => signals,
            None => StopSignals::install(false)?,
        };
        let fleet = Fleet::start(
            config,
            plan.sampling.discovery(),
            Counted {
                inner: UnwinderFactory::new(&plan.sampling, capture.clone()),
                counters: counters.clone(),
            },
            writer.clone(),
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
        if let Some(program) = launched.as_mut() {
            // Stopped before the program was released: it is not started at all.
            match signals.arrived().await {
                Some(sig) => program.abandon(sig),
                None => program.release(),
            }
        }

        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_draw: Option<Instant> = None;
        let mut seen_any = false;
        let mut status: Option<FleetStatus> = None;
        let why = loop {
            // With a program started here, the recording ends when it exits; a signal is
            // passed on to it as `launched` says.
            tokio::select! {
                sig = signals.next() => match launched.as_mut() {
                    Some(program) => {
                        program.heard(sig);
                        continue;
                    }
                    None => break Some(format!("stopped by {}", sig.as_str())),
                },
                _ = tick.tick() => {}
            }
            if let Some(program) = launched.as_mut() {
                program.escalate();
                if program.exited() {
                    break Some(format!("the program exited ({})", program.exit_code()));
                }
            }
            if plan.duration.is_some_and(|d| started.elapsed() >= d) {
                break None;
            }
            if let Ok(s) = fleet.status().await {
                seen_any |= s
                    .processes
                    .iter()
                    .any(|p| p.state == ProcessState::Sampling);
                status = Some(s);
            }
            if launched.is_none() {
                if let Some(why) = ended(&plan, &targets, seen_any, status.as_ref()) {
                    break Some(why);
                }
            }
            if progress && last_draw.is_none_or(|t| t.elapsed() >= REDRAW) {
                last_draw = Some(Instant::now());
                draw(&what, &plan, started.elapsed(), &counters, status.as_ref());
            }
        };
        if progress {
            let line = format!("pyfleet: writing {}…", writer.path().display());
            status_line(&pyfleet::output::for_terminal(&line));
        }
        let written = super::fleet_runtime::stop_and_write(fleet).await;
        if progress {
            status_line("");
        }
        written?;
        Ok::<_, anyhow::Error>(why)
    });
    // Blocking work still running (a probe stuck on a target's file) is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(200));
    let why = why?;
    let written = writer.written().unwrap_or_default();
    let top = writer.top_functions(TOP_FUNCTIONS);
    if !top.is_empty() {
        eprintln!(
            "pyfleet: highest own share ({} mode: {} samples):",
            plan.sampling.mode.as_str(),
            written.samples
        );
        for hot in &top {
            eprintln!(
                "  {:5.1}%  {}",
                hot.share,
                pyfleet::output::for_terminal(&hot.to_string())
            );
        }
    }
    print_task_entries(&writer, plan.sampling.mode);
    print_gil_holders(&writer, written.samples);
    print_collections(&writer, written.samples);
    if plan.sampling.mode == Mode::Wall && capture.is_some() && writer.gil_waits() > 0 {
        pyfleet::logging::note(
            "note: with the kernel capture, threads waiting for the GIL are not charged to \
             the GIL's holder (the capture knows the holder only as of its last full read): \
             --capture reads does",
        );
    }
    if capture.is_some() && writer.loop_blockers().1 > 0 {
        pyfleet::logging::note(
            "note: with the kernel capture, ready asyncio tasks are not charged to what their \
             loop ran meanwhile (a thread's chain comes at its own interrupts, not at each \
             tick): --capture reads does",
        );
    }
    let mut line = format!(
        "pyfleet: wrote {} thread samples of {} process{} to {} ({}, {} mode)",
        written.samples,
        written.processes,
        if written.processes == 1 { "" } else { "es" },
        writer.path().display(),
        writer.format(),
        plan.sampling.mode.as_str(),
    );
    if let Some(hot) = top.first() {
        line.push_str(&format!("; hottest: {hot} {:.1}%", hot.share));
    }
    line.push_str(&failed_note(
        counters.errors(),
        counters.samples(),
        !plan.sampling.blocking && capture.is_none(),
    ));
    let lost = capture.as_ref().map_or(0, |c| c.lost());
    if lost > 0 {
        line.push_str(&format!(
            "; {lost} sample{} lost (the kernel capture had no room for them, or could not read them)",
            if lost == 1 { "" } else { "s" }
        ));
    }
    if let Some(why) = why {
        line.push_str("; ");
        line.push_str(&why);
    }
    if written.samples == 0
        && counters.errors() == 0
        && plan.sampling.mode == Mode::Cpu
        && launched.is_none()
    {
        line.push_str(
            "; no thread ran on a CPU while recorded (cpu mode counts only those): \
             --mode wall shows where idle threads wait",
        );
    }
    if plan.sampling.leave_out_idle {
        line.push_str(&idle_note(
            counters.idle_left_out(),
            &helpers_left_out(&plan),
        ));
    }
    eprintln!("{}", pyfleet::output::for_terminal(&line));
    if let Some(mut program) = launched {
        std::process::exit(program.exit_code());
    }
    Ok(())
}

/// With `--match`: whether a process matches now. Without `--wait`, none is an error (the
/// user sees it at once, not after the duration).
fn matches_now(plan: &Plan) -> Result<bool> {
    use pyfleet_actors::Discovery;
    // What the fleet would list: the same scan, rules and roles.
    let mut discovery = plan.sampling.discovery();
    let found = !discovery.scan().is_empty();
    let refused = pyfleet::discovery::refusal_line(&discovery.refused());
    if found {
        if let Some(line) = refused {
            pyfleet::logging::warning(&line);
        }
        note_left_out_subprocesses(plan);
        return Ok(true);
    }
    // Matches it may not read: the privilege is the error, not "no process matches".
    if let Some(line) = refused {
        bail!(
            "no Python process matching {} can be read: {line}",
            plan.rules()
        );
    }
    if plan.whole_host() {
        bail!(
            "no Python process runs here that pyfleet can read (`pyfleet doctor` says why; \
             --pid or --match names one)"
        );
    }
    if !plan.wait {
        bail!(
            "no Python process matches {} (`pyfleet list` shows the Python processes it \
             can see; --wait waits for one to start)",
            plan.rules()
        );
    }
    Ok(false)
}

/// With `--match --wait`: returns once a process matches.
fn await_match(plan: &Plan) {
    use pyfleet_actors::Discovery;
    let mut discovery = plan.sampling.discovery();
    pyfleet::logging::note(&format!(
        "waiting for a Python process matching {} (Ctrl-C to give up)",
        plan.rules()
    ));
    loop {
        std::thread::sleep(WAIT_POLL);
        if !discovery.scan().is_empty() {
            note_left_out_subprocesses(plan);
            return;
        }
    }
}

/// Without `--subprocesses`: says so when matched processes have Python descendants that do
/// not match (uvicorn's and multiprocessing's workers run `python -c ...`), since a
/// recording of a master that only waits would otherwise be empty without a word why.
fn note_left_out_subprocesses(plan: &Plan) {
    use pyfleet_actors::Discovery;
    if plan.sampling.subprocesses {
        return;
    }
    let scan = |subprocesses| {
        plan.sampling
            .discovery()
            .with_subprocesses(subprocesses)
            .scan()
            .into_iter()
            .map(|p| p.pid)
            .collect::<std::collections::BTreeSet<i32>>()
    };
    let matched = scan(false);
    let left_out: Vec<String> = scan(true)
        .difference(&matched)
        .map(i32::to_string)
        .collect();
    if left_out.is_empty() {
        return;
    }
    let n = left_out.len();
    let (es, does, s) = if n == 1 {
        ("", "does", "")
    } else {
        ("es", "do", "s")
    };
    let shown = left_out
        .iter()
        .take(8)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let more = if n > 8 { ", ..." } else { "" };
    pyfleet::logging::note(&format!(
        "note: {n} Python process{es} started by the matched ones {does} not match (pid{s} \
         {shown}{more}) and will not be recorded; --subprocesses takes them in"
    ));
}

/// Most entries, and phases of each, the summary of task samples shows.
const TOP_ENTRIES: usize = 8;
const TOP_PHASES: usize = 6;
/// Phases below this share of their entry's samples are not shown.
const MIN_PHASE_SHARE: f64 = 1.0;

/// With task samples recorded: where the tasks spend their time, by entry into the program's
/// own code and what each called next, then what held the event loops, then the ready
/// tasks by what their loop ran while they waited (see `output::task_entries`).
fn print_task_entries(writer: &RecordFile, mode: Mode) {
    let (entries, total) = writer.task_entries();
    if total == 0 {
        return;
    }
    let counted = match mode {
        Mode::Wall => "waiting counts",
        Mode::Cpu => "on a CPU",
        Mode::Gil => "holding the GIL",
    };
    eprintln!(
        "pyfleet: asyncio tasks by their first function in the program's own code \
         ({total} task samples, {} mode: {counted}):",
        mode.as_str()
    );
    print_entries(&entries);
    let (holders, running) = writer.loop_holders();
    if running > 0 {
        eprintln!(
            "pyfleet: what held the event loops ({running} samples of a loop running \
             Python; meanwhile every other task of the loop waited):"
        );
        print_entries(&holders);
    }
    let (blocked, ready) = writer.loop_blockers();
    if ready > 0 {
        eprintln!(
            "pyfleet: tasks ready but waiting for their event loop, by what the loop ran \
             meanwhile ({ready} samples, {:.1}% of task samples):",
            100.0 * ready as f64 / total.max(1) as f64
        );
        print_entries(&blocked);
    }
}

/// Entries and their phases, for the terminal.
fn print_entries(entries: &[pyfleet::output::task_entries::Entry]) {
    use pyfleet::output::task_entries::ITSELF;
    let shown = |label: &str| {
        let label: String = label
            .chars()
            .take(pyfleet::output::record_file::MAX_LABEL)
            .collect();
        pyfleet::output::for_terminal(&label).into_owned()
    };
    for e in entries.iter().take(TOP_ENTRIES) {
        eprintln!("  {:5.1}%  {}", e.share, shown(&e.label));
        for (phase, share) in e.phases.iter().take(TOP_PHASES) {
            if *share < MIN_PHASE_SHARE {
                break;
            }
            let phase = match phase.as_str() {
                ITSELF => ITSELF.to_string(),
                p => shown(p),
            };
            eprintln!("           {share:5.1}%  {phase}");
        }
    }
}

/// With samples of threads waiting for the GIL while a known thread held it: the functions
/// the holders ran (see `gil_blame`).
fn print_gil_holders(writer: &RecordFile, samples: u64) {
    let (holders, waiting) = writer.gil_holders();
    if waiting == 0 {
        return;
    }
    eprintln!(
        "pyfleet: threads waiting for the GIL, by the function its holder ran ({waiting} \
         samples, {:.1}% of all):",
        100.0 * waiting as f64 / samples.max(1) as f64
    );
    print_ranked(&holders);
}

/// The first [`TOP_FUNCTIONS`] of `ranked` (label, percent), labels bounded and defanged.
fn print_ranked(ranked: &[(String, f64)]) {
    for (label, share) in ranked.iter().take(TOP_FUNCTIONS) {
        let label: String = label
            .chars()
            .take(pyfleet::output::record_file::MAX_LABEL)
            .collect();
        eprintln!("  {share:5.1}%  {}", pyfleet::output::for_terminal(&label));
    }
}

/// With samples of the garbage collector: how much it ran, and which functions started the
/// collections (see `output::collector`).
fn print_collections(writer: &RecordFile, samples: u64) {
    let (starters, collecting) = writer.collections();
    if collecting == 0 {
        return;
    }
    eprintln!(
        "pyfleet: the garbage collector ran in {collecting} samples ({:.1}% of all), started by:",
        100.0 * collecting as f64 / samples.max(1) as f64
    );
    print_ranked(&starters);
}

/// Helper processes the recording leaves out as idle (see `HostDiscovery::leaving_out_helpers`)
/// that match now.
fn helpers_left_out(plan: &Plan) -> Vec<i32> {
    use pyfleet_actors::Discovery;
    let scan = |leave_out| {
        plan.sampling
            .discovery()
            .leaving_out_helpers(leave_out)
            .scan()
            .into_iter()
            .map(|p| p.pid)
            .collect::<std::collections::BTreeSet<i32>>()
    };
    let kept = scan(true);
    scan(false).difference(&kept).copied().collect()
}

/// The end line's word on what wall mode left out as idle: `samples` of threads and tasks
/// waiting for work, and the helper processes `helpers`.
fn idle_note(samples: u64, helpers: &[i32]) -> String {
    let mut parts = Vec::new();
    if samples > 0 {
        parts.push(format!(
            "{samples} sample{} of threads and asyncio tasks waiting for work (a pool's idle \
             workers, an idle event loop, a server's ticker)",
            if samples == 1 { "" } else { "s" }
        ));
    }
    if !helpers.is_empty() {
        let pids: Vec<String> = helpers.iter().take(8).map(i32::to_string).collect();
        parts.push(format!(
            "{} helper process{} (multiprocessing's resource tracker or forkserver: pid{} {}{})",
            helpers.len(),
            if helpers.len() == 1 { "" } else { "es" },
            if helpers.len() == 1 { "" } else { "s" },
            pids.join(", "),
            if helpers.len() > 8 { ", ..." } else { "" },
        ));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(
            "; left out as idle: {} (--idle keeps them)",
            parts.join(" and ")
        ),
    }
}

/// The end line's word on failed samples: how many, what share of those attempted, and when
/// above 1% with reads from outside (`reads`: neither `--blocking` nor the kernel capture),
/// the ways to get them all.
fn failed_note(errors: u64, samples: u64, reads: bool) -> String {
    if errors == 0 {
        return String::new();
    }
    let share = 100.0 * errors as f64 / (errors + samples) as f64;
    let s = if errors == 1 { "" } else { "s" };
    let mut note = format!("; {errors} failed sample{s} ({share:.1}% of those attempted");
    if share > 1.0 && reads {
        note.push_str(
            ": stacks that moved while read; --capture kernel copies each at an interrupt \
             (as root), --blocking pauses the target for each",
        );
    }
    note.push(')');
    note
}

/// Why the recording ends now that every target has exited, or `None`. With `--pid` only,
/// the pids themselves are watched (gone, zombie, or reused). With `--match`, the supervisor
/// must have sampled some process, every process it tracks must have exited since, and so
/// must every `--pid`.
fn ended(
    plan: &Plan,
    targets: &[Target],
    seen_any: bool,
    status: Option<&FleetStatus>,
) -> Option<String> {
    let pids_gone = targets.iter().all(Target::exited);
    if !plan.by_rule() {
        if !pids_gone {
            return None;
        }
        let pids: Vec<String> = targets.iter().map(|t| t.pid.to_string()).collect();
        return Some(match pids.as_slice() {
            [one] => format!("process {one} exited"),
            _ => format!("processes {} exited", pids.join(", ")),
        });
    }
    let fleet_gone = seen_any
        && status.is_some_and(|s| s.processes.iter().all(|p| p.state == ProcessState::Exited));
    (fleet_gone && pids_gone).then(|| "every matching process exited".to_string())
}

fn describe_targets(plan: &Plan) -> String {
    if plan.whole_host() {
        return "every Python process".to_string();
    }
    let mut parts: Vec<String> = plan
        .sampling
        .pids
        .iter()
        .map(|p| format!("pid {p}"))
        .collect();
    if plan.by_rule() {
        parts.push(plan.rules());
    }
    pyfleet::output::for_terminal(&parts.join(", ")).into_owned()
}

impl Plan {
    /// Whether processes are chosen by rules (`--match`, `--match-label`, or none given: every
    /// Python process), not only by pid.
    fn by_rule(&self) -> bool {
        !self.sampling.matches.is_empty()
            || !self.sampling.match_cmdline.is_empty()
            || !self.sampling.labels.is_empty()
            || self.whole_host()
    }

    /// No process named and no program to start: every Python process of the host.
    fn whole_host(&self) -> bool {
        self.sampling.policy.matches_everything()
            && self.sampling.labels.is_empty()
            && self.sampling.command.is_empty()
    }

    /// The rules, as the user gave them: `/A|B/` for the patterns, then each label rule.
    fn rules(&self) -> String {
        if self.whole_host() {
            return "every Python process".to_string();
        }
        let mut parts = Vec::new();
        if !self.sampling.matches.is_empty() {
            parts.push(format!("/{}/", self.sampling.matches.join("|")));
        }
        if !self.sampling.match_cmdline.is_empty() {
            parts.push(format!(
                "command line /{}/",
                self.sampling.match_cmdline.join("|")
            ));
        }
        parts.extend(self.sampling.labels.iter().cloned());
        pyfleet::output::for_terminal(&parts.join(" ")).into_owned()
    }
}

/// The progress line: targets, a bar when the duration is known, elapsed time, samples taken,
/// errors, processes being sampled.
fn draw(
    what: &str,
    plan: &Plan,
    elapsed: Duration,
    counters: &SampleCounters,
    status: Option<&FleetStatus>,
) {
    let secs = elapsed.as_secs_f64();
    let time = match plan.duration {
        Some(d) => {
            const WIDTH: usize = 10;
            let total = d.as_secs_f64();
            let filled = ((secs / total).clamp(0.0, 1.0) * WIDTH as f64) as usize;
            format!(
                "[{}{}] {secs:.1}/{total:.0} s",
                "#".repeat(filled),
                ".".repeat(WIDTH - filled)
            )
        }
        None => format!("{secs:.1} s"),
    };
    let sampling = status
        .map(|s| {
            s.processes
                .iter()
                .filter(|p| p.state == ProcessState::Sampling)
                .count()
        })
        .unwrap_or(0);
    // Short enough for an 80-column terminal (a wrapped line would not be redrawn in place).
    const WHAT_MAX: usize = 24;
    let what: String = if what.chars().count() > WHAT_MAX {
        what.chars().take(WHAT_MAX - 1).chain(['…']).collect()
    } else {
        what.to_string()
    };
    status_line(&format!(
        "recording {what} {time}, {} samples, {} errors, {sampling} process{}",
        counters.samples(),
        counters.errors(),
        if sampling == 1 { "" } else { "es" },
    ));
}

/// Replaces the terminal's progress line with `text` (already fit for a terminal).
fn status_line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2K{text}");
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_samples_are_told_with_their_share() {
        assert_eq!(failed_note(0, 100, true), "");
        assert_eq!(
            failed_note(1, 199, true),
            "; 1 failed sample (0.5% of those attempted)"
        );
        let note = failed_note(10, 90, true);
        assert!(note.starts_with("; 10 failed samples (10.0% of those attempted: "));
        assert!(note.contains("--blocking") && note.contains("--capture kernel"));
        assert!(!failed_note(10, 90, false).contains("--blocking"));
    }
}
