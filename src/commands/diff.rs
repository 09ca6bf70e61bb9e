//! `pyfleet diff BASE NEW -o OUT`: what grew and what shrank between two profiles (folded
//! files, pprof profiles or snapshot directories, in any mix), by function unless `--lines`,
//! as a differential flamegraph SVG or folded deltas (by OUT's extension), with a summary of
//! the functions that changed most on standard output: in seconds per second when both
//! profiles say how they were sampled, else in share; what differs in how they were sampled
//! (mode, rate) is said. See `output::differential` for what is compared.

use anyhow::{bail, Context, Result};
use pyfleet::output::{differential, for_terminal, profile_input, write_atomically};
use pyfleet_policies::FileMode;
use std::path::Path;

/// Functions listed in the summary.
const SUMMARY_ROWS: usize = 10;

/// What `-o` writes, by its extension.
enum Output {
    Svg,
    Folded,
}

pub fn run(
    base: &Path,
    new: &Path,
    out: &Path,
    file_mode: Option<&str>,
    lines: bool,
) -> Result<()> {
    let kind = match out.extension().and_then(|e| e.to_str()) {
        Some("svg") => Output::Svg,
        Some("folded" | "txt") => Output::Folded,
        _ => bail!(
            "-o {}: say what to write by the extension: .svg (a differential flamegraph) or \
             .folded (the deltas, `stack base new` per line)",
            out.display()
        ),
    };
    let mode = match file_mode {
        Some(m) => m
            .parse::<FileMode>()
            .map_err(|e| anyhow::anyhow!("--file-mode: {e}"))?,
        None => FileMode::default(),
    };
    let (out_dir, out_name) =
        pyfleet::output::output_place(out).map_err(|e| anyhow::anyhow!("-o: {e}"))?;
    let mut base_profile = profile_input::read(base).map_err(anyhow::Error::msg)?;
    let mut new_profile = profile_input::read(new).map_err(anyhow::Error::msg)?;
    // A function is one frame however its lines moved (an edit shifts them all).
    if !lines {
        base_profile = base_profile.by_function();
        new_profile = new_profile.by_function();
    }
    for (p, path) in [(&base_profile, base), (&new_profile, new)] {
        if p.total == 0 {
            bail!("{}: no samples to compare", path.display());
        }
    }
    let deltas =
        differential::folded_deltas(&base_profile, &new_profile).map_err(anyhow::Error::msg)?;
    let bytes = match kind {
        Output::Folded => deltas.into_bytes(),
        Output::Svg => differential::svg(
            "pyfleet diff",
            &format!(
                "{} ({} samples) to {} ({} samples){}; red grew, blue shrank, in points of \
                 each profile's samples; widths are the new profile's",
                base.display(),
                base_profile.total,
                new.display(),
                new_profile.total,
                if lines { "" } else { ", by function" },
            ),
            &deltas,
        )
        .map_err(anyhow::Error::msg)?,
    };
    write_atomically(&out_dir, &out_name, &bytes, mode, None)
        .with_context(|| format!("writing {}", out.display()))?;

    let changes = differential::by_function(&base_profile, &new_profile);
    outln!(
        "pyfleet diff: {} samples in {}, {} in {}; wrote {}",
        base_profile.total,
        for_terminal(&base.display().to_string()),
        new_profile.total,
        for_terminal(&new.display().to_string()),
        for_terminal(&out.display().to_string())
    );
    for (what, p) in [("base", &base_profile), ("new", &new_profile)] {
        if let Some(t) = &p.timing {
            outln!(
                "  {what}: {} mode at {} Hz over {:.1} s",
                t.mode.as_deref().map_or("?".into(), for_terminal),
                pyfleet::output::render_context::shown_hz(t.rate_hz),
                t.seconds
            );
        }
    }
    match (&base_profile.timing, &new_profile.timing) {
        (Some(b), Some(n)) if b.mode.is_some() && n.mode.is_some() && b.mode != n.mode => {
            outln!(
                "pyfleet diff: warning: the profiles count different samples ({} mode, {} \
                 mode): the change is in what they count as much as in the program",
                b.mode.as_deref().map_or("?".into(), for_terminal),
                n.mode.as_deref().map_or("?".into(), for_terminal),
            );
        }
        (Some(_), Some(_)) => {}
        _ => outln!(
            "pyfleet diff: {} does not say how it was sampled (a folded file): shares are \
             compared, not time",
            match base_profile.timing {
                None => for_terminal(&base.display().to_string()).into_owned(),
                Some(_) => for_terminal(&new.display().to_string()).into_owned(),
            }
        ),
    }
    let timed = changes.first().is_some_and(|c| c.per_second.is_some());
    match timed {
        true => outln!(
            "{:>9} {:>9} {:>9}  {:>6} {:>6}  function (own: innermost frame; seconds per \
             second of each window)",
            "base s/s",
            "new s/s",
            "change",
            "base",
            "new"
        ),
        false => outln!(
            "{:>8} {:>8} {:>8}  function (own share: innermost frame)",
            "base",
            "new",
            "change"
        ),
    }
    for c in changes.iter().take(SUMMARY_ROWS) {
        match c.per_second {
            Some((b, n)) => outln!(
                "{b:>9.3} {n:>9.3} {:>+9.3}  {:>5.1}% {:>5.1}%  {}",
                n - b,
                100.0 * c.base,
                100.0 * c.new,
                for_terminal(&c.function)
            ),
            None => outln!(
                "{:>7.1}% {:>7.1}% {:>+8.1}  {}",
                100.0 * c.base,
                100.0 * c.new,
                c.change_points(),
                for_terminal(&c.function)
            ),
        }
    }
    Ok(())
}
