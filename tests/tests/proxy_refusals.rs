//! What `idemlog-proxy` refuses before the upstream runs: another body, method, path, query or
//! content type under a used key (422), a body over the limit, counted also when chunked (413), a
//! malformed key (400), a missing, too long or untrusted scope (401), a missing key on a route that
//! requires one (400), a path spelled so as to evade a route rule (400), a stalled body (408).
//! Every refusal claims nothing, and the upstream count proves the upstream never saw it.

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

/// Asserts `reply` is an RFC 9457 problem with `status`.
fn assert_problem(reply: &Reply, status: u16) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert!(
        reply
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json")),
        "problem+json: {reply:?}"
    );
    assert_eq!(reply.json()["status"], status, "{}", reply.text());
}

#[test]
fn the_same_key_with_another_body_is_422_and_the_upstream_runs_once() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-422");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(first.status, 201, "{first:?}");
    let other = proxy.post(TENANT_A, "order-1", OTHER_ORDER, "");
    assert_problem(&other, 422);
    assert!(!other.replayed());
    assert_eq!(upstream.runs("order-1"), 1);
    // The original request still replays.
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    // Another path under the same key is another request too.
    let elsewhere = proxy.request(
        "POST",
        "/refunds",
        &order_headers(TENANT_A, "order-1", ""),
        ORDER.as_bytes(),
    );
    assert_problem(&elsewhere, 422);
    // So is another method, another query, and another content type.
    let patch = proxy.request(
        "PATCH",
        ORDERS,
        &order_headers(TENANT_A, "order-1", ""),
        ORDER.as_bytes(),
    );
    assert_problem(&patch, 422);
    let query = proxy.request(
        "POST",
        "/orders?dry_run=1",
        &order_headers(TENANT_A, "order-1", ""),
        ORDER.as_bytes(),
    );
    assert_problem(&query, 422);
    let text = proxy.request(
        "POST",
        ORDERS,
        &[
            (TENANT_HEADER, TENANT_A),
            ("Idempotency-Key", "order-1"),
            ("Content-Type", "text/plain"),
        ],
        ORDER.as_bytes(),
    );
    assert_problem(&text, 422);
    assert_eq!(upstream.total(), 1);
}

#[test]
fn a_body_over_the_limit_is_413_and_never_reaches_the_upstream() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-413");
    let proxy = Proxy::start(&upstream, dir.path(), &["--max-body-bytes", "1024"]);
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(4096));
    let reply = proxy.post(TENANT_A, "order-1", &big, "");
    assert_problem(&reply, 413);
    assert_eq!(upstream.total(), 0, "no silent pass-through");
    // The refusal did not claim the key: the same key with a body within the limit runs.
    let ok = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(ok.status, 201, "{ok:?}");
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn the_body_limit_is_exact_and_holds_for_a_chunked_body() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-413-chunked");
    let proxy = Proxy::start(&upstream, dir.path(), &["--max-body-bytes", "1024"]);
    let body_of = |len: usize| {
        let pad = len - r#"{"pad": ""}"#.len();
        format!(r#"{{"pad": "{}"}}"#, "x".repeat(pad))
    };
    let at_limit = proxy.post(TENANT_A, "order-1", &body_of(1024), "");
    assert_eq!(at_limit.status, 201, "1024 bytes are allowed: {at_limit:?}");
    let over = proxy.post(TENANT_A, "order-2", &body_of(1025), "");
    assert_problem(&over, 413);
    // A chunked body announces no length: the proxy counts, and still refuses.
    let chunked = |key: &str, body: &str| {
        let mut raw = format!(
            "POST {ORDERS} HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\
             {TENANT_HEADER}: {TENANT_A}\r\nIdempotency-Key: {key}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        for piece in body.as_bytes().chunks(300) {
            raw.push_str(&format!("{:x}\r\n", piece.len()));
            raw.push_str(std::str::from_utf8(piece).expect("ASCII"));
            raw.push_str("\r\n");
        }
        raw.push_str("0\r\n\r\n");
        http_raw(proxy.addr, raw.as_bytes()).expect("an answer")
    };
    let refused = chunked("order-3", &body_of(1025));
    assert_problem(&refused, 413);
    assert_eq!(upstream.runs("order-2") + upstream.runs("order-3"), 0);
    let accepted = chunked("order-4", &body_of(1000));
    assert_eq!(accepted.status, 201, "{accepted:?}");
    let replay = proxy.post(TENANT_A, "order-4", &body_of(1000), "");
    assert!(
        replay.replayed(),
        "the chunked body and the same body with a length are one request: {replay:?}"
    );
    assert_eq!(upstream.total(), 2);
}

#[test]
fn a_body_over_a_route_limit_is_413() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-413-route");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
methods = ["POST"]
path = "/uploads/**"
max_body_bytes = 100
"#,
        &[],
    );
    let body = format!(r#"{{"pad": "{}"}}"#, "x".repeat(200));
    let headers = order_headers(TENANT_A, "upload-1", "");
    let refused = proxy.request("POST", "/uploads/a/b", &headers, body.as_bytes());
    assert_problem(&refused, 413);
    // The default limit (1 MiB) applies elsewhere.
    let accepted = proxy.post(TENANT_A, "order-1", &body, "");
    assert_eq!(accepted.status, 201, "{accepted:?}");
    assert_eq!(upstream.total(), 1);
}

#[test]
fn a_malformed_key_is_400_and_never_reaches_the_upstream() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-400");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let too_long = "k".repeat(256);
    for key in ["has space", "\"unterminated", too_long.as_str()] {
        let reply = proxy.post(TENANT_A, key, ORDER, "");
        assert_problem(&reply, 400);
    }
    // Two keys on one request.
    let reply = proxy.request(
        "POST",
        ORDERS,
        &[
            (TENANT_HEADER, TENANT_A),
            ("Idempotency-Key", "a"),
            ("Idempotency-Key", "b"),
        ],
        ORDER.as_bytes(),
    );
    assert_problem(&reply, 400);
    assert_eq!(upstream.total(), 0);
    // The longest key is fine.
    let longest = "k".repeat(255);
    let reply = proxy.post(TENANT_A, &longest, ORDER, "");
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(upstream.runs(&longest), 1);
}

#[test]
fn a_protected_request_without_a_scope_header_is_401() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-401-none");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let reply = proxy.request(
        "POST",
        ORDERS,
        &[
            ("Idempotency-Key", "order-1"),
            ("Content-Type", "application/json"),
        ],
        ORDER.as_bytes(),
    );
    assert_problem(&reply, 401);
    let empty = proxy.post("", "order-1", ORDER, "");
    assert_problem(&empty, 401);
    // A scope is 1 to 255 bytes: a longer one is refused, not cut or hashed into another.
    let long = "t".repeat(256);
    let too_long = proxy.post(&long, "order-1", ORDER, "");
    assert_problem(&too_long, 401);
    assert_eq!(upstream.total(), 0);
    let longest = proxy.post(&long[..255], "order-1", ORDER, "");
    assert_eq!(longest.status, 201, "{longest:?}");
}

#[test]
fn a_scope_header_from_an_untrusted_peer_is_401() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-401-untrusted");
    // 127.0.0.1 is outside 10.0.0.0/8: the test client is not the trusted gateway.
    let proxy = Proxy::start_bare(
        &upstream.url(),
        dir.path(),
        &[
            "--scope-header",
            TENANT_HEADER,
            "--trusted-peer",
            "10.0.0.0/8",
        ],
    );
    let reply = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&reply, 401);
    assert_eq!(upstream.total(), 0);
    // Nor does X-Forwarded-For make the peer trusted.
    let spoofed = proxy.request(
        "POST",
        ORDERS,
        &[
            (TENANT_HEADER, TENANT_A),
            ("Idempotency-Key", "order-2"),
            ("X-Forwarded-For", "10.1.2.3"),
            ("Forwarded", "for=10.1.2.3"),
        ],
        ORDER.as_bytes(),
    );
    assert_problem(&spoofed, 401);
    // The header is refused on a pass-through too, so nothing behind the proxy sees a forged
    // scope; without it a pass-through goes on.
    let forged = proxy.request("GET", "/orders/1", &[(TENANT_HEADER, TENANT_A)], b"");
    assert_problem(&forged, 401);
    assert_eq!(upstream.total(), 0);
    let plain = proxy.request("GET", "/orders/1", &[], b"");
    assert_eq!(plain.status, 201, "{plain:?}");
    assert_eq!(upstream.total(), 1);
}

#[test]
fn a_route_that_requires_a_key_refuses_a_request_without_one_with_400() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-key-required");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
methods = ["POST"]
path = "/payments/*"
key = "required"
"#,
        &[],
    );
    let headers = [
        (TENANT_HEADER, TENANT_A),
        ("Content-Type", "application/json"),
    ];
    let refused = proxy.request("POST", "/payments/card", &headers, ORDER.as_bytes());
    assert_problem(&refused, 400);
    assert_eq!(upstream.total(), 0);
    // `*` is one segment: a deeper path is not this route, so the key stays optional there.
    let deeper = proxy.request("POST", "/payments/card/extra", &headers, ORDER.as_bytes());
    assert_eq!(deeper.status, 201, "{deeper:?}");
    // With a key the route works and is protected.
    let with_key = order_headers(TENANT_A, "pay-1", "");
    let first = proxy.request("POST", "/payments/card", &with_key, ORDER.as_bytes());
    let replay = proxy.request("POST", "/payments/card", &with_key, ORDER.as_bytes());
    assert_eq!(first.status, 201, "{first:?}");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(upstream.runs("pay-1"), 1);
}

#[test]
fn a_route_rule_cannot_be_evaded_by_an_equivalent_spelling_of_its_path() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-path-spelling");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
methods = ["POST"]
path = "/payments/*"
key = "required"
"#,
        &[],
    );
    let headers = [
        (TENANT_HEADER, TENANT_A),
        ("Content-Type", "application/json"),
    ];
    // RFC 3986 section 6.2.2: a percent-encoded unreserved character and dot-segments are the same
    // path. The proxy may normalise them or refuse the request, but must not forward it as a
    // request the rule does not cover.
    for path in [
        "/%70ayments/card",
        "/payments/./card",
        "/x/../payments/card",
        "/payments/x/../card",
    ] {
        let reply = proxy.request("POST", path, &headers, ORDER.as_bytes());
        assert_eq!(
            reply.status,
            400,
            "{path}: {} {}",
            reply.status,
            reply.text()
        );
    }
    let seen: Vec<String> = upstream.requests().into_iter().map(|r| r.path).collect();
    assert!(
        seen.is_empty(),
        "keyless payments reached the upstream: {seen:?}"
    );
}

#[test]
fn a_stalled_request_body_is_408_and_claims_nothing() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-408");
    let proxy = Proxy::start(&upstream, dir.path(), &["--body-read-timeout", "1s"]);
    let mut stream = std::net::TcpStream::connect(proxy.addr).expect("connect");
    let head = format!(
        "POST {ORDERS} HTTP/1.1\r\nHost: shop\r\n{TENANT_HEADER}: {TENANT_A}\r\n\
         Idempotency-Key: order-1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n\
         {{\"item\":"
    );
    std::io::Write::write_all(&mut stream, head.as_bytes()).expect("send");
    // The rest of the body never comes.
    let (raw, closed) = read_until_closed(&mut stream, std::time::Duration::from_secs(20));
    let text = String::from_utf8_lossy(&raw);
    assert!(closed.is_some(), "the connection is closed: {text}");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(upstream.total(), 0);
    // Nothing was claimed: the whole request runs now.
    let reply = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(!reply.replayed());
    assert_eq!(upstream.runs("order-1"), 1);
}
