//! Differential profiles: what grew and what shrank from a base profile to a new one.
//!
//! The folded deltas are inferno's differential folder's (`stack base new`, the base's counts
//! scaled so that both profiles hold the same total: shares are compared, not sample
//! counts, which differ with the length and rate of each recording); the SVG is inferno's
//! flamegraph of them (frame widths from the new profile; red: grew, blue: shrank; each
//! frame's title says its change in points of the new total), and its other side the same in
//! the base's shape, where what vanished still has its width. The summary, by function, is
//! this module's: each function's own share (samples in which it is the innermost frame) in
//! each profile and the change. Frame text is untrusted: it was defanged for the folded
//! format when read, inferno escapes it for XML, and the summary goes through
//! [`for_terminal`](super::for_terminal) where it is printed.

use super::profile_input::FoldedProfile;
use inferno::differential;
use inferno::flamegraph;
use std::collections::HashMap;

/// The folded deltas of `base` to `new`: `stack base new` per line, the base's counts
/// normalised to the new total.
pub fn folded_deltas(base: &FoldedProfile, new: &FoldedProfile) -> Result<String, String> {
    let opts = differential::Options {
        normalize: true,
        strip_hex: false,
    };
    let mut out = Vec::new();
    differential::from_readers(
        opts,
        base.text().as_bytes(),
        new.text().as_bytes(),
        &mut out,
    )
    .map_err(|e| format!("comparing the profiles failed: {e}"))?;
    String::from_utf8(out).map_err(|e| format!("comparing the profiles failed: {e}"))
}

/// The differential flamegraph of `deltas` (from [`folded_deltas`]): the new profile's shape.
pub fn svg(title: &str, subtitle: &str, deltas: &str) -> Result<Vec<u8>, String> {
    render_svg(title, subtitle, deltas, false)
}

/// The other side: the differential flamegraph in the base profile's shape, so that what
/// shrank or vanished has its width (the colours say the same as [`svg`]'s: red grew, blue
/// shrank).
pub fn base_shape_svg(
    title: &str,
    subtitle: &str,
    base: &FoldedProfile,
    new: &FoldedProfile,
) -> Result<Vec<u8>, String> {
    // The deltas the other way round (`stack new base`, widths the base's), their sign
    // turned back.
    let deltas = folded_deltas(new, base)?;
    render_svg(title, subtitle, &deltas, true)
}

fn render_svg(title: &str, subtitle: &str, deltas: &str, negate: bool) -> Result<Vec<u8>, String> {
    let mut opts = super::svg::options(title, subtitle);
    opts.negate_differentials = negate;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut opts, deltas.lines(), &mut out)
        .map_err(|e| format!("rendering the differential flamegraph failed: {e}"))?;
    Ok(out)
}

/// One function's own share in each profile, and its own seconds per second of each window
/// when both profiles say how they were sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionChange {
    /// `function (file)`: the frame label without its line ([`function_label`]).
    pub function: String,
    /// Own share of the base and of the new profile, 0 to 1.
    pub base: f64,
    pub new: f64,
    /// Own seconds per second of the base's and the new window (CPU seconds a second in cpu
    /// mode), when both are known.
    pub per_second: Option<(f64, f64)>,
}

impl FunctionChange {
    /// In points (percent of each profile's samples): positive when it grew.
    pub fn change_points(&self) -> f64 {
        100.0 * (self.new - self.base)
    }

    /// In seconds per second, when known: positive when it grew.
    pub fn change_per_second(&self) -> Option<f64> {
        self.per_second.map(|(b, n)| n - b)
    }
}

/// Every function innermost in a stack of either profile, by how much it changed, the
/// largest change, up or down, first (ties by name): in seconds per second when both
/// profiles say how they were sampled (a share can shrink because another function grew),
/// else in share.
pub fn by_function(base: &FoldedProfile, new: &FoldedProfile) -> Vec<FunctionChange> {
    let mut own: HashMap<String, (u64, u64)> = HashMap::new();
    for (profile, which) in [(base, 0), (new, 1)] {
        for (stack, n) in &profile.stacks {
            let leaf = stack.rsplit(';').next().unwrap_or(stack);
            let e = own.entry(function_label(leaf)).or_default();
            match which {
                0 => e.0 += n,
                _ => e.1 += n,
            }
        }
    }
    let share = |n: u64, total: u64| match total {
        0 => 0.0,
        t => n as f64 / t as f64,
    };
    let timings = base.timing.as_ref().zip(new.timing.as_ref());
    let mut out: Vec<FunctionChange> = own
        .into_iter()
        .map(|(function, (b, n))| FunctionChange {
            function,
            base: share(b, base.total),
            new: share(n, new.total),
            per_second: timings.map(|(tb, tn)| (tb.per_second(b), tn.per_second(n))),
        })
        .collect();
    let size = |c: &FunctionChange| match c.change_per_second() {
        Some(s) => s.abs(),
        None => c.change_points().abs(),
    };
    out.sort_by(|a, b| {
        size(b)
            .total_cmp(&size(a))
            .then_with(|| a.function.cmp(&b.function))
    });
    out
}

/// A frame label without its line: `function (file:line)` as `function (file)`; other labels
/// as they are.
pub fn function_label(label: &str) -> String {
    if let Some((head, line)) = label.strip_suffix(')').and_then(|b| b.rsplit_once(':')) {
        if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) && head.contains(" (") {
            return format!("{head})");
        }
    }
    label.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::profile_input::from_folded;

    #[test]
    fn deltas_are_normalised_and_the_grown_function_comes_first() {
        // The base has 100 samples, the new 1,000: shares are compared.
        let base = from_folded("main (a.py:1);alpha (a.py:6) 25\nmain (a.py:1);beta (a.py:9) 75\n")
            .unwrap();
        let new =
            from_folded("main (a.py:1);alpha (a.py:6) 750\nmain (a.py:1);beta (a.py:9) 250\n")
                .unwrap();
        let deltas = folded_deltas(&base, &new).unwrap();
        assert!(
            deltas.contains("main (a.py:1);beta (a.py:9) 750 250"),
            "{deltas}"
        );
        let changes = by_function(&base, &new);
        assert_eq!(changes.len(), 2);
        let alpha = changes
            .iter()
            .find(|c| c.function.starts_with("alpha"))
            .unwrap();
        assert!((alpha.change_points() - 50.0).abs() < 1e-9, "{changes:?}");
        assert_eq!(changes[0].function, "alpha (a.py)");
        let svg = String::from_utf8(svg("t", "s", &deltas).unwrap()).unwrap();
        assert!(svg.contains("+50.00%"), "the grown frame's title says so");
    }

    #[test]
    fn a_label_loses_its_line_only() {
        assert_eq!(function_label("f (a.py:12)"), "f (a.py)");
        assert_eq!(function_label("f (a.py)"), "f (a.py)");
        assert_eq!(function_label("plain"), "plain");
        assert_eq!(function_label("g (c:\\x:3)"), "g (c:\\x)");
        assert_eq!(function_label("h (a.py:x1)"), "h (a.py:x1)");
    }
}
