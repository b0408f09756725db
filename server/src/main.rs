//! The `idemlog-server` binary: parse flags, open the store, serve, shut down gracefully.
//!
//! Shutdown on SIGTERM or Ctrl-C: stop accepting, let requests in flight finish (connections still
//! open after `--shutdown-grace` are closed), wait up to `--shutdown-grace` again for handlers whose
//! clients already left, then close the store, which flushes and syncs the log.

use std::io::{IsTerminal, Stderr};
use std::process::ExitCode;
use std::sync::Arc;

use idemlog::{Options, SystemClock};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::backends::postgres::{PgConfig, PostgresBackend, redacted_url};
use idemlog_idempotency::{StoreError, StoreHandle};
use idemlog_server::auth::{ApiKeys, DEMO_ACCOUNT, DEMO_API_KEY};
use idemlog_server::config::{Config, LogFormat, StoreChoice, Switch};
use idemlog_server::log_buffer::{LogGuard, log_buffer};
use idemlog_server::router::{RouterConfig, Services, router};
use idemlog_server::telemetry::log_subscriber;
use tokio::net::TcpListener;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt;

/// mimalloc instead of glibc malloc: a request allocates and frees a few dozen small blocks, often on
/// different worker threads, and glibc's arena locks and chunk consolidation took about a fifth of
/// the server's CPU in a profile under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, thiserror::Error)]
enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("could not open the store in {dir}: {source}")]
    Open {
        dir: String,
        #[source]
        source: idemlog::Error,
    },
    #[error("{0}")]
    Database(String),
    #[error("the store cannot be read: {0}")]
    Store(#[source] StoreError),
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),
    #[error("closing the store failed: {0}")]
    Close(#[source] StoreError),
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Log lines go to stderr through a batching writer thread ([`log_buffer`]): a request appends its
/// line to a shared buffer and the `idemlog-log` thread writes what has gathered in one call. The
/// returned guard writes what is pending when `main` returns; a crash can lose the lines of the
/// last 10 ms (README, "What a request logs").
fn init_logging(format: LogFormat) -> std::io::Result<LogGuard<Stderr>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let (writer, guard) = log_buffer(std::io::stderr())?;
    let subscriber = log_subscriber(filter, format, writer, ansi);
    // `try_init` also forwards the `log` crate's records (tokio-postgres logs through it).
    subscriber.try_init().map_err(std::io::Error::other)?;
    Ok(guard)
}

fn main() -> ExitCode {
    let (config, store_choice) =
        Config::parse_with_store(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let _log_guard = match init_logging(config.log_format) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("could not start the log writer thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(workers) = config.worker_threads {
        runtime.worker_threads(usize::from(workers));
    }
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "could not start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config, store_choice)) {
        Ok(()) => {
            info!("shut down cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %e, "server stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config, store_choice: StoreChoice) -> Result<(), ServerError> {
    let keys = ApiKeys::new(&config.api_keys).map_err(|e| ServerError::Config(e.to_string()))?;
    if keys.is_demo() {
        warn!(
            api_key = DEMO_API_KEY,
            account = DEMO_ACCOUNT,
            "NO API KEYS CONFIGURED: serving with the public DEMO key. Anyone can use it. \
             Pass --api-key KEY=ACCOUNT (or IDEMLOG_API_KEYS) for real use."
        );
    } else {
        info!(keys = keys.len(), "API keys loaded");
    }
    if config.idempotency == Switch::Off {
        warn!(
            "IDEMPOTENCY LAYER OFF (--idempotency off): POST /payments is NOT protected against \
             duplicates. This mode exists only to benchmark the layer's cost."
        );
    }

    let (store, max_value_bytes) = match &store_choice {
        StoreChoice::Postgres(url) => {
            if config.data_dir.is_some() {
                info!("IDEMLOG_DATA_DIR ignored: --database-url chooses the PostgreSQL store");
            }
            (open_postgres(&config, url).await?, 4 << 20)
        }
        StoreChoice::Embedded(dir) => {
            if config.database_url.is_some() {
                info!("IDEMLOG_DATABASE_URL ignored: --data-dir chooses the embedded store");
            }
            open_embedded(&config, dir).await?
        }
    };
    info!(
        backend = store.kind(),
        "store chosen: the {} store serves every request",
        store.kind()
    );

    let app_config = RouterConfig {
        key_ttl: config.key_ttl,
        lease: config.lease,
        retry_after: config.retry_after,
        max_body_bytes: config.max_body_bytes,
        max_response_bytes: max_value_bytes,
        fingerprint: config.fingerprint.into(),
        gateway_latency: config.gateway_latency,
        gateway_fail_after_charge: config.gateway_fail_after_charge,
        idempotency: config.idempotency == Switch::On,
        max_live_keys_per_account: config.max_live_keys_per_account,
    };
    let application = Services::new(Arc::clone(&store), keys, &app_config);
    match application.gateway.charges_total().await {
        Ok(total) => info!(
            charges_total = total,
            backend = store.kind(),
            "payment provider ready"
        ),
        Err(e) => return Err(ServerError::Store(e)),
    }
    let router = router(&application);

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServerError::Serve)?;
    info!(%addr, "listening");

    idemlog_server::serve::serve(listener, router, config.http_limits(), shutdown_signal())
        .await
        .map_err(ServerError::Serve)?;

    info!("stopped accepting; connections closed");
    if let Some(layer) = &application.idempotency {
        let in_flight = layer.in_flight();
        if in_flight.count() > 0 {
            info!(
                tasks = in_flight.count(),
                "waiting for requests whose clients left to finish"
            );
        }
        if tokio::time::timeout(config.shutdown_grace, in_flight.wait_idle())
            .await
            .is_err()
        {
            warn!(
                tasks = in_flight.count(),
                "requests still running after the grace period: their keys are taken over \
                 after the lease on the next start"
            );
        }
    }
    store.close().await.map_err(ServerError::Close)?;
    info!("store closed: log flushed and synced");
    Ok(())
}

/// The embedded store in `--data-dir` (the default), and the largest value it stores.
async fn open_embedded(
    config: &Config,
    data_dir: &std::path::Path,
) -> Result<(StoreHandle, usize), ServerError> {
    let clock = Arc::new(SystemClock);
    let options = Options::default()
        .durability(config.engine_durability())
        .group_commit(config.engine_group_commit())
        .lease(config.lease)
        .clock(clock);
    let max_value_bytes = options.max_value_bytes;
    let dir = data_dir.to_path_buf();
    let embedded = tokio::task::spawn_blocking(move || EmbeddedBackend::open(&dir, options))
        .await?
        .map_err(|source| ServerError::Open {
            dir: data_dir.display().to_string(),
            source,
        })?;
    if let Some(engine) = embedded.engine() {
        let report = engine.recovery_report();
        info!(
            dir = %data_dir.display(),
            segments = report.segments,
            frames = report.frames,
            operations = report.operations,
            bytes = report.bytes,
            durability = ?config.durability,
            group_commit = ?config.engine_group_commit(),
            "store opened: log replayed"
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

    Ok((Arc::new(embedded), max_value_bytes))
}

/// How long start-up may try to reach PostgreSQL before the process exits non-zero.
const DATABASE_STARTUP_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The shared PostgreSQL store (`--database-url`); `--data-dir` is not used.
async fn open_postgres(config: &Config, url: &str) -> Result<StoreHandle, ServerError> {
    let mut pg = PgConfig::new(url)
        .schema(config.database_schema.clone())
        .lease(config.lease)
        .pool_size(config.database_pool_size)
        .writers(usize::from(config.database_writers))
        .pooling(config.database_pooler.into());
    pg.pool_wait_timeout = config.database_pool_wait;
    let database = redacted_url(url);
    info!(%database, schema = %config.database_schema, "connecting to PostgreSQL");
    let store =
        match tokio::time::timeout(DATABASE_STARTUP_LIMIT, PostgresBackend::connect(pg)).await {
            Ok(Ok(store)) => store,
            Ok(Err(e)) => return Err(ServerError::Database(e.to_string())),
            Err(_) => {
                return Err(ServerError::Database(format!(
                    "could not reach the database {database} within {} s",
                    DATABASE_STARTUP_LIMIT.as_secs()
                )));
            }
        };
    info!(%database, schema = %config.database_schema, "PostgreSQL store ready: schema migrated");
    Ok(Arc::new(store))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("Ctrl-C received: shutting down"),
        () = terminate => info!("SIGTERM received: shutting down"),
    }
}
