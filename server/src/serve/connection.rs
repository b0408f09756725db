//! One connection's task: the protocol choice, then hyper serving it under the idle watchdog, the
//! HTTP/2 header timer and the shutdown signal, each of which asks it to close gracefully and
//! drops it if it makes no progress one period later.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tracing::{debug, info};

use super::activity::{Activity, Tracked};
use super::log_limit::RateLimit;
use super::request_clock::{Clocked, RequestClock};
use super::sniff::{NoProtocol, Protocol, sniff};

/// What every connection task shares.
pub(super) struct Shared {
    pub(super) http1: auto::Builder<TokioExecutor>,
    pub(super) http2: auto::Builder<TokioExecutor>,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) closed_log: Mutex<RateLimit>,
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
pub(super) async fn serve_connection<S>(
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
