//! The listener's credentials read again while the daemon runs: its token file and its TLS
//! certificate, key and client CA, on SIGHUP and whenever one of those files changes.
//!
//! Contract. [`Reloader::run`] looks at the files every [`POLL`] (each file's device, inode,
//! size and modification time, following links: a Kubernetes Secret's atomic swap of its
//! `..data` link counts as a change) and at every SIGHUP it is given. A file read again is
//! checked as at start (`Token::from_file`, `tls::server_config`); what passes replaces the
//! previous one for every request and handshake from then on (connections already open keep
//! theirs), what does not leaves the previous one serving, and either is said in one line on
//! stderr. A new token ends the sessions of the old one.

use super::access::{Token, TokenSlot};
use crate::tls::{ServerFiles, ServerSlot};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// What tells a file changed: its device, inode, size and modification time (`None`: it
/// cannot be read now).
type Fingerprint = Option<(u64, u64, u64, i64, i64)>;

/// What can be reloaded, and where from.
pub struct Reloader {
    token_file: Option<PathBuf>,
    token: TokenSlot,
    tls_files: Option<ServerFiles>,
    tls: Option<ServerSlot>,
    seen: Vec<Fingerprint>,
}

impl Reloader {
    pub fn new(
        token_file: Option<PathBuf>,
        token: TokenSlot,
        tls_files: Option<ServerFiles>,
        tls: Option<ServerSlot>,
    ) -> Reloader {
        let mut reloader = Reloader {
            token_file,
            token,
            tls_files,
            tls,
            seen: Vec::new(),
        };
        reloader.seen = reloader.fingerprints();
        reloader
    }

    /// Whether there is anything to reload.
    pub fn has_files(&self) -> bool {
        self.token_file.is_some() || self.tls_files.is_some()
    }

    fn files(&self) -> Vec<&Path> {
        let mut files: Vec<&Path> = self.token_file.iter().map(PathBuf::as_path).collect();
        if let Some(tls) = &self.tls_files {
            files.extend([tls.cert.as_path(), tls.key.as_path()]);
            files.extend(tls.client_ca.as_deref());
        }
        files
    }

    fn fingerprints(&self) -> Vec<Fingerprint> {
        self.files()
            .iter()
            .map(|f| {
                std::fs::metadata(f)
                    .ok()
                    .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            })
            .collect()
    }

    /// Reads every file again (see the module documentation); one line per credential said.
    pub fn reload(&mut self, why: &str) {
        self.seen = self.fingerprints();
        if let Some(file) = &self.token_file {
            match Token::from_file(file, "the listener's token") {
                Ok(token) if self.token.current().as_ref() == Some(&token) => {}
                Ok(token) => {
                    self.token.set(token);
                    crate::logging::note(&format!(
                        "{why}: the listener's token is read again from {}",
                        file.display()
                    ));
                }
                Err(e) => crate::logging::warning(&format!(
                    "{why}: {}; the previous token stays",
                    crate::output::for_terminal(&e)
                )),
            }
        }
        if let (Some(files), Some(slot)) = (&self.tls_files, &self.tls) {
            match crate::tls::server_config(files) {
                Ok(config) => {
                    slot.set(config);
                    crate::logging::note(&format!(
                        "{why}: the listener's certificate is read again from {}",
                        files.cert.display()
                    ));
                }
                Err(e) => crate::logging::warning(&format!(
                    "{why}: {}; the previous certificate stays",
                    crate::output::for_terminal(&e)
                )),
            }
        }
    }

    /// Reloads on every `hangup` and whenever a file changes, for as long as the daemon runs.
    pub async fn run(mut self, mut hangup: Option<tokio::signal::unix::Signal>) {
        let mut every = tokio::time::interval(POLL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hangup = async {
                match hangup.as_mut() {
                    Some(stream) => stream.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = hangup => self.reload("SIGHUP"),
                _ = every.tick() => {
                    if self.fingerprints() != self.seen {
                        self.reload("a credential's file changed");
                    }
                }
            }
        }
    }
}
