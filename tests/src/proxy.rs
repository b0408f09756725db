//! Harness of the `idemlog-proxy` end-to-end tests: the real proxy binary in front of the Python
//! counting upstream (`tests/upstream/counting_upstream.py`), both on 127.0.0.1 on ports they chose
//! themselves.
//!
//! - [`proxy_binary`] builds `idemlog-proxy` once per test process, like [`crate::binary`] does for
//!   the server.
//! - [`Upstream`] runs the upstream with `python3` from `PATH`, reads `listening port=N` from its
//!   stdout, and reads what it counted and recorded through its control endpoints (`/_counts`,
//!   `/_requests`), so a test proves how many times an effect ran from the upstream's side, not from
//!   the proxy's own metrics.
//! - [`Proxy`] starts the proxy with `--listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`, parses the
//!   `proxy listening addr=` and `admin listening addr=` lines of its stderr, checks the admin
//!   `/healthz`, and can be stopped (SIGTERM), crashed (SIGKILL) and started again with the same
//!   arguments (so the same data directory).
//! - [`http`] is the minimal blocking HTTP/1.1 client of the crate, for any address and any
//!   headers (the caller may replace `Host` and `Connection`); [`http_raw`] sends bytes exactly as
//!   written; [`KeepAlive`] sends several requests on one connection and reads each response by
//!   its framing.
//! - [`mint_jwt`], [`mint_rs256_jwt`] and [`jwks_of`] make bearer tokens and key sets with
//!   `tests/upstream/mint_jwt.py` (and the `openssl` command for RSA), so the JWT scope is tested
//!   without a JWT crate on the test side.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::{Reply, parse_response};

/// The header the test proxies take the scope from.
pub const TENANT_HEADER: &str = "X-Tenant-Id";
/// A tenant.
pub const TENANT_A: &str = "tenant-a";
/// Another tenant.
pub const TENANT_B: &str = "tenant-b";
/// The path protected requests go to, unless a test says otherwise.
pub const ORDERS: &str = "/orders";
/// A JSON request body.
pub const ORDER: &str = r#"{"item": "book", "quantity": 1}"#;
/// Another JSON request body.
pub const OTHER_ORDER: &str = r#"{"item": "book", "quantity": 2}"#;
/// The upstream's behaviour header (see the upstream's docs).
pub const BEHAVIOUR: &str = "X-Test-Behaviour";
/// The header the proxy passes the claim's fencing token in.
pub const FENCING_TOKEN: &str = "Idempotency-Fencing-Token";

/// The scope arguments of a proxy that believes [`TENANT_HEADER`] from 127.0.0.1.
pub const TRUSTED_TENANT_HEADER: [&str; 4] = [
    "--scope-header",
    TENANT_HEADER,
    "--trusted-peer",
    "127.0.0.1/32",
];

static PROXY_BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Path of a freshly built `idemlog-proxy`.
pub fn proxy_binary() -> &'static Path {
    PROXY_BINARY.get_or_init(|| crate::build_workspace_binary("idemlog-proxy", "idemlog-proxy"))
}

/// A key no other test process uses: the PostgreSQL tests share one database across runs.
pub fn unique_key(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos}", std::process::id())
}

/// A 127.0.0.1 port nothing listens on right now (bound, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// Sends one request to `addr` (`Connection: close` and `Host` added unless given, a
/// `Content-Length` always) and reads the whole response; `Err` when connecting, writing or
/// reading fails or the connection closes before a whole response head.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Reply> {
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    if !has("connection") {
        head.push_str("Connection: close\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut raw = head.into_bytes();
    raw.extend_from_slice(body);
    http_raw(addr, &raw)
}

/// Sends `request` exactly as given (a whole HTTP/1.1 request, e.g. with a chunked body) and reads
/// the whole response, as [`http`] does.
pub fn http_raw(addr: SocketAddr, request: &[u8]) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(request)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        Ok(parse_response(&raw))
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "connection closed before a response head: {:?}",
                String::from_utf8_lossy(&raw)
            ),
        ))
    }
}

/// A keep-alive HTTP/1.1 connection that sends requests one after another and reads exactly one
/// response for each, by its framing (none for 204 and 304, `Content-Length`, or chunked): a
/// response framed wrongly leaves the connection unusable and the next request fails.
pub struct KeepAlive {
    stream: TcpStream,
    addr: SocketAddr,
    buffer: Vec<u8>,
}

impl KeepAlive {
    /// Connects to `addr`.
    pub fn open(addr: SocketAddr) -> KeepAlive {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        KeepAlive {
            stream,
            addr,
            buffer: Vec::new(),
        }
    }

    /// Sends a request (with `Host` and `Content-Length`) and reads its response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes()).expect("send head");
        self.stream.write_all(body).expect("send body");
        let head_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.fill();
        };
        let reply_head = parse_response(&self.buffer[..head_end]);
        let chunked = reply_head
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let end = if method == "HEAD" || matches!(reply_head.status, 204 | 304) {
            head_end
        } else if chunked {
            self.chunked_end(head_end)
        } else {
            let length: usize = reply_head
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a keep-alive response without framing: {reply_head:?}"));
            while self.buffer.len() < head_end + length {
                self.fill();
            }
            head_end + length
        };
        let raw: Vec<u8> = self.buffer.drain(..end).collect();
        parse_response(&raw)
    }

    /// Where the chunked body starting at `at` ends (after its last chunk and the empty trailer).
    fn chunked_end(&mut self, mut at: usize) -> usize {
        loop {
            let line_end = loop {
                if let Some(p) = self.buffer[at..].windows(2).position(|w| w == b"\r\n") {
                    break at + p;
                }
                self.fill();
            };
            let size_text = String::from_utf8_lossy(&self.buffer[at..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {size_text:?}"));
            at = line_end + 2;
            if size == 0 {
                // No trailers are expected: the empty line ends the body.
                while self.buffer.len() < at + 2 {
                    self.fill();
                }
                assert_eq!(
                    &self.buffer[at..at + 2],
                    b"\r\n",
                    "trailers are not expected"
                );
                return at + 2;
            }
            while self.buffer.len() < at + size + 2 {
                self.fill();
            }
            at += size + 2;
        }
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).expect("read the response");
        assert!(
            n > 0,
            "the connection closed mid-response: {:?}",
            String::from_utf8_lossy(&self.buffer)
        );
        self.buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Reads `child`'s stream line by line into `logs` on a thread of its own, sending every line to
/// `lines` as well.
fn drain(
    stream: impl Read + Send + 'static,
    logs: Arc<Mutex<Vec<String>>>,
    lines: mpsc::Sender<String>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let _ = lines.send(line.clone());
            logs.lock().expect("logs").push(line);
        }
    });
}

/// Kills and reaps `child` if it still runs.
fn reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The Python counting upstream. Killed on drop.
pub struct Upstream {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Its `Idempotency-Key`, if any.
    pub key: Option<String>,
    /// Headers in the order received, names as sent.
    pub headers: Vec<(String, String)>,
    /// Body length.
    pub body_len: u64,
}

impl UpstreamRequest {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header, by case-insensitive name.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The fencing token the proxy passed, parsed as the contract's decimal u64.
    pub fn fencing_token(&self) -> u64 {
        let value = self
            .header(FENCING_TOKEN)
            .unwrap_or_else(|| panic!("no {FENCING_TOKEN} header in {self:?}"));
        value
            .parse()
            .unwrap_or_else(|e| panic!("{FENCING_TOKEN}: {value:?} is not a decimal u64: {e}"))
    }
}

impl Upstream {
    /// Starts the upstream on a port of its choosing.
    pub fn start() -> Upstream {
        Self::launch(0)
    }

    /// Starts the upstream on `port` (a test that first points the proxy at a closed port).
    pub fn start_on_port(port: u16) -> Upstream {
        Self::launch(port)
    }

    fn launch(port: u16) -> Upstream {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream/counting_upstream.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--port")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3 tests/upstream/counting_upstream.py");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        drain(
            child.stdout.take().expect("stdout"),
            Arc::clone(&logs),
            tx.clone(),
        );
        drain(child.stderr.take().expect("stderr"), Arc::clone(&logs), tx);
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(port) = line
                        .strip_prefix("listening port=")
                        .and_then(|p| p.trim().parse::<u16>().ok())
                    {
                        break port;
                    }
                }
                Err(_) => {
                    reap(&mut child);
                    panic!(
                        "the upstream did not start; output:\n{}",
                        logs.lock().expect("logs").join("\n")
                    );
                }
            }
        };
        Upstream {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            logs,
        }
    }

    /// `http://127.0.0.1:PORT`, for `--upstream`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything it printed so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    fn control(&self, path: &str) -> serde_json::Value {
        let reply = http(self.addr, "GET", path, &[], b"")
            .unwrap_or_else(|e| panic!("upstream GET {path}: {e}"));
        assert_eq!(reply.status, 200, "upstream GET {path}: {reply:?}");
        reply.json()
    }

    /// How many times the effect of `key` ran.
    pub fn runs(&self, key: &str) -> u64 {
        self.counts().get(key).copied().unwrap_or(0)
    }

    /// Runs per `Idempotency-Key`.
    pub fn counts(&self) -> HashMap<String, u64> {
        let value = self.control("/_counts");
        value["counts"]
            .as_object()
            .expect("counts object")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("a count")))
            .collect()
    }

    /// Every request it received (control endpoints aside), with a key or not.
    pub fn total(&self) -> u64 {
        self.control("/_counts")["total"].as_u64().expect("total")
    }

    /// Every request it received (control endpoints aside), in arrival order.
    pub fn requests(&self) -> Vec<UpstreamRequest> {
        let value = self.control("/_requests");
        value
            .as_array()
            .expect("requests array")
            .iter()
            .map(|r| UpstreamRequest {
                seq: r["seq"].as_u64().expect("seq"),
                method: r["method"].as_str().expect("method").to_owned(),
                path: r["path"].as_str().expect("path").to_owned(),
                key: r["key"].as_str().map(str::to_owned),
                headers: r["headers"]
                    .as_array()
                    .expect("headers")
                    .iter()
                    .map(|pair| {
                        (
                            pair[0].as_str().expect("name").to_owned(),
                            pair[1].as_str().expect("value").to_owned(),
                        )
                    })
                    .collect(),
                body_len: r["body_len"].as_u64().expect("body_len"),
            })
            .collect()
    }

    /// The requests that carried `key`.
    pub fn requests_with_key(&self, key: &str) -> Vec<UpstreamRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.key.as_deref() == Some(key))
            .collect()
    }

    /// Stops it (SIGKILL): the upstream is down from here on.
    pub fn stop(mut self) {
        reap(&mut self.child);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// How a proxy was started, so it can be started again the same way.
#[derive(Debug, Clone)]
struct Launch {
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    /// The folder of the `--config` file, kept as long as any process started this way.
    config: Option<Arc<crate::TempDir>>,
}

/// A running `idemlog-proxy`. Killed on drop if still running.
pub struct Proxy {
    child: Child,
    /// The proxy listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin_addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    launch: Launch,
}

impl Proxy {
    /// A proxy in front of `upstream` on the embedded store in `data_dir`, believing
    /// [`TENANT_HEADER`] from 127.0.0.1, with `args` added.
    pub fn start(upstream: &Upstream, data_dir: &Path, args: &[&str]) -> Proxy {
        let mut all: Vec<&str> = TRUSTED_TENANT_HEADER.to_vec();
        all.extend_from_slice(args);
        Self::start_bare(&upstream.url(), data_dir, &all)
    }

    /// A proxy in front of `upstream_url` on the embedded store in `data_dir` with `args` and no
    /// scope source of its own (the test gives one in `args`).
    pub fn start_bare(upstream_url: &str, data_dir: &Path, args: &[&str]) -> Proxy {
        let mut all: Vec<OsString> = vec![
            "--upstream".into(),
            upstream_url.into(),
            "--data-dir".into(),
            data_dir.as_os_str().to_owned(),
        ];
        all.extend(args.iter().map(OsString::from));
        Self::launch(Launch {
            args: all,
            env: Vec::new(),
            config: None,
        })
    }

    /// [`Proxy::start`] with the route rules `rules` (TOML) in a `--config` file of its own.
    pub fn start_with_rules(
        upstream: &Upstream,
        data_dir: &Path,
        rules: &str,
        args: &[&str],
    ) -> Proxy {
        let config = crate::TempDir::new("proxy-config");
        let path = write_config(config.path(), "proxy.toml", rules);
        let path = path.to_str().expect("utf-8 path");
        let mut all = vec!["--config", path];
        all.extend_from_slice(args);
        let mut proxy = Self::start(upstream, data_dir, &all);
        proxy.launch.config = Some(Arc::new(config));
        proxy
    }

    /// A proxy in front of `upstream` on the PostgreSQL database `url` (`--database-url`),
    /// believing [`TENANT_HEADER`] from 127.0.0.1, with `args` added.
    pub fn start_on_database(upstream: &Upstream, url: &str, args: &[&str]) -> Proxy {
        let mut all: Vec<OsString> = vec![
            "--upstream".into(),
            upstream.url().into(),
            "--database-url".into(),
            url.into(),
        ];
        all.extend(TRUSTED_TENANT_HEADER.iter().map(OsString::from));
        all.extend(args.iter().map(OsString::from));
        Self::launch(Launch {
            args: all,
            env: Vec::new(),
            config: None,
        })
    }

    /// The command the harness runs for `args`: listeners on free ports, `RUST_LOG=info`, and no
    /// `IDEMLOG_*` or `DATABASE_URL` from the test process (CI exports `DATABASE_URL`; a proxy
    /// meant to run on its embedded store must not pick up a database).
    fn command(args: &[OsString], env: &[(String, String)]) -> Command {
        let mut command = Command::new(proxy_binary());
        for (name, _) in std::env::vars() {
            if name.starts_with("IDEMLOG_") || name == "DATABASE_URL" {
                command.env_remove(name);
            }
        }
        command
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(n, v)| (n, v)))
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    /// Runs the proxy with exactly `args` (after the listen flags) and waits for it to exit
    /// within `limit`: a start-up that must be refused. Returns the exit status and the stderr.
    pub fn run_expecting_exit(args: &[&str], limit: Duration) -> (ExitStatus, String) {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut child = Self::command(&args, &[])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idemlog-proxy");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, _rx) = mpsc::channel();
        drain(child.stderr.take().expect("stderr"), Arc::clone(&logs), tx);
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                reap(&mut child);
                panic!(
                    "idemlog-proxy {args:?} did not exit within {limit:?}; log:\n{}",
                    logs.lock().expect("logs").join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Let the reader thread take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        let text = logs.lock().expect("logs").join("\n");
        (status, text)
    }

    fn launch(launch: Launch) -> Proxy {
        let mut child = Self::command(&launch.args, &launch.env)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idemlog-proxy");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        drain(child.stderr.take().expect("stderr"), Arc::clone(&logs), tx);
        let address = |line: &str, what: &str| {
            line.split(what)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<SocketAddr>()
                .ok()
        };
        let (mut addr, mut admin_addr) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(120);
        while addr.is_none() || admin_addr.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    addr = addr.or_else(|| address(&line, "proxy listening addr="));
                    admin_addr = admin_addr.or_else(|| address(&line, "admin listening addr="));
                }
                Err(_) => {
                    let status = child.try_wait().ok().flatten();
                    reap(&mut child);
                    panic!(
                        "idemlog-proxy did not log both listening addresses (exit: {status:?}); \
                         args {:?}; log:\n{}",
                        launch.args,
                        logs.lock().expect("logs").join("\n")
                    );
                }
            }
        }
        let (Some(addr), Some(admin_addr)) = (addr, admin_addr) else {
            unreachable!("the loop ends when both are known")
        };
        let proxy = Proxy {
            child,
            addr,
            admin_addr,
            logs,
            launch,
        };
        let health = proxy.admin_get("/healthz");
        assert_eq!(health.status, 200, "admin /healthz: {health:?}");
        proxy
    }

    /// Everything it logged so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Sends a request to the proxy listener and reads the whole response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        http(self.addr, method, path, headers, body).unwrap_or_else(|e| {
            panic!(
                "{method} {path} through the proxy: {e}; proxy log:\n{}",
                self.logs().join("\n")
            )
        })
    }

    /// Like [`Proxy::request`], for a proxy that may die under it: `None` when there was no whole
    /// response (the client never got an answer).
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Reply> {
        http(self.addr, method, path, headers, body).ok()
    }

    /// `POST /orders` for `tenant` with `key`, a JSON `body`, and the upstream behaviour
    /// `behaviour` (`""` for the default).
    pub fn post(&self, tenant: &str, key: &str, body: &str, behaviour: &str) -> Reply {
        self.request(
            "POST",
            ORDERS,
            &order_headers(tenant, key, behaviour),
            body.as_bytes(),
        )
    }

    /// `POST path` for `tenant` with `key` and a JSON `body`.
    pub fn post_to(&self, path: &str, tenant: &str, key: &str, body: &str) -> Reply {
        self.request(
            "POST",
            path,
            &order_headers(tenant, key, ""),
            body.as_bytes(),
        )
    }

    /// `GET` on the admin listener.
    pub fn admin_get(&self, path: &str) -> Reply {
        http(self.admin_addr, "GET", path, &[], b"")
            .unwrap_or_else(|e| panic!("admin GET {path}: {e}"))
    }

    /// SIGKILL, then a new process with the same arguments (so the same data directory).
    pub fn crash_and_restart(mut self) -> Proxy {
        reap(&mut self.child);
        Self::launch(self.launch.clone())
    }

    /// SIGTERM, a clean exit (asserted), then a new process with the same arguments.
    pub fn restart(self) -> Proxy {
        let launch = self.launch.clone();
        let status = self.terminate();
        assert!(status.success(), "SIGTERM exit: {status:?}");
        Self::launch(launch)
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) {
        reap(&mut self.child);
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Sends `signal` (a name `kill` knows: `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Sends SIGKILL without waiting or reaping (the process may be shared with client threads;
    /// [`Proxy::crash_and_restart`] or drop reaps it).
    pub fn signal_kill(&self) {
        let status = Command::new("kill")
            .arg("-KILL")
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL failed");
    }

    /// SIGTERM, then waits (at most 30 s) for the exit.
    pub fn terminate(mut self) -> ExitStatus {
        self.signal_terminate();
        self.wait_exit(Duration::from_secs(30))
    }

    /// Waits for the process to exit, killing it and failing after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                reap(&mut self.child);
                panic!(
                    "idemlog-proxy did not exit; log:\n{}",
                    self.logs().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// The headers of a protected order request: tenant, key, JSON, and the upstream behaviour
/// (left out when `behaviour` is empty).
pub fn order_headers<'a>(
    tenant: &'a str,
    key: &'a str,
    behaviour: &'a str,
) -> Vec<(&'static str, &'a str)> {
    let mut headers = vec![
        (TENANT_HEADER, tenant),
        ("Idempotency-Key", key),
        ("Content-Type", "application/json"),
    ];
    if !behaviour.is_empty() {
        headers.push((BEHAVIOUR, behaviour));
    }
    headers
}

/// An HS256 JWT with `claims` (JSON; `exp` in seconds from now, negative for the past), signed
/// with the secret in `secret_file`, minted by `tests/upstream/mint_jwt.py`; `alg` is `HS256` or
/// `none`.
pub fn mint_jwt(secret_file: &Path, claims: &str, alg: &str) -> String {
    mint_jwt_script(&[secret_file.as_os_str(), claims.as_ref(), alg.as_ref()])
}

/// Runs `tests/upstream/mint_jwt.py` with `args` and returns its trimmed stdout.
fn mint_jwt_script(args: &[&std::ffi::OsStr]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream/mint_jwt.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("run python3 tests/upstream/mint_jwt.py");
    assert!(
        out.status.success(),
        "mint_jwt.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("ASCII output")
        .trim()
        .to_owned()
}

/// A new 2048-bit RSA private key (PEM) at `dir/name`, made by the `openssl` command.
pub fn rsa_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&path)
        .stderr(Stdio::null())
        .status()
        .expect("run openssl genpkey");
    assert!(status.success(), "openssl genpkey failed");
    path
}

/// The public key of `pem` in PEM form (for an algorithm-confusion token).
pub fn rsa_public_pem(pem: &Path, out: &Path) -> PathBuf {
    let status = Command::new("openssl")
        .args(["rsa", "-pubout", "-in"])
        .arg(pem)
        .arg("-out")
        .arg(out)
        .stderr(Stdio::null())
        .status()
        .expect("run openssl rsa -pubout");
    assert!(status.success(), "openssl rsa -pubout failed");
    out.to_path_buf()
}

/// A JWKS document holding the public half of `pem` under `kid` (RS256).
pub fn jwks_of(pem: &Path, kid: &str) -> String {
    mint_jwt_script(&["--jwks".as_ref(), pem.as_os_str(), kid.as_ref()])
}

/// An RS256 JWT with `claims` (as [`mint_jwt`]), signed with the private key `pem`, `kid` in
/// its header.
pub fn mint_rs256_jwt(pem: &Path, claims: &str, kid: &str) -> String {
    mint_jwt_script(&[
        pem.as_os_str(),
        claims.as_ref(),
        "RS256".as_ref(),
        kid.as_ref(),
    ])
}

/// Writes `text` to `name` in `dir` (a TOML route file) and returns its path.
pub fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the proxy config");
    path
}
