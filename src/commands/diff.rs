//! `pyfleet diff BASE NEW -o OUT`: what grew and what shrank between two profiles (folded
//! files, pprof profiles or snapshot directories, in any mix), by function unless `--lines`,
//! as a differential flamegraph SVG (and its other side, the base's shape, beside it) or
//! folded deltas (by OUT's extension), with a summary of the functions that changed most on
//! standard output: in seconds per second when both profiles say how they were sampled (in
//! milliseconds per request with `--requests`), else in share; what differs in how they were
//! sampled (mode, rate) is said. See `output::differential` for what is compared.

use anyhow::{bail, Context, Result};
use pyfleet::output::{differential, for_terminal, profile_input, write_atomically};
use pyfleet_policies::FileMode;
use std::path::Path;

/// `diff.svg`'s other side, the base's shape: `diff.base.svg`.
fn base_side_name(name: &std::ffi::OsStr) -> std::ffi::OsString {
    let name = name.to_string_lossy();
    let stem = name.strip_suffix(".svg").unwrap_or(&name);
    format!("{stem}.base.svg").into()
}

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
    requests: &[u64],
) -> Result<()> {
    let requests = match requests {
        [] => None,
        &[b, n] if b > 0 && n > 0 => Some((b, n)),
        _ => bail!("--requests takes two counts above zero, BASE,NEW (such as 1200,1180)"),
    };
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
    let subtitle = |shape: &str| {
        format!(
            "{} ({} samples) to {} ({} samples){}; red grew, blue shrank, in points of each \
             profile's samples; widths are the {shape} profile's",
            base.display(),
            base_profile.total,
            new.display(),
            new_profile.total,
            if lines { "" } else { ", by function" },
        )
    };
    // With an SVG, its other side too: the base's shape, where what vanished is drawn.
    let mut written = Vec::new();
    match kind {
        Output::Folded => written.push((out_name.clone(), deltas.into_bytes())),
        Output::Svg => {
            let new_shape = differential::svg("pyfleet diff", &subtitle("new"), &deltas)
                .map_err(anyhow::Error::msg)?;
            let base_shape = differential::base_shape_svg(
                "pyfleet diff: the base's shape",
                &subtitle("base"),
                &base_profile,
                &new_profile,
            )
            .map_err(anyhow::Error::msg)?;
            written.push((out_name.clone(), new_shape));
            written.push((base_side_name(&out_name), base_shape));
        }
    }
    for (name, bytes) in &written {
        write_atomically(&out_dir, name, bytes, mode, None)
            .with_context(|| format!("writing {}", out.with_file_name(name).display()))?;
    }

    let changes = differential::by_function(&base_profile, &new_profile);
    outln!(
        "pyfleet diff: {} samples in {}, {} in {}; wrote {}",
        base_profile.total,
        for_terminal(&base.display().to_string()),
        new_profile.total,
        for_terminal(&new.display().to_string()),
        written
            .iter()
            .map(
                |(name, _)| for_terminal(&out.with_file_name(name).display().to_string())
                    .into_owned()
            )
            .collect::<Vec<_>>()
            .join(" and ")
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
    // Per request: own seconds per second, times the window, over its requests.
    let per_request = match (requests, &base_profile.timing, &new_profile.timing) {
        (Some((b, n)), Some(bt), Some(nt)) => Some((bt.seconds / b as f64, nt.seconds / n as f64)),
        (Some(_), _, _) => {
            outln!(
                "pyfleet diff: --requests needs both profiles to say how they were sampled \
                 (a folded file does not): no time per request"
            );
            None
        }
        (None, _, _) => None,
    };
    if let Some((b, n)) = per_request {
        outln!(
            "{:>9} {:>9} {:>9}  {:>6} {:>6}  function (own milliseconds per request)",
            "base ms",
            "new ms",
            "change",
            "base",
            "new"
        );
        for c in changes.iter().take(SUMMARY_ROWS) {
            if let Some((bs, ns)) = c.per_second {
                let (bm, nm) = (1e3 * bs * b, 1e3 * ns * n);
                outln!(
                    "{bm:>9.2} {nm:>9.2} {:>+9.2}  {:>5.1}% {:>5.1}%  {}",
                    nm - bm,
                    100.0 * c.base,
                    100.0 * c.new,
                    for_terminal(&c.function)
                );
            }
        }
        return Ok(());
    }
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
