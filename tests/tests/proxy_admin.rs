//! The admin listener of `idemlog-proxy`: `/metrics`, `/healthz` and `/readyz` are answered there
//! and only there. On the proxy listener those paths belong to the upstream, so the proxy never
//! shadows an upstream route. Also start-up: without a scope source the proxy refuses to start,
//! and SIGTERM lets a request in flight finish and complete.

use std::time::Duration;

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

#[test]
fn admin_endpoints_are_served_on_the_admin_listener() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-admin");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "");
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(first.status == 201 && replay.replayed());
    assert_eq!(proxy.admin_get("/healthz").status, 200);
    assert_eq!(proxy.admin_get("/readyz").status, 200);
    let metrics = proxy.admin_get("/metrics");
    assert_eq!(metrics.status, 200, "{metrics:?}");
    let text = metrics.text();
    assert!(text.contains("# TYPE"), "Prometheus text: {text}");
    assert!(
        text.contains("idempotency_requests_total{outcome=\"replayed\"} 1"),
        "the layer's series: {text}"
    );
    assert!(
        text.contains("proxy_upstream_request_duration_seconds_count{status_class=\"2xx\"} 1"),
        "the upstream latency, one 2xx: {text}"
    );
    assert!(
        text.contains("proxy_upstream_errors_total{kind=\"timeout\"} 0"),
        "{text}"
    );
    assert!(
        !text.contains(TENANT_A) && !text.contains("order-1"),
        "no scope or key in metric labels: {text}"
    );
    assert_eq!(
        upstream.total(),
        1,
        "admin requests never reach the upstream"
    );
}

#[test]
fn metrics_and_health_paths_on_the_proxy_listener_go_to_the_upstream() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-admin-shadow");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let reply = proxy.request("GET", path, &[], b"");
        assert_eq!(reply.status, 201, "{path}: {reply:?}");
        assert_eq!(reply.json()["path"], path, "the upstream's answer");
    }
    let paths: Vec<String> = upstream.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/metrics", "/healthz", "/readyz"]);
}

#[test]
fn start_up_is_refused_without_a_scope_source() {
    let dir = TempDir::new("proxy-no-scope");
    let data = dir.path().to_str().expect("utf-8 path");
    let upstream = "http://127.0.0.1:9";
    let (status, log) = Proxy::run_expecting_exit(
        &["--upstream", upstream, "--data-dir", data],
        Duration::from_secs(60),
    );
    assert_eq!(
        status.code(),
        Some(2),
        "exit code 2: {status:?}; log:\n{log}"
    );
    assert!(
        log.to_ascii_lowercase().contains("scope"),
        "the message names what is missing:\n{log}"
    );
    // A scope header nobody is trusted to set is no scope source either.
    let (status, log) = Proxy::run_expecting_exit(
        &[
            "--upstream",
            upstream,
            "--data-dir",
            data,
            "--scope-header",
            TENANT_HEADER,
        ],
        Duration::from_secs(60),
    );
    assert!(
        !status.success(),
        "--scope-header needs --trusted-peer; log:\n{log}"
    );
    assert!(log.contains("trusted-peer"), "{log}");
}

#[test]
fn a_static_scope_is_a_scope_source() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-static-scope");
    let proxy = Proxy::start_bare(&upstream.url(), dir.path(), &["--static-scope", "shop"]);
    let headers = [
        ("Idempotency-Key", "order-1"),
        ("Content-Type", "application/json"),
    ];
    let first = proxy.request("POST", ORDERS, &headers, ORDER.as_bytes());
    let replay = proxy.request("POST", ORDERS, &headers, ORDER.as_bytes());
    assert_eq!(first.status, 201, "{first:?}");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(upstream.runs("order-1"), 1);
    assert!(
        proxy
            .logs()
            .iter()
            .any(|l| l.to_ascii_lowercase().contains("static")),
        "the static scope is logged at start-up: {:#?}",
        proxy.logs()
    );
}

#[test]
fn sigterm_lets_a_request_in_flight_finish_and_complete() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-sigterm");
    let proxy = std::sync::Arc::new(Proxy::start(&upstream, dir.path(), &[]));
    let in_flight = {
        let proxy = std::sync::Arc::clone(&proxy);
        std::thread::spawn(move || proxy.post(TENANT_A, "order-1", ORDER, "slow=1000"))
    };
    wait_until(Duration::from_secs(10), "the upstream run", || {
        upstream.runs("order-1") == 1
    });
    proxy.signal_terminate();
    let reply = in_flight.join().expect("thread");
    assert_eq!(
        reply.status, 201,
        "the request in flight finishes: {reply:?}"
    );
    let Ok(mut proxy) = std::sync::Arc::try_unwrap(proxy) else {
        panic!("the client thread is done")
    };
    let status = proxy.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "exit 0 after SIGTERM: {status:?}");
    // It was completed, not just answered: a new process replays it.
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, reply.body);
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn start_up_is_refused_with_a_clear_message_for_a_bad_configuration() {
    let dir = TempDir::new("proxy-bad-config");
    let data = dir.path().to_str().expect("utf-8 path");
    let config = |name: &str, text: &str| {
        write_config(dir.path(), name, text)
            .to_str()
            .expect("utf-8 path")
            .to_owned()
    };
    let not_toml = config("not.toml", "[[route]\npath = \"/a\"\n");
    let bad_pattern = config("pattern.toml", "[[route]]\npath = \"/a/**/b\"\n");
    let other_lease = config("lease.toml", "[[route]]\npath = \"/a\"\nlease = \"5s\"\n");
    let bad_status = config(
        "status.toml",
        "[[route]]\npath = \"/a\"\nrelease_statuses = [\"6xx\"]\n",
    );
    let static_scope = ["--static-scope", "shop"];
    let cases: Vec<(&str, &str, Vec<&str>, &str)> = vec![
        (
            "TOML syntax",
            "http://127.0.0.1:9",
            vec!["--config", &not_toml],
            "not.toml",
        ),
        (
            "a misplaced **",
            "http://127.0.0.1:9",
            vec!["--config", &bad_pattern],
            "/a/**/b",
        ),
        (
            "a route lease other than --lease",
            "http://127.0.0.1:9",
            vec!["--config", &other_lease],
            "lease",
        ),
        (
            "an unknown status class",
            "http://127.0.0.1:9",
            vec!["--config", &bad_status],
            "6xx",
        ),
        ("an https upstream", "https://127.0.0.1:9", vec![], "http"),
    ];
    for (what, upstream, args, named) in cases {
        let mut all = vec!["--upstream", upstream, "--data-dir", data];
        all.extend(static_scope);
        all.extend(args);
        let (status, log) = Proxy::run_expecting_exit(&all, Duration::from_secs(60));
        assert_eq!(status.code(), Some(2), "{what}: {status:?}; log:\n{log}");
        assert!(
            log.contains(named),
            "{what}: the message names {named:?}:\n{log}"
        );
    }
    let (status, log) = Proxy::run_expecting_exit(
        &[
            "--upstream",
            "http://127.0.0.1:9",
            "--data-dir",
            data,
            "--static-scope",
            "shop",
            "--scope-header",
            TENANT_HEADER,
            "--trusted-peer",
            "127.0.0.1",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(
        status.code(),
        Some(2),
        "two scope sources: {status:?}; log:\n{log}"
    );
    assert!(log.contains("scope"), "{log}");
}

#[test]
fn an_idle_keep_alive_connection_does_not_hold_up_shutdown_and_sigint_exits_0() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-idle-shutdown");
    let mut proxy = Proxy::start(&upstream, dir.path(), &["--shutdown-grace", "20s"]);
    let mut idle = KeepAlive::open(proxy.addr);
    let reply = idle.request("GET", "/warm", &[], b"");
    assert_eq!(reply.status, 201, "{reply:?}");
    // The connection stays open and idle; SIGINT must not wait the 20 s grace for it.
    let start = std::time::Instant::now();
    proxy.signal("INT");
    let status = proxy.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "exit 0 after SIGINT: {status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "an idle connection held the shutdown for {:?}",
        start.elapsed()
    );
}
