//! The machine, shared by the tests of one binary: `alone()` and `shared()`. Each hold, when it
//! ends, appends the test's name, how it held the machine and for how long to
//! `$CARGO_TARGET_TMPDIR/it-durations.tsv` (scripts/test.sh prints the slowest: CI's time).

use std::io::Write;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

/// Every test holds the machine while it runs: many tests share it, or one has it alone.
static MACHINE: RwLock<()> = RwLock::new(());

/// A test's hold on the machine, released when dropped (at the end of the test, also when it
/// panics).
pub struct Machine {
    hold: Hold,
    since: Instant,
}

enum Hold {
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
}

/// The machine to this test alone: it starts once every running test has ended, and no other
/// test starts before it ends. For a test whose assertions depend on the machine's load (shares
/// of samples or of on-CPU time, exactness against a reference recorded at the same time,
/// timings), one that loads the machine itself (busy workers, HTTP load), or one that matches
/// processes host-wide (`--match gunicorn`). A panic in such a test does not stop the others.
pub fn alone() -> Machine {
    let hold = Hold::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner()));
    Machine {
        hold,
        since: Instant::now(),
    }
}

/// The machine shared with the other tests that share it (the cargo test default: as many at
/// once as `--test-threads`); waits while a test has it `alone()`.
pub fn shared() -> Machine {
    let hold = Hold::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner()));
    Machine {
        hold,
        since: Instant::now(),
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let how = match self.hold {
            Hold::Alone(_) => "alone",
            Hold::Shared(_) => "shared",
        };
        let test = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("it-durations.tsv");
        // A line under PIPE_BUF in one append: lines of tests ending at once do not interleave.
        let line = format!("{:.1}\t{how}\t{test}\n", self.since.elapsed().as_secs_f64());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}
