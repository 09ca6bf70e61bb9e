//! What `run` and `record` share: the async runtime of the fleet's actors, stopping the fleet
//! and writing its last output (within a grace the samplers get), and the warnings about
//! privilege and the context-switch log.

use anyhow::{anyhow, Context, Result};
use pyfleet_actors::Fleet;
use std::time::Duration;

/// Opens the kernel's log of context switches (`--switch-log`), or says why it stays off.
pub fn start_switch_log() {
    if !pyfleet::process::switches::start() {
        pyfleet::logging::warning(
            "--switch-log: the kernel's log of context switches cannot be opened (it needs \
             CAP_PERFMON); idle threads are told by /proc instead",
        );
    }
}

/// Longest the fleet's samplers are given to stop once told to end (the daemon's and
/// `record`'s `stop_timeout`); the final snapshot or file is written after.
pub const STOP_GRACE: Duration = Duration::from_millis(1500);

/// Stops the fleet (its samplers within [`STOP_GRACE`], what is stuck left behind) and writes
/// its final snapshot or file, however long that takes: it holds everything sampled. A
/// SIGINT or SIGTERM meanwhile abandons the write.
pub async fn stop_and_write(fleet: Fleet) -> Result<std::path::PathBuf> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    tokio::select! {
        written = fleet.shutdown() => written.map_err(|e| anyhow!("{e}")),
        _ = term.recv() => Err(anyhow!("SIGTERM came while the final output was written: not written")),
        _ = int.recv() => Err(anyhow!("SIGINT came while the final output was written: not written")),
    }
}

/// The async runtime of the fleet's actors (the daemon's and `record`'s): two workers,
/// since sampling itself runs on its own thread.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("pyfleet-async")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Says so when pyfleet runs without root or CAP_SYS_PTRACE: only the user's own processes
/// can then be read, and the others would silently be missing.
pub fn warn_without_ptrace(what: &str) {
    if pyfleet::host::has_ptrace_capability() == Some(false) {
        pyfleet::logging::warning(&format!(
            "without root or CAP_SYS_PTRACE only this user's own processes can be {what}"
        ));
    }
}
