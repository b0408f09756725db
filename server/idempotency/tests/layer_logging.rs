//! Which span the layer's lines are in: the request's own, when it declares `scope` and `key`, or
//! an `idempotency` span of the layer's. Either way a line written under a claim names both.

mod memory_store;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use idemlog::Durability;
use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, KEY_FIELD, SCOPE_FIELD, Scope};
use parking_lot::Mutex;
use tower::ServiceExt;
use tracing::Instrument;
use tracing::field::Empty;

/// Log output gathered in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The captured line containing `needle` (exactly one).
    fn line_with(&self, needle: &str) -> String {
        let text = String::from_utf8_lossy(&self.0.lock()).into_owned();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
        assert_eq!(lines.len(), 1, "one line with {needle:?} in:\n{text}");
        lines[0].to_owned()
    }
}

/// How the request span of the app under test is made.
#[derive(Clone, Copy)]
enum RequestSpan {
    /// None at all.
    Absent,
    /// A `request` span declaring the scope and key fields, as the server's does.
    WithFields,
    /// A `request` span with other fields only.
    WithoutFields,
}

async fn handler() -> (StatusCode, &'static str) {
    tracing::info!("handler ran");
    (StatusCode::CREATED, "done")
}

fn router(span: RequestSpan) -> Router {
    let store = memory_store::open(Durability::None);
    let config = IdempotencyConfig::new(Duration::from_secs(3600), Duration::from_secs(30));
    let layer = IdempotencyLayer::new(Arc::new(store), config);
    Router::new()
        .route("/ok", post(handler))
        .route_layer(layer)
        .layer(middleware::from_fn(
            move |mut request: Request, next: Next| async move {
                request.extensions_mut().insert(Scope::new("tenant"));
                match span {
                    RequestSpan::Absent => next.run(request).await,
                    RequestSpan::WithFields => {
                        let span =
                            tracing::error_span!("request", id = 7, scope = Empty, key = Empty);
                        next.run(request).instrument(span).await
                    }
                    RequestSpan::WithoutFields => {
                        let span = tracing::error_span!("request", id = 7);
                        next.run(request).instrument(span).await
                    }
                }
            },
        ))
}

/// Runs one request with key `k-1` under a subscriber that captures INFO and above.
async fn logged(span: RequestSpan) -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let request = Request::post("/ok")
        .header("idempotency-key", "k-1")
        .body(Body::empty())
        .expect("request");
    let response: Response = router(span).oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::CREATED);
    captured
}

#[test]
fn the_fields_the_layer_records_are_named_scope_and_key() {
    assert_eq!((SCOPE_FIELD, KEY_FIELD), ("scope", "key"));
}

#[tokio::test]
async fn scope_and_key_are_recorded_on_a_request_span_that_declares_them() {
    let line = logged(RequestSpan::WithFields)
        .await
        .line_with("handler ran");
    assert!(
        line.contains("request{id=7 scope=\"tenant\" key=\"k-1\"}"),
        "{line}"
    );
    assert!(!line.contains("idempotency{"), "no second span: {line}");
}

#[tokio::test]
async fn without_a_request_span_the_layer_opens_its_own() {
    let line = logged(RequestSpan::Absent).await.line_with("handler ran");
    assert!(
        line.contains("idempotency{scope=\"tenant\" key=\"k-1\"}"),
        "{line}"
    );
}

#[tokio::test]
async fn a_request_span_without_the_fields_gets_the_layers_span_inside_it() {
    let line = logged(RequestSpan::WithoutFields)
        .await
        .line_with("handler ran");
    assert!(
        line.contains("request{id=7}:idempotency{scope=\"tenant\" key=\"k-1\"}"),
        "{line}"
    );
}
