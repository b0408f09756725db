//! Shared by this crate's integration tests: where the PostgreSQL tests find their database.

/// Whether a missing test database fails the test instead of skipping it: under CI, or with
/// `IDEMLOG_REQUIRE_POSTGRES=1`.
fn required() -> bool {
    std::env::var_os("CI").is_some()
        || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1")
}

/// The test database (`DATABASE_URL`), or `None` after printing `SKIPPED`. Under CI (or with
/// `IDEMLOG_REQUIRE_POSTGRES=1`) a missing database fails the test instead of skipping it.
#[allow(dead_code)] // not every test file that includes this fixture uses it
pub fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                !required(),
                "DATABASE_URL is not set but the PostgreSQL tests are required here: \
                 run them under scripts/pg-test-cluster"
            );
            eprintln!(
                "SKIPPED on PostgreSQL: DATABASE_URL is not set (see scripts/pg-test-cluster)"
            );
            None
        }
    }
}

/// The TLS-only test cluster of `scripts/pg-test-cluster start --tls`.
#[allow(dead_code)] // only the TLS tests use it
pub struct TlsDatabase {
    /// `IDEMLOG_TEST_TLS_DATABASE_URL`: host `localhost` (the only name the server's certificate
    /// holds), `sslmode=verify-full`, `sslrootcert` = [`TlsDatabase::ca`].
    pub url: String,
    /// `PG_TEST_CA`: the CA that signed the server's certificate (PEM).
    pub ca: String,
    /// `PG_TEST_OTHER_CA`: a CA that signed nothing the server holds (PEM).
    pub other_ca: String,
}

/// The TLS test cluster, or `None` after printing `SKIPPED`; like [`database_url`], a missing one
/// fails the test under CI (or with `IDEMLOG_REQUIRE_POSTGRES=1`).
#[allow(dead_code)] // only the TLS tests use it
pub fn tls_database() -> Option<TlsDatabase> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let Some(url) = var("IDEMLOG_TEST_TLS_DATABASE_URL") else {
        assert!(
            !required(),
            "IDEMLOG_TEST_TLS_DATABASE_URL is not set but the PostgreSQL TLS tests are required \
             here: run them under scripts/pg-test-cluster run --tls"
        );
        eprintln!(
            "SKIPPED on PostgreSQL with TLS: IDEMLOG_TEST_TLS_DATABASE_URL is not set (see \
             scripts/pg-test-cluster start --tls)"
        );
        return None;
    };
    let path = |name: &str| {
        var(name).unwrap_or_else(|| {
            panic!("IDEMLOG_TEST_TLS_DATABASE_URL is set but {name} is not: take both from scripts/pg-test-cluster start --tls")
        })
    };
    Some(TlsDatabase {
        url,
        ca: path("PG_TEST_CA"),
        other_ca: path("PG_TEST_OTHER_CA"),
    })
}
