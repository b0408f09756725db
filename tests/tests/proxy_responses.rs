//! What `idemlog-proxy` keeps of a response and how it sends it: the stored-header allow-list
//! (never `Set-Cookie` unless a route lists it; `Content-Encoding` always, as it describes the
//! bytes), a response larger than what is stored (the first client still gets it whole; its replay
//! says the request completed and the body was not kept), exact framing of firsts and replays on
//! one keep-alive connection, and a large request body passed on whole.

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

#[test]
fn set_cookie_is_not_replayed_by_default() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-cookie-default");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "cookie");
    assert_eq!(first.status, 201, "{first:?}");
    assert!(
        first.header("set-cookie").is_some(),
        "the first client gets the upstream's cookie: {first:?}"
    );
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "cookie");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header("set-cookie"),
        None,
        "a session cookie is never handed to whoever replays the key: {replay:?}"
    );
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn set_cookie_is_replayed_only_on_a_route_that_lists_it() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-cookie-listed");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
methods = ["POST"]
path = "/sessions"
stored_headers = ["content-type", "set-cookie"]
"#,
        &[],
    );
    let headers = order_headers(TENANT_A, "session-1", "cookie");
    let first = proxy.request("POST", "/sessions", &headers, ORDER.as_bytes());
    assert_eq!(first.status, 201, "{first:?}");
    let cookie = first.header("set-cookie").expect("Set-Cookie").to_owned();
    let replay = proxy.request("POST", "/sessions", &headers, ORDER.as_bytes());
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header("set-cookie"), Some(cookie.as_str()));
    assert_eq!(
        replay.header("location"),
        None,
        "the route's list replaces the default one: {replay:?}"
    );
    // The route is exact: another path keeps the default list.
    let other = order_headers(TENANT_A, "session-2", "cookie");
    let _ = proxy.request("POST", "/sessions/x", &other, ORDER.as_bytes());
    let replay = proxy.request("POST", "/sessions/x", &other, ORDER.as_bytes());
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header("set-cookie"), None, "{replay:?}");
}

#[test]
fn a_response_over_the_stored_limit_is_sent_whole_and_its_replay_names_the_status() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-big");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--max-stored-response-bytes", "4096"],
    );
    let size = 300_000;
    let behaviour = format!("big={size},status=202");
    let first = proxy.post(TENANT_A, "order-1", ORDER, &behaviour);
    assert_eq!(first.status, 202, "{:?}", first.headers);
    assert_eq!(first.body.len(), size, "the first client gets every byte");
    assert!(first.body.iter().skip(64).all(|b| *b == b'x'));

    let replay = proxy.post(TENANT_A, "order-1", ORDER, &behaviour);
    assert!(
        replay
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json")),
        "{replay:?}"
    );
    // As settled in the contract's changes: the original status, marked as a replay, with the
    // allow-listed headers, and a problem body naming the status.
    assert_eq!(replay.status, 202, "{replay:?}");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header("location"), first.header("location"));
    let problem = replay.json();
    assert_eq!(problem["status"], 202, "{problem}");
    assert_eq!(
        problem["type"], "urn:idemlog:problem:response-body-not-kept",
        "{problem}"
    );
    let text = problem["detail"].as_str().expect("detail").to_owned();
    assert!(
        text.contains("202"),
        "the replay says the request completed with status 202: {text}"
    );
    assert!(
        replay.body.len() < 4096,
        "not the body: {} bytes",
        replay.body.len()
    );
    assert_eq!(upstream.runs("order-1"), 1, "the upstream never runs twice");
    // The same when the upstream announces no length (chunked): the proxy counts.
    let behaviour = format!("big={size},status=201,chunked");
    let first = proxy.post(TENANT_A, "order-3", ORDER, &behaviour);
    assert_eq!(first.status, 201, "{:?}", first.headers);
    assert_eq!(first.body.len(), size, "the first client gets every byte");
    let replay = proxy.post(TENANT_A, "order-3", ORDER, &behaviour);
    assert_eq!(replay.status, 201);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.json()["status"], 201, "{}", replay.text());
    assert_eq!(upstream.runs("order-3"), 1);
    // A response within the limit on the same proxy is stored as usual.
    let small = proxy.post(TENANT_A, "order-2", ORDER, "big=1000");
    let again = proxy.post(TENANT_A, "order-2", ORDER, "big=1000");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, small.body);
    assert_eq!(small.body.len(), 1000);
}

#[test]
fn responses_and_replays_keep_their_framing_on_one_keep_alive_connection() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-keep-alive");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let mut conn = KeepAlive::open(proxy.addr);
    // The same connection carries firsts, replays, a 204 without a body, a chunked answer and a
    // pass-through: every response must be framed exactly, or the next one is misread.
    let mut firsts = Vec::new();
    for (key, behaviour) in [
        ("ka-1", ""),
        ("ka-204", "status=204"),
        ("ka-chunked", "chunked"),
        ("ka-big-chunked", "big=5000,chunked"),
    ] {
        let headers = order_headers(TENANT_A, key, behaviour);
        let first = conn.request("POST", ORDERS, &headers, ORDER.as_bytes());
        let replay = conn.request("POST", ORDERS, &headers, ORDER.as_bytes());
        assert!(!first.replayed(), "{key}: {first:?}");
        assert!(replay.replayed(), "{key}: {replay:?}");
        assert_eq!(replay.status, first.status, "{key}");
        assert_eq!(replay.body, first.body, "{key}: byte for byte");
        let passed = conn.request("GET", "/orders/1", &[], b"");
        assert_eq!(passed.status, 201, "{passed:?}");
        firsts.push(first);
    }
    assert_eq!(firsts[1].status, 204);
    assert!(firsts[1].body.is_empty());
    assert_eq!(firsts[3].body.len(), 5000);
    for key in ["ka-1", "ka-204", "ka-chunked", "ka-big-chunked"] {
        assert_eq!(upstream.runs(key), 1, "{key}");
    }
}

#[test]
fn a_large_request_body_reaches_the_upstream_whole() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-large-request");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let body = format!(r#"{{"pad": "{}"}}"#, "y".repeat(900_000));
    let first = proxy.post(TENANT_A, "order-1", &body, "");
    assert_eq!(first.status, 201, "{first:?}");
    let seen = &upstream.requests_with_key("order-1")[0];
    assert_eq!(seen.body_len, body.len() as u64);
    let replay = proxy.post(TENANT_A, "order-1", &body, "");
    assert!(replay.replayed(), "{replay:?}");
    let mut changed = body.clone().into_bytes();
    changed[500_000] = b'z';
    let other = proxy.request(
        "POST",
        ORDERS,
        &order_headers(TENANT_A, "order-1", ""),
        &changed,
    );
    assert_eq!(other.status, 422, "one byte differs: {other:?}");
    assert_eq!(upstream.total(), 1);
}

#[test]
fn a_compressed_answer_replays_with_its_content_encoding() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-gzip");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
path = "/narrow"
stored_headers = ["content-type"]
"#,
        &[],
    );
    let first = proxy.post(TENANT_A, "order-1", ORDER, "gzip");
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    assert_eq!(&first.body[..2], &[0x1f, 0x8b], "gzip bytes");
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "gzip");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    // The same bytes without `Content-Encoding: gzip` are not the same answer: a client would read
    // gzip as JSON.
    assert_eq!(
        replay.header("content-encoding"),
        Some("gzip"),
        "{:?}",
        replay.headers
    );
    // It describes the bytes, so no allow-list can leave it out.
    let headers = order_headers(TENANT_A, "narrow-1", "gzip");
    let first = proxy.request("POST", "/narrow", &headers, ORDER.as_bytes());
    let replay = proxy.request("POST", "/narrow", &headers, ORDER.as_bytes());
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("content-encoding"), Some("gzip"));
    assert_eq!(replay.header("location"), None, "the narrow list holds");
}

#[test]
fn concurrent_copies_of_an_oversize_answer_run_the_upstream_once() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-big-concurrent");
    let proxy = std::sync::Arc::new(Proxy::start(
        &upstream,
        dir.path(),
        &["--max-stored-response-bytes", "4096"],
    ));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(10));
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let proxy = std::sync::Arc::clone(&proxy);
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                proxy.post(TENANT_A, "order-1", ORDER, "slow=300,big=200000")
            })
        })
        .collect();
    let replies: Vec<Reply> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    assert_eq!(upstream.runs("order-1"), 1);
    let whole: Vec<&Reply> = replies
        .iter()
        .filter(|r| !r.replayed() && r.status == 201)
        .collect();
    assert_eq!(whole.len(), 1, "one client gets the answer");
    assert_eq!(whole[0].body.len(), 200_000);
    for reply in &replies {
        assert!(
            reply.status == 409 || reply.status == 201,
            "{} {}",
            reply.status,
            reply.text()
        );
        if reply.replayed() {
            assert_eq!(reply.json()["status"], 201, "{}", reply.text());
        }
    }
}
