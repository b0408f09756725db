//! Shared by this crate's integration tests: where the PostgreSQL tests find their database.

/// The test database (`DATABASE_URL`), or `None` after printing `SKIPPED`. Under CI (or with
/// `IDEMLOG_REQUIRE_POSTGRES=1`) a missing database fails the test instead of skipping it.
pub fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var_os("CI").is_some()
                || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
            assert!(
                !required,
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
