//! HTTP load generator for `POST /payments`: raw HTTP/1.1 over keep-alive TCP connections on a
//! current-thread tokio runtime, against the real `idemlog-server` binary on 127.0.0.1.
//!
//! It starts two servers from the same binary and flags (`--durability none --gateway-latency 0ms`),
//! one with the idempotency layer and one with `--idempotency off`, and runs in alternation, for
//! `--rounds` rounds:
//!
//! - `new keys, layer on`: every request carries a new `Idempotency-Key`;
//! - `new keys, layer off`: the same requests against the server without the layer;
//! - `replays, layer on`: requests cycle through `--replay-keys` keys completed beforehand, so every
//!   answer is a stored response (checked through the `Idempotent-Replayed` header).
//!
//! Each run uses `--connections` connections for `--warmup` (not recorded) plus `--duration`, and
//! stops by itself; it reports requests per second and the p50/p99 latency. The layer's cost is
//! `1 - (req/s on) / (req/s off)` from the medians over the rounds. On two shared cores the rate of
//! one server swings by a third from one run to the next, so the on and off runs swap order every
//! round (on first in odd rounds) and the median of each round's own on ÷ off ratio is reported
//! too: it pairs runs that were close in time. Only 127.0.0.1 is ever contacted.
//!
//! `cargo build --release -p idemlog-server -p idemlog-benches`, then
//! `$CARGO_TARGET_DIR/release/loadgen --connections 64 --duration 10s --rounds 3`

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idemlog_benches::{Flags, ScratchDir, item};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const API_KEY: &str = "bench-key";
const ACCOUNT: &str = "acct_bench";
const BODY: &str = r#"{"amount": 100.00, "currency": "BRL"}"#;
/// Upper bound on the requests of one run, whatever the duration.
const MAX_REQUESTS_PER_RUN: u64 = 50_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// A new key per request, from a process-wide counter.
    New,
    /// Keys `0..n` of the replay set, round-robin.
    Replay(u64),
}

struct Outcome {
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    replays: u64,
    elapsed: Duration,
    /// CPU time the server used in the recorded window.
    server_cpu: Duration,
    latencies_us: Vec<u32>,
}

impl Outcome {
    /// Server CPU per request, microseconds.
    fn cpu_per_request_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }

    /// Cores the server kept busy on average.
    fn server_cores(&self) -> f64 {
        self.server_cpu.as_secs_f64() / self.elapsed.as_secs_f64()
    }

    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        if self.latencies_us.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        Duration::from_micros(u64::from(self.latencies_us[rank]))
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    _dir: ScratchDir,
}

impl Server {
    /// CPU time (user + system) the server process has used so far, from `/proc/PID/stat`.
    fn cpu_time(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let hz = clock_ticks_per_second();
        Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz)
    }

    fn start(bin: &Path, label: &str, layer: bool, rust_log: &str) -> Server {
        let dir = ScratchDir::new(&format!("http-{label}"));
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
            probe.local_addr().expect("probe address").port()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.path().join("server.log");
        let log_file = std::fs::File::create(&log).expect("create the server log");
        let child = Command::new(bin)
            .args(["--listen", &addr.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--durability", "none", "--gateway-latency", "0ms"])
            .args(["--api-key", &format!("{API_KEY}={ACCOUNT}")])
            .args(["--idempotency", if layer { "on" } else { "off" }])
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let server = Server {
            child,
            addr,
            log,
            _dir: dir,
        };
        server.wait_healthy();
        server
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(self.addr) {
                use std::io::{Read, Write};
                let _ = s.write_all(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                );
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        panic!(
            "server on {} did not become healthy; its log:\n{log}",
            self.addr
        );
    }

    fn stop(mut self) {
        let pid = self.child.id().to_string();
        let termed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while termed && Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `getconf CLK_TCK`, almost always 100 on Linux.
fn clock_ticks_per_second() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

fn request(key: &str) -> Vec<u8> {
    format!(
        "POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}

/// One parsed response: status, whether it was a replay, and whether the server closes.
struct Response {
    status: u16,
    replayed: bool,
    close: bool,
}

/// Reads one response from `stream`, using `buf` for leftovers between calls.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Response> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("connection closed before a response"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("non-UTF-8 head"))?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let (mut length, mut chunked, mut replayed, mut close) = (0usize, false, false, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| bad("bad content-length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("idempotent-replayed") {
            replayed = value == "true";
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    if chunked {
        return Err(bad("chunked responses are not expected from this server"));
    }
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("connection closed inside a body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..head_end + length);
    Ok(Response {
        status,
        replayed,
        close,
    })
}

struct Shared {
    next_key: AtomicU64,
    issued: AtomicU64,
    limit: u64,
}

struct ConnResult {
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    replays: u64,
    latencies_us: Vec<u32>,
}

async fn connection(
    addr: SocketAddr,
    keys: Keys,
    shared: Arc<Shared>,
    record_from: Instant,
    until: Instant,
) -> ConnResult {
    let mut result = ConnResult {
        requests: 0,
        errors: 0,
        first_error: None,
        replays: 0,
        latencies_us: Vec::new(),
    };
    let fail = |result: &mut ConnResult, recorded: bool, msg: String| {
        if recorded {
            result.errors += 1;
        }
        result.first_error.get_or_insert(msg);
    };
    let mut stream: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(16 * 1024);
    while Instant::now() < until {
        if shared.issued.fetch_add(1, Ordering::Relaxed) >= shared.limit {
            break;
        }
        let n = shared.next_key.fetch_add(1, Ordering::Relaxed);
        let key = match keys {
            Keys::New => item(n),
            Keys::Replay(count) => item(n % count),
        };
        let req = request(key.key_str());
        let s = match stream.as_mut() {
            Some(s) => s,
            None => match TcpStream::connect(addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    buf.clear();
                    stream.insert(s)
                }
                Err(e) => {
                    fail(&mut result, true, format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let sent = Instant::now();
        let answer = match s.write_all(&req).await {
            Ok(()) => read_response(s, &mut buf).await,
            Err(e) => Err(e),
        };
        let took = sent.elapsed();
        let recorded = sent >= record_from;
        match answer {
            Ok(response) => {
                if response.close {
                    stream = None;
                }
                if response.status != 201 {
                    fail(
                        &mut result,
                        recorded,
                        format!("status {} for key {}", response.status, key.key_str()),
                    );
                    continue;
                }
                if recorded {
                    result.requests += 1;
                    result.replays += u64::from(response.replayed);
                    result
                        .latencies_us
                        .push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
                }
            }
            Err(e) => {
                stream = None;
                fail(&mut result, recorded, format!("i/o: {e}"));
            }
        }
    }
    result
}

/// One run: where, which keys, how many connections, for how long.
struct RunSpec<'a> {
    server: &'a Server,
    keys: Keys,
    first_key: u64,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    limit: u64,
}

fn run(rt: &tokio::runtime::Runtime, spec: &RunSpec) -> (Outcome, u64) {
    let RunSpec {
        server,
        keys,
        first_key,
        connections,
        warmup,
        duration,
        limit,
    } = *spec;
    let addr = server.addr;
    let shared = Arc::new(Shared {
        next_key: AtomicU64::new(first_key),
        issued: AtomicU64::new(0),
        limit,
    });
    let start = Instant::now();
    let record_from = start + warmup;
    let until = record_from + duration;
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|_| {
                tokio::spawn(connection(
                    addr,
                    keys,
                    Arc::clone(&shared),
                    record_from,
                    until,
                ))
            })
            .collect();
        tokio::time::sleep_until(record_from.into()).await;
        let cpu_before = server.cpu_time();
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(task.await.expect("a connection task panicked"));
        }
        (results, server.cpu_time().saturating_sub(cpu_before))
    });
    let (results, server_cpu) = results;
    let elapsed = Instant::now().saturating_duration_since(record_from);
    let mut outcome = Outcome {
        requests: 0,
        errors: 0,
        first_error: None,
        replays: 0,
        elapsed,
        server_cpu,
        latencies_us: Vec::new(),
    };
    for r in results {
        outcome.requests += r.requests;
        outcome.errors += r.errors;
        outcome.replays += r.replays;
        if outcome.first_error.is_none() {
            outcome.first_error = r.first_error;
        }
        outcome.latencies_us.extend(r.latencies_us);
    }
    outcome.latencies_us.sort_unstable();
    (outcome, shared.next_key.load(Ordering::Relaxed))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn default_server_bin() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("idemlog-server")))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "idemlog-server".to_owned())
}

fn main() {
    let mut flags = Flags::parse(
        "HTTP load generator: POST /payments with new keys and replays, idempotency layer on vs off.",
    );
    let default_bin = default_server_bin();
    let bin = PathBuf::from(flags.string("server", &default_bin, "the idemlog-server binary"));
    let connections: usize = flags.num("connections", "64", "concurrent keep-alive connections");
    let duration = flags.duration("duration", "10s", "recorded time of each run");
    let warmup = flags.duration("warmup", "2s", "unrecorded time before each run");
    let rounds: usize = flags.num("rounds", "3", "rounds of (on, off, replay) runs");
    let replay_keys: u64 = flags.num(
        "replay-keys",
        "10000",
        "keys completed before the replay runs",
    );
    let rust_log = flags.string("rust-log", "warn", "RUST_LOG of both servers");
    flags.finish();
    if !bin.exists() {
        eprintln!(
            "{} not found: build it with `cargo build --release -p idemlog-server` or pass --server",
            bin.display()
        );
        std::process::exit(2);
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    let on = Server::start(&bin, "on", true, &rust_log);
    let off = Server::start(&bin, "off", false, &rust_log);
    println!(
        "servers: {} (layer on, {}), {} (layer off, {}); --durability none --gateway-latency 0ms, RUST_LOG={rust_log}",
        bin.display(),
        on.addr,
        bin.display(),
        off.addr
    );
    println!(
        "load: {connections} keep-alive connections, one client thread, {warmup:?} warm-up + {duration:?} per run, {rounds} rounds\n"
    );

    // Keys for the replay runs: 0..replay_keys, completed once through the layer.
    let (prefill, _) = run(
        &rt,
        &RunSpec {
            server: &on,
            keys: Keys::Replay(replay_keys),
            first_key: 0,
            connections: connections.min(replay_keys as usize).max(1),
            warmup: Duration::ZERO,
            duration: Duration::from_secs(60),
            limit: replay_keys,
        },
    );
    assert!(
        prefill.requests == replay_keys && prefill.errors == 0,
        "prefill completed only {} requests (errors {}: {:?})",
        prefill.requests,
        prefill.errors,
        prefill.first_error
    );
    let mut next_key = replay_keys;

    println!(
        "| run | round | req/s | p50 | p99 | requests | errors | replayed | server CPU/request | server cores busy |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rates: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut p50s: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut p99s: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut cpus: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let names = [
        "new keys, layer on",
        "new keys, layer off",
        "replays, layer on",
    ];
    let mut total_errors = 0;
    for round in 1..=rounds {
        // Odd rounds run on, off, replays; even rounds off, on, replays.
        let order: [usize; 3] = if round % 2 == 1 { [0, 1, 2] } else { [1, 0, 2] };
        for i in order {
            let name = names[i];
            let (server, keys) = match i {
                0 => (&on, Keys::New),
                1 => (&off, Keys::New),
                _ => (&on, Keys::Replay(replay_keys)),
            };
            let start_key = if keys == Keys::New { next_key } else { 0 };
            let (outcome, after) = run(
                &rt,
                &RunSpec {
                    server,
                    keys,
                    first_key: start_key,
                    connections,
                    warmup,
                    duration,
                    limit: MAX_REQUESTS_PER_RUN,
                },
            );
            if keys == Keys::New {
                next_key = after;
            }
            total_errors += outcome.errors;
            println!(
                "| {name} | {round} | {:.0} | {:.2?} | {:.2?} | {} | {} | {} | {:.0} µs | {:.2} |",
                outcome.rate(),
                outcome.percentile(0.50),
                outcome.percentile(0.99),
                outcome.requests,
                outcome.errors,
                outcome.replays,
                outcome.cpu_per_request_us(),
                outcome.server_cores()
            );
            if let Some(e) = &outcome.first_error {
                eprintln!("  first error of {name}: {e}");
            }
            if i == 2 && outcome.replays != outcome.requests {
                eprintln!(
                    "  warning: {} of {} replay requests were not marked as replays",
                    outcome.requests - outcome.replays,
                    outcome.requests
                );
            }
            rates[i].push(outcome.rate());
            p50s[i].push(outcome.percentile(0.50).as_secs_f64() * 1e3);
            p99s[i].push(outcome.percentile(0.99).as_secs_f64() * 1e3);
            cpus[i].push(outcome.cpu_per_request_us());
        }
    }
    on.stop();
    off.stop();

    println!("\nmedians over {rounds} rounds:\n");
    println!("| run | req/s | p50 (ms) | p99 (ms) | server CPU/request (µs) |");
    println!("|---|---|---|---|---|");
    // Each round's own on / off ratio, before the medians below sort the rates.
    let mut paired: Vec<f64> = rates[0]
        .iter()
        .zip(&rates[1])
        .map(|(on, off)| on / off)
        .collect();
    let mut medians = [0.0; 3];
    let mut cpu_medians = [0.0; 3];
    for (i, name) in names.iter().enumerate() {
        medians[i] = median(&mut rates[i]);
        cpu_medians[i] = median(&mut cpus[i]);
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.0} |",
            medians[i],
            median(&mut p50s[i]),
            median(&mut p99s[i]),
            cpu_medians[i]
        );
    }
    let cost = 1.0 - medians[0] / medians[1];
    println!(
        "\nlayer on / off (new keys): {:.3}; the layer costs {:.1}% of req/s (target ≤ 15%: {})",
        medians[0] / medians[1],
        cost * 100.0,
        if cost <= 0.15 { "met" } else { "MISSED" }
    );
    let per_round = paired
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    let paired_median = median(&mut paired);
    println!(
        "per-round on / off ratios: {per_round}; median {paired_median:.3}, i.e. the layer costs {:.1}%",
        (1.0 - paired_median) * 100.0
    );
    println!(
        "server CPU per request, layer on / off (new keys): {:.2} ({:+.0}%)",
        cpu_medians[0] / cpu_medians[1],
        (cpu_medians[0] / cpu_medians[1] - 1.0) * 100.0
    );
    println!(
        "replays / new keys (layer on): {:.2}",
        medians[2] / medians[0]
    );
    if total_errors > 0 {
        println!("\n{total_errors} requests failed: the figures above exclude them");
        std::process::exit(1);
    }
}
