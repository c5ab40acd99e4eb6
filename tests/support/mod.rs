//! Shared test helpers: certificates made per test, the real server on 127.0.0.1:0, and real
//! HTTPS clients (HTTP/1.1 as the API server speaks it, and HTTP/2).
#![allow(dead_code)]

pub mod fake_apiserver;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube_object_lock::app::{Source, Webhook};
use kube_object_lock::cli::certs::{CertsRequest, generate};
use kube_object_lock::metrics::Metrics;
use kube_object_lock::server::Drain;
use kube_object_lock::settings::Settings;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Installs ring as the process-wide provider, as `main` does.
pub fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A CA and serving certificate in a temporary directory.
pub struct Certs {
    pub dir: tempfile::TempDir,
}

impl Certs {
    pub fn new() -> Certs {
        Certs::generate(false)
    }

    /// With a client CA and an API-server client certificate too.
    pub fn with_client() -> Certs {
        Certs::generate(true)
    }

    fn generate(client: bool) -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        generate(&CertsRequest {
            out: dir.path().to_owned(),
            sans: vec![],
            days: 1,
            ca_days: 2,
            force: false,
            client,
        })
        .expect("certificates");
        Certs { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

/// Reads a fixture captured from a real API server.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The real webhook, served in this process.
pub struct TestServer {
    pub addr: SocketAddr,
    pub certs: Certs,
    /// Sends what SIGHUP sends in the binary: reload the certificate now.
    pub reload: tokio::sync::mpsc::Sender<()>,
    /// Where `/metrics` is served (plain HTTP).
    pub metrics_addr: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Drain>>,
}

impl TestServer {
    /// Starts the webhook with the given lock source; `tune` adjusts the settings.
    pub async fn start(source: Source, tune: impl FnOnce(&mut Settings)) -> TestServer {
        TestServer::start_with(Certs::new(), source, tune).await
    }

    /// Starts the webhook serving `certs`.
    pub async fn start_with(
        certs: Certs,
        source: Source,
        tune: impl FnOnce(&mut Settings),
    ) -> TestServer {
        TestServer::start_full(certs, source, Arc::new(Metrics::new()), tune).await
    }

    /// Starts the webhook counting into `metrics` (give the source `metrics.source` too).
    pub async fn start_full(
        certs: Certs,
        source: Source,
        metrics: Arc<Metrics>,
        tune: impl FnOnce(&mut Settings),
    ) -> TestServer {
        init();
        let mut settings = Settings::default();
        settings.server.listen = "127.0.0.1:0".parse().expect("addr");
        settings.tls.cert = Some(certs.path("tls.crt"));
        settings.tls.key = Some(certs.path("tls.key"));
        settings.metrics.listen = "127.0.0.1:0".to_owned();
        tune(&mut settings);
        let webhook = Webhook::bind(settings, Some(source), metrics)
            .await
            .expect("webhook binds");
        let addr = webhook.local_addr();
        let metrics_addr = webhook.metrics_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let (reload, reloads) = tokio::sync::mpsc::channel(1);
        let handle = tokio::spawn(webhook.run(
            async {
                let _ = rx.await;
            },
            reloads,
        ));
        TestServer {
            addr,
            certs,
            reload,
            metrics_addr,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    /// Starts the webhook on the files source, with `yaml` as the only lock file.
    pub async fn with_lock_files(yaml: &str) -> (TestServer, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("locks.yaml"), yaml).expect("write locks");
        let mut settings = Settings::default();
        settings.locks.dir = Some(dir.path().to_owned());
        settings.locks.poll_interval = Duration::from_millis(100);
        let source = kube_object_lock::app::lock_source(&settings, true, Default::default())
            .await
            .expect("files source");
        let server = TestServer::start(source, |_| {}).await;
        (server, dir)
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// A client speaking only HTTP/1.1 (ALPN `http/1.1`), as the API server does.
    pub fn http1(&self) -> HttpsClient {
        HttpsClient::new(&self.certs.path("ca.crt"), Protocol::Http1)
    }

    /// A client speaking only HTTP/2 (ALPN `h2`).
    pub fn http2(&self) -> HttpsClient {
        HttpsClient::new(&self.certs.path("ca.crt"), Protocol::Http2)
    }

    /// Signals shutdown without waiting for the drain ([`TestServer::stop`] waits).
    pub fn signal_stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// True once the server has stopped (drain finished).
    pub fn finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Signals shutdown and waits for the drain.
    pub async fn stop(mut self) -> Drain {
        self.signal_stop();
        self.handle
            .take()
            .expect("running")
            .await
            .expect("server task")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// A client trusting the test CA.
pub struct HttpsClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// A response: status, headers and body.
pub struct Reply {
    pub status: u16,
    pub version: http::Version,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// A rustls client configuration trusting `ca`.
pub fn client_tls(ca: &Path, alpn: &[&[u8]]) -> rustls::ClientConfig {
    client_tls_auth(ca, alpn, None)
}

/// A rustls client configuration trusting `ca`, presenting `identity` (cert, key files) if any.
pub fn client_tls_auth(
    ca: &Path,
    alpn: &[&[u8]],
    identity: Option<(&Path, &Path)>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("ca file") {
        roots.add(cert.expect("ca cert")).expect("add ca");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let mut config = match identity {
        None => config.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .expect("client cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("client cert");
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).expect("client key");
            config
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

impl HttpsClient {
    pub fn new(ca: &Path, protocol: Protocol) -> HttpsClient {
        // hyper-rustls sets ALPN from the enabled protocols: `http/1.1` only, or `h2` only.
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_tls(ca, &[]))
            .https_only();
        let connector = match protocol {
            Protocol::Http1 => builder.enable_http1().build(),
            Protocol::Http2 => builder.enable_http2().build(),
        };
        let mut client = Client::builder(TokioExecutor::new());
        if protocol == Protocol::Http2 {
            client.http2_only(true);
        }
        HttpsClient {
            client: client.build(connector),
        }
    }

    /// Sends a request and reads the whole response (bounded by 10 s so a hang fails the test).
    pub async fn send(&self, request: http::Request<Full<Bytes>>) -> Reply {
        let work = async {
            let response = self.client.request(request).await.expect("request sent");
            let (head, body) = response.into_parts();
            let body = body.collect().await.expect("body read").to_bytes().to_vec();
            let (status, version) = (head.status.as_u16(), head.version);
            let headers = head.headers;
            Reply {
                status,
                version,
                headers,
                body,
            }
        };
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .expect("the server answered within 10 s")
    }

    /// POSTs a JSON body to `url`.
    pub async fn post_json(&self, url: &str, body: Vec<u8>) -> Reply {
        let request = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        self.send(request).await
    }

    pub async fn get(&self, url: &str) -> Reply {
        let request = http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .expect("request");
        self.send(request).await
    }
}

impl TestServer {
    /// POSTs the AdmissionReview `body` to `/validate` (with the API server's `?timeout=10s`)
    /// over HTTP/1.1, as the API server does, and returns the answer's `response`.
    pub async fn admission_response(&self, body: Vec<u8>) -> serde_json::Value {
        let reply = self
            .http1()
            .post_json(&self.url("/validate?timeout=10s"), body)
            .await;
        assert_eq!(reply.status, 200);
        reply.json()["response"].clone()
    }

    /// Scrapes `/metrics` over plain HTTP/1.1.
    pub async fn scrape(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.metrics_addr.expect("metrics are served");
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut out))
            .await
            .expect("metrics answered in time")
            .expect("read");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out
    }
}

/// The value of the sample `series` (exact match of name and labels), or 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// A Lock / ClusterLock YAML document.
pub fn lock_yaml(namespace: Option<&str>, name: &str, reason: Option<&str>) -> String {
    let (kind, ns) = match namespace {
        Some(ns) => ("Lock", format!("\n  namespace: {ns}")),
        None => ("ClusterLock", String::new()),
    };
    let spec = reason
        .map(|r| format!("spec:\n  reason: {r}\n"))
        .unwrap_or_default();
    format!(
        "---\napiVersion: objectlock.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}{ns}\n{spec}"
    )
}

/// The lock source's settings for tests that only need it to work: a long fallback TTL, the
/// default staleness bound.
pub fn cache_config() -> kube_object_lock::locks::apiserver::CacheConfig {
    kube_object_lock::locks::apiserver::CacheConfig {
        ttl: Duration::from_secs(60),
        max_namespaces: 100,
        stale_after: Duration::from_secs(3),
    }
}

/// The lock view the status and event writers read, built as the service builds it: the lock
/// index fed by its watch on `client`, followed ([`kube_object_lock::status::view`]). The future
/// runs both until dropped.
pub fn lock_view(
    client: kube::Client,
) -> (
    tokio::sync::watch::Receiver<kube_object_lock::status::LockSnapshot>,
    impl Future<Output = ()> + Send + 'static,
) {
    let source = kube_object_lock::locks::apiserver::KubeSource::new(
        client,
        cache_config(),
        Default::default(),
    );
    let (view, follow) = kube_object_lock::status::view::follow(source.index().clone());
    let watch = source.watch();
    (view, async move {
        futures::future::join(watch, follow).await;
    })
}

/// Polls `read` until `check` holds (10 s at most: a hang fails, a slow machine does not).
pub async fn until<T: std::fmt::Debug>(
    what: &str,
    read: impl Fn() -> T,
    check: impl Fn(&T) -> bool,
) -> T {
    until_async(what, || std::future::ready(read()), check).await
}

/// Like [`until`], for a read that awaits (a request, a scrape).
pub async fn until_async<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    what: &str,
    read: impl Fn() -> F,
    check: impl Fn(&T) -> bool,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let value = read().await;
        if check(&value) {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: never happened; last: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
