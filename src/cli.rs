//! The command line: clap's definitions, and which command runs (`commands/` holds them).

use crate::commands::{self, record::RecordOptions, top::TopOptions};
use anyhow::Result;
use clap::{Parser, Subcommand};
use pyfleet::config::RunOptions;
use pyfleet::cpython;

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
    /// How pyfleet's log on stderr is written: text (coloured only on a terminal) or json
    /// (one object per line, for log collectors).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        value_name = "FORMAT"
    )]
    pub log_format: pyfleet::logging::LogFormat,
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
        /// Also every asyncio task (Python 3.14+): its name, thread, whether it runs, its
        /// coroutine frames and the tasks awaiting it.
        #[arg(long = "async")]
        tasks: bool,
        /// Also each frame's local variables: names and values of the interpreter's own
        /// simple types (None, bool, int, float, str, bytes; a tuple, list or dict by its
        /// length), any other object by its type and address. Read from memory: nothing of
        /// the target runs (no `__repr__`).
        #[arg(long)]
        locals: bool,
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
    /// A live view of where processes spend their samples, like `py-spy top`: functions by
    /// own and total share, per process or for the fleet, with GIL and CPU shares (`q`
    /// quits). From a fleet of its own (--pid, --match) or a running daemon (--connect).
    Top(Box<TopOptions>),
    /// Compare two profiles (folded files, pprof profiles or snapshot directories): a
    /// differential flamegraph of what grew (red) and shrank (blue), shares normalised by
    /// each profile's samples, or the folded deltas; prints the functions whose own share
    /// changed most.
    Diff {
        /// The profile to compare against.
        #[arg(value_name = "BASE")]
        base: std::path::PathBuf,
        /// The profile to compare.
        #[arg(value_name = "NEW")]
        new: std::path::PathBuf,
        /// Where to write: `.svg` (a differential flamegraph) or `.folded` (`stack base new`
        /// per line, the base's counts scaled to the new total).
        #[arg(long, short, value_name = "FILE")]
        output: std::path::PathBuf,
        /// Permission bits of the file written, in octal (600: the owner only).
        #[arg(long, value_name = "MODE")]
        file_mode: Option<String>,
        /// Compare frames line by line (by default a function is one frame, however its
        /// lines moved between the two).
        #[arg(long)]
        lines: bool,
        /// How many requests (or jobs, any unit of work) each profile's window served, as
        /// BASE,NEW: the summary then says each function's own milliseconds per request.
        #[arg(long, value_name = "BASE,NEW", value_delimiter = ',')]
        requests: Vec<u64>,
    },
    /// List the Python processes on this host: pid, parent, version, the name pyfleet gives
    /// it (in file names and metric labels), its role (master, or worker of its parent), command line.
    List {
        /// Only processes whose program matches this regex: its name, its executable's name,
        /// or its command line without directories (repeatable: any may match).
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
        return commands::run::run(cli.run);
    };
    match command {
        Command::Run(opts) => commands::run::run(*opts),
        Command::Record(opts) => commands::record::run(*opts),
        Command::Dump {
            pid,
            bare_pid,
            json,
            nonblocking,
            tasks,
            locals,
        } => match pid.or(bare_pid) {
            Some(pid) => commands::dump::run(pid, json, !nonblocking, tasks, locals),
            None => anyhow::bail!("dump needs a process: `pyfleet dump PID`"),
        },
        Command::Doctor { json } => commands::doctor::run(json),
        Command::Top(opts) => commands::top::run(*opts),
        Command::Diff {
            base,
            new,
            output,
            file_mode,
            lines,
            requests,
        } => commands::diff::run(&base, &new, &output, file_mode.as_deref(), lines, &requests),
        Command::List {
            matches,
            match_label,
            exclude_label,
            subprocesses,
        } => commands::list::run(&matches, &match_label, &exclude_label, subprocesses),
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
            (pids, Some(rate)) if floor => commands::bench::fleet_floor(pids, rate, duration, json),
            (_, Some(rate)) if !(rate.is_finite() && rate > 0.0) => {
                anyhow::bail!("--rate must be a positive number of samples a second")
            }
            ([pid], rate) => {
                if !yes && !floor && rate.is_none() {
                    commands::bench::consent(*pid, duration)?;
                }
                let opts = cpython::UnwinderOptions {
                    frame_cache: !no_frame_cache,
                    read_only,
                    skip_idle: !no_skip_idle,
                    blocking,
                    ..Default::default()
                };
                commands::bench::run(*pid, duration, rate, switch_log, opts, floor, json)
            }
            _ => anyhow::bail!("several --pid go with --floor --rate"),
        },
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    let d = s
        .parse::<pyfleet::config::Seconds>()?
        .positive("duration")?;
    Ok(d.as_secs_f64())
}
