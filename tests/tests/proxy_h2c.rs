//! `idemlog-proxy` speaks HTTP/2 with prior knowledge (h2c) on the same port as HTTP/1.1, with
//! the same protection: copies on one HTTP/2 connection run the upstream once, the replay is byte
//! for byte, and a stream cancelled mid-request still completes its key.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemlog_e2e::proxy::*;
use idemlog_e2e::*;

fn order(key: &str) -> Request<Full<Bytes>> {
    Request::post(ORDERS)
        .header(TENANT_HEADER, TENANT_A)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(ORDER.as_bytes())))
        .expect("request")
}

#[test]
fn h2c_requests_are_protected_like_http1_ones() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-h2c");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (first, replay) = runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let first = send.send_request(order("h2-1")).await.expect("first");
        assert_eq!(first.version(), Version::HTTP_2);
        assert_eq!(first.status(), 201);
        let first = first.into_body().collect().await.expect("body").to_bytes();
        let replay = send.send_request(order("h2-1")).await.expect("replay");
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let replay = replay.into_body().collect().await.expect("body").to_bytes();
        (first, replay)
    });
    assert_eq!(first, replay, "byte for byte");
    assert_eq!(upstream.runs("h2-1"), 1);
    // The same key over HTTP/1.1 is the same request.
    let h1 = proxy.post(TENANT_A, "h2-1", ORDER, "");
    assert!(h1.replayed(), "{h1:?}");
    assert_eq!(h1.body, first.to_vec());
}

#[test]
fn concurrent_copies_on_one_h2c_connection_run_the_upstream_once() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-h2c-concurrent");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let answers = runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let streams: Vec<_> = (0..20)
            .map(|_| {
                let mut send = send.clone();
                tokio::spawn(async move {
                    let mut request = order("h2-copies");
                    request
                        .headers_mut()
                        .insert(BEHAVIOUR, "slow=300".parse().expect("value"));
                    let response = send.send_request(request).await.expect("response");
                    let status = response.status().as_u16();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    let body = response.into_body().collect().await.expect("body");
                    (status, replayed, body.to_bytes())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for stream in streams {
            answers.push(stream.await.expect("stream task"));
        }
        answers
    });
    assert_eq!(upstream.runs("h2-copies"), 1, "{answers:?}");
    let fresh: Vec<_> = answers.iter().filter(|a| a.0 == 201 && !a.1).collect();
    assert_eq!(fresh.len(), 1, "{answers:?}");
    for (status, _, body) in &answers {
        assert!(*status == 201 || *status == 409, "{answers:?}");
        if *status == 201 {
            assert_eq!(body, &fresh[0].2);
        }
    }
}

#[test]
fn a_stream_cancelled_mid_request_still_completes_its_key() {
    let upstream = Upstream::start();
    let dir = TempDir::new("proxy-h2c-cancel");
    let proxy = Proxy::start(&upstream, dir.path(), &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut request = order("h2-cancel");
        request
            .headers_mut()
            .insert(BEHAVIOUR, "slow=800".parse().expect("value"));
        let pending = tokio::spawn(send.send_request(request));
        while upstream_runs(&upstream, "h2-cancel").await == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // RST_STREAM(CANCEL) while the upstream works; the connection stays up.
        pending.abort();
    });
    let mut reply = proxy.post(TENANT_A, "h2-cancel", ORDER, "");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while reply.status == 409 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        reply = proxy.post(TENANT_A, "h2-cancel", ORDER, "");
    }
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(
        reply.replayed(),
        "the cancelled stream's run was completed: {reply:?}"
    );
    assert_eq!(upstream.runs("h2-cancel"), 1);
}

/// [`Upstream::runs`] off the runtime's worker (it blocks on a socket).
async fn upstream_runs(upstream: &Upstream, key: &str) -> u64 {
    tokio::task::block_in_place(|| upstream.runs(key))
}
