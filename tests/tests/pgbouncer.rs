//! Two real `idemlog-server` processes on one PostgreSQL database through a real PgBouncer in
//! transaction mode (`pool_mode = transaction`, fewer server connections than the instances
//! hold), as many teams deploy it.
//!
//! Needs `IDEMLOG_TEST_PGBOUNCER_URL`, which `scripts/pg-test-cluster start` prints when the
//! `pgbouncer` binary is installed. Without it the tests print a skip line, unless CI set the
//! PostgreSQL tests up (`CI` or `IDEMLOG_REQUIRE_POSTGRES=1`): then they fail. Each test uses a
//! schema of its own.

use std::sync::Arc;

use idemlog_e2e::*;

fn pgbouncer_url() -> Option<String> {
    match std::env::var("IDEMLOG_TEST_PGBOUNCER_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var_os("CI").is_some()
                || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
            assert!(
                !required,
                "IDEMLOG_TEST_PGBOUNCER_URL is not set but the PostgreSQL tests are required here \
                 (install pgbouncer; scripts/pg-test-cluster starts it)"
            );
            eprintln!(
                "SKIPPED: IDEMLOG_TEST_PGBOUNCER_URL is not set (see scripts/pg-test-cluster)"
            );
            None
        }
    }
}

fn schema(test: &str) -> String {
    format!("pgb_{test}_{}", std::process::id())
}

/// An instance behind the pooler, told so with `--database-pooler transaction`.
fn instance(url: &str, schema: &str, args: &[&str]) -> Server {
    let mut all = vec![
        "--database-schema",
        schema,
        "--database-pooler",
        "transaction",
    ];
    all.extend_from_slice(args);
    launch(url, &all)
}

fn launch(url: &str, args: &[&str]) -> Server {
    Server::start_on_database(
        url,
        args,
        &[(
            "IDEMLOG_API_KEYS",
            &format!("{KEY_A}={ACCOUNT_A},{KEY_B}={ACCOUNT_B}"),
        )],
    )
}

/// Log lines at WARN or ERROR after start-up (the start-up lines end with "listening").
fn problems_after_startup(server: &Server) -> Vec<String> {
    let logs = server.logs();
    let start = logs
        .iter()
        .position(|l| l.contains("listening"))
        .unwrap_or(0);
    logs[start..]
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .cloned()
        .collect()
}

#[test]
fn concurrent_duplicates_through_pgbouncer_on_two_instances_charge_once() {
    let Some(url) = pgbouncer_url() else { return };
    let schema = schema("dups");
    let a = Arc::new(instance(&url, &schema, &["--gateway-latency", "50ms"]));
    let b = Arc::new(instance(&url, &schema, &["--gateway-latency", "50ms"]));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let server = Arc::clone(if i % 2 == 0 { &a } else { &b });
            std::thread::spawn(move || server.pay(KEY_A, "order-1", BODY))
        })
        .collect();
    let replies: Vec<Reply> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty(), "{replies:?}");
    assert!(
        replies.iter().all(|r| r.status == 201 || r.status == 409),
        "{replies:?}"
    );
    assert!(created.iter().all(|r| r.body == created[0].body));
    assert_eq!(a.charges(), 1);
    assert_eq!(b.charges(), 1, "the counter is the shared database's");
}

#[test]
fn a_key_completed_through_pgbouncer_replays_on_the_other_instance_byte_for_byte() {
    let Some(url) = pgbouncer_url() else { return };
    let schema = schema("replay");
    let a = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let b = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let first = a.pay(KEY_A, "order-1", BODY);
    assert_eq!(first.status, 201, "{first:?}");
    for _ in 0..5 {
        let replay = b.pay(KEY_A, "order-1", BODY);
        assert_eq!(replay.status, 201);
        assert!(replay.replayed());
        assert_eq!(replay.body, first.body);
        for header in ["location", "content-type", "content-length"] {
            assert_eq!(replay.header(header), first.header(header), "{header}");
        }
    }
    let other = b.pay(KEY_A, "order-1", r#"{"amount": 250.00, "currency": "BRL"}"#);
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(b.charges(), 1);
}

/// 16 client threads, 480 payments over 240 keys (each key paid twice, on alternating
/// instances), through 8 pooled server connections shared by both instances' 32.
#[test]
fn load_through_pgbouncer_in_transaction_mode_runs_without_errors() {
    let Some(url) = pgbouncer_url() else { return };
    let schema = schema("load");
    let a = Arc::new(instance(&url, &schema, &["--gateway-latency", "0ms"]));
    let b = Arc::new(instance(&url, &schema, &["--gateway-latency", "0ms"]));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for i in 0..15 {
                    let key = format!("load-{t}-{i}");
                    let (first, second) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    let paid = first.pay(KEY_A, &key, BODY);
                    let again = second.pay(KEY_A, &key, BODY);
                    assert!(again.replayed() && again.body == paid.body, "{again:?}");
                    statuses.push(paid.status);
                    statuses.push(again.status);
                }
                statuses
            })
        })
        .collect();
    for thread in threads {
        let statuses = thread.join().expect("a client thread failed");
        assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    }
    assert_eq!(a.charges(), 240);
    assert_eq!(problems_after_startup(&a), Vec::<String>::new());
    assert_eq!(problems_after_startup(&b), Vec::<String>::new());
}

#[test]
fn a_pooler_that_refuses_startup_options_is_detected_without_the_flag() {
    let Some(url) = pgbouncer_url() else { return };
    let schema = schema("detect");
    let server = launch(&url, &["--database-schema", &schema]);
    let paid = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(paid.status, 201, "{paid:?}");
    assert!(server.pay(KEY_A, "order-1", BODY).replayed());
    assert!(
        server
            .logs()
            .iter()
            .any(|l| l.contains("switching to pooler mode")),
        "no log line says the pooler was detected: {:?}",
        server.logs()
    );
}
