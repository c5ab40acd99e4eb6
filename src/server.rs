//! The accept loop: TCP, then a TLS handshake with a deadline, then HTTP/1.1 or HTTP/2.
//!
//! warp 0.4 has no TLS, so this is warp's own graceful loop (`run::Graceful`) with a rustls
//! handshake in front. Every wait is bounded: the handshake, the HTTP/1.1 header read (idle
//! keep-alive connections included, so scanners and idle clients cannot pile up), and the
//! drain after a shutdown signal. The loop knows nothing of locks or of admission: it serves
//! whatever tower service it is given.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{Instrument, debug, info, info_span, warn};

/// The bounded waits of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest wait for HTTP/1.1 request headers, idle keep-alive included.
    pub header_timeout: Duration,
    /// How long open connections may take to finish after the shutdown signal.
    pub shutdown_grace: Duration,
}

/// How the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Every connection finished within the grace period.
    Complete,
    /// The grace period ran out; the remaining connections were dropped.
    TimedOut,
}

/// Serves `service` on `listener` (over TLS when `tls` is set) until `shutdown` completes,
/// then stops accepting and waits up to `limits.shutdown_grace` for open connections to finish.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: S,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Drain
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let draining = Arc::new(AtomicBool::new(false));
    let service = CloseWhenDraining {
        inner: service,
        draining: draining.clone(),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    accept_error(error).await;
                    continue;
                }
            },
            () = &mut shutdown => {
                info!("shutdown signal received; no longer accepting connections");
                break;
            }
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(service.clone());
        let watcher = graceful.watcher();
        let span = info_span!("conn", %peer);
        tokio::spawn(
            async move {
                let _ = tcp.set_nodelay(true);
                let builder = builder(&limits);
                let Some(acceptor) = acceptor else {
                    let builder = builder.http1_only();
                    let conn = builder.serve_connection(TokioIo::new(tcp), service);
                    if let Err(error) = watcher.watch(conn.into_owned()).await {
                        debug!(%error, "connection ended with an error");
                    }
                    return;
                };
                let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        debug!(%error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(timeout = ?limits.handshake_timeout, "TLS handshake timed out");
                        return;
                    }
                };
                // ALPN already chose the protocol: no sniffing read, which has no deadline.
                let h2 = tls.get_ref().1.alpn_protocol() == Some(&b"h2"[..]);
                let builder = if h2 {
                    builder.http2_only()
                } else {
                    builder.http1_only()
                };
                let conn = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(error) = watcher.watch(conn.into_owned()).await {
                    debug!(%error, "connection ended with an error");
                }
            }
            .instrument(span),
        );
    }
    drop(listener);
    // A client may have just written a request on an idle keep-alive connection: closing it
    // now would drop that request unanswered (and the API server does not retry a POST). So
    // keep serving a moment, telling each HTTP/1.1 client to close after its answer, and only
    // then close what is still idle.
    draining.store(true, Ordering::SeqCst);
    let delay = drain_delay(limits.shutdown_grace);
    tokio::time::sleep(delay).await;
    let grace = limits.shutdown_grace.saturating_sub(delay);
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => {
            info!("all connections drained");
            Drain::Complete
        }
        Err(_) => {
            warn!(grace = ?limits.shutdown_grace, "connections still open after the grace period; closing them");
            Drain::TimedOut
        }
    }
}

/// How long connections keep being served after the shutdown signal before idle ones close:
/// a tenth of the grace, between 100 ms and 2 s.
fn drain_delay(grace: Duration) -> Duration {
    (grace / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(2))
        .min(grace)
}

/// Adds `Connection: close` to HTTP/1.1 answers once the server is draining, so clients stop
/// reusing the connection instead of sending a request into one about to close.
#[derive(Clone)]
struct CloseWhenDraining<S> {
    inner: S,
    draining: Arc<AtomicBool>,
}

impl<S, B> tower_service::Service<Request<Incoming>> for CloseWhenDraining<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response<B>, Infallible>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let http1 = request.version() == http::Version::HTTP_11;
        let draining = self.draining.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            if http1 && draining.load(Ordering::SeqCst) {
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok(response)
        })
    }
}

/// HTTP/1.1 with a header-read deadline (idle keep-alive included), HTTP/2 with pings.
fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    builder
}

async fn accept_error(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    // Most likely out of file descriptors: wait for some to be released instead of spinning.
    warn!(%error, "accept failed; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
