//! Scopes in `idemlog-proxy`: a tenant never receives another tenant's response, even under the
//! same key with the same body.

use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

#[test]
fn two_tenants_with_the_same_key_each_get_their_own_response() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-tenants");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let a = proxy.post(TENANT_A, "order-1", ORDER, "");
    let b = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
    assert!(
        !b.replayed(),
        "tenant B is not replayed tenant A's answer: {b:?}"
    );
    assert_ne!(a.body, b.body);
    assert_eq!(upstream.runs("order-1"), 2, "one run per tenant");
    // Each replays its own.
    let a_again = proxy.post(TENANT_A, "order-1", ORDER, "");
    let b_again = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert!(a_again.replayed() && b_again.replayed());
    assert_eq!(a_again.body, a.body);
    assert_eq!(b_again.body, b.body);
    // Another body under tenant A's key is a mismatch for A only: B's key is its own.
    let c = proxy.post("tenant-c", "order-1", OTHER_ORDER, "");
    assert_eq!(c.status, 201, "{c:?}");
    assert_eq!(upstream.runs("order-1"), 3);
}

#[test]
fn a_tenant_waiting_on_its_own_key_is_not_blocked_by_another_tenants_run() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-tenants-concurrent");
    let proxy = std::sync::Arc::new(Proxy::start(&upstream, dir.path(), &[]));
    let slow = {
        let proxy = std::sync::Arc::clone(&proxy);
        std::thread::spawn(move || proxy.post(TENANT_A, "order-1", ORDER, "slow=1500"))
    };
    wait_until(std::time::Duration::from_secs(10), "tenant A's run", || {
        upstream.runs("order-1") == 1
    });
    // Tenant A's copy is in progress; tenant B's same key is not a copy of it.
    let b = proxy.post(TENANT_B, "order-1", ORDER, "");
    assert_eq!(b.status, 201, "{b:?}");
    let a_copy = proxy.post(TENANT_A, "order-1", ORDER, "");
    assert_eq!(a_copy.status, 409, "{a_copy:?}");
    let a = slow.join().expect("thread");
    assert_eq!(a.status, 201);
    assert_ne!(a.body, b.body);
    assert_eq!(upstream.runs("order-1"), 2);
}
