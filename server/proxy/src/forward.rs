//! Forwarding a request to the upstream over a pooled keep-alive HTTP/1.1 client (hyper-util's
//! legacy client), and turning what happens into a response.
//!
//! Headers: hop-by-hop headers (RFC 9110 section 7.6.1: `Connection` and every header it names,
//! `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//! `Proxy-Authorization`, `Proxy-Authenticate`) are removed both ways. `X-Forwarded-For` and
//! `Forwarded` get the peer appended; `X-Forwarded-Proto` and `X-Forwarded-Host` are set; `Host`
//! becomes the upstream's. `Idempotency-Key` is passed on as it came. [`FENCING_TOKEN`] is always
//! removed from the client's request and, on a protected request, set to the claim's fencing token,
//! so an upstream that cares can refuse a stale holder.
//!
//! Failures:
//! - connecting fails (refused, unreachable, connect timeout): nothing reached the upstream → 502,
//!   and a protected key is released ([`ClaimDirective::Release`]);
//! - the upstream does not answer within the timeout, or the connection is lost after the request
//!   was sent: the effect is unknown → 504, and a protected key is left in progress until its lease
//!   runs out ([`ClaimDirective::EffectUnknown`]), so no retry runs the request a second time
//!   while the first may still be running;
//! - the upstream answered but the store cannot record the answer (its disk is full, PostgreSQL is
//!   down): the client gets the upstream's answer, and the key is left in progress until its lease
//!   runs out, as after a 504 (the layer's `UnrecordedResponse::SendAndHold`, set in `app`;
//!   outcome `unrecorded`). An answer the store refuses (too large for it) is stored without its
//!   body, as one over the route's stored limit is.
//!
//! A protected request's response body is read here, within the same timeout, up to the route's
//! stored limit: what the idempotency layer then stores is complete. A body larger than that is
//! passed on as what was read followed by the rest, streamed (the layer sends it whole to the first
//! client and stores only that the request completed). A streamed body (that rest, or a
//! pass-through response) that stops arriving for the timeout ends with an error, and the client's
//! connection is cut: it never hangs as long as the upstream does.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::uri::{Authority, Scheme};
use axum::http::{HeaderMap, Request, Response, StatusCode, Uri, Version};
use axum::response::IntoResponse;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idemlog_idempotency::layer::{Collected, collect_bounded};
use idemlog_idempotency::{ClaimDirective, ClaimInfo, Problem};
use tower_http::timeout::TimeoutBody;
use tracing::{debug, warn};

use crate::metrics::{UpstreamError, UpstreamMetrics};

/// The header carrying the claim's fencing token to the upstream (a decimal u64; a later claim of
/// the same key always has a larger one).
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("idempotency-fencing-token");

/// The TCP peer of a request, put in its extensions by the server.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// Why `--upstream` was refused.
#[derive(Debug, thiserror::Error)]
#[error("--upstream {url:?}: {reason}")]
pub struct UpstreamUrlError {
    url: String,
    reason: &'static str,
}

/// The upstream: where it is, the pooled client, the timeout and the metrics.
pub struct Upstream {
    client: Client<HttpConnector, Body>,
    authority: Authority,
    /// Path prefix of `--upstream`, without a trailing `/` (often empty).
    prefix: String,
    timeout: Duration,
    metrics: UpstreamMetrics,
}

impl Upstream {
    /// A client for `url` (`http://host:port[/prefix]`).
    pub fn new(
        url: &str,
        timeout: Duration,
        metrics: UpstreamMetrics,
    ) -> Result<Self, UpstreamUrlError> {
        let err = |reason| UpstreamUrlError {
            url: url.to_owned(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|_| err("not a valid URL"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(err(
                "only http:// upstreams are supported (the upstream is normally on the same host \
                 or network)",
            ));
        }
        let authority = uri.authority().cloned().ok_or_else(|| err("no host"))?;
        if uri.query().is_some() {
            return Err(err("a query string is not allowed"));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            client,
            authority,
            prefix,
            timeout,
            metrics,
        })
    }

    fn target(&self, uri: &Uri) -> Result<Uri, axum::http::Error> {
        let path = uri.path_and_query().map_or("/", |pq| pq.as_str());
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(format!("{}{path}", self.prefix))
            .build()
    }
}

/// The innermost service: forwards to the upstream. `max_stored` is `Some` on a protected route
/// (its stored-response limit), `None` for a pass-through.
#[derive(Clone)]
pub struct Forward {
    upstream: Arc<Upstream>,
    max_stored: Option<usize>,
}

impl Forward {
    /// Forwarding for pass-through requests.
    pub fn pass_through(upstream: Arc<Upstream>) -> Self {
        Self {
            upstream,
            max_stored: None,
        }
    }

    /// Forwarding for a protected route storing at most `max_stored` response bytes.
    pub fn protected(upstream: Arc<Upstream>, max_stored: usize) -> Self {
        Self {
            upstream,
            max_stored: Some(max_stored),
        }
    }
}

impl tower::Service<Request<Body>> for Forward {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(request).await) })
    }
}

/// What went wrong talking to the upstream.
enum Failure {
    /// Nothing was sent.
    Connect(String),
    /// No answer in time.
    Timeout,
    /// Lost after sending.
    Lost(String),
}

impl Forward {
    async fn forward(&self, request: Request<Body>) -> Response<Body> {
        let upstream = &*self.upstream;
        let protected = self.max_stored.is_some();
        let (mut parts, body) = request.into_parts();
        let peer = parts.extensions.get::<Peer>().map(|p| p.0);
        let fence = parts.extensions.get::<ClaimInfo>().map(|c| c.fence);
        let target = match upstream.target(&parts.uri) {
            Ok(target) => target,
            Err(e) => {
                warn!(error = %e, "request target could not be mapped to the upstream");
                return Problem::from_status(
                    StatusCode::BAD_REQUEST,
                    "the request target is not valid",
                )
                .into_response();
            }
        };
        let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        remove_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        // The proxy answered (or will answer) any `100-continue` itself and sends the body whole.
        parts.headers.remove(header::EXPECT);
        set_forwarded(&mut parts.headers, peer, original_host.as_ref());
        parts.headers.remove(FENCING_TOKEN);
        if let (true, Some(fence)) = (protected, fence) {
            parts
                .headers
                .insert(FENCING_TOKEN, HeaderValue::from(fence));
        }
        parts.uri = target;
        parts.version = Version::HTTP_11;
        let request = Request::from_parts(parts, body);

        let started = Instant::now();
        let exchange = async {
            let response = upstream.client.request(request).await.map_err(|e| {
                if e.is_connect() {
                    Failure::Connect(error_chain(&e))
                } else {
                    Failure::Lost(error_chain(&e))
                }
            })?;
            // Past the head, a body that stops arriving for the timeout ends the exchange: the
            // client's connection is cut rather than held open for as long as the upstream stalls.
            let response = response.map(|body| TimeoutBody::new(upstream.timeout, body));
            match self.max_stored {
                None => Ok(response.map(Body::new)),
                Some(limit) => read_bounded(response, limit).await,
            }
        };
        let result = match tokio::time::timeout(upstream.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Timeout),
        };
        let elapsed = started.elapsed();
        match result {
            Ok(mut response) => {
                upstream.metrics.observe(elapsed, response.status());
                remove_hop_by_hop(response.headers_mut());
                response
            }
            Err(Failure::Connect(error)) => {
                upstream.metrics.error(UpstreamError::Connect);
                warn!(%error, "could not connect to the upstream: 502, nothing was sent");
                let mut response = Problem::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unavailable",
                    "Upstream unavailable",
                    "the proxy could not connect to the service behind it; the request was not \
                     sent, so it may be retried with the same Idempotency-Key",
                )
                .into_response();
                response.extensions_mut().insert(ClaimDirective::Release);
                response
            }
            Err(failure) => {
                let (kind, error) = match failure {
                    Failure::Timeout => (
                        UpstreamError::Timeout,
                        format!("no answer within {:?}", upstream.timeout),
                    ),
                    Failure::Lost(e) => (UpstreamError::Lost, e),
                    Failure::Connect(_) => unreachable!("handled above"),
                };
                upstream.metrics.error(kind);
                let detail = if protected {
                    warn!(%error, kind = kind.label(), "upstream did not answer after the request was sent: 504, effect unknown, key left in progress until its lease runs out");
                    "the service behind the proxy did not answer after the request was sent, so \
                     it may or may not have taken effect; this Idempotency-Key stays in progress \
                     until its lease runs out (a retry with it gets 409 until then, and runs the \
                     request again only after)"
                } else {
                    warn!(%error, kind = kind.label(), "upstream did not answer: 504");
                    "the service behind the proxy did not answer in time"
                };
                let mut response = Problem::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream-timeout",
                    "Upstream did not answer",
                    detail,
                )
                .into_response();
                response
                    .extensions_mut()
                    .insert(ClaimDirective::EffectUnknown);
                response
            }
        }
    }
}

/// Reads a protected response's body up to `limit` bytes, with the layer's own bounded read: a
/// complete body comes back whole; a larger one as what was read followed by the rest of the
/// stream; a body that fails midway is a connection lost after the request was sent.
async fn read_bounded(
    response: Response<TimeoutBody<hyper::body::Incoming>>,
    limit: usize,
) -> Result<Response<Body>, Failure> {
    let (parts, body) = response.into_parts();
    match collect_bounded(Body::new(body), limit).await {
        Ok(Collected::Whole(body)) => Ok(Response::from_parts(parts, Body::from(body))),
        Ok(Collected::TooLarge(body)) => {
            debug!(
                limit,
                "upstream response larger than stored: streaming the rest"
            );
            Ok(Response::from_parts(parts, body))
        }
        Err(e) => Err(Failure::Lost(error_chain(&e))),
    }
}

/// An error and its sources, for the log.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Hop-by-hop headers that never cross the proxy.
const HOP_BY_HOP: [&str; 8] = [
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// Removes the hop-by-hop headers, and every header that `Connection` names.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    headers.remove(header::CONNECTION);
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Sets `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`
/// (appended, RFC 7239).
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: Option<SocketAddr>,
    host: Option<&HeaderValue>,
) {
    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
    const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
    const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");
    if let Some(peer) = peer {
        let ip = peer.ip().to_canonical();
        let xff = match headers.get(&XFF).and_then(|v| v.to_str().ok()) {
            Some(existing) => format!("{existing}, {ip}"),
            None => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert(XFF, v);
        }
        let node = match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let mut element = format!("for={node};proto=http");
        let quotable = |h: &&str| {
            h.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        };
        if let Some(host) = host.and_then(|h| h.to_str().ok()).filter(quotable) {
            element.push_str(&format!(";host=\"{host}\""));
        }
        let forwarded = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
            Some(existing) => format!("{existing}, {element}"),
            None => element,
        };
        if let Ok(v) = HeaderValue::from_str(&forwarded) {
            headers.insert(header::FORWARDED, v);
        }
    }
    headers.insert(XFP, HeaderValue::from_static("http"));
    match host {
        Some(host) => {
            headers.insert(XFH, host.clone());
        }
        None => {
            headers.remove(XFH);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            "keep-alive, x-secret".parse().expect("v"),
        );
        h.insert("keep-alive", "timeout=5".parse().expect("v"));
        h.insert("x-secret", "1".parse().expect("v"));
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().expect("v"));
        h.insert(header::UPGRADE, "h2c".parse().expect("v"));
        h.insert("idempotency-key", "k1".parse().expect("v"));
        h.insert(header::CONTENT_TYPE, "application/json".parse().expect("v"));
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["idempotency-key"], "k1");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn forwarded_headers_append_the_peer_and_name_the_original_host() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9".parse().expect("v"));
        let host = HeaderValue::from_static("shop.example:8081");
        set_forwarded(
            &mut h,
            Some("10.0.0.7:5555".parse().expect("addr")),
            Some(&host),
        );
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "shop.example:8081");
        assert_eq!(
            h[header::FORWARDED],
            "for=10.0.0.7;proto=http;host=\"shop.example:8081\""
        );
        let mut v6 = HeaderMap::new();
        set_forwarded(
            &mut v6,
            Some("[2001:db8::1]:80".parse().expect("addr")),
            None,
        );
        assert_eq!(v6[header::FORWARDED], "for=\"[2001:db8::1]\";proto=http");
        assert!(v6.get("x-forwarded-host").is_none());
    }

    #[test]
    fn upstream_urls_other_than_plain_http_are_refused() {
        let m = UpstreamMetrics::default();
        assert!(Upstream::new("https://x:1", Duration::from_secs(1), m.clone()).is_err());
        assert!(Upstream::new("not a url", Duration::from_secs(1), m.clone()).is_err());
        let with_prefix =
            Upstream::new("http://127.0.0.1:3000/api/", Duration::from_secs(1), m).expect("valid");
        let target = with_prefix
            .target(&"/orders?x=1".parse().expect("uri"))
            .expect("target");
        assert_eq!(target.to_string(), "http://127.0.0.1:3000/api/orders?x=1");
    }
}
