//! End-to-end harness: builds the real `idemlog-server` binary, starts it on 127.0.0.1 with a free
//! port, and talks HTTP/1.1 to it over plain sockets.
//!
//! How the binary is found: `CARGO_BIN_EXE_*` only exists inside the server's own package, so the
//! first test of each test process runs `cargo build -p idemlog-server` (through the `CARGO` that
//! runs the tests, into the same target directory and profile directory as the test executable)
//! once behind a `OnceLock`, and uses `<target>/<profile>/idemlog-server`. Cargo has released its
//! build lock by the time tests run, and a fresh binary makes this a no-op.
//!
//! How the port is found: the server is started with `--listen 127.0.0.1:0` and the harness reads
//! the address it logs (`listening addr=…`) from its stderr, so there is no race for a port.
//!
//! The client is a minimal blocking HTTP/1.1 client (`Connection: close`), enough for these tests
//! and able to do what a library client hides: send a request and hang up before the answer.
//!
//! The proxy's harness (the `idemlog-proxy` binary in front of a Python upstream that counts its
//! effects) is the [`proxy`] module; it builds its binary the same way.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod proxy;

/// The API key / account pairs every test server gets, unless a test says otherwise.
pub const KEY_A: &str = "e2e_key_a";
/// Account of [`KEY_A`].
pub const ACCOUNT_A: &str = "acct_a";
/// Second key.
pub const KEY_B: &str = "e2e_key_b";
/// Account of [`KEY_B`].
pub const ACCOUNT_B: &str = "acct_b";
/// A valid payment body.
pub const BODY: &str = r#"{"amount": 100.00, "currency": "BRL"}"#;

static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Path of a freshly built `idemlog-server`.
pub fn binary() -> &'static Path {
    BINARY.get_or_init(|| build_workspace_binary("idemlog-server", "idemlog-server"))
}

/// Builds binary `bin` of workspace package `package` with the test executable's profile, into
/// its target directory, and returns the binary's path (see the module docs for why).
pub(crate) fn build_workspace_binary(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile dir>/deps/<test exe>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in <target>/<profile>/deps")
        .to_path_buf();
    let target_dir = profile_dir
        .parent()
        .expect("profile directory has a parent")
        .to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        // `cargo test` builds with the `test` profile into `debug/`: building the binary with the
        // same profile reuses the dependencies it already compiled.
        Some("debug") => "test".to_owned(),
        Some(other) => other.to_owned(),
        None => "test".to_owned(),
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace)
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .arg("--profile")
        .arg(&profile)
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build -p {package} failed");
    let binary = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    assert!(binary.exists(), "{} was not built", binary.display());
    binary
}

/// A temporary data directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory.
    pub fn new(name: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "idemlog-e2e-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server process. Killed on drop if still running.
pub struct Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased (last value wins).
    pub headers: HashMap<String, String>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Reply {
    /// A header by lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// True when `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Server {
    /// Starts the server on `data_dir` with the two test keys and `args`.
    pub fn start(data_dir: &Path, args: &[&str]) -> Server {
        Self::start_with(
            data_dir,
            args,
            &[(
                "IDEMLOG_API_KEYS",
                &format!("{KEY_A}={ACCOUNT_A},{KEY_B}={ACCOUNT_B}"),
            )],
        )
    }

    /// Starts the server with exactly these extra environment variables (every other `IDEMLOG_*`
    /// of the test process is removed).
    pub fn start_with(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all: Vec<&std::ffi::OsStr> = vec!["--data-dir".as_ref(), data_dir.as_os_str()];
        all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
        Self::launch(&all, env)
    }

    /// Starts the server on the PostgreSQL database `url` (`--database-url`, no `--data-dir`) with
    /// `args` and exactly these extra environment variables.
    pub fn start_on_database(url: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all: Vec<&std::ffi::OsStr> = vec!["--database-url".as_ref(), url.as_ref()];
        all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
        Self::launch(&all, env)
    }

    fn launch(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(binary());
        for (name, _) in std::env::vars() {
            // DATABASE_URL too: CI exports it for the PostgreSQL tests, and a server meant to run on
            // its embedded store must not pick it up.
            if name.starts_with("IDEMLOG_") || name == "DATABASE_URL" {
                command.env_remove(name);
            }
        }
        command
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start idemlog-server");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let logs = Arc::clone(&logs);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if line.contains(" listening")
                        && let Some(addr) = line.split("addr=").nth(1)
                        && let Ok(addr) = addr.trim().parse::<SocketAddr>()
                    {
                        let _ = tx.send(addr);
                    }
                    logs.lock().expect("logs").push(line);
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not start listening; log:\n{}",
                    logs.lock().expect("logs").join("\n")
                );
            }
        };
        let server = Server { child, addr, logs };
        let health = server.get(None, "/healthz");
        assert_eq!(health.status, 200, "healthz: {health:?}");
        server
    }

    /// Everything the server logged so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a request and reads the whole response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut stream = self.send_only(method, path, headers, body);
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("read response");
        parse_response(&raw)
    }

    /// Sends a request and returns the open connection without reading the answer.
    pub fn send_only(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        self.try_send(method, path, headers, body)
            .expect("connect and send the request")
    }

    /// [`Server::send_only`] that reports a failure to connect or write instead of panicking.
    fn try_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<TcpStream> {
        let mut stream = TcpStream::connect(self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        Ok(stream)
    }

    /// `POST /payments` with a Bearer key, an Idempotency-Key and a JSON body.
    pub fn pay(&self, api_key: &str, idempotency_key: &str, body: &str) -> Reply {
        let auth = format!("Bearer {api_key}");
        self.request(
            "POST",
            "/payments",
            &pay_headers(&auth, idempotency_key),
            body.as_bytes(),
        )
    }

    /// Like [`Server::pay`], for a server that may die under it: `None` when the connection
    /// fails or closes before a whole response head arrives (the client never got an answer).
    pub fn try_pay(&self, api_key: &str, idempotency_key: &str, body: &str) -> Option<Reply> {
        let auth = format!("Bearer {api_key}");
        let headers = pay_headers(&auth, idempotency_key);
        let mut stream = self
            .try_send("POST", "/payments", &headers, body.as_bytes())
            .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).ok()?;
        raw.windows(4)
            .any(|w| w == b"\r\n\r\n")
            .then(|| parse_response(&raw))
    }

    /// `GET path`, with a Bearer key if given.
    pub fn get(&self, api_key: Option<&str>, path: &str) -> Reply {
        let auth = api_key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.request("GET", path, &headers, b"")
    }

    /// A sample's value from `/metrics`, e.g. `gateway_charges_total` or
    /// `idempotency_requests_total{outcome="replayed"}`.
    pub fn metric(&self, sample: &str) -> u64 {
        let text = self.get(None, "/metrics").text();
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no sample {sample} in:\n{text}"))
    }

    /// Charges the provider has ever made.
    pub fn charges(&self) -> u64 {
        self.metric("gateway_charges_total")
    }

    /// `idempotency_requests_total{outcome="…"}`.
    pub fn outcome(&self, outcome: &str) -> u64 {
        self.metric(&format!(
            "idempotency_requests_total{{outcome=\"{outcome}\"}}"
        ))
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn terminate(mut self) -> ExitStatus {
        self.signal_terminate();
        self.wait_exit(Duration::from_secs(30))
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("server did not exit; log:\n{}", self.logs().join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The headers of a payment request.
fn pay_headers<'a>(auth: &'a str, idempotency_key: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("Authorization", auth),
        ("Content-Type", "application/json"),
        ("Idempotency-Key", idempotency_key),
    ]
}

pub(crate) fn parse_response(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "no header end in response: {:?}",
                String::from_utf8_lossy(raw)
            )
        });
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[split + 4..];
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        dechunk(rest)
    } else if let Some(len) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        rest[..len.min(rest.len())].to_vec()
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&rest[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        rest = &rest[eol + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[(size + 2).min(rest.len())..];
    }
    body
}

/// Polls `check` every 20 ms until it is true, for at most `limit`.
pub fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// A raw TCP connection to the server, for tests that send partial requests.
    pub fn connect_raw(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream
    }
}

/// Reads from `stream` until the server closes it (EOF or reset) or `limit` passes. Returns the
/// bytes read and, if the server closed the connection, how long after the call that was.
pub fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Duration>) {
    let start = Instant::now();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (bytes, Some(start.elapsed())),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // Reset or aborted: closed as well.
            Err(_) => return (bytes, Some(start.elapsed())),
        }
        if start.elapsed() >= limit {
            return (bytes, None);
        }
    }
}

/// Reads one response from a keep-alive connection (one with a `Content-Length`), within `limit`.
pub fn read_one_response(stream: &mut TcpStream, limit: Duration) -> Reply {
    let deadline = Instant::now() + limit;
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let reply = parse_response(&raw);
            let len: usize = reply
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .expect("a keep-alive response with a Content-Length");
            if raw.len() >= split + 4 + len {
                return reply;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no complete response within {limit:?}: {:?}",
            String::from_utf8_lossy(&raw)
        );
        match stream.read(&mut buf) {
            Ok(0) => panic!(
                "connection closed mid-response: {:?}",
                String::from_utf8_lossy(&raw)
            ),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => panic!("read failed: {e}"),
        }
    }
}
