//! Tracing of requests: the span every log line of a request is recorded in.
//!
//! The request id itself is settled by the idempotency crate's
//! [`RequestContextLayer`](idemlog_idempotency::request_id::RequestContextLayer) middleware (outermost), so
//! the span can name it; the route label is the matched template, or [`UNMATCHED_ROUTE`].

use axum::extract::{MatchedPath, Request};
use idemlog_idempotency::request_id::REQUEST_ID;
use tracing::{Span, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;
use crate::log_line::{TextFields, TextLine};
use crate::routes::UNMATCHED_ROUTE;

/// The server's log subscriber: `filter`'s lines in `format`, written to `writer` (the binary passes
/// its batching stderr writer; the in-process router benchmark a sink, so that it measures the same
/// per-request logging work the server does).
pub fn log_subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(
            builder
                .fmt_fields(TextFields)
                .event_format(TextLine::default())
                .finish(),
        ),
        LogFormat::Json => Box::new(builder.json().finish()),
    }
}

/// The span of one request (for tower-http's `TraceLayer`): request id, method and route template,
/// so that every log line of the request names them, and on idempotent routes the scope and key,
/// which the idempotency layer records ([`SCOPE_FIELD`](idemlog_idempotency::SCOPE_FIELD),
/// [`KEY_FIELD`](idemlog_idempotency::KEY_FIELD)). At ERROR level, so that it is enabled
/// whatever the log filter lets through (a span filtered out would leave the request's warnings
/// without their id).
pub fn make_span(request: &Request) -> Span {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, MatchedPath::as_str);
    tracing::error_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = %route,
        // Filled in by the idempotency layer on the routes it wraps, instead of a span of its own.
        scope = tracing::field::Empty,
        key = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use idemlog_idempotency::{KEY_FIELD, SCOPE_FIELD};

    use super::*;

    #[test]
    fn the_request_span_declares_the_fields_the_idempotency_layer_records() {
        tracing::subscriber::with_default(tracing_subscriber::registry(), || {
            let span = make_span(&Request::new(Body::empty()));
            assert!(span.has_field(SCOPE_FIELD), "no {SCOPE_FIELD} field");
            assert!(span.has_field(KEY_FIELD), "no {KEY_FIELD} field");
        });
    }
}
