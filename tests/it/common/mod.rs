//! Shared helpers for the integration tests that run pyfleet against real CPython processes.
//!
//! Every process a test starts is owned by a guard that kills (SIGKILL) and reaps it on drop,
//! also when the test panics.  Every wait polls with a deadline and fails with a message that
//! says what was awaited.
#![allow(dead_code)]

use std::time::Duration;

/// How long a single pyfleet invocation may take before the test fails.
pub const PYFLEET_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a target may take to write its ready/expectation file.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const POLL: Duration = Duration::from_millis(10);

mod machine;
pub use machine::*;
mod provided;
pub use provided::*;
mod interpreters;
pub use interpreters::*;
mod scratch;
pub use scratch::*;
mod procfs;
pub use procfs::*;
mod targets;
pub use targets::*;
mod commands;
pub use commands::*;
mod http;
pub use http::*;
mod gunicorn;
pub use gunicorn::*;
mod measure;
pub use measure::*;
mod tls;
pub use tls::*;
