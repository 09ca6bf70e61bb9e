//! `pyfleet top`: a live terminal view of where processes spend their samples, like `py-spy
//! top`: functions by own and total share, for the whole fleet or one process, with the
//! shares of samples on a CPU, holding the GIL and waiting for it; sorted and filtered by key,
//! redrawn in place (ratatui draws only what changed), the terminal as it was once `q` quits.
//!
//! Its samples come from a fleet of its own (`--pid`, `--match`, or every Python process of
//! the host when none is named: the fleet's pipeline as `record` runs it, every snapshot window of a second handed to the screen instead of a
//! file) or from a running daemon (`--connect ADDR`: a pull of each second from its
//! listener). The screen runs on the main thread; the fleet or the pulls on the runtime's.

use anyhow::{anyhow, bail, Context, Result};
use pyfleet::cpython;
use pyfleet::discovery::HostDiscovery;
use pyfleet::sampling_options::{Sampling, SamplingOptions};
use pyfleet::stack_source::UnwinderFactory;
use pyfleet::top::model::TopModel;
use pyfleet::top::remote::Remote;
use pyfleet::top::terminal::{Input, KeyInput, Watch};
use pyfleet::top::view::{self, Header, ViewState};
use pyfleet_actors::{Fleet, FleetConfig, Snapshot, SnapshotWriter};
use pyfleet_policies::Mode;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `top`'s CPU budget for its own fleet: one core, as `record`'s.
const TOP_MAX_CPU_PERCENT: f64 = 100.0;
/// How often the screen gets a window of samples.
const WINDOW: Duration = Duration::from_secs(1);
/// How long the screen waits for a key before it looks for samples again.
const KEY_WAIT: Duration = Duration::from_millis(100);
/// Longest token file read.
const MAX_TOKEN_BYTES: u64 = 4096;

#[derive(Debug, Clone, clap::Args)]
pub struct TopOptions {
    /// A process to show, as `pyfleet top 1234` (the same as --pid).
    #[arg(value_name = "PID")]
    pub bare_pids: Vec<i32>,
    /// A process to show (repeatable).
    #[arg(long = "pid", short = 'p', value_name = "PID")]
    pub pids: Vec<i32>,
    /// The Python processes whose program matches REGEX (its name, its executable's name, or
    /// its command line without directories; see `record`), repeatable, those that start
    /// later too.
    #[arg(long = "match", short = 'm', value_name = "REGEX")]
    pub matches: Vec<String>,
    /// cpu, wall or gil (see `record`) [default: cpu].
    #[arg(long, value_name = "cpu|wall|gil")]
    pub mode: Option<String>,
    /// Samples per second per process [default: 100].
    #[arg(long, short = 'r', value_name = "HZ")]
    pub rate: Option<f64>,
    /// auto, reads or kernel (see `record`) [default: auto].
    #[arg(long, value_name = "auto|reads|kernel")]
    pub capture: Option<String>,
    /// Show what a running daemon samples, from its listener (`--metrics-addr`): HOST:PORT.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["pids", "bare_pids", "matches", "mode", "rate", "capture"])]
    pub connect: Option<String>,
    /// With --connect: a file holding the listener's bearer token [default: the token a
    /// daemon of this user keeps in its state directory, e.g. /var/lib/pyfleet/listen-token
    /// for root, when there is one].
    #[arg(long, value_name = "FILE", requires = "connect")]
    pub token_file: Option<PathBuf>,
    /// With --connect https://HOST:PORT: the CA certificates (PEM) the listener's certificate
    /// must come from [default: the system's].
    #[arg(long, value_name = "FILE", requires = "connect")]
    pub ca_file: Option<PathBuf>,
}

/// The fleet's snapshots, handed to the screen.
struct ToScreen(mpsc::Sender<Result<Snapshot, String>>);

impl SnapshotWriter for ToScreen {
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String> {
        // The screen gone (quitting): nothing to hand over.
        let _ = self.0.send(Ok(snap.clone()));
        Ok(PathBuf::new())
    }

    fn apply_retention(&self) {}
}

/// Where the samples come from.
enum Source {
    Fleet(Fleet),
    Daemon,
}

/// What to show, validated.
enum Plan {
    Fleet(Box<Sampling>),
    Daemon(Remote),
}

pub fn run(o: TopOptions) -> Result<()> {
    // Mistakes first, each its own line, terminal or not.
    let plan = match &o.connect {
        Some(addr) => {
            let token = match o
                .token_file
                .clone()
                .or_else(pyfleet::listener::own_token::existing_file)
            {
                Some(path) => Some(read_token(&path)?),
                None => None,
            };
            let tls = match Remote::is_https(addr) {
                true => Some(
                    pyfleet::tls::client_config(o.ca_file.as_deref(), "--ca-file")
                        .map_err(|e| anyhow!(e))?,
                ),
                false if o.ca_file.is_some() => {
                    bail!("--ca-file goes with --connect https://HOST:PORT")
                }
                false => None,
            };
            Plan::Daemon(Remote::new(addr, token, tls).map_err(|e| anyhow!(e))?)
        }
        None => Plan::Fleet(Box::new(sampling(&o)?)),
    };
    if !std::io::stdout().is_terminal() {
        bail!("top draws on a terminal, and standard output is not one (for a file, use `pyfleet record`)");
    }
    let runtime = super::fleet_runtime::runtime()?;
    let (tx, rx) = mpsc::channel();
    let (source, what, how, rate_hz) = match plan {
        Plan::Daemon(remote) => {
            let what = format!("the daemon at {}", remote.authority());
            runtime.spawn(pull_forever(remote, tx));
            (
                Source::Daemon,
                what,
                "samples as it takes them".to_string(),
                None,
            )
        }
        Plan::Fleet(sampling) => start_fleet(*sampling, &runtime, tx)?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    runtime.spawn(stop_on_signals(stop.clone()));

    let watch = Watch::start(stop.clone())?;
    let mut terminal = ratatui::init();
    let shown = show(&mut terminal, &rx, &stop, what, how, rate_hz);
    ratatui::restore();
    drop(watch);
    if let Source::Fleet(fleet) = source {
        let grace = super::fleet_runtime::STOP_GRACE * 2;
        let _ = runtime.block_on(async { tokio::time::timeout(grace, fleet.shutdown()).await });
    }
    runtime.shutdown_timeout(Duration::from_millis(200));
    shown
}

/// The screen, until `q` (or a signal, or the terminal hanging up).
fn show(
    terminal: &mut ratatui::DefaultTerminal,
    rx: &mpsc::Receiver<Result<Snapshot, String>>,
    stop: &AtomicBool,
    what: String,
    how: String,
    rate_hz: Option<f64>,
) -> Result<()> {
    let keys = KeyInput::open()?;
    let mut model = TopModel::default();
    let mut state = ViewState::default();
    let mut since = Instant::now();
    let mut last_error: Option<String> = None;
    while !state.quit && !stop.load(Ordering::Relaxed) {
        while let Ok(window) = rx.try_recv() {
            match window {
                Ok(snap) => {
                    model.add_snapshot(&snap);
                    last_error = None;
                }
                Err(e) => last_error = Some(e),
            }
        }
        if state.reset {
            model.reset();
            since = Instant::now();
            state.reset = false;
        }
        let header = Header {
            what: what.clone(),
            how: match &last_error {
                Some(e) => format!("{how} (last pull failed: {e})"),
                None => how.clone(),
            },
            seconds: since.elapsed().as_secs_f64(),
            rate_hz,
        };
        terminal
            .draw(|f| view::draw(f, &model, &state, &header))
            .context("cannot draw on the terminal")?;
        match keys.wait(KEY_WAIT)? {
            Input::Quiet => {}
            Input::HungUp => bail!("the terminal hung up"),
            Input::Ready => take_keys(&model, &mut state)?,
        }
    }
    Ok(())
}

/// Every key crossterm has (one read may bring several), each to the screen's state.
fn take_keys(model: &TopModel, state: &mut ViewState) -> Result<()> {
    while event::poll(Duration::ZERO).context("cannot read the terminal")? {
        let Event::Key(k) = event::read().context("cannot read the terminal")? else {
            continue;
        };
        if k.kind == KeyEventKind::Press {
            let pids: Vec<i32> = model.processes().into_iter().map(|(p, _)| p).collect();
            state.key(k, &pids);
        }
    }
    Ok(())
}

/// The sampling `--pid` and `--match` ask for, each `--pid` a Python process pyfleet can read.
fn sampling(o: &TopOptions) -> Result<Sampling> {
    let mut pids = o.pids.clone();
    pids.extend(&o.bare_pids);
    let sampling = SamplingOptions {
        matches: o.matches.clone(),
        pids,
        rate: o.rate,
        mode: o.mode.clone(),
        capture: o.capture.clone(),
        ..SamplingOptions::default()
    }
    .resolve(std::process::id() as i32, TOP_MAX_CPU_PERCENT)
    .map_err(|e| anyhow!(e))?;
    // Each --pid must be a Python process pyfleet can read, now.
    for &pid in &sampling.pids {
        cpython::attach(
            pid,
            cpython::UnwinderOptions {
                frame_cache: false,
                read_only: true,
                ..Default::default()
            },
        )
        .with_context(|| format!("cannot show process {pid}"))?;
    }
    Ok(sampling)
}

/// A fleet of its own for `--pid` and `--match`, each window of it sent to the screen.
fn start_fleet(
    sampling: Sampling,
    runtime: &tokio::runtime::Runtime,
    tx: mpsc::Sender<Result<Snapshot, String>>,
) -> Result<(Source, String, String, Option<f64>)> {
    let what = match (sampling.pids.as_slice(), sampling.matches.as_slice()) {
        ([], []) => "every Python process".to_string(),
        ([pid], []) => format!("pid {pid}"),
        (pids, matches) => {
            let mut parts: Vec<String> = pids.iter().map(|p| format!("pid {p}")).collect();
            parts.extend(matches.iter().map(|m| format!("/{m}/")));
            parts.join(", ")
        }
    };
    let rate = sampling.rate.base_hz();
    let config = FleetConfig {
        snapshot_interval: WINDOW,
        batch_interval: WINDOW / 4,
        mode: sampling.mode,
        rate: sampling.rate.clone(),
        stop_timeout: super::fleet_runtime::STOP_GRACE,
        ..FleetConfig::default()
    };
    config.validate().map_err(|e| anyhow!("{e}"))?;
    let (capture, how) = sampling
        .capture
        .start(rate, sampling.mode != Mode::Cpu)
        .map_err(|e| anyhow!(e))?;
    super::fleet_runtime::warn_without_ptrace("shown");
    pyfleet::process::runstate::raise_open_file_limit();
    let factory = UnwinderFactory::new(&sampling, capture);
    let fleet = runtime
        .block_on(Fleet::start(
            config,
            HostDiscovery::new(sampling.policy.clone()),
            factory,
            ToScreen(tx),
        ))
        .map_err(|e| anyhow!("{e}"))?;
    let how = format!("{} mode at {rate} Hz, {how}", sampling.mode.as_str());
    Ok((Source::Fleet(fleet), what, how, Some(rate)))
}

/// Pulls a second of the daemon's samples after another, each to the screen (a failure too,
/// then a second's pause).
async fn pull_forever(remote: Remote, tx: mpsc::Sender<Result<Snapshot, String>>) {
    loop {
        let pulled = remote.pull(WINDOW.as_secs().max(1)).await;
        let failed = pulled.is_err();
        if tx.send(pulled).is_err() {
            return;
        }
        if failed {
            tokio::time::sleep(WINDOW).await;
        }
    }
}

/// Sets `stop` at SIGTERM or SIGHUP (the terminal went away); Ctrl-C is a key in raw mode.
async fn stop_on_signals(stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
    stop.store(true, Ordering::Relaxed);
}

fn read_token(path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut text))
        .with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        bail!("--token-file {}: empty", path.display());
    }
    Ok(token.to_string())
}
