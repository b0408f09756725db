//! Reading a handler's response body for storage, bounded by `max_response_bytes`.
//!
//! A body within the limit is collected whole and stored. A larger one is not truncated and not
//! dropped: the frames read so far are kept ([`Collected::TooLarge`]) and handed back in front of
//! the rest of the body, so the client that ran the request still receives every byte, while
//! memory stays bounded by the limit plus one frame.
//!
//! Public for services in front of the layer that read a body themselves under a deadline of their
//! own (a reverse proxy reading its upstream's answer within its timeout): they get the layer's
//! reading, and the layer, reading an already whole body again, only takes one frame.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, HttpBody};
use bytes::Bytes;
use http_body_util::BodyExt;

/// A response body, read up to the limit.
pub enum Collected {
    /// The whole body, within the limit.
    Whole(Bytes),
    /// More than the limit: the whole body, as what was read followed by the rest, unread.
    TooLarge(Body),
}

/// Reads `body` up to `limit` bytes; an error is the body's own (a connection lost mid-body).
pub async fn collect_bounded(mut body: Body, limit: usize) -> Result<Collected, axum::Error> {
    let mut read: VecDeque<Bytes> = VecDeque::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        // Trailers are neither stored nor replayed.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        total += data.len();
        read.push_back(data);
        if total > limit {
            return Ok(Collected::TooLarge(Body::new(Prefixed {
                read,
                rest: body,
            })));
        }
    }
    Ok(Collected::Whole(match read.len() {
        0 => Bytes::new(),
        1 => read.pop_front().unwrap_or_default(),
        _ => {
            let mut joined = Vec::with_capacity(total);
            for chunk in &read {
                joined.extend_from_slice(chunk);
            }
            Bytes::from(joined)
        }
    }))
}

/// Frames already read, then the rest of the body.
struct Prefixed {
    read: VecDeque<Bytes>,
    rest: Body,
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of several frames (what was read, with nothing after it).
    fn chunked(chunks: &[&'static [u8]]) -> Body {
        Body::new(Prefixed {
            read: chunks.iter().map(|c| Bytes::from_static(c)).collect(),
            rest: Body::empty(),
        })
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_collected_whole() {
        let Ok(Collected::Whole(bytes)) = collect_bounded(chunked(&[b"ab", b"cd"]), 4).await else {
            panic!("expected the whole body");
        };
        assert_eq!(&bytes[..], b"abcd");
    }

    #[tokio::test]
    async fn a_larger_body_is_handed_back_whole_in_order() {
        let Ok(Collected::TooLarge(body)) =
            collect_bounded(chunked(&[b"ab", b"cd", b"ef", b"gh"]), 3).await
        else {
            panic!("expected too large");
        };
        let all = axum::body::to_bytes(body, 1 << 20).await.expect("read");
        assert_eq!(&all[..], b"abcdefgh");
    }
}
