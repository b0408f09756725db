//! Choosing a connection's protocol from its first bytes, within the header read timeout:
//! hyper-util's auto builder reads them with no timer at all.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The HTTP/2 client connection preface (RFC 9113 section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// How [`sniff`] ended without a protocol.
pub(super) enum NoProtocol {
    /// Nothing decisive within the header read timeout.
    TimedOut,
    /// The client closed the connection (or it failed) first.
    Closed,
}

/// Reads a connection's first bytes until they either are the HTTP/2 preface (prior knowledge) or
/// cannot be; returns the protocol and the bytes read (served before the rest of the stream).
pub(super) async fn sniff(
    stream: &mut TcpStream,
    limit: Duration,
) -> Result<(Protocol, Vec<u8>), NoProtocol> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let read = async {
        let mut buf = [0u8; 24];
        loop {
            let want = H2_PREFACE.len() - seen.len();
            let n = stream.read(&mut buf[..want]).await.ok()?;
            if n == 0 {
                return None;
            }
            seen.extend_from_slice(&buf[..n]);
            if !H2_PREFACE.starts_with(&seen) {
                return Some(Protocol::Http1);
            }
            if seen.len() == H2_PREFACE.len() {
                return Some(Protocol::Http2);
            }
        }
    };
    match tokio::time::timeout(limit, read).await {
        Ok(Some(protocol)) => Ok((protocol, seen)),
        Ok(None) => Err(NoProtocol::Closed),
        Err(_) => Err(NoProtocol::TimedOut),
    }
}
