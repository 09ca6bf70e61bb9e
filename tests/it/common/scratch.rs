//! Unique tokens, temporary and artifact directories, whether the tests run as root.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A token unique to this test run and call (for markers in command lines).
pub fn unique_token(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}{:x}{:x}{n}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("cannot create a temporary directory")
}

/// Where a test may keep files for a human to look at after a failure.
pub fn artifacts_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("pyfleet-tests")
        .join(test);
    fs::create_dir_all(&dir).expect("cannot create the artifacts directory");
    dir
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Writes `token` (and a newline) to `path`, readable by its owner only, as a token file must
/// be.
pub fn write_token_file(path: &std::path::Path, token: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{token}\n")).expect("write the token file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .expect("chmod the token file");
}

/// The state directory every pyfleet the tests start is given (`STATE_DIRECTORY`, see
/// `pyfleet::listener::own_token`): private, holding the token a loopback listener given no
/// credential asks for, written here once before any daemon starts.
pub fn harness_state_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyfleet-state");
        fs::create_dir_all(&dir).expect("cannot create the tests' state directory");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod state");
        let token = dir.join("listen-token");
        if fs::read_to_string(&token).map_or(true, |t| t.trim().len() < 32) {
            write_token_file(
                &token,
                &format!("{}{}", unique_token("state"), "0123456789abcdef"),
            );
        }
        dir
    })
}

/// The token of [`harness_state_dir`]: what a loopback daemon of the tests asks for when
/// given no credential.
pub fn harness_token() -> String {
    fs::read_to_string(harness_state_dir().join("listen-token"))
        .expect("the tests' listen token")
        .trim()
        .to_string()
}
