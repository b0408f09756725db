//! Orders: a tiny axum app whose `POST /orders` runs once per `Idempotency-Key`
//! on the embedded store. Run it and create an order twice with one key:
//!
//! ```sh
//! cargo run -p idemlog-idempotency --example orders -- ./orders-data 127.0.0.1:3000
//! curl -si localhost:3000/orders -H 'X-Tenant: shop-1' -H 'Idempotency-Key: k1' \
//!     -H 'Content-Type: application/json' -d '{"item": "book"}'
//! ```
//!
//! The second call replays the first answer (`idempotent-replayed: true`, same order id).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, Scope};
use serde_json::{Value, json};

/// The scope is whoever your authentication says the caller is (a header here, for brevity).
/// Without one, the layer answers 401.
async fn tenant(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok());
    if let Some(scope) = tenant
        .filter(|t| !t.is_empty())
        .map(|t| Scope::new(t.to_owned()))
    {
        request.extensions_mut().insert(scope);
    }
    next.run(request).await
}

async fn create_order(State(ids): State<Arc<AtomicU64>>, Json(order): Json<Value>) -> Response {
    let id = ids.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "order": order })),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "./orders-data".to_owned());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let store = EmbeddedBackend::open(&dir, idemlog::Options::default())?;
    // Keys are remembered for a day; a claim holds its key 30 s unless its handler still runs.
    let config = IdempotencyConfig::new(Duration::from_secs(86_400), Duration::from_secs(30));
    let app = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::new(Arc::new(store), config))
        .with_state(Arc::new(AtomicU64::new(1)))
        .layer(middleware::from_fn(tenant));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
