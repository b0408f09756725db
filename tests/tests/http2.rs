//! HTTP/2 cleartext with prior knowledge, on the same port as HTTP/1.1, with the protections
//! HTTP/1.1 has: header and body limits, request-head and idle timeouts, a bound on concurrent
//! streams, and slow clients cut off. Against the real binary on 127.0.0.1, with hyper's HTTP/2
//! client for whole requests and raw frames where a client library would hide the misbehaviour.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemlog_e2e::*;

/// Every close must come well within this; without the limits nothing closes at all.
const LIMIT: Duration = Duration::from_secs(10);

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// An HTTP/2 connection (prior knowledge) and the task driving it.
async fn h2<B>(addr: SocketAddr) -> (SendRequest<B>, tokio::task::JoinHandle<()>)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, driver)
}

fn payment(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request")
}

#[test]
fn http2_with_prior_knowledge_and_http1_are_served_on_one_port() {
    let dir = TempDir::new("h2-one-port");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    runtime().block_on(async {
        let (mut send, _driver) = h2(server.addr).await;
        let first = send
            .send_request(payment("h2-key", BODY))
            .await
            .expect("first");
        assert_eq!(first.version(), Version::HTTP_2);
        assert_eq!(first.status(), 201);
        assert!(first.headers().contains_key("x-request-id"));
        let first_body = first.into_body().collect().await.expect("body").to_bytes();
        let replay = send
            .send_request(payment("h2-key", BODY))
            .await
            .expect("replay");
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let replay_body = replay.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(replay_body, first_body);
    });
    // HTTP/1.1 on the same port sees the same key's stored answer.
    let h1 = server.pay(KEY_A, "h2-key", BODY);
    assert_eq!(h1.status, 201);
    assert!(h1.replayed());
    assert_eq!(server.charges(), 1);
}

/// The server's SETTINGS frame, after sending the preface and an empty SETTINGS: (id, value) pairs.
fn server_settings(stream: &mut std::net::TcpStream) -> Vec<(u16, u32)> {
    stream.write_all(PREFACE).expect("preface");
    stream.write_all(EMPTY_SETTINGS).expect("settings");
    stream.set_read_timeout(Some(LIMIT)).expect("read timeout");
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).expect("frame head");
    assert_eq!(head[3], 4, "the server's first frame is SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).expect("settings payload");
    payload
        .chunks_exact(6)
        .map(|p| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
            )
        })
        .collect()
}

#[test]
fn the_server_bounds_concurrent_streams_and_header_lists_in_its_settings() {
    let dir = TempDir::new("h2-settings");
    let server = Server::start(dir.path(), &[]);
    let settings = server_settings(&mut server.connect_raw());
    const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    let value = |id| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
    assert_eq!(value(MAX_CONCURRENT_STREAMS), Some(100), "{settings:?}");
    assert_eq!(value(MAX_HEADER_LIST_SIZE), Some(64 * 1024), "{settings:?}");
}

#[test]
fn an_http2_request_with_headers_over_the_limit_is_refused_and_the_server_goes_on() {
    let dir = TempDir::new("h2-big-headers");
    let server = Server::start(dir.path(), &[]);
    runtime().block_on(async {
        let (mut send, _driver) = h2(server.addr).await;
        let big = "a".repeat(100 * 1024);
        let request = Request::get("/healthz")
            .header("x-big", big)
            .body(Full::new(Bytes::new()))
            .expect("request");
        // Refused outright (stream reset or connection error) is as good as an error status.
        if let Ok(response) = send.send_request(request).await {
            assert!(
                !response.status().is_success(),
                "a 100 KiB header was served: {}",
                response.status()
            );
        }
        let (mut fresh, _driver) = h2(server.addr).await;
        let ok = Request::get("/healthz")
            .body(Full::new(Bytes::new()))
            .expect("request");
        assert_eq!(fresh.send_request(ok).await.expect("healthz").status(), 200);
    });
}

#[test]
fn an_http2_body_over_the_limit_is_413_and_nothing_is_charged() {
    let dir = TempDir::new("h2-body-limit");
    let server = Server::start(dir.path(), &["--max-body-bytes", "64"]);
    runtime().block_on(async {
        let (mut send, _driver) = h2(server.addr).await;
        let body = r#"{"amount": 100.00, "currency": "BRL", "padding": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        let response = send.send_request(payment("h2-big-body", body)).await.expect("response");
        assert_eq!(response.status(), 413);
        assert_eq!(response.headers()["content-type"], "application/problem+json");
    });
    assert_eq!(server.charges(), 0);
}

#[test]
fn a_stalled_http2_body_gets_408_before_any_claim() {
    let dir = TempDir::new("h2-body-timeout");
    let server = Server::start(
        dir.path(),
        &["--body-read-timeout", "300ms", "--gateway-latency", "0ms"],
    );
    runtime().block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let body = ChannelBody(rx);
        let (mut send, _driver) = h2(server.addr).await;
        let request = Request::post("/payments")
            .header("authorization", format!("Bearer {KEY_A}"))
            .header("content-type", "application/json")
            .header("idempotency-key", "h2-stalled")
            .body(body)
            .expect("request");
        tx.send(Bytes::from_static(b"{\"amount\":"))
            .await
            .expect("first chunk");
        let started = Instant::now();
        let response = tokio::time::timeout(LIMIT, send.send_request(request))
            .await
            .expect("answered within the limit")
            .expect("response");
        assert_eq!(response.status(), 408);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        drop(tx);
    });
    assert_eq!(server.charges(), 0);
    // Nothing was claimed: the key is free for the complete retry.
    assert_eq!(server.pay(KEY_A, "h2-stalled", BODY).status, 201);
}

/// A request body fed by a channel: a client that sends part of its body and then stalls.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

#[test]
fn a_partial_http2_preface_is_closed_after_the_header_read_timeout() {
    let dir = TempDir::new("h2-partial-preface");
    let server = Server::start(dir.path(), &["--header-read-timeout", "300ms"]);
    let mut stream = server.connect_raw();
    stream.write_all(&PREFACE[..10]).expect("write");
    let (_, closed) = read_until_closed(&mut stream, LIMIT);
    let after = closed.unwrap_or_else(|| panic!("a partial preface was kept open {LIMIT:?}"));
    assert!(
        after >= Duration::from_millis(200) && after < Duration::from_secs(5),
        "closed after {after:?}, expected about 300ms"
    );
}

#[test]
fn an_http2_request_head_trickled_byte_by_byte_is_cut_off_at_the_header_read_timeout() {
    let dir = TempDir::new("h2-slowloris");
    let server = Server::start(
        dir.path(),
        &["--header-read-timeout", "500ms", "--idle-timeout", "1m"],
    );
    let mut stream = server.connect_raw();
    stream.write_all(PREFACE).expect("preface");
    stream.write_all(EMPTY_SETTINGS).expect("settings");
    // HEADERS on stream 1, 1000 bytes announced, END_HEADERS not set: a head that never ends.
    stream
        .write_all(&[0, 0x03, 0xE8, 1, 0x4, 0, 0, 0, 1])
        .expect("frame head");
    let mut writer = stream.try_clone().expect("clone");
    std::thread::spawn(move || {
        // One byte every 50 ms keeps the socket busy (the idle watchdog never fires).
        for _ in 0..1000 {
            if writer.write_all(&[0x82]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let (_, closed) = read_until_closed(&mut stream, LIMIT);
    let after = closed.unwrap_or_else(|| panic!("a trickled request head was kept open {LIMIT:?}"));
    assert!(
        after >= Duration::from_millis(400) && after < Duration::from_secs(5),
        "closed after {after:?}, expected 0.5 to 1 s"
    );
    assert_eq!(server.get(None, "/healthz").status, 200);
}

#[test]
fn an_http2_connection_is_closed_when_no_request_follows_the_last_response() {
    let dir = TempDir::new("h2-idle");
    let server = Server::start(
        dir.path(),
        &["--header-read-timeout", "500ms", "--idle-timeout", "1m"],
    );
    runtime().block_on(async {
        let (mut send, driver) = h2(server.addr).await;
        let request = Request::get("/healthz")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = send.send_request(request).await.expect("healthz");
        assert_eq!(response.status(), 200);
        let started = Instant::now();
        tokio::time::timeout(LIMIT, driver)
            .await
            .expect("the server closed the idle HTTP/2 connection")
            .expect("driver");
        let after = started.elapsed();
        assert!(
            after >= Duration::from_millis(400) && after < Duration::from_secs(5),
            "closed after {after:?}, expected about 500ms"
        );
    });
}
