//! The `idemlog-proxy` binary: flags, scope source and rules checked before anything starts
//! (exit code 2 on a bad configuration), then the store, the admin and proxy listeners, and a
//! graceful shutdown on SIGTERM/SIGINT (exit code 0 once requests in flight finished and the
//! store is closed).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idemlog_proxy::admin::{self, AdminState};
use idemlog_proxy::app::App;
use idemlog_proxy::cli::Cli;
use idemlog_proxy::config::{RouteRule, RouteSettings, load_rules};
use idemlog_proxy::forward::Upstream;
use idemlog_proxy::metrics::UpstreamMetrics;
use idemlog_proxy::scope::ScopeSource;
use idemlog_proxy::{serve, store, workers};
use tokio::net::TcpListener;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc malloc, as in the server: a request allocates and frees a few dozen
/// small blocks, often on different worker threads, where glibc's arena locks cost CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code of a configuration the proxy refuses to start with.
const EXIT_CONFIG: u8 = 2;

fn config_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("idemlog-proxy: configuration error: {message}");
    ExitCode::from(EXIT_CONFIG)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let scope = match ScopeSource::from_cli(&cli) {
        Ok(scope) => scope,
        Err(e) => return config_error(e),
    };
    let defaults = RouteSettings::defaults(&cli);
    let rules = match &cli.config {
        Some(path) => match load_rules(path, &defaults) {
            Ok(rules) => rules,
            Err(e) => return config_error(e),
        },
        None => Vec::new(),
    };
    let largest_stored = rules
        .iter()
        .map(|r| r.settings.max_stored_response_bytes)
        .fold(defaults.max_stored_response_bytes, usize::max);
    if let Err(e) = store::check_limits(&cli, largest_stored) {
        return config_error(e);
    }
    let metrics = UpstreamMetrics::default();
    let workers = cli.workers.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    );
    // One upstream client (and so one connection pool) per worker: see `run`.
    let mut upstreams = Vec::with_capacity(workers);
    for _ in 0..workers {
        match Upstream::new(&cli.upstream, cli.upstream_timeout, metrics.clone()) {
            Ok(upstream) => upstreams.push(Arc::new(upstream)),
            Err(e) => return config_error(e),
        }
    }
    // This thread's runtime runs the store's background tasks, the admin listener and the
    // shutdown; the proxy listener is served by the worker threads `run` starts.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "could not start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, scope, defaults, rules, upstreams, metrics)) {
        Ok(()) => {
            info!("shut down cleanly");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %e, "proxy stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    cli: Cli,
    scope: ScopeSource,
    defaults: RouteSettings,
    rules: Vec<RouteRule>,
    upstreams: Vec<Arc<Upstream>>,
    metrics: UpstreamMetrics,
) -> Result<(), Box<dyn std::error::Error>> {
    match &scope {
        ScopeSource::Static(s) => warn!(
            scope = s.as_str(),
            "static scope: every caller shares one scope (single-tenant service only)"
        ),
        other => info!(source = %other.describe(), "scope source"),
    }
    let largest_stored = rules
        .iter()
        .map(|r| r.settings.max_stored_response_bytes)
        .fold(defaults.max_stored_response_bytes, usize::max);
    let store = store::open(&cli, largest_stored).await?;
    info!(
        backend = store.kind(),
        upstream = %cli.upstream,
        routes = rules.len(),
        "store chosen"
    );
    let first = upstreams.first().cloned().ok_or("no worker")?;
    let app = App::new(Arc::clone(&store), first, scope, &defaults, rules);
    let layer = app.layer().clone();

    let admin_listener = TcpListener::bind(cli.admin_listen)
        .await
        .map_err(|e| format!("could not listen on {}: {e}", cli.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_router = admin::router(AdminState {
        store: Arc::clone(&store),
        counts: layer.counts(),
        upstream: metrics,
    });
    let admin_task = tokio::spawn(async move {
        let stopped = async {
            let _ = admin_stopped.await;
        };
        axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(stopped)
            .await
    });
    info!(addr = %admin_addr, "admin listening");

    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("could not listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    let limits = serve::Limits {
        grace: cli.shutdown_grace,
        body_read_timeout: cli.body_read_timeout,
    };
    let mut workers = workers::start(&app, upstreams, limits)?;
    info!(addr = %addr, workers = workers.len(), "proxy listening");

    let served = workers
        .serve_until(
            listener,
            serve::connection_permits(cli.max_connections as usize),
            serve::shutdown_signal(),
            limits.grace,
        )
        .await;
    let grace_ends = served.grace_ends;

    let in_flight = layer.in_flight();
    if in_flight.count() > 0 {
        info!(
            tasks = in_flight.count(),
            "waiting for requests whose clients left to finish"
        );
    }
    // One grace period in all: connections and the requests whose clients left share it.
    if tokio::time::timeout_at(grace_ends, in_flight.wait_idle())
        .await
        .is_err()
    {
        // Nothing releases these claims: the upstream may still be running them. Their keys stay
        // in progress in the store (the embedded store keeps the lease across the restart, see
        // `store`), so a retry gets 409 until the lease ends and runs the upstream again only then.
        warn!(
            tasks = in_flight.count(),
            lease_ms = cli.lease.as_millis() as u64,
            "requests still running after the grace period are cut off: their keys are not \
             released; retries get 409 until each claim's lease ends (at most --lease after its \
             last renewal), then a retry takes the key over and runs the upstream again"
        );
    }
    let _ = admin_stop.send(());
    match admin_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "admin listener failed"),
        Err(e) => warn!(error = %e, "admin listener task failed"),
    }
    let closed = store.close().await;
    workers.release();
    closed?;
    info!("store closed");
    match served.failure {
        Some(failure) => Err(failure.into()),
        None => Ok(()),
    }
}
