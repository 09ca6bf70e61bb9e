//! `pyfleet top --connect ADDR`: a running daemon's samples, pulled from its listener as pprof
//! profiles of one second (`/debug/pprof/profile?seconds=1`, with a bearer token when given)
//! and turned back into snapshots (`output::pprof::snapshot`).
//!
//! Plain HTTP (`HOST:PORT`, `http://HOST:PORT`) or TLS (`https://HOST:PORT`: the listener's
//! certificate verified against the CA file given, or the system's, for the host named);
//! no client certificate is presented. Bounded: an answer of at most [`MAX_ANSWER`] bytes,
//! within the pull's seconds and [`ANSWER_GRACE`].

use crate::output::pprof;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use pyfleet_actors::Snapshot;
use std::sync::Arc;
use std::time::Duration;

/// Longest answer read.
pub const MAX_ANSWER: usize = 64 << 20;
/// How long past the pull's seconds an answer may take.
pub const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// A daemon's listener.
#[derive(Debug, Clone)]
pub struct Remote {
    authority: String,
    /// The host of the authority, for TLS's server name.
    host: String,
    token: Option<String>,
    /// With `https://`: the TLS client configuration.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Remote {
    /// `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`; `token`: the bearer token the
    /// listener asks for; `tls`: the TLS client configuration an `https` address needs.
    pub fn new(
        addr: &str,
        token: Option<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Remote, String> {
        let (authority, https) = match addr.split_once("://") {
            None => (addr, false),
            Some(("http", rest)) => (rest.trim_end_matches('/'), false),
            Some(("https", rest)) => (rest.trim_end_matches('/'), true),
            Some((scheme, _)) => {
                return Err(format!(
                    "--connect {}: {} is not a scheme of the listener's (http or https)",
                    addr.escape_debug(),
                    scheme.escape_debug()
                ))
            }
        };
        let host = authority
            .rsplit_once(':')
            .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
            .unwrap_or("");
        if authority.contains('/') || host.is_empty() {
            return Err(format!(
                "--connect {}: give the daemon's listener as HOST:PORT (its --metrics-addr)",
                addr.escape_debug()
            ));
        }
        let tls = match (https, tls) {
            (true, Some(config)) => Some(config),
            (true, None) => {
                return Err(format!("--connect {addr}: https needs a TLS configuration"))
            }
            (false, _) => None,
        };
        Ok(Remote {
            authority: authority.to_string(),
            host: host.to_string(),
            token,
            tls,
        })
    }

    /// Whether the address asked for TLS.
    pub fn is_https(addr: &str) -> bool {
        addr.starts_with("https://")
    }

    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// What the daemon counts during the next `seconds`.
    pub async fn pull(&self, seconds: u64) -> Result<Snapshot, String> {
        let wait = Duration::from_secs(seconds) + ANSWER_GRACE;
        let body = tokio::time::timeout(wait, self.get(seconds))
            .await
            .map_err(|_| format!("{}: no answer within {} s", self.authority, wait.as_secs()))??;
        let profile = pprof::decode(&body)?;
        Ok(pprof::snapshot(&profile, Duration::from_secs(seconds)))
    }

    async fn get(&self, seconds: u64) -> Result<Vec<u8>, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", self.authority);
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| at(&e))?;
        match &self.tls {
            None => self.get_on(stream, seconds).await,
            Some(config) => {
                let stream = crate::tls::connect(config, &self.host, stream)
                    .await
                    .map_err(|e| at(&e))?;
                self.get_on(stream, seconds).await
            }
        }
    }

    /// The profile's request on an open connection (plain or TLS), its answer.
    async fn get_on<S>(&self, stream: S, seconds: u64) -> Result<Vec<u8>, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", self.authority);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| at(&e))?;
        let connection = tokio::spawn(connection);
        let mut request = hyper::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
            .header(hyper::header::HOST, &self.authority)
            .header(
                hyper::header::USER_AGENT,
                concat!("pyfleet/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Empty::<Bytes>::new()).map_err(|e| at(&e))?;
        let response = sender.send_request(request).await.map_err(|e| at(&e))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| at(&e))?
            .to_bytes();
        connection.abort();
        match status.as_u16() {
            200 => Ok(body.to_vec()),
            401 | 403 => Err(format!(
                "{}: the listener refused the request ({status}): give its token with \
                 --token-file",
                self.authority
            )),
            _ => Err(format!(
                "{}: {status}: {}",
                self.authority,
                crate::output::for_terminal(&String::from_utf8_lossy(&body[..body.len().min(200)]))
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_host_and_port_over_http_or_https() {
        assert_eq!(
            Remote::new("127.0.0.1:9464", None, None)
                .unwrap()
                .authority(),
            "127.0.0.1:9464"
        );
        assert_eq!(
            Remote::new("http://node-3:9464/", None, None)
                .unwrap()
                .authority(),
            "node-3:9464"
        );
        assert!(Remote::new("https://node-3:9464", None, None)
            .unwrap_err()
            .contains("https"));
        let tls = crate::tls::client_config(None, "--ca-file").ok();
        if let Some(tls) = tls {
            let remote = Remote::new("https://[::1]:9464", None, Some(tls)).unwrap();
            assert_eq!(
                (remote.authority(), remote.host.as_str()),
                ("[::1]:9464", "::1")
            );
        }
        assert!(Remote::new("ftp://node-3:9464", None, None).is_err());
        assert!(Remote::new("node-3", None, None).is_err());
        assert!(Remote::new("http://node-3:9464/metrics", None, None).is_err());
    }
}
