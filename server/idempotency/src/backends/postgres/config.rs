//! How the PostgreSQL backend is configured, and why connecting can fail.

use std::time::Duration;

use super::statement::Pooling;

/// Settings of [`super::PostgresBackend::connect`]. Start from [`PgConfig::new`] and change what you need.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// `postgres://user:password@host:port/database?...` or a key/value connection string. Logged
    /// and reported only through [`super::redacted_url`]. TLS follows libpq: `sslmode=disable|prefer|
    /// require|verify-ca|verify-full` (default `prefer`) and `sslrootcert=PATH` (PEM) or
    /// `sslrootcert=system`; see the `tls` module.
    pub url: String,
    /// The schema holding the tables (created if missing). Default `idemlog`. Letters, digits and
    /// `_` only, not starting with a digit, at most 63 bytes.
    pub schema: String,
    /// Most pooled connections. Default 16.
    pub pool_size: usize,
    /// How long a call waits for a free pooled connection before failing with
    /// [`crate::StoreError::Unavailable`] (503). Default 2 s.
    pub pool_wait_timeout: Duration,
    /// Bound on opening one connection (TCP connect and start-up). Default 5 s.
    pub connect_timeout: Duration,
    /// Server-side `statement_timeout` of every session; calls are also bounded client-side by
    /// roughly this plus the pool and connect timeouts. Default 5 s.
    pub statement_timeout: Duration,
    /// Lease of an in-progress claim: after this long without `extend`, a retry with the same
    /// fingerprint may take the key over. Default 30 s (the embedded engine's default).
    pub lease: Duration,
    /// Connection attempts at start-up before [`super::PostgresBackend::connect`] gives up (one second
    /// apart). Default 3, so a dead database fails start-up within about 20 s.
    pub connect_attempts: u32,
    /// How often the background cleanup deletes expired rows; `None` runs none (call
    /// [`super::PostgresBackend::spawn_cleanup`] or [`super::PostgresBackend::cleanup_once`] yourself). Default
    /// every 60 s.
    pub cleanup_interval: Option<Duration>,
    /// Rows deleted per cleanup statement. Default 500.
    pub cleanup_batch: u32,
    /// Lanes per batched statement (claims; completions and releases; write-once inserts): each
    /// lane sends what queued while its previous batch was in flight as one statement, on one
    /// pooled connection at a time (see the `lanes` module). More lanes let more batches run at
    /// once and make each smaller; a request's calls are routed by its key, so calls about one
    /// key always meet in one lane. Default 1; at least 1.
    pub writers: usize,
    /// Whether a pooler in transaction mode (PgBouncer `pool_mode = transaction`) sits in front
    /// of the database. Default [`Pooling::None`]; a server that refuses the start-up `options`
    /// parameter, as PgBouncer does, switches the store to [`Pooling::Transaction`] by itself,
    /// with a warning.
    pub pooling: Pooling,
}

impl PgConfig {
    /// The defaults listed on each field, for this URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "idemlog".to_string(),
            pool_size: 16,
            pool_wait_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(30),
            connect_attempts: 3,
            cleanup_interval: Some(Duration::from_secs(60)),
            cleanup_batch: 500,
            writers: 1,
            pooling: Pooling::None,
        }
    }

    /// Sets the schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets the lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how statements reach the database (see [`Pooling`]).
    pub fn pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = pooling;
        self
    }

    /// Sets the lanes per batched statement ([`PgConfig::writers`]).
    pub fn writers(mut self, writers: usize) -> Self {
        self.writers = writers;
        self
    }

    /// Sets the pool size.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }
}

/// Why [`super::PostgresBackend::connect`] failed. Messages name the database through
/// [`super::redacted_url`]: never with its password.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// A setting is out of range (empty pool, zero lease, bad schema name).
    #[error("invalid PostgreSQL setting: {0}")]
    Config(String),
    /// The URL does not parse.
    #[error("invalid database URL {url}: {reason}")]
    Url {
        /// The redacted URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be opened (after the bounded retries), or the server refused us.
    #[error("cannot connect to database {url}: {reason}")]
    Connect {
        /// The redacted URL.
        url: String,
        /// The last error.
        reason: String,
    },
    /// The CA certificates to verify the server with cannot be used: the `sslrootcert` file (or
    /// libpq's default `~/.postgresql/root.crt` under `verify-ca`/`verify-full`) is missing,
    /// unreadable or holds no usable certificate, or the system's store is empty.
    #[error(
        "cannot use the root certificate file {path} (sslrootcert) for database {url}: {reason}"
    )]
    RootCert {
        /// The redacted URL.
        url: String,
        /// The file (or `system`).
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server's TLS certificate was rejected (`verify-ca`, `verify-full`, or `require` with a
    /// root certificate). Not retried: the same certificate would be rejected again.
    #[error(
        "cannot connect to database {url}: the TLS certificate of {host} is not accepted: {problem}"
    )]
    Certificate {
        /// The redacted URL.
        url: String,
        /// The host name (or address) connected to, as the URL names it.
        host: String,
        /// Why it was rejected.
        problem: CertProblem,
    },
    /// The schema could not be created or migrated.
    #[error("cannot create or migrate schema {schema:?} in database {url}: {reason}")]
    Migrate {
        /// The redacted URL.
        url: String,
        /// The schema.
        schema: String,
        /// The last error.
        reason: String,
    },
    /// The schema was migrated by a newer build: this one refuses to serve tables it does not know.
    #[error(
        "schema {schema:?} in database {url} is at version {found}, newer than this build's \
         version {known}: run a build that knows version {found} (or use another schema)"
    )]
    SchemaTooNew {
        /// The redacted URL.
        url: String,
        /// The schema.
        schema: String,
        /// The schema's version in the database.
        found: i32,
        /// The newest version this build knows ([`super::SCHEMA_VERSION`]).
        known: i32,
    },
}

/// Why a server's TLS certificate was rejected ([`PgError::Certificate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertProblem {
    /// The certificate does not chain to any of the trusted CA certificates.
    #[error("certificate signed by an unknown CA: not trusted by {roots}")]
    NotTrusted {
        /// Where the trusted CAs came from (`sslrootcert /path/ca.pem`, or the system's roots).
        roots: String,
    },
    /// `verify-full`: the certificate is not valid for the host name connected to.
    #[error("host name mismatch: the certificate is valid for {} only", names(.presented))]
    NameMismatch {
        /// The names the certificate holds (DNS names and IP addresses), when known.
        presented: Vec<String>,
    },
    /// Anything else: expired, not yet valid, not for server use, malformed.
    #[error("{0}")]
    Invalid(String),
}

fn names(presented: &[String]) -> String {
    if presented.is_empty() {
        "other names".to_string()
    } else {
        presented.join(", ")
    }
}

/// Checks that `schema` is a plain identifier, safe to quote into statements.
pub(crate) fn validate_schema(schema: &str) -> Result<(), PgError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && !schema.as_bytes()[0].is_ascii_digit()
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(PgError::Config(format!(
            "schema name {schema:?} must be 1-63 letters, digits or '_', not starting with a digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_identifiers() {
        for ok in ["idemlog", "t_1a2b", "_x", "Mixed_Case"] {
            assert!(validate_schema(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1abc", "a-b", "a\"b", "a b", "a;drop", &"x".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad}");
        }
    }
}
