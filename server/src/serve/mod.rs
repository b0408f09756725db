//! Serving the router over HTTP/1.1 and HTTP/2 cleartext (h2c with prior knowledge) on one port,
//! with connection limits: what `axum::serve` does, plus timeouts, a cap on connections, HTTP/2
//! stream and header bounds and a bounded graceful shutdown (`axum::serve` exposes none of these).
//!
//! | limit | HTTP/1.1 | HTTP/2 | what happens |
//! |---|---|---|---|
//! | [`Limits::header_read_timeout`] | hyper's `header_read_timeout` (with [`TokioTimer`](hyper_util::rt::TokioTimer)) | `RequestClock` (`request_clock`): no request in flight and no new request head for this long | the connection is closed (HTTP/2: GOAWAY) |
//! | protocol choice | [`sniff()`](sniff::sniff): the first bytes, read under [`Limits::header_read_timeout`] | the same | a connection that sends nothing (or a partial preface) is closed |
//! | [`Limits::body_read_timeout`] | tower-http's [`RequestBodyTimeoutLayer`](tower_http::timeout::RequestBodyTimeoutLayer) | the same | the idempotency layer answers 408 `body-timeout` before claiming |
//! | [`Limits::idle_timeout`] | per-connection watchdog on socket activity (`connection::serve_connection`) | the same | graceful close; dropped if still silent one more period later |
//! | header size | hyper's defaults: 100 headers, a read buffer of about 400 KB | `SETTINGS_MAX_HEADER_LIST_SIZE` of [`MAX_HEADER_BYTES`] | 431 (HTTP/1.1), the stream refused (HTTP/2) |
//! | concurrent requests | one at a time | `SETTINGS_MAX_CONCURRENT_STREAMS` [`MAX_CONCURRENT_STREAMS`]; rapid resets bounded by hyper's defaults | streams over the bound are refused |
//! | [`Limits::max_connections`] | a [`Semaphore`](tokio::sync::Semaphore) taken before `accept` | the same | no `accept` while at the cap: clients wait in the listen backlog |
//! | [`Limits::shutdown_grace`] | [`JoinSet`](tokio::task::JoinSet) of connection tasks, aborted at the deadline | the same | lingering connections are closed |
//!
//! hyper 1's HTTP/1 header read timer starts whenever the connection is ready for a request head:
//! on accept, and again when a keep-alive connection finishes a response. So it also bounds the
//! idle time between HTTP/1.1 requests; hyper has no separate keep-alive idle timeout, hence the
//! watchdog, which matters when `idle_timeout` is the shorter of the two and for connections that
//! stall elsewhere (a client that stops reading its response).
//!
//! HTTP/2 has no header read timer in hyper, and hyper-util's auto builder reads the first bytes
//! to choose a protocol with no timer at all. So the choice is made here (`sniff`, bounded by the
//! header read timeout) before hyper-util's builder serves the connection in the protocol chosen,
//! and `RequestClock` (`request_clock`) gives HTTP/2 the HTTP/1 rule: a connection with no request
//! in flight must complete a request head within the header read timeout (counted from the end of
//! the protocol choice, and again from the end of each response head), else it gets GOAWAY. A
//! client trickling a header block one byte at a time keeps the socket busy but never completes a
//! head, so it is cut off like an HTTP/1.1 slowloris. No HTTP/2 keep-alive pings are sent: the
//! idle watchdog already closes a silent connection, and a ping that a stalled client's stack
//! answers would count as activity and keep it open.
//!
//! The module's files: `accept` the accept loop, the connection cap and the shutdown drain;
//! `sniff` the protocol choice from a connection's first bytes; `connection` one connection's
//! task (idle watchdog, HTTP/2 header timer, graceful close); `request_clock` the HTTP/2 request
//! clock; `activity` the I/O accounting behind the idle watchdog; `log_limit` the rate limits of
//! the log lines a flood of connections would otherwise multiply.
//!
//! The shutdown is a `watch` channel and a `JoinSet` of connection tasks rather than hyper-util's
//! `server::graceful::GracefulShutdown`: that one takes each connection future over when it is
//! watched, so this module could no longer ask a connection to close for its own reasons (the idle
//! watchdog, the HTTP/2 header timer), it has no say over a connection still choosing its
//! protocol (no hyper connection exists yet), and it cannot abort the connections still open at
//! the end of the grace period, which the `JoinSet` does.

mod accept;
mod activity;
mod connection;
mod log_limit;
mod request_clock;
mod sniff;

use std::time::Duration;

pub use self::accept::serve;

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
