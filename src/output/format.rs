//! The profile formats a [`Snapshot`] can be written in, and the one entry point that renders
//! them: folded stacks, SVG flamegraph, speedscope JSON and pprof (gzipped protobuf).
//!
//! Owns the format names (`--format`, `--snapshot-format`), the file-name extensions that
//! select them, and what every format renders: the whole snapshot, every process in it. In the
//! folded and SVG renditions each stack is rooted at its process's frame
//! ([`folded::process_root`]: `<process>-<pid>`, `<process>-worker-<pid>`...) (as a
//! snapshot's `all.folded` and `flamegraph.svg`); speedscope has one profile per process;
//! pprof carries the process and pid as labels. Asyncio tasks show as the context asks
//! ([`RenderContext::tasks`]): by default merged by what they run, pprof labelling each
//! sample with its task. Must not do I/O: callers write the bytes.

pub use super::render_context::RenderContext;
use super::{folded, pprof, speedscope, svg};
use pyfleet_actors::Snapshot;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// One output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// Brendan Gregg's folded stacks (`.folded`, `.txt`).
    Folded,
    /// A flamegraph (inferno), `.svg`.
    Svg,
    /// speedscope's JSON file format (`.json`, `.speedscope.json`).
    Speedscope,
    /// pprof's profile.proto, gzipped (`.pb.gz`, `.pprof`).
    Pprof,
}

impl Format {
    pub const ALL: [Format; 4] = [
        Format::Folded,
        Format::Svg,
        Format::Speedscope,
        Format::Pprof,
    ];

    /// The name on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Speedscope => "speedscope",
            Format::Pprof => "pprof",
        }
    }

    /// The extension written for this format (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Speedscope => "speedscope.json",
            Format::Pprof => "pb.gz",
        }
    }

    /// The format a file name's extension stands for: `.folded`/`.txt`, `.svg`,
    /// `.json`/`.speedscope.json`, `.pb.gz`/`.pprof` (case-insensitive). `None` otherwise.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        // `<stem>.<ext>` with a non-empty stem.
        let ends = |ext: &str| {
            name.strip_suffix(ext)
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|stem| !stem.is_empty())
        };
        if ends("pb.gz") || ends("pprof") {
            Some(Format::Pprof)
        } else if ends("json") {
            Some(Format::Speedscope)
        } else if ends("svg") {
            Some(Format::Svg)
        } else if ends("folded") || ends("txt") {
            Some(Format::Folded)
        } else {
            None
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        let wanted = s.trim().to_ascii_lowercase();
        Format::ALL
            .into_iter()
            .find(|f| f.name() == wanted)
            .ok_or_else(|| {
                format!(
                    "unknown format '{}' (expected folded, svg, speedscope or pprof)",
                    super::for_terminal(s)
                )
            })
    }
}

/// Renders a whole snapshot in one format.
pub fn render(format: Format, snap: &Snapshot, ctx: &RenderContext) -> Result<Vec<u8>, String> {
    let ctx = &ctx.for_snapshot(snap);
    // pprof drops the frames naming tasks itself, keeping each sample's task as a label.
    let shown = || super::views::with_task_frames(snap, ctx.tasks);
    match format {
        Format::Folded => Ok(folded::render(&folded::fleet_lines(&shown())).into_bytes()),
        Format::Svg => svg::render(
            &ctx.title,
            &ctx.describe(),
            &folded::fleet_lines(&shown()),
            ctx.icicle,
        ),
        Format::Speedscope => speedscope::render(&shown(), ctx),
        Format::Pprof => pprof::render(snap, ctx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_extensions() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>(), Ok(f));
            let file = format!("out.{}", f.extension());
            assert_eq!(Format::from_path(Path::new(&file)), Some(f), "{file}");
        }
        let by_ext = |p: &str| Format::from_path(Path::new(p));
        assert_eq!(by_ext("/tmp/x.txt"), Some(Format::Folded));
        assert_eq!(by_ext("x.JSON"), Some(Format::Speedscope));
        assert_eq!(by_ext("x.pprof"), Some(Format::Pprof));
        assert_eq!(by_ext("x.gz"), None);
        assert_eq!(by_ext("x.svg.bak"), None);
        assert_eq!(by_ext(".svg"), None);
        assert_eq!(by_ext("svg"), None);
        assert_eq!(by_ext("dir/"), None);
        let e = "flame\n".parse::<Format>().unwrap_err();
        assert!(e.contains("unknown format") && !e.contains('\n'), "{e}");
        assert_eq!(" SVG ".parse::<Format>(), Ok(Format::Svg));
    }
}
