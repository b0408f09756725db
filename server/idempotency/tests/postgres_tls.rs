//! TLS to the database (libpq's `sslmode` and `sslrootcert`) against a real TLS-only server.
//!
//! The server comes from `scripts/pg-test-cluster start --tls` (or `run --tls -- cargo test -p
//! idemlog-idempotency --features postgres --test postgres_tls`): `ssl=on`, a certificate for the
//! name `localhost` only, signed by the CA in `PG_TEST_CA`, a second unrelated CA in
//! `PG_TEST_OTHER_CA`, and a `pg_hba.conf` that rejects every plaintext TCP connection. Without it
//! the tests print a skip line and pass, unless `CI` is set or `IDEMLOG_REQUIRE_POSTGRES=1`: then
//! they fail. Each test that connects works in a schema of its own (left in the throwaway cluster).

mod common;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use bytes::Bytes;
use common::{TlsDatabase, tls_database};
use idemlog_idempotency::backends::postgres::{
    CertProblem, PgConfig, PgError, PostgresBackend, redacted_url,
};
use idemlog_idempotency::store::{Claim, Fingerprint, IdempotencyStore, StoredResponse};

const TTL: Duration = Duration::from_secs(60);

/// The cluster's URL with `host` (`localhost` or `127.0.0.1`) and `query` (`sslmode=...`).
fn url(db: &TlsDatabase, host: &str, query: &str) -> String {
    let base = db.url.split('?').next().unwrap_or_default();
    let cfg: tokio_postgres::Config = base.parse().expect("the base URL parses");
    let password = cfg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    format!(
        "postgres://{}:{password}@{host}:{}/{}?{query}",
        cfg.get_user().unwrap_or("postgres"),
        cfg.get_ports().first().copied().unwrap_or(5432),
        cfg.get_dbname().unwrap_or("postgres"),
    )
}

fn config(url: String) -> PgConfig {
    let mut c = PgConfig::new(url)
        .schema(format!(
            "t_tls_{:016x}",
            RandomState::new().build_hasher().finish()
        ))
        .pool_size(2);
    c.cleanup_interval = None;
    // A failure that is retried would take a second per attempt: the ones tested here are not.
    c.connect_attempts = 2;
    c
}

async fn connect(url: String) -> Result<PostgresBackend, PgError> {
    PostgresBackend::connect(config(url)).await
}

/// A claim, its completion, and the replay of the completed response: the store works end to end
/// over the connection.
async fn round_trip(store: &PostgresBackend) {
    let fp = Fingerprint([9; 32]);
    let held = match store
        .claim("acct_tls", "k1", &fp, TTL)
        .await
        .expect("claim")
    {
        Claim::Acquired(held) => held,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let response = StoredResponse::new(201, Bytes::from_static(b"{\"id\":\"pay_tls\"}"));
    store
        .complete(&held, &response, &[])
        .await
        .expect("complete");
    match store
        .claim("acct_tls", "k1", &fp, TTL)
        .await
        .expect("replay")
    {
        Claim::Completed(stored) => assert_eq!(stored, response),
        other => panic!("expected Completed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_servers_ca_connects_and_a_claim_completes_and_replays() {
    let Some(db) = tls_database() else { return };
    let store = PostgresBackend::connect(config(db.url.clone()))
        .await
        .expect("verify-full with the right CA and host name connects");
    round_trip(&store).await;
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_another_ca_fails_at_startup_saying_the_certificate_is_not_trusted() {
    let Some(db) = tls_database() else { return };
    let err = connect(url(
        &db,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", db.other_ca),
    ))
    .await
    .err()
    .expect("a certificate from another CA is refused");
    match &err {
        PgError::Certificate { host, problem, .. } => {
            assert_eq!(host, "localhost");
            assert!(
                matches!(problem, CertProblem::NotTrusted { roots } if roots.contains(&db.other_ca)),
                "{problem:?}"
            );
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("unknown CA") && message.contains("not trusted"),
        "{message}"
    );
    assert!(!message.contains("idemlog-test-pw"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_to_an_address_the_certificate_does_not_name_fails_saying_the_name_does_not_match()
 {
    let Some(db) = tls_database() else { return };
    // The certificate names localhost only; 127.0.0.1 is the same server under another name.
    let err = connect(url(
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", db.ca),
    ))
    .await
    .err()
    .expect("a host name the certificate does not hold is refused");
    match &err {
        PgError::Certificate { host, problem, .. } => {
            assert_eq!(host, "127.0.0.1");
            assert!(
                matches!(problem, CertProblem::NameMismatch { presented } if presented == &["localhost"]),
                "{problem:?}"
            );
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("the TLS certificate of 127.0.0.1")
            && message.contains("host name mismatch: the certificate is valid for localhost only"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_accepts_the_servers_certificate_under_a_name_it_does_not_hold() {
    let Some(db) = tls_database() else { return };
    let store = connect(url(
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={}", db.ca),
    ))
    .await
    .expect("verify-ca checks the chain, not the name");
    round_trip(&store).await;
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_still_refuses_a_certificate_from_another_ca() {
    let Some(db) = tls_database() else { return };
    let err = connect(url(
        &db,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={}", db.other_ca),
    ))
    .await
    .err()
    .expect("verify-ca checks the chain");
    assert!(
        matches!(
            err,
            PgError::Certificate {
                problem: CertProblem::NotTrusted { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_is_refused_by_a_server_that_accepts_only_tls() {
    let Some(db) = tls_database() else { return };
    let err = connect(url(&db, "localhost", "sslmode=disable"))
        .await
        .err()
        .expect("plaintext is rejected by pg_hba.conf");
    match &err {
        PgError::Connect { reason, .. } => {
            assert!(
                reason.contains("28000") && reason.contains("no encryption"),
                "{reason}"
            );
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_connects_without_a_ca_under_any_name() {
    let Some(db) = tls_database() else { return };
    let store = connect(url(&db, "127.0.0.1", "sslmode=require"))
        .await
        .expect("require encrypts without checking the certificate");
    round_trip(&store).await;
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_with_a_root_certificate_checks_the_chain_as_libpq_does() {
    let Some(db) = tls_database() else { return };
    let err = connect(url(
        &db,
        "localhost",
        &format!("sslmode=require&sslrootcert={}", db.other_ca),
    ))
    .await
    .err()
    .expect("require with sslrootcert behaves like verify-ca");
    assert!(
        matches!(
            err,
            PgError::Certificate {
                problem: CertProblem::NotTrusted { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sslmode_tls_is_used_when_the_server_offers_it() {
    let Some(db) = tls_database() else { return };
    // No sslmode: libpq's default, prefer. The server rejects plaintext, so only TLS gets in.
    let base = db.url.split('?').next().unwrap_or_default().to_string();
    let store = connect(base)
        .await
        .expect("prefer negotiates TLS with a server that offers it");
    round_trip(&store).await;
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_value_connection_string_with_verify_full_connects_too() {
    let Some(db) = tls_database() else { return };
    let base: tokio_postgres::Config = db
        .url
        .split('?')
        .next()
        .unwrap_or_default()
        .parse()
        .expect("base URL");
    let password = String::from_utf8_lossy(base.get_password().unwrap_or_default()).into_owned();
    let key_value = format!(
        "host=localhost port={} user={} password='{password}' dbname={} sslmode=verify-full sslrootcert='{}'",
        base.get_ports().first().copied().unwrap_or(5432),
        base.get_user().unwrap_or("postgres"),
        base.get_dbname().unwrap_or("postgres"),
        db.ca,
    );
    let store = connect(key_value)
        .await
        .expect("the key/value form takes the same parameters");
    round_trip(&store).await;
    store.close().await.expect("close");
}

#[tokio::test]
async fn a_sslrootcert_naming_a_missing_file_is_a_startup_error_naming_the_path() {
    // Refused before any connection is tried: no server needed (nobody listens on port 1).
    let missing = "/nonexistent/idemlog-tls/root.pem";
    let err = connect(format!(
        "postgres://app:s3cret@127.0.0.1:1/app?sslmode=verify-full&sslrootcert={missing}"
    ))
    .await
    .err()
    .expect("a missing CA file is refused");
    match &err {
        PgError::RootCert { path, .. } => assert_eq!(path, missing),
        other => panic!("expected a root certificate error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(missing), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

#[tokio::test]
async fn an_sslmode_libpq_does_not_know_is_a_url_error() {
    let err = connect("postgres://app:s3cret@127.0.0.1:1/app?sslmode=verify_full".into())
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, PgError::Url { .. }), "{err:?}");
    assert!(err.to_string().contains("verify-full"), "{err}");
}

#[test]
fn the_redacted_url_keeps_sslmode_and_sslrootcert_and_hides_the_password() {
    let shown = redacted_url(
        "postgres://app:s3cret@db:5432/pay?sslmode=verify-full&sslrootcert=/etc/idemlog/ca.pem",
    );
    assert_eq!(
        shown,
        "postgres://app:***@db:5432/pay?sslmode=verify-full&sslrootcert=/etc/idemlog/ca.pem"
    );
}
