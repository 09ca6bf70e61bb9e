//! The token a loopback listener asks for when the operator gave none: every local user
//! reaches 127.0.0.1, so stacks are never served there without a credential unless the
//! operator says `--insecure-listen`.
//!
//! Contract. The token lives in [`FILE_NAME`] in pyfleet's state directory ([`state_dir`]):
//! systemd's `$STATE_DIRECTORY` when set, else `/var/lib/pyfleet` for root, else
//! `$XDG_STATE_HOME/pyfleet` (`~/.local/state/pyfleet`). The directory must be pyfleet's
//! user's and writable by nobody else, and is made so (0700) when missing. A token there is
//! used as any token file is ([`Token::from_file`]: its owner's alone, long and random); when
//! there is none, one is drawn (32 random bytes, 64 hex characters), written 0600 under a
//! temporary name and published only if no other daemon published one first, so daemons
//! started together share one token. The token is never printed: the startup line names the
//! file, and whoever may read it (the user, root) has the credential. `top --connect` to a
//! loopback address reads the same file when given no `--token-file`.

use super::access::Token;
use crate::output::beneath::Beneath;
use crate::output::FileMode;
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The token's file in the state directory.
pub const FILE_NAME: &str = "listen-token";

/// Random bytes in a drawn token (written as twice as many hex characters).
const TOKEN_BYTES: usize = 32;

/// pyfleet's state directory (see the module documentation); `None` when no variable names
/// one (no HOME for a user other than root).
pub fn state_dir() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dirs) = std::env::var("STATE_DIRECTORY")
        .ok()
        .filter(|v| !v.is_empty())
    {
        // systemd lists one directory per StateDirectory= entry, colon-separated.
        return dirs.split(':').next().map(PathBuf::from);
    }
    if nix::unistd::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/pyfleet"));
    }
    from("XDG_STATE_HOME")
        .or_else(|| from("HOME").map(|home| home.join(".local/state")))
        .map(|dir| dir.join("pyfleet"))
}

/// The state directory's token file, when pyfleet's user has one (for `top --connect`).
pub fn existing_file() -> Option<PathBuf> {
    let path = state_dir()?.join(FILE_NAME);
    path.is_file().then_some(path)
}

/// The token of the state directory, drawn now if there was none; with its file and whether
/// it was drawn now. The error is one line that says what to do instead.
pub fn load_or_create() -> Result<(Token, PathBuf, bool), String> {
    let Some(dir_path) = state_dir() else {
        return Err(refusal(
            Path::new("$XDG_STATE_HOME/pyfleet"),
            "no state directory (neither HOME nor XDG_STATE_HOME is set)",
        ));
    };
    let fail = |e: &dyn std::fmt::Display| refusal(&dir_path, &e.to_string());
    if let Some(parent) = dir_path.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            std::fs::create_dir_all(parent).map_err(|e| fail(&e))?;
        }
    }
    let dir = Beneath::open_or_create(&dir_path, FileMode::default()).map_err(|e| fail(&e))?;
    dir.require_private().map_err(|e| fail(&e))?;
    let path = dir_path.join(FILE_NAME);
    let name = OsStr::new(FILE_NAME);
    let created = match dir.kind(Path::new(name)) {
        Some(_) => false,
        None => publish_new_token(&dir).map_err(|e| fail(&e))?,
    };
    let token = Token::from_file(&path, "the listener's token")?;
    Ok((token, path, created))
}

/// Draws a token and publishes it as [`FILE_NAME`]; false when another daemon published one
/// first (then that one is used).
fn publish_new_token(dir: &Beneath) -> std::io::Result<bool> {
    let mut bytes = [0u8; TOKEN_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| std::io::Error::other("no randomness for a token"))?;
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let temporary = format!(".{FILE_NAME}.{}", std::process::id());
    let _ = dir.remove_all(Path::new(&temporary));
    let mut file = dir.create_new(Path::new(&temporary), FileMode::default())?;
    let written = file
        .write_all(format!("{text}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| dir.rename_new(OsStr::new(&temporary), OsStr::new(FILE_NAME)));
    match written {
        Ok(()) => {
            dir.sync()?;
            Ok(true)
        }
        Err(e) => {
            let _ = dir.remove_all(Path::new(&temporary));
            match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(false),
                _ => Err(e),
            }
        }
    }
}

fn refusal(dir: &Path, why: &str) -> String {
    format!(
        "the listener on loopback serves stacks to holders of a token, kept in {}/{FILE_NAME}: \
         {why}; give --listen-token-file FILE, or --insecure-listen to serve stacks to every \
         local user",
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_drawn_once_private_and_then_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Beneath::open(tmp.path()).unwrap();
        assert!(publish_new_token(&dir).unwrap());
        // A second daemon finds it published and keeps it.
        assert!(!publish_new_token(&dir).unwrap());
        let path = tmp.path().join(FILE_NAME);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 2 * TOKEN_BYTES);
        assert!(text.trim().bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(Token::from_file(&path, "t")
            .unwrap()
            .is(text.trim().as_bytes()));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}
