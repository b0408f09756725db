//! HTTP load generator for durability: `POST /payments` with a new `Idempotency-Key` per request
//! against real `idemlog-server` binaries on 127.0.0.1, each in `--durability sync` (the server's
//! default: every answer waits for an fdatasync, group commit) and `--durability none`, so the
//! cost of durable answers over HTTP can be read from one run, for a new build and, optionally, a
//! previous one side by side.
//!
//! For every binary (`--server`, and `--baseline` if given) it starts two servers, `sync` and
//! `none`, each with `--gateway-latency 0ms`, the idempotency layer on, `RUST_LOG=warn` and its own
//! fresh data directory; their environment has no `DATABASE_URL` and no `IDEMLOG_*` variable. Then:
//!
//! 1. **Closed loop** (like `loadgen`): `--rounds` rounds; in each, every configuration runs once
//!    with `--connections` keep-alive connections, each with one request outstanding, for
//!    `--warmup` (not recorded) plus `--duration`. The order of the configurations rotates by one
//!    every round, so that the per-round ratios (sync ÷ none for each binary, new ÷ baseline for
//!    each durability) pair runs close in time. Reported: per run and as medians over the rounds,
//!    req/s, p50/p99 latency and the server's CPU time per request (from `/proc`).
//! 2. **fdatasync per request**: `GET /metrics` at both ends of every recorded window gives
//!    `idemlog_syncs_total` and `idemlog_commit_batch_operations` (`_sum`, `_count`): fdatasyncs
//!    per request (Δsyncs ÷ requests answered in the window) and operations per fdatasync
//!    (Δsum ÷ Δcount), summed over the rounds; `n/a` where a binary does not export them.
//! 3. **Open loop** (fixed arrival rate, wrk2-style, free of coordinated omission): for each
//!    configuration, `--open-loop-fraction` of its closed-loop median req/s (or `--rate`). Request
//!    `i` is due at `start + i / rate` and goes to connection `i mod --open-loop-connections`; a
//!    connection still busy with an earlier request sends it late, and its latency counts from
//!    the time it was due, not the time it was sent. `--warmup`, then `--open-loop-duration`
//!    recorded; requests due in the window are all sent and awaited (for at most as long again).
//!    Latencies go into an HdrHistogram: p50, p99, p99.9, max, the achieved rate against the
//!    target, errors, and the send delay (scheduled to sent: the client's timer, which has 1 ms
//!    resolution, so up to about 1 ms of every open-loop latency can be the client's, plus waiting
//!    for a connection still busy with an earlier request).
//!
//! Before every run (closed and open) it runs `sync`, unless `--sync-before-runs off`: a `none`
//! server leaves hundreds of MiB of dirty page cache, and the kernel writing it back during the
//! next run slows that run's fdatasyncs (the page cache flushed is shown per run). PostgreSQL's WAL
//! flushes suffer the same: with 400 MiB of unrelated dirty pages written just before, a
//! `--database-url` run fell from about 3 000 to 600-950 req/s.
//!
//! With `--database-url URL` every binary runs once, on that PostgreSQL database (mode `postgres`),
//! instead of twice on the embedded store; the figures are the same (fdatasyncs are `n/a`), and the
//! server CPU per request leaves out the database's own.
//!
//! Every response must be a 201; anything else is an error, and the first one's status and body
//! start are printed. The tables are markdown, printed with the command line and the load average
//! at the start; the exit status is 1 if any recorded request failed. Only 127.0.0.1 is contacted.
//!
//! # Usage
//!
//! ```text
//! cargo build --release -p idemlog-server -p idemlog-benches
//! $CARGO_TARGET_DIR/release/durable_http                      # the idemlog-server next to it
//! $CARGO_TARGET_DIR/release/durable_http --server new/idemlog-server \
//!     --baseline old/idemlog-server --rounds 5 --duration 10s
//! $CARGO_TARGET_DIR/release/durable_http --warmup 1s --duration 3s --rounds 1 \
//!     --open-loop-duration 3s                                  # a smoke run
//! $CARGO_TARGET_DIR/release/durable_http --database-url "$DATABASE_URL"  # on PostgreSQL
//! ```
//!
//! `--help` lists every flag. For a previous build, `git worktree add /tmp/old REV` and build it
//! there with its own `CARGO_TARGET_DIR`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use idemlog_benches::http::{
    Keys, MAX_REQUESTS_PER_RUN, Outcome, RunSpec, Server, ServerOptions, default_server_bin,
    median, metric_value, read_response, request, run, scrape,
};
use idemlog_benches::{Flags, item};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SYNCS: &str = "idemlog_syncs_total";
const BATCH_SUM: &str = "idemlog_commit_batch_operations_sum";
const BATCH_COUNT: &str = "idemlog_commit_batch_operations_count";
/// Largest latency the open-loop histograms hold (µs); larger ones are recorded as this.
const MAX_LATENCY_US: u64 = 3_600_000_000;
/// Flags of `idemlog-server` this tool passes; checked in `--help` of every binary.
const SERVER_FLAGS: [&str; 6] = [
    "--listen",
    "--data-dir",
    "--durability",
    "--gateway-latency",
    "--api-key",
    "--idempotency",
];
const DURABILITIES: [&str; 2] = ["sync", "none"];
/// The mode name of a server on `--database-url` (PostgreSQL: every answer waits for its commit).
const POSTGRES: &str = "postgres";

/// One binary in one durability mode, with its running server.
struct Config {
    /// `new` or `baseline`.
    binary: &'static str,
    durability: &'static str,
    server: Server,
}

impl Config {
    fn name(&self) -> String {
        format!("{}, {}", self.binary, self.durability)
    }
}

/// Changes of the fsync metrics over recorded windows, summed; `None` once a window lacked them.
#[derive(Clone, Copy)]
struct SyncTotals {
    requests: u64,
    elapsed: Duration,
    syncs: Option<f64>,
    batch_sum: Option<f64>,
    batch_count: Option<f64>,
}

impl SyncTotals {
    fn new() -> SyncTotals {
        SyncTotals {
            requests: 0,
            elapsed: Duration::ZERO,
            syncs: Some(0.0),
            batch_sum: Some(0.0),
            batch_count: Some(0.0),
        }
    }

    fn add(&mut self, requests: u64, elapsed: Duration, metrics: Option<&(String, String)>) {
        self.requests += requests;
        self.elapsed += elapsed;
        let delta = |name: &str| {
            let (before, after) = metrics?;
            Some(metric_value(after, name)? - metric_value(before, name)?)
        };
        let sum = |total: Option<f64>, d: Option<f64>| Some(total? + d?);
        self.syncs = sum(self.syncs, delta(SYNCS));
        self.batch_sum = sum(self.batch_sum, delta(BATCH_SUM));
        self.batch_count = sum(self.batch_count, delta(BATCH_COUNT));
    }

    fn row(&self, name: &str, kind: &str) -> String {
        let na = || "n/a".to_owned();
        let per_request = self
            .syncs
            .map_or_else(na, |s| format!("{:.3}", s / self.requests.max(1) as f64));
        let per_sync = match (self.batch_sum, self.batch_count) {
            (Some(sum), Some(count)) if count > 0.0 => format!("{:.1}", sum / count),
            (Some(_), Some(_)) => "– (no fdatasync)".to_owned(),
            _ => na(),
        };
        let per_second = self
            .syncs
            .map_or_else(na, |s| format!("{:.0}", s / self.elapsed.as_secs_f64()));
        let syncs = self.syncs.map_or_else(na, |s| format!("{s:.0}"));
        format!(
            "| {name} | {kind} | {} | {syncs} | {per_request} | {per_sync} | {per_second} |",
            self.requests
        )
    }
}

/// Figures of one configuration's closed-loop runs, one entry per round.
struct ClosedRuns {
    rates: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    cpu_us: Vec<f64>,
    errors: u64,
    sync: SyncTotals,
}

/// One open-loop run.
struct OpenSpec<'a> {
    server: &'a Server,
    rate: f64,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    first_key: u64,
}

struct OpenOutcome {
    /// Requests due in the window and answered 201.
    requests: u64,
    /// Requests due in the window that failed.
    errors: u64,
    /// Requests due in the window never sent: the drain limit ran out first.
    unsent: u64,
    first_error: Option<String>,
    /// From the first due time of the window to the last answer (at least the window).
    elapsed: Duration,
    server_cpu: Duration,
    metrics: Option<(String, String)>,
    /// Latency from the due time to the answer, µs.
    latency: Histogram<u64>,
    /// Send time less due time, µs: the timer's lateness plus waiting for a busy connection.
    lag: Histogram<u64>,
    next_key: u64,
}

struct OpenShared {
    next_key: AtomicU64,
    latency: Mutex<Histogram<u64>>,
    lag: Mutex<Histogram<u64>>,
}

#[derive(Default)]
struct OpenConn {
    requests: u64,
    errors: u64,
    sent_in_window: u64,
    first_error: Option<String>,
    last_answer: Option<Instant>,
}

/// The open-loop schedule: request `k` is due at `start + k / rate`.
#[derive(Clone, Copy)]
struct Schedule {
    start: Instant,
    rate: f64,
    record_from: Instant,
    until: Instant,
    /// Nothing is sent after this; what is still due is counted as unsent.
    hard_stop: Instant,
}

impl Schedule {
    fn due(&self, k: u64) -> Instant {
        self.start + Duration::from_secs_f64(k as f64 / self.rate)
    }

    /// Requests due in `[record_from, until)`.
    fn due_in_window(&self) -> u64 {
        let first = |t: Instant| (t.duration_since(self.start).as_secs_f64() * self.rate).ceil();
        (first(self.until) - first(self.record_from)).max(0.0) as u64
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_LATENCY_US)
}

async fn open_connection(
    addr: SocketAddr,
    index: u64,
    connections: u64,
    schedule: Schedule,
    shared: Arc<OpenShared>,
) -> OpenConn {
    let mut result = OpenConn::default();
    let mut stream: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut k = index;
    loop {
        let due = schedule.due(k);
        k += connections;
        if due >= schedule.until || Instant::now() >= schedule.hard_stop {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let recorded = due >= schedule.record_from;
        let key = item(shared.next_key.fetch_add(1, Ordering::Relaxed));
        let req = request(key.key_str());
        let left = schedule.hard_stop.saturating_duration_since(Instant::now());
        let sent = Instant::now();
        let attempt = tokio::time::timeout(left, async {
            if stream.is_none() {
                let s = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let _ = s.set_nodelay(true);
                buf.clear();
                stream = Some(s);
            }
            let s = stream.as_mut().expect("connected above");
            s.write_all(&req).await.map_err(|e| format!("i/o: {e}"))?;
            read_response(s, &mut buf)
                .await
                .map_err(|e| format!("i/o: {e}"))
        })
        .await;
        let answered = Instant::now();
        if recorded {
            result.sent_in_window += 1;
        }
        let failure = match attempt {
            Ok(Ok(response)) => {
                if response.close {
                    stream = None;
                }
                if response.status == 201 {
                    None
                } else {
                    Some(response.describe(key.key_str()))
                }
            }
            Ok(Err(e)) => {
                stream = None;
                Some(e)
            }
            Err(_) => {
                stream = None;
                Some("no answer before the drain limit".to_owned())
            }
        };
        match failure {
            None if recorded => {
                result.requests += 1;
                result.last_answer = Some(answered);
                let _ = shared
                    .latency
                    .lock()
                    .expect("histogram lock")
                    .record(micros(answered - due));
                let _ = shared
                    .lag
                    .lock()
                    .expect("histogram lock")
                    .record(micros(sent.saturating_duration_since(due)));
            }
            None => {}
            Some(msg) => {
                if recorded {
                    result.errors += 1;
                    result.last_answer = Some(answered);
                }
                result.first_error.get_or_insert(msg);
                if stream.is_none() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    result
}

fn run_open(rt: &tokio::runtime::Runtime, spec: &OpenSpec) -> OpenOutcome {
    let addr = spec.server.addr;
    let start = Instant::now();
    let record_from = start + spec.warmup;
    let until = record_from + spec.duration;
    let schedule = Schedule {
        start,
        rate: spec.rate,
        record_from,
        until,
        hard_stop: until + spec.duration.max(Duration::from_secs(5)),
    };
    let shared = Arc::new(OpenShared {
        next_key: AtomicU64::new(spec.first_key),
        latency: Mutex::new(histogram()),
        lag: Mutex::new(histogram()),
    });
    let connections = spec.connections as u64;
    let (results, server_cpu, metrics) = rt.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|i| {
                tokio::spawn(open_connection(
                    addr,
                    i,
                    connections,
                    schedule,
                    Arc::clone(&shared),
                ))
            })
            .collect();
        tokio::time::sleep_until(record_from.into()).await;
        let cpu_before = spec.server.cpu_time();
        let before = scrape(addr).await;
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(task.await.expect("a connection task panicked"));
        }
        let cpu = spec.server.cpu_time().saturating_sub(cpu_before);
        let after = match before {
            Some(_) => scrape(addr).await,
            None => None,
        };
        (results, cpu, before.zip(after))
    });
    let mut requests = 0;
    let mut errors = 0;
    let mut sent = 0;
    let mut first_error = None;
    let mut last = until;
    for r in results {
        requests += r.requests;
        errors += r.errors;
        sent += r.sent_in_window;
        if first_error.is_none() {
            first_error = r.first_error;
        }
        if let Some(t) = r.last_answer {
            last = last.max(t);
        }
    }
    let shared = Arc::into_inner(shared).expect("every connection task has ended");
    OpenOutcome {
        requests,
        errors,
        unsent: schedule.due_in_window().saturating_sub(sent),
        first_error,
        elapsed: last.duration_since(record_from),
        server_cpu,
        metrics,
        latency: shared.latency.into_inner().expect("histogram lock"),
        lag: shared.lag.into_inner().expect("histogram lock"),
        next_key: shared.next_key.load(Ordering::Relaxed),
    }
}

/// `Dirty:` of `/proc/meminfo`, bytes.
fn dirty_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("Dirty:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// With `enabled`, writes back every dirty page of the machine (`sync`) before a run, so that the
/// pages a `none` server left dirty are not written back during the next run, where they would
/// slow the `sync` servers' fdatasyncs. Returns a note for the per-run table.
fn flush_page_cache(enabled: bool) -> String {
    if !enabled {
        return "–".to_owned();
    }
    let dirty = dirty_bytes();
    let started = Instant::now();
    let ok = Command::new("sync").status().is_ok_and(|s| s.success());
    let took = started.elapsed();
    match (ok, dirty) {
        (true, Some(d)) => format!("{:.0} MiB, {took:.1?}", d as f64 / (1 << 20) as f64),
        (true, None) => format!("{took:.1?}"),
        (false, _) => "sync failed".to_owned(),
    }
}

/// Milliseconds with two decimals, from microseconds.
fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1e3)
}

/// Checks that `bin` exists and takes every flag this tool passes; returns its `--version` line.
fn check_server(bin: &Path, what: &str) -> String {
    if !bin.exists() {
        eprintln!(
            "{what} {} not found: build it with `cargo build --release -p idemlog-server`",
            bin.display()
        );
        std::process::exit(2);
    }
    let help = Command::new(bin)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {} --help: {e}", bin.display()));
    let help = String::from_utf8_lossy(&help.stdout);
    let missing: Vec<&str> = SERVER_FLAGS
        .into_iter()
        .filter(|f| !help.contains(f))
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "{what} {} lacks {} in its --help: too old for this tool",
            bin.display(),
            missing.join(", ")
        );
        std::process::exit(2);
    }
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// `a, b, c; median m` of the per-round ratios `num[r] / den[r]`.
fn ratios(num: &[f64], den: &[f64]) -> String {
    let mut all: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
    let listed = all
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{listed}; median {:.3}", median(&mut all))
}

fn main() {
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let load_at_start = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned());
    let mut flags = Flags::parse(
        "HTTP load generator for durability: POST /payments with new keys, --durability sync vs none, \
         closed loop, fdatasyncs per request, and an open loop at a fixed rate.",
    );
    let default_bin = default_server_bin();
    let bin = PathBuf::from(flags.string("server", &default_bin, "the idemlog-server binary"));
    let baseline = flags.string(
        "baseline",
        "",
        "a previous idemlog-server binary to run side by side (none if empty)",
    );
    let connections: usize = flags.num("connections", "64", "closed-loop keep-alive connections");
    let warmup = flags.duration("warmup", "2s", "unrecorded time before each run");
    let duration = flags.duration("duration", "10s", "recorded time of each closed-loop run");
    let rounds: usize = flags.num(
        "rounds",
        "3",
        "closed-loop rounds (every configuration once)",
    );
    let fraction: f64 = flags.num(
        "open-loop-fraction",
        "0.5",
        "open-loop rate as a fraction of the configuration's closed-loop median req/s (0: no open loop)",
    );
    let fixed_rate: f64 = flags.num(
        "rate",
        "0",
        "open-loop rate in req/s for every configuration, instead of the fraction (0: use it)",
    );
    let open_connections: usize = flags.num(
        "open-loop-connections",
        "256",
        "open-loop keep-alive connections",
    );
    let open_duration = flags.duration(
        "open-loop-duration",
        "10s",
        "recorded time of each open-loop run",
    );
    let rust_log = flags.string("rust-log", "warn", "RUST_LOG of every server");
    let database_url = flags.string(
        "database-url",
        "",
        "run each binary once on this PostgreSQL database (mode `postgres`) instead of the embedded \
         store in sync and none (empty: embedded)",
    );
    let flush = flags.string(
        "sync-before-runs",
        "on",
        "on: run `sync` before every run, so one run's dirty pages are not written back in the next",
    );
    flags.finish();
    let flush = match flush.as_str() {
        "on" => true,
        "off" => false,
        other => {
            eprintln!("--sync-before-runs {other:?}: use on or off");
            std::process::exit(2);
        }
    };
    if connections == 0 || open_connections == 0 || rounds == 0 {
        eprintln!("--connections, --open-loop-connections and --rounds must be at least 1");
        std::process::exit(2);
    }

    let mut binaries: Vec<(&'static str, PathBuf)> = vec![("new", bin)];
    if !baseline.is_empty() {
        binaries.push(("baseline", PathBuf::from(baseline)));
    }
    println!("command: `{command_line}`");
    println!("load average at start: {load_at_start}");
    for (label, path) in &binaries {
        let version = check_server(path, label);
        println!("{label}: {} ({version})", path.display());
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    let modes: &[&'static str] = if database_url.is_empty() {
        &DURABILITIES
    } else {
        &[POSTGRES]
    };
    let mut configs = Vec::new();
    for (label, path) in &binaries {
        for &durability in modes {
            let options = ServerOptions {
                durability: if durability == POSTGRES {
                    "sync"
                } else {
                    durability
                },
                layer: true,
                rust_log: &rust_log,
                database_url: (!database_url.is_empty()).then_some(database_url.as_str()),
            };
            let server = Server::start(path, &format!("durable-{label}-{durability}"), &options);
            configs.push(Config {
                binary: label,
                durability,
                server,
            });
        }
    }
    if database_url.is_empty() {
        println!(
            "servers: --durability sync and none per binary, --gateway-latency 0ms, layer on, \
             RUST_LOG={rust_log}, fresh data directories, no DATABASE_URL or IDEMLOG_* in their environment"
        );
    } else {
        println!(
            "servers: one per binary on --database-url (PostgreSQL; server CPU excludes the \
             database's), --gateway-latency 0ms, layer on, RUST_LOG={rust_log}, no DATABASE_URL or \
             IDEMLOG_* in their environment"
        );
    }
    println!(
        "closed loop: {connections} keep-alive connections, one client thread, new key per request, \
         {warmup:?} warm-up + {duration:?} per run, {rounds} rounds, order rotated every round"
    );
    println!(
        "before every run: {}\n",
        if flush {
            "`sync` (the dirty page cache written back: its size before, and how long it took)"
        } else {
            "nothing (--sync-before-runs off)"
        }
    );

    // 1 and 2: closed loop, with the fsync metrics of every window.
    println!("## Closed loop, per run\n");
    println!(
        "| configuration | round | req/s | p50 | p99 | requests | errors | server CPU/request | server cores busy | fdatasyncs/request | synced before |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut closed: Vec<ClosedRuns> = configs
        .iter()
        .map(|_| ClosedRuns {
            rates: Vec::new(),
            p50_ms: Vec::new(),
            p99_ms: Vec::new(),
            cpu_us: Vec::new(),
            errors: 0,
            sync: SyncTotals::new(),
        })
        .collect();
    let mut next_key = 0;
    for round in 0..rounds {
        for step in 0..configs.len() {
            let i = (step + round) % configs.len();
            let config = &configs[i];
            let flushed = flush_page_cache(flush);
            let (outcome, after): (Outcome, u64) = run(
                &rt,
                &RunSpec {
                    server: &config.server,
                    keys: Keys::New,
                    first_key: next_key,
                    connections,
                    warmup,
                    duration,
                    limit: MAX_REQUESTS_PER_RUN,
                    scrape_metrics: true,
                },
            );
            next_key = after;
            let mut window = SyncTotals::new();
            window.add(outcome.requests, outcome.elapsed, outcome.metrics.as_ref());
            let per_request = window.syncs.map_or_else(
                || "n/a".to_owned(),
                |s| format!("{:.3}", s / outcome.requests.max(1) as f64),
            );
            println!(
                "| {} | {} | {:.0} | {:.2?} | {:.2?} | {} | {} | {:.0} µs | {:.2} | {per_request} | {flushed} |",
                config.name(),
                round + 1,
                outcome.rate(),
                outcome.percentile(0.50),
                outcome.percentile(0.99),
                outcome.requests,
                outcome.errors,
                outcome.cpu_per_request_us(),
                outcome.server_cores(),
            );
            if let Some(e) = &outcome.first_error {
                eprintln!("  first error of {}: {e}", config.name());
            }
            let runs = &mut closed[i];
            runs.rates.push(outcome.rate());
            runs.p50_ms
                .push(outcome.percentile(0.50).as_secs_f64() * 1e3);
            runs.p99_ms
                .push(outcome.percentile(0.99).as_secs_f64() * 1e3);
            runs.cpu_us.push(outcome.cpu_per_request_us());
            runs.errors += outcome.errors;
            runs.sync
                .add(outcome.requests, outcome.elapsed, outcome.metrics.as_ref());
        }
    }

    println!("\n## Closed loop, medians over {rounds} rounds\n");
    println!("| configuration | req/s | p50 (ms) | p99 (ms) | server CPU/request (µs) | errors |");
    println!("|---|---|---|---|---|---|");
    let mut medians = Vec::with_capacity(configs.len());
    for (config, runs) in configs.iter().zip(&closed) {
        let rate = median(&mut runs.rates.clone());
        medians.push(rate);
        println!(
            "| {} | {rate:.0} | {:.2} | {:.2} | {:.0} | {} |",
            config.name(),
            median(&mut runs.p50_ms.clone()),
            median(&mut runs.p99_ms.clone()),
            median(&mut runs.cpu_us.clone()),
            runs.errors
        );
    }
    println!();
    // Configurations are (binary, sync), (binary, none) per binary, in that order (embedded only).
    for (b, (label, _)) in binaries.iter().enumerate().filter(|_| modes.len() == 2) {
        let (sync, none) = (&closed[2 * b], &closed[2 * b + 1]);
        println!(
            "- {label}: sync ÷ none req/s per round: {}",
            ratios(&sync.rates, &none.rates)
        );
    }
    if binaries.len() == 2 {
        let per_binary = modes.len();
        for (d, mode) in modes.iter().enumerate() {
            println!(
                "- {mode}: new ÷ baseline req/s per round: {}",
                ratios(&closed[d].rates, &closed[per_binary + d].rates)
            );
        }
    }

    // 3: open loop at a fixed rate.
    let mut open_rows = Vec::new();
    let mut open_sync = Vec::new();
    let mut open_errors = 0;
    if fraction > 0.0 || fixed_rate > 0.0 {
        for (i, config) in configs.iter().enumerate() {
            let rate = if fixed_rate > 0.0 {
                fixed_rate
            } else {
                fraction * medians[i]
            };
            if rate < 1.0 {
                eprintln!(
                    "  open loop of {} skipped: target rate {rate:.1} req/s",
                    config.name()
                );
                continue;
            }
            let flushed = flush_page_cache(flush);
            let outcome = run_open(
                &rt,
                &OpenSpec {
                    server: &config.server,
                    rate,
                    connections: open_connections,
                    warmup,
                    duration: open_duration,
                    first_key: next_key,
                },
            );
            next_key = outcome.next_key;
            open_errors += outcome.errors + outcome.unsent;
            if let Some(e) = &outcome.first_error {
                eprintln!("  first error of {} (open loop): {e}", config.name());
            }
            let h = &outcome.latency;
            let achieved = outcome.requests as f64 / outcome.elapsed.as_secs_f64();
            let cpu = if outcome.requests == 0 {
                "–".to_owned()
            } else {
                let us = outcome.server_cpu.as_secs_f64() * 1e6 / outcome.requests as f64;
                format!("{us:.0}")
            };
            let server_slow = ["0.0025", "0.005", "0.01", "0.025"]
                .iter()
                .map(|le| {
                    outcome
                        .metrics
                        .as_ref()
                        .and_then(|(before, after)| server_share_above(before, after, le))
                        .map_or_else(
                            || "n/a".to_owned(),
                            |share| format!("{:.2}%", share * 100.0),
                        )
                })
                .collect::<Vec<_>>()
                .join(" / ");
            let (slow_syncs, compactions) = outcome.metrics.as_ref().map_or_else(
                || ("n/a".to_owned(), "n/a".to_owned()),
                |(before, after)| {
                    let (slow, all) = count_above(before, after, FDATASYNC, &[], "0.005");
                    let compactions = metric_value(after, COMPACTIONS).unwrap_or(0.0)
                        - metric_value(before, COMPACTIONS).unwrap_or(0.0);
                    (
                        format!("{slow:.0} of {all:.0}"),
                        format!("{compactions:.0}"),
                    )
                },
            );
            open_rows.push(format!(
                "| {} | {rate:.0} | {achieved:.0} ({:.1}%) | {} | {} | {} | {} | {} / {} | {server_slow} | {slow_syncs} | {compactions} | {} | {} | {} | {cpu} | {flushed} |",
                config.name(),
                achieved / rate * 100.0,
                ms(h.value_at_quantile(0.50)),
                ms(h.value_at_quantile(0.99)),
                ms(h.value_at_quantile(0.999)),
                ms(h.max()),
                ms(outcome.lag.value_at_quantile(0.50)),
                ms(outcome.lag.value_at_quantile(0.99)),
                outcome.requests,
                outcome.errors,
                outcome.unsent,
            ));
            let mut totals = SyncTotals::new();
            totals.add(outcome.requests, outcome.elapsed, outcome.metrics.as_ref());
            open_sync.push(totals.row(&config.name(), "open"));
        }
    }
    let names: Vec<String> = configs.iter().map(Config::name).collect();
    for config in configs {
        config.server.stop();
    }

    println!("\n## fdatasync per request\n");
    println!(
        "Δ`{SYNCS}` and Δ`idemlog_commit_batch_operations` (_sum ÷ _count) over the recorded windows \
         (closed loop: all rounds summed), requests = those answered 201 in the windows.\n"
    );
    println!(
        "| configuration | loop | requests | fdatasyncs | fdatasyncs/request | operations/fdatasync | fdatasyncs/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, runs) in closed.iter().enumerate() {
        println!("{}", runs.sync.row(&names[i], "closed"));
    }
    for row in &open_sync {
        println!("{row}");
    }

    if !open_rows.is_empty() {
        let target = if fixed_rate > 0.0 {
            format!("{fixed_rate} req/s")
        } else {
            format!("{fraction} × the closed-loop median req/s")
        };
        println!(
            "\n## Open loop: fixed arrival rate ({target}), {open_connections} connections, \
             {warmup:?} warm-up + {open_duration:?}\n"
        );
        println!(
            "Latency counts from each request's scheduled time (no coordinated omission). Send delay \
             is the time from scheduled to sent: the client's timer (1 ms resolution) plus waiting \
             for its connection to finish an earlier request. Server > 2.5 / 5 / 10 / 25 ms: the share of \
             `POST /payments` the server itself took longer than that over, from router arrival to \
             response head (its `{HTTP_DURATION}` histogram over the window); fdatasyncs > 5 ms \
             and compactions: `{FDATASYNC}` and `{COMPACTIONS}` over the window. Unsent: due in the \
             window but not sent before the drain limit.\n"
        );
        println!(
            "| configuration | target req/s | achieved req/s | p50 (ms) | p99 (ms) | p99.9 (ms) | max (ms) | send delay p50 / p99 (ms) | server > 2.5 / 5 / 10 / 25 ms | fdatasyncs > 5 ms | compactions | requests | errors | unsent | server CPU/request (µs) | synced before |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for row in &open_rows {
            println!("{row}");
        }
    }

    let total_errors: u64 = closed.iter().map(|r| r.errors).sum::<u64>() + open_errors;
    if total_errors > 0 {
        println!(
            "\n{total_errors} requests failed or were never sent: the figures above exclude them"
        );
        std::process::exit(1);
    }
}

/// The server's request-duration histogram.
const HTTP_DURATION: &str = "http_server_request_duration_seconds";
/// The embedded store's fdatasync-duration histogram.
const FDATASYNC: &str = "idemlog_fdatasync_duration_seconds";
/// The embedded store's compaction counter.
const COMPACTIONS: &str = "idemlog_compactions_total";

/// The sum of histogram `name`'s `le` = `bound` buckets over the series whose labels contain every
/// one of `labels` (e.g. `http_route="/payments"`); 0 without any.
fn bucket_count(text: &str, name: &str, labels: &[&str], bound: &str) -> f64 {
    let bucket = format!("{name}_bucket{{");
    let le = format!("le=\"{bound}\"}}");
    text.lines()
        .filter(|l| l.starts_with(&bucket) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.split_once(&le).map(|(_, v)| v))
        .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .sum()
}

/// Between two scrapes, how many observations of histogram `name` (series with `labels`) fell
/// above the bucket bound `bound`, and how many there were in all.
fn count_above(before: &str, after: &str, name: &str, labels: &[&str], bound: &str) -> (f64, f64) {
    let delta =
        |b: &str| bucket_count(after, name, labels, b) - bucket_count(before, name, labels, b);
    let total = delta("+Inf");
    (total - delta(bound), total)
}

/// Between two scrapes, the share of `POST /payments` requests the server's own histogram counts
/// above the bucket bound `le` (as written in the exposition, e.g. `0.005`); `None` without any.
fn server_share_above(before: &str, after: &str, le: &str) -> Option<f64> {
    let labels = ["http_route=\"/payments\"", "http_request_method=\"POST\""];
    let (above, total) = count_above(before, after, HTTP_DURATION, &labels, le);
    (total > 0.0).then(|| above / total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(syncs: u64, sum: u64, count: u64) -> String {
        format!(
            "idemlog_syncs_total {syncs}.0\nidemlog_commit_batch_operations_sum {sum}.0\n\
             idemlog_commit_batch_operations_count {count}\n"
        )
    }

    #[test]
    fn server_share_above_reads_the_payments_buckets_between_scrapes() {
        let scrape = |fast: u64, all: u64, other: u64| {
            format!(
                "{HTTP_DURATION}_bucket{{http_route=\"/payments\",http_request_method=\"POST\",http_response_status_code=\"201\",le=\"0.005\"}} {fast}\n\
                 {HTTP_DURATION}_bucket{{http_route=\"/payments\",http_request_method=\"POST\",http_response_status_code=\"201\",le=\"+Inf\"}} {all}\n\
                 {HTTP_DURATION}_bucket{{http_route=\"/metrics\",http_request_method=\"GET\",http_response_status_code=\"200\",le=\"+Inf\"}} {other}\n"
            )
        };
        let share = server_share_above(&scrape(10, 10, 1), &scrape(1000, 1010, 5), "0.005");
        assert_eq!(share, Some(0.01));
        assert_eq!(
            server_share_above(&scrape(1, 1, 0), &scrape(1, 1, 9), "0.005"),
            None
        );
    }

    #[test]
    fn sync_totals_sum_the_windows() {
        let mut totals = SyncTotals::new();
        let w1 = (exposition(10, 100, 10), exposition(30, 700, 30));
        let w2 = (exposition(50, 900, 40), exposition(70, 1300, 50));
        totals.add(100, Duration::from_secs(1), Some(&w1));
        totals.add(100, Duration::from_secs(1), Some(&w2));
        assert_eq!(
            totals.row("new, sync", "closed"),
            "| new, sync | closed | 200 | 40 | 0.200 | 33.3 | 20 |"
        );
    }

    #[test]
    fn missing_metrics_read_n_a() {
        let full = (exposition(1, 1, 1), exposition(2, 3, 2));
        let mut totals = SyncTotals::new();
        totals.add(100, Duration::from_secs(1), Some(&full));
        totals.add(100, Duration::from_secs(1), None);
        assert_eq!(
            totals.row("baseline, sync", "closed"),
            "| baseline, sync | closed | 200 | n/a | n/a | n/a | n/a |"
        );
        let old = (
            "idemlog_records 3\n".to_owned(),
            "idemlog_records 5\n".to_owned(),
        );
        let mut totals = SyncTotals::new();
        totals.add(100, Duration::from_secs(1), Some(&old));
        assert_eq!(
            totals.row("baseline, none", "open"),
            "| baseline, none | open | 100 | n/a | n/a | n/a | n/a |"
        );
    }
}
