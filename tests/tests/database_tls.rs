//! The real `idemlog-server` on a TLS-only PostgreSQL (issue 21, point 2): the libpq URL that works
//! with `psql` works as `--database-url` and as `IDEMLOG_DATABASE_URL`, and a certificate from the
//! wrong CA stops start-up with a message that says so.
//!
//! Needs the cluster of `scripts/pg-test-cluster start --tls` (`IDEMLOG_TEST_TLS_DATABASE_URL`,
//! `PG_TEST_CA`, `PG_TEST_OTHER_CA`); without it the tests print a skip line, unless `CI` or
//! `IDEMLOG_REQUIRE_POSTGRES=1` is set: then they fail.

// The layer crate's fixture: one definition of where the PostgreSQL tests find their databases.
#[path = "../../server/idempotency/tests/common/mod.rs"]
mod pg_fixture;

use std::process::{Command, Stdio};

use idemlog_e2e::*;
use pg_fixture::tls_database;

#[test]
fn a_server_given_a_verify_full_database_url_serves_and_replays_payments() {
    let Some(db) = tls_database() else { return };
    let schema = format!("e2e_tls_{}", std::process::id());
    let server = Server::start_on_database(
        &db.url,
        &["--database-schema", &schema, "--gateway-latency", "0ms"],
        &[("IDEMLOG_API_KEYS", &format!("{KEY_A}={ACCOUNT_A}"))],
    );
    let first = server.pay(KEY_A, "order-tls-1", BODY);
    assert_eq!(first.status, 201, "{first:?}");
    let replay = server.pay(KEY_A, "order-tls-1", BODY);
    assert_eq!(replay.status, 201, "{replay:?}");
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(
        server.metric(r#"idemlog_store_info{backend="postgres"}"#),
        1
    );
    let logs = server.logs().join("\n");
    assert!(
        logs.contains("PostgreSQL store ready") && logs.contains("verify-full"),
        "{logs}"
    );
}

#[test]
fn a_database_certificate_from_another_ca_stops_startup_with_a_message_saying_it_is_not_trusted() {
    let Some(db) = tls_database() else { return };
    let url = db.url.replace(
        &format!("sslrootcert={}", db.ca),
        &format!("sslrootcert={}", db.other_ca),
    );
    assert_ne!(url, db.url, "the URL names the CA as sslrootcert");
    let mut command = Command::new(binary());
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEMLOG_") || name == "DATABASE_URL" {
            command.env_remove(name);
        }
    }
    let output = command
        .env("IDEMLOG_DATABASE_URL", &url)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run idemlog-server");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not trusted") && stderr.contains("unknown CA"),
        "{stderr}"
    );
    assert!(stderr.contains(&db.other_ca), "{stderr}");
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(creds, _)| creds.split_once(':'))
        .map(|(_, password)| password)
        .expect("the test URL has a password");
    assert!(!stderr.contains(password), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
}
