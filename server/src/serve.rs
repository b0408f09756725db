//! Serving the router over HTTP/1.1 and HTTP/2 cleartext (h2c with prior knowledge) on one port,
//! with connection limits: what `axum::serve` does, plus timeouts, a cap on connections, HTTP/2
//! stream and header bounds and a bounded graceful shutdown (`axum::serve` exposes none of these).
//!
//! | limit | HTTP/1.1 | HTTP/2 | what happens |
//! |---|---|---|---|
//! | [`Limits::header_read_timeout`] | hyper's `header_read_timeout` (with [`TokioTimer`]) | [`RequestClock`]: no request in flight and no new request head for this long | the connection is closed (HTTP/2: GOAWAY) |
//! | protocol choice | [`sniff`]: the first bytes, read under [`Limits::header_read_timeout`] | the same | a connection that sends nothing (or a partial preface) is closed |
//! | [`Limits::body_read_timeout`] | tower-http's [`RequestBodyTimeoutLayer`] | the same | the idempotency layer answers 408 `body-timeout` before claiming |
//! | [`Limits::idle_timeout`] | per-connection watchdog on socket activity (`serve_connection`) | the same | graceful close; dropped if still silent one more period later |
//! | header size | hyper's defaults: 100 headers, a read buffer of about 400 KB | `SETTINGS_MAX_HEADER_LIST_SIZE` of [`MAX_HEADER_BYTES`] | 431 (HTTP/1.1), the stream refused (HTTP/2) |
//! | concurrent requests | one at a time | `SETTINGS_MAX_CONCURRENT_STREAMS` [`MAX_CONCURRENT_STREAMS`]; rapid resets bounded by hyper's defaults | streams over the bound are refused |
//! | [`Limits::max_connections`] | a [`Semaphore`] taken before `accept` | the same | no `accept` while at the cap: clients wait in the listen backlog |
//! | [`Limits::shutdown_grace`] | [`JoinSet`] of connection tasks, aborted at the deadline | the same | lingering connections are closed |
//!
//! hyper 1's HTTP/1 header read timer starts whenever the connection is ready for a request head:
//! on accept, and again when a keep-alive connection finishes a response. So it also bounds the
//! idle time between HTTP/1.1 requests; hyper has no separate keep-alive idle timeout, hence the
//! watchdog, which matters when `idle_timeout` is the shorter of the two and for connections that
//! stall elsewhere (a client that stops reading its response).
//!
//! HTTP/2 has no header read timer in hyper, and hyper-util's auto builder reads the first bytes
//! to choose a protocol with no timer at all. So the choice is made here ([`sniff`], bounded by
//! the header read timeout) before hyper-util's builder serves the connection in the protocol
//! chosen, and [`RequestClock`] gives HTTP/2 the HTTP/1 rule: a connection with no request in
//! flight must complete a request head within the header read timeout (counted from the end of
//! the protocol choice, and again from the end of each response head), else it gets GOAWAY. A
//! client trickling a header block one byte at a time keeps the socket busy but never completes a
//! head, so it is cut off like an HTTP/1.1 slowloris. No HTTP/2 keep-alive pings are sent: the
//! idle watchdog already closes a silent connection, and a ping that a stalled client's stack
//! answers would count as activity and keep it open.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::Layer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tracing::{debug, error, info, warn};

/// Connection limits (the binary fills them from its flags; see [`crate::config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time to deliver a complete request head, from accept or from the end of the previous
    /// response on a keep-alive connection.
    pub header_read_timeout: Duration,
    /// Longest wait for the next chunk of a request body.
    pub body_read_timeout: Duration,
    /// A connection with no I/O for this long is closed once its current request is answered.
    pub idle_timeout: Duration,
    /// Connections served at once (at least 1).
    pub max_connections: usize,
    /// After the shutdown signal, how long open connections may finish their requests.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Most concurrent HTTP/2 streams (requests) on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// Largest HTTP/2 request head (`SETTINGS_MAX_HEADER_LIST_SIZE`: names, values and 32 bytes per
/// field), well under what hyper's HTTP/1.1 parser allows (100 fields, about 400 KB).
pub const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// The HTTP/2 client connection preface (RFC 9113 section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Minimum time between two log lines of the same kind of event (the others are counted).
const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after an `accept` error that is not about one connection (EMFILE, ENFILE, ENOBUFS…).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, asks every
/// connection to close after its current request, and closes those still open after
/// [`Limits::shutdown_grace`].
///
/// Sets TCP_NODELAY on accepted sockets. `accept` errors are logged (rate-limited) and never end
/// the loop. Returns once every connection task has ended.
pub async fn serve<F>(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()>,
{
    if limits.max_connections == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "max_connections must be at least 1",
        ));
    }
    info!(
        header_read_timeout = ?limits.header_read_timeout,
        body_read_timeout = ?limits.body_read_timeout,
        idle_timeout = ?limits.idle_timeout,
        max_connections = limits.max_connections,
        shutdown_grace = ?limits.shutdown_grace,
        "HTTP limits in force"
    );
    // The body timeout wraps every request body, so whoever reads it (the idempotency layer,
    // before it claims anything) sees a read error when the client stalls.
    let service = RequestBodyTimeoutLayer::new(limits.body_read_timeout).layer(router);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES);
    let shared = Arc::new(Shared {
        http1: builder.clone().http1_only(),
        http2: builder.http2_only(),
        header_read_timeout: limits.header_read_timeout,
        idle_timeout: limits.idle_timeout,
        closed_log: Mutex::new(RateLimit::default()),
    });

    let semaphore = Arc::new(Semaphore::new(limits.max_connections));
    let (shutdown_tx, _) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut cap = CapLog::default();
    let mut accept_errors = RateLimit::default();
    loop {
        while let Some(ended) = connections.try_join_next() {
            log_task_end(ended);
        }
        let permit = match Arc::clone(&semaphore).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                cap.reached(limits.max_connections);
                tokio::select! {
                    permit = Arc::clone(&semaphore).acquire_owned() => {
                        permit.expect("the connection semaphore is never closed")
                    }
                    () = &mut shutdown => break,
                }
            }
        };
        cap.relieved();
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    if let Some(suppressed) = accept_errors.allow() {
                        error!(error = %e, suppressed, "accept failed: backing off");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%peer, error = %e, "could not set TCP_NODELAY");
        }
        connections.spawn(serve_connection(
            Arc::clone(&shared),
            service.clone(),
            stream,
            peer,
            shutdown_tx.subscribe(),
            permit,
        ));
    }

    // Stop accepting: clients still in the backlog are refused.
    drop(listener);
    info!(
        connections = connections.len(),
        grace = ?limits.shutdown_grace,
        "stopped accepting: closing idle connections, letting requests in flight finish"
    );
    shutdown_tx.send_replace(());
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while let Some(ended) = connections.join_next().await {
            log_task_end(ended);
        }
    })
    .await;
    if drained.is_err() {
        warn!(
            connections = connections.len(),
            grace = ?limits.shutdown_grace,
            "connections still open after the shutdown grace period: closing them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// What every connection task shares.
struct Shared {
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    closed_log: Mutex<RateLimit>,
}

impl Shared {
    /// Logs a connection closed by a limit: info at most once per [`LOG_INTERVAL`], debug otherwise.
    fn closed(&self, peer: SocketAddr, reason: &'static str) {
        match self.closed_log.lock().allow() {
            Some(suppressed) => info!(%peer, reason, suppressed, "closed a connection"),
            None => debug!(%peer, reason, "closed a connection"),
        }
    }
}

/// Why a connection is closing.
#[derive(Clone, Copy)]
enum Closing {
    Shutdown,
    Idle,
    /// HTTP/2: no request head within the header read timeout. GOAWAY is sent; if the connection
    /// is still open one more period later (a client that never answers the GOAWAY's ping while
    /// it trickles bytes, so that the idle watchdog never fires), it is dropped.
    HeadTimeout,
}

/// The protocol a connection speaks, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// How [`sniff`] ended without a protocol.
enum NoProtocol {
    /// Nothing decisive within the header read timeout.
    TimedOut,
    /// The client closed the connection (or it failed) first.
    Closed,
}

/// Reads a connection's first bytes until they either are the HTTP/2 preface (prior knowledge) or
/// cannot be; returns the protocol and the bytes read (served before the rest of the stream).
async fn sniff(stream: &mut TcpStream, limit: Duration) -> Result<(Protocol, Vec<u8>), NoProtocol> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let read = async {
        let mut buf = [0u8; 24];
        loop {
            let want = H2_PREFACE.len() - seen.len();
            let n = stream.read(&mut buf[..want]).await.ok()?;
            if n == 0 {
                return None;
            }
            seen.extend_from_slice(&buf[..n]);
            if !H2_PREFACE.starts_with(&seen) {
                return Some(Protocol::Http1);
            }
            if seen.len() == H2_PREFACE.len() {
                return Some(Protocol::Http2);
            }
        }
    };
    match tokio::time::timeout(limit, read).await {
        Ok(Some(protocol)) => Ok((protocol, seen)),
        Ok(None) => Err(NoProtocol::Closed),
        Err(_) => Err(NoProtocol::TimedOut),
    }
}

/// Serves one connection while holding one of the [`Limits::max_connections`] permits.
///
/// The protocol is chosen first ([`sniff`], within the header read timeout). The idle watchdog:
/// [`Tracked`] stamps every read and write; when the connection has been silent for
/// `idle_timeout` it is asked to close gracefully (hyper closes it at once when no request is in
/// flight, or after answering the current one), and if it is still silent one `idle_timeout`
/// later (a client that stopped reading its response, a handler that never ends) it is dropped.
/// On HTTP/2 the [`RequestClock`] also asks it to close when no request head completes within
/// the header read timeout while none is in flight. A dropped request is handled like a client
/// that left: the idempotency layer finishes it on a task of its own. The sleeps are re-armed
/// from the last activity, so they wake about once per period rather than on every read.
async fn serve_connection<S>(
    shared: Arc<Shared>,
    service: S,
    mut stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<()>,
    _permit: OwnedSemaphorePermit,
) where
    S: tower::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let sniffed = tokio::select! {
        sniffed = sniff(&mut stream, shared.header_read_timeout) => sniffed,
        _ = shutdown.changed() => return,
    };
    let (protocol, prefix) = match sniffed {
        Ok(sniffed) => sniffed,
        Err(NoProtocol::TimedOut) => {
            shared.closed(peer, "header read timeout (no protocol chosen)");
            return;
        }
        Err(NoProtocol::Closed) => return,
    };
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        prefix,
        activity: Arc::clone(&activity),
    });
    let clock = Arc::new(RequestClock::new());
    let service = Clocked {
        inner: service,
        clock: Arc::clone(&clock),
    };
    let builder = match protocol {
        Protocol::Http1 => &shared.http1,
        Protocol::Http2 => &shared.http2,
    };
    let mut conn = pin!(builder.serve_connection(io, TowerToHyperService::new(service)));
    let idle = shared.idle_timeout;
    let head_limit = shared.header_read_timeout;
    let mut watchdog = pin!(tokio::time::sleep(idle));
    let mut head_timer = pin!(tokio::time::sleep(head_limit));
    let mut closing: Option<Closing> = None;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                match result {
                    Ok(()) => {}
                    Err(e) if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) => {
                        shared.closed(peer, "header read timeout");
                    }
                    Err(e) => debug!(%peer, error = %e, "connection ended with an error"),
                }
                return;
            }
            _ = shutdown.changed(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Closing::Shutdown);
            }
            () = head_timer.as_mut(), if protocol == Protocol::Http2 => {
                if let Some(Closing::HeadTimeout) = closing {
                    shared.closed(peer, "no progress after being asked to close");
                    return;
                }
                match clock.waiting_for_head() {
                    Some(_) if closing.is_some() => head_timer.as_mut().reset(Instant::now() + head_limit),
                    Some(waited) if waited >= head_limit => {
                        shared.closed(peer, "header read timeout (HTTP/2)");
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Closing::HeadTimeout);
                        head_timer.as_mut().reset(Instant::now() + head_limit);
                    }
                    Some(waited) => head_timer.as_mut().reset(Instant::now() + (head_limit - waited)),
                    None => head_timer.as_mut().reset(Instant::now() + head_limit),
                }
            }
            () = watchdog.as_mut() => {
                let silent = activity.silent_for();
                if silent < idle {
                    watchdog.as_mut().reset(Instant::now() + (idle - silent));
                    continue;
                }
                match closing {
                    None => {
                        shared.closed(peer, "idle timeout");
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Closing::Idle);
                        watchdog.as_mut().reset(Instant::now() + idle);
                    }
                    Some(Closing::Idle | Closing::Shutdown | Closing::HeadTimeout) => {
                        shared.closed(peer, "no progress after being asked to close");
                        return;
                    }
                }
            }
        }
    }
}

/// Requests in flight on one connection, and since when none has been: the HTTP/2 counterpart of
/// hyper's HTTP/1 header read timer (hyper calls the service once a request head is complete).
struct RequestClock {
    start: Instant,
    in_flight: AtomicU64,
    /// Milliseconds from `start` to the moment the last request in flight was answered.
    idle_since_ms: AtomicU64,
}

impl RequestClock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn answered(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since_ms.store(ms, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// How long the connection has been waiting for a request head, or `None` while a request is
    /// in flight.
    fn waiting_for_head(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.start.elapsed().saturating_sub(since))
    }
}

/// Marks a request answered when its response future completes or is dropped.
struct Answered(Arc<RequestClock>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// The connection's service, counting requests in [`RequestClock`].
#[derive(Clone)]
struct Clocked<S> {
    inner: S,
    clock: Arc<RequestClock>,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Clocked<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ClockedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        self.clock.started();
        let answered = Answered(Arc::clone(&self.clock));
        ClockedFuture {
            inner: self.inner.call(request),
            answered: Some(answered),
        }
    }
}

pin_project! {
    /// The response future of [`Clocked`]: the request counts as answered when its response is
    /// ready, or when the future is dropped before (its [`Answered`] goes with it). A named future
    /// rather than a boxed one per request.
    struct ClockedFuture<F> {
        #[pin]
        inner: F,
        answered: Option<Answered>,
    }
}

impl<F: Future> Future for ClockedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        this.answered.take();
        Poll::Ready(output)
    }
}

fn log_task_end(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        error!(error = %e, "a connection task panicked");
    }
}

/// Errors about one connection that the next `accept` does not share (as `axum::serve`).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The last time a connection read or wrote a byte.
struct Activity {
    start: Instant,
    /// Milliseconds from `start`.
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// A TCP stream that stamps [`Activity`] on every successful read or write, and first gives back
/// the bytes [`sniff`] read.
struct Tracked {
    inner: TcpStream,
    prefix: Vec<u8>,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            self.activity.touch();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Lets one event of a kind through per [`LOG_INTERVAL`], counting the others.
#[derive(Default)]
struct RateLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// `Some(events suppressed since the last one let through)` when this one may be logged.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_INTERVAL)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Warns once per episode of being at the connection cap (episodes closer than [`LOG_INTERVAL`]
/// are counted, not logged).
#[derive(Default)]
struct CapLog {
    at_cap: bool,
    log: RateLimit,
}

impl CapLog {
    fn reached(&mut self, max_connections: usize) {
        if std::mem::replace(&mut self.at_cap, true) {
            return;
        }
        if let Some(suppressed) = self.log.allow() {
            warn!(
                max_connections,
                earlier_episodes_not_logged = suppressed,
                "connection cap reached: not accepting new connections until one closes"
            );
        }
    }

    fn relieved(&mut self) {
        if std::mem::replace(&mut self.at_cap, false) {
            debug!("below the connection cap again: accepting");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_lets_one_event_through_per_interval_and_counts_the_rest() {
        let mut limit = RateLimit::default();
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        tokio::time::advance(LOG_INTERVAL).await;
        assert_eq!(limit.allow(), Some(2));
        assert_eq!(limit.allow(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn activity_measures_silence_since_the_last_touch() {
        let activity = Activity::new();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(activity.silent_for(), Duration::from_secs(5));
        activity.touch();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(activity.silent_for(), Duration::from_secs(2));
    }

    #[tokio::test]
    async fn zero_connections_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let limits = Limits {
            max_connections: 0,
            ..Limits::default()
        };
        let err = serve(listener, Router::new(), limits, async {})
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
