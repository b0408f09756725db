//! Opening the store the layer runs on: the embedded engine in `--data-dir` (the default), or
//! PostgreSQL with `--database-url` (several proxies sharing keys). Both are the layer crate's own
//! backends; what is specific to the proxy is the flags and one engine option.
//!
//! The embedded store opens with [`RecoveredClaims::HeldUntilLeaseEnd`]: a claim found in progress
//! at open was held by a proxy that died (`kill -9`) or was stopped before the upstream answered
//! (the shutdown grace ran out), and the upstream it forwarded to does not stop with the proxy. So
//! such a claim keeps the lease its last log record holds (at most `--lease`): retries get 409 with
//! `Retry-After` until it ends, exactly as after a 504, instead of running the upstream a second
//! time while the first run may still be going. PostgreSQL keeps leases in the database, which
//! already behaves this way.

use std::sync::Arc;
use std::time::Duration;

use idemlog::{Options, RecoveredClaims, SystemClock};
use idemlog_idempotency::StoreHandle;
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::backends::postgres::{PgConfig, PostgresBackend, redacted_url};
use tracing::{info, warn};

use crate::cli::{Cli, DurabilityArg};

/// How long start-up may try to reach PostgreSQL.
const DATABASE_STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The embedded store.
    #[error("could not open the store in {dir}: {source}")]
    Embedded {
        /// The directory.
        dir: String,
        /// Why.
        #[source]
        source: idemlog::Error,
    },
    /// PostgreSQL.
    #[error("{0}")]
    Database(String),
    /// A limit is larger than the store accepts.
    #[error("{0}")]
    Limit(String),
    /// The blocking open task failed.
    #[error("store open task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Opens the store the flags choose; `largest_stored` is the largest response any route stores.
pub async fn open(cli: &Cli, largest_stored: usize) -> Result<StoreHandle, OpenError> {
    match &cli.database_url {
        Some(url) => open_postgres(cli, url).await,
        None => open_embedded(cli, largest_stored).await,
    }
}

/// Room left in an engine value for a stored response's status and headers.
const HEADER_ROOM: usize = 64 * 1024;

/// Refuses a stored-response limit the chosen store cannot hold (checked before start-up, so that
/// it is a configuration error rather than a request that fails later).
pub fn check_limits(cli: &Cli, largest_stored: usize) -> Result<(), String> {
    if cli.database_url.is_some() {
        return Ok(());
    }
    let most = Options::default().max_value_bytes - HEADER_ROOM;
    if largest_stored > most {
        return Err(format!(
            "max_stored_response_bytes {largest_stored} is too large for the embedded store: at \
             most {most} bytes"
        ));
    }
    Ok(())
}

async fn open_embedded(cli: &Cli, largest_stored: usize) -> Result<StoreHandle, OpenError> {
    let durability = match cli.durability {
        DurabilityArg::Sync => idemlog::Durability::Sync,
        DurabilityArg::None => idemlog::Durability::None,
    };
    let options = Options::default()
        .durability(durability)
        .lease(cli.lease)
        .recovered_claims(RecoveredClaims::HeldUntilLeaseEnd)
        .clock(Arc::new(SystemClock));
    check_limits(cli, largest_stored).map_err(OpenError::Limit)?;
    let dir = cli.data_dir.clone();
    let embedded = tokio::task::spawn_blocking(move || EmbeddedBackend::open(&dir, options))
        .await?
        .map_err(|source| OpenError::Embedded {
            dir: cli.data_dir.display().to_string(),
            source,
        })?;
    if let Some(engine) = embedded.engine() {
        let report = engine.recovery_report();
        info!(
            dir = %cli.data_dir.display(),
            segments = report.segments,
            operations = report.operations,
            durability = ?cli.durability,
            "embedded store opened: log replayed (claims found in progress keep their lease: \
             the upstream may still be running them)"
        );
        if let Some(torn) = &report.torn_tail {
            warn!(
                segment = %torn.path.display(),
                offset = torn.offset,
                discarded_bytes = torn.discarded,
                "cut a torn tail left by a crash (writes that were never acknowledged)"
            );
        }
    }
    if cli.durability == DurabilityArg::None {
        warn!("--durability none: a crash can lose keys whose responses were already sent");
    }
    Ok(Arc::new(embedded))
}

async fn open_postgres(cli: &Cli, url: &str) -> Result<StoreHandle, OpenError> {
    let pg = PgConfig::new(url)
        .schema(cli.database_schema.clone())
        .lease(cli.lease);
    let database = redacted_url(url);
    info!(%database, schema = %cli.database_schema, "connecting to PostgreSQL");
    match tokio::time::timeout(DATABASE_STARTUP_LIMIT, PostgresBackend::connect(pg)).await {
        Ok(Ok(store)) => {
            info!(%database, "PostgreSQL store ready: schema migrated");
            Ok(Arc::new(store))
        }
        Ok(Err(e)) => Err(OpenError::Database(e.to_string())),
        Err(_) => Err(OpenError::Database(format!(
            "could not reach the database {database} within {} s",
            DATABASE_STARTUP_LIMIT.as_secs()
        ))),
    }
}
