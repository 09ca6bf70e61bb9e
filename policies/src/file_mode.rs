//! Who may read what pyfleet writes (`--file-mode`): the permission bits of its output files
//! (snapshots, `record`'s file) and of the directories it creates for them.
//!
//! Profiles name every function, file and service of the processes sampled, so by default
//! only their owner reads them: files 0600, directories 0700. A group (or everyone) may be
//! let in with a wider mode, such as 0640 for a group that reads snapshots. A mode carries
//! read and write bits only (no execute, setuid, setgid or sticky bit) and always lets the
//! owner read and write. A directory gets the file mode plus search (execute) for whoever may
//! read, and write for its owner only (whoever could write in it could plant links there):
//! 0640 gives 0750, 0666 gives 0755. The bits are exact, not masked by the umask: whoever
//! applies them sets them explicitly.

use std::fmt;
use std::str::FromStr;

/// The permission bits of pyfleet's output files; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode {
    bits: u32,
}

impl Default for FileMode {
    fn default() -> Self {
        FileMode { bits: 0o600 }
    }
}

/// A `--file-mode` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileModeError {
    #[error("{input:?} is not an octal mode such as 0600 or 0640")]
    NotOctal { input: String },
    #[error("{mode:04o} has bits other than read and write (the most is 0666)")]
    BeyondReadWrite { mode: u32 },
    #[error("{mode:04o} does not let the owner read and write (it must include 0600)")]
    OwnerLockedOut { mode: u32 },
}

impl FileMode {
    /// A mode from its bits, checked as a parsed one is.
    pub fn new(bits: u32) -> Result<FileMode, FileModeError> {
        if bits & !0o666 != 0 {
            return Err(FileModeError::BeyondReadWrite { mode: bits });
        }
        if bits & 0o600 != 0o600 {
            return Err(FileModeError::OwnerLockedOut { mode: bits });
        }
        Ok(FileMode { bits })
    }

    /// The bits of a file.
    pub fn file(self) -> u32 {
        self.bits
    }

    /// The bits of a directory: the file's, search wherever read is allowed, and write for
    /// the owner only.
    pub fn directory(self) -> u32 {
        (self.bits & !0o022) | ((self.bits & 0o444) >> 2)
    }
}

impl FromStr for FileMode {
    type Err = FileModeError;

    /// `0600`, `600` or `0o600`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let digits = t.strip_prefix("0o").unwrap_or(t);
        let not_octal = || FileModeError::NotOctal {
            input: s.to_string(),
        };
        if digits.is_empty()
            || digits.len() > 4
            || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
        {
            return Err(not_octal());
        }
        let bits = u32::from_str_radix(digits, 8).map_err(|_| not_octal())?;
        FileMode::new(bits)
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_only_by_default() {
        let m = FileMode::default();
        assert_eq!((m.file(), m.directory()), (0o600, 0o700));
        assert_eq!(m.to_string(), "0600");
    }

    #[test]
    fn directories_are_searchable_by_whoever_reads() {
        for (text, file, dir) in [
            ("0640", 0o640, 0o750),
            ("644", 0o644, 0o755),
            ("0o660", 0o660, 0o750),
            ("0606", 0o606, 0o705),
            ("0666", 0o666, 0o755),
        ] {
            let m: FileMode = text.parse().expect(text);
            assert_eq!((m.file(), m.directory()), (file, dir), "{text}");
        }
    }

    #[test]
    fn other_bits_owners_without_access_and_non_octal_are_refused() {
        for bad in ["0755", "4600", "1600", "0700"] {
            assert!(
                matches!(
                    bad.parse::<FileMode>(),
                    Err(FileModeError::BeyondReadWrite { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["0400", "0200", "0044", "0"] {
            assert!(
                matches!(
                    bad.parse::<FileMode>(),
                    Err(FileModeError::OwnerLockedOut { .. })
                ),
                "{bad}"
            );
        }
        for bad in [
            "",
            "rw-r-----",
            "0689",
            "0o",
            "00600",
            "-600",
            "+600",
            "6 00",
        ] {
            assert!(
                matches!(bad.parse::<FileMode>(), Err(FileModeError::NotOctal { .. })),
                "{bad:?}"
            );
        }
    }
}
