//! The command line: clap definitions and the one-shot commands (`dump`, `list`).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use pyfleet::cpython;
use pyfleet::output::dump::{self, DumpHeader};
use pyfleet::output::for_terminal;
use pyfleet::process::Process;
use pyfleet_policies::MatchPolicy;

#[derive(Parser, Debug)]
#[command(
    name = "pyfleet",
    version,
    about = "Always-on sampling profiler for fleets of CPython processes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print every interpreter, thread and frame of one Python process, innermost frame first.
    Dump {
        /// The process to read.
        #[arg(long, short)]
        pid: i32,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the Python processes on this host: pid, version, command line.
    List {
        /// Only processes whose command line or executable name matches this regex
        /// (repeatable: any may match).
        #[arg(long = "match", short = 'm', value_name = "REGEX")]
        matches: Vec<String>,
    },
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Dump { pid, json } => dump(pid, json),
        Command::List { matches } => list(&matches),
    }
}

fn dump(pid: i32, json: bool) -> Result<()> {
    // A dump is one sample: it needs no frame cache, and must not write to the target.
    let opts = cpython::SamplerOptions {
        frame_cache: false,
        read_only: true,
        cpu_status: true,
        ..Default::default()
    };
    let mut unwinder = cpython::attach(pid, opts)?;
    let stacks = unwinder
        .snapshot()
        .with_context(|| format!("reading the stacks of process {pid} failed"))?;
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
    println!("{out}");
    Ok(())
}

fn list(matches: &[String]) -> Result<()> {
    let policy = MatchPolicy::new(
        matches,
        [] as [&str; 0],
        &[],
        Some(std::process::id() as i32),
    )?;
    let found = pyfleet::discovery::scan(&policy);
    println!("{:>7}  {:<9}  COMMAND", "PID", "PYTHON");
    for p in &found {
        println!(
            "{:>7}  {:<9}  {}",
            p.pid,
            p.version.to_string(),
            for_terminal(&p.cmdline)
        );
    }
    if found.is_empty() {
        eprintln!("pyfleet: no matching Python process found");
    }
    Ok(())
}
