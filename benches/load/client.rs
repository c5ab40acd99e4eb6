//! The load generator: C connections, each a hyper HTTP/1.1 client connection over
//! tokio-rustls (ALPN `http/1.1` only, no TLS session resumption: what the API server's Go
//! client does), sending `POST /validate?timeout=10s` back to back on keep-alive connections,
//! or on a new connection per request.
//!
//! Closed loop: each connection sends its next request when the previous answer is read, as the
//! API server's admission calls do. Latency is from just before sending (or connecting, for a
//! new connection per request) to the last byte of the answer, recorded in microseconds in one
//! HdrHistogram per connection, merged at the end. Requests that start during the warm-up are
//! not counted; requests that start before the end of the measured window are.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{CONTENT_TYPE, HOST};
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::client::Resumption;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The API server's own timeout for one admission call (and our bound on one request).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest warm-up, whatever is left of the first pass over the bodies.
const MAX_WARMUP: Duration = Duration::from_secs(60);
/// Distinct error messages kept for the report.
const ERROR_SAMPLES: usize = 5;

/// How to load a server.
#[derive(Debug, Clone)]
pub struct Plan {
    pub connections: usize,
    /// Shortest warm-up.
    pub warmup: Duration,
    /// Measured window.
    pub duration: Duration,
    pub new_connection: bool,
    /// Slices the window is cut into, alternating between the servers.
    pub rounds: usize,
    /// The warm-up also lasts until every body has been sent once.
    pub full_pass: bool,
}

/// Where and how to connect.
pub struct Target {
    pub addr: SocketAddr,
    host: String,
    tls: TlsConnector,
    server_name: ServerName<'static>,
}

impl Target {
    /// A target on 127.0.0.1 trusting the CA in `ca`.
    pub fn new(addr: SocketAddr, ca: &Path) -> anyhow::Result<Target> {
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| anyhow::anyhow!("{}: {e:?}", ca.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| anyhow::anyhow!("{}: {e:?}", ca.display()))?;
            roots.add(cert).context("CA certificate")?;
        }
        let mut config = ClientConfig::builder_with_provider(kube_object_lock::tls::provider())
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // What the API server's webhook client offers.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Go's http.Transport has no client session cache unless one is configured: every new
        // connection is a full handshake.
        config.resumption = Resumption::disabled();
        Ok(Target {
            addr,
            host: addr.to_string(),
            tls: TlsConnector::from(Arc::new(config)),
            server_name: ServerName::from(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        })
    }

    /// A new keep-alive connection.
    pub async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let tcp = TcpStream::connect(self.addr).await.context("connect")?;
        tcp.set_nodelay(true).context("TCP_NODELAY")?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// `GET path` on a new connection: the status, or an error.
    pub async fn get(&self, path: &str) -> anyhow::Result<u16> {
        let (sender, connection) = {
            let tcp = TcpStream::connect(self.addr).await.context("connect")?;
            let tls = self.tls.connect(self.server_name.clone(), tcp).await?;
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?
        };
        let mut sender: SendRequest<Empty<Bytes>> = sender;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = http::Request::get(path)
            .header(HOST, &self.host)
            .body(Empty::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        Ok(status)
    }

    /// Sends one review on `sender`; true when the answer refuses it.
    pub async fn denied(
        &self,
        sender: &mut SendRequest<Full<Bytes>>,
        body: Bytes,
    ) -> anyhow::Result<bool> {
        sender.ready().await.context("connection")?;
        let response = sender.send_request(self.request(body)).await?;
        anyhow::ensure!(response.status() == 200, "HTTP {}", response.status());
        let body = response.into_body().collect().await?.to_bytes();
        Ok(contains(&body, br#""allowed":false"#))
    }

    fn request(&self, body: Bytes) -> http::Request<Full<Bytes>> {
        http::Request::post("/validate?timeout=10s")
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("a valid request: constant method, path and headers")
    }
}

/// A point in time as seen from the server and the machine: CPU times and API calls so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Server CPU time (user + system), in clock ticks.
    pub cpu_ticks: Option<u64>,
    /// This process's CPU time (the load generator and the fake API server), in clock ticks.
    pub own_cpu_ticks: Option<u64>,
    /// All CPUs of the machine: (busy, total) clock ticks from /proc/stat.
    pub machine_ticks: Option<(u64, u64)>,
    /// Requests the fake API server has received.
    pub api_requests: Option<usize>,
}

/// Takes a [`Sample`].
pub type Probe = Arc<dyn Fn() -> Sample + Send + Sync>;

/// What one run measured.
pub struct Outcome {
    /// Successful (HTTP 200) answers to requests started in the measured window.
    pub ok: u64,
    /// Failed requests started in the measured window (connection errors, timeouts, non-200).
    pub errors: u64,
    /// Answers with `"allowed":false`.
    pub denied: u64,
    /// The measured window, as it really lasted.
    pub window: Duration,
    /// How long the warm-up lasted.
    pub warmup: Duration,
    /// Latency of the successful answers, in microseconds.
    pub latency: Histogram<u64>,
    /// Distinct error messages (first few).
    pub error_samples: BTreeSet<String>,
    /// Each measured window: its start and its end (several when runs are merged).
    pub windows: Vec<(Sample, Sample)>,
    /// Before the (first) warm-up.
    pub before: Sample,
}

impl Outcome {
    /// Adds a later run against the same server.
    pub fn merge(&mut self, later: Outcome) {
        self.ok += later.ok;
        self.errors += later.errors;
        self.denied += later.denied;
        self.window += later.window;
        self.latency
            .add(&later.latency)
            .expect("histograms with the same bounds merge");
        self.error_samples.extend(later.error_samples);
        self.windows.extend(later.windows);
    }

    /// The sum over the windows of `end - start` of one counter.
    pub fn delta(&self, counter: impl Fn(&Sample) -> Option<u64>) -> Option<u64> {
        self.windows.iter().try_fold(0, |sum, (start, end)| {
            Some(sum + counter(end)?.saturating_sub(counter(start)?))
        })
    }
}

/// The phases of a run, shared by every connection.
struct Clock {
    origin: Instant,
    /// Microseconds from `origin` to the start of the measured window; `u64::MAX` until then.
    start_us: AtomicU64,
    duration: Duration,
    /// Requests sent so far (the warm-up lasts at least one pass over the bodies).
    sent: AtomicU64,
    /// The next body, round-robin across connections.
    next: AtomicUsize,
}

enum Phase {
    Warmup,
    Measure,
    Done,
}

impl Clock {
    fn phase(&self, now: Instant) -> Phase {
        let start = self.start_us.load(Ordering::Acquire);
        if start == u64::MAX {
            return Phase::Warmup;
        }
        let since_origin = now.duration_since(self.origin);
        let start = Duration::from_micros(start);
        if since_origin < start {
            Phase::Warmup
        } else if since_origin < start + self.duration {
            Phase::Measure
        } else {
            Phase::Done
        }
    }
}

struct Worker {
    ok: u64,
    errors: u64,
    denied: u64,
    latency: Histogram<u64>,
    error_samples: BTreeSet<String>,
}

/// Loads `target` with `bodies` following `plan`; `probe` is sampled before the warm-up, at the
/// start of the measured window and at its end.
pub async fn run(
    target: Arc<Target>,
    bodies: Arc<Vec<Bytes>>,
    plan: &Plan,
    probe: Probe,
) -> Outcome {
    let before = probe();
    let clock = Arc::new(Clock {
        origin: Instant::now(),
        start_us: AtomicU64::new(u64::MAX),
        duration: plan.duration,
        sent: AtomicU64::new(0),
        next: AtomicUsize::new(0),
    });
    let workers: Vec<_> = (0..plan.connections)
        .map(|_| {
            let (target, bodies, clock) = (target.clone(), bodies.clone(), clock.clone());
            tokio::spawn(worker(target, bodies, clock, plan.new_connection))
        })
        .collect();

    // The warm-up: at least `plan.warmup`, and until every body has been sent once.
    let pass = if plan.full_pass {
        bodies.len() as u64
    } else {
        0
    };
    let min_end = clock.origin + plan.warmup;
    let max_end = clock.origin + plan.warmup.max(MAX_WARMUP);
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = Instant::now();
        if now >= max_end || (now >= min_end && clock.sent.load(Ordering::Relaxed) >= pass) {
            break;
        }
    }
    let start = probe();
    let started = Instant::now();
    let start_us = started.duration_since(clock.origin).as_micros() as u64;
    clock.start_us.store(start_us, Ordering::Release);
    tokio::time::sleep_until((started + plan.duration).into()).await;
    let end = probe();

    let mut outcome = Outcome {
        ok: 0,
        errors: 0,
        denied: 0,
        window: plan.duration,
        warmup: started.duration_since(clock.origin),
        latency: new_histogram(),
        error_samples: BTreeSet::new(),
        windows: vec![(start, end)],
        before,
    };
    for worker in workers {
        match worker.await {
            Ok(w) => {
                outcome.ok += w.ok;
                outcome.errors += w.errors;
                outcome.denied += w.denied;
                outcome
                    .latency
                    .add(&w.latency)
                    .expect("histograms with the same bounds merge");
                outcome.error_samples.extend(w.error_samples);
            }
            Err(e) => {
                outcome.errors += 1;
                outcome
                    .error_samples
                    .insert(format!("load worker failed: {e}"));
            }
        }
    }
    outcome.error_samples = outcome
        .error_samples
        .into_iter()
        .take(ERROR_SAMPLES)
        .collect();
    outcome
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs to 1 min, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

async fn worker(
    target: Arc<Target>,
    bodies: Arc<Vec<Bytes>>,
    clock: Arc<Clock>,
    fresh: bool,
) -> Worker {
    let mut w = Worker {
        ok: 0,
        errors: 0,
        denied: 0,
        latency: new_histogram(),
        error_samples: BTreeSet::new(),
    };
    let mut connection: Option<SendRequest<Full<Bytes>>> = None;
    loop {
        let started = Instant::now();
        let measuring = match clock.phase(started) {
            Phase::Done => break,
            Phase::Warmup => false,
            Phase::Measure => true,
        };
        let body = bodies[clock.next.fetch_add(1, Ordering::Relaxed) % bodies.len()].clone();
        clock.sent.fetch_add(1, Ordering::Relaxed);
        let request = target.request(body);
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let sender = match &mut connection {
                Some(sender) => sender,
                None => connection.insert(target.connect().await?),
            };
            sender.ready().await.context("connection not ready")?;
            let response = sender.send_request(request).await.context("send")?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .context("read answer")?;
            anyhow::Ok((status, body.to_bytes()))
        })
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}")));
        let elapsed = started.elapsed();
        let failure = match answer {
            Ok((status, body)) if status == http::StatusCode::OK => {
                if measuring {
                    w.ok += 1;
                    w.latency
                        .saturating_record(elapsed.as_micros().max(1) as u64);
                    if contains(&body, br#""allowed":false"#) {
                        w.denied += 1;
                    }
                }
                None
            }
            Ok((status, body)) => Some(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )),
            Err(e) => Some(format!("{e:#}")),
        };
        if let Some(message) = failure {
            connection = None;
            if measuring {
                w.errors += 1;
                if w.error_samples.len() < ERROR_SAMPLES {
                    w.error_samples.insert(message);
                }
            }
            // Do not spin on a server that refuses connections.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if fresh {
            connection = None;
        }
    }
    w
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
