//! Issue 13's client-facing features through the release binary on its embedded store: key
//! status, `differing_fields` in a 422, and the per-account quota of live keys.

use idemlog_e2e::*;

#[test]
fn the_key_status_route_reports_a_completed_key_without_changing_it() {
    let dir = TempDir::new("status");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let paid = server.pay(KEY_A, "order/1", BODY);
    assert_eq!(paid.status, 201);
    let status = server.get(Some(KEY_A), "/idempotency-keys/order%2F1");
    assert_eq!(status.status, 200, "{status:?}");
    let json = status.json();
    assert_eq!(json["key"], "order/1");
    assert_eq!(json["state"], "completed");
    assert_eq!(json["response_status"], 201);
    assert_eq!(json["location"].as_str(), paid.header("location"));
    // Another account, an unknown key, no credentials: nothing is revealed.
    assert_eq!(
        server
            .get(Some(KEY_B), "/idempotency-keys/order%2F1")
            .status,
        404
    );
    assert_eq!(
        server.get(Some(KEY_A), "/idempotency-keys/nope").status,
        404
    );
    assert_eq!(server.get(None, "/idempotency-keys/order%2F1").status, 401);
    let replay = server.pay(KEY_A, "order/1", BODY);
    assert!(replay.replayed());
    assert_eq!(replay.body, paid.body);
    assert_eq!(server.charges(), 1);
}

#[test]
fn a_reused_key_names_the_differing_fields_but_no_values() {
    let dir = TempDir::new("differing");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    assert_eq!(server.pay(KEY_A, "order-1", BODY).status, 201);
    let other = server.pay(KEY_A, "order-1", r#"{"amount": 250.00, "currency": "USD"}"#);
    assert_eq!(other.status, 422, "{other:?}");
    let json = other.json();
    assert_eq!(
        json["differing_fields"],
        serde_json::json!(["/amount", "/currency"])
    );
    // No value anywhere in the answer. The request id is random (a UUID may well contain "250"),
    // so it is left out of the search.
    let mut without_id = json.clone();
    if let Some(fields) = without_id.as_object_mut() {
        fields.remove("request_id");
    }
    let text = without_id.to_string();
    assert!(!text.contains("250") && !text.contains("USD"), "{text}");
}

#[test]
fn new_keys_over_the_account_quota_are_429_while_replays_and_other_accounts_work() {
    let dir = TempDir::new("quota");
    let server = Server::start(
        dir.path(),
        &[
            "--gateway-latency",
            "0ms",
            "--max-live-keys-per-account",
            "2",
        ],
    );
    assert_eq!(server.pay(KEY_A, "k1", BODY).status, 201);
    assert_eq!(server.pay(KEY_A, "k2", BODY).status, 201);
    let over = server.pay(KEY_A, "k3", BODY);
    assert_eq!(over.status, 429, "{over:?}");
    let retry_after: u64 = over
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!(retry_after >= 1);
    assert!(server.pay(KEY_A, "k1", BODY).replayed());
    assert_eq!(server.pay(KEY_B, "k3", BODY).status, 201);
    assert_eq!(server.charges(), 3);
    assert_eq!(server.outcome("quota_exceeded"), 1);
}
