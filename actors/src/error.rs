//! Why the fleet could not start, or how its shutdown went wrong.
//!
//! Owns [`FleetError`], the one error type of the crate's public API.

/// Why the fleet could not start, or how shutdown went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error("invalid fleet configuration: {0}")]
    Config(String),
    #[error("cannot start the {actor} actor: {reason}")]
    Spawn { actor: &'static str, reason: String },
    #[error("the {0} actor is not running")]
    ActorGone(&'static str),
    #[error("final snapshot not written: {0}")]
    Snapshot(String),
}
