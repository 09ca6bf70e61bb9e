//! What pyfleet tells its operator on stderr while it runs: tracing's events (the actors', the
//! listener's) and the commands' own notes and warnings, in the one format chosen at start
//! (`--log-format`):
//! - text: tracing's lines, coloured only when stderr is a terminal and `NO_COLOR` is unset
//!   (a journal or a file gets no escape codes); notes as `pyfleet: ...`, warnings as
//!   `pyfleet: warning: ...`;
//! - json: one object per line, tracing-subscriber's shape (`timestamp`, `level`,
//!   `fields.message`, `target`), notes at level INFO and warnings at WARN, both with target
//!   [`NOTICE_TARGET`].
//!
//! Contract: every line a running command writes on stderr goes through here ([`note`],
//! [`warning`], or tracing), so that a JSON log holds no line of another shape. Errors that
//! end a command (`main`) and what a command prints as its result do not.

use std::io::IsTerminal;
use std::sync::OnceLock;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// How the log is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people (colour only on a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The target of notes and warnings in the JSON log (not a module path: tracing's own events
/// at INFO stay out).
pub const NOTICE_TARGET: &str = "pyfleet_notice";

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Installs the log in `format`: tracing's events at WARN and above, and (JSON) the notes.
/// Called once, first thing; a second call changes nothing.
pub fn init(format: LogFormat) {
    if FORMAT.set(format).is_err() {
        return;
    }
    let filter = Targets::new()
        .with_default(LevelFilter::WARN)
        .with_target(NOTICE_TARGET, LevelFilter::INFO);
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer.with_ansi(wants_colour()).boxed(),
        LogFormat::Json => layer.json().with_ansi(false).boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}

/// Colour only for a person at a terminal who has not asked for none (no-color.org).
fn wants_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

/// Tells the operator what pyfleet does (one line, no trailing newline in `message`).
pub fn note(message: &str) {
    match format() {
        LogFormat::Text => eprintln!("pyfleet: {message}"),
        LogFormat::Json => tracing::info!(target: NOTICE_TARGET, "{message}"),
    }
}

/// Warns the operator of something pyfleet cannot do as asked, and goes on.
pub fn warning(message: &str) {
    match format() {
        LogFormat::Text => eprintln!("pyfleet: warning: {message}"),
        LogFormat::Json => tracing::warn!(target: NOTICE_TARGET, "{message}"),
    }
}
