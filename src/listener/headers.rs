//! What every response of the listeners carries, whatever it answers: `nosniff` (a browser
//! takes the content type as given), `Cache-Control: no-store` (stacks stay out of caches),
//! `Referrer-Policy: no-referrer`, and a Content-Security-Policy by what the body is:
//!
//! - pyfleet's own HTML (the page, the sign-in form): only its own inline script and style,
//!   named by their SHA-256 (nothing injected runs), requests to itself alone, never framed;
//! - an SVG (a flamegraph, whose inline script zooms and searches): its script runs in a
//!   sandbox of its own origin, reaches nothing, framed by the page alone;
//! - anything else: nothing runs, never framed.

use base64::Engine;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;

/// Puts the headers of the module documentation on `response`.
pub fn secure(response: &mut Response<Full<Bytes>>, body: &[u8]) {
    let kind = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let policy = if kind.starts_with("text/html") {
        html_policy(body)
    } else if kind.starts_with("image/svg+xml") {
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
         img-src data:; frame-ancestors 'self'; sandbox allow-scripts"
            .to_string()
    } else {
        "default-src 'none'; frame-ancestors 'none'; sandbox".to_string()
    };
    let headers = response.headers_mut();
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    if let Ok(value) = HeaderValue::from_str(&policy) {
        headers.insert("content-security-policy", value);
    }
}

/// The policy of one of pyfleet's HTML documents: its inline `<script>` and `<style>` blocks
/// by hash, requests and frames to itself, forms to itself, never framed.
fn html_policy(html: &[u8]) -> String {
    let html = String::from_utf8_lossy(html);
    let hashes = |tag: &str| -> String {
        inline_blocks(&html, tag)
            .into_iter()
            .map(|block| {
                let digest = ring::digest::digest(&ring::digest::SHA256, block.as_bytes());
                format!(
                    " 'sha256-{}'",
                    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
                )
            })
            .collect()
    };
    format!(
        "default-src 'none'; script-src{}; style-src{}; connect-src 'self'; img-src 'self' \
         data:; frame-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        or_none(hashes("script")),
        or_none(hashes("style")),
    )
}

fn or_none(sources: String) -> String {
    match sources.is_empty() {
        true => " 'none'".to_string(),
        false => sources,
    }
}

/// The contents of each `<TAG>...</TAG>` block of `html` (pyfleet's own documents: tags
/// without attributes).
fn inline_blocks<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    html.split(open.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once(close.as_str()).map(|(block, _)| block))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secured(kind: &'static str, body: &str) -> Response<Full<Bytes>> {
        let mut r =
            super::super::http::with_type(hyper::StatusCode::OK, body.as_bytes().to_vec(), kind);
        secure(&mut r, body.as_bytes());
        r
    }

    #[test]
    fn every_response_is_kept_out_of_caches_and_frames() {
        let page = super::super::fleet_page::PAGE;
        let r = secured("text/html; charset=utf-8", page);
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe"),
            "{csp}"
        );
        // The page's one script and one style, by hash.
        assert_eq!(csp.matches("'sha256-").count(), 2, "{csp}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(r.headers()[CACHE_CONTROL], "no-store");
        let svg = secured("image/svg+xml", "<svg><script>1</script></svg>");
        let csp = svg.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("sandbox allow-scripts") && csp.contains("frame-ancestors 'self'"));
        let text = secured("text/plain", "x");
        let csp = text.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
        // A script pyfleet did not write has no hash in the policy.
        let injected = html_policy(b"<script>a()</script>");
        assert!(!injected.contains(&html_policy(b"<script>b()</script>")[30..60]));
    }
}
