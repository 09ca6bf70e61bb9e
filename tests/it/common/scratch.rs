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
