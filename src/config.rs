//! Settings of the fleet daemon (`pyfleet run`): the same options on the command line and in a
//! TOML file (`--config pyfleet.toml`, keys as the long options: `match = ["gunicorn"]`,
//! `max-cpu = 5`, ...), the command line winning. [`RunOptions::resolve`] validates everything
//! up front, so bad input fails with one line before anything starts.
//!
//! Owns parsing and validation only; it starts nothing.

use crate::output::format::Format;
use crate::output::snapshot_dir::DEFAULT_FORMATS;
use crate::sampling_options::{Sampling, SamplingOptions};
use pyfleet_policies::{parse_size, RestartPolicy, RetentionPolicy};
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

/// The daemon's options, as clap parses them and as a config file holds them: the sampling
/// options `record` shares (flattened, the same keys in the file) and the daemon's own.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct RunOptions {
    #[command(flatten)]
    #[serde(skip)]
    pub sampling: SamplingOptions,
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
    /// A host name the listener answers to besides IP addresses and `localhost` (a request
    /// whose Host is another name is refused: a web page that points a name of its own at
    /// this address gets nothing); repeatable. Config file: [listen] names.
    #[arg(long = "listen-name", value_name = "NAME")]
    #[serde(skip)]
    pub listen_names: Vec<String>,
    /// Serve profiles on an address other hosts reach without any credential (refused
    /// otherwise). Config file: [listen] insecure.
    #[arg(long)]
    #[serde(skip)]
    pub insecure_listen: bool,
    /// Take the token over plain HTTP on an address other hosts reach, on a network you trust
    /// (refused otherwise: give the listener TLS). Config file: [listen] token-over-http.
    #[arg(long)]
    #[serde(skip)]
    pub listen_token_over_http: bool,
    /// The config file's [listen] table.
    #[arg(skip)]
    #[serde(rename = "listen")]
    pub listen: Option<ListenFile>,
    /// Stop after this long (seconds, or 30s, 5m, 1h, ...; a final snapshot is written)
    /// [default: run until stopped].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<Seconds>,
    /// Run as this user (a name or a uid) once the kernel capture and the listeners are open,
    /// keeping only the four capabilities pyfleet uses; --out must be this user's (or is
    /// created theirs) [default: stay pyfleet's user, with only those capabilities].
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
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
    /// Take the token off loopback over plain HTTP (a network the operator trusts).
    pub token_over_http: bool,
    /// Host names the listener answers to besides IP addresses and `localhost`.
    pub names: Vec<String>,
}

/// Who may read what the daemon's listener serves, validated.
#[derive(Debug, Clone, Default)]
pub struct ListenSettings {
    pub access: crate::listener::access::Access,
    /// The listener's TLS, when it speaks TLS.
    pub tls: Option<crate::tls::ServerSlot>,
    /// The files its TLS was read from, read again when they change.
    pub tls_files: Option<crate::tls::ServerFiles>,
    /// The file its token was read from (given, or the state directory's), read again when
    /// it changes.
    pub token_file: Option<PathBuf>,
    /// Clients must present a certificate from the client CA.
    pub client_certs: bool,
    /// The token of pyfleet's state directory, for a loopback listener given no credential.
    pub own_token: OwnToken,
}

/// Whether the listener uses the token of pyfleet's state directory (`listener::own_token`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum OwnToken {
    /// A token file or client certificates were given, `--insecure-listen` was, or the
    /// listener is not loopback-only (which needs a credential given, see `check_exposure`).
    #[default]
    NotUsed,
    /// To be loaded (or drawn) by the daemon when it starts: [`ListenSettings::take_own_token`].
    Wanted,
    /// Loaded from `file`; drawn there at this start or not.
    Kept { file: PathBuf, drawn_now: bool },
}

impl ListenSettings {
    /// How the listener is guarded, for the startup line: `(profiles need the token and a
    /// client certificate; /metrics open)`.
    pub fn describe(&self) -> String {
        let mut needs = Vec::new();
        let own;
        if let OwnToken::Kept { file, drawn_now } = &self.own_token {
            own = format!(
                "the token in {}{}",
                file.display(),
                if *drawn_now { ", drawn now" } else { "" }
            );
            needs.push(own.as_str());
        } else if self.access.token.is_some() {
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

impl ListenSettings {
    /// Loads the state directory's token when the listener wants it (drawing one if there is
    /// none): a side effect, so the daemon does it as it starts, not when settings are read.
    pub fn take_own_token(&mut self) -> Result<(), String> {
        if self.own_token == OwnToken::Wanted {
            let (token, file, drawn_now) = crate::listener::own_token::load_or_create()?;
            self.access.token = crate::listener::access::TokenSlot::new(Some(token));
            self.token_file = Some(file.clone());
            self.own_token = OwnToken::Kept { file, drawn_now };
        }
        Ok(())
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
    /// What to sample and how, as `record` takes it too.
    pub sampling: Sampling,
    pub scan_interval: Duration,
    pub snapshot_interval: Duration,
    /// Formats written in each snapshot, without duplicates.
    pub snapshot_formats: Vec<Format>,
    pub out: PathBuf,
    pub retention: RetentionPolicy,
    pub restart: RestartPolicy,
    pub metrics_addr: Option<SocketAddr>,
    pub listen: ListenSettings,
    pub health_addr: Option<SocketAddr>,
    pub duration: Option<Duration>,
    pub push: Option<PushSettings>,
    /// `--user`, as given (looked up by the command, before anything starts).
    pub user: Option<String>,
}

fn seconds(name: &str, v: Option<Seconds>, default: f64) -> Result<Duration, String> {
    v.unwrap_or(Seconds(default)).positive(name)
}

impl RunOptions {
    /// Reads a config file: its keys are the long options of `run` (the sampling options
    /// and the daemon's own), and the `[listen]` and `[pyroscope]` tables.
    pub fn from_file(path: &std::path::Path) -> Result<RunOptions, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let at_line = |span: Option<std::ops::Range<usize>>, msg: &str| match span {
            Some(span) => {
                let line = 1 + text.as_bytes()[..span.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count();
                format!("invalid config {} line {line}: {msg}", path.display())
            }
            None => format!("invalid config {}: {msg}", path.display()),
        };
        let located = |e: toml::de::Error| at_line(e.span(), &e.message().replace('\n', " "));
        // Each part reads the whole file and takes its own keys; a key neither takes is a
        // mistake.
        let keys: std::collections::BTreeMap<toml::Spanned<String>, serde::de::IgnoredAny> =
            toml::from_str(&text).map_err(located)?;
        let (sampling_keys, own_keys) = (
            struct_keys::<SamplingOptions>(),
            struct_keys::<RunOptions>(),
        );
        if let Some(key) = keys.keys().find(|k| {
            !sampling_keys.contains(&k.get_ref().as_str())
                && !own_keys.contains(&k.get_ref().as_str())
        }) {
            return Err(at_line(
                Some(key.span()),
                &format!(
                    "unknown key `{}` (the keys are `pyfleet run`'s long options, and the \
                     [listen] and [pyroscope] tables)",
                    crate::output::for_terminal(key.get_ref())
                ),
            ));
        }
        let mut options: RunOptions = toml::from_str(&text).map_err(located)?;
        options.sampling = toml::from_str(&text).map_err(located)?;
        Ok(options)
    }

    /// These options over `file`'s: a value given here wins, lists given here replace the
    /// file's.
    pub fn over(self, file: RunOptions) -> RunOptions {
        let snapshot_format = match self.snapshot_format.is_empty() {
            true => file.snapshot_format,
            false => self.snapshot_format,
        };
        RunOptions {
            sampling: self.sampling.over(file.sampling),
            max_cpu: self.max_cpu.or(file.max_cpu),
            scan_interval: self.scan_interval.or(file.scan_interval),
            snapshot_interval: self.snapshot_interval.or(file.snapshot_interval),
            snapshot_format,
            out: self.out.or(file.out),
            keep: self.keep.or(file.keep),
            max_bytes: self.max_bytes.or(file.max_bytes),
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            health_addr: self.health_addr.or(file.health_addr),
            listen_token_file: self.listen_token_file,
            listen_metrics_token: self.listen_metrics_token,
            listen_tls_cert: self.listen_tls_cert,
            listen_tls_key: self.listen_tls_key,
            listen_client_ca: self.listen_client_ca,
            insecure_listen: self.insecure_listen,
            listen_token_over_http: self.listen_token_over_http,
            listen_names: self.listen_names,
            listen: file.listen,
            duration: self.duration.or(file.duration),
            user: self.user.or(file.user),
            pyroscope_url: self.pyroscope_url,
            push_interval: self.push_interval,
            pyroscope: file.pyroscope,
            config: self.config,
        }
    }

    /// Merges the config file (if any) and validates everything.
    pub fn resolve(self, self_pid: i32) -> Result<RunSettings, String> {
        let o = match self.config.clone() {
            Some(path) => self.over(RunOptions::from_file(&path)?),
            None => self,
        };
        if !o.sampling.command.is_empty() && o.duration.is_some() {
            return Err(
                "a program after -- is profiled until it exits: --duration goes with processes"
                    .into(),
            );
        }
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
        let (listen, insecure) = listen_settings(&o, metrics_addr)?;
        if let Some(addr) = metrics_addr {
            crate::listener::access::check_exposure(
                addr,
                crate::listener::access::Guards {
                    token: listen.access.token.is_some(),
                    tls: listen.tls.is_some(),
                    client_certs: listen.client_certs,
                    insecure,
                    token_over_http: o.listen_token_over_http
                        || o.listen.as_ref().is_some_and(|t| t.token_over_http),
                },
            )?;
        }
        let push = push_settings(&o)?;
        let sampling = o.sampling.resolve(
            self_pid,
            o.max_cpu
                .unwrap_or(pyfleet_policies::rate::DEFAULT_MAX_CPU_PERCENT),
        )?;
        Ok(RunSettings {
            sampling,
            scan_interval: seconds("scan-interval", o.scan_interval, 1.0)?,
            snapshot_interval: seconds("snapshot-interval", o.snapshot_interval, 60.0)?,
            snapshot_formats,
            out: o.out.unwrap_or_else(|| PathBuf::from(DEFAULT_OUT)),
            retention,
            restart: RestartPolicy::default(),
            metrics_addr,
            listen,
            health_addr,
            duration: match o.duration {
                Some(d) => Some(seconds("duration", Some(d), 0.0)?),
                None => None,
            },
            push,
            user: o.user,
        })
    }
}

/// The keys a derived `Deserialize` struct takes: serde's own list (after renames, without
/// skipped fields), which its derive hands to `deserialize_struct`.
fn struct_keys<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    struct Keys<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Keys<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Error::custom("keys taken"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut keys: &'static [&'static str] = &[];
    let _ = T::deserialize(Keys(&mut keys));
    keys
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
fn listen_settings(
    o: &RunOptions,
    addr: Option<SocketAddr>,
) -> Result<(ListenSettings, bool), String> {
    let table = o.listen.clone().unwrap_or_default();
    let insecure = o.insecure_listen || table.insecure;
    let token_file = o.listen_token_file.clone().or(table.token_file.clone());
    let token = match o.listen_token_file.as_ref().or(table.token_file.as_ref()) {
        Some(f) => Some(crate::listener::access::Token::from_file(
            f,
            "--listen-token-file",
        )?),
        None => None,
    };
    let token_given = token.is_some();
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
    let mut names = o.listen_names.clone();
    names.extend(table.names);
    for name in &names {
        if !crate::listener::access::is_host_name(name) {
            return Err(format!(
                "--listen-name {:?} is not a host name (letters, digits, '-' and '.')",
                name
            ));
        }
    }
    let settings = ListenSettings {
        access: crate::listener::access::Access {
            token: crate::listener::access::TokenSlot::new(token),
            metrics_need_token,
            tls: tls.is_some(),
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            ..Default::default()
        },
        client_certs: files.as_ref().is_some_and(|f| f.client_ca.is_some()),
        own_token: match settings_need_own_token(
            token_given,
            files.as_ref().is_some_and(|f| f.client_ca.is_some()),
            insecure,
            addr,
        ) {
            true => OwnToken::Wanted,
            false => OwnToken::NotUsed,
        },
        tls: tls.map(crate::tls::ServerSlot::new),
        tls_files: files,
        token_file,
    };
    Ok((settings, insecure))
}

/// Whether a listener at `addr` uses the state directory's token: one on loopback given no
/// credential, unless `--insecure-listen`.
fn settings_need_own_token(
    token_given: bool,
    client_certs: bool,
    insecure: bool,
    addr: Option<SocketAddr>,
) -> bool {
    !token_given && !client_certs && !insecure && addr.is_some_and(|a| a.ip().is_loopback())
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
        assert!(s.sampling.policy.matches_everything());
        assert_eq!(s.sampling.rate.base_hz(), 100.0);
        assert_eq!(s.sampling.rate.max_cpu_percent(), 5.0);
        assert_eq!(s.sampling.mode, pyfleet_policies::Mode::Cpu);
        assert_eq!(s.scan_interval, Duration::from_secs(1));
        assert_eq!(s.snapshot_interval, Duration::from_secs(60));
        assert_eq!(s.retention.keep, 60);
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(s.duration, None);
        assert!(!s.sampling.read_only);
        assert_eq!(s.snapshot_formats, vec![Format::Folded, Format::Svg]);
        assert_eq!(s.health_addr, None);
        assert!(!s.listen.access.token.is_some() && s.listen.tls.is_none());
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
        std::fs::write(&token, "3f1c9a7e5b2d4c6a8e0f1b3d5a7c9e1f\n").unwrap();
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let config = dir.join("pyfleet.toml");
        std::fs::write(
            &config,
            format!(
                "metrics-addr = \"0.0.0.0:9464\"\n[listen]\ntoken-file = \"{}\"\nmetrics-token = true\ntoken-over-http = true\n",
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
                    sampling: SamplingOptions {
                        matches: vec!["(".into()],
                        ..Default::default()
                    },
                    ..Default::default()
                },
                "invalid regex",
            ),
            (
                RunOptions {
                    sampling: SamplingOptions {
                        rate: Some(0.0),
                        ..Default::default()
                    },
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
                    sampling: SamplingOptions {
                        mode: Some("fast".into()),
                        ..Default::default()
                    },
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
                    sampling: SamplingOptions {
                        pids: vec![0],
                        ..Default::default()
                    },
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
            s.sampling.matches,
            vec!["gunicorn".to_string(), "celery".to_string()]
        );
        assert_eq!(s.retention.max_bytes, Some(2 << 30));
    }

    /// The config file takes each of `run`'s long options under its own name (the sampling
    /// options `record` shares too), but those with a table of their own and `--config`.
    #[test]
    fn every_long_option_is_a_config_key() {
        use clap::Args;
        let command_line_only = [
            "config",
            "listen-token-file",
            "listen-metrics-token",
            "listen-tls-cert",
            "listen-tls-key",
            "listen-client-ca",
            "insecure-listen",
            "listen-token-over-http",
            "listen-name",
            "pyroscope",
            "push-interval",
        ];
        let run = RunOptions::augment_args(clap::Command::new("run"));
        let keys: Vec<&str> = struct_keys::<SamplingOptions>()
            .iter()
            .chain(struct_keys::<RunOptions>())
            .copied()
            .collect();
        // `pyroscope` is both: the push URL's option, and the file's table.
        let tables = ["listen", "pyroscope"];
        let mut longs = 0;
        for long in run.get_arguments().filter_map(|a| a.get_long()) {
            longs += 1;
            let is_key = keys.contains(&long) && !tables.contains(&long);
            assert!(
                is_key != command_line_only.contains(&long),
                "--{long}: a config key unless it is command-line only, never both"
            );
        }
        assert!(longs > 30, "{longs} long options");
        for table in tables {
            assert!(keys.contains(&table), "[{table}]");
        }
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
            sampling: SamplingOptions {
                rate: Some(20.0),
                ..Default::default()
            },
            config: Some(path.clone()),
            ..Default::default()
        };
        let s = cli.resolve(1).unwrap();
        assert_eq!(s.sampling.matches, vec!["gunicorn".to_string()]);
        assert_eq!(s.sampling.rate.base_hz(), 20.0, "the command line wins");
        assert_eq!(s.sampling.rate.max_cpu_percent(), 2.5);
        assert_eq!(s.out, PathBuf::from("/var/lib/pyfleet"));
        assert!(s.sampling.read_only);
        assert_eq!(s.snapshot_formats, vec![Format::Pprof, Format::Svg]);
        assert_eq!(
            (
                s.sampling.file_mode.file(),
                s.sampling.file_mode.directory()
            ),
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
        assert!(
            e.contains("line 2") && e.contains("unknown key `bogus`"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = RunOptions {
            config: Some(dir.path().join("missing.toml")),
            ..Default::default()
        }
        .resolve(1)
        .unwrap_err();
        assert!(e.starts_with("cannot read config"), "{e}");
    }

    /// `async` and `async-mode` from a config file, validated as on the command line.
    #[test]
    fn asyncio_tasks_from_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pyfleet.toml");
        let resolve = |text: &str| {
            std::fs::write(&path, text).unwrap();
            RunOptions {
                config: Some(path.clone()),
                ..Default::default()
            }
            .resolve(1)
        };
        let s = resolve("mode = \"wall\"\nasync = true\nasync-mode = \"all\"\n").unwrap();
        assert_eq!(
            s.sampling.tasks,
            Some(crate::cpython::asyncio::TaskScope::All)
        );
        let s = resolve("async = true\n").unwrap();
        assert_eq!(
            s.sampling.tasks,
            Some(crate::cpython::asyncio::TaskScope::Running)
        );
        // All mode is wall mode's, unless another is asked.
        let s = resolve("async = true\nasync-mode = \"all\"\n").unwrap();
        assert_eq!(s.sampling.mode, pyfleet_policies::Mode::Wall);
        let e = resolve("mode = \"cpu\"\nasync = true\nasync-mode = \"all\"\n").unwrap_err();
        assert!(e.contains("goes with --mode wall"), "{e}");
        // Tasks grouped by task, or by thread, from the file; an unknown key is one line.
        let s = resolve("async = true\ngroup-by = [\"task\", \"thread\"]\n").unwrap();
        assert_eq!(
            s.sampling.task_frames,
            crate::output::views::TaskFrames::Kept
        );
        assert!(s.sampling.threads);
        let e = resolve("async = true\ngroup-by = [\"endpoint\"]\n").unwrap_err();
        assert!(e.contains("--group-by") && !e.contains('\n'), "{e}");
        let e = resolve("group-by = [\"task\"]\n").unwrap_err();
        assert!(e.contains("goes with --async"), "{e}");
        let e = resolve("async-mode = \"all\"\n").unwrap_err();
        assert!(e.contains("goes with --async"), "{e}");
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
        assert!(s.sampling.policy.uses_labels());
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
                    sampling: SamplingOptions {
                        match_label: vec!["colour=red".into()],
                        ..Default::default()
                    },
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
