//! The scenarios of the conformance suite: what every store must do, through the layer
//! ([`App`]) and through the store's own calls.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;

use super::app::{App, ORDERS, Settings, order, send};
use super::{LEASE, Run, Scenario, TTL};
use crate::Outcome;
use crate::store::{
    Claim, Fingerprint, InsertOnce, RecordWrite, StoreError, StoredResponse, Takeover,
};

/// Two tenants (scopes).
const TENANT_A: &str = "tenant_a";
const TENANT_B: &str = "tenant_b";
/// An order, and the same order re-serialised (members in another order, other whitespace).
const BODY: &str = r#"{"item": "book", "quantity": 2}"#;
const BODY_AGAIN: &str = r#"{"quantity":2,"item":"book"}"#;

macro_rules! scenario {
    ($name:ident) => {
        scenario!($name, Settings::DEFAULT)
    };
    ($name:ident, $settings:expr) => {
        Scenario {
            name: stringify!($name),
            settings: $settings,
            run: {
                fn run(app: &App) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
                    Box::pin($name(app))
                }
                run as Run
            },
        }
    };
}

pub(super) const ALL: &[Scenario] = &[
    scenario!(a_new_key_runs_once_and_replays_byte_for_byte),
    scenario!(concurrent_duplicates_run_the_handler_once),
    scenario!(the_same_key_with_another_body_is_422),
    scenario!(a_missing_key_is_400_and_runs_nothing),
    scenario!(keys_of_different_scopes_never_meet),
    scenario!(
        a_running_key_is_409_with_retry_after,
        Settings {
            latency: Duration::from_millis(600),
            ..Settings::DEFAULT
        }
    ),
    scenario!(
        a_5xx_releases_the_key_and_the_retry_runs_again,
        Settings {
            fail_first: 1,
            ..Settings::DEFAULT
        }
    ),
    scenario!(an_expired_key_is_a_new_operation),
    scenario!(a_stuck_claim_is_taken_over_and_its_holder_fenced),
    scenario!(a_business_record_exists_exactly_when_its_key_completes),
    scenario!(a_write_once_record_keeps_its_first_value_and_counts_once),
    scenario!(the_status_of_a_completed_key_is_its_response_and_reading_it_changes_nothing),
    scenario!(the_status_path_names_the_key_as_stored_for_quoted_and_bare_headers),
    scenario!(the_status_of_a_running_key_never_extends_its_lease),
    scenario!(a_reused_key_422_names_the_differing_fields_and_no_values),
    scenario!(
        a_new_key_over_the_scope_quota_is_429_and_the_quota_frees_itself,
        Settings {
            max_live_keys: Some(2),
            ..Settings::DEFAULT
        }
    ),
    scenario!(
        concurrent_new_keys_at_the_quota_admit_exactly_the_quota,
        Settings {
            max_live_keys: Some(5),
            ..Settings::DEFAULT
        }
    ),
];

fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

fn status_path(key: &str) -> String {
    format!("/idempotency-keys/{key}")
}

async fn a_new_key_runs_once_and_replays_byte_for_byte(app: &App) {
    let first = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let again = app.order(TENANT_A, Some("k1"), BODY_AGAIN).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(app.runs(), 1);
    assert_eq!(app.outcome(Outcome::Replayed), 1);
}

async fn concurrent_duplicates_run_the_handler_once(app: &App) {
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let router = app.router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, order(TENANT_A, Some("k1"), BODY)).await
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        let reply = task.await.expect("the request task finishes");
        match reply.status {
            StatusCode::CREATED => created.push(reply.body),
            StatusCode::CONFLICT => assert!(reply.header("retry-after").is_some()),
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|b| *b == created[0]),
        "one response for all"
    );
    assert_eq!(app.runs(), 1);
}

async fn the_same_key_with_another_body_is_422(app: &App) {
    let first = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = app
        .order(TENANT_A, Some("k1"), r#"{"item": "book", "quantity": 3}"#)
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(app.runs(), 1);
}

async fn a_missing_key_is_400_and_runs_nothing(app: &App) {
    let reply = app.order(TENANT_A, None, BODY).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(app.runs(), 0);
}

async fn keys_of_different_scopes_never_meet(app: &App) {
    let a = app.order(TENANT_A, Some("k1"), BODY).await;
    let b = app.order(TENANT_B, Some("k1"), BODY).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(!b.replayed());
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(app.runs(), 2);
    // The same key of the other scope is not this scope's to read.
    assert!(app.store.get(TENANT_A, "k1").await.expect("get").is_some());
    assert!(
        app.store
            .get("tenant_c", "k1")
            .await
            .expect("get")
            .is_none()
    );
}

async fn a_running_key_is_409_with_retry_after(app: &App) {
    let router = app.router.clone();
    let first = tokio::spawn(async move { send(&router, order(TENANT_A, Some("k1"), BODY)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while app.runs() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first request never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    assert_eq!(busy.header("retry-after"), Some("1"));
    let first = first.await.expect("the first request finishes");
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(app.runs(), 1);
}

async fn a_5xx_releases_the_key_and_the_retry_runs_again(app: &App) {
    let failed = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY, "{failed:?}");
    assert_eq!(app.outcome(Outcome::Released), 1);
    let retry = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed(), "the handler ran again");
    assert_eq!(app.runs(), 2);
}

async fn an_expired_key_is_a_new_operation(app: &App) {
    let first = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    app.pass(TTL + Duration::from_millis(200)).await;
    let second = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    assert_ne!(first.json()["id"], second.json()["id"]);
    assert_eq!(app.runs(), 2);
}

async fn a_stuck_claim_is_taken_over_and_its_holder_fenced(app: &App) {
    let store = &app.store;
    let Claim::Acquired(zombie) = store
        .claim(TENANT_A, "k", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a new key is acquired");
    };
    match store
        .claim(TENANT_A, "k", &fp(1), TTL)
        .await
        .expect("claim")
    {
        Claim::InProgress { lease_left } => assert!(lease_left <= LEASE),
        other => panic!("expected in progress, got {other:?}"),
    }
    app.pass(LEASE + Duration::from_millis(200)).await;
    let Claim::Acquired(winner) = store
        .claim(TENANT_A, "k", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a claim whose lease ran out is taken over");
    };
    assert_eq!(winner.takeover, Some(Takeover::LeaseExpired));
    assert!(winner.fence > zombie.fence);
    // The zombie wakes up: it can neither complete (with its business record) nor release nor extend.
    let record = RecordWrite::put(ORDERS, "ord_zombie", "{}");
    let refused = store
        .complete(&zombie, &StoredResponse::new(201, "zombie"), &[record])
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert!(
        store
            .record(ORDERS, "ord_zombie")
            .await
            .expect("read")
            .is_none()
    );
    assert!(matches!(
        store.release(&zombie).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.extend(&zombie).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store
        .complete(&winner, &StoredResponse::new(201, "winner"), &[])
        .await
        .expect("the winner completes");
    match store
        .claim(TENANT_A, "k", &fp(1), TTL)
        .await
        .expect("claim")
    {
        Claim::Completed(stored) => assert_eq!(stored.body, Bytes::from("winner")),
        other => panic!("expected the winner's response, got {other:?}"),
    }
}

async fn a_business_record_exists_exactly_when_its_key_completes(app: &App) {
    let store = &app.store;
    let Claim::Acquired(released) = store
        .claim(TENANT_A, "k1", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("acquired");
    };
    store.release(&released).await.expect("release");
    assert!(store.record(ORDERS, "ord_1").await.expect("read").is_none());
    let Claim::Acquired(token) = store
        .claim(TENANT_A, "k1", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a released key is acquired again");
    };
    assert!(token.fence > released.fence);
    let record = RecordWrite::put(ORDERS, "ord_1", r#"{"quantity":1}"#);
    store
        .complete(&token, &StoredResponse::new(201, "ok"), &[record])
        .await
        .expect("complete");
    assert_eq!(
        store.record(ORDERS, "ord_1").await.expect("read"),
        Some(Bytes::from(r#"{"quantity":1}"#))
    );
    assert!(matches!(
        store
            .claim(TENANT_A, "k1", &fp(2), TTL)
            .await
            .expect("claim"),
        Claim::Mismatch { .. }
    ));
}

async fn a_write_once_record_keeps_its_first_value_and_counts_once(app: &App) {
    let store = &app.store;
    let write = RecordWrite::put("conformance.once", "k", "first");
    assert_eq!(
        store
            .insert_once(&write, "conformance_inserts")
            .await
            .expect("insert"),
        InsertOnce::Inserted
    );
    let again = RecordWrite::put("conformance.once", "k", "second");
    assert_eq!(
        store
            .insert_once(&again, "conformance_inserts")
            .await
            .expect("insert"),
        InsertOnce::Existing(Bytes::from("first"))
    );
    assert_eq!(
        store.counter("conformance_inserts").await.expect("counter"),
        1
    );
}

async fn the_status_of_a_completed_key_is_its_response_and_reading_it_changes_nothing(app: &App) {
    let first = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let status = app.get(TENANT_A, &status_path("k1")).await;
    assert_eq!(status.status, StatusCode::OK, "{status:?}");
    assert_eq!(status.header("content-type"), Some("application/json"));
    let body = status.json();
    assert_eq!(body["key"], "k1");
    assert_eq!(body["state"], "completed");
    assert_eq!(body["response_status"], 201);
    assert_eq!(body["location"].as_str(), first.header("location"));
    assert!(body.get("retry_after").is_none());
    for field in ["created_at", "expires_at"] {
        let at = body[field].as_str().expect(field);
        assert!(
            at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
            "{at}"
        );
    }
    assert!(body["created_at"].as_str() < body["expires_at"].as_str());
    // Reading changed nothing: the replay is the stored response, the handler did not run again.
    let again = app.order(TENANT_A, Some("k1"), BODY).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(app.runs(), 1);
    // Another scope, an unknown key: the same 404.
    for (tenant, key) in [(TENANT_B, "k1"), (TENANT_A, "never-used")] {
        let missing = app.get(tenant, &status_path(key)).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
        assert_eq!(
            missing.header("content-type"),
            Some("application/problem+json")
        );
    }
    // An expired key is a 404 too.
    app.pass(TTL + Duration::from_millis(200)).await;
    assert_eq!(
        app.get(TENANT_A, &status_path("k1")).await.status,
        StatusCode::NOT_FOUND
    );
}

async fn the_status_path_names_the_key_as_stored_for_quoted_and_bare_headers(app: &App) {
    let quoted = app.order(TENANT_A, Some("\"quoted-1\""), BODY).await;
    assert_eq!(quoted.status, StatusCode::CREATED, "{quoted:?}");
    let bare = app.order(TENANT_A, Some("a/b?c"), BODY).await;
    assert_eq!(bare.status, StatusCode::CREATED, "{bare:?}");
    let quoted = app.get(TENANT_A, &status_path("quoted-1")).await;
    assert_eq!(quoted.status, StatusCode::OK, "{quoted:?}");
    assert_eq!(quoted.json()["key"], "quoted-1");
    let encoded = app.get(TENANT_A, &status_path("a%2Fb%3Fc")).await;
    assert_eq!(encoded.status, StatusCode::OK, "{encoded:?}");
    assert_eq!(encoded.json()["key"], "a/b?c");
}

async fn the_status_of_a_running_key_never_extends_its_lease(app: &App) {
    let store = &app.store;
    let Claim::Acquired(first) = store
        .claim(TENANT_A, "running", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("acquired");
    };
    for _ in 0..3 {
        let status = app.get(TENANT_A, &status_path("running")).await;
        assert_eq!(status.status, StatusCode::OK, "{status:?}");
        let body = status.json();
        assert_eq!(body["state"], "in_progress");
        assert_eq!(body["retry_after"], 1);
        assert!(body.get("response_status").is_none());
        app.pass(LEASE / 4).await;
    }
    app.pass(LEASE / 4 + Duration::from_millis(200)).await;
    // The lease ran out on schedule: the reads did not renew it.
    let Claim::Acquired(winner) = store
        .claim(TENANT_A, "running", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("the lease was not extended by the status reads");
    };
    assert_eq!(winner.takeover, Some(Takeover::LeaseExpired));
    assert!(winner.fence > first.fence);
}

async fn a_reused_key_422_names_the_differing_fields_and_no_values(app: &App) {
    let first = app.order(TENANT_A, Some("k1"), BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let cases: [(&str, &[&str]); 3] = [
        (r#"{"item": "book", "quantity": 250}"#, &["/quantity"]),
        (
            r#"{"item": "lamp", "quantity": 7}"#,
            &["/item", "/quantity"],
        ),
        (
            r#"{"item": "book", "quantity": 2, "note": "x"}"#,
            &["/note"],
        ),
    ];
    for (body, expected) in cases {
        let reply = app.order(TENANT_A, Some("k1"), body).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        let json = reply.json();
        assert_eq!(
            json["differing_fields"],
            serde_json::json!(expected),
            "{body}"
        );
        // No value of either request anywhere in the answer. The request id is random (a UUID may
        // well contain "250"), so it is left out of the search.
        let mut without_id = json.clone();
        if let Some(fields) = without_id.as_object_mut() {
            fields.remove("request_id");
        }
        let text = without_id.to_string();
        assert!(!text.contains("250") && !text.contains("lamp"), "{text}");
    }
    // A member that disappeared is named from the stored side.
    let reply = app.order(TENANT_A, Some("k1"), r#"{"item": "book"}"#).await;
    assert_eq!(
        reply.json()["differing_fields"],
        serde_json::json!(["/quantity"])
    );
    // Query and content type; a body that is no longer JSON is compared whole ("").
    let request = axum::http::Request::post("/orders?x=1")
        .header("x-tenant", TENANT_A)
        .header("content-type", "text/plain")
        .header("idempotency-key", "k1")
        .body(axum::body::Body::from(BODY))
        .expect("a valid request");
    let reply = app.send(request).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reply.json()["differing_fields"],
        serde_json::json!(["", "content-type", "query"])
    );
    assert_eq!(app.runs(), 1);
    assert_eq!(app.outcome(Outcome::Mismatch), 5);
}

async fn a_new_key_over_the_scope_quota_is_429_and_the_quota_frees_itself(app: &App) {
    for key in ["k1", "k2"] {
        let created = app.order(TENANT_A, Some(key), BODY).await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    }
    let refused = app.order(TENANT_A, Some("k3"), BODY).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    let wait: u64 = refused
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&wait), "{wait}");
    assert_eq!(app.runs(), 2, "the refused request did not run");
    assert_eq!(app.outcome(Outcome::QuotaExceeded), 1);
    assert_eq!(
        app.get(TENANT_A, &status_path("k3")).await.status,
        StatusCode::NOT_FOUND,
        "nothing claimed"
    );
    // Existing keys still replay and report; other scopes are unaffected.
    assert!(app.order(TENANT_A, Some("k1"), BODY).await.replayed());
    assert_eq!(
        app.get(TENANT_A, &status_path("k2")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.order(TENANT_B, Some("k3"), BODY).await.status,
        StatusCode::CREATED
    );
    // The scope's keys expire: the quota frees itself.
    app.pass(TTL + Duration::from_millis(1100)).await;
    assert_eq!(
        app.order(TENANT_A, Some("k3"), BODY).await.status,
        StatusCode::CREATED
    );
}

async fn concurrent_new_keys_at_the_quota_admit_exactly_the_quota(app: &App) {
    let mut tasks = Vec::new();
    for i in 0..16 {
        let router = app.router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, order(TENANT_A, Some(&format!("c{i}")), BODY)).await
        }));
    }
    let (mut created, mut refused) = (0, 0);
    for task in tasks {
        let reply = task.await.expect("the request task finishes");
        match reply.status {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!((created, refused), (5, 11));
    assert_eq!(app.runs(), 5);
}
