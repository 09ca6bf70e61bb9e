//! Free ports and plain HTTP requests to a daemon's listener.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// `GET path` over HTTP/1.0 as a holder of the tests' state-directory token (what a daemon
/// on loopback given no credential asks for): (status, body), or None if the connection
/// fails.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_with_token(port, path, Some(&super::harness_token()))
}

/// `GET path` over HTTP/1.0 with `Authorization: Bearer TOKEN` when given.
pub fn http_get_with_token(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    http_get_with_headers(port, path, &format!("Host: 127.0.0.1:{port}\r\n{auth}"))
}

/// `GET path` over HTTP/1.0 with exactly these header lines (each ending in CRLF).
pub fn http_get_with_headers(port: u16, path: &str, headers: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n{headers}\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}
