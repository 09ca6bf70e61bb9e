//! Settings of the fleet daemon (`pyfleet run`): the same options on the command line and in a
//! TOML file (`--config pyfleet.toml`, keys as the long options: `match = ["gunicorn"]`,
//! `max-cpu = 5`, ...), the command line winning. [`RunOptions::resolve`] validates everything
//! up front, so bad input fails with one line before anything starts.
//!
//! Owns parsing and validation only; it starts nothing.

use crate::output::format::Format;
use crate::output::snapshot_dir::DEFAULT_FORMATS;
use pyfleet_policies::{
    parse_size, FileMode, MatchPolicy, Mode, RatePolicy, RestartPolicy, RetentionPolicy, Role,
};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_OUT: &str = "pyfleet-snapshots";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// A length of time as people write it: seconds (`90`, `2.5`) or a number with a unit (`30s`,
/// `5m`, `1h30m`, `250ms`); in a config file a number or a string. Checked for being positive
/// and finite where it is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub f64);

impl std::str::FromStr for Seconds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(v) = t.parse::<f64>() {
            return Ok(Seconds(v));
        }
        humantime::parse_duration(t)
            .map(|d| Seconds(d.as_secs_f64()))
            .map_err(|_| {
                format!(
                    "'{}' is not a length of time: give seconds (90, 2.5) or a number with a \
                     unit (30s, 5m, 1h)",
                    s.escape_debug()
                )
            })
    }
}

impl Seconds {
    /// The length as a `Duration` when it is positive and finite (under 10^9 s), else the
    /// one-line error for option `--name`.
    pub fn positive(self, name: &str) -> Result<Duration, String> {
        let v = self.0;
        if !(v.is_finite() && v > 0.0 && v < 1e9) {
            return Err(format!(
                "--{name} must be a positive length of time (got {v} s)"
            ));
        }
        Ok(Duration::from_secs_f64(v))
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(v) => Ok(Seconds(v)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The daemon's options, as clap parses them and as a config file holds them.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunOptions {
    /// Profile processes whose command line or executable name matches REGEX (repeatable).
    /// With no --match and no --pid, every Python process on the host.
    #[arg(long = "match", short = 'm', value_name = "REGEX")]
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    /// Never profile processes matching REGEX (repeatable; wins over --match and --pid).
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<String>,
    /// Only profile processes whose label KEY matches REGEX, as KEY=REGEX (repeatable: every
    /// one must match; keys: service, namespace, pod, pod_uid, container_id; see `pyfleet
    /// list`). A process without that label does not match.
    #[arg(long, value_name = "KEY=REGEX")]
    pub match_label: Vec<String>,
    /// Never profile processes whose label KEY matches REGEX (repeatable).
    #[arg(long, value_name = "KEY=REGEX")]
    pub exclude_label: Vec<String>,
    /// Never profile processes in this role: master (the parent of workers of its own name,
    /// such as a gunicorn master), worker, helper (multiprocessing's resource tracker or
    /// forkserver) or single (repeatable; see `pyfleet list`).
    #[arg(long, value_name = "ROLE")]
    pub exclude_role: Vec<String>,
    /// Also profile every Python descendant of a matched process, however it was started
    /// (fork, multiprocessing's spawn or forkserver, subprocess), found within a scan.
    #[arg(long)]
    pub subprocesses: bool,
    /// Profile this process (repeatable).
    #[arg(long = "pid", short = 'p', value_name = "PID")]
    #[serde(rename = "pid")]
    pub pids: Vec<i32>,
    /// Samples per second per process [default: 100].
    #[arg(long, value_name = "HZ")]
    pub rate: Option<f64>,
    /// Which thread samples count: cpu (threads on a CPU), wall (every thread, waiting too),
    /// gil (the thread holding the GIL) [default: cpu].
    #[arg(long, value_name = "cpu|wall|gil")]
    pub mode: Option<String>,
    /// pyfleet's own CPU budget, percent of one core; rates come down to hold it [default: 5].
    #[arg(long, value_name = "PERCENT")]
    pub max_cpu: Option<f64>,
    /// Time between scans for new and exited processes (seconds, or 500ms, 2s, ...)
    /// [default: 1s].
    #[arg(long, value_name = "DURATION")]
    pub scan_interval: Option<Seconds>,
    /// Time between snapshots (seconds, or 30s, 5m, 1h, ...) [default: 60s].
    #[arg(long, value_name = "DURATION")]
    pub snapshot_interval: Option<Seconds>,
    /// Format of the snapshots' files: folded, svg, speedscope or pprof (repeatable, or
    /// comma-separated) [default: folded and svg].
    #[arg(long = "snapshot-format", value_name = "FORMAT", value_delimiter = ',')]
    pub snapshot_format: Vec<String>,
    /// Directory for snapshots [default: ./pyfleet-snapshots].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Snapshots kept [default: 60].
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Most bytes of snapshots kept (e.g. 500M, 2G) [default: no limit].
    #[arg(long, value_name = "SIZE")]
    pub max_bytes: Option<String>,
    /// Permission bits of snapshot files, octal: read and write bits only, the owner's
    /// always; directories get search where read is allowed (0640 gives 0750). Set exactly,
    /// whatever the umask [default: 0600, the owner only].
    #[arg(long, value_name = "OCTAL")]
    pub file_mode: Option<String>,
    /// Fold snapshots' frames by function, without line numbers (one box per function).
    #[arg(long)]
    pub function: bool,
    /// Root each thread's stacks at a frame naming the thread (`thread NAME`, the kernel's
    /// name of the thread, in file `tid TID`).
    #[arg(long)]
    pub threads: bool,
    /// Wall mode: keep the samples of threads off their CPU that wait for work (a pool's
    /// idle workers, an idle event loop); by default they are left out.
    #[arg(long, conflicts_with = "no_idle")]
    pub idle: bool,
    /// Wall mode: leave out the samples of threads off their CPU that wait for work (the
    /// default).
    #[arg(long)]
    pub no_idle: bool,
    /// After `--`: a program to start and profile, with its Python subprocesses, from its
    /// start until it exits (`pyfleet run -- gunicorn app:app`); Ctrl-C goes to it, and its
    /// exit status becomes pyfleet's.
    #[arg(last = true, value_name = "COMMAND")]
    #[serde(skip)]
    pub command: Vec<String>,
    /// Prometheus listener address, or `off` [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR|off")]
    pub metrics_addr: Option<String>,
    /// Health and readiness (/healthz, /readyz) on a listener of their own, for probes: its
    /// connections are its own, so no client of --metrics-addr can starve it (IP:PORT, or
    /// off) [default: off; /healthz and /readyz are on --metrics-addr too].
    #[arg(long, value_name = "ADDR|off")]
    pub health_addr: Option<String>,
    /// Profiles (/debug/pprof/*) need `Authorization: Bearer <token>`, the token this file
    /// holds (one line, 16 characters or more); /metrics too with --listen-metrics-token.
    /// Config file: [listen] token-file.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub listen_token_file: Option<PathBuf>,
    /// /metrics needs the token too (else it is open). Config file: [listen] metrics-token.
    #[arg(long)]
    #[serde(skip)]
    pub listen_metrics_token: bool,
    /// Serve --metrics-addr over TLS with this certificate chain (PEM, leaf first). Config
    /// file: [listen] tls-cert.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub listen_tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM). Config file: [listen] tls-key.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub listen_tls_key: Option<PathBuf>,
    /// With TLS, only clients with a certificate from this CA (PEM) are served. Config file:
    /// [listen] client-ca.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub listen_client_ca: Option<PathBuf>,
    /// Serve profiles on an address other hosts reach without any credential (refused
    /// otherwise). Config file: [listen] insecure.
    #[arg(long)]
    #[serde(skip)]
    pub insecure_listen: bool,
    /// The config file's [listen] table.
    #[arg(skip)]
    #[serde(rename = "listen")]
    pub listen: Option<ListenFile>,
    /// Stop after this long (seconds, or 30s, 5m, 1h, ...; a final snapshot is written)
    /// [default: run until stopped].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<Seconds>,
    /// Never write to target processes (no 3.15 frame-cache marker; results stay exact).
    #[arg(long)]
    pub read_only: bool,
    /// Pause the target's threads for each sample (ptrace), so that every stack is one
    /// instant's; costs the target a short stop per sample (see docs/reference.md).
    #[arg(long)]
    pub blocking: bool,
    /// Tell idle threads by the kernel's log of context switches (needs CAP_PERFMON): a sample
    /// of a process that has not run costs no syscall, but every context switch on the host
    /// costs a little more while pyfleet runs (see docs/reference.md).
    #[arg(long)]
    pub switch_log: bool,
    /// How stacks are taken: kernel (the kernel copies a running thread's frames at its
    /// CPU's sampling interrupt, and in wall and gil modes a thread's as it leaves its CPU:
    /// one instant each, never stopping it; needs root), reads (pyfleet reads
    /// each target's memory at each tick), or auto (kernel where it can, else reads)
    /// [default: auto].
    #[arg(long, value_name = "auto|reads|kernel")]
    pub capture: Option<String>,
    /// Push profiles to Grafana Pyroscope at this URL (http[s]://host:port; see docs/reference.md)
    /// [default: no push]. Authentication and tenant: the config file's [pyroscope] table.
    #[arg(long = "pyroscope", value_name = "URL")]
    #[serde(skip)]
    pub pyroscope_url: Option<String>,
    /// Time between pushes to Pyroscope (seconds, or 15s, 1m, ...) [default: 15s].
    #[arg(long, value_name = "DURATION")]
    #[serde(skip)]
    pub push_interval: Option<Seconds>,
    /// The config file's [pyroscope] table.
    #[arg(skip)]
    #[serde(rename = "pyroscope")]
    pub pyroscope: Option<PyroscopeFile>,
    /// Read settings from this TOML file (command-line options win).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// The config file's `[pyroscope]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PyroscopeFile {
    pub url: Option<String>,
    pub push_interval: Option<Seconds>,
    /// A file holding `user:password` for basic authentication.
    pub basic_auth_file: Option<PathBuf>,
    /// A file holding a bearer token.
    pub token_file: Option<PathBuf>,
    /// `X-Scope-OrgID` (multi-tenant Pyroscope).
    pub tenant: Option<String>,
    /// Push windows held while Pyroscope does not take them [default: 64].
    pub queue: Option<usize>,
    /// For `https` URLs: the CAs (PEM) the server's certificate must come from [default: the
    /// system's].
    pub ca_file: Option<PathBuf>,
    /// Send credentials over plain `http` to a host other than this one (refused otherwise).
    pub credentials_over_http: bool,
}

/// The config file's `[listen]` table: who may read what `metrics-addr` serves.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ListenFile {
    /// A file holding the bearer token profiles need.
    pub token_file: Option<PathBuf>,
    /// `/metrics` needs the token too.
    pub metrics_token: bool,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    /// Serve profiles off loopback without a credential.
    pub insecure: bool,
}

/// Who may read what the daemon's listener serves, validated.
#[derive(Debug, Clone, Default)]
pub struct ListenSettings {
    pub access: crate::listener::access::Access,
    /// The listener's TLS, when it speaks TLS.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Clients must present a certificate from the client CA.
    pub client_certs: bool,
}

impl ListenSettings {
    /// How the listener is guarded, for the startup line: `(profiles need the token and a
    /// client certificate; /metrics open)`.
    pub fn describe(&self) -> String {
        let mut needs = Vec::new();
        if self.access.token.is_some() {
            needs.push("the token");
        }
        if self.client_certs {
            needs.push("a client certificate");
        }
        if needs.is_empty() {
            return "(no credential needed)".to_string();
        }
        let metrics = match (self.access.metrics_need_token, self.client_certs) {
            (true, _) => "the token",
            (false, true) => "a client certificate",
            (false, false) => "nothing",
        };
        format!(
            "(profiles need {}; /metrics {metrics})",
            needs.join(" and ")
        )
    }
}

/// Where and how often to push, validated.
#[derive(Debug, Clone)]
pub struct PushSettings {
    pub target: crate::push::Target,
    pub interval: Duration,
    pub queue: usize,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub policy: MatchPolicy,
    pub exclude_roles: Vec<Role>,
    pub subprocesses: bool,
    pub matches: Vec<String>,
    pub pids: Vec<i32>,
    pub rate: RatePolicy,
    pub mode: Mode,
    pub scan_interval: Duration,
    pub snapshot_interval: Duration,
    /// Formats written in each snapshot, without duplicates.
    pub snapshot_formats: Vec<Format>,
    pub out: PathBuf,
    pub retention: RetentionPolicy,
    /// The bits of snapshot files and directories.
    pub file_mode: FileMode,
    /// Frames folded by function (`--function`).
    pub by_function: bool,
    /// Stacks rooted at their thread (`--threads`).
    pub threads: bool,
    /// The program to start (`-- COMMAND`), if any: the policy then matches nothing until
    /// the daemon names the program's pid.
    pub command: Vec<String>,
    /// Wall mode without `--idle`: threads waiting for work left out.
    pub leave_out_idle: bool,
    pub restart: RestartPolicy,
    pub metrics_addr: Option<SocketAddr>,
    pub listen: ListenSettings,
    pub health_addr: Option<SocketAddr>,
    pub duration: Option<Duration>,
    pub read_only: bool,
    pub blocking: bool,
    pub switch_log: bool,
    /// How stacks are taken, resolved for the mode (`Auto`: the kernel capture if it starts).
    pub capture: crate::capture::Capture,
    pub push: Option<PushSettings>,
}

/// `--exclude-role` values, checked.
pub fn parse_roles(names: &[String]) -> Result<Vec<Role>, String> {
    names
        .iter()
        .map(|n| {
            n.parse::<Role>()
                .map_err(|e| format!("--exclude-role: {e}"))
        })
        .collect()
}

fn seconds(name: &str, v: Option<Seconds>, default: f64) -> Result<Duration, String> {
    v.unwrap_or(Seconds(default)).positive(name)
}

impl RunOptions {
    /// Reads a config file.
    pub fn from_file(path: &std::path::Path) -> Result<RunOptions, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let line = 1 + text.as_bytes()[..span.start.min(text.len())]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count();
                    format!("invalid config {} line {line}: {msg}", path.display())
                }
                None => format!("invalid config {}: {msg}", path.display()),
            }
        })
    }

    /// These options over `file`'s: a value given here wins, lists given here replace the
    /// file's.
    pub fn over(self, file: RunOptions) -> RunOptions {
        fn list<T>(a: Vec<T>, b: Vec<T>) -> Vec<T> {
            if a.is_empty() {
                b
            } else {
                a
            }
        }
        RunOptions {
            matches: list(self.matches, file.matches),
            exclude: list(self.exclude, file.exclude),
            match_label: list(self.match_label, file.match_label),
            exclude_label: list(self.exclude_label, file.exclude_label),
            exclude_role: list(self.exclude_role, file.exclude_role),
            subprocesses: self.subprocesses || file.subprocesses,
            pids: list(self.pids, file.pids),
            rate: self.rate.or(file.rate),
            mode: self.mode.or(file.mode),
            max_cpu: self.max_cpu.or(file.max_cpu),
            scan_interval: self.scan_interval.or(file.scan_interval),
            snapshot_interval: self.snapshot_interval.or(file.snapshot_interval),
            snapshot_format: list(self.snapshot_format, file.snapshot_format),
            out: self.out.or(file.out),
            keep: self.keep.or(file.keep),
            max_bytes: self.max_bytes.or(file.max_bytes),
            file_mode: self.file_mode.or(file.file_mode),
            function: self.function || file.function,
            threads: self.threads || file.threads,
            // The command line's choice, if it makes one, else the file's.
            idle: if self.idle || self.no_idle {
                self.idle
            } else {
                file.idle
            },
            no_idle: if self.idle || self.no_idle {
                self.no_idle
            } else {
                file.no_idle
            },
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            health_addr: self.health_addr.or(file.health_addr),
            listen_token_file: self.listen_token_file,
            listen_metrics_token: self.listen_metrics_token,
            listen_tls_cert: self.listen_tls_cert,
            listen_tls_key: self.listen_tls_key,
            listen_client_ca: self.listen_client_ca,
            insecure_listen: self.insecure_listen,
            listen: file.listen,
            duration: self.duration.or(file.duration),
            read_only: self.read_only || file.read_only,
            blocking: self.blocking || file.blocking,
            switch_log: self.switch_log || file.switch_log,
            capture: self.capture.or(file.capture),
            pyroscope_url: self.pyroscope_url,
            push_interval: self.push_interval,
            pyroscope: file.pyroscope,
            config: self.config,
            command: self.command,
        }
    }

    /// Merges the config file (if any) and validates everything.
    pub fn resolve(self, self_pid: i32) -> Result<RunSettings, String> {
        let o = match self.config.clone() {
            Some(path) => self.over(RunOptions::from_file(&path)?),
            None => self,
        };
        if let Some(bad) = o.pids.iter().find(|p| **p <= 0) {
            return Err(format!("--pid must be a positive process id (got {bad})"));
        }
        if !o.command.is_empty() {
            if !(o.pids.is_empty() && o.matches.is_empty() && o.match_label.is_empty()) {
                return Err("give either a program after -- or processes to profile \
                            (pid, match, match-label), not both"
                    .into());
            }
            if o.duration.is_some() {
                return Err(
                    "a program after -- is profiled until it exits: --duration goes with \
                     processes"
                        .into(),
                );
            }
        }
        let policy = MatchPolicy::new(&o.matches, &o.exclude, &o.pids, Some(self_pid))
            .map_err(|e| e.to_string())?
            .with_label_rules(&o.match_label, &o.exclude_label)
            .map_err(|e| e.to_string())?;
        let rate = RatePolicy::new(
            o.rate.unwrap_or(pyfleet_policies::rate::DEFAULT_RATE_HZ),
            o.max_cpu
                .unwrap_or(pyfleet_policies::rate::DEFAULT_MAX_CPU_PERCENT),
        )
        .map_err(|e| e.to_string())?;
        let mode: Mode = match &o.mode {
            Some(m) => m
                .parse()
                .map_err(|e: pyfleet_policies::ModeError| e.to_string())?,
            None => Mode::default(),
        };
        let capture: crate::capture::Capture = o
            .capture
            .as_deref()
            .unwrap_or("auto")
            .parse()
            .map_err(|e| format!("capture {e}"))?;
        let capture = capture.resolve(o.blocking, o.switch_log, "capture")?;
        let max_bytes = match &o.max_bytes {
            Some(s) => Some(parse_size(s).map_err(|e| format!("--max-bytes: {e}"))?),
            None => None,
        };
        let retention =
            RetentionPolicy::new(o.keep.unwrap_or(60), max_bytes).map_err(|e| e.to_string())?;
        let mut snapshot_formats: Vec<Format> = Vec::new();
        for name in &o.snapshot_format {
            let f: Format = name
                .parse()
                .map_err(|e| format!("--snapshot-format: {e}"))?;
            if !snapshot_formats.contains(&f) {
                snapshot_formats.push(f);
            }
        }
        if snapshot_formats.is_empty() {
            snapshot_formats = DEFAULT_FORMATS.to_vec();
        }
        let metrics_addr = address(
            "metrics-addr",
            o.metrics_addr.as_deref(),
            DEFAULT_METRICS_ADDR,
        )?;
        let health_addr = address("health-addr", o.health_addr.as_deref(), "off")?;
        let (listen, insecure) = listen_settings(&o)?;
        if let Some(addr) = metrics_addr {
            crate::listener::access::check_exposure(
                addr,
                listen.access.token.is_some(),
                listen.client_certs,
                insecure,
            )?;
        }
        let exclude_roles = parse_roles(&o.exclude_role)?;
        let push = push_settings(&o)?;
        Ok(RunSettings {
            policy,
            exclude_roles,
            subprocesses: o.subprocesses || !o.command.is_empty(),
            matches: o.matches,
            pids: o.pids,
            rate,
            mode,
            scan_interval: seconds("scan-interval", o.scan_interval, 1.0)?,
            snapshot_interval: seconds("snapshot-interval", o.snapshot_interval, 60.0)?,
            snapshot_formats,
            out: o.out.unwrap_or_else(|| PathBuf::from(DEFAULT_OUT)),
            retention,
            file_mode: match &o.file_mode {
                Some(m) => m.parse().map_err(|e| format!("--file-mode: {e}"))?,
                None => FileMode::default(),
            },
            by_function: o.function,
            threads: o.threads,
            command: o.command,
            leave_out_idle: pyfleet_policies::leave_out_idle(mode, o.idle, o.no_idle)?,
            restart: RestartPolicy::default(),
            metrics_addr,
            listen,
            health_addr,
            duration: match o.duration {
                Some(d) => Some(seconds("duration", Some(d), 0.0)?),
                None => None,
            },
            read_only: o.read_only,
            blocking: o.blocking,
            switch_log: o.switch_log,
            capture,
            push,
        })
    }
}

/// A listener's address option: IP:PORT or `off`.
fn address(name: &str, given: Option<&str>, default: &str) -> Result<Option<SocketAddr>, String> {
    match given.unwrap_or(default) {
        "off" => Ok(None),
        a => a.parse::<SocketAddr>().map(Some).map_err(|_| {
            format!(
                "--{name} must be IP:PORT (e.g. {DEFAULT_METRICS_ADDR}) or off (got '{}')",
                a.escape_debug()
            )
        }),
    }
}

/// The `--listen-*` options and the `[listen]` table, checked (the command line wins), and
/// whether serving profiles without a credential was allowed.
fn listen_settings(o: &RunOptions) -> Result<(ListenSettings, bool), String> {
    let table = o.listen.clone().unwrap_or_default();
    let token = match o.listen_token_file.as_ref().or(table.token_file.as_ref()) {
        Some(f) => Some(crate::listener::access::Token::from_file(
            f,
            "--listen-token-file",
        )?),
        None => None,
    };
    let metrics_need_token = o.listen_metrics_token || table.metrics_token;
    if metrics_need_token && token.is_none() {
        return Err("--listen-metrics-token goes with --listen-token-file FILE".to_string());
    }
    let cert = o.listen_tls_cert.clone().or(table.tls_cert);
    let key = o.listen_tls_key.clone().or(table.tls_key);
    let client_ca = o.listen_client_ca.clone().or(table.client_ca);
    let files = match (cert, key) {
        (Some(cert), Some(key)) => Some(crate::tls::ServerFiles {
            cert,
            key,
            client_ca,
        }),
        (None, None) if client_ca.is_none() => None,
        (None, None) => {
            return Err(
                "--listen-client-ca goes with --listen-tls-cert and --listen-tls-key".into(),
            )
        }
        _ => return Err("--listen-tls-cert and --listen-tls-key go together".to_string()),
    };
    let tls = files.as_ref().map(crate::tls::server_config).transpose()?;
    let settings = ListenSettings {
        access: crate::listener::access::Access {
            token,
            metrics_need_token,
        },
        tls,
        client_certs: files.is_some_and(|f| f.client_ca.is_some()),
    };
    Ok((settings, o.insecure_listen || table.insecure))
}

/// `--pyroscope`, `--push-interval` and the `[pyroscope]` table, checked (the command line
/// wins).
fn push_settings(o: &RunOptions) -> Result<Option<PushSettings>, String> {
    let table = o.pyroscope.clone().unwrap_or_default();
    let Some(url) = o.pyroscope_url.clone().or(table.url.clone()) else {
        if o.push_interval.is_some() {
            return Err("--push-interval goes with --pyroscope URL".to_string());
        }
        return Ok(None);
    };
    let read = |what: &str, path: &PathBuf| {
        std::fs::read_to_string(path)
            .map_err(|e| format!("pyroscope {what} {}: {e}", path.display()))
    };
    let mut target = crate::push::Target::parse(&url)?;
    match (&table.basic_auth_file, &table.token_file) {
        (Some(_), Some(_)) => {
            return Err("pyroscope: basic-auth-file and token-file exclude each other".into())
        }
        (Some(f), None) => {
            let credentials = read("basic-auth-file", f)?;
            if !credentials.trim().contains(':') {
                return Err(format!(
                    "pyroscope basic-auth-file {}: not user:password",
                    f.display()
                ));
            }
            target = target.with_basic_auth(&credentials);
        }
        (None, Some(f)) => target = target.with_token(&read("token-file", f)?),
        (None, None) => {}
    }
    if target.is_https() {
        let ca = table.ca_file.as_deref();
        target = target.with_tls(crate::tls::client_config(ca, "[pyroscope] ca-file")?);
    } else if table.ca_file.is_some() {
        return Err("pyroscope ca-file goes with an https:// url".to_string());
    } else if target.authorization.is_some()
        && !target.is_loopback()
        && !table.credentials_over_http
    {
        return Err(format!(
            "pyroscope url {url}: the credentials would cross the network in clear: use \
             https://, or set credentials-over-http = true in [pyroscope]"
        ));
    }
    if let Some(t) = &table.tenant {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("pyroscope tenant '{t}': printable characters only"));
        }
    }
    let interval = seconds(
        "push-interval",
        o.push_interval.or(table.push_interval),
        15.0,
    )?;
    Ok(Some(PushSettings {
        target: target.with_tenant(table.tenant.clone()),
        interval,
        queue: table.queue.unwrap_or(crate::push::DEFAULT_QUEUE).max(1),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let s = RunOptions::default().resolve(1).unwrap();
        assert!(s.policy.matches_everything());
        assert_eq!(s.rate.base_hz(), 100.0);
        assert_eq!(s.rate.max_cpu_percent(), 5.0);
        assert_eq!(s.mode, Mode::Cpu);
        assert_eq!(s.scan_interval, Duration::from_secs(1));
        assert_eq!(s.snapshot_interval, Duration::from_secs(60));
        assert_eq!(s.retention.keep, 60);
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(s.duration, None);
        assert!(!s.read_only);
        assert_eq!(s.snapshot_formats, vec![Format::Folded, Format::Svg]);
        assert_eq!(s.health_addr, None);
        assert!(s.listen.access.token.is_none() && s.listen.tls.is_none());
    }

    #[test]
    fn a_wide_listener_needs_a_credential_or_insecure_listen() {
        let wide = |insecure: bool| RunOptions {
            metrics_addr: Some("0.0.0.0:9464".into()),
            insecure_listen: insecure,
            ..Default::default()
        };
        assert!(wide(false).resolve(1).is_err());
        assert!(wide(true).resolve(1).is_ok());
        let dir = std::env::temp_dir().join(format!("pyfleet-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
        let config = dir.join("pyfleet.toml");
        std::fs::write(
            &config,
            format!(
                "metrics-addr = \"0.0.0.0:9464\"\n[listen]\ntoken-file = \"{}\"\nmetrics-token = true\n",
                token.display()
            ),
        )
        .unwrap();
        let s = RunOptions {
            config: Some(config),
            ..Default::default()
        }
        .resolve(1)
        .unwrap();
        assert!(s.listen.access.token.is_some() && s.listen.access.metrics_need_token);
        assert_eq!(
            s.listen.describe(),
            "(profiles need the token; /metrics the token)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_input_is_one_line() {
        let cases: Vec<(RunOptions, &str)> = vec![
            (
                RunOptions {
                    matches: vec!["(".into()],
                    ..Default::default()
                },
                "invalid regex",
            ),
            (
                RunOptions {
                    rate: Some(0.0),
                    ..Default::default()
                },
                "--rate",
            ),
            (
                RunOptions {
                    metrics_addr: Some("nope".into()),
                    ..Default::default()
                },
                "--metrics-addr",
            ),
            (
                RunOptions {
                    metrics_addr: Some("0.0.0.0:9464".into()),
                    ..Default::default()
                },
                "--insecure-listen",
            ),
            (
                RunOptions {
                    health_addr: Some("9465".into()),
                    ..Default::default()
                },
                "--health-addr",
            ),
            (
                RunOptions {
                    listen_metrics_token: true,
                    ..Default::default()
                },
                "--listen-token-file",
            ),
            (
                RunOptions {
                    listen_token_file: Some("/nonexistent/token".into()),
                    ..Default::default()
                },
                "/nonexistent/token",
            ),
            (
                RunOptions {
                    listen_tls_cert: Some("/nonexistent/cert.pem".into()),
                    ..Default::default()
                },
                "go together",
            ),
            (
                RunOptions {
                    listen_client_ca: Some("/nonexistent/ca.pem".into()),
                    ..Default::default()
                },
                "--listen-tls-cert",
            ),
            (
                RunOptions {
                    listen_tls_cert: Some("/nonexistent/cert.pem".into()),
                    listen_tls_key: Some("/nonexistent/key.pem".into()),
                    ..Default::default()
                },
                "--listen-tls-cert /nonexistent/cert.pem",
            ),
            (
                RunOptions {
                    mode: Some("fast".into()),
                    ..Default::default()
                },
                "mode",
            ),
            (
                RunOptions {
                    keep: Some(0),
                    ..Default::default()
                },
                "--keep",
            ),
            (
                RunOptions {
                    max_bytes: Some("12Q".into()),
                    ..Default::default()
                },
                "--max-bytes",
            ),
            (
                RunOptions {
                    scan_interval: Some(Seconds(-1.0)),
                    ..Default::default()
                },
                "--scan-interval",
            ),
            (
                RunOptions {
                    pids: vec![0],
                    ..Default::default()
                },
                "--pid",
            ),
            (
                RunOptions {
                    snapshot_format: vec!["svg".into(), "png".into()],
                    ..Default::default()
                },
                "--snapshot-format",
            ),
        ];
        for (o, want) in cases {
            let e = o.resolve(1).unwrap_err();
            assert!(e.contains(want), "{e} (wanted {want})");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        assert!(RunOptions {
            metrics_addr: Some("off".into()),
            ..Default::default()
        }
        .resolve(1)
        .unwrap()
        .metrics_addr
        .is_none());
    }

    #[test]
    fn the_example_config_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pyfleet.toml");
        let s = RunOptions {
            config: Some(path),
            ..Default::default()
        }
        .resolve(1)
        .unwrap();
        assert_eq!(
            s.matches,
            vec!["gunicorn".to_string(), "celery".to_string()]
        );
        assert_eq!(s.retention.max_bytes, Some(2 << 30));
    }

    #[test]
    fn config_file_and_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyfleet.toml");
        std::fs::write(
            &path,
            "match = [\"gunicorn\"]\nrate = 50\nmax-cpu = 2.5\nout = \"/var/lib/pyfleet\"\nread-only = true\nsnapshot-format = [\"pprof\", \"svg\", \"pprof\"]\nfile-mode = \"0640\"\n",
        )
        .unwrap();
        let cli = RunOptions {
            rate: Some(20.0),
            config: Some(path.clone()),
            ..Default::default()
        };
        let s = cli.resolve(1).unwrap();
        assert_eq!(s.matches, vec!["gunicorn".to_string()]);
        assert_eq!(s.rate.base_hz(), 20.0, "the command line wins");
        assert_eq!(s.rate.max_cpu_percent(), 2.5);
        assert_eq!(s.out, PathBuf::from("/var/lib/pyfleet"));
        assert!(s.read_only);
        assert_eq!(s.snapshot_formats, vec![Format::Pprof, Format::Svg]);
        assert_eq!(
            (s.file_mode.file(), s.file_mode.directory()),
            (0o640, 0o750)
        );
        let cli = RunOptions {
            snapshot_format: vec!["speedscope".into()],
            config: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(
            cli.resolve(1).unwrap().snapshot_formats,
            vec![Format::Speedscope],
            "a list on the command line replaces the file's"
        );

        std::fs::write(&path, "match = [\"x\"]\nbogus = 1\n").unwrap();
        let e = RunOptions {
            config: Some(path.clone()),
            ..Default::default()
        }
        .resolve(1)
        .unwrap_err();
        assert!(e.contains("line 2") && e.contains("bogus"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = RunOptions {
            config: Some(dir.path().join("missing.toml")),
            ..Default::default()
        }
        .resolve(1)
        .unwrap_err();
        assert!(e.starts_with("cannot read config"), "{e}");
    }

    /// Label rules and the `[pyroscope]` table from a config file; the command line's
    /// `--pyroscope` wins; mistakes are one line.
    #[test]
    fn label_rules_and_pyroscope_from_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyfleet.toml");
        let auth = dir.path().join("auth");
        std::fs::write(&auth, "user:pass\n").unwrap();
        std::fs::write(
            &path,
            format!(
                "match-label = [\"namespace=^prod$\"]\nexclude-label = [\"service=canary\"]\n\
                 [pyroscope]\nurl = \"http://pyro:4040\"\npush-interval = \"30s\"\n\
                 basic-auth-file = \"{}\"\ntenant = \"team-a\"\nqueue = 8\n\
                 credentials-over-http = true\n",
                auth.display()
            ),
        )
        .unwrap();
        let from = |cli: RunOptions| {
            RunOptions {
                config: Some(path.clone()),
                ..cli
            }
            .resolve(1)
        };
        let s = from(RunOptions::default()).unwrap();
        assert!(s.policy.uses_labels());
        let push = s.push.expect("push settings");
        assert_eq!(push.target.authority, "pyro:4040");
        assert_eq!(push.target.tenant.as_deref(), Some("team-a"));
        assert_eq!(
            push.target.authorization.as_deref(),
            Some("Basic dXNlcjpwYXNz")
        );
        assert_eq!((push.interval, push.queue), (Duration::from_secs(30), 8));
        let s = from(RunOptions {
            pyroscope_url: Some("http://other:4040".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.push.unwrap().target.authority, "other:4040");
        // Credentials in clear to another host only when the table says so; over https with
        // the system's CAs or a CA file.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("credentials-over-http = true\n", "")).unwrap();
        let e = from(RunOptions::default()).unwrap_err();
        assert!(e.contains("in clear") && e.lines().count() == 1, "{e}");
        let local = from(RunOptions {
            pyroscope_url: Some("http://127.0.0.1:4040".into()),
            ..Default::default()
        });
        assert!(local.is_ok(), "{:?}", local.err());
        // (A machine without CA certificates is told so, in one line.)
        match from(RunOptions {
            pyroscope_url: Some("https://pyro:4443".into()),
            ..Default::default()
        }) {
            Ok(s) => {
                let tls = s.push.unwrap();
                assert!(tls.target.is_https() && tls.target.tls.is_some());
            }
            Err(e) => assert!(e.contains("no system CA certificate"), "{e}"),
        }
        std::fs::write(
            &path,
            "[pyroscope]\nurl = \"https://pyro\"\nca-file = \"/nonexistent/ca.pem\"\n",
        )
        .unwrap();
        let e = from(RunOptions::default()).unwrap_err();
        assert!(
            e.contains("/nonexistent/ca.pem") && e.lines().count() == 1,
            "{e}"
        );
        for (cli, says) in [
            (
                RunOptions {
                    pyroscope_url: Some("ftp://x".into()),
                    ..Default::default()
                },
                "not http[s]://",
            ),
            (
                RunOptions {
                    push_interval: Some(Seconds(5.0)),
                    ..Default::default()
                },
                "--push-interval goes with --pyroscope",
            ),
            (
                RunOptions {
                    match_label: vec!["colour=red".into()],
                    ..Default::default()
                },
                "unknown label 'colour'",
            ),
        ] {
            let e = cli.resolve(1).unwrap_err();
            assert!(e.contains(says) && e.lines().count() == 1, "{e}");
        }
    }
}
