//! Keys of `idemlog-proxy` outlive the process. Completed keys replay byte for byte after a clean
//! restart and after `kill -9` under concurrent load, and none of them runs twice upstream. A key
//! whose request was in flight when the process died (`kill -9`) or was cut off (the shutdown
//! grace ended) stays in progress until its lease ends, because the upstream does not stop with
//! the proxy: a retry gets 409 instead of running the upstream a second time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

#[test]
fn a_completed_key_replays_byte_for_byte_after_a_restart() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-restart");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let first = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(first.status, 201, "{first:?}");
    let proxy = proxy.restart();
    let replay = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(upstream.runs("order-1"), 1);
    // The fingerprint survived too.
    let other = proxy.post(TENANT_A, "order-1", OTHER_ORDER, "");
    assert_eq!(other.status, 422, "{other:?}");
}

#[test]
fn kill_9_under_concurrent_load_loses_no_acknowledged_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-kill9");
    let proxy = Arc::new(Proxy::start(&upstream, dir.path(), &[]));
    let stop = Arc::new(AtomicBool::new(false));
    // key -> the answer the client got (only keys that got a whole answer).
    let acknowledged: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
    let sent: Arc<Mutex<Vec<String>>> = Arc::default();
    let clients: Vec<_> = (0..16)
        .map(|client| {
            let proxy = Arc::clone(&proxy);
            let stop = Arc::clone(&stop);
            let acknowledged = Arc::clone(&acknowledged);
            let sent = Arc::clone(&sent);
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load-{client}-{n}");
                    n += 1;
                    sent.lock().expect("sent").push(key.clone());
                    let headers = order_headers(TENANT_A, &key, "slow=10");
                    match proxy.try_request("POST", ORDERS, &headers, ORDER.as_bytes()) {
                        // A whole answer: acknowledged.
                        Some(reply)
                            if reply
                                .header("content-length")
                                .and_then(|l| l.parse::<usize>().ok())
                                == Some(reply.body.len()) =>
                        {
                            assert_eq!(reply.status, 201, "before the crash: {reply:?}");
                            acknowledged.lock().expect("acks").insert(key, reply);
                        }
                        // Cut off mid-body by the crash: not acknowledged.
                        Some(_) => break,
                        // The proxy died under this request.
                        None => break,
                    }
                }
            })
        })
        .collect();
    wait_until(Duration::from_secs(60), "some acknowledged keys", || {
        acknowledged.lock().expect("acks").len() >= 200
    });
    // The crash, with requests in flight on every client.
    proxy.signal_kill();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }
    let Ok(proxy) = Arc::try_unwrap(proxy) else {
        unreachable!("the clients have ended")
    };
    let acknowledged = std::mem::take(&mut *acknowledged.lock().expect("acks"));
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));
    let before = upstream.counts();
    for key in &sent {
        assert!(
            before.get(key).copied().unwrap_or(0) <= 1,
            "{key} ran more than once before the crash"
        );
    }
    for key in acknowledged.keys() {
        assert_eq!(before.get(key), Some(&1), "{key} was acknowledged");
    }

    let proxy = proxy.crash_and_restart();
    for (key, first) in &acknowledged {
        let headers = order_headers(TENANT_A, key, "");
        let replay = proxy.request("POST", ORDERS, &headers, ORDER.as_bytes());
        assert_eq!(replay.status, 201, "{key} after the restart: {replay:?}");
        assert!(replay.replayed(), "{key} is a replay: {replay:?}");
        assert_eq!(replay.body, first.body, "{key} byte for byte");
    }
    let after = upstream.counts();
    for key in acknowledged.keys() {
        assert_eq!(after.get(key), Some(&1), "{key} ran twice");
    }
    // The keys in flight at the crash: their effect is unknown. A claim is on disk before its
    // request is forwarded and keeps its lease across the restart, so a retry replays a kept
    // completion or waits (409); it runs only a key that never reached the upstream.
    let in_flight: Vec<&String> = sent
        .iter()
        .filter(|k| !acknowledged.contains_key(*k))
        .collect();
    let (mut replayed, mut waiting, mut ran_again) = (0, 0, 0);
    for key in in_flight.iter().copied() {
        let headers = order_headers(TENANT_A, key, "");
        let retry = proxy.request("POST", ORDERS, &headers, ORDER.as_bytes());
        assert!(
            retry.status == 201 || retry.status == 409,
            "{key} in flight at the crash: {retry:?}"
        );
        let runs = upstream.runs(key);
        if retry.replayed() {
            assert_eq!(runs, 1, "{key}: a kept completion, one run");
            replayed += 1;
        } else if retry.status == 409 {
            assert!(runs <= 1, "{key}: {runs} runs");
            waiting += 1;
        } else {
            ran_again += usize::from(runs == 2);
            assert_eq!(runs, 1, "{key}: run by the retry only, never twice");
        }
    }
    eprintln!(
        "kill -9: {} acknowledged keys replayed once each; {} in flight: {replayed} replayed, \
         {waiting} in progress (409), {ran_again} run a second time upstream",
        acknowledged.len(),
        in_flight.len()
    );
    assert!(
        acknowledged.len() >= 200,
        "{} acknowledged keys",
        acknowledged.len()
    );
}

#[test]
fn a_key_in_flight_at_a_crash_is_not_run_again_while_its_lease_holds() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-crash-in-flight");
    let proxy = Proxy::start(&upstream, dir.path(), &["--lease", "10s"]);
    let addr = proxy.addr;
    let abandoned = std::thread::spawn(move || {
        http(
            addr,
            "POST",
            ORDERS,
            &order_headers(TENANT_A, "order-1", "slow=3000"),
            ORDER.as_bytes(),
        )
    });
    wait_until(Duration::from_secs(10), "the first run", || {
        upstream.runs("order-1") == 1
    });
    // The proxy dies while the upstream is still working on the request.
    let proxy = proxy.crash_and_restart();
    assert!(abandoned.join().expect("thread").is_err(), "no answer");
    // As after a 504: the effect is unknown and the first run may still be going, so a retry is
    // told to wait until the lease runs out instead of running the request a second time now.
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(
        upstream.runs("order-1"),
        1,
        "the upstream ran the key again while its first run was still going: {} {}",
        retry.status,
        retry.text()
    );
    assert_eq!(retry.status, 409, "{retry:?}");
    let after: u64 = retry
        .header("retry-after")
        .unwrap_or_else(|| panic!("Retry-After on the 409: {retry:?}"))
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=10).contains(&after), "at most the 10 s lease: {after}");
}

#[test]
fn a_request_cut_off_by_the_shutdown_grace_is_not_run_again_while_its_lease_holds() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-grace");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--lease", "30s", "--shutdown-grace", "1s"],
    );
    let addr = proxy.addr;
    let cut_off = std::thread::spawn(move || {
        http(
            addr,
            "POST",
            ORDERS,
            &order_headers(TENANT_A, "order-1", "slow=5000"),
            ORDER.as_bytes(),
        )
    });
    wait_until(Duration::from_secs(10), "the first run", || {
        upstream.runs("order-1") == 1
    });
    let status = proxy.terminate();
    assert!(status.success(), "{status:?}");
    let _ = cut_off.join().expect("thread");
    let proxy = Proxy::start(
        &upstream,
        dir.path(),
        &["--lease", "30s", "--shutdown-grace", "1s"],
    );
    let retry = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(
        upstream.runs("order-1"),
        1,
        "the upstream ran the key again while its first run was still going: {} {}",
        retry.status,
        retry.text()
    );
    assert_eq!(retry.status, 409, "{}", retry.text());
}
