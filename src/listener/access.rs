//! Who may read what the listener serves.
//!
//! Contract. With a token ([`Token::from_file`]: a file only its owner may read, of at least
//! [`MIN_TOKEN_CHARS`] characters and [`MIN_TOKEN_DISTINCT`] distinct ones), every request for
//! stacks (`/debug/pprof/*`, the fleet page and its windows), and `/metrics` when
//! [`Access::metrics_need_token`] is set, must carry `Authorization: Bearer <token>`, or the
//! session cookie a browser is given at `/login` for the token; anything else is answered 401
//! with one line (the page itself with the login form). The token check takes the same time
//! whatever the request carries: both sides are hashed (SHA-256) and the digests compared in
//! constant time, so neither the token's bytes nor its length can be found by timing.
//!
//! A session is this daemon's alone: the cookie holds when it expires and an HMAC (SHA-256)
//! of that and of the token's digest under a key drawn at random when the daemon starts, so
//! it cannot be computed offline, is refused by every other daemon (same token or not), ends
//! after [`SESSION_SECONDS`] (`Max-Age`) and with a change of token. It is `HttpOnly`,
//! `SameSite=Strict`, and under TLS `Secure` and named `__Host-pyfleet_session` (no other
//! port or host can set it). A browser sends it to every port of the host, so a request it
//! admits must not come from another origin: one whose `Sec-Fetch-Site` says `same-site` or
//! `cross-site` is refused, and the API routes that take samples or list the fleet
//! ([`Page::Api`]) also need the header [`PAGE_HEADER`], which the page's `fetch` sets and an
//! `<img>` or a form of another page cannot (another origin's `fetch` setting it needs a CORS
//! preflight pyfleet never grants). Sign-in attempts are throttled ([`LOGINS_PER_SECOND`]). Client certificates, when the listener requires them, are checked by the TLS
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

/// Fewest characters a token may have (`openssl rand -hex 16` gives 32).
pub const MIN_TOKEN_CHARS: usize = 32;
/// Fewest distinct characters a token may have (32 random hex characters have about 14):
/// a long run of one character is not a secret.
pub const MIN_TOKEN_DISTINCT: usize = 8;
/// How long a browser's session lasts.
pub const SESSION_SECONDS: u64 = 12 * 3600;
/// The header the fleet page's requests carry (see the module documentation).
pub const PAGE_HEADER: &str = "x-pyfleet-page";
/// Sign-in attempts taken per second, in all (more are answered 429).
pub const LOGINS_PER_SECOND: u32 = 5;
/// Most bytes a token file may hold.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// The cookie that stands for the token in a browser, over plain HTTP.
pub const SESSION_COOKIE: &str = "pyfleet_session";
/// The cookie over TLS: the `__Host-` prefix makes the browser refuse one set by another
/// host or port, or without `Secure` and `Path=/`.
pub const TLS_SESSION_COOKIE: &str = "__Host-pyfleet_session";

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
        let group_or_others = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077;
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
        let distinct = token.iter().collect::<std::collections::HashSet<_>>().len();
        if distinct < MIN_TOKEN_DISTINCT {
            return Err(bad(format!(
                "a token needs random characters, at least {MIN_TOKEN_DISTINCT} different ones \
                 (e.g. `openssl rand -hex 32`)"
            )));
        }
        if group_or_others != 0 {
            return Err(bad(
                "others may read it: a token file is its owner's alone (`chmod 600` it)".into(),
            ));
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

    /// What a session of this token signs, for one that ends at `expires` (Unix seconds).
    fn session_message(&self, expires: u64) -> Vec<u8> {
        let mut message = b"pyfleet session\0".to_vec();
        message.extend_from_slice(self.0.as_ref());
        message.extend_from_slice(&expires.to_be_bytes());
        message
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

/// The value of cookie `name` among `headers`' cookies, if any.
fn session_cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(name.as_bytes())?.strip_prefix(b"=")
        })
}

/// The key this daemon signs its sessions with, drawn at random when it starts.
#[derive(Clone)]
pub struct SessionKey(std::sync::Arc<ring::hmac::Key>);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl Default for SessionKey {
    fn default() -> Self {
        let rng = ring::rand::SystemRandom::new();
        // The system's randomness failing is not something to go on without.
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .unwrap_or_else(|_| panic!("no randomness for the session key"));
        SessionKey(std::sync::Arc::new(key))
    }
}

/// Sign-in attempts taken in the current second, in all.
#[derive(Debug, Default, Clone)]
pub struct LoginThrottle(std::sync::Arc<std::sync::Mutex<(u64, u32)>>);

impl LoginThrottle {
    /// Whether one more attempt may be looked at now.
    pub fn take(&self) -> bool {
        let now = unix_seconds();
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if slot.0 != now {
            *slot = (now, 0);
        }
        slot.1 += 1;
        slot.1 <= LOGINS_PER_SECOND
    }
}

/// Whether a browser says the request comes from a page of another origin (`Sec-Fetch-Site`:
/// `same-site` is another port or subdomain of this host, `cross-site` another site).
fn from_another_origin(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"same-site" || v.as_bytes() == b"cross-site")
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    text.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

fn strip_prefix_ignore_case<'a>(v: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &v[prefix.len()..])
}

/// The listener's token, shared by every connection and replaced when its file is reloaded
/// (`listener::reload`): a request is judged by the token of the moment it arrives.
#[derive(Clone, Default)]
pub struct TokenSlot(std::sync::Arc<std::sync::RwLock<Option<Token>>>);

impl std::fmt::Debug for TokenSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenSlot({})",
            if self.is_some() { "set" } else { "none" }
        )
    }
}

impl TokenSlot {
    pub fn new(token: Option<Token>) -> TokenSlot {
        TokenSlot(std::sync::Arc::new(std::sync::RwLock::new(token)))
    }

    /// The token now.
    pub fn current(&self) -> Option<Token> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn is_some(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Replaces the token: sessions of the previous one end with it.
    pub fn set(&self, token: Token) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
    }
}

/// What a listener asks of its clients.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub token: TokenSlot,
    /// `/metrics` takes the token too (else it is open, as Prometheus scrapes without one).
    pub metrics_need_token: bool,
    /// The listener speaks TLS: the session cookie is `Secure`, `__Host-`.
    pub tls: bool,
    /// Host names it answers to besides IP addresses and `localhost` (lower case).
    pub names: Vec<String>,
    /// This daemon's sessions' key.
    pub session_key: SessionKey,
    /// Sign-in attempts.
    pub logins: LoginThrottle,
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
    /// A session, but the request came from another origin (or an API route without the
    /// page's header).
    AnotherOrigin,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::NoCredential => {
                "a credential is needed: send Authorization: Bearer <the token> (a browser: /login)"
            }
            Refused::WrongCredential => "the credential is not valid",
            Refused::AnotherOrigin => {
                "a browser session is honoured for the page's own requests only (same origin, \
                 and the API with its header); other clients send Authorization: Bearer"
            }
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
            Refused::AnotherOrigin => "This request did not come from this daemon's page.",
        }
    }
}

/// Which kind of page a path is, for access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Stacks of the targets: the page, its windows, past snapshots.
    Stacks,
    /// What takes samples or lists the fleet: `/debug/pprof/*`, `/api/*`, `/flamegraph.svg`
    /// (a browser session also needs the page's header, see the module documentation).
    Api,
    /// `/metrics`.
    Metrics,
    /// Health, readiness and the 404 page.
    Open,
}

impl Access {
    /// Whether a request for `page` with `headers` may be answered.
    pub fn admit(&self, page: Page, headers: &HeaderMap) -> Result<(), Refused> {
        let needed = match page {
            Page::Stacks | Page::Api => true,
            Page::Metrics => self.metrics_need_token,
            Page::Open => false,
        };
        let Some(token) = self.token.current().filter(|_| needed) else {
            return Ok(());
        };
        // Both checked (`|`, not `||`): the same work whichever was given.
        let bearer = token.admits(headers);
        let session = self.admits_session(&token, headers);
        match (bearer, session) {
            (true, _) => Ok(()),
            (false, true) if from_another_origin(headers) => Err(Refused::AnotherOrigin),
            (false, true) if page == Page::Api && !headers.contains_key(PAGE_HEADER) => {
                Err(Refused::AnotherOrigin)
            }
            (false, true) => Ok(()),
            (false, false)
                if headers.contains_key(AUTHORIZATION)
                    || session_cookie(headers, self.cookie_name()).is_some() =>
            {
                Err(Refused::WrongCredential)
            }
            (false, false) => Err(Refused::NoCredential),
        }
    }

    /// The session cookie's name on this listener.
    fn cookie_name(&self) -> &'static str {
        match self.tls {
            true => TLS_SESSION_COOKIE,
            false => SESSION_COOKIE,
        }
    }

    /// A session of `token` that ends at `expires` (Unix seconds): `EXPIRES.HMAC` in hex.
    fn session_value(&self, token: &Token, expires: u64) -> String {
        let tag = ring::hmac::sign(&self.session_key.0, &token.session_message(expires));
        format!("{expires}.{}", hex(tag.as_ref()))
    }

    /// Whether `headers` carry a live session of `token` this daemon gave.
    fn admits_session(&self, token: &Token, headers: &HeaderMap) -> bool {
        let Some(given) = session_cookie(headers, self.cookie_name()) else {
            return false;
        };
        let Some((expires, tag)) = given
            .iter()
            .position(|&b| b == b'.')
            .map(|dot| (&given[..dot], &given[dot + 1..]))
        else {
            return false;
        };
        let Some(expires) = std::str::from_utf8(expires)
            .ok()
            .and_then(|e| e.parse::<u64>().ok())
        else {
            return false;
        };
        let now = unix_seconds();
        if expires <= now || expires > now + SESSION_SECONDS {
            return false;
        }
        let Some(tag) = unhex(tag) else {
            return false;
        };
        ring::hmac::verify(&self.session_key.0, &token.session_message(expires), &tag).is_ok()
    }

    /// The `Set-Cookie` value that gives a browser a session of `token`.
    pub fn session_cookie(&self, token: &Token) -> String {
        let expires = unix_seconds() + SESSION_SECONDS;
        format!(
            "{}={}; Path=/; Max-Age={SESSION_SECONDS}; HttpOnly; SameSite=Strict{}",
            self.cookie_name(),
            self.session_value(token, expires),
            if self.tls { "; Secure" } else { "" }
        )
    }
}

/// What guards a listener, as [`check_exposure`] looks at it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Guards {
    /// A token is asked.
    pub token: bool,
    /// The listener speaks TLS.
    pub tls: bool,
    /// Clients need a certificate of the client CA (TLS too).
    pub client_certs: bool,
    /// `--insecure-listen`: stacks served without a credential, as asked.
    pub insecure: bool,
    /// `--listen-token-over-http`: the token may cross the network in the clear, as asked.
    pub token_over_http: bool,
}

/// The startup rule (see the module doc): `Err` is the one line that refuses to start.
pub fn check_exposure(addr: SocketAddr, guards: Guards) -> Result<(), String> {
    if addr.ip().is_loopback() || guards.client_certs {
        return Ok(());
    }
    if guards.token {
        if guards.tls || guards.token_over_http {
            return Ok(());
        }
        return Err(format!(
            "--metrics-addr {addr} is reachable from other hosts and its token would cross the \
             network in the clear, for anyone on the path to take: give --listen-tls-cert and \
             --listen-tls-key, or --listen-token-over-http on a network you trust"
        ));
    }
    if guards.insecure {
        return Ok(());
    }
    Err(format!(
        "--metrics-addr {addr} is reachable from other hosts and would serve every profiled \
         process's stacks to anyone: give --listen-token-file FILE (with TLS) or TLS with \
         --listen-client-ca, or --insecure-listen to serve them anyway"
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
            token: TokenSlot::new(Some(token)),
            ..Default::default()
        };
        let right = headers(Some("Bearer 0123456789abcdef0123"));
        let lower = headers(Some("bearer 0123456789abcdef0123"));
        let wrong = headers(Some("Bearer 0123456789abcdef0124"));
        let prefix = headers(Some("Bearer 0123456789abcdef012"));
        let basic = headers(Some("Basic MDEyMzQ1Njc4OWFiY2RlZjAxMjM="));
        let none = headers(None);
        for page in [Page::Stacks, Page::Api] {
            assert_eq!(access.admit(page, &right), Ok(()));
            assert_eq!(access.admit(page, &lower), Ok(()));
            for h in [&wrong, &prefix, &basic] {
                assert_eq!(access.admit(page, h), Err(Refused::WrongCredential));
            }
            assert_eq!(access.admit(page, &none), Err(Refused::NoCredential));
        }
        assert_eq!(access.admit(Page::Metrics, &none), Ok(()));
        assert_eq!(access.admit(Page::Open, &none), Ok(()));
        access.metrics_need_token = true;
        assert_eq!(
            access.admit(Page::Metrics, &none),
            Err(Refused::NoCredential)
        );
        assert_eq!(access.admit(Page::Metrics, &right), Ok(()));
        assert_eq!(access.admit(Page::Open, &none), Ok(()));
        assert!(token_is_checked(&access));
        // No token: everything is open (the exposure rule decides whether that may start).
        let open = Access::default();
        assert_eq!(open.admit(Page::Stacks, &none), Ok(()));
    }

    fn token_is_checked(access: &Access) -> bool {
        let token = access.token.current().unwrap();
        token.is(b"0123456789abcdef0123") && !token.is(b"0123456789abcdef012")
    }

    /// The value of the cookie a `Set-Cookie` line sets.
    fn set_value(set: &str) -> String {
        set.split(';')
            .next()
            .unwrap()
            .split_once('=')
            .unwrap()
            .1
            .to_string()
    }

    #[test]
    fn sessions_are_this_daemons_alone_expire_and_stay_with_the_page() {
        let token = Token::new(b"0123456789abcdef0123");
        let access = Access {
            token: TokenSlot::new(Some(token.clone())),
            ..Default::default()
        };
        let with = |cookie: &str, extra: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            h.insert(COOKIE, HeaderValue::from_str(cookie).unwrap());
            for (k, v) in extra {
                h.insert(
                    hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            h
        };
        let set = access.session_cookie(&token);
        assert!(
            set.contains("HttpOnly")
                && set.contains("SameSite=Strict")
                && set.contains(&format!("Max-Age={SESSION_SECONDS}"))
                && !set.contains("Secure"),
            "{set}"
        );
        let value = set_value(&set);
        assert!(!value.contains("0123456789abcdef0123"));
        let session = format!("theme=dark; {SESSION_COOKIE}={value}");
        assert_eq!(access.admit(Page::Stacks, &with(&session, &[])), Ok(()));
        // The page's own requests: same origin, and the API with its header.
        let page = [("sec-fetch-site", "same-origin"), (PAGE_HEADER, "1")];
        assert_eq!(access.admit(Page::Api, &with(&session, &page)), Ok(()));
        assert_eq!(
            access.admit(Page::Api, &with(&session, &page[..1])),
            Err(Refused::AnotherOrigin),
            "an <img> or a link of the page's: no header"
        );
        for site in ["same-site", "cross-site"] {
            let from = [("sec-fetch-site", site), (PAGE_HEADER, "1")];
            for p in [Page::Stacks, Page::Api] {
                assert_eq!(
                    access.admit(p, &with(&session, &from)),
                    Err(Refused::AnotherOrigin),
                    "{site}"
                );
            }
        }
        // Another daemon with the same token: its own key, so this session is not its.
        let other = Access {
            token: TokenSlot::new(Some(token.clone())),
            ..Default::default()
        };
        assert_eq!(
            other.admit(Page::Stacks, &with(&session, &[])),
            Err(Refused::WrongCredential)
        );
        // Expired, stretched past its lifetime, forged, or the token's old digest scheme.
        let now = unix_seconds();
        let mut refused = vec![
            access.session_value(&token, now - 1),
            access.session_value(&token, now + SESSION_SECONDS + 60),
            format!("{}.{}", now + 60, "00".repeat(32)),
            format!("{}0", value),
            "0123456789abcdef0123".to_string(),
            String::new(),
        ];
        let (expires, tag) = value.split_once('.').unwrap();
        refused.push(format!("{}.{tag}", expires.parse::<u64>().unwrap() + 1));
        for v in refused {
            assert_eq!(
                access.admit(Page::Stacks, &with(&format!("{SESSION_COOKIE}={v}"), &[])),
                Err(Refused::WrongCredential),
                "{v}"
            );
        }
        // Another token: its sessions end.
        let changed = Access {
            token: TokenSlot::new(Some(Token::new(b"another-token-0123456789abcdefXYZ"))),
            session_key: access.session_key.clone(),
            ..Default::default()
        };
        assert_eq!(
            changed.admit(Page::Stacks, &with(&session, &[])),
            Err(Refused::WrongCredential)
        );
        // Under TLS: Secure, and the __Host- name (the plain one is not looked at).
        let tls = Access {
            tls: true,
            ..access.clone()
        };
        let set = tls.session_cookie(&token);
        assert!(
            set.starts_with(TLS_SESSION_COOKIE) && set.ends_with("; Secure"),
            "{set}"
        );
        let tls_session = format!("{TLS_SESSION_COOKIE}={}", set_value(&set));
        assert_eq!(tls.admit(Page::Stacks, &with(&tls_session, &[])), Ok(()));
        assert_eq!(
            tls.admit(Page::Stacks, &with(&session, &[])),
            Err(Refused::NoCredential)
        );
    }

    #[test]
    fn sign_in_attempts_are_throttled() {
        let throttle = LoginThrottle::default();
        let taken = (0..100).filter(|_| throttle.take()).count();
        // Within one second, LOGINS_PER_SECOND; across a second's turn, at most twice that.
        assert!(
            (LOGINS_PER_SECOND as usize..=2 * LOGINS_PER_SECOND as usize).contains(&taken),
            "{taken}"
        );
    }

    #[test]
    fn token_files_are_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let read = |content: &[u8]| {
            std::fs::write(&file, content).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            Token::from_file(&file, "--listen-token-file")
        };
        let hex32 = b"3f1c9a7e5b2d4c6a8e0f1b3d5a7c9e1f";
        let good = read(&[&hex32[..], b"\n"].concat()).unwrap();
        assert_eq!(good, Token::new(hex32));
        assert!(read(&[&hex32[..], b"\r\n"].concat()).is_ok());
        for (bad, says) in [
            (&b"short\n"[..], "32 characters"),
            (b"0123456789abcdef0123\n", "32 characters"),
            (
                b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
                "different ones",
            ),
            (b"abababababababababababababababababab", "different ones"),
            (b"has a space in it, long enough to be one", "visible ASCII"),
            (
                b"two\nlines of token text, long enough to be one",
                "visible ASCII",
            ),
            (b"", "32 characters"),
        ] {
            let e = read(bad).unwrap_err();
            assert!(
                e.starts_with("--listen-token-file ") && !e.contains('\n') && e.contains(says),
                "{e}"
            );
        }
        // Readable by others: refused, whatever it holds.
        std::fs::write(&file, hex32).unwrap();
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Token::from_file(&file, "--listen-token-file").unwrap_err();
            assert!(e.contains("chmod 600"), "{mode:o}: {e}");
        }
        let e = Token::from_file(&dir.path().join("absent"), "--listen-token-file").unwrap_err();
        assert!(e.contains("absent") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn only_loopback_may_serve_stacks_without_a_credential() {
        let wide: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let other: SocketAddr = "127.0.0.2:9464".parse().unwrap();
        let v6: SocketAddr = "[::1]:9464".parse().unwrap();
        let none = Guards::default();
        assert!(check_exposure(other, none).is_ok());
        assert!(check_exposure(v6, none).is_ok());
        let e = check_exposure(wide, none).unwrap_err();
        assert!(e.contains("--listen-token-file") && !e.contains('\n'));
        let token = Guards {
            token: true,
            ..none
        };
        // A token in the clear off loopback only when asked; with TLS always.
        let e = check_exposure(wide, token).unwrap_err();
        assert!(e.contains("--listen-tls-cert") && !e.contains('\n'), "{e}");
        let e = check_exposure(
            wide,
            Guards {
                insecure: true,
                ..token
            },
        )
        .unwrap_err();
        assert!(e.contains("--listen-token-over-http"), "{e}");
        assert!(check_exposure(wide, Guards { tls: true, ..token }).is_ok());
        assert!(check_exposure(
            wide,
            Guards {
                token_over_http: true,
                ..token
            }
        )
        .is_ok());
        assert!(check_exposure(v6, token).is_ok());
        let certs = Guards {
            tls: true,
            client_certs: true,
            ..none
        };
        assert!(check_exposure(wide, certs).is_ok());
        assert!(check_exposure(
            wide,
            Guards {
                insecure: true,
                ..none
            }
        )
        .is_ok());
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
