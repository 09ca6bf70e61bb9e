//! gunicorn from the venvs `scripts/setup-venvs.sh` makes.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// gunicorn from the venvs `scripts/setup-venvs.sh` makes.

/// The python of the gunicorn venv `name` (`gunicorn-3.15`); None (the test returns) only when
/// it is missing and PYFLEET_ALLOW_MISSING=1 (see `skip_or_fail`).
#[track_caller]
pub fn gunicorn_venv(name: &str) -> Option<PathBuf> {
    provided(
        &format!("venv {name}"),
        venvs_dir().join(name).join("bin/python"),
        SETUP_VENVS,
    )
}

/// Children of `pid` (gunicorn's workers).
pub fn children(pid: i32) -> std::collections::BTreeSet<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// A gunicorn master (serving `tests/targets/wsgi_app.py`) whose workers die with it (SIGKILL to all on drop), so that no worker
/// outlives the test and loads the machine for the next one.
pub struct Gunicorn(pub Proc);

impl Gunicorn {
    pub fn pid(&self) -> i32 {
        self.0.pid()
    }
}

impl Drop for Gunicorn {
    fn drop(&mut self) {
        let workers = children(self.0.pid());
        self.0.kill();
        for w in workers {
            try_signal(w, libc::SIGKILL);
        }
    }
}

/// gunicorn from a venv's `python` (`gunicorn_venv`), serving on `port` once its workers are up.
pub fn gunicorn(label: &str, python: &Path, port: u16, workers: u32) -> Gunicorn {
    let app_dir = targets_dir();
    let args: Vec<String> = vec![
        "-m".into(),
        "gunicorn".into(),
        "--workers".into(),
        workers.to_string(),
        "--bind".into(),
        format!("127.0.0.1:{port}"),
        "--chdir".into(),
        app_dir.display().to_string(),
        "wsgi_app:app".into(),
    ];
    let mut p = Proc::spawn(label, python, &args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while children(p.pid()).len() < workers as usize || http_get(port, "/").is_none() {
        assert!(
            Instant::now() < deadline,
            "{label} did not start: {}",
            p.stderr()
        );
        assert!(p.exited().is_none(), "{label} exited: {}", p.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    Gunicorn(p)
}
