//! Shared pieces of the HTTP load generators (`loadgen`, `durable_http`): starting and stopping a
//! real `idemlog-server` on 127.0.0.1, the `POST /payments` request, a minimal HTTP/1.1 response
//! reader, the closed-loop connection loop, the server's CPU time from `/proc`, and a `/metrics`
//! scrape. Only 127.0.0.1 is ever contacted.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{ScratchDir, item};

/// The API key every server is started with.
pub const API_KEY: &str = "bench-key";
/// The account [`API_KEY`] authenticates.
pub const ACCOUNT: &str = "acct_bench";
/// The JSON body of every `POST /payments`.
pub const BODY: &str = r#"{"amount": 100.00, "currency": "BRL"}"#;
/// Upper bound on the requests of one run, whatever the duration.
pub const MAX_REQUESTS_PER_RUN: u64 = 50_000_000;
/// Longest body excerpt kept for an error message.
const SNIPPET_LEN: usize = 200;

/// Which keys a run's requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// A new key per request, from a process-wide counter.
    New,
    /// Keys `0..n` of the replay set, round-robin.
    Replay(u64),
}

/// The figures of one closed-loop run's recorded window.
pub struct Outcome {
    /// Requests answered 201 in the window.
    pub requests: u64,
    /// Requests that failed (another status, or an I/O error) in the window.
    pub errors: u64,
    /// The first failure seen, warm-up included.
    pub first_error: Option<String>,
    /// Answers marked `Idempotent-Replayed: true`.
    pub replays: u64,
    /// Length of the recorded window.
    pub elapsed: Duration,
    /// CPU time the server used in the recorded window.
    pub server_cpu: Duration,
    /// Sorted latencies of the recorded requests, microseconds.
    pub latencies_us: Vec<u32>,
    /// The server's `/metrics` text at the start and at the end of the recorded window, when the
    /// run asked for it and the scrape succeeded.
    pub metrics: Option<(String, String)>,
}

impl Outcome {
    /// Server CPU per request, microseconds.
    pub fn cpu_per_request_us(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }

    /// Cores the server kept busy on average.
    pub fn server_cores(&self) -> f64 {
        self.server_cpu.as_secs_f64() / self.elapsed.as_secs_f64()
    }

    /// Requests per second in the window.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// The `p` quantile (0..=1) of the latencies.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.latencies_us.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        Duration::from_micros(u64::from(self.latencies_us[rank]))
    }
}

/// How a [`Server`] is started, beyond `--gateway-latency 0ms` and the API key, which are fixed.
pub struct ServerOptions<'a> {
    /// `--durability`: `sync`, `periodic` or `none`.
    pub durability: &'a str,
    /// `--idempotency on` (true) or `off`.
    pub layer: bool,
    /// `RUST_LOG` of the server.
    pub rust_log: &'a str,
    /// `--database-url` (the PostgreSQL store) instead of a scratch `--data-dir`; `durability`
    /// is then passed but means nothing to the server.
    pub database_url: Option<&'a str>,
}

/// A running `idemlog-server` on 127.0.0.1 with its own scratch data directory.
pub struct Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: ScratchDir,
}

impl Server {
    /// CPU time (user + system) the server process has used so far, from `/proc/PID/stat`.
    pub fn cpu_time(&self) -> Duration {
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

    /// Starts `bin` on a free port of 127.0.0.1 and waits until `/healthz` answers 200. The
    /// server's environment has no `DATABASE_URL` and no `IDEMLOG_*` variable, so every setting is
    /// the command line's (and the store is the embedded one).
    pub fn start(bin: &Path, label: &str, options: &ServerOptions) -> Server {
        let dir = ScratchDir::new(&format!("http-{label}"));
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
            probe.local_addr().expect("probe address").port()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.path().join("server.log");
        let log_file = std::fs::File::create(&log).expect("create the server log");
        let mut command = Command::new(bin);
        command.args(["--listen", &addr.to_string()]);
        match options.database_url {
            Some(url) => command.args(["--database-url", url]),
            None => command.arg("--data-dir").arg(dir.path().join("data")),
        };
        command
            .args([
                "--durability",
                options.durability,
                "--gateway-latency",
                "0ms",
            ])
            .args(["--api-key", &format!("{API_KEY}={ACCOUNT}")])
            // Every request of a run uses a new key of the one account, millions of them in a
            // long run: past the default quota of live keys per account (1 M) they would all be
            // 429s. A limit no run reaches keeps the quota's bookkeeping on the measured path.
            .args(["--max-live-keys-per-account", "1000000000"])
            .args(["--idempotency", if options.layer { "on" } else { "off" }]);
        for (name, _) in std::env::vars_os() {
            let leaks = name
                .to_str()
                .is_some_and(|n| n == "DATABASE_URL" || n.starts_with("IDEMLOG_"));
            if leaks {
                command.env_remove(&name);
            }
        }
        let child = command
            .env("RUST_LOG", options.rust_log)
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

    /// Stops the server with SIGTERM (then SIGKILL after 10 s) and removes its data directory.
    pub fn stop(mut self) {
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

/// The bytes of `POST /payments` with `key` as its `Idempotency-Key`.
pub fn request(key: &str) -> Vec<u8> {
    format!(
        "POST /payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}

/// One parsed response: status, whether it was a replay, and whether the server closes.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// `Connection: close`.
    pub close: bool,
    /// The start of the body, for a status outside 2xx only.
    pub snippet: Option<String>,
}

impl Response {
    /// `status N for key K` and, if there is one, the body's start: for error messages.
    pub fn describe(&self, key: &str) -> String {
        match &self.snippet {
            Some(s) if !s.is_empty() => format!("status {} for key {key}: {s}", self.status),
            _ => format!("status {} for key {key}", self.status),
        }
    }
}

/// Reads one response from `stream`, using `buf` for leftovers between calls.
pub async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Response> {
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
    let snippet = (!(200..300).contains(&status)).then(|| {
        let body = &buf[head_end..head_end + length.min(SNIPPET_LEN)];
        String::from_utf8_lossy(body).trim().to_owned()
    });
    buf.drain(..head_end + length);
    Ok(Response {
        status,
        replayed,
        close,
        snippet,
    })
}

/// `GET path` on a connection of its own (`Connection: close`): the status and the body.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("bad chunked body"))?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// Joins the chunks of a chunked body.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size_line, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
}

/// The value of an unlabelled sample `name` in a Prometheus text exposition (`name 12.0`).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
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
                    fail(&mut result, recorded, response.describe(key.key_str()));
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

/// One closed-loop run: where, which keys, how many connections, for how long.
pub struct RunSpec<'a> {
    /// The server to load.
    pub server: &'a Server,
    /// Which keys the requests carry.
    pub keys: Keys,
    /// The first key number (new keys count up from it).
    pub first_key: u64,
    /// Keep-alive connections, each with one request outstanding at a time.
    pub connections: usize,
    /// Unrecorded time before the window.
    pub warmup: Duration,
    /// The recorded window.
    pub duration: Duration,
    /// Most requests to send, warm-up included.
    pub limit: u64,
    /// Scrape `GET /metrics` at the start and the end of the window ([`Outcome::metrics`]).
    pub scrape_metrics: bool,
}

/// Runs `spec` on `rt`: the outcome, and the next unused key number.
pub fn run(rt: &tokio::runtime::Runtime, spec: &RunSpec) -> (Outcome, u64) {
    let RunSpec {
        server,
        keys,
        first_key,
        connections,
        warmup,
        duration,
        limit,
        scrape_metrics,
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
        let before = if scrape_metrics {
            scrape(addr).await
        } else {
            None
        };
        let mut results = Vec::with_capacity(tasks.len());
        for task in tasks {
            results.push(task.await.expect("a connection task panicked"));
        }
        let cpu = server.cpu_time().saturating_sub(cpu_before);
        let after = match before {
            Some(_) => scrape(addr).await,
            None => None,
        };
        (results, cpu, before.zip(after))
    });
    let (results, server_cpu, metrics) = results;
    let elapsed = Instant::now().saturating_duration_since(record_from);
    let mut outcome = Outcome {
        requests: 0,
        errors: 0,
        first_error: None,
        replays: 0,
        elapsed,
        server_cpu,
        latencies_us: Vec::new(),
        metrics,
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

/// `GET /metrics`, or `None` (with a warning) if it fails or answers another status than 200.
pub async fn scrape(addr: SocketAddr) -> Option<String> {
    match get(addr, "/metrics").await {
        Ok((200, body)) => Some(body),
        Ok((status, body)) => {
            let start: String = body.chars().take(SNIPPET_LEN).collect();
            eprintln!("  GET /metrics on {addr}: status {status}: {start}");
            None
        }
        Err(e) => {
            eprintln!("  GET /metrics on {addr}: {e}");
            None
        }
    }
}

/// The median (sorts `values`); 0 for none.
pub fn median(values: &mut [f64]) -> f64 {
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

/// `idemlog-server` next to the running binary (both are built into the same target directory).
pub fn default_server_bin() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("idemlog-server")))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "idemlog-server".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "# TYPE idemlog_syncs_total counter\n\
        idemlog_syncs_total 9.0\n\
        # TYPE idemlog_commit_batch_operations histogram\n\
        idemlog_commit_batch_operations_bucket{le=\"+Inf\"} 9\n\
        idemlog_commit_batch_operations_sum 15.0\n\
        idemlog_commit_batch_operations_count 9\n";

    #[test]
    fn metric_value_reads_unlabelled_samples_only() {
        assert_eq!(metric_value(EXPOSITION, "idemlog_syncs_total"), Some(9.0));
        assert_eq!(
            metric_value(EXPOSITION, "idemlog_commit_batch_operations_sum"),
            Some(15.0)
        );
        assert_eq!(
            metric_value(EXPOSITION, "idemlog_commit_batch_operations_count"),
            Some(9.0)
        );
        // A prefix of another name, a labelled sample, and a missing name.
        assert_eq!(metric_value(EXPOSITION, "idemlog_syncs"), None);
        assert_eq!(
            metric_value(EXPOSITION, "idemlog_commit_batch_operations_bucket"),
            None
        );
        assert_eq!(metric_value(EXPOSITION, "idemlog_records"), None);
    }

    #[test]
    fn dechunk_joins_chunks() {
        assert_eq!(
            dechunk("5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n").as_deref(),
            Some("hello!")
        );
        assert_eq!(dechunk("5\r\nhel"), None);
    }
}
