//! Issue 14: the metrics series, request ids in headers and problem bodies, and the OpenAPI
//! document, on the real router (in-process, as `payments_idempotency.rs` drives it).

mod common;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{BODY, KEY_A, TestApp};
use idemlog_server::routes::{ROUTES, Route};

async fn scrape(t: &TestApp) -> String {
    let reply = t
        .send(
            Request::get("/metrics")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    String::from_utf8(reply.body).expect("utf8")
}

/// The value of the sample whose line starts with `prefix` (name and labels), if present.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|rest| rest.trim().parse().ok())
}

const PAY_COUNT: &str = "http_server_request_duration_seconds_count{http_route=\"/payments\",http_request_method=\"POST\",http_response_status_code=\"201\"}";

#[tokio::test]
async fn the_request_histogram_counts_requests_by_route_template_method_and_status() {
    let t = TestApp::new();
    let before = scrape(&t).await;
    assert_eq!(sample(&before, PAY_COUNT), None, "no payment yet");
    t.pay(KEY_A, "order-1", BODY).await;
    t.pay(KEY_A, "order-1", BODY).await;
    t.pay(KEY_A, "order-2", BODY).await;
    let created = t.pay(KEY_A, "order-3", BODY).await;
    let location = created.header("location").expect("location").to_owned();
    assert_eq!(t.get(KEY_A, &location).await.status, StatusCode::OK);
    assert_eq!(
        t.get(KEY_A, "/payments/pay_nope").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        t.get(KEY_A, "/no/such/route").await.status,
        StatusCode::NOT_FOUND
    );

    let text = scrape(&t).await;
    assert_eq!(sample(&text, PAY_COUNT), Some(4.0), "{text}");
    let get = "http_server_request_duration_seconds_count{http_route=\"/payments/{id}\",http_request_method=\"GET\",http_response_status_code=\"200\"}";
    assert_eq!(sample(&text, get), Some(1.0), "{text}");
    let missing = "http_server_request_duration_seconds_count{http_route=\"/payments/{id}\",http_request_method=\"GET\",http_response_status_code=\"404\"}";
    assert_eq!(sample(&text, missing), Some(1.0), "{text}");
    let unmatched = "http_server_request_duration_seconds_count{http_route=\"unmatched\",http_request_method=\"GET\",http_response_status_code=\"404\"}";
    assert_eq!(sample(&text, unmatched), Some(1.0), "{text}");
    assert!(!text.contains("pay_nope"), "raw paths never become labels");
    let inf = "http_server_request_duration_seconds_bucket{http_route=\"/payments\",http_request_method=\"POST\",http_response_status_code=\"201\",le=\"+Inf\"}";
    assert_eq!(sample(&text, inf), Some(4.0), "{text}");
    assert!(
        text.contains("le=\"0.0001\""),
        "sub-millisecond buckets: {text}"
    );

    // The histogram's count rises with more requests.
    t.pay(KEY_A, "order-4", BODY).await;
    assert_eq!(sample(&scrape(&t).await, PAY_COUNT), Some(5.0));
}

#[tokio::test]
async fn every_series_of_the_embedded_backend_is_exposed() {
    let t = TestApp::new();
    t.pay(KEY_A, "order-1", BODY).await;
    t.pay(KEY_A, "order-1", BODY).await;
    let text = scrape(&t).await;
    assert!(text.contains("\ngateway_charges_total 1\n"), "{text}");
    assert!(text.contains("idempotency_requests_total{outcome=\"executed\"} 1\n"));
    assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
    assert_eq!(sample(&text, "idemlog_store_up "), Some(1.0), "{text}");
    assert_eq!(sample(&text, "idemlog_records "), Some(1.0), "{text}");
    assert_eq!(sample(&text, "idemlog_records_in_progress "), Some(0.0));
    // The payment, the provider's charge and one counter stripe.
    assert_eq!(sample(&text, "idemlog_side_records "), Some(3.0), "{text}");
    for name in [
        "idemlog_disk_bytes ",
        "idemlog_live_bytes ",
        "idemlog_segments ",
        "idemlog_frames_appended_total ",
        "idemlog_bytes_appended_total ",
        "idemlog_syncs_total ",
        "idemlog_compactions_total ",
        "idemlog_compaction_failures_total ",
        "idemlog_compaction_reclaimed_bytes_total ",
        "idemlog_fdatasync_duration_seconds_count ",
        "idemlog_fdatasync_duration_seconds_sum ",
        "idemlog_commit_batch_operations_count ",
    ] {
        assert!(sample(&text, name).is_some(), "{name} missing: {text}");
    }
    assert!(text.contains("# TYPE idemlog_fdatasync_duration_seconds histogram\n"));
    assert!(text.contains("# TYPE idemlog_commit_batch_operations histogram\n"));
    // Durability sync: a new key's five operations (claim; the provider's charge record and its
    // counter stripe; the completion and the payment record) are made durable together, by the one
    // fdatasync the completion waits for. (The first claim after open also synced a fence floor.)
    let batches =
        |text: &str| sample(text, "idemlog_commit_batch_operations_count ").expect("count");
    let synced_ops =
        |text: &str| sample(text, "idemlog_commit_batch_operations_sum ").expect("sum");
    t.pay(KEY_A, "order-2", BODY).await;
    let after = scrape(&t).await;
    assert_eq!(batches(&after) - batches(&text), 1.0, "{after}");
    assert_eq!(synced_ops(&after) - synced_ops(&text), 5.0, "{after}");
}

#[tokio::test]
async fn store_up_drops_to_zero_while_the_store_is_poisoned() {
    let t = TestApp::new();
    // Every mutation fails from now on, as on a full disk: poisoned, and it cannot reopen.
    t.fs.crash_after(0);
    let reply = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let text = scrape(&t).await;
    assert_eq!(sample(&text, "idemlog_store_up "), Some(0.0), "{text}");
}

#[tokio::test]
async fn a_sane_client_request_id_is_echoed_and_an_insane_one_replaced() {
    let t = TestApp::new();
    let with_id = |id: &str| {
        Request::get("/healthz")
            .header("x-request-id", id)
            .body(Body::empty())
            .expect("request")
    };
    let reply = t.send(with_id("client-id-42")).await;
    assert_eq!(reply.header("x-request-id"), Some("client-id-42"));

    for insane in ["a".repeat(129), "two words".to_owned(), String::new()] {
        let reply = t.send(with_id(&insane)).await;
        let echoed = reply.header("x-request-id").expect("an id");
        assert_ne!(echoed, insane);
        assert_eq!(echoed.len(), 36, "a generated UUID: {echoed}");
    }
    let reply = t
        .send(
            Request::get("/healthz")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert!(reply.header("x-request-id").is_some());
}

#[tokio::test]
async fn generated_request_ids_are_distinct_version_4_uuids() {
    let t = TestApp::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let reply = t
            .send(
                Request::get("/healthz")
                    .body(Body::empty())
                    .expect("request"),
            )
            .await;
        let id = reply.header("x-request-id").expect("an id").to_owned();
        let bytes = id.as_bytes();
        assert_eq!(bytes.len(), 36, "{id}");
        assert!(
            [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-'),
            "hyphenated: {id}"
        );
        assert_eq!(bytes[14], b'4', "version 4: {id}");
        assert!(
            matches!(bytes[19], b'8' | b'9' | b'a' | b'b'),
            "RFC 4122 variant: {id}"
        );
        assert!(seen.insert(id.clone()), "id {id} given twice");
    }
}

#[tokio::test]
async fn problem_bodies_name_the_request_id_and_a_replayed_4xx_keeps_the_original_one() {
    let t = TestApp::new();
    // 401 (from the auth middleware) and 404 (the fallback).
    for request in [
        Request::post("/payments")
            .header("x-request-id", "req-401")
            .body(Body::empty())
            .expect("request"),
        Request::get("/nowhere")
            .header("x-request-id", "req-404")
            .body(Body::empty())
            .expect("request"),
    ] {
        let id = request.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let reply = t.send(request).await;
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(reply.json()["request_id"], id.as_str());
    }

    // A 422 from the handler is stored by the layer: its replay is the first body byte for byte,
    // naming the first request's id, while the replay's header names the replaying request.
    let invalid = r#"{"amount": 1.234, "currency": "BRL"}"#;
    let pay = |id: &str| {
        let mut request = common::payment(KEY_A, Some("order-422"), invalid);
        request
            .headers_mut()
            .insert("x-request-id", id.parse().expect("header"));
        request
    };
    let first = t.send(pay("req-first")).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first.json()["request_id"], "req-first");
    let replay = t.send(pay("req-second")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body, "replayed byte for byte");
    assert_eq!(replay.header("x-request-id"), Some("req-second"));
}

fn documented(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if [
                "get", "post", "put", "patch", "delete", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                ops.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

fn listed(routes: &[Route]) -> BTreeSet<(String, String)> {
    routes
        .iter()
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect()
}

#[tokio::test]
async fn the_openapi_document_is_served_and_describes_exactly_the_routes() {
    let t = TestApp::new();
    let reply = t
        .send(
            Request::get("/openapi.json")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let doc = reply.json();
    assert_eq!(doc["openapi"], "3.1.0");

    let expected = listed(ROUTES);
    assert_eq!(documented(&doc), expected, "document vs app::ROUTES");

    // Every listed route is served by the router (not the 404 fallback, not a 405).
    for route in ROUTES {
        let path = route
            .path
            .replace("{id}", "pay_probe")
            .replace("{key}", "probe");
        let request = Request::builder()
            .method(route.method)
            .uri(&path)
            .body(Body::empty())
            .expect("request");
        let reply = t.send(request).await;
        assert_ne!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{route:?}");
        let fallback =
            reply.status == StatusCode::NOT_FOUND && reply.json()["detail"] == "no such route";
        assert!(!fallback, "{route:?} is not served by the router");
    }

    // What clients rely on is in it.
    let post = &doc["paths"]["/payments"]["post"];
    let params = post["parameters"].as_array().expect("parameters");
    let key = params
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .expect("Idempotency-Key parameter");
    assert_eq!(key["in"], "header");
    assert_eq!(key["required"], true);
    assert_eq!(key["schema"]["minLength"], 1);
    for status in [
        "201", "400", "401", "409", "413", "415", "422", "429", "503",
    ] {
        assert!(
            post["responses"][status].is_object(),
            "POST /payments {status}"
        );
    }
    assert!(post["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
    assert!(post["responses"]["409"]["headers"]["Retry-After"].is_object());
    assert!(post["responses"]["422"]["content"]["application/problem+json"]["schema"].is_object());
    let status = &doc["paths"]["/idempotency-keys/{key}"]["get"]["responses"];
    for code in ["200", "401", "404"] {
        assert!(
            status[code].is_object(),
            "GET /idempotency-keys/{{key}} {code}"
        );
    }
    let schemas = &doc["components"]["schemas"];
    for field in ["type", "title", "status", "detail", "request_id"] {
        assert!(
            schemas["ProblemDetails"]["properties"][field].is_object(),
            "{field}"
        );
    }
}

fn document() -> serde_json::Value {
    idemlog_server::openapi::document()
}

#[test]
fn the_idempotency_key_header_and_path_declare_the_parsers_rule_the_path_without_percent() {
    let doc = document();
    let param = |path: &str, method: &str, name: &str| {
        doc["paths"][path][method]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} {name}"))
            .clone()
    };
    let header = param("/payments", "post", "Idempotency-Key");
    let path = param("/idempotency-keys/{key}", "get", "key");
    assert_eq!(
        header["schema"]["pattern"],
        idemlog_idempotency::key::PATTERN
    );
    assert_eq!(
        path["schema"]["pattern"],
        idemlog_idempotency::key::PATH_PATTERN
    );
    let status = &doc["paths"]["/idempotency-keys/{key}"]["get"]["responses"];
    assert!(status["400"].is_object(), "the path's 400 is documented");
}

#[tokio::test]
async fn a_quoted_key_in_the_status_path_names_the_same_key_as_the_bare_one() {
    let t = TestApp::new();
    assert_eq!(
        t.pay(KEY_A, "\"order-7\"", BODY).await.status,
        StatusCode::CREATED
    );
    for path in [
        "/idempotency-keys/order-7",
        "/idempotency-keys/%22order-7%22",
    ] {
        let reply = t
            .send(
                Request::get(path)
                    .header("authorization", format!("Bearer {KEY_A}"))
                    .body(Body::empty())
                    .expect("request"),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(reply.json()["key"], "order-7", "{path}");
    }
    let spaced = t
        .send(
            Request::get("/idempotency-keys/%22a%20b%22")
                .header("authorization", format!("Bearer {KEY_A}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(
        spaced.status,
        StatusCode::BAD_REQUEST,
        "as the header would"
    );
}

#[tokio::test]
async fn a_key_holding_a_percent_is_found_in_the_status_path_as_percent_25() {
    let t = TestApp::new();
    assert_eq!(
        t.pay(KEY_A, "50%-off", BODY).await.status,
        StatusCode::CREATED
    );
    let status = |path: &'static str| {
        t.send(
            Request::get(path)
                .header("authorization", format!("Bearer {KEY_A}"))
                .body(Body::empty())
                .expect("request"),
        )
    };
    let encoded = status("/idempotency-keys/50%25-off").await;
    assert_eq!(encoded.status, StatusCode::OK);
    assert_eq!(encoded.json()["key"], "50%-off");
    assert_eq!(
        status("/idempotency-keys/50%EF%BF%BD-off").await.status,
        StatusCode::BAD_REQUEST,
        "a decoded non-ASCII key is the header's 400"
    );
}

#[test]
fn the_request_id_parameter_declares_no_limit_the_server_does_not_enforce() {
    let doc = document();
    let params = doc["paths"]["/payments"]["post"]["parameters"]
        .as_array()
        .expect("parameters");
    let id = params
        .iter()
        .find(|p| p["name"] == "X-Request-Id")
        .expect("X-Request-Id");
    assert_eq!(id["schema"], serde_json::json!({"type": "string"}));
    let echoed = &doc["components"]["headers"]["X-Request-Id"]["schema"]["pattern"];
    assert_eq!(
        echoed, "^[\\x21-\\x7E]{1,128}$",
        "what the response carries"
    );
}

#[test]
fn amounts_declare_the_two_decimal_rule_on_request_and_response() {
    let doc = document();
    for schema in ["PaymentRequest", "Payment"] {
        let amount = &doc["components"]["schemas"][schema]["properties"]["amount"];
        assert_eq!(amount["multipleOf"], 0.01, "{schema}");
        assert_eq!(amount["exclusiveMinimum"], 0, "{schema}");
    }
}

#[test]
fn every_response_of_every_route_declares_x_request_id() {
    let doc = document();
    let mut seen = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("item") {
            for (status, response) in operation["responses"].as_object().expect("responses") {
                assert_eq!(
                    response["headers"]["X-Request-Id"]["$ref"],
                    "#/components/headers/X-Request-Id",
                    "{method} {path} {status}"
                );
                seen += 1;
            }
        }
    }
    assert!(seen > 20, "{seen} responses");
}
