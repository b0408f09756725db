//! `idemlog-proxy` in front of the Python counting upstream: concurrent copies run the upstream
//! once, completed keys replay byte for byte, and what is not protected passes through untouched.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

/// `copies` clients, each on a connection of its own, POST the same order under `key` at once.
fn concurrent_copies(proxy: &Arc<Proxy>, copies: usize, key: &str, behaviour: &str) -> Vec<Reply> {
    let barrier = Arc::new(std::sync::Barrier::new(copies));
    let threads: Vec<_> = (0..copies)
        .map(|_| {
            let (proxy, barrier) = (Arc::clone(proxy), Arc::clone(&barrier));
            let (key, behaviour) = (key.to_owned(), behaviour.to_owned());
            std::thread::spawn(move || {
                barrier.wait();
                proxy.post(TENANT_A, &key, ORDER, &behaviour)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect()
}

#[test]
fn twenty_concurrent_copies_run_the_upstream_once() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-concurrent");
    let proxy = Arc::new(Proxy::start(&upstream, dir.path(), &[]));
    let replies = concurrent_copies(&proxy, 20, "order-1", "slow=300");
    assert_eq!(upstream.runs("order-1"), 1, "{replies:#?}");
    let fresh: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one first answer: {replies:#?}");
    for reply in &replies {
        match reply.status {
            201 => assert_eq!(reply.body, fresh[0].body, "a replay is the first answer"),
            409 => assert!(
                reply.header("retry-after").is_some(),
                "a 409 for a copy in progress says when to retry: {reply:?}"
            ),
            other => panic!("unexpected status {other}: {reply:?}"),
        }
    }
    assert!(
        replies.iter().any(|r| r.status == 409),
        "the copies overlapped the first run (else this proves nothing): {replies:#?}"
    );
    // Every copy that got a 409 can now retry and gets the first answer.
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed());
    assert_eq!(retry.body, fresh[0].body);
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn a_replay_is_the_first_answer_byte_for_byte_with_idempotent_replayed() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-replay");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed(), "{first:?}");
    let body = first.json();
    assert_eq!(
        body["key"], "order-1",
        "the key reached the upstream as sent"
    );
    assert_eq!(body["count"], 1);

    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(replay.status, 201, "{replay:?}");
    assert!(replay.replayed(), "Idempotent-Replayed: true: {replay:?}");
    assert_eq!(
        replay.body, first.body,
        "byte for byte (the body holds the upstream's run id, sequence and a nonce)"
    );
    for header in ["content-type", "location", "etag"] {
        assert!(first.header(header).is_some(), "{header} in {first:?}");
        assert_eq!(
            replay.header(header),
            first.header(header),
            "{header} is on the default allow-list"
        );
    }
    assert_eq!(
        replay.header("x-upstream-seq"),
        None,
        "a header off the allow-list is not stored: {replay:?}"
    );
    assert_eq!(upstream.runs("order-1"), 1);
    assert_eq!(upstream.total(), 1);
}

#[test]
fn an_upstream_4xx_is_stored_and_replayed_without_a_second_run() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-4xx");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "status=404");
    assert_eq!(first.status, 404, "{first:?}");
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "status=404");
    assert_eq!(replay.status, 404, "{replay:?}");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn patch_with_a_key_is_protected_too() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-patch");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let headers = order_headers(TENANT_A, "patch-1", "");
    let first = proxy.request("PATCH", "/orders/7", &headers, ORDER.as_bytes());
    assert_eq!(first.status, 201, "{first:?}");
    let replay = proxy.request("PATCH", "/orders/7", &headers, ORDER.as_bytes());
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(upstream.runs("patch-1"), 1);
}

#[test]
fn requests_without_a_key_and_other_methods_pass_through_untouched() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-passthrough");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    // POST without a key: runs every time, never marked as a replay.
    let no_key = [
        (TENANT_HEADER, TENANT_A),
        ("Content-Type", "application/json"),
    ];
    let a = proxy.request("POST", ORDERS, &no_key, ORDER.as_bytes());
    let b = proxy.request("POST", ORDERS, &no_key, ORDER.as_bytes());
    assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
    assert!(!a.replayed() && !b.replayed());
    assert_ne!(a.body, b.body, "two runs, two answers");
    // GET, PUT and DELETE carrying a key: not protected, so each runs.
    for method in ["GET", "PUT", "DELETE"] {
        let key = format!("{method}-key");
        let headers = order_headers(TENANT_A, &key, "");
        let first = proxy.request(method, "/orders/1?x=1", &headers, b"");
        let second = proxy.request(method, "/orders/1?x=1", &headers, b"");
        assert_eq!((first.status, second.status), (201, 201), "{method}");
        assert!(!second.replayed(), "{method}: {second:?}");
        assert_ne!(first.body, second.body, "{method} ran twice");
        assert_eq!(upstream.runs(&key), 2, "{method}");
        assert_eq!(
            first.json()["path"],
            "/orders/1?x=1",
            "path and query are passed on"
        );
    }
    assert_eq!(upstream.total(), 2 + 6);
    // Headers reach the upstream unchanged, and the passed-through request has no fencing token.
    let requests = upstream.requests();
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert_eq!(first.body_len, ORDER.len() as u64);
    assert_eq!(
        first.header(FENCING_TOKEN),
        None,
        "no claim, no fencing token: {first:?}"
    );
}

#[test]
fn the_fencing_token_reaches_the_upstream_and_grows_after_a_release() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-fencing");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let failed = proxy.post(TENANT_A, "order-1", ORDER, "fail");
    assert_eq!(failed.status, 500, "{failed:?}");
    let done = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(done.status, 201, "{done:?}");
    let runs = upstream.requests_with_key("order-1");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (first, second) = (runs[0].fencing_token(), runs[1].fencing_token());
    assert!(
        second > first,
        "the claim after the release has a larger token: {first} then {second}"
    );
    let other = proxy.post(TENANT_A, "order-2", ORDER, "");
    assert_eq!(other.status, 201);
    let _ = upstream.requests_with_key("order-2")[0].fencing_token();
}

#[test]
fn forwarding_sets_forwarded_headers_and_drops_hop_by_hop_ones() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-forwarding");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let headers = [
        (TENANT_HEADER, TENANT_A),
        ("Idempotency-Key", "order-1"),
        ("Content-Type", "application/json"),
        ("Host", "shop.example"),
        ("Connection", "close, X-Hop-Secret"),
        ("X-Hop-Secret", "must-not-pass"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Authorization", "Basic c2VjcmV0"),
        ("X-End-To-End", "kept"),
        ("X-Forwarded-For", "203.0.113.7"),
        // A client cannot choose the token the upstream sees.
        (FENCING_TOKEN, "18446744073709551615"),
    ];
    let reply = proxy.request("POST", ORDERS, &headers, ORDER.as_bytes());
    assert_eq!(reply.status, 201, "{reply:?}");
    let seen = &upstream.requests_with_key("order-1")[0];
    assert_eq!(seen.header("x-end-to-end"), Some("kept"), "{seen:?}");
    assert_eq!(seen.header("idempotency-key"), Some("order-1"));
    for hop in ["x-hop-secret", "keep-alive", "proxy-authorization"] {
        assert_eq!(seen.header(hop), None, "{hop} is hop-by-hop: {seen:?}");
    }
    assert!(
        seen.header_values("connection")
            .iter()
            .all(|v| !v.to_ascii_lowercase().contains("x-hop-secret")),
        "{seen:?}"
    );
    let xff = seen
        .header("x-forwarded-for")
        .unwrap_or_else(|| panic!("X-Forwarded-For: {seen:?}"));
    assert!(
        xff.starts_with("203.0.113.7") && xff.ends_with("127.0.0.1"),
        "the peer is appended to what came: {xff}"
    );
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"), "{seen:?}");
    assert_eq!(
        seen.header("x-forwarded-host"),
        Some("shop.example"),
        "{seen:?}"
    );
    let forwarded = seen
        .header("forwarded")
        .unwrap_or_else(|| panic!("Forwarded: {seen:?}"))
        .to_ascii_lowercase();
    assert!(
        forwarded.contains("for=") && forwarded.contains("127.0.0.1"),
        "{forwarded}"
    );
    assert!(forwarded.contains("proto=http"), "{forwarded}");
    assert_eq!(seen.header_values(FENCING_TOKEN).len(), 1, "{seen:?}");
    assert_ne!(
        seen.fencing_token(),
        u64::MAX,
        "the client's token was dropped"
    );
    // Nor on a request passed through.
    let passed = proxy.request(
        "POST",
        ORDERS,
        &[(FENCING_TOKEN, "7"), ("X-Passed", "yes")],
        ORDER.as_bytes(),
    );
    assert_eq!(passed.status, 201, "{passed:?}");
    let seen = upstream
        .requests()
        .into_iter()
        .find(|r| r.header("x-passed").is_some())
        .expect("the passed-through request");
    assert_eq!(seen.header(FENCING_TOKEN), None, "{seen:?}");
}

#[test]
fn an_unprotected_request_needs_no_scope() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-no-scope-needed");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let get = proxy.request("GET", "/anything", &[], b"");
    assert_eq!(get.status, 201, "{get:?}");
    let post = proxy.request("POST", "/anything", &[], ORDER.as_bytes());
    assert_eq!(
        post.status, 201,
        "a POST without a key is not protected: {post:?}"
    );
    assert_eq!(upstream.total(), 2);
}

#[test]
fn a_client_that_hangs_up_mid_request_still_gets_the_completed_answer_on_retry() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-hangup");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    {
        let mut stream = TcpStream::connect(proxy.addr).expect("connect");
        let head = format!(
            "POST {ORDERS} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{TENANT_HEADER}: {TENANT_A}\r\n\
             Idempotency-Key: order-1\r\nContent-Type: application/json\r\n{BEHAVIOUR}: slow=800\r\n\
             Content-Length: {}\r\n\r\n{ORDER}",
            proxy.addr,
            ORDER.len()
        );
        stream.write_all(head.as_bytes()).expect("send");
        wait_until(Duration::from_secs(10), "the upstream run", || {
            upstream.runs("order-1") == 1
        });
        // The client gives up while the upstream is still working.
    }
    // The run completes and is kept: the retry is its replay, not a second run.
    let mut reply = proxy.post(TENANT_A, "order-1", ORDER, "");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reply.status == 409 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        reply = proxy.post(TENANT_A, "order-1", ORDER, "");
    }
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(
        reply.replayed(),
        "the abandoned run was completed: {reply:?}"
    );
    assert_eq!(reply.json()["key"], "order-1");
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn a_quoted_key_and_the_bare_key_are_one_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-quoted-key");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let bare = proxy.post(TENANT_A, "order-1", ORDER, "");
    let quoted = proxy.post(TENANT_A, "\"order-1\"", ORDER, "");
    assert_eq!(bare.status, 201, "{bare:?}");
    assert!(quoted.replayed(), "{quoted:?}");
    assert_eq!(quoted.body, bare.body);
    assert_eq!(upstream.total(), 1);
}

#[test]
fn an_expired_key_runs_again() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-ttl");
    let proxy = Proxy::start(&upstream, dir.path(), &["--key-ttl", "1s"]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "");
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let later = proxy.post(TENANT_A, "order-1", OTHER_ORDER, "");
    assert_eq!(
        later.status, 201,
        "the key expired, so it is free: {later:?}"
    );
    assert!(!later.replayed());
    assert_ne!(later.body, first.body);
    assert_eq!(upstream.runs("order-1"), 2);
}

#[test]
fn a_route_rule_chooses_the_protected_methods_and_the_key_ttl() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-route-methods");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
methods = ["PUT"]
path = "/documents/*"

[[route]]
path = "/carts/**"
key_ttl = "1s"
"#,
        &[],
    );
    // PUT is protected on /documents/*; elsewhere PUT passes through.
    let put = order_headers(TENANT_A, "doc-1", "");
    let first = proxy.request("PUT", "/documents/7", &put, ORDER.as_bytes());
    let replay = proxy.request("PUT", "/documents/7", &put, ORDER.as_bytes());
    assert_eq!(first.status, 201, "{first:?}");
    assert!(replay.replayed(), "PUT is protected here: {replay:?}");
    assert_eq!(upstream.runs("doc-1"), 1);
    let elsewhere = order_headers(TENANT_A, "doc-2", "");
    let _ = proxy.request("PUT", "/other/7", &elsewhere, ORDER.as_bytes());
    let again = proxy.request("PUT", "/other/7", &elsewhere, ORDER.as_bytes());
    assert!(!again.replayed(), "PUT elsewhere passes through");
    assert_eq!(upstream.runs("doc-2"), 2);
    // /carts keeps its keys for 1 s; the default route for a day.
    let cart = proxy.post_to("/carts/1", TENANT_A, "cart-1", ORDER);
    let order = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!((cart.status, order.status), (201, 201));
    std::thread::sleep(Duration::from_millis(1500));
    let cart_again = proxy.post_to("/carts/1", TENANT_A, "cart-1", ORDER);
    let order_again = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(
        !cart_again.replayed(),
        "the cart key expired: {cart_again:?}"
    );
    assert!(order_again.replayed(), "{order_again:?}");
    assert_eq!(upstream.runs("cart-1"), 2);
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn a_passed_through_path_reaches_the_upstream_exactly_as_spelled() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-raw-path");
    // No route rules: nothing to evade, so no spelling is refused or rewritten.
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let paths = [
        "/files/a%2Fb/c%20d?q=%2F&x=..",
        "/a//b/./c/../d",
        "/%7Euser/caf%C3%A9;v=1",
    ];
    for path in paths {
        let get = proxy.request("GET", path, &[], b"");
        assert_eq!(get.status, 201, "{path}: {get:?}");
        let post = proxy.request("POST", path, &[], ORDER.as_bytes());
        assert_eq!(post.status, 201, "{path}: {post:?}");
    }
    let seen: Vec<String> = upstream.requests().into_iter().map(|r| r.path).collect();
    let expected: Vec<String> = paths
        .iter()
        .flat_map(|p| [p.to_string(), p.to_string()])
        .collect();
    assert_eq!(seen, expected);
}

#[test]
fn copies_spread_over_four_workers_still_run_the_upstream_once() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-workers");
    let proxy = Arc::new(Proxy::start(&upstream, dir.path(), &["--workers", "4"]));
    // The listener accepts before the start-up line is logged (and read from the pipe).
    let named = |proxy: &Proxy| {
        proxy
            .logs()
            .iter()
            .any(|line| line.contains("proxy listening") && line.contains("workers=4"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !named(&proxy) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        named(&proxy),
        "the start-up log names the workers: {:?}",
        proxy.logs()
    );
    // Each copy on a connection of its own: the main thread spreads them over the four workers,
    // whose event loops claim the one key against each other.
    let replies = concurrent_copies(&proxy, 16, "spread-1", "slow=300");
    assert_eq!(upstream.runs("spread-1"), 1, "{replies:#?}");
    let fresh = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .count();
    assert_eq!(fresh, 1, "exactly one first answer: {replies:#?}");
    assert!(
        replies.iter().all(|r| r.status == 201 || r.status == 409),
        "{replies:#?}"
    );
    // Many keys at once: every one runs once and answers.
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let proxy = Arc::clone(&proxy);
            std::thread::spawn(move || proxy.post(TENANT_A, &format!("many-{i}"), ORDER, ""))
        })
        .collect();
    for t in threads {
        let reply = t.join().expect("client thread");
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    for i in 0..32 {
        assert_eq!(upstream.runs(&format!("many-{i}")), 1);
    }
}
