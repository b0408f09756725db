//! HTTP connection limits (audit finding 12): header, body and idle timeouts, the connection cap
//! and the bounded graceful shutdown, against the real binary on 127.0.0.1 with short limits.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use idemlog_e2e::*;

/// Every close must come well within this; without the limits nothing closes at all.
const LIMIT: Duration = Duration::from_secs(10);

fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(bytes);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

fn keep_alive_get(stream: &mut TcpStream, path: &str) {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: e2e\r\n\r\n").expect("write request");
}

fn payment_head(key: &str) -> String {
    format!(
        "POST /payments HTTP/1.1\r\nHost: e2e\r\nAuthorization: Bearer {KEY_A}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    )
}

#[test]
fn a_half_sent_request_line_is_closed_after_the_header_read_timeout() {
    let dir = TempDir::new("header-timeout");
    let server = Server::start(dir.path(), &["--header-read-timeout", "300ms"]);
    let mut stream = server.connect_raw();
    stream.write_all(b"GET /healthz HT").expect("write");
    let (bytes, closed) = read_until_closed(&mut stream, LIMIT);
    let after =
        closed.unwrap_or_else(|| panic!("a half-sent request line was kept open {LIMIT:?}"));
    assert!(
        after >= Duration::from_millis(200) && after < Duration::from_secs(5),
        "closed after {after:?}, expected about 300ms"
    );
    assert_ne!(status_of(&bytes), Some(200), "{bytes:?}");
    // The server is still fine.
    assert_eq!(server.get(None, "/healthz").status, 200);
}

#[test]
fn a_keep_alive_request_head_is_bounded_by_the_header_read_timeout_too() {
    let dir = TempDir::new("header-timeout-keepalive");
    let server = Server::start(
        dir.path(),
        &["--header-read-timeout", "300ms", "--idle-timeout", "1m"],
    );
    let mut stream = server.connect_raw();
    keep_alive_get(&mut stream, "/healthz");
    assert_eq!(read_one_response(&mut stream, LIMIT).status, 200);
    stream.write_all(b"GET /heal").expect("write");
    let (_, closed) = read_until_closed(&mut stream, LIMIT);
    let after = closed.unwrap_or_else(|| panic!("a half-sent second request was kept open"));
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
}

#[test]
fn a_stalled_body_fails_before_any_claim_and_the_retry_charges_once() {
    let dir = TempDir::new("body-timeout");
    let server = Server::start(
        dir.path(),
        &["--body-read-timeout", "300ms", "--gateway-latency", "0ms"],
    );
    let mut stream = server.connect_raw();
    stream
        .write_all(payment_head("stalled-body").as_bytes())
        .expect("write head");
    stream
        .write_all(&BODY.as_bytes()[..10])
        .expect("write part");
    let (bytes, closed) = read_until_closed(&mut stream, LIMIT);
    let after = closed.unwrap_or_else(|| {
        panic!(
            "a stalled body was kept open {LIMIT:?}; got {:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
    let status = status_of(&bytes).expect("a status line before the close");
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(server.charges(), 0);

    let retry = server.pay(KEY_A, "stalled-body", BODY);
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed(), "nothing was stored for the stalled try");
    assert_eq!(server.charges(), 1);
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let dir = TempDir::new("idle-timeout");
    let server = Server::start(
        dir.path(),
        &["--idle-timeout", "300ms", "--header-read-timeout", "1m"],
    );
    let mut stream = server.connect_raw();
    keep_alive_get(&mut stream, "/healthz");
    assert_eq!(read_one_response(&mut stream, LIMIT).status, 200);
    let (bytes, closed) = read_until_closed(&mut stream, LIMIT);
    let after = closed.unwrap_or_else(|| panic!("an idle keep-alive was kept open {LIMIT:?}"));
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
    assert!(bytes.is_empty(), "{bytes:?}");
}

#[test]
fn at_the_connection_cap_new_clients_wait_until_stalled_connections_time_out() {
    let dir = TempDir::new("max-connections");
    let server = Server::start(
        dir.path(),
        &[
            "--max-connections",
            "8",
            "--header-read-timeout",
            "2s",
            "--gateway-latency",
            "0ms",
        ],
    );
    let stalled: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut stream = server.connect_raw();
            stream.write_all(b"GET /healthz HT").expect("write");
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));

    // The 21st client: accepted by the kernel, but not served while 8 stalled ones hold the slots.
    let sent = Instant::now();
    let mut waiting = server.connect_raw();
    write!(
        waiting,
        "GET /healthz HTTP/1.1\r\nHost: e2e\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let (early, closed) = read_until_closed(&mut waiting, Duration::from_millis(1000));
    assert!(
        early.is_empty() && closed.is_none(),
        "served at the cap: {:?}",
        String::from_utf8_lossy(&early)
    );
    assert!(
        server
            .logs()
            .iter()
            .any(|line| line.contains("connection cap reached")),
        "no cap warning in:\n{}",
        server.logs().join("\n")
    );

    // The stalled ones time out in batches of 8; then the waiting client is served.
    let (bytes, closed) = read_until_closed(&mut waiting, Duration::from_secs(30));
    assert!(closed.is_some(), "never served");
    assert_eq!(
        status_of(&bytes),
        Some(200),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(sent.elapsed() >= Duration::from_millis(1500));
    drop(stalled);

    let paid = server.pay(KEY_A, "after-the-cap", BODY);
    assert_eq!(paid.status, 201, "{paid:?}");
    assert_eq!(server.get(None, "/healthz").status, 200);
}

#[test]
fn sigterm_closes_stalled_connections_within_the_shutdown_grace() {
    let dir = TempDir::new("shutdown-grace");
    let mut server = Server::start(
        dir.path(),
        &[
            "--shutdown-grace",
            "1s",
            "--header-read-timeout",
            "1m",
            "--body-read-timeout",
            "1m",
            "--idle-timeout",
            "1m",
        ],
    );
    let mut half_line = server.connect_raw();
    half_line.write_all(b"GET /healthz HT").expect("write");
    let mut idle = server.connect_raw();
    keep_alive_get(&mut idle, "/healthz");
    assert_eq!(read_one_response(&mut idle, LIMIT).status, 200);
    let mut mid_body = server.connect_raw();
    mid_body
        .write_all(payment_head("stalled-at-shutdown").as_bytes())
        .expect("write head");
    mid_body
        .write_all(&BODY.as_bytes()[..10])
        .expect("write part");
    std::thread::sleep(Duration::from_millis(200));

    let signalled = Instant::now();
    server.signal_terminate();
    let status = server.wait_exit(Duration::from_secs(6));
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(6), "shutdown took {took:?}");
    assert!(
        server
            .logs()
            .iter()
            .any(|line| line.contains("store closed")),
        "{}",
        server.logs().join("\n")
    );
    drop((half_line, idle, mid_body));
}
