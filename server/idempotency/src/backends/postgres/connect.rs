//! Connecting: the pool, the bounded start-up (connection attempts and migration under one
//! deadline), and the background tasks a new store starts.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use parking_lot::Mutex;
use tokio_postgres::SimpleQueryMessage;
use tracing::{info, warn};

use super::batch::BatchRunner;
use super::batch::claims::Claims;
use super::batch::finish::Finishes;
use super::batch::inserts::Inserts;
use super::batch_sizes::BatchSizes;
use super::codec::millis;
use super::config::{self, PgConfig, PgError};
use super::error::describe;
use super::health;
use super::lanes::Lanes;
use super::schema::MigrateError;
use super::sql::Statements;
use super::state::DbState;
use super::statement::Pooling;
use super::store::{Inner, PostgresBackend};
use super::{latency, redacted_url, schema, ssl_params, tls, url};

/// Bound on all of [`PostgresBackend::connect`] (connection attempts and migration), so that a binary that
/// cannot reach its database exits within 30 s.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(25);

impl PostgresBackend {
    /// Connects (bounded: [`PgConfig::connect_attempts`] attempts of at most
    /// [`PgConfig::connect_timeout`] each), creates or migrates the schema, and starts the
    /// background cleanup ([`PgConfig::cleanup_interval`]) and the health probe. Errors name the
    /// database by [`redacted_url`], never with its password.
    pub async fn connect(config: PgConfig) -> Result<PostgresBackend, PgError> {
        config::validate_schema(&config.schema)?;
        if config.writers == 0 {
            return Err(PgError::Config("writers must be at least 1".into()));
        }
        if config.pool_size == 0 {
            return Err(PgError::Config("pool_size must be at least 1".into()));
        }
        if config.pool_size < 3 * config.writers + 1 {
            warn!(
                pool = config.pool_size,
                writers = config.writers,
                "the pool is smaller than three batch writers per kind need, plus one for \
                 other calls: batches will wait for connections"
            );
        }
        if config.lease < Duration::from_millis(1) {
            return Err(PgError::Config("lease must be at least 1 ms".into()));
        }
        let shown = redacted_url(&config.url);
        // libpq's sslmode/sslrootcert are ours (tokio-postgres knows only part of them); the rest is
        // tokio-postgres's to parse.
        let (driver_url, ssl) = ssl_params::split(&config.url).map_err(|reason| PgError::Url {
            url: shown.clone(),
            reason,
        })?;
        let tls = tls::setup(&ssl, &shown)?;
        let sslmode = tls.mode.as_str();
        let mut pg: tokio_postgres::Config =
            driver_url
                .parse()
                .map_err(|e: tokio_postgres::Error| PgError::Url {
                    url: shown.clone(),
                    reason: match std::error::Error::source(&e) {
                        Some(cause) => url::scrub(&format!("{e}: {cause}"), None),
                        None => e.to_string(),
                    },
                })?;
        let password = pg.get_password().map(<[u8]>::to_vec);
        if pg.get_application_name().is_none() {
            pg.application_name("idemlog");
        }
        pg.ssl_mode(tls.driver_mode);
        let scrub = |s: String| url::scrub(&s, password.as_deref());
        let deadline = tokio::time::Instant::now() + STARTUP_DEADLINE;
        let mut pooling = config.pooling;
        let (pool, mut client) = loop {
            let pool = build_pool(pg.clone(), tls.connector.clone(), &config, pooling)?;
            match first_connection(&pool, &config, &shown, deadline, &scrub).await {
                Ok(client) => break (pool, client),
                Err(Refused::StartupOptions(_)) if pooling == Pooling::None => {
                    pool.close();
                    warn!(
                        database = %shown,
                        "the server refused the start-up parameter `options`, as PgBouncer does: \
                         switching to pooler mode (unnamed statements, no session options); \
                         set it explicitly to silence this (--database-pooler transaction)"
                    );
                    pooling = Pooling::Transaction;
                }
                Err(Refused::Certificate(rejected)) => {
                    // A rejected certificate is rejected again on every attempt: say why, now.
                    pool.close();
                    let err = PgError::Certificate {
                        url: shown,
                        host: rejected.host,
                        problem: rejected.problem,
                    };
                    warn!(error = %err, "cannot connect to the database");
                    return Err(err);
                }
                Err(Refused::StartupOptions(last) | Refused::Other(last)) => {
                    pool.close();
                    return Err(PgError::Connect {
                        url: shown,
                        reason: last,
                    });
                }
            }
        };
        if pooling == Pooling::Transaction {
            warn_without_statement_timeout(&client, &shown).await;
        }
        let migrated =
            tokio::time::timeout_at(deadline, schema::migrate(&mut client, &config.schema))
                .await
                .unwrap_or_else(|_| {
                    Err(MigrateError::Db(format!(
                        "not done within {} s",
                        STARTUP_DEADLINE.as_secs()
                    )))
                });
        match migrated {
            Ok(()) => {}
            Err(MigrateError::TooNew { found, known }) => {
                pool.close();
                return Err(PgError::SchemaTooNew {
                    url: shown,
                    schema: config.schema.clone(),
                    found,
                    known,
                });
            }
            Err(MigrateError::Db(reason)) => {
                pool.close();
                return Err(PgError::Migrate {
                    url: shown,
                    schema: config.schema.clone(),
                    reason: scrub(reason),
                });
            }
        }
        drop(client);
        info!(database = %shown, schema = %config.schema, pool = config.pool_size, pooler = ?pooling, sslmode, "PostgreSQL store ready");

        let queue_wait = config.pool_wait_timeout;
        let writers = config.writers;
        let inner = Arc::new_cyclic(|weak| {
            let claims = Lanes::new(
                writers,
                BatchRunner::<Claims>::new(weak.clone()),
                queue_wait,
                "claim",
            );
            let finishes = Lanes::new(
                writers,
                BatchRunner::<Finishes>::new(weak.clone()),
                queue_wait,
                "complete",
            );
            let inserts = Lanes::new(
                writers,
                BatchRunner::<Inserts>::new(weak.clone()),
                queue_wait,
                "insert_once",
            );
            Inner {
                pool,
                sql: Statements::new(&config.schema),
                pooling,
                lease: config.lease,
                lease_ms: millis(config.lease),
                attempt_timeout: config.pool_wait_timeout
                    + config.connect_timeout
                    + config.statement_timeout
                    + Duration::from_secs(1),
                pool_wait: config.pool_wait_timeout,
                state: Arc::new(DbState::default()),
                tasks: Mutex::new(Vec::new()),
                password,
                latency: latency::StatementLatency::default(),
                batch_sizes: BatchSizes::default(),
                claims,
                finishes,
                inserts,
                cleanup_from: Mutex::new(String::new()),
            }
        });
        // Start-up has just reached the database: the probe's first check is due a whole interval
        // from now, not at once (where it would race the first calls for the pool's connections).
        inner.state.mark_up();
        let probe = tokio::spawn(health::probe(inner.pool.clone(), inner.state.clone()));
        inner.tasks.lock().push(probe);
        let store = PostgresBackend { inner };
        if let Some(interval) = config.cleanup_interval {
            store.spawn_cleanup(interval, config.cleanup_batch);
        }
        Ok(store)
    }
}

/// Why the first connection failed.
enum Refused {
    /// The server (a pooler) refused the start-up parameter `options`.
    StartupOptions(String),
    /// The server's TLS certificate was refused (see [`tls`]).
    Certificate(tls::Rejected),
    Other(String),
}

/// The pool for `pg`. Under [`Pooling::None`] the session timeouts travel in the start-up
/// `options`; a pooler in transaction mode refuses that parameter (and would hand the session's
/// settings to other clients' transactions anyway), so under [`Pooling::Transaction`] they must
/// be set on the role (README, "Through PgBouncer") and the client-side bound of every call
/// remains.
fn build_pool(
    mut pg: tokio_postgres::Config,
    connector: tokio_postgres_rustls::MakeRustlsConnect,
    config: &PgConfig,
    pooling: Pooling,
) -> Result<Pool, PgError> {
    if pooling == Pooling::None {
        let statement_ms = millis(config.statement_timeout).max(1);
        let mut options = pg.get_options().unwrap_or_default().to_string();
        if !options.is_empty() {
            options.push(' ');
        }
        options.push_str(&format!(
            "-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout={}",
            statement_ms.saturating_mul(2)
        ));
        pg.options(options);
    }
    pg.connect_timeout(config.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(config.statement_timeout + Duration::from_secs(5));
    let manager = Manager::from_config(
        pg,
        connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(config.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(config.pool_wait_timeout))
        .create_timeout(Some(config.connect_timeout + Duration::from_secs(1)))
        .recycle_timeout(Some(config.connect_timeout))
        .build()
        .map_err(|e| PgError::Config(e.to_string()))
}

/// The first connection: [`PgConfig::connect_attempts`] attempts one second apart, all before
/// `deadline`. Authentication failures and a missing database end the attempts at once.
async fn first_connection(
    pool: &Pool,
    config: &PgConfig,
    shown: &str,
    deadline: tokio::time::Instant,
    scrub: &impl Fn(String) -> String,
) -> Result<Object, Refused> {
    let attempts = config.connect_attempts.max(1);
    let mut last = String::new();
    for attempt in 1..=attempts {
        let got = tokio::time::timeout_at(deadline, pool.get())
            .await
            .unwrap_or(Err(PoolError::Timeout(TimeoutType::Create)));
        let e = match got {
            Ok(client) => return Ok(client),
            Err(e) => e,
        };
        if let PoolError::Backend(db) = &e
            && let Some(rejected) = tls::rejection(db)
        {
            return Err(Refused::Certificate(rejected.clone()));
        }
        let fatal = match &e {
            PoolError::Backend(db) => db.code().is_some_and(|c| {
                let c = c.code();
                c.starts_with("28") || c == "3D000"
            }),
            _ => false,
        };
        last = scrub(match &e {
            PoolError::Backend(db) => describe(db),
            PoolError::Timeout(_) => format!(
                "no connection within {} ms",
                config.connect_timeout.as_millis()
            ),
            other => other.to_string(),
        });
        if let PoolError::Backend(db) = &e
            && refused_options(db)
        {
            return Err(Refused::StartupOptions(last));
        }
        warn!(database = %shown, attempt, attempts, error = %last, "cannot connect to the database");
        if fatal {
            break;
        }
        if attempt < attempts {
            if tokio::time::Instant::now() + Duration::from_secs(1) >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Err(Refused::Other(last))
}

/// PgBouncer's answer to a start-up packet with `options`: "unsupported startup parameter: options".
fn refused_options(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        db.message()
            .to_ascii_lowercase()
            .contains("unsupported startup parameter: options")
    })
}

/// Through a pooler the start-up `options` cannot set the server-side timeouts: says so at
/// start-up when the role or database does not set `statement_timeout` either.
async fn warn_without_statement_timeout(client: &Object, shown: &str) {
    let value = match client.simple_query("SHOW statement_timeout").await {
        Ok(messages) => messages.into_iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        }),
        Err(_) => None,
    };
    if value.as_deref() == Some("0") {
        warn!(
            database = %shown,
            "no server-side statement_timeout through the pooler: set one on the role \
             (ALTER ROLE ... SET statement_timeout = '5s'); calls stay bounded client-side"
        );
    }
}
