//! Serving the proxy listener: HTTP/1.1 and h2c (prior knowledge) on one port with hyper-util's
//! auto builder, and a graceful shutdown with hyper-util's `GracefulShutdown`: on the signal the
//! listener is closed, every connection is asked to finish (HTTP/1.1: after its current request;
//! HTTP/2: GOAWAY), and the wait is bounded by the grace period.
//!
//! Bounds: an HTTP/1.1 request head must arrive within [`HEADER_READ_TIMEOUT`]; HTTP/2 allows
//! [`MAX_CONCURRENT_STREAMS`] requests per connection and heads of at most [`MAX_HEADER_BYTES`];
//! protected bodies are bounded by the route's limit (the layer answers 413 past it).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_http::timeout::TimeoutBody;
use tracing::{debug, info, warn};

use crate::app::App;
use crate::forward::Peer;

/// Time for an HTTP/1.1 client to send a complete request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most concurrent HTTP/2 streams per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Largest HTTP/2 header list.
pub const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// The limits of the proxy listener (from the flags).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// After the shutdown signal, how long connections may finish their requests.
    pub grace: Duration,
    /// Longest wait for the next piece of a request body (the layer answers 408 before claiming).
    pub body_read_timeout: Duration,
}

/// A connection cap shared by every worker's listener: `--max-connections` permits in all.
pub fn connection_permits(max_connections: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(max_connections.max(1)))
}

/// The connections one event loop serves: the HTTP/1.1 + h2c builder, the graceful-shutdown
/// watcher, and the app every request goes to.
pub struct Connections {
    builder: auto::Builder<TokioExecutor>,
    graceful: GracefulShutdown,
    app: App,
    limits: Limits,
}

impl Connections {
    /// Connections to `app`, with these limits.
    pub fn new(app: App, limits: Limits) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .max_header_list_size(MAX_HEADER_BYTES);
        Self {
            builder,
            graceful: GracefulShutdown::new(),
            app,
            limits,
        }
    }

    /// Serves one accepted connection on a task of the current runtime; `on_close` runs when it
    /// ends (it holds the connection's permit).
    pub fn serve(&self, stream: TcpStream, peer: SocketAddr, on_close: impl Send + 'static) {
        let _ = stream.set_nodelay(true);
        let app = self.app.clone();
        let body_read_timeout = self.limits.body_read_timeout;
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let app = app.clone();
            let request = request.map(|body| Body::new(TimeoutBody::new(body_read_timeout, body)));
            async move { Ok::<_, Infallible>(app.handle(request, Peer(peer)).await) }
        });
        let connection = self
            .builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = self.graceful.watch(connection);
        tokio::spawn(async move {
            let _on_close = on_close;
            if let Err(e) = connection.await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }

    /// Asks every connection to finish (HTTP/1.1: after its current request; HTTP/2: GOAWAY) and
    /// waits for them, for at most the grace period. Returns the period's end.
    pub async fn drain(self) -> tokio::time::Instant {
        let grace = self.limits.grace;
        let deadline = tokio::time::Instant::now() + grace;
        info!("stopped accepting: waiting for the requests in flight");
        if tokio::time::timeout_at(deadline, self.graceful.shutdown())
            .await
            .is_err()
        {
            warn!(
                grace_ms = grace.as_millis() as u64,
                "connections still open after the grace period: closing them"
            );
        }
        deadline
    }
}

/// Serves `listener` on the current runtime until `shutdown` resolves, then drains connections
/// for at most `limits.grace`. A connection is accepted only with one of `permits`; at the cap,
/// clients wait in the listen backlog. Returns when the grace period ends (`now + grace` at the
/// signal), so that the caller's wait for requests whose clients left shares the same deadline.
/// (The binary spreads connections over worker threads instead: `crate::workers`.)
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    permits: Arc<Semaphore>,
) -> tokio::time::Instant {
    let connections = Connections::new(app, limits);
    let mut shutdown = pin!(shutdown);
    while let Some((stream, peer, permit)) = accept(&listener, &permits, shutdown.as_mut()).await {
        connections.serve(stream, peer, permit);
    }
    drop(listener);
    connections.drain().await
}

/// The next connection, with its permit (taken before `accept`); `None` once `shutdown` resolved.
pub async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(permits).acquire_owned() => permit.ok()?,
            () = shutdown.as_mut() => return None,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => return Some((stream, peer, permit)),
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = shutdown.as_mut() => return None,
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("SIGINT received: shutting down"),
        () = terminate => info!("SIGTERM received: shutting down"),
    }
}
