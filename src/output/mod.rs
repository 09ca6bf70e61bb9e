//! The one home of every output format. Strings from targets are untrusted: each format
//! escapes them for where they go (a terminal, JSON, folded stacks, SVG, protobuf, file names).
//! [`format`] names the profile formats and renders a snapshot in any of them; the daemon's
//! [`snapshot_dir`] and `record`'s [`record_file`] write them.

pub mod beneath;
pub mod blame;
pub mod collector;
pub mod differential;
pub mod dump;
pub mod folded;
pub mod format;
pub mod pprof;
pub mod profile_input;
pub mod record_file;
pub mod render_context;
pub mod snapshot_dir;
pub mod snapshot_load;
pub mod speedscope;
pub mod svg;
pub mod task_entries;
pub mod views;

pub use pyfleet_policies::FileMode;

/// Where an output file goes: its directory, held open (reached without following a link
/// another user could have planted, see [`beneath`]), and its name there. The error says what
/// is wrong with the path, in words.
pub fn output_place(
    path: &std::path::Path,
) -> Result<(beneath::Beneath, std::ffi::OsString), String> {
    let name = path
        .file_name()
        .ok_or_else(|| "not a file name".to_string())?
        .to_os_string();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let held = beneath::Beneath::open(dir).map_err(|e| e.to_string())?;
    Ok((held, name))
}

/// Writes `data` to file `name` of `dir` atomically: into a new temporary file beside it (see
/// [`create_beside`]), fsynced, renamed over `name` (a symlink there is replaced, not
/// followed), and the directory fsynced, so a reader sees the old file or the whole new one.
/// The file has `mode`'s bits, and is handed to `owner` when one is given. On failure the
/// temporary file is removed.
pub fn write_atomically(
    dir: &beneath::Beneath,
    name: &std::ffi::OsStr,
    data: &[u8],
    mode: FileMode,
    owner: Option<Owner>,
) -> std::io::Result<()> {
    use std::io::Write;
    let (tmp, mut f) = create_beside(dir, name, mode)?;
    let r = (|| {
        if let Some(o) = owner {
            std::os::unix::fs::fchown(&f, Some(o.uid), Some(o.gid))?;
        }
        f.write_all(data)?;
        f.sync_all()?;
        dir.rename(&tmp, name)?;
        dir.sync()
    })();
    if r.is_err() {
        let _ = dir.remove_all(std::path::Path::new(&tmp));
    }
    r
}

/// Who a written file is handed to: `record` run through sudo gives its file to the user who
/// ran sudo, as if they had written it (files are created for their owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// The user who ran sudo (`SUDO_UID` and `SUDO_GID`, both ids), when pyfleet runs as root
    /// through it; else none.
    pub fn sudo_invoker() -> Option<Owner> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let id = |var: &str| std::env::var(var).ok()?.trim().parse::<u32>().ok();
        Some(Owner {
            uid: id("SUDO_UID")?,
            gid: id("SUDO_GID")?,
        })
        .filter(|o| o.uid != 0)
    }
}

/// Creates a new file `.<name>.<random>.tmp` in `dir`, with `mode`'s bits: never an existing
/// one, never through a symlink, under a name nobody can guess beforehand. Its name and the
/// file.
pub fn create_beside(
    dir: &beneath::Beneath,
    name: &std::ffi::OsStr,
    mode: FileMode,
) -> std::io::Result<(std::ffi::OsString, std::fs::File)> {
    use std::hash::{BuildHasher, Hasher};
    let name = name.to_string_lossy();
    let mut last = None;
    for _ in 0..8 {
        // RandomState's keys come from the OS's randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let tmp = std::ffi::OsString::from(format!(".{name}.{:016x}.tmp", h.finish()));
        match dir.create_new(std::path::Path::new(&tmp), mode) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name")))
}

/// Whether the first bytes of an existing file are a profile pyfleet could have written in
/// `format` (so that `record -o` may replace it): folded stacks (every line ends in a count),
/// an SVG, a speedscope file, a gzipped pprof profile. A source file or a config is not one.
/// An empty file holds nothing to lose (a folded recording of no sample is one).
pub fn looks_like_profile(format: format::Format, head: &[u8]) -> bool {
    use format::Format;
    let text = || std::str::from_utf8(head).ok();
    if head.is_empty() {
        return true;
    }
    match format {
        Format::Folded => text().is_some_and(|t| {
            // The head may end mid-line: only whole lines count.
            let whole = t.rfind('\n').map_or("", |i| &t[..i]);
            !whole.is_empty()
                && whole.lines().all(|l| {
                    l.rsplit_once(' ').is_some_and(|(stack, n)| {
                        !stack.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                    })
                })
        }),
        Format::Svg => text().is_some_and(|t| {
            let t = t.trim_start();
            (t.starts_with("<?xml") || t.starts_with("<svg")) && t.contains("<svg")
        }),
        Format::Speedscope => text()
            .is_some_and(|t| t.trim_start().starts_with('{') && t.contains(speedscope::SCHEMA_URL)),
        Format::Pprof => head.starts_with(&[0x1f, 0x8b]),
    }
}

/// Replaces control characters (terminal escapes, newlines) and bidirectional and line
/// separator characters in a target's string with visible escapes (`\u{1b}`), so that a dump
/// cannot drive the user's terminal, break lines or show text in another order than it is.
pub fn for_terminal(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if needs_escape(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Control characters, and what reorders or breaks lines on a terminal: bidirectional
/// embeddings, overrides and isolates, the line and paragraph separators.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'
        )
}

#[cfg(test)]
mod tests {
    #[test]
    fn writes_never_follow_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let out = dir.path().join("profile.svg");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let (held, name) = super::output_place(&out).unwrap();
        let mode = super::FileMode::default();
        super::write_atomically(&held, &name, b"profile", mode, None).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&out).unwrap(), b"profile");
        assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
        // Temporary names differ from one call to the next, and none is left behind.
        let (a, _) = super::create_beside(&held, &name, mode).unwrap();
        let (b, _) = super::create_beside(&held, &name, mode).unwrap();
        assert_ne!(a, b);
        std::fs::remove_file(dir.path().join(a)).unwrap();
        std::fs::remove_file(dir.path().join(b)).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn terminal_strings_are_defanged() {
        assert_eq!(super::for_terminal("plain ü"), "plain ü");
        assert_eq!(super::for_terminal("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(
            super::for_terminal("evil\u{202e}txt.py\u{2028}x"),
            "evil\\u{202e}txt.py\\u{2028}x"
        );
    }
}
