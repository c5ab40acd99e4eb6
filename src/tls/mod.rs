//! The serving certificate and the rustls configuration (ring, ALPN `h2` and `http/1.1`).
//! Invariant: a pair is checked (PEM parses, key matches) before the listener binds, and
//! handshakes read it from memory ([`CertStore`]), never from disk.

pub mod identity;
pub mod reload;

use std::net::IpAddr;
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
    #[error("cannot read {what} from {path}: {message}")]
    Read {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("certificate {path} {message}")]
    Certificate {
        path: PathBuf,
        /// What is wrong, worded to follow the path.
        message: String,
    },
    #[error("{cert} and {key} do not make a usable pair: {message}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot parse the serving certificate: {0}")]
    Parse(String),
    #[error(
        "the serving certificate does not cover {host} (the host of webhook.url {url}): it has {sans}; the API server would refuse every call. Make one with `kube-object-lock certs --san {host}`"
    )]
    HostNotCovered {
        host: String,
        url: String,
        sans: String,
    },
    #[error("cannot use client CA {path}: {message}")]
    ClientCa { path: PathBuf, message: String },
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
    // rustls would blame the pair ("invalid peer certificate: UnsupportedCertVersion").
    if let Some(message) = chain
        .first()
        .and_then(|leaf| identity::version_problem(leaf))
    {
        return Err(TlsError::Certificate {
            path: cert.to_owned(),
            message,
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
pub struct CertStore(RwLock<Arc<CertifiedKey>>);

impl CertStore {
    pub fn new(pair: CertifiedKey) -> Arc<Self> {
        Arc::new(CertStore(RwLock::new(Arc::new(pair))))
    }

    /// Serves `pair` from the next handshake on.
    pub fn replace(&self, pair: CertifiedKey) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
    }

    /// End of validity of the served certificate, Unix seconds (0 if unparsable).
    pub fn not_after(&self) -> i64 {
        CertInfo::of(&self.current()).map_or(0, |info| info.not_after)
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`; with
/// `client_ca`, a client certificate signed by it is required (mTLS from the API server).
pub fn server_config(
    store: Arc<CertStore>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(path)?),
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn client_verifier(
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let error = |message: String| TlsError::ClientCa {
        path: path.to_owned(),
        message,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| error(e.to_string()))? {
        roots
            .add(cert.map_err(|e| error(e.to_string()))?)
            .map_err(|e| error(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(error("no CERTIFICATE block found".to_owned()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| error(e.to_string()))
}

/// What a serving certificate covers, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
    /// End of validity, seconds since the Unix epoch.
    pub not_after: i64,
}

impl CertInfo {
    pub fn of(pair: &CertifiedKey) -> Result<CertInfo, TlsError> {
        let leaf = pair
            .cert
            .first()
            .ok_or_else(|| TlsError::Parse("empty chain".into()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| TlsError::Parse(e.to_string()))?;
        let mut info = CertInfo {
            ips: Vec::new(),
            dns: Vec::new(),
            not_after: cert.validity().not_after.timestamp(),
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        info.dns.push((*d).to_owned())
                    }
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                        let ip = <[u8; 4]>::try_from(*bytes).map(IpAddr::from);
                        info.ips
                            .extend(ip.or(<[u8; 16]>::try_from(*bytes).map(IpAddr::from)));
                    }
                    _ => {}
                }
            }
        }
        Ok(info)
    }

    /// True when a client connecting to `host` accepts this certificate's names: an IP host
    /// needs an IP SAN (no CN fallback), a DNS host a matching DNS SAN (one `*.` label allowed).
    pub fn covers(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.ips.contains(&ip);
        }
        let host = host.to_ascii_lowercase();
        self.dns.iter().any(|name| {
            let name = name.to_ascii_lowercase();
            match name.strip_prefix("*.") {
                Some(suffix) => host
                    .split_once('.')
                    .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
                None => name == host,
            }
        })
    }

    pub fn describe_sans(&self) -> String {
        let mut names: Vec<String> = self.ips.iter().map(|ip| format!("IP:{ip}")).collect();
        names.extend(self.dns.iter().map(|d| format!("DNS:{d}")));
        if names.is_empty() {
            "no subject alternative names".to_owned()
        } else {
            names.join(", ")
        }
    }
}

/// Refuses a certificate the API server would refuse when calling `url`.
pub fn check_covers_url(pair: &CertifiedKey, url: &str) -> Result<CertInfo, TlsError> {
    let info = CertInfo::of(pair)?;
    let uri: http::Uri = url
        .parse()
        .map_err(|e| TlsError::Parse(format!("webhook.url {url:?} is not a URL: {e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| TlsError::Parse(format!("webhook.url {url:?} has no host")))?;
    if !info.covers(host) {
        return Err(TlsError::HostNotCovered {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            url: url.to_owned(),
            sans: info.describe_sans(),
        });
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ips: &[&str], dns: &[&str]) -> CertInfo {
        CertInfo {
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
            dns: dns.iter().map(|d| (*d).to_owned()).collect(),
            not_after: 0,
        }
    }

    #[test]
    fn ip_hosts_need_ip_sans() {
        let cert = info(&["127.0.0.1", "::1"], &["localhost", "*.example.com"]);
        assert!(cert.covers("127.0.0.1"));
        assert!(cert.covers("[::1]"));
        assert!(!cert.covers("10.0.0.1"));
        assert!(cert.covers("localhost"));
        assert!(cert.covers("a.example.com"));
        assert!(!cert.covers("example.com"));
        assert!(!cert.covers("a.b.example.com"));
        // A DNS SAN spelling an IP does not cover the IP.
        assert!(!info(&[], &["127.0.0.1"]).covers("127.0.0.1"));
    }

    #[test]
    fn generated_certificates_cover_the_default_url() {
        let dir = tempfile::tempdir().expect("tempdir");
        crate::cli::certs::generate(&crate::cli::certs::CertsRequest {
            out: dir.path().to_owned(),
            sans: vec!["webhook.local".into()],
            days: 40,
            ca_days: 41,
            force: false,
            client: false,
        })
        .expect("certs");
        let pair =
            load_pair(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).expect("pair");
        let err =
            check_covers_url(&pair, "https://127.0.0.1:8443/validate").expect_err("no IP SAN");
        assert_eq!(
            err.to_string(),
            "the serving certificate does not cover 127.0.0.1 (the host of webhook.url https://127.0.0.1:8443/validate): it has DNS:webhook.local; the API server would refuse every call. Make one with `kube-object-lock certs --san 127.0.0.1`"
        );
        let info = check_covers_url(&pair, "https://webhook.local:8443/validate").expect("covered");
        let days_left =
            (info.not_after - time::OffsetDateTime::now_utc().unix_timestamp()) / 86_400;
        assert!((39..=40).contains(&days_left), "{days_left}");
    }
}
