//! Flamegraph SVG from folded lines, rendered by inferno.
//!
//! Owns the flamegraph's options (title, colours, sorting, labels truncated on the right so
//! that they keep the function's name). Frame text is untrusted: it is defanged for the folded
//! format before it gets here, and inferno escapes it for XML; the tests check that hostile
//! names still give well-formed SVG. Must not do I/O beyond writing into the buffer it is
//! given.

use inferno::flamegraph::{self, Options, TextTruncateDirection};

/// Renders `lines` (folded text without the counts split off) into an SVG document headed by
/// `title` and `subtitle`; `icicle`: roots at the top, stacks growing down (where a pane that
/// shows the top of a tall graph first shows its processes). An empty profile gives a small
/// valid SVG that says so, rather than an error.
pub fn render(
    title: &str,
    subtitle: &str,
    lines: &[(String, u64)],
    icicle: bool,
) -> Result<Vec<u8>, String> {
    let mut opts = options(title, subtitle);
    if icicle {
        opts.direction = flamegraph::Direction::Inverted;
    }
    let mut out = Vec::new();
    if lines.iter().all(|(_, n)| *n == 0) {
        let t = xml_escape(&format!("{title}: {subtitle}"));
        out.extend_from_slice(
            format!(
                "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" \
                 height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"24\" \
                 text-anchor=\"middle\">{t}</text><text x=\"600\" y=\"48\" \
                 text-anchor=\"middle\">No samples in this window</text></svg>\n"
            )
            .as_bytes(),
        );
        return Ok(out);
    }
    let text: Vec<String> = lines
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(l, n)| format!("{l} {n}"))
        .collect();
    flamegraph::from_lines(&mut opts, text.iter().map(String::as_str), &mut out)
        .map_err(|e| format!("rendering the flamegraph failed: {e}"))?;
    Ok(out)
}

/// The flamegraph's options: `title` and `subtitle` above it, counts named samples.
pub fn options(title: &str, subtitle: &str) -> Options<'static> {
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(subtitle.to_string());
    opts.count_name = "samples".to_string();
    // Labels read `function (file:line)`: a label too long for its frame keeps the function's
    // name and loses the end of the path (inferno's default cuts the left, the name).
    opts.text_truncate_direction = TextTruncateDirection::Right;
    opts
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn well_formed(svg: &[u8]) {
        let mut reader = quick_xml::Reader::from_reader(svg);
        let mut buf = Vec::new();
        loop {
            match reader.read_event_into(&mut buf) {
                Ok(quick_xml::events::Event::Eof) => break,
                Ok(_) => {}
                Err(e) => panic!("not XML: {e}\n{}", String::from_utf8_lossy(svg)),
            }
            buf.clear();
        }
    }

    #[test]
    fn hostile_names_give_well_formed_svg() {
        let lines = vec![
            (
                "app-1;<script>alert(1)</script> (/x.py:1);a&b\"c' (</svg>]]>:2)".to_string(),
                3,
            ),
            ("app-1;main (/ü/名前.py:9)".to_string(), 1),
        ];
        let svg = render("pyfleet <&> test", "cpu <mode>", &lines, false).unwrap();
        well_formed(&svg);
        let text = String::from_utf8(svg).unwrap();
        assert!(!text.contains("<script>"));
        assert!(text.contains("名前.py"));
        assert!(
            text.contains("cpu &lt;mode&gt;"),
            "the subtitle is shown, escaped"
        );
    }

    #[test]
    fn empty_profile_is_valid_svg() {
        let svg = render("nothing <here>", "wall mode", &[], true).unwrap();
        well_formed(&svg);
    }
}
