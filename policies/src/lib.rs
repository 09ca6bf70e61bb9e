//! pyfleet-policies: the pure decisions of pyfleet. No I/O, no async, no clocks read here:
//! callers pass in what they observed and get a decision back, so every rule is unit-tested
//! exhaustively.

pub mod matching;

pub use matching::{MatchError, MatchPolicy, ProcessFacts};
