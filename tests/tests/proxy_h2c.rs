//! `idemlog-proxy` speaks HTTP/2 with prior knowledge (h2c) on the same port as HTTP/1.1, with
//! the same protection: copies on one HTTP/2 connection run the upstream once, and the replay is
//! byte for byte.

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
