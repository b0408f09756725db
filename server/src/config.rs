//! Command-line flags and their `IDEMLOG_*` environment variables: the binary's contract.
//!
//! Every flag can also be set from the environment (the variable is named next to each flag in
//! `--help`). Durations are written as a whole number followed by a unit: `250ms`, `2s`, `30s`, `5m`,
//! `24h`, `7d`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use idemlog_idempotency::FingerprintMode;
use idemlog_idempotency::backends::postgres::Pooling;

/// Flags of the `idemlog-server` binary.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "idemlog-server",
    version,
    about = "Payments API behind an Idempotency-Key layer on the embedded idemlog store"
)]
pub struct Config {
    /// Address to listen on (port 0 picks a free port; the chosen address is logged).
    #[arg(long, env = "IDEMLOG_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Directory of the embedded store (created if missing). Default `./data`. Given on the
    /// command line, it always selects the embedded store, whatever the environment holds.
    #[arg(long, env = "IDEMLOG_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// PostgreSQL URL (`postgres://user:password@host:port/db`): keep every record in that shared
    /// database instead of `--data-dir`, so any number of instances can serve the same keys.
    #[arg(long, env = "IDEMLOG_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Schema of the PostgreSQL tables (created or migrated at start-up).
    #[arg(long, env = "IDEMLOG_DATABASE_SCHEMA", default_value = "idemlog")]
    pub database_schema: String,

    /// Most PostgreSQL connections this instance holds.
    #[arg(long, env = "IDEMLOG_DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: usize,

    /// Batch writers per kind of write (claims; completions and releases; the provider's
    /// records): each sends what queued while its previous statement was in flight as one
    /// statement, so concurrent requests share statements and commits. Requests are routed to a
    /// writer by their key.
    #[arg(long, env = "IDEMLOG_DATABASE_WRITERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub database_writers: u16,

    /// A connection pooler between this server and PostgreSQL: `transaction` for PgBouncer's
    /// `pool_mode = transaction` (unnamed statements, no start-up options; set
    /// `statement_timeout` on the role instead). A server that refuses the start-up options, as
    /// PgBouncer does, is detected and switches to `transaction` with a warning.
    #[arg(long, env = "IDEMLOG_DATABASE_POOLER", value_enum, default_value_t = PoolerArg::None)]
    pub database_pooler: PoolerArg,

    /// Longest a request waits for a pooled PostgreSQL connection before it gets a 503.
    #[arg(long, env = "IDEMLOG_DATABASE_POOL_WAIT", default_value = "2s", value_parser = parse_positive_duration)]
    pub database_pool_wait: Duration,

    /// API key and the account it authenticates, as KEY=ACCOUNT; repeatable. The environment form
    /// is comma-separated: IDEMLOG_API_KEYS="k1=acct_a,k2=acct_b". With none, a demo key is used.
    #[arg(
        long = "api-key",
        env = "IDEMLOG_API_KEYS",
        value_name = "KEY=ACCOUNT",
        value_delimiter = ',',
        value_parser = parse_api_key
    )]
    pub api_keys: Vec<(String, String)>,

    /// How long a completed (or claimed) Idempotency-Key is remembered; the fake provider remembers
    /// its derived key for as long.
    #[arg(long, env = "IDEMLOG_KEY_TTL", default_value = "24h", value_parser = parse_positive_duration)]
    pub key_ttl: Duration,

    /// How long a claim holds its key before a retry may take it over (the holder renews it while
    /// its handler runs, so only a dead holder loses it).
    #[arg(long, env = "IDEMLOG_LEASE", default_value = "30s", value_parser = parse_positive_duration)]
    pub lease: Duration,

    /// `Retry-After` of a 409 (a request with this key is still running): a short hint, capped by
    /// the time left on the running claim's lease.
    #[arg(long, env = "IDEMLOG_RETRY_AFTER", default_value = "1s", value_parser = parse_positive_duration)]
    pub retry_after: Duration,

    /// Most live (unexpired) Idempotency-Keys per account: a request with a new key beyond it is a
    /// 429 with `Retry-After` (until the account's next key expires). 0: no limit.
    #[arg(
        long,
        env = "IDEMLOG_MAX_LIVE_KEYS_PER_ACCOUNT",
        default_value_t = 1_000_000
    )]
    pub max_live_keys_per_account: u64,

    /// When a write must be on disk before the request is answered.
    #[arg(long, env = "IDEMLOG_DURABILITY", value_enum, default_value_t = DurabilityArg::Sync)]
    pub durability: DurabilityArg,

    /// `--durability sync`: how long an fdatasync may be held back so that more requests share it
    /// (`0ms`, the default: synced as soon as one request waits). When set, and requests come
    /// together (a lone one is still synced at once), the log syncs once
    /// as many requests wait as recently came together (three quarters of the recent peak, at most
    /// `--group-commit-batch`) or the first has waited this long. Each fdatasync
    /// costs the same CPU however much it covers, so with many more concurrent clients than the
    /// batch this saves CPU per request; with a few clients it costs throughput (benches/NOTEBOOK.md,
    /// issue 23).
    #[arg(long, env = "IDEMLOG_GROUP_COMMIT_WAIT", default_value = "0ms", value_parser = parse_group_commit_wait)]
    pub group_commit_wait: Duration,

    /// `--durability sync` with `--group-commit-wait`: most waiting requests an fdatasync waits for.
    #[arg(long, env = "IDEMLOG_GROUP_COMMIT_BATCH", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub group_commit_batch: u16,

    /// fdatasync interval for `--durability periodic`.
    #[arg(long, env = "IDEMLOG_SYNC_INTERVAL", default_value = "100ms", value_parser = parse_positive_duration)]
    pub sync_interval: Duration,

    /// Largest request body accepted on idempotent routes (bytes); larger is 413.
    #[arg(long, env = "IDEMLOG_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,

    /// Time the fake payment provider takes to answer a charge (after recording it).
    #[arg(long, env = "IDEMLOG_GATEWAY_LATENCY", default_value = "50ms", value_parser = parse_duration)]
    pub gateway_latency: Duration,

    /// The fake provider records the first N new charges, then fails the call as though its
    /// response was lost (the handler answers 502 and the key is released).
    #[arg(long, env = "IDEMLOG_GATEWAY_FAIL_AFTER_CHARGE", default_value_t = 0)]
    pub gateway_fail_after_charge: u64,

    /// How request bodies enter the fingerprint: JSON in canonical form (sorted keys, no
    /// insignificant whitespace) or the exact bytes.
    #[arg(long, env = "IDEMLOG_FINGERPRINT", value_enum, default_value_t = FingerprintArg::CanonicalJson)]
    pub fingerprint: FingerprintArg,

    /// BENCHMARKING AID ONLY: `off` serves POST /payments without the idempotency layer so a load
    /// generator can measure the layer's cost against the same handler. Never run `off` for real.
    #[arg(long, env = "IDEMLOG_IDEMPOTENCY", value_enum, default_value_t = Switch::On)]
    pub idempotency: Switch,

    /// Log format.
    #[arg(long, env = "IDEMLOG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Threads that run requests (the async runtime's workers). Default: one per CPU. The store's
    /// own threads (the log's flusher, the maintenance thread, the log writer) come on top; on a
    /// machine of few cores shared with other busy processes, one fewer worker than cores can
    /// cost less CPU per request (benches/NOTEBOOK.md, issue 23). At most 1024: each is an OS thread
    /// started up front.
    #[arg(long, env = "IDEMLOG_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=MAX_WORKER_THREADS))]
    pub worker_threads: Option<u16>,

    /// How long shutdown waits, in each of its two phases: for open connections to finish their
    /// requests (then lingering connections are closed), then for requests still running after
    /// their clients left.
    #[arg(long, env = "IDEMLOG_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// How long a client has to send a complete request head (request line and headers), counted
    /// from when the connection is accepted or finished its previous response; then the connection
    /// is closed.
    #[arg(long, env = "IDEMLOG_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,

    /// Longest wait for the next piece of a request body; then the request fails with a 4xx
    /// before anything is claimed or charged, and the connection is closed.
    #[arg(long, env = "IDEMLOG_BODY_READ_TIMEOUT", default_value = "15s", value_parser = parse_positive_duration)]
    pub body_read_timeout: Duration,

    /// A connection with no bytes read or written for this long is closed once its current
    /// request (if any) is answered. Between HTTP/1.1 requests the --header-read-timeout already
    /// runs, so an idle keep-alive connection is closed after the smaller of the two.
    #[arg(long, env = "IDEMLOG_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_positive_duration)]
    pub idle_timeout: Duration,

    /// Most connections served at once; further clients wait in the listen backlog until one
    /// closes. Keeps the process well below its file descriptor limit.
    #[arg(long, env = "IDEMLOG_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

/// `--durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Every answer waits for an fdatasync covering its records (group commit).
    Sync,
    /// Records are written at once and fdatasynced every `--sync-interval`.
    Periodic,
    /// No fdatasync until shutdown: a crash may lose recent records. For tests and benchmarks.
    None,
}

/// `--fingerprint`: the command-line names of [`FingerprintMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FingerprintArg {
    /// JSON bodies in canonical form; anything else as exact bytes.
    CanonicalJson,
    /// Every body as its exact bytes.
    ExactBytes,
}

impl From<FingerprintArg> for FingerprintMode {
    fn from(arg: FingerprintArg) -> Self {
        match arg {
            FingerprintArg::CanonicalJson => FingerprintMode::CanonicalJson,
            FingerprintArg::ExactBytes => FingerprintMode::ExactBytes,
        }
    }
}

/// `--database-pooler`: the command-line names of [`Pooling`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolerArg {
    /// Direct connections, or a pooler in session mode.
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`).
    Transaction,
}

impl From<PoolerArg> for Pooling {
    fn from(arg: PoolerArg) -> Self {
        match arg {
            PoolerArg::None => Pooling::None,
            PoolerArg::Transaction => Pooling::Transaction,
        }
    }
}

/// An on/off switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines with key=value fields.
    Text,
    /// One JSON object per line.
    Json,
}

/// The store that serves, chosen explicitly (see [`Config::parse_with_store`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The embedded store in this directory.
    Embedded(PathBuf),
    /// The shared PostgreSQL database at this URL.
    Postgres(String),
}

/// Directory of the embedded store when neither store is named.
pub const DEFAULT_DATA_DIR: &str = "./data";

impl Config {
    /// Parses `args` (and the environment) and chooses the store: a store named on the command
    /// line wins over the environment, so an explicit `--data-dir` always means the embedded store;
    /// `--data-dir` and `--database-url` both on the command line (or `IDEMLOG_DATA_DIR` and
    /// `IDEMLOG_DATABASE_URL` both in the environment, neither on the command line) is an error
    /// naming both; with neither, the embedded store in `./data`.
    pub fn parse_with_store<I, T>(args: I) -> Result<(Config, StoreChoice), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        let mut command = Config::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let config = Config::from_arg_matches(&matches)?;
        let source = |id: &str| matches.value_source(id);
        let cli = |id: &str| source(id) == Some(ValueSource::CommandLine);
        let mut both = |what: &str| {
            command.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "{what}: choose one store, the embedded one (--data-dir) or PostgreSQL \
                     (--database-url)"
                ),
            )
        };
        let embedded = |config: &Config| {
            StoreChoice::Embedded(
                config
                    .data_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            )
        };
        let choice = match (&config.database_url, cli("data_dir"), cli("database_url")) {
            (Some(_), true, true) => {
                return Err(both("--data-dir and --database-url both given"));
            }
            (_, true, false) | (None, _, _) => embedded(&config),
            (Some(url), false, true) => StoreChoice::Postgres(url.clone()),
            (Some(url), false, false) => {
                if config.data_dir.is_some() {
                    return Err(both(
                        "IDEMLOG_DATA_DIR and IDEMLOG_DATABASE_URL both set in the environment",
                    ));
                }
                StoreChoice::Postgres(url.clone())
            }
        };
        Ok((config, choice))
    }
}

impl Config {
    /// The HTTP connection limits for these flags.
    pub fn http_limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections as usize,
            shutdown_grace: self.shutdown_grace,
        }
    }

    /// When the engine's committer syncs for waiting requests, for these flags.
    pub fn engine_group_commit(&self) -> idemlog::GroupCommit {
        if self.group_commit_wait.is_zero() {
            idemlog::GroupCommit::Immediate
        } else {
            idemlog::GroupCommit::Gather {
                max_batch: usize::from(self.group_commit_batch),
                max_wait: self.group_commit_wait,
            }
        }
    }

    /// The engine's durability mode for these flags.
    pub fn engine_durability(&self) -> idemlog::Durability {
        match self.durability {
            DurabilityArg::Sync => idemlog::Durability::Sync,
            DurabilityArg::Periodic => idemlog::Durability::Periodic(self.sync_interval),
            DurabilityArg::None => idemlog::Durability::None,
        }
    }
}

/// Parses `250ms`, `2s`, `30s`, `5m`, `24h`, `7d` (and `0ms`), with humantime's grammar (which
/// also takes `1.5s`, `1h 30m`, `2days` and the like).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "duration {text:?}: {e}: write a whole number and a unit, such as 250ms, 30s or 24h"
        )
    })
}

/// [`parse_duration`], refusing zero (TTLs, leases, intervals).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("duration {text:?} must be at least 1ms"));
    }
    Ok(d)
}

/// Most `--worker-threads`.
pub const MAX_WORKER_THREADS: i64 = 1024;

/// Longest `--group-commit-wait`: the engine's bound on how long an fdatasync may be held back.
pub const MAX_GROUP_COMMIT_WAIT: Duration = Duration::from_secs(1);

/// Parses `--group-commit-wait`: a duration of at most [`MAX_GROUP_COMMIT_WAIT`] (`0ms`: off).
pub fn parse_group_commit_wait(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > MAX_GROUP_COMMIT_WAIT {
        return Err(format!(
            "group commit wait {text:?} is longer than {} ms",
            MAX_GROUP_COMMIT_WAIT.as_millis()
        ));
    }
    Ok(d)
}

/// Parses `KEY=ACCOUNT`: the key is visible ASCII, the account 1–255 visible ASCII characters (it
/// becomes the engine's scope).
pub fn parse_api_key(text: &str) -> Result<(String, String), String> {
    let (key, account) = text
        .split_once('=')
        .ok_or_else(|| "expected KEY=ACCOUNT".to_owned())?;
    let visible = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if !visible(key) {
        return Err("the API key must be non-empty visible ASCII".to_owned());
    }
    if !visible(account) || account.len() > idemlog::MAX_SCOPE {
        return Err(format!(
            "the account must be 1–{} visible ASCII characters",
            idemlog::MAX_SCOPE
        ));
    }
    Ok((key.to_owned(), account.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_documented_forms() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        // humantime's grammar also takes fractions and sums.
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn durations_without_a_number_and_unit_are_refused() {
        for bad in ["30", "", "s", "10x", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn zero_is_a_duration_but_not_a_positive_one() {
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert!(parse_positive_duration("0s").is_err());
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn api_keys_are_key_equals_account() {
        assert_eq!(
            parse_api_key("k1=acct_a"),
            Ok(("k1".to_owned(), "acct_a".to_owned()))
        );
        assert!(parse_api_key("k1").is_err());
        assert!(parse_api_key("=acct").is_err());
        assert!(parse_api_key("k1=").is_err());
        assert!(parse_api_key("k 1=acct").is_err());
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::try_parse_from(["idemlog-server"]).expect("defaults parse");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.data_dir, None);
        assert!(c.api_keys.is_empty());
        assert_eq!(c.key_ttl, Duration::from_secs(86_400));
        assert_eq!(c.lease, Duration::from_secs(30));
        assert_eq!(c.retry_after, Duration::from_secs(1));
        assert_eq!(c.database_schema, "idemlog");
        assert_eq!(c.database_pool_size, 16);
        assert_eq!(c.database_writers, 1);
        assert_eq!(c.database_pool_wait, Duration::from_secs(2));
        assert_eq!(c.durability, DurabilityArg::Sync);
        assert_eq!(c.max_body_bytes, 65_536);
        assert_eq!(c.gateway_latency, Duration::from_millis(50));
        assert_eq!(c.gateway_fail_after_charge, 0);
        assert_eq!(c.idempotency, Switch::On);
    }

    #[test]
    fn group_commit_is_immediate_unless_a_wait_is_given() {
        let c = Config::try_parse_from(["idemlog-server"]).expect("defaults parse");
        assert_eq!(c.engine_group_commit(), idemlog::GroupCommit::Immediate);
        let c = Config::try_parse_from(["idemlog-server", "--group-commit-wait", "2ms"])
            .expect("parse");
        assert_eq!(
            c.engine_group_commit(),
            idemlog::GroupCommit::Gather {
                max_batch: 32,
                max_wait: Duration::from_millis(2)
            }
        );
        assert!(Config::try_parse_from(["idemlog-server", "--group-commit-batch", "0"]).is_err());
    }

    #[test]
    fn a_group_commit_wait_over_one_second_is_refused_at_parse_time() {
        assert!(Config::try_parse_from(["idemlog-server", "--group-commit-wait", "1s"]).is_ok());
        let err = Config::try_parse_from(["idemlog-server", "--group-commit-wait", "2s"])
            .expect_err("2s accepted");
        assert!(err.to_string().contains("longer than 1000 ms"), "{err}");
    }

    #[test]
    fn worker_threads_default_to_the_runtime_choice_and_refuse_zero_and_thousands() {
        let c = Config::try_parse_from(["idemlog-server"]).expect("defaults parse");
        assert_eq!(c.worker_threads, None);
        let c = Config::try_parse_from(["idemlog-server", "--worker-threads", "3"]).expect("parse");
        assert_eq!(c.worker_threads, Some(3));
        assert!(Config::try_parse_from(["idemlog-server", "--worker-threads", "0"]).is_err());
        assert!(Config::try_parse_from(["idemlog-server", "--worker-threads", "1025"]).is_err());
    }

    #[test]
    fn http_limits_default_to_payments_api_values() {
        let c = Config::try_parse_from(["idemlog-server"]).expect("defaults parse");
        assert_eq!(c.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.body_read_timeout, Duration::from_secs(15));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.max_connections, 4096);
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        let limits = c.http_limits();
        assert_eq!(limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(limits.body_read_timeout, Duration::from_secs(15));
        assert_eq!(limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(limits.max_connections, 4096);
        assert_eq!(limits.shutdown_grace, Duration::from_secs(30));
    }

    #[test]
    fn http_limits_take_flags_and_refuse_zero() {
        let c = Config::try_parse_from([
            "idemlog-server",
            "--header-read-timeout",
            "300ms",
            "--body-read-timeout",
            "2s",
            "--idle-timeout",
            "1m",
            "--max-connections",
            "8",
        ])
        .expect("parse");
        assert_eq!(c.header_read_timeout, Duration::from_millis(300));
        assert_eq!(c.body_read_timeout, Duration::from_secs(2));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.max_connections, 8);
        for (flag, zero) in [
            ("--header-read-timeout", "0ms"),
            ("--body-read-timeout", "0s"),
            ("--idle-timeout", "0s"),
            ("--max-connections", "0"),
        ] {
            assert!(
                Config::try_parse_from(["idemlog-server", flag, zero]).is_err(),
                "{flag} {zero} should be refused"
            );
        }
    }

    #[test]
    fn api_key_flag_repeats() {
        let c = Config::try_parse_from([
            "idemlog-server",
            "--api-key",
            "k1=acct_a",
            "--api-key",
            "k2=acct_b",
        ])
        .expect("parse");
        assert_eq!(c.api_keys.len(), 2);
        assert_eq!(c.api_keys[1], ("k2".to_owned(), "acct_b".to_owned()));
    }

    #[test]
    fn no_store_named_means_the_embedded_store_in_data() {
        let (_, choice) = Config::parse_with_store(["idemlog-server"]).expect("parse");
        assert_eq!(choice, StoreChoice::Embedded(PathBuf::from("./data")));
    }

    #[test]
    fn a_database_url_flag_chooses_postgres() {
        let (_, choice) =
            Config::parse_with_store(["idemlog-server", "--database-url", "postgres://db/x"])
                .expect("parse");
        assert_eq!(choice, StoreChoice::Postgres("postgres://db/x".into()));
    }

    #[test]
    fn data_dir_and_database_url_flags_together_are_an_error_naming_both() {
        let err = Config::parse_with_store([
            "idemlog-server",
            "--data-dir",
            "/tmp/x",
            "--database-url",
            "postgres://db/x",
        ])
        .expect_err("both stores named");
        let text = err.to_string();
        assert!(
            text.contains("--data-dir") && text.contains("--database-url"),
            "{text}"
        );
    }
}
