//! TLS configurations built from PEM files (rustls with the ring provider; no OpenSSL): the
//! listener's server side, optionally requiring client certificates from a CA, and the push's
//! client side, trusting a CA file or the system's CA certificates.
//!
//! Contract: every function reads its files once, at startup, and fails with one line naming
//! the file and what is wrong with it; nothing here logs or keeps a file open.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;

/// The files of the listener's TLS, as given.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerFiles {
    /// The certificate chain, leaf first (PEM).
    pub cert: std::path::PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
    /// When set, clients must present a certificate issued by one of these CAs (PEM).
    pub client_ca: Option<std::path::PathBuf>,
}

/// The listener's TLS configuration, shared by its connections and replaced when its files
/// are reloaded (`listener::reload`): each handshake takes the configuration of its moment.
#[derive(Clone, Debug)]
pub struct ServerSlot(Arc<std::sync::RwLock<Arc<ServerConfig>>>);

impl ServerSlot {
    pub fn new(config: Arc<ServerConfig>) -> ServerSlot {
        ServerSlot(Arc::new(std::sync::RwLock::new(config)))
    }

    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, config: Arc<ServerConfig>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = config;
    }
}

/// A TLS client connection on `stream` to `host` (a name or an IP address), verified by
/// `config` (the push's and `top --connect`'s).
pub async fn connect(
    config: &Arc<ClientConfig>,
    host: &str,
    stream: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let name =
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file; none is an error.
pub fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// The CAs of a PEM file, as roots to verify peers against.
pub fn roots(path: &Path, what: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, what)? {
        roots
            .add(cert)
            .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The listener's TLS configuration (HTTP/1.1 only, as the listener speaks).
pub fn server_config(files: &ServerFiles) -> Result<Arc<ServerConfig>, String> {
    let certs = certificates(&files.cert, "--listen-tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("--listen-tls-key {}: {e}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let roots = roots(ca, "--listen-client-ca")?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| format!("--listen-client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "--listen-tls-cert {} and --listen-tls-key {}: {e}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's TLS configuration (HTTP/1.1): servers must present a certificate from the CAs
/// in `ca_file` (PEM), or else from the system's (`SSL_CERT_FILE`, `SSL_CERT_DIR`, or where
/// the distribution keeps them). `what` names the option in errors.
pub fn client_config(ca_file: Option<&Path>, what: &str) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca_file {
        Some(path) => roots(path, what)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no system CA certificate found to verify https servers with: give {what}"
                ));
            }
            roots
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
