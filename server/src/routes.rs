//! Every route the server serves, by method and path template: the one list that the router, the
//! HTTP metrics' `http_route` label and the OpenAPI document are checked against.

/// One route of the router: its method and path template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, as given to axum (`/payments/{id}`).
    pub path: &'static str,
}

const fn route(method: &'static str, path: &'static str) -> Route {
    Route { method, path }
}

/// Every route [`crate::router::router`] serves. The OpenAPI document must describe exactly these;
/// a test checks it, and that the router serves each of them. A request to a route missing here
/// panics in debug builds ([`crate::metrics`] labels requests from this list).
pub const ROUTES: &[Route] = &[
    route("POST", "/payments"),
    route("GET", "/payments/{id}"),
    route("GET", "/idempotency-keys/{key}"),
    route("GET", "/healthz"),
    route("GET", "/readyz"),
    route("GET", "/metrics"),
    route("GET", "/openapi.json"),
];

/// The route label (metrics, log spans) of a request no route matched (the 404 fallback).
pub const UNMATCHED_ROUTE: &str = "unmatched";
