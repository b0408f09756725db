//! Two `idemlog-proxy` processes on one PostgreSQL database (`--database-url`), as behind a load
//! balancer: copies of one request spread over both still run the upstream once per key; a key
//! completed on one replays on the other; a proxy killed mid-request is taken over by the other
//! only after the lease, and one killed under load loses no acknowledged key; a frozen holder
//! (a zombie) cannot overwrite the answer of the proxy that took its key over.
//!
//! Needs `DATABASE_URL` (`scripts/pg-test-cluster run -- cargo test`). Without it the tests print a
//! skip line, unless CI set PostgreSQL up (`CI` or `IDEMLOG_REQUIRE_POSTGRES=1`): then they fail.
//! Each test uses a schema of its own (`--database-schema`), and its keys carry the process id and
//! the time as well.

use std::sync::Arc;

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var_os("CI").is_some()
                || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
            assert!(
                !required,
                "DATABASE_URL is not set but the PostgreSQL tests are required here"
            );
            eprintln!("SKIPPED: DATABASE_URL is not set (see scripts/pg-test-cluster)");
            None
        }
    }
}

/// A schema for `test` in this process.
fn schema(test: &str) -> String {
    format!("proxy_{test}_{}", std::process::id())
}

#[test]
fn concurrent_copies_spread_over_two_proxies_run_the_upstream_once_per_key() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("spread");
    let args = ["--database-schema", schema.as_str()];
    let a = Arc::new(Proxy::start_on_database(&upstream, &url, &args));
    let b = Arc::new(Proxy::start_on_database(&upstream, &url, &args));
    let keys: Vec<String> = (0..4).map(|i| unique_key(&format!("spread{i}"))).collect();
    let barrier = Arc::new(std::sync::Barrier::new(keys.len() * 10));
    let threads: Vec<_> = keys
        .iter()
        .flat_map(|key| (0..10).map(move |copy| (key.clone(), copy)))
        .map(|(key, copy)| {
            let proxy = if copy % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let reply = proxy.post(TENANT_A, &key, ORDER, "slow=300");
                (key, reply)
            })
        })
        .collect();
    let replies: Vec<(String, Reply)> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    for key in &keys {
        assert_eq!(upstream.runs(key), 1, "{key}: {replies:#?}");
        let mine: Vec<&Reply> = replies
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, r)| r)
            .collect();
        let fresh: Vec<&&Reply> = mine
            .iter()
            .filter(|r| r.status == 201 && !r.replayed())
            .collect();
        assert_eq!(fresh.len(), 1, "{key}: {mine:#?}");
        for reply in &mine {
            match reply.status {
                201 => assert_eq!(reply.body, fresh[0].body, "{key}"),
                409 => assert!(reply.header("retry-after").is_some(), "{reply:?}"),
                other => panic!("{key}: unexpected {other}: {reply:?}"),
            }
        }
        // Both proxies replay it now.
        for proxy in [&a, &b] {
            let replay = proxy.post(TENANT_A, key, ORDER, "");
            assert!(replay.replayed(), "{key}: {replay:?}");
            assert_eq!(replay.body, fresh[0].body);
        }
    }
    assert_eq!(upstream.total(), keys.len() as u64);
}

#[test]
fn a_key_completed_on_one_proxy_replays_on_the_other_and_scopes_stay_apart() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("handover");
    let args = ["--database-schema", schema.as_str()];
    let a = Proxy::start_on_database(&upstream, &url, &args);
    let b = Proxy::start_on_database(&upstream, &url, &args);
    let key = unique_key("handover");
    let first = a.post(TENANT_A, &key, ORDER, "");
    assert_eq!(first.status, 201, "{first:?}");
    let replay = b.post(TENANT_A, &key, ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    let other = b.post(TENANT_A, &key, OTHER_ORDER, "");
    assert_eq!(other.status, 422, "{other:?}");
    let tenant_b = b.post(TENANT_B, &key, ORDER, "");
    assert_eq!(tenant_b.status, 201, "{tenant_b:?}");
    assert!(!tenant_b.replayed());
    assert_eq!(upstream.runs(&key), 2, "one run per tenant");
}

#[test]
fn a_proxy_killed_mid_request_is_taken_over_by_the_other_after_the_lease() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("takeover");
    let args = ["--database-schema", schema.as_str(), "--lease", "2s"];
    let a = Proxy::start_on_database(&upstream, &url, &args);
    let b = Proxy::start_on_database(&upstream, &url, &args);
    let key = unique_key("takeover");
    let addr = a.addr;
    let abandoned = {
        let key = key.clone();
        std::thread::spawn(move || {
            http(
                addr,
                "POST",
                ORDERS,
                &order_headers(TENANT_A, &key, "hang"),
                ORDER.as_bytes(),
            )
        })
    };
    wait_until(std::time::Duration::from_secs(10), "the first run", || {
        upstream.runs(&key) == 1
    });
    a.kill();
    assert!(abandoned.join().expect("thread").is_err(), "A died first");
    // The claim of the dead proxy holds until its lease runs out: the effect may have happened.
    let early = b.post(TENANT_A, &key, ORDER, "");
    assert_eq!(early.status, 409, "{early:?}");
    assert!(early.header("retry-after").is_some(), "{early:?}");
    assert_eq!(upstream.runs(&key), 1);
    let mut late = early;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while late.status == 409 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(250));
        late = b.post(TENANT_A, &key, ORDER, "");
    }
    assert_eq!(late.status, 201, "taken over after the lease: {late:?}");
    let runs = upstream.requests_with_key(&key);
    assert_eq!(runs.len(), 2);
    assert!(
        runs[1].fencing_token() > runs[0].fencing_token(),
        "the upstream can tell the stale holder from the new one"
    );
}

#[test]
fn a_zombie_holder_cannot_overwrite_the_answer_of_the_proxy_that_took_its_key_over() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("zombie");
    let args = ["--database-schema", schema.as_str(), "--lease", "2s"];
    let a = Proxy::start_on_database(&upstream, &url, &args);
    let b = Proxy::start_on_database(&upstream, &url, &args);
    let key = unique_key("zombie");
    let addr = a.addr;
    let zombie = {
        let key = key.clone();
        std::thread::spawn(move || {
            http(
                addr,
                "POST",
                ORDERS,
                &order_headers(TENANT_A, &key, "slow=2000"),
                ORDER.as_bytes(),
            )
        })
    };
    wait_until(std::time::Duration::from_secs(10), "the first run", || {
        upstream.runs(&key) == 1
    });
    // A freezes (a long GC pause, a stalled VM): it cannot renew its lease.
    a.signal("STOP");
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let mut taken = b.post(TENANT_A, &key, ORDER, "");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while taken.status == 409 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(250));
        taken = b.post(TENANT_A, &key, ORDER, "");
    }
    assert_eq!(taken.status, 201, "B took the key over: {taken:?}");
    assert!(!taken.replayed());
    // A wakes up with the upstream's first answer in hand and tries to complete.
    a.signal("CONT");
    let late = zombie.join().expect("thread");
    let runs = upstream.requests_with_key(&key);
    assert_eq!(runs.len(), 2);
    assert!(runs[1].fencing_token() > runs[0].fencing_token());
    // Whatever A's own client got, the key's answer is B's, on both proxies.
    for proxy in [&a, &b] {
        let replay = proxy.post(TENANT_A, &key, ORDER, "");
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(
            replay.body, taken.body,
            "the zombie's completion was refused by the fencing token (A's client got {late:?})"
        );
    }
    assert_eq!(upstream.runs(&key), 2);
    // A's client was told the key's answer (B's) or to retry (409), as the layer's `fenced`
    // outcome promises.
    let late = late.expect("A's client got an answer after SIGCONT");
    assert!(
        late.status == 409 || late.body == taken.body,
        "the zombie's client: {} {}",
        late.status,
        late.text()
    );
    let metrics = a.admin_get("/metrics").text();
    assert!(
        metrics.contains("idempotency_requests_total{outcome=\"fenced\"} 1"),
        "{metrics}"
    );
}

#[test]
fn on_postgresql_a_scope_and_key_pair_never_collides_with_another_split() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("split");
    let proxy = Proxy::start_on_database(&upstream, &url, &["--database-schema", schema.as_str()]);
    let unique = unique_key("u");
    for sep in [":", "/", "|", ",", ".", "-", "_", "#", "=", "\\"] {
        let tenant_a = format!("t{sep}x");
        let key_b = format!("x{sep}{unique}");
        let first = proxy.post(&tenant_a, &unique, ORDER, "");
        let second = proxy.post("t", &key_b, ORDER, "");
        assert_eq!((first.status, second.status), (201, 201), "{sep:?}");
        assert!(
            !second.replayed() && second.body != first.body,
            "{sep:?}: tenant \"t\" got tenant {tenant_a:?}'s response"
        );
    }
}

#[test]
fn kill_9_of_one_proxy_under_load_loses_no_acknowledged_key_and_runs_none_twice() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("kill9");
    let args = ["--database-schema", schema.as_str(), "--lease", "30s"];
    let a = Arc::new(Proxy::start_on_database(&upstream, &url, &args));
    let b = Proxy::start_on_database(&upstream, &url, &args);
    let prefix = unique_key("load");
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let clients: Vec<_> = (0..16)
        .map(|client| {
            let a = Arc::clone(&a);
            let stop = Arc::clone(&stop);
            let acknowledged = Arc::clone(&acknowledged);
            let sent = Arc::clone(&sent);
            let prefix = prefix.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{prefix}-{client}-{n}");
                    n += 1;
                    sent.lock().expect("sent").push(key.clone());
                    let headers = order_headers(TENANT_A, &key, "slow=10");
                    match a.try_request("POST", ORDERS, &headers, ORDER.as_bytes()) {
                        Some(reply)
                            if reply
                                .header("content-length")
                                .and_then(|l| l.parse::<usize>().ok())
                                == Some(reply.body.len()) =>
                        {
                            assert_eq!(reply.status, 201, "before the crash: {reply:?}");
                            acknowledged.lock().expect("acks").insert(key, reply);
                        }
                        _ => break,
                    }
                }
            })
        })
        .collect();
    wait_until(
        std::time::Duration::from_secs(60),
        "acknowledged keys",
        || acknowledged.lock().expect("acks").len() >= 200,
    );
    a.signal_kill();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }
    let acknowledged = std::mem::take(&mut *acknowledged.lock().expect("acks"));
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));
    for (key, first) in &acknowledged {
        let replay = b.post(TENANT_A, key, ORDER, "");
        assert!(replay.replayed(), "{key} on the other proxy: {replay:?}");
        assert_eq!(replay.body, first.body, "{key} byte for byte");
        assert_eq!(upstream.runs(key), 1, "{key}");
    }
    // The keys in flight at the crash: their claims hold until the lease ends, so the other proxy
    // replays a kept completion or says 409, and never runs them a second time now.
    for key in sent.iter().filter(|k| !acknowledged.contains_key(*k)) {
        let retry = b.post(TENANT_A, key, ORDER, "");
        let runs = upstream.runs(key);
        assert!(
            retry.replayed() || retry.status == 409 || runs == 1 && retry.status == 201,
            "{key}: {} {}",
            retry.status,
            retry.text()
        );
        assert!(runs <= 1, "{key} ran {runs} times");
    }
}

#[test]
fn a_run_longer_than_the_lease_is_renewed_and_the_other_proxy_does_not_take_it_over() {
    let Some(url) = database_url() else { return };
    let upstream = Upstream::start();
    let schema = schema("renewal");
    let args = [
        "--database-schema",
        schema.as_str(),
        "--lease",
        "2s",
        "--upstream-timeout",
        "20s",
    ];
    let a = Arc::new(Proxy::start_on_database(&upstream, &url, &args));
    let b = Proxy::start_on_database(&upstream, &url, &args);
    let key = unique_key("renewal");
    let slow = {
        let a = Arc::clone(&a);
        let key = key.clone();
        std::thread::spawn(move || a.post(TENANT_A, &key, ORDER, "slow=5000"))
    };
    wait_until(std::time::Duration::from_secs(10), "the slow run", || {
        upstream.runs(&key) == 1
    });
    for _ in 0..7 {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let copy = b.post(TENANT_A, &key, ORDER, "");
        assert_eq!(copy.status, 409, "A renews its lease: {copy:?}");
    }
    let first = slow.join().expect("thread");
    assert_eq!(first.status, 201, "{first:?}");
    let replay = b.post(TENANT_A, &key, ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(upstream.runs(&key), 1);
}
