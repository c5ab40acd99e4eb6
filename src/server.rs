//! The accept loop: TCP, a TLS handshake with a deadline, then HTTP/1.1 or HTTP/2.
//!
//! Invariant: every wait is bounded (handshake, headers, idle keep-alive, idle connections, drain),
//! and an idle connection is never closed before the API server gives it up.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::settings::ServerSettings;

/// The bounded waits of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest wait for a request's headers: from the handshake for a connection's first
    /// request, from the first byte of the request for the next ones (HTTP/1.1).
    pub header_timeout: Duration,
    /// Longest idle time of a keep-alive connection between requests.
    pub idle_timeout: Duration,
    /// Most idle keep-alive connections at once; beyond, a connection closes after its answer.
    pub max_idle_connections: usize,
    /// How long open connections may take to finish after the shutdown signal.
    pub shutdown_grace: Duration,
}

impl Limits {
    /// The limits configured in `server.*`.
    pub fn from_settings(server: &ServerSettings) -> Limits {
        Limits {
            handshake_timeout: server.handshake_timeout,
            header_timeout: server.header_timeout,
            idle_timeout: server.idle_timeout,
            max_idle_connections: server.max_idle_connections,
            shutdown_grace: server.shutdown_grace,
        }
    }
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
    S: tower_service::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let acceptor = tls.map(TlsAcceptor::from);
    let (stop, stopping) = watch::channel(false);
    let draining = Arc::new(AtomicBool::new(false));
    let idle = Arc::new(IdleSlots {
        count: AtomicUsize::new(0),
        max: limits.max_idle_connections,
    });
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Reap finished connections so the set holds only live ones.
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
        let acceptor = acceptor.clone();
        let service = service.clone();
        let draining = draining.clone();
        let idle = idle.clone();
        let stopping = stopping.clone();
        let span = info_span!("conn", %peer);
        connections.spawn(
            async move {
                let _ = tcp.set_nodelay(true);
                let builder = builder();
                let Some(acceptor) = acceptor else {
                    let tracker = Arc::new(Tracker::new(limits, idle, false));
                    let service = ConnService::new(service, draining, tracker.clone());
                    let io = TokioIo::new(Tracked::new(tcp, tracker.clone()));
                    let builder = builder.http1_only();
                    let conn = builder.serve_connection(io, TowerToHyperService::new(service));
                    drive(conn, |c| c.graceful_shutdown(), &tracker, stopping).await;
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
                let tracker = Arc::new(Tracker::new(limits, idle, h2));
                let service =
                    TowerToHyperService::new(ConnService::new(service, draining, tracker.clone()));
                let io = TokioIo::new(Tracked::new(tls, tracker.clone()));
                let builder = if h2 {
                    builder.http2_only()
                } else {
                    builder.http1_only()
                };
                let conn = builder.serve_connection(io, service);
                drive(conn, |c| c.graceful_shutdown(), &tracker, stopping).await;
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
    let _ = stop.send(true);
    let grace = limits.shutdown_grace.saturating_sub(delay);
    let finished = async { while connections.join_next().await.is_some() {} };
    match tokio::time::timeout(grace, finished).await {
        Ok(()) => {
            info!("all connections drained");
            Drain::Complete
        }
        Err(_) => {
            warn!(grace = ?limits.shutdown_grace, "connections still open after the grace period; closing them");
            // Dropping the set aborts the connections left.
            Drain::TimedOut
        }
    }
}

/// Runs one connection until it ends: closes it gracefully (HTTP/1.1: at once if idle, after
/// the answer otherwise; HTTP/2: GOAWAY) on the shutdown signal or when idle too long, and
/// drops it when a request's headers are late.
async fn drive<C, E>(
    conn: C,
    graceful: impl Fn(Pin<&mut C>),
    tracker: &Tracker,
    mut stopping: watch::Receiver<bool>,
) where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut conn = std::pin::pin!(conn);
    let mut closing = false;
    // A graceful close that the client does not complete (an HTTP/2 client that never answers
    // the GOAWAY's ping) is cut off after this.
    let mut cut_off = None::<Instant>;
    let result = loop {
        tokio::select! {
            result = conn.as_mut() => break result,
            _ = stopping.wait_for(|stop| *stop), if !closing => {
                closing = true;
                graceful(conn.as_mut());
            }
            expiry = tracker.expired(), if !closing => match expiry {
                Expiry::Idle => {
                    debug!("closing an idle keep-alive connection");
                    closing = true;
                    cut_off = Some(Instant::now() + tracker.limits.header_timeout);
                    graceful(conn.as_mut());
                }
                Expiry::Headers => {
                    debug!(timeout = ?tracker.limits.header_timeout, "no complete request headers in time; closing");
                    return;
                }
            },
            () = sleep_until(cut_off), if cut_off.is_some() => {
                debug!("the client did not finish closing; connection dropped");
                return;
            }
        }
    };
    if let Err(error) = result {
        debug!(%error, "connection ended with an error");
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// How long connections keep being served after the shutdown signal before idle ones close:
/// a tenth of the grace, between 100 ms and 2 s.
fn drain_delay(grace: Duration) -> Duration {
    (grace / 10)
        .clamp(Duration::from_millis(100), Duration::from_secs(2))
        .min(grace)
}

/// The server-wide count of idle keep-alive connections, bounded by `max`.
struct IdleSlots {
    count: AtomicUsize,
    max: usize,
}

impl IdleSlots {
    fn try_take(&self) -> bool {
        self.count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a connection is in its life, and so which deadline applies.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's headers since then (`header_timeout`).
    Headers(Instant),
    /// This many requests are being answered (no deadline here: `body_timeout` and the
    /// service bound them).
    Busy(usize),
    /// Idle since then (`idle_timeout`); `slot` when it holds one of the idle slots (otherwise
    /// it closes at once).
    Idle { since: Instant, slot: bool },
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// A request's headers did not arrive in time.
    Headers,
    /// The connection was idle too long, or there was no idle slot for it.
    Idle,
}

/// The phase of one connection, moved by its reads and by the requests it serves.
struct Tracker {
    phase: Mutex<Phase>,
    changed: Notify,
    limits: Limits,
    idle: Arc<IdleSlots>,
    /// HTTP/2 reads frames (pings, window updates) while idle, so reads do not start requests.
    h2: bool,
}

impl Tracker {
    fn new(limits: Limits, idle: Arc<IdleSlots>, h2: bool) -> Tracker {
        Tracker {
            phase: Mutex::new(Phase::Headers(Instant::now())),
            changed: Notify::new(),
            limits,
            idle,
            h2,
        }
    }

    fn update(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        let before = *phase;
        let after = change(before);
        if let Phase::Idle { slot: true, .. } = before
            && !matches!(after, Phase::Idle { .. })
        {
            self.idle.release();
        }
        *phase = after;
        drop(phase);
        self.changed.notify_waiters();
    }

    /// Bytes arrived: on an idle HTTP/1.1 connection, a request has started.
    fn read(&self) {
        if self.h2 {
            return;
        }
        let idle = matches!(
            *self.phase.lock().unwrap_or_else(|e| e.into_inner()),
            Phase::Idle { .. }
        );
        if idle {
            self.update(|phase| match phase {
                Phase::Idle { .. } => Phase::Headers(Instant::now()),
                other => other,
            });
        }
    }

    /// A request's headers are in: the service is called.
    fn request(&self) {
        self.update(|phase| match phase {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Headers(_) | Phase::Idle { .. } => Phase::Busy(1),
        });
    }

    /// A request was answered (or abandoned). Returns false when the connection goes idle
    /// without an idle slot: it is closed instead of kept.
    fn answered(&self) -> bool {
        let mut kept = true;
        self.update(|phase| match phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            Phase::Busy(_) => {
                kept = self.idle.try_take();
                Phase::Idle {
                    since: Instant::now(),
                    slot: kept,
                }
            }
            other => other,
        });
        kept
    }

    /// The current deadline and what passing it means.
    fn deadline(&self) -> Option<(Instant, Expiry)> {
        match *self.phase.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Headers(since) => Some((since + self.limits.header_timeout, Expiry::Headers)),
            Phase::Busy(_) => None,
            Phase::Idle { since, slot: true } => {
                Some((since + self.limits.idle_timeout, Expiry::Idle))
            }
            Phase::Idle { since, slot: false } => Some((since, Expiry::Idle)),
        }
    }

    /// Completes when the deadline of the current phase passes.
    async fn expired(&self) -> Expiry {
        loop {
            // Created before the phase is read, so no change in between is missed.
            let changed = self.changed.notified();
            match self.deadline() {
                Some((deadline, expiry)) if deadline <= Instant::now() => return expiry,
                Some((deadline, _)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if let Phase::Idle { slot: true, .. } =
            *self.phase.lock().unwrap_or_else(|e| e.into_inner())
        {
            self.idle.release();
        }
    }
}

/// An I/O stream that tells its [`Tracker`] when bytes arrive.
struct Tracked<T> {
    io: T,
    tracker: Arc<Tracker>,
}

impl<T> Tracked<T> {
    fn new(io: T, tracker: Arc<Tracker>) -> Tracked<T> {
        Tracked { io, tracker }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.tracker.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// How much of a request body the service gave up on is still read (and thrown away) on
/// HTTP/2, and for how long, so that the stream can end without a reset.
const DRAIN_BYTES: usize = 16 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// The body of a request as the service sees it.
///
/// On HTTP/2, a body the service drops before reading it to the end (a request refused early:
/// wrong content type, too large) is read on and thrown away, up to [`DRAIN_BYTES`] within
/// [`DRAIN_TIME`], and kept at least until the answer has been sent. Dropping it at once makes
/// hyper reset the stream with `CANCEL`, racing the answer; even a reset with `NO_ERROR` after
/// the answer (RFC 9113, 8.1) is reported by some clients (curl 7.x) as a stream error instead
/// of the 4xx. Drained, the stream ends as any other; only a body beyond the bound is reset,
/// with `NO_ERROR`.
pub struct RequestBody {
    inner: Option<Incoming>,
    /// Resolves (with an error) once the answer has been sent; set on HTTP/2 only.
    answered: Option<oneshot::Receiver<()>>,
}

impl RequestBody {
    fn new(inner: Incoming, answered: Option<oneshot::Receiver<()>>) -> RequestBody {
        RequestBody {
            inner: Some(inner),
            answered,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let (Some(body), Some(answered)) = (self.inner.take(), self.answered.take()) else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(body, answered));
        }
    }
}

/// Reads and discards what is left of `body` (bounded), then drops it once the answer is sent.
async fn drain(mut body: Incoming, answered: oneshot::Receiver<()>) {
    use http_body_util::BodyExt;
    let discard = async {
        let mut read = 0;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
    let _ = answered.await;
}

/// A response body that, when dropped (after it has been sent), tells a request body the
/// service gave up on that the answer is out.
pub struct AnswerBody<B> {
    inner: Pin<Box<B>>,
    _sent: Option<oneshot::Sender<()>>,
}

impl<B: Body> Body for AnswerBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The service of one connection: tracks requests in the connection's [`Tracker`], drains
/// refused HTTP/2 request bodies, and adds `Connection: close` to HTTP/1.1 answers while the
/// server drains or when no idle slot is left, so the client stops reusing the connection
/// instead of sending a request into one about to close.
#[derive(Clone)]
struct ConnService<S> {
    inner: S,
    draining: Arc<AtomicBool>,
    tracker: Arc<Tracker>,
}

impl<S> ConnService<S> {
    fn new(inner: S, draining: Arc<AtomicBool>, tracker: Arc<Tracker>) -> ConnService<S> {
        ConnService {
            inner,
            draining,
            tracker,
        }
    }
}

/// Marks its request answered when dropped, also when the request is abandoned midway.
struct Answering {
    tracker: Arc<Tracker>,
    done: bool,
}

impl Answering {
    fn answered(mut self) -> bool {
        self.done = true;
        self.tracker.answered()
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.done {
            self.tracker.answered();
        }
    }
}

impl<S, B> tower_service::Service<Request<Incoming>> for ConnService<S>
where
    S: tower_service::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<AnswerBody<B>>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response<AnswerBody<B>>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        self.tracker.request();
        let answering = Answering {
            tracker: self.tracker.clone(),
            done: false,
        };
        let http1 = request.version() < http::Version::HTTP_2;
        let (sent, answered) = if http1 {
            (None, None)
        } else {
            let (sent, answered) = oneshot::channel();
            (Some(sent), Some(answered))
        };
        let request = request.map(|body| RequestBody::new(body, answered));
        let draining = self.draining.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let kept_open = answering.answered();
            let mut response = response.map(|body| AnswerBody {
                inner: Box::pin(body),
                _sent: sent,
            });
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

/// HTTP/1.1 keep-alive without hyper's header timeout (the [`Tracker`] keeps the deadlines),
/// HTTP/2 with pings.
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
