//! The one home of every output format. Strings from targets are untrusted: each format
//! escapes them for where they go (a terminal, JSON, folded stacks, SVG, protobuf, file names).
//! [`format`] names the profile formats and renders a snapshot in any of them; the daemon's
//! [`snapshot_dir`] and `record`'s [`record_file`] write them.

pub mod dump;
pub mod folded;
pub mod format;
pub mod pprof;
pub mod record_file;
pub mod snapshot_dir;
pub mod speedscope;
pub mod svg;

/// Writes `data` to `path` atomically: into `tmp` (same directory), fsynced, renamed over
/// `path`, and the directory fsynced, so a reader sees the old file or the whole new one. On
/// failure `tmp` is removed.
pub fn write_atomically(
    tmp: &std::path::Path,
    path: &std::path::Path,
    data: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    let r = (|| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    r
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
    fn terminal_strings_are_defanged() {
        assert_eq!(super::for_terminal("plain ü"), "plain ü");
        assert_eq!(super::for_terminal("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\u{a}");
        assert_eq!(
            super::for_terminal("evil\u{202e}txt.py\u{2028}x"),
            "evil\\u{202e}txt.py\\u{2028}x"
        );
    }
}
