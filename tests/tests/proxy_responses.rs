//! What `idemlog-proxy` keeps of a response: the stored-header allow-list (never `Set-Cookie`
//! unless a route lists it), and a response larger than what is stored, which the first client
//! still gets whole while its replay says the request completed and the body was not kept.

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
    let config_dir = TempDir::new("proxy-cookie-listed-config");
    let config = write_config(
        config_dir.path(),
        "proxy.toml",
        r#"
[[route]]
methods = ["POST"]
path = "/sessions"
stored_headers = ["content-type", "set-cookie"]
"#,
    );
    let config = config.to_str().expect("utf-8 path");
    let proxy = Proxy::start(&upstream, dir.path(), &["--config", config]);
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
    // A response within the limit on the same proxy is stored as usual.
    let small = proxy.post(TENANT_A, "order-2", ORDER, "big=1000");
    let again = proxy.post(TENANT_A, "order-2", ORDER, "big=1000");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, small.body);
    assert_eq!(small.body.len(), 1000);
}
