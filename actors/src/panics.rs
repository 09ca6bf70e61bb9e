//! Catching panics from code this crate does not own (sources, discovery, writers).
//!
//! Owns the one helper that turns a panic into its message, so a broken implementation of a
//! trait ends as an error the actors handle (a sampler failure, a skipped scan, a failed
//! write) instead of taking a thread or the process down. It must not log or decide anything.

use std::panic::AssertUnwindSafe;

/// Runs `f`; a panic becomes `Err` with the panic's message.
pub(crate) fn guard<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_string())
    })
}
