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
                let conn = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(error) = watcher.watch(conn.into_owned()).await {
                    debug!(%error, "connection ended with an error");
                }
            }
            .instrument(span),
        );
    }
    drop(listener);
    match tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await {
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
