//! The machine, shared by the tests of one binary: `alone()` and `shared()`.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Every test holds the machine while it runs: many tests share it, or one has it alone.
static MACHINE: RwLock<()> = RwLock::new(());

/// A test's hold on the machine, released when dropped (at the end of the test, also when it
/// panics).
pub enum Machine {
    Alone(RwLockWriteGuard<'static, ()>),
    Shared(RwLockReadGuard<'static, ()>),
}

/// The machine to this test alone: it starts once every running test has ended, and no other
/// test starts before it ends. For a test whose assertions depend on the machine's load (shares
/// of samples or of on-CPU time, exactness against a reference recorded at the same time,
/// timings), one that loads the machine itself (busy workers, HTTP load), or one that matches
/// processes host-wide (`--match gunicorn`). A panic in such a test does not stop the others.
pub fn alone() -> Machine {
    Machine::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner()))
}

/// The machine shared with the other tests that share it (the cargo test default: as many at
/// once as `--test-threads`); waits while a test has it `alone()`.
pub fn shared() -> Machine {
    Machine::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner()))
}
