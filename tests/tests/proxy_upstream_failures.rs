//! How `idemlog-proxy` settles a key when the upstream fails: a 5xx, 408 or 429 releases it (the
//! retry runs again), a refused connection is a 502 and releases it, and a hang, a connection lost
//! after the request was sent or an answer cut off or stalled mid-body is a 504 that keeps the key
//! in progress until its lease ends, because the effect may have happened: retries get 409 with
//! `Retry-After` and the upstream does not run again. A run longer than the lease is renewed.

use std::time::{Duration, Instant};

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

fn assert_problem(reply: &Reply, status: u16) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert!(
        reply
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json")),
        "problem+json: {reply:?}"
    );
}

/// `proxy_upstream_errors_total{kind="…"}` from the admin `/metrics`.
fn upstream_errors(proxy: &Proxy, kind: &str) -> u64 {
    let text = proxy.admin_get("/metrics").text();
    let sample = format!("proxy_upstream_errors_total{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {sample} in:\n{text}"))
}

#[test]
fn an_upstream_500_releases_the_key_and_the_retry_runs_again() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-500");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let failed = proxy.post(TENANT_A, "order-1", ORDER, "fail");
    assert_eq!(failed.status, 500, "{failed:?}");
    assert_eq!(
        failed.json()["outcome"],
        "failed",
        "the upstream's own answer"
    );
    assert!(!failed.replayed());
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed(), "a released key runs again: {retry:?}");
    assert_eq!(upstream.runs("order-1"), 2);
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "fail");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(
        replay.body, retry.body,
        "the 201 is what is kept, not the 500"
    );
    assert_eq!(upstream.runs("order-1"), 2);
}

#[test]
fn an_upstream_429_or_408_releases_the_key_by_default_and_other_4xx_are_kept() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-429");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    // 429 and 408 say the upstream did not act on the request: a retry must run it.
    for (key, status) in [("limited", 429), ("slow-read", 408)] {
        let behaviour = format!("status={status}");
        let first = proxy.post(TENANT_A, key, ORDER, &behaviour);
        assert_eq!(first.status, status, "{first:?}");
        let retry = proxy.post(TENANT_A, key, ORDER, "");
        assert_eq!(retry.status, 201, "{status} released the key: {retry:?}");
        assert!(!retry.replayed(), "{retry:?}");
        assert_eq!(upstream.runs(key), 2);
    }
    // Any other 4xx is the upstream's answer to this request, kept for every retry.
    let first = proxy.post(TENANT_A, "refused", ORDER, "status=422");
    assert_eq!(first.status, 422, "{first:?}");
    let again = proxy.post(TENANT_A, "refused", ORDER, "");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.status, 422);
    assert_eq!(upstream.runs("refused"), 1);
}

#[test]
fn release_statuses_of_a_route_choose_what_releases() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-release-statuses");
    let proxy = Proxy::start_with_rules(
        &upstream,
        dir.path(),
        r#"
[[route]]
path = "/strict/**"
release_statuses = [503]

[[route]]
path = "/lenient/**"
release_statuses = ["4xx", "5xx"]
"#,
        &[],
    );

    // /strict: only 503 releases, so a 500 is kept and replayed.
    let h = order_headers(TENANT_A, "strict-500", "fail");
    let first = proxy.request("POST", "/strict/a", &h, ORDER.as_bytes());
    assert_eq!(first.status, 500, "{first:?}");
    let again = proxy.request("POST", "/strict/a", &h, ORDER.as_bytes());
    assert_eq!(again.status, 500, "{again:?}");
    assert!(again.replayed(), "a 500 outside release_statuses is kept");
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.runs("strict-500"), 1);
    let h = order_headers(TENANT_A, "strict-503", "status=503");
    let first = proxy.request("POST", "/strict/a", &h, ORDER.as_bytes());
    assert_eq!(first.status, 503, "{first:?}");
    let again = proxy.request("POST", "/strict/a", &h, ORDER.as_bytes());
    assert!(!again.replayed(), "503 releases: {again:?}");
    assert_eq!(upstream.runs("strict-503"), 2);

    // /lenient: a 404 releases too.
    let h = order_headers(TENANT_A, "lenient-404", "status=404");
    let first = proxy.request("POST", "/lenient/a/b", &h, ORDER.as_bytes());
    assert_eq!(first.status, 404, "{first:?}");
    let again = proxy.request("POST", "/lenient/a/b", &h, ORDER.as_bytes());
    assert!(!again.replayed(), "4xx releases here: {again:?}");
    assert_eq!(upstream.runs("lenient-404"), 2);

    // Elsewhere the default: a 404 is kept.
    let h = order_headers(TENANT_A, "default-404", "status=404");
    let _ = proxy.request("POST", ORDERS, &h, ORDER.as_bytes());
    let again = proxy.request("POST", ORDERS, &h, ORDER.as_bytes());
    assert!(again.replayed(), "{again:?}");
    assert_eq!(upstream.runs("default-404"), 1);
}

#[test]
fn an_upstream_hang_is_504_and_no_retry_runs_while_the_lease_holds() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-hang");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--upstream-timeout", "1s", "--lease", "60s"],
    );
    let start = Instant::now();
    let hung = proxy.post(TENANT_A, "order-1", ORDER, "hang");
    assert_problem(&hung, 504);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the timeout is 1s, took {:?}",
        start.elapsed()
    );
    assert_eq!(upstream.runs("order-1"), 1);
    // The effect is unknown: the key stays in progress, so a retry is told to wait, not run.
    for _ in 0..3 {
        let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
        assert_problem(&retry, 409);
        let after: u64 = retry
            .header("retry-after")
            .unwrap_or_else(|| panic!("Retry-After on the 409: {retry:?}"))
            .parse()
            .expect("Retry-After in seconds");
        assert!(after <= 60, "within the lease: {after}");
    }
    assert_eq!(upstream.runs("order-1"), 1, "no second run");
    // Other keys are not held up.
    let other = proxy.post(TENANT_A, "order-2", ORDER, "");
    assert_eq!(other.status, 201, "{other:?}");
    assert_eq!(upstream_errors(&proxy, "timeout"), 1);
    let metrics = proxy.admin_get("/metrics").text();
    assert!(
        metrics.contains("idempotency_requests_total{outcome=\"effect_unknown\"} 1"),
        "{metrics}"
    );
}

#[test]
fn after_a_504_the_first_retry_past_the_lease_runs_with_a_larger_fencing_token() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-hang-lease");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--upstream-timeout", "1s", "--lease", "3s"],
    );
    let hung = proxy.post(TENANT_A, "order-1", ORDER, "hang");
    assert_problem(&hung, 504);
    let early = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&early, 409);
    assert_eq!(upstream.runs("order-1"), 1);
    std::thread::sleep(Duration::from_millis(3500));
    let late = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(late.status, 201, "the lease ended: {late:?}");
    assert!(!late.replayed());
    let runs = upstream.requests_with_key("order-1");
    assert_eq!(runs.len(), 2);
    assert!(
        runs[1].fencing_token() > runs[0].fencing_token(),
        "the takeover's token is larger, so the upstream can refuse the stale holder"
    );
}

#[test]
fn a_connection_lost_after_sending_is_504_and_keeps_the_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-lost");
    let proxy = Proxy::start(&upstream, dir.path(), &["--lease", "60s"]);
    let lost = proxy.post(TENANT_A, "order-1", ORDER, "close");
    assert_problem(&lost, 504);
    assert_eq!(upstream.runs("order-1"), 1, "sent once, not retried");
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&retry, 409);
    assert!(retry.header("retry-after").is_some(), "{retry:?}");
    assert_eq!(upstream.runs("order-1"), 1);
    assert_eq!(upstream_errors(&proxy, "lost"), 1);
}

#[test]
fn a_refused_connection_is_502_and_releases_the_key() {
    let port = free_port();
    let dir = TempDir::new("proxy-refused");
    let proxy = Proxy::start_bare(
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        &TRUSTED_TENANT_HEADER,
    );
    let refused = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&refused, 502);
    let again = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&again, 502);
    assert_eq!(upstream_errors(&proxy, "connect"), 2);
    // The upstream comes up on that port: the released key runs now, once.
    let upstream = Upstream::start_on_port(port);
    let ok = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(ok.status, 201, "released, so it runs: {ok:?}");
    assert!(!ok.replayed());
    assert_eq!(upstream.runs("order-1"), 1);
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
}

#[test]
fn a_run_longer_than_the_lease_keeps_its_claim_and_no_copy_runs() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-renewal");
    // The lease is renewed while the upstream is being waited for: a slow run is not taken over.
    let proxy = std::sync::Arc::new(Proxy::start(
        &upstream,
        dir.path(),
        &["--lease", "2s", "--upstream-timeout", "20s"],
    ));
    let slow = {
        let proxy = std::sync::Arc::clone(&proxy);
        std::thread::spawn(move || proxy.post(TENANT_A, "order-1", ORDER, "slow=5000"))
    };
    wait_until(Duration::from_secs(10), "the slow run", || {
        upstream.runs("order-1") == 1
    });
    for _ in 0..7 {
        std::thread::sleep(Duration::from_millis(500));
        let copy = proxy.post(TENANT_A, "order-1", ORDER, "");
        assert_problem(&copy, 409);
    }
    let first = slow.join().expect("thread");
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(upstream.runs("order-1"), 1, "no copy ran past the lease");
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
}

#[test]
fn an_answer_cut_off_mid_body_is_504_and_keeps_the_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-cut-body");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--lease", "60s", "--max-stored-response-bytes", "4096"],
    );
    // The upstream ran and started answering, then the connection broke: the effect happened, so
    // the key must neither be completed with half a body nor released for a second run.
    let cut = proxy.post(TENANT_A, "order-1", ORDER, "truncate");
    assert_problem(&cut, 504);
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&retry, 409);
    assert!(retry.header("retry-after").is_some(), "{retry:?}");
    assert_eq!(upstream.runs("order-1"), 1);
    // An answer over the stored limit is already on its way to the client when it breaks: the
    // client sees it cut off, and the key still never runs twice.
    let first = proxy.try_request(
        "POST",
        ORDERS,
        &order_headers(TENANT_A, "order-2", "big=300000,truncate"),
        ORDER.as_bytes(),
    );
    if let Some(first) = &first {
        assert!(
            first.status == 504 || first.body.len() < 300_000,
            "the client cannot get what the upstream never sent: {} {} bytes",
            first.status,
            first.body.len()
        );
    }
    let retry = proxy.post(TENANT_A, "order-2", ORDER, "");
    assert!(
        retry.status == 409 || retry.replayed(),
        "{} {}",
        retry.status,
        retry.text()
    );
    assert_eq!(upstream.runs("order-2"), 1);
}

#[test]
fn an_answer_that_stalls_mid_body_is_504_and_keeps_the_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-stalled-body");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--lease", "60s", "--upstream-timeout", "1s"],
    );
    let stalled = proxy.post(TENANT_A, "order-1", ORDER, "stall");
    assert_problem(&stalled, 504);
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_problem(&retry, 409);
    assert_eq!(upstream.runs("order-1"), 1);
}

#[test]
fn a_pass_through_answer_that_stalls_mid_body_is_cut_off_after_the_upstream_timeout() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-stalled-pass-through");
    let proxy = Proxy::start(&upstream, dir.path(), &["--upstream-timeout", "1s"]);
    // A GET passes through; the upstream sends its head and half its body, then stalls for
    // minutes. The client's read gives up after 60 s on its own.
    let started = Instant::now();
    let reply = proxy.try_request("GET", "/orders/1", &[("X-Test-Behaviour", "stall")], b"");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "the proxy held the client for {waited:?} while the upstream stalled mid-body"
    );
    if let Some(reply) = reply {
        let declared: usize = reply
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .expect("the upstream's answer declares its length");
        assert!(
            reply.body.len() < declared,
            "a cut-off body must not look whole: {} of {declared} bytes",
            reply.body.len()
        );
    }
}
