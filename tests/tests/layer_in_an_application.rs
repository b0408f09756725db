//! An application that depends on the layer keeps serde's usual reading of JSON numbers.
//!
//! Cargo builds one serde_json per build, with the union of every crate's features. Had the layer
//! (or anything else in this workspace) turned on serde_json's `arbitrary_precision`, numbers
//! would reach `#[serde(untagged)]` and `#[serde(flatten)]` as maps, and both tests here would fail
//! with "invalid type: map". They run inside the workspace's build on purpose: the build that
//! `cargo test --workspace` makes is the one whose features they check.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use idemlog_e2e::TempDir;
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, Scope, StoreHandle};
use serde::Deserialize;
use tower::ServiceExt;

/// A price given either as a whole number of cents or as a decimal.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(untagged)]
enum Price {
    Cents(u64),
    Decimal(f64),
}

#[derive(Debug, PartialEq, Deserialize)]
struct Dimensions {
    weight: f64,
    count: u32,
}

#[derive(Debug, PartialEq, Deserialize)]
struct Order {
    price: Price,
    #[serde(flatten)]
    dimensions: Dimensions,
}

#[test]
fn untagged_and_flatten_read_numbers_in_the_workspace_build() {
    let order: Order =
        serde_json::from_str(r#"{"price": 12.5, "weight": 0.25, "count": 3}"#).expect("order");
    assert_eq!(
        order,
        Order {
            price: Price::Decimal(12.5),
            dimensions: Dimensions {
                weight: 0.25,
                count: 3
            },
        }
    );
    let cents: Price = serde_json::from_str("1250").expect("price");
    assert_eq!(cents, Price::Cents(1250));
}

async fn with_scope(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Scope::new("tenant"));
    next.run(request).await
}

async fn create(Json(order): Json<Order>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("{order:?}"))
}

#[tokio::test]
async fn a_handler_behind_the_layer_reads_untagged_and_flattened_numbers() {
    let dir = TempDir::new("serde-features");
    let store: StoreHandle = Arc::new(
        EmbeddedBackend::open(dir.path(), idemlog::Options::default()).expect("embedded store"),
    );
    let layer = IdempotencyLayer::new(
        store,
        IdempotencyConfig::new(Duration::from_secs(3600), Duration::from_secs(30)),
    );
    let app = Router::new()
        .route("/orders", post(create).route_layer(layer))
        .layer(middleware::from_fn(with_scope));
    let request = axum::http::Request::post("/orders")
        .header("idempotency-key", "order-1")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"price": 12.5, "weight": 0.25, "count": 3}"#))
        .expect("request");
    let response = app.oneshot(request).await.expect("response");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("body");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body.contains("Decimal(12.5)"), "{body}");
    assert!(body.contains("weight: 0.25, count: 3"), "{body}");
}
