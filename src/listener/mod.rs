//! The daemon's HTTP listeners: its site (`--metrics-addr`: metrics, profiles, health) and,
//! when asked, one for the probes alone (`--health-addr`); what each answers is in
//! [`routes`], who may read it in [`access`], what every response carries in [`headers`].
//!
//! Bounded whatever its clients do: a listener holds at most its [`Limits`] of connections
//! (in all, and from one peer: [`slots`]); a connection past them takes the slot of the
//! oldest one whose request is not yet being answered (which is closed), or is closed at once
//! when every slot is being answered. The
//! TLS handshake and the request's head must arrive within [`HEADER_TIMEOUT`], and a
//! connection lives at most [`CONNECTION_TIMEOUT`] (and the profile's seconds, for a profile
//! request); one request per connection. The probes' listener has slots of its own, so no
//! client of the site can take them. Renderings run off the runtime's workers, at most
//! `routes::RENDERINGS` at once, so no request's CPU work delays another's answer.

pub mod access;
pub mod fleet_page;
pub mod headers;
pub mod http;
pub mod own_token;
pub mod reload;
pub mod routes;
pub mod slots;
pub mod snapshot_files;
pub mod windows;

pub use routes::{Exporter, Pages, Pull, MAX_PROFILE_SECONDS};
pub use slots::Limits;

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// The site's connections: in all, and from one address.
pub const SITE_LIMITS: Limits = Limits {
    total: 32,
    per_peer: 8,
};
/// The probes' listener's connections.
pub const HEALTH_LIMITS: Limits = Limits {
    total: 16,
    per_peer: 4,
};
/// Time a client has for the TLS handshake and then for its request's head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection is kept, whatever it does (beyond a profile's own seconds).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `pages` on `listener` until the runtime ends: over TLS when `tls` is set, with at
/// most `limits` connections.
pub async fn serve(
    listener: TcpListener,
    tls: Option<crate::tls::ServerSlot>,
    limits: Limits,
    pages: Pages,
) {
    let slots = slots::Slots::new(limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait, do not spin.
                tracing::warn!("listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let pages = pages.clone();
        // The configuration of this moment: a reload changes the next handshakes.
        let tls = tls
            .as_ref()
            .map(|slot| tokio_rustls::TlsAcceptor::from(slot.current()));
        tokio::spawn(async move {
            let answering = slot.answering_flag();
            let serve = async {
                match tls {
                    None => serve_connection(stream, pages, answering).await,
                    Some(acceptor) => {
                        let handshake =
                            tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream));
                        // A failed handshake (no client certificate, a wrong one, not TLS) is
                        // the client's to see; nothing is served.
                        if let Ok(Ok(stream)) = handshake.await {
                            serve_connection(stream, pages, answering).await;
                        }
                    }
                }
            };
            // A connection whose slot a newcomer took is closed.
            tokio::select! {
                _ = serve => {}
                _ = slot.evicted() => {}
            }
            drop(slot);
        });
    }
}

/// One request on `io`, within the connection's time; `answering` is set once its request's
/// head has arrived (the slot is no longer evicted).
async fn serve_connection<S>(io: S, pages: Pages, answering: slots::AnsweringFlag)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Seconds a profile request adds to the connection's time.
    let extra = Arc::new(AtomicU64::new(0));
    let granted = extra.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (pages, granted) = (pages.clone(), granted.clone());
        answering.set();
        async move {
            let response = routes::respond(&pages, &granted, req).await;
            Ok::<_, Infallible>(response)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let started = tokio::time::Instant::now();
    loop {
        let seconds = extra.load(Ordering::Relaxed);
        let until = started + CONNECTION_TIMEOUT + Duration::from_secs(seconds);
        match tokio::time::timeout_at(until, connection.as_mut()).await {
            Ok(_) => break,
            // A profile request lengthened the connection meanwhile: wait on.
            Err(_) if extra.load(Ordering::Relaxed) != seconds => continue,
            Err(_) => break,
        }
    }
}
