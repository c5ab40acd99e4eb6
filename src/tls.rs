//! The serving certificate and the rustls configuration.
//!
//! The certificate is loaded and checked (PEM parses, key matches certificate) before the
//! listener binds, so a bad pair fails the start instead of every handshake. Handshakes read it
//! from memory through [`CertStore`], a resolver holding the current pair behind a lock, so a
//! later reload swaps it without touching connections in flight.
//!
//! ALPN offers `h2` and `http/1.1`: the API server only speaks HTTP/1.1 to webhooks and fails
//! the handshake if its protocol is missing from our list. Exactly one crypto provider, ring.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read or holds no PEM of the expected type.
    #[error("cannot read {what} from {path}: {message}")]
    Read {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The key is not usable or does not belong to the certificate.
    #[error("{cert} and {key} do not make a usable pair: {message}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The crypto provider used everywhere (kube's client uses ring too).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks a certificate chain and its private key.
pub fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|iter| iter.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Read {
            what: "certificate",
            path: cert.to_owned(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Read {
            what: "certificate",
            path: cert.to_owned(),
            message: "no CERTIFICATE block found".to_owned(),
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Read {
        what: "private key",
        path: key.to_owned(),
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, private, &provider()).map_err(|e| TlsError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
    })
}

/// The certificate handshakes use, swappable at run time.
#[derive(Debug)]
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    /// A store serving `pair`.
    pub fn new(pair: CertifiedKey) -> Arc<Self> {
        Arc::new(CertStore {
            current: RwLock::new(Arc::new(pair)),
        })
    }

    /// Serves `pair` from the next handshake on.
    pub fn replace(&self, pair: CertifiedKey) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
    }

    /// The pair currently served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`.
pub fn server_config(store: Arc<CertStore>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
