//! The accept loop: TCP, a TLS handshake with a deadline, then HTTP/1.1 or HTTP/2 (chosen by
//! ALPN) through hyper-util, drained with hyper-util's graceful shutdown.
//!
//! Invariant: every wait is bounded (handshake, headers, idle keep-alive, drain); why the
//! deadlines are kept here rather than by hyper: `docs/design/serving.md`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::settings::ServerSettings;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    Complete,
    /// The grace period ran out; the remaining connections were dropped.
    TimedOut,
}

/// Serves until `shutdown` completes, then drains for up to `server.shutdown_grace`.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: S,
    limits: &ServerSettings,
    shutdown: impl Future<Output = ()>,
) -> Drain
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limits = Arc::new(limits.clone());
    let acceptor = tls.map(TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let draining = Arc::new(AtomicBool::new(false));
    let idle = Arc::new(Semaphore::new(limits.max_idle_connections));
    // Dropped at the end: aborts what the grace period did not see finish.
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
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
        let watcher = graceful.watcher();
        let (acceptor, limits) = (acceptor.clone(), limits.clone());
        let (draining, idle) = (draining.clone(), idle.clone());
        let service = service.clone();
        let connection = async move {
            let _ = tcp.set_nodelay(true);
            let timeout = limits.handshake_timeout;
            let (io, h2) = match acceptor {
                None => (Either::Left(tcp), false),
                Some(acceptor) => match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                    // ALPN already chose the protocol: no sniffing read, which has no deadline.
                    Ok(Ok(tls)) => {
                        let h2 = tls.get_ref().1.alpn_protocol() == Some(&b"h2"[..]);
                        (Either::Right(tls), h2)
                    }
                    Ok(Err(error)) => return debug!(%error, "TLS handshake failed"),
                    Err(_) => return debug!("TLS handshake timed out"),
                },
            };
            let tracker = Arc::new(Tracker::new(limits, idle, h2));
            let service = TowerToHyperService::new(ConnService {
                inner: service,
                draining,
                tracker: tracker.clone(),
            });
            // Only reads are tracked: the write half goes to hyper as it is.
            let (read, write) = tokio::io::split(io);
            let io = TokioIo::new(tokio::io::join(Tracked::new(read, tracker), write));
            let builder = if h2 {
                builder().http2_only()
            } else {
                builder().http1_only()
            };
            if let Err(error) = watcher.watch(builder.serve_connection(io, service)).await {
                debug!(%error, "connection ended with an error");
            }
        };
        connections.spawn(connection.instrument(info_span!("conn", %peer)));
    }
    drop(listener);
    // An idle connection may carry a request just sent (the API server does not retry a POST):
    // keep serving a moment with `Connection: close`, then close what is still idle.
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

/// How long serving goes on after the shutdown signal before idle connections close.
fn drain_delay(grace: Duration) -> Duration {
    (grace / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(2))
        .min(grace)
}

/// Where a connection is in its life, and so which deadline applies.
enum Phase {
    /// Waiting for a request's headers since then (`header_timeout`).
    Headers(Instant),
    /// This many requests are being answered (bounded by `body_timeout` and the service).
    Busy(usize),
    /// Idle since then: `idle_timeout` with an idle slot, else until the answer is read.
    Idle {
        since: Instant,
        slot: Option<OwnedSemaphorePermit>,
    },
}

#[derive(Debug, Clone, Copy)]
enum Expiry {
    /// A request's headers did not arrive in time: the connection is dropped.
    Headers,
    /// The connection was idle too long: it is closed as the client would close it.
    Idle,
}

/// The phase of one connection, moved by [`Tracked`] and [`ConnService`].
struct Tracker {
    state: Mutex<(Phase, Option<Waker>)>,
    limits: Arc<ServerSettings>,
    idle: Arc<Semaphore>,
    /// HTTP/2 reads frames (pings, window updates) while idle, so reads do not start requests.
    h2: bool,
}

impl Tracker {
    fn new(limits: Arc<ServerSettings>, idle: Arc<Semaphore>, h2: bool) -> Tracker {
        Tracker {
            state: Mutex::new((Phase::Headers(Instant::now()), None)),
            limits,
            idle,
            h2,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Option<Waker>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived: on an idle HTTP/1.1 connection, a request has started.
    fn read(&self) {
        let mut state = self.lock();
        if !self.h2 && matches!(state.0, Phase::Idle { .. }) {
            state.0 = Phase::Headers(Instant::now());
        }
    }

    /// A request's headers are in: the service is called.
    fn request(&self) {
        let mut state = self.lock();
        state.0 = match state.0 {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Headers(_) | Phase::Idle { .. } => Phase::Busy(1),
        };
    }

    /// A request was answered or abandoned; false when idle without a slot (to be closed).
    fn answered(&self) -> bool {
        let mut state = self.lock();
        match state.0 {
            Phase::Busy(n) if n > 1 => state.0 = Phase::Busy(n - 1),
            Phase::Busy(_) => {
                let slot = self.idle.clone().try_acquire_owned().ok();
                let kept = slot.is_some();
                let since = Instant::now();
                state.0 = Phase::Idle { since, slot };
                // The reader waits with no deadline while busy: let it take the idle one.
                if let Some(reader) = state.1.take() {
                    reader.wake();
                }
                return kept;
            }
            _ => {}
        }
        true
    }

    /// The current deadline and what passing it means; `reader` is woken when it changes.
    fn deadline(&self, reader: &Waker) -> Option<(Instant, Expiry)> {
        let mut state = self.lock();
        state.1 = Some(reader.clone());
        let limits = &self.limits;
        match &state.0 {
            Phase::Headers(since) => Some((*since + limits.header_timeout, Expiry::Headers)),
            Phase::Busy(_) => None,
            Phase::Idle { since, slot } => {
                let wait = match slot {
                    Some(_) => limits.idle_timeout,
                    None => limits.header_timeout,
                };
                Some((*since + wait, Expiry::Idle))
            }
        }
    }
}

/// An I/O stream reporting reads to its [`Tracker`]; past the deadline it ends reading: end of
/// stream when idle (a clean close), an error when a request's headers are late.
struct Tracked<T> {
    io: T,
    tracker: Arc<Tracker>,
    timer: Pin<Box<Sleep>>,
}

impl<T> Tracked<T> {
    fn new(io: T, tracker: Arc<Tracker>) -> Tracked<T> {
        let timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        Tracked { io, tracker, timer }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.tracker.read();
        }
        if polled.is_ready() {
            return polled;
        }
        let Some((deadline, expiry)) = this.tracker.deadline(cx.waker()) else {
            return polled;
        };
        if this.timer.deadline() != deadline {
            this.timer.as_mut().reset(deadline);
        }
        if this.timer.as_mut().poll(cx).is_pending() {
            return polled;
        }
        match expiry {
            Expiry::Idle => {
                debug!("closing an idle keep-alive connection");
                Poll::Ready(Ok(()))
            }
            Expiry::Headers => {
                debug!(timeout = ?this.tracker.limits.header_timeout, "no complete request headers in time; closing");
                Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()))
            }
        }
    }
}

/// The service of one connection: tracks requests, and adds `Connection: close` to HTTP/1.1
/// answers while draining or when no idle slot is left.
#[derive(Clone)]
struct ConnService<S> {
    inner: S,
    draining: Arc<AtomicBool>,
    tracker: Arc<Tracker>,
}

/// Marks its request answered when dropped, also when the request is abandoned midway.
struct Answering(Option<Arc<Tracker>>);

impl Answering {
    fn answered(mut self) -> bool {
        self.0.take().is_none_or(|tracker| tracker.answered())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(tracker) = self.0.take() {
            tracker.answered();
        }
    }
}

impl<S, B> tower_service::Service<Request<Incoming>> for ConnService<S>
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response<B>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        self.tracker.request();
        let answering = Answering(Some(self.tracker.clone()));
        let http1 = request.version() < http::Version::HTTP_2;
        let draining = self.draining.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            let kept_open = answering.answered();
            if http1 && (!kept_open || draining.load(Ordering::SeqCst)) {
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok(response)
        })
    }
}

fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
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
