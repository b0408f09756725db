//! The accept loop: a connection cap taken before `accept`, `accept` errors that never end the
//! loop, one task per connection, and the shutdown: stop accepting, ask every connection to close,
//! wait out the grace period, abort what is left.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::Layer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tracing::{debug, error, info, warn};

use super::connection::{Shared, serve_connection};
use super::log_limit::{CapLog, RateLimit};
use super::{Limits, MAX_CONCURRENT_STREAMS, MAX_HEADER_BYTES};

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

#[cfg(test)]
mod tests {
    use super::*;

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
