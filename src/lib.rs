//! pyfleet: a sampling profiler for fleets of CPython processes.
//!
//! This crate is the remote unwinder (reading CPython 3.11-3.15 stacks from outside the
//! process) and the CLI that wires it to the actors of `pyfleet-actors`.
pub mod binary;
pub mod capture;
pub mod config;
pub mod cpython;
pub mod discovery;
pub mod gil_blame;
pub mod host;
pub mod idle_stacks;
pub mod listener;
pub mod logging;
pub mod memory;
pub mod output;
pub mod process;
pub mod push;
pub mod sampling_options;
pub mod stack_source;
pub mod stacks;
pub mod task_stacks;
pub mod thread_frames;
pub mod tls;
pub mod top;
