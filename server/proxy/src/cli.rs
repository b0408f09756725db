//! The command line: the flags of `idemlog-proxy` and their defaults (issue 43's contract).
//!
//! Durations use humantime's grammar (`30s`, `24h`, `250ms`). The flags here are checked by clap;
//! the rules that span several flags (exactly one scope source, `--trusted-peer` with
//! `--scope-header`) are checked by
//! [`ScopeSource::from_cli`](crate::scope::ScopeSource::from_cli), whose error the binary turns
//! into exit code 2.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ipnet::IpNet;

/// Flags of the `idemlog-proxy` binary.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "idemlog-proxy",
    version,
    about = "Exactly-once POST/PATCH in front of any HTTP service: an Idempotency-Key reverse proxy"
)]
pub struct Cli {
    /// The service behind the proxy, as `http://host:port` (a path prefix is kept).
    #[arg(long, env = "IDEMLOG_PROXY_UPSTREAM")]
    pub upstream: String,

    /// Address the proxy serves on (HTTP/1.1 and h2c); port 0 picks a free port, logged.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,

    /// Address of `/metrics`, `/healthz` and `/readyz` (never served on `--listen`).
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub admin_listen: SocketAddr,

    /// Directory of the embedded store (created if missing).
    #[arg(long, default_value = "./proxy-data")]
    pub data_dir: PathBuf,

    /// When the embedded store's writes reach the disk.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Sync)]
    pub durability: DurabilityArg,

    /// PostgreSQL URL: keep the keys in that shared database instead of `--data-dir`, so several
    /// proxies can serve the same keys.
    #[arg(long, env = "IDEMLOG_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Schema of the PostgreSQL tables (created or migrated at start-up).
    #[arg(long, default_value = "idemlog")]
    pub database_schema: String,

    /// TOML file with per-route rules (`[[route]]`).
    #[arg(long)]
    pub config: Option<PathBuf>,

    /// Scope from this request header, set by an authenticating gateway in front; believed only
    /// from `--trusted-peer` addresses.
    #[arg(long, value_name = "NAME")]
    pub scope_header: Option<String>,

    /// A peer network (CIDR, or a single address) allowed to set `--scope-header`; repeatable.
    #[arg(long, value_name = "CIDR", value_parser = parse_net)]
    pub trusted_peer: Vec<IpNet>,

    /// Scope from a bearer JWT signed with HS256 by the secret in this file.
    #[arg(long, value_name = "FILE")]
    pub jwt_hs256_secret_file: Option<PathBuf>,

    /// Scope from a bearer JWT signed with RS256 or ES256 by a key of this JWKS file.
    #[arg(long, value_name = "FILE")]
    pub jwt_jwks_file: Option<PathBuf>,

    /// The JWT claim holding the scope.
    #[arg(long, default_value = "sub")]
    pub jwt_claim: String,

    /// Required `iss` of the JWT.
    #[arg(long)]
    pub jwt_issuer: Option<String>,

    /// Required `aud` of the JWT.
    #[arg(long)]
    pub jwt_audience: Option<String>,

    /// One scope for every request: a single-tenant service.
    #[arg(long, value_name = "NAME")]
    pub static_scope: Option<String>,

    /// How long a key (claimed or completed) is remembered.
    #[arg(long, default_value = "24h", value_parser = parse_positive_duration)]
    pub key_ttl: Duration,

    /// How long a claim holds its key before a retry may take it over; renewed while the upstream
    /// is being waited for.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub lease: Duration,

    /// Largest request body of a protected request; larger is 413.
    #[arg(long, default_value_t = 1_048_576)]
    pub max_body_bytes: usize,

    /// Largest upstream response body stored for replay; a larger one is still sent whole to the
    /// first client, and its replay says the body was not kept.
    #[arg(long, default_value_t = 1_048_576)]
    pub max_stored_response_bytes: usize,

    /// Longest wait for the upstream's answer (head, and the body of a protected request); then
    /// 504, and a protected key stays in progress until its lease runs out. A streamed body (a
    /// pass-through answer) may pause this long between pieces before the client's connection is
    /// cut.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub upstream_timeout: Duration,

    /// Longest wait for the next piece of a request body; then 408 (a protected request claims
    /// nothing) and the connection is closed.
    #[arg(long, default_value = "15s", value_parser = parse_positive_duration)]
    pub body_read_timeout: Duration,

    /// Most connections served at once; further clients wait in the listen backlog.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long shutdown waits for requests in flight.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub shutdown_grace: Duration,

    /// Threads serving the proxy listener, each with an event loop and a pool of upstream
    /// connections of its own (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: Option<u16>,
}

/// `--durability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Every answer waits for an fdatasync covering its records.
    Sync,
    /// No fdatasync until shutdown: a crash may lose recent keys. For tests and benchmarks.
    None,
}

/// Parses a humantime duration (`30s`, `24h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("duration {text:?}: {e}: write a number and a unit, such as 30s or 24h")
    })
}

/// [`parse_duration`], refusing zero.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("duration {text:?} must be at least 1ms"));
    }
    Ok(d)
}

/// Parses a CIDR (`10.0.0.0/8`) or a single address (`127.0.0.1`, as a /32 or /128).
pub fn parse_net(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    text.parse::<std::net::IpAddr>()
        .map(IpNet::from)
        .map_err(|_| format!("{text:?} is neither a CIDR (10.0.0.0/8) nor an IP address"))
}
