//! `pyfleet run`: the fleet daemon. Validates every setting first (one-line errors, nothing
//! started), then wires the actors of `pyfleet-actors` to the unwinder (`fleet`), the snapshot
//! directory (`output::snapshot_dir`) and the Prometheus exporter, and runs until SIGINT,
//! SIGTERM or the end of `--duration`, when a final snapshot is written.

use super::launched::{HeldSignals, Launched, StopSignals};
use super::privileges::{self, RunAs};
use anyhow::{anyhow, bail, Context, Result};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;
use pyfleet::config::RunOptions;
use pyfleet::output::snapshot_dir::SnapshotDir;
use pyfleet::stack_source::UnwinderFactory;
use pyfleet_actors::{Fleet, FleetConfig};
use std::sync::Arc;
use std::time::Duration;

/// pyfleet's own resident memory, for dashboards and alerts.
pub const RESIDENT_MEMORY: &str = "pyfleet_resident_memory_bytes";

/// How the daemon takes stacks: 1, labelled `stacks` (kernel, reads, paused) and `why` (why
/// not the kernel capture: asked, mode, blocking, switch_log, no_privilege, kernel_too_old,
/// denied, verifier_refused, load_failed; empty with the capture).
pub const CAPTURE_INFO: &str = "pyfleet_capture_info";
/// The kernel capture's samples lost: no room in the kernel's ring (`reason="ring_full"`),
/// too many waiting for one process (`"queue_full"`), or a record that did not parse
/// (`"unparsable"`).
pub const CAPTURE_LOST: &str = "pyfleet_capture_lost_samples_total";
/// The rate the kernel capture samples at (fixed at its start: the CPU budget lowers the
/// sampling threads' rate, not the capture's).
pub const CAPTURE_RATE: &str = "pyfleet_capture_rate_hz";

/// Exports how stacks are taken and, with the capture, its losses, every second: the
/// exporter drops a series nothing touched for its idle timeout (at least 30 s), so a value
/// set once at start would be gone within a minute.
async fn export_capture_state(
    how: pyfleet::capture::HowStacks,
    shared: Option<Arc<pyfleet::capture::SharedCapture>>,
) {
    let (stacks, why_not_kernel) = how.codes();
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        // Looked up at every tick, not once: a series the exporter dropped anyway (its idle
        // clock is not ours) comes back within a second rather than never.
        metrics::gauge!(CAPTURE_INFO, "stacks" => stacks, "why" => why_not_kernel).set(1.0);
        let Some(shared) = &shared else {
            continue;
        };
        metrics::gauge!(CAPTURE_RATE).set(f64::from(shared.rate_hz()));
        let lost = shared.losses();
        for (reason, n) in [
            ("ring_full", lost.ring_full),
            ("queue_full", lost.queue_full),
            ("unparsable", lost.unparsable),
        ] {
            metrics::counter!(CAPTURE_LOST, "reason" => reason).absolute(n);
        }
    }
}

pub fn run(opts: RunOptions) -> Result<()> {
    let mut settings = opts
        .resolve(std::process::id() as i32)
        .map_err(|e| anyhow!(e))?;
    let launching = !settings.sampling.command.is_empty();
    let user = match (&settings.user, launching) {
        (Some(_), true) => bail!(
            "--user goes with the daemon, not with a program after --: `run -- COMMAND` keeps \
             pyfleet's privileges to start the program as you and pass signals on to it"
        ),
        (Some(spec), false) => Some(RunAs::parse(spec)?),
        (None, _) => None,
    };
    let writer = SnapshotDir::open_for(
        &settings.out,
        settings.retention,
        settings.sampling.file_mode,
        user.as_ref().map(RunAs::owner),
    )
    .map_err(|e| anyhow!(e))?
    .with_formats(&settings.snapshot_formats)
    .by_function(settings.sampling.by_function)
    .showing_tasks(settings.sampling.task_frames)
    .with_sampling(settings.sampling.mode, settings.sampling.rate.base_hz());
    settings.listen.take_own_token().map_err(|e| anyhow!(e))?;
    let mut config = FleetConfig {
        scan_interval: settings.scan_interval,
        snapshot_interval: settings.snapshot_interval,
        ends_after: settings.duration,
        mode: settings.sampling.mode,
        rate: settings.sampling.rate.clone(),
        restart: settings.restart.clone(),
        stop_timeout: super::fleet_runtime::STOP_GRACE,
        ..FleetConfig::default()
    };
    config.validate().map_err(|e| anyhow!("{e}"))?;

    // What needs privileges is opened first, on this thread alone: a SIGTERM meanwhile waits,
    // and ends the daemon once it runs, with its last snapshot.
    let held = HeldSignals::hold()?;
    // Bound first, so that a port in use is a startup error, not a log line later.
    let bind = |addr: std::net::SocketAddr, option: &str| {
        std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| format!("cannot listen on {option} {addr}"))
    };
    let metrics_listener = settings
        .metrics_addr
        .map(|addr| bind(addr, "--metrics-addr"))
        .transpose()?;
    let health_listener = settings
        .health_addr
        .map(|addr| bind(addr, "--health-addr"))
        .transpose()?;
    let (capture, how) = settings
        .sampling
        .capture
        .start(
            settings.sampling.rate.base_hz(),
            settings.sampling.mode != pyfleet_policies::Mode::Cpu,
        )
        .map_err(|e| anyhow!(e))?;
    if settings.sampling.switch_log {
        super::fleet_runtime::start_switch_log();
    }
    pyfleet::process::runstate::raise_open_file_limit();
    // Then the daemon keeps only what it uses; its threads, all made after, the same.
    let kept = match launching {
        true => None,
        false => Some(privileges::keep_only_what_is_used(user.as_ref())?),
    };
    if user.is_some() {
        writer.ready_to_write().map_err(|e| anyhow!(e))?;
    }

    let runtime = super::fleet_runtime::runtime()?;
    // Set once the fleet runs: /debug/pprof/profile takes its profiles through it.
    let profiler = Arc::new(std::sync::OnceLock::new());
    let pull = pyfleet::listener::Pull {
        profiler: profiler.clone(),
        mode: settings.sampling.mode,
        rate_hz: settings.sampling.rate.base_hz(),
        tasks: settings.sampling.task_frames,
        snapshots: Some(writer.directory()),
        windows: Default::default(),
    };
    let result: Result<Option<i32>> = runtime.block_on(async move {
        // With a program to start, SIGHUP too (see `launched`).
        let mut signals = StopSignals::install(launching)?;
        // SIGHUP, when it does not end the run, reads the listener's credentials again.
        let hangup = match launching {
            true => None,
            false => Some(
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                    .context("cannot handle SIGHUP")?,
            ),
        };
        held.release()?;
        let reloader = pyfleet::listener::reload::Reloader::new(
            settings.listen.token_file.clone(),
            settings.listen.access.token.clone(),
            settings.listen.tls_files.clone(),
            settings.listen.tls.clone(),
        );
        tokio::spawn(reloader.run(hangup));
        if let Some(listener) = metrics_listener {
            let listener = tokio::net::TcpListener::from_std(listener)
                .context("cannot listen on --metrics-addr")?;
            let recorder = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::ALL, Some(config.metrics_idle_timeout()))
                // Real histogram buckets (not a summary), so rates and quantiles aggregate
                // across processes in Prometheus: 1 µs to 100 ms.
                .set_buckets_for_metric(
                    Matcher::Full(pyfleet_actors::metric_names::SAMPLE_DURATION.to_string()),
                    &[
                        1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2, 1e-1,
                    ],
                )
                .context("bad histogram buckets")?
                .build_recorder();
            let exporter = pyfleet::listener::Exporter::new(recorder.handle());
            metrics::set_global_recorder(recorder)
                .map_err(|_| anyhow!("a metrics recorder is already installed"))?;
            let site = pyfleet::listener::Pages::Site {
                exporter: exporter.clone(),
                pull,
                access: settings.listen.access.clone(),
            };
            tokio::spawn(pyfleet::listener::serve(
                listener,
                settings.listen.tls.clone(),
                pyfleet::listener::SITE_LIMITS,
                site,
            ));
            tokio::spawn(exporter.keep_tidy(config.metrics_idle_timeout() / 2));
            pyfleet_actors::metric_names::describe();
            metrics::describe_gauge!(
                CAPTURE_INFO,
                "How stacks are taken (stacks: kernel, reads, paused) and why not by the kernel capture (why)"
            );
            metrics::describe_gauge!(
                CAPTURE_RATE,
                "The rate the kernel capture samples at (the CPU budget lowers the sampling threads' rate only)"
            );
            metrics::describe_counter!(
                CAPTURE_LOST,
                "Kernel-capture samples lost (reason: ring_full, queue_full, unparsable)"
            );
            metrics::describe_gauge!(
                RESIDENT_MEMORY,
                metrics::Unit::Bytes,
                "pyfleet's own resident memory"
            );
            tokio::spawn(async {
                let mut every = tokio::time::interval(Duration::from_secs(5));
                loop {
                    every.tick().await;
                    if let Some(rss) = pyfleet::process::own_rss_bytes() {
                        metrics::gauge!(RESIDENT_MEMORY).set(rss as f64);
                    }
                }
            });
        }
        if let Some(listener) = health_listener {
            let listener = tokio::net::TcpListener::from_std(listener)
                .context("cannot listen on --health-addr")?;
            let probes = pyfleet::listener::Pages::Health {
                ready: profiler.clone(),
            };
            tokio::spawn(pyfleet::listener::serve(
                listener,
                None,
                pyfleet::listener::HEALTH_LIMITS,
                probes,
            ));
        }
        // A program to start (the signals that end the run are taken already, so it gets them
        // at their default): started held at its gate (it runs once the fleet is ready), and
        // profiled by its pid and its Python descendants.
        let mut launched = match settings.sampling.command.is_empty() {
            true => None,
            false => {
                let program = Launched::spawn(&settings.sampling.command)?;
                settings.sampling.policy = program.policy()?;
                config.scan_interval = config.scan_interval.min(super::launched::SCAN);
                Some(program)
            }
        };
        let what = if let Some(program) = &launched {
            let command = format!("`{}`", settings.sampling.command.join(" "));
            format!(
                "{} (pid {})",
                pyfleet::output::for_terminal(&command),
                program.pid()
            )
        } else if settings.sampling.matches.is_empty()
            && settings.sampling.match_cmdline.is_empty()
            && settings.sampling.pids.is_empty()
        {
            "every Python process".to_string()
        } else {
            let mut parts: Vec<String> = settings.sampling.matches.iter().map(|m| format!("/{m}/")).collect();
            parts.extend(
                settings
                    .sampling
                    .match_cmdline
                    .iter()
                    .map(|m| format!("command line /{m}/")),
            );
            parts.extend(settings.sampling.pids.iter().map(|p| format!("pid {p}")));
            parts.join(", ")
        };
        pyfleet::logging::note(&format!(
            "profiling {what} at {} Hz ({} mode{}); {how}; snapshots ({}) every {} s in {}; metrics {}{}{}; {}",
            settings.sampling.rate.base_hz(),
            settings.sampling.mode,
            if settings.sampling.read_only { ", read-only" } else { "" },
            settings
                .snapshot_formats
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", "),
            settings.snapshot_interval.as_secs_f64(),
            settings.out.display(),
            settings
                .metrics_addr
                .map(|a| format!(
                    "on {}://{a}/metrics {}",
                    if settings.listen.tls.is_some() { "https" } else { "http" },
                    settings.listen.describe()
                ))
                .unwrap_or_else(|| "off".into()),
            settings
                .health_addr
                .map(|a| format!("; probes on http://{a}/healthz and /readyz"))
                .unwrap_or_default(),
            settings
                .push
                .as_ref()
                .map(|p| format!(
                    "; pushing to pyroscope at {} every {} s",
                    p.target.authority,
                    p.interval.as_secs_f64()
                ))
                .unwrap_or_default(),
            match &kept {
                Some(kept) => kept.to_string(),
                None => "keeps its privileges for the program it starts".to_string(),
            },
        ));
        super::fleet_runtime::warn_without_ptrace("profiled");
        tokio::spawn(export_capture_state(how, capture.clone()));
        for &pid in &settings.sampling.pids {
            use pyfleet::discovery::Probed;
            match pyfleet::discovery::probe_within(pid, pyfleet::discovery::PROBE_DEADLINE) {
                Probed::Python(_) => {}
                Probed::Refused(why) => pyfleet::logging::warning(&format!(
                    "pid {pid} cannot be read: {}",
                    pyfleet::output::for_terminal(&why)
                )),
                _ => pyfleet::logging::warning(&format!(
                    "pid {pid} is not a Python process that can be read now; it is profiled if \
                     it becomes one"
                )),
            }
        }
        // Pushing to Pyroscope: windows go to a queue a task of its own sends.
        let pusher = settings.push.as_ref().map(|p| {
            let pusher = pyfleet::push::Pusher::start(
                p.target.clone(),
                p.queue,
                settings.sampling.mode,
                settings.sampling.rate.base_hz(),
            );
            config.push = Some(pyfleet_actors::PushSchedule {
                interval: p.interval,
                pusher: Arc::new(pusher.clone()),
            });
            pusher
        });
        let fleet = Fleet::start(
            config,
            settings.sampling.discovery()
                .warning_of_refusals(),
            UnwinderFactory::new(&settings.sampling, capture),
            writer,
        )
        .await
        .map_err(|e| anyhow!("{e}"))?;
        let _ = profiler.set(fleet.profiler());
        if let Some(program) = launched.as_mut() {
            // Stopped before the program was released: it is not started at all.
            match signals.arrived().await {
                Some(sig) => program.abandon(sig),
                None => program.release(),
            }
        }

        let why = wait_for_end(settings.duration, &mut signals, launched.as_mut()).await;
        tracing::info!("{why}: writing the final snapshot");
        let last = super::fleet_runtime::stop_and_write(fleet)
            .await
            .map_err(|e| anyhow!("{why}, but {e}"))?;
        if let Some(p) = pusher {
            // The last window went to the queue with the final snapshot: a moment to send it.
            p.drain(PUSH_DRAIN).await;
        }
        pyfleet::logging::note(&format!("{why}; last snapshot {}", last.display()));
        Ok(launched.as_mut().map(|program| program.exit_code()))
    });
    // Blocking work still running (a probe stuck on a target's file) is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(200));
    // A program started here: its exit status is pyfleet's.
    if let Some(code) = result? {
        std::process::exit(code);
    }
    Ok(())
}

/// Longest the daemon waits, at the end, for the queued push windows to be sent.
const PUSH_DRAIN: Duration = Duration::from_secs(5);

/// Waits for SIGINT, SIGTERM or the end of the duration; says which. With a program started
/// here, for its exit instead (a signal is passed on to it as `launched` says).
async fn wait_for_end(
    duration: Option<Duration>,
    signals: &mut StopSignals,
    launched: Option<&mut Launched>,
) -> String {
    if let Some(program) = launched {
        let mut tick = tokio::time::interval(super::launched::SCAN);
        loop {
            tokio::select! {
                sig = signals.next() => program.heard(sig),
                _ = tick.tick() => {}
            }
            program.escalate();
            if program.exited() {
                return "the program exited".to_string();
            }
        }
    }
    let sleep = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        sig = signals.next() => format!("stopped by {}", sig.as_str()),
        _ = sleep => "duration reached".to_string(),
    }
}
