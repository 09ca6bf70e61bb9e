//! Who may read what the listener serves.
//!
//! Contract. With a token ([`Token::from_file`]), every request for stacks
//! (`/debug/pprof/*`, the fleet page and its windows), and `/metrics` when
//! [`Access::metrics_need_token`] is set, must carry `Authorization: Bearer <token>`, or the
//! [`SESSION_COOKIE`] a browser is given at `/login` for the token; anything else is answered
//! 401 with one line (the page itself with the login form). The cookie holds a digest of the
//! token, never the token, and is `HttpOnly`, `SameSite=Strict` (and `Secure` over TLS). The
//! check takes the same time whatever the request carries: both sides are hashed (SHA-256)
//! and the digests compared in constant time, so neither the token's bytes nor its length can
//! be found by timing. Client certificates, when the listener requires them, are checked by the TLS
//! handshake before any request is read (`crate::tls`). Health and readiness never need a
//! credential: they say nothing about the targets.
//!
//! [`check_exposure`] is the startup rule: a listener that is not loopback-only serves stacks
//! only behind a token or client certificates, unless the operator said `--insecure-listen`.
//!
//! Every request's `Host` must be an IP address, `localhost`, or a name the operator gave
//! (`--listen-name`): a web page that points a DNS name of its own at the listener's address
//! (DNS rebinding) is refused before anything else is looked at ([`host_is_allowed`]). An IP
//! literal cannot be rebound, so any is allowed (Prometheus and the kubelet reach a pod by its
//! address).

use hyper::header::{AUTHORIZATION, COOKIE};
use hyper::HeaderMap;
use ring::digest::{digest, Digest, SHA256};
use std::net::SocketAddr;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Fewest characters a token may have: 16 random characters or more are not guessed.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Most bytes a token file may hold.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The cookie that stands for the token in a browser.
pub const SESSION_COOKIE: &str = "pyfleet_session";

/// A bearer token, kept only as its digest.
#[derive(Clone)]
pub struct Token(Digest);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.0.as_ref().ct_eq(other.0.as_ref()).into()
    }
}

impl Token {
    /// The token a file holds: one line of visible ASCII (a trailing newline is dropped), at
    /// least [`MIN_TOKEN_CHARS`] long. `what` names the option in errors.
    pub fn from_file(path: &Path, what: &str) -> Result<Token, String> {
        let bad = |why: String| format!("{what} {}: {why}", path.display());
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.len() > MAX_TOKEN_BYTES as u64 {
            return Err(bad(format!("more than {MAX_TOKEN_BYTES} bytes")));
        }
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let token = text.strip_suffix(b"\n").unwrap_or(&text);
        let token = token.strip_suffix(b"\r").unwrap_or(token);
        if !token.iter().all(u8::is_ascii_graphic) {
            return Err(bad(
                "a token is one line of visible ASCII characters (no spaces)".into(),
            ));
        }
        if token.len() < MIN_TOKEN_CHARS {
            return Err(bad(format!(
                "a token needs at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 32`)"
            )));
        }
        Ok(Token::new(token))
    }

    fn new(bytes: &[u8]) -> Token {
        Token(digest(&SHA256, bytes))
    }

    /// Whether `given` is the token (for `/login`).
    pub fn is(&self, given: &[u8]) -> bool {
        Token::new(given) == *self
    }

    /// The session cookie's value for this token: a digest of the token's digest, in hex.
    pub fn session(&self) -> String {
        let mut input = b"pyfleet session\0".to_vec();
        input.extend_from_slice(self.0.as_ref());
        digest(&SHA256, &input)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `headers` carry this token's session cookie.
    fn admits_session(&self, headers: &HeaderMap) -> bool {
        let given = session_cookie(headers).unwrap_or(b"");
        Token::new(given) == Token::new(self.session().as_bytes())
    }

    /// Whether `headers` carry this token as `Authorization: Bearer <token>`.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(AUTHORIZATION)
            .map(|v| v.as_bytes())
            .and_then(|v| strip_prefix_ignore_case(v, b"bearer "))
            .unwrap_or(b"");
        // Hashed whatever was given (nothing too): the same work for every request.
        self.is(given)
    }
}

/// The value of the [`SESSION_COOKIE`] among `headers`' cookies, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(SESSION_COOKIE.as_bytes())?
                .strip_prefix(b"=")
        })
}

fn strip_prefix_ignore_case<'a>(v: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &v[prefix.len()..])
}

/// What a listener asks of its clients.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub token: Option<Token>,
    /// `/metrics` takes the token too (else it is open, as Prometheus scrapes without one).
    pub metrics_need_token: bool,
    /// The listener speaks TLS: the session cookie is `Secure`.
    pub tls: bool,
    /// Host names it answers to besides IP addresses and `localhost` (lower case).
    pub names: Vec<String>,
}

/// Whether a request whose `Host` header is `host` (`None`: none sent) is for this listener:
/// an IP address (v4, or v6 in brackets), `localhost`, or one of `names` (lower case), with
/// or without a port. A request without a Host (HTTP/1.0) is allowed: a browser always
/// sends one.
pub fn host_is_allowed(host: Option<&[u8]>, names: &[String]) -> bool {
    let Some(host) = host else {
        return true;
    };
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [v6]:port or [v6]
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || is_port(port) => {
                return v6.parse::<std::net::Ipv6Addr>().is_ok()
            }
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok() || name == "localhost" || names.contains(&name)
}

/// `:PORT` after a host.
fn is_port(s: &str) -> bool {
    s.strip_prefix(':').unwrap_or(s).parse::<u16>().is_ok()
}

/// Whether `name` may be given as a listener's host name: letters, digits, `-` and `.`.
pub fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// Why a request was refused (one line, for the 401's body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    NoCredential,
    WrongCredential,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::NoCredential => {
                "a credential is needed: send Authorization: Bearer <the token> (a browser: /login)"
            }
            Refused::WrongCredential => "the credential is not valid",
        })
    }
}

impl Refused {
    /// The refusal in words for a person at a browser (the login form's).
    pub fn to_browser(self) -> &'static str {
        match self {
            Refused::NoCredential => "This daemon's page needs its token.",
            Refused::WrongCredential => {
                "The credential this browser holds is not valid: sign in again."
            }
        }
    }
}

/// Which kind of page a path is, for access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Stacks of the targets: `/debug/pprof/*`.
    Stacks,
    /// `/metrics`.
    Metrics,
    /// Health, readiness and the 404 page.
    Open,
}

impl Access {
    /// Whether a request for `page` with `headers` may be answered.
    pub fn admit(&self, page: Page, headers: &HeaderMap) -> Result<(), Refused> {
        let needed = match page {
            Page::Stacks => true,
            Page::Metrics => self.metrics_need_token,
            Page::Open => false,
        };
        match &self.token {
            // Both checked (`|`, not `||`): the same work whichever was given.
            Some(token) if needed => match token.admits(headers) | token.admits_session(headers) {
                true => Ok(()),
                false
                    if headers.contains_key(AUTHORIZATION) || session_cookie(headers).is_some() =>
                {
                    Err(Refused::WrongCredential)
                }
                false => Err(Refused::NoCredential),
            },
            _ => Ok(()),
        }
    }

    /// The `Set-Cookie` value that gives a browser the session of `token`.
    pub fn session_cookie(&self, token: &Token) -> String {
        format!(
            "{SESSION_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict{}",
            token.session(),
            if self.tls { "; Secure" } else { "" }
        )
    }
}

/// The startup rule (see the module doc): `Err` is the one line that refuses to start.
pub fn check_exposure(
    addr: SocketAddr,
    has_token: bool,
    has_client_certs: bool,
    insecure: bool,
) -> Result<(), String> {
    if addr.ip().is_loopback() || has_token || has_client_certs || insecure {
        return Ok(());
    }
    Err(format!(
        "--metrics-addr {addr} is reachable from other hosts and would serve every profiled \
         process's stacks to anyone: give --listen-token-file FILE (or TLS with \
         --listen-client-ca), or --insecure-listen to serve them anyway"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    #[test]
    fn stacks_need_the_token_and_metrics_only_when_asked() {
        let token = Token::new(b"0123456789abcdef0123");
        let mut access = Access {
            token: Some(token),
            metrics_need_token: false,
            tls: false,
            names: Vec::new(),
        };
        let right = headers(Some("Bearer 0123456789abcdef0123"));
        let lower = headers(Some("bearer 0123456789abcdef0123"));
        let wrong = headers(Some("Bearer 0123456789abcdef0124"));
        let prefix = headers(Some("Bearer 0123456789abcdef012"));
        let basic = headers(Some("Basic MDEyMzQ1Njc4OWFiY2RlZjAxMjM="));
        let none = headers(None);
        assert_eq!(access.admit(Page::Stacks, &right), Ok(()));
        assert_eq!(access.admit(Page::Stacks, &lower), Ok(()));
        for h in [&wrong, &prefix, &basic] {
            assert_eq!(access.admit(Page::Stacks, h), Err(Refused::WrongCredential));
        }
        assert_eq!(
            access.admit(Page::Stacks, &none),
            Err(Refused::NoCredential)
        );
        assert_eq!(access.admit(Page::Metrics, &none), Ok(()));
        assert_eq!(access.admit(Page::Open, &none), Ok(()));
        access.metrics_need_token = true;
        assert_eq!(
            access.admit(Page::Metrics, &none),
            Err(Refused::NoCredential)
        );
        assert_eq!(access.admit(Page::Metrics, &right), Ok(()));
        assert_eq!(access.admit(Page::Open, &none), Ok(()));
        // A browser's session cookie, among others; a wrong one, or the token itself as one.
        let token = access.token.clone().unwrap();
        let cookie = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(COOKIE, HeaderValue::from_str(v).unwrap());
            h
        };
        let session = cookie(&format!("theme=dark; {SESSION_COOKIE}={}", token.session()));
        assert_eq!(access.admit(Page::Stacks, &session), Ok(()));
        for wrong in [
            format!("{SESSION_COOKIE}=0123456789abcdef0123"),
            format!("{SESSION_COOKIE}={}0", token.session()),
        ] {
            assert_eq!(
                access.admit(Page::Stacks, &cookie(&wrong)),
                Err(Refused::WrongCredential),
                "{wrong}"
            );
        }
        assert_eq!(
            access.admit(Page::Stacks, &cookie("theme=dark")),
            Err(Refused::NoCredential)
        );
        assert!(!token.session().contains("0123456789abcdef0123"));
        assert!(token.is(b"0123456789abcdef0123") && !token.is(b"0123456789abcdef012"));
        let set = access.session_cookie(&token);
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && !set.contains("Secure")
        );
        access.tls = true;
        assert!(access.session_cookie(&token).ends_with("; Secure"));
        // No token: everything is open (the exposure rule decides whether that may start).
        let open = Access::default();
        assert_eq!(open.admit(Page::Stacks, &none), Ok(()));
    }

    #[test]
    fn token_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("pyfleet-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        let read = |content: &[u8]| {
            std::fs::write(&file, content).unwrap();
            Token::from_file(&file, "--listen-token-file")
        };
        let good = read(b"0123456789abcdef0123\n").unwrap();
        assert_eq!(good, Token::new(b"0123456789abcdef0123"));
        assert!(read(b"0123456789abcdef0123\r\n").is_ok());
        for bad in [
            &b"short\n"[..],
            b"has a space in it, long enough",
            b"two\nlines of token text",
            b"",
        ] {
            let e = read(bad).unwrap_err();
            assert!(
                e.starts_with("--listen-token-file ") && !e.contains('\n'),
                "{e}"
            );
        }
        let e = Token::from_file(&dir.join("absent"), "--listen-token-file").unwrap_err();
        assert!(e.contains("absent") && !e.contains('\n'), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_loopback_may_serve_stacks_without_a_credential() {
        let wide: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let other: SocketAddr = "127.0.0.2:9464".parse().unwrap();
        let v6: SocketAddr = "[::1]:9464".parse().unwrap();
        assert!(check_exposure(other, false, false, false).is_ok());
        assert!(check_exposure(v6, false, false, false).is_ok());
        let e = check_exposure(wide, false, false, false).unwrap_err();
        assert!(e.contains("--listen-token-file") && !e.contains('\n'));
        assert!(check_exposure(wide, true, false, false).is_ok());
        assert!(check_exposure(wide, false, true, false).is_ok());
        assert!(check_exposure(wide, false, false, true).is_ok());
    }

    #[test]
    fn only_addresses_localhost_and_given_names_are_hosts() {
        let names = vec!["pyfleet.example.org".to_string()];
        for host in [
            "127.0.0.1",
            "127.0.0.1:9464",
            "10.1.2.3:9464",
            "[::1]:9464",
            "[::1]",
            "localhost:9464",
            "LocalHost",
            "localhost.",
            "pyfleet.example.org:9464",
            "PYFLEET.example.org",
        ] {
            assert!(host_is_allowed(Some(host.as_bytes()), &names), "{host}");
        }
        assert!(host_is_allowed(None, &names));
        for host in [
            "rebind.attacker.example",
            "rebind.attacker.example:9464",
            "127.0.0.1.nip.io",
            "localhost.attacker.example",
            "[::1]x",
            "[zz]:1",
            "localhost:99999",
            "",
            "pyfleet.example.org.attacker.example",
        ] {
            assert!(!host_is_allowed(Some(host.as_bytes()), &names), "{host}");
        }
        assert!(!host_is_allowed(Some(b"\xff"), &names));
        assert!(is_host_name("pyfleet-1.example.org") && !is_host_name("a b") && !is_host_name(""));
    }
}
