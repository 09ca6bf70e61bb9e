//! `pyfleet top`'s parts that are not the command itself: the counts it shows (`model`), its
//! screen and keys (`view`), the pull of a running daemon's samples (`remote`), and whether
//! its terminal is still there (`terminal`). The command (`commands/top.rs`) feeds the model
//! with snapshots, from a fleet of its own or a daemon, and draws.

pub mod model;
pub mod remote;
pub mod terminal;
pub mod view;
