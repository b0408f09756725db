//! Operations: what a frame's payload carries (see `FORMAT.md`).
//!
//! Every operation is a self-contained snapshot ("the record for (scope, key) is now X"), never a
//! delta. Replaying a log is therefore idempotent and order-only: applying the same operation twice, or
//! applying a compacted copy of a record after the original, leaves the same state. Compaction relies on
//! this: it copies live operations verbatim.
//!
//! ```text
//! op        := tag u8, fields
//! 0x01 in progress  scope:b8 key:b8 fingerprint:[32] fence:u64 created:u64 expires:u64 lease_until:u64
//! 0x02 completed    scope:b8 key:b8 fingerprint:[32] fence:u64 created:u64 expires:u64 response
//! 0x03 released     scope:b8 key:b8 fence:u64
//! 0x04 side put     namespace:b8 key:b16 expires:u64 value:b32       (expires u64::MAX = never)
//! 0x05 side remove  namespace:b8 key:b16
//! 0x06 fence floor  next_fence:u64
//! 0x07 in progress, with request digest: as 0x01, then digest:b16
//! 0x08 completed, with request digest:   as 0x02 up to expires, then digest:b16, then response
//! response  := status:u16 header_count:u16 (name:b8 value:b16)* body:b32
//! bN        := length as uN, then that many bytes
//! ```

use bytes::Bytes;

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::response::StoredResponse;

const IN_PROGRESS: u8 = 0x01;
const COMPLETED: u8 = 0x02;
const RELEASED: u8 = 0x03;
const SIDE_PUT: u8 = 0x04;
const SIDE_REMOVE: u8 = 0x05;
const FENCE_FLOOR: u8 = 0x06;
/// In progress with a request digest (`digest:b16` after the head).
const IN_PROGRESS_DIGEST: u8 = 0x07;
/// Completed with a request digest (`digest:b16` after the head, before the response).
const COMPLETED_DIGEST: u8 = 0x08;

/// Longest request digest a record carries (the server's per-member digests of a request).
pub(crate) const MAX_DIGEST: usize = crate::limits::MAX_REQUEST_DIGEST;

/// `expires_at` of a side record that never expires.
pub(crate) const NEVER: u64 = u64::MAX;

/// The fields every idempotency-record snapshot carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head<'a> {
    pub(crate) scope: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) fingerprint: [u8; 32],
    pub(crate) fence: u64,
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
    /// The caller's request digest (empty: none). Written with tags 0x07/0x08 when present, so
    /// records without one keep the original encoding.
    pub(crate) digest: &'a [u8],
}

/// A response either as a value to encode or as the encoded bytes found in the log.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Response<'a> {
    Value(&'a StoredResponse),
    Encoded(&'a [u8]),
}

/// One operation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    InProgress {
        head: Head<'a>,
        lease_until: u64,
    },
    Completed {
        head: Head<'a>,
        response: Response<'a>,
    },
    Released {
        scope: &'a [u8],
        key: &'a [u8],
        fence: u64,
    },
    SidePut {
        namespace: &'a [u8],
        key: &'a [u8],
        expires_at: u64,
        value: &'a [u8],
    },
    SideRemove {
        namespace: &'a [u8],
        key: &'a [u8],
    },
    FenceFloor {
        next_fence: u64,
    },
}

/// Why a checksummed payload does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpError {
    UnknownTag(u8),
    Malformed(&'static str),
}

impl From<DecodeError> for OpError {
    fn from(_: DecodeError) -> Self {
        OpError::Malformed("operation cut short")
    }
}

const HEAD_FIXED: usize = 1 + 1 + 32 + 8 + 8 + 8;

fn head_len(head: &Head<'_>) -> usize {
    let digest = if head.digest.is_empty() {
        0
    } else {
        2 + head.digest.len()
    };
    HEAD_FIXED + head.scope.len() + head.key.len() + digest
}

fn response_len(response: &Response<'_>) -> usize {
    match response {
        Response::Encoded(raw) => raw.len(),
        Response::Value(r) => {
            2 + 2
                + r.headers
                    .iter()
                    .map(|(n, v)| 1 + n.len() + 2 + v.len())
                    .sum::<usize>()
                + 4
                + r.body.len()
        }
    }
}

impl Op<'_> {
    /// Exact number of bytes [`Op::encode`] appends.
    pub(crate) fn encoded_len(&self) -> usize {
        1 + match self {
            Op::InProgress { head, .. } => head_len(head) + 8,
            Op::Completed { head, response } => head_len(head) + response_len(response),
            Op::Released { scope, key, .. } => 2 + scope.len() + key.len() + 8,
            Op::SidePut {
                namespace,
                key,
                value,
                ..
            } => 1 + namespace.len() + 2 + key.len() + 8 + 4 + value.len(),
            Op::SideRemove { namespace, key } => 1 + namespace.len() + 2 + key.len(),
            Op::FenceFloor { .. } => 8,
        }
    }

    /// Appends the operation. Lengths must have passed `limits`.
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) {
        let mut e = Encoder::new(buf);
        match self {
            Op::InProgress { head, lease_until } => {
                e.u8(if head.digest.is_empty() {
                    IN_PROGRESS
                } else {
                    IN_PROGRESS_DIGEST
                });
                encode_head(&mut e, head);
                e.u64(*lease_until);
            }
            Op::Completed { head, response } => {
                e.u8(if head.digest.is_empty() {
                    COMPLETED
                } else {
                    COMPLETED_DIGEST
                });
                encode_head(&mut e, head);
                match response {
                    Response::Encoded(raw) => e.raw(raw),
                    Response::Value(r) => encode_response(&mut e, r),
                }
            }
            Op::Released { scope, key, fence } => {
                e.u8(RELEASED);
                e.bytes8(scope);
                e.bytes8(key);
                e.u64(*fence);
            }
            Op::SidePut {
                namespace,
                key,
                expires_at,
                value,
            } => {
                e.u8(SIDE_PUT);
                e.bytes8(namespace);
                e.bytes16(key);
                e.u64(*expires_at);
                e.bytes32(value);
            }
            Op::SideRemove { namespace, key } => {
                e.u8(SIDE_REMOVE);
                e.bytes8(namespace);
                e.bytes16(key);
            }
            Op::FenceFloor { next_fence } => {
                e.u8(FENCE_FLOOR);
                e.u64(*next_fence);
            }
        }
    }
}

fn encode_head(e: &mut Encoder<'_>, head: &Head<'_>) {
    e.bytes8(head.scope);
    e.bytes8(head.key);
    e.raw(&head.fingerprint);
    e.u64(head.fence);
    e.u64(head.created_at);
    e.u64(head.expires_at);
    if !head.digest.is_empty() {
        e.bytes16(head.digest);
    }
}

fn encode_response(e: &mut Encoder<'_>, r: &StoredResponse) {
    e.u16(r.status);
    e.u16(u16::try_from(r.headers.len()).expect("limits bound the header count"));
    for (name, value) in &r.headers {
        e.bytes8(name.as_bytes());
        e.bytes16(value);
    }
    e.bytes32(&r.body);
}

/// A record's scope and key: 1–255 bytes each.
fn record_id<'a>(d: &mut Decoder<'a>) -> Result<(&'a [u8], &'a [u8]), OpError> {
    let scope = d.bytes8()?;
    let key = d.bytes8()?;
    if scope.is_empty() || key.is_empty() {
        return Err(OpError::Malformed("empty scope or key"));
    }
    Ok((scope, key))
}

/// The head of a record operation; `with_digest` for tags 0x07 and 0x08.
fn decode_head<'a>(d: &mut Decoder<'a>, with_digest: bool) -> Result<Head<'a>, OpError> {
    let (scope, key) = record_id(d)?;
    let mut head = Head {
        scope,
        key,
        fingerprint: d.fixed()?,
        fence: d.u64()?,
        created_at: d.u64()?,
        expires_at: d.u64()?,
        digest: &[],
    };
    if with_digest {
        head.digest = d.bytes16()?;
        if head.digest.is_empty() || head.digest.len() > MAX_DIGEST {
            return Err(OpError::Malformed("request digest empty or too long"));
        }
    }
    Ok(head)
}

/// Walks an encoded response, checking its structure, and returns its bytes.
fn decode_response_extent<'a>(d: &mut Decoder<'a>, whole: &'a [u8]) -> Result<&'a [u8], OpError> {
    let start = d.position();
    d.u16()?;
    let count = d.u16()?;
    for _ in 0..count {
        let name = d.bytes8()?;
        if std::str::from_utf8(name).is_err() {
            return Err(OpError::Malformed("header name is not UTF-8"));
        }
        d.bytes16()?;
    }
    d.bytes32()?;
    Ok(&whole[start..d.position()])
}

/// A side record's namespace (1–255 bytes) and key (1–1024 bytes).
fn side_id<'a>(d: &mut Decoder<'a>) -> Result<(&'a [u8], &'a [u8]), OpError> {
    let namespace = d.bytes8()?;
    let key = d.bytes16()?;
    if namespace.is_empty() || key.is_empty() {
        return Err(OpError::Malformed("empty side namespace or key"));
    }
    if key.len() > crate::limits::MAX_SIDE_KEY {
        return Err(OpError::Malformed("side key too long"));
    }
    Ok((namespace, key))
}

/// Decodes every operation in a frame payload, each with its offset and length inside the payload.
/// The payload must be consumed exactly. For the fuzz entry points (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn decode_all(payload: &[u8]) -> Result<Vec<(usize, usize, Op<'_>)>, OpError> {
    let mut ops = Vec::new();
    decode_all_into(payload, &mut ops)?;
    Ok(ops)
}

/// [`decode_all`] into `ops` (cleared first), so that a caller decoding frame after frame reuses one
/// allocation. On error, `ops` holds what decoded before the failure.
pub(crate) fn decode_all_into<'a>(
    payload: &'a [u8],
    ops: &mut Vec<(usize, usize, Op<'a>)>,
) -> Result<(), OpError> {
    ops.clear();
    let mut d = Decoder::new(payload);
    while !d.is_empty() {
        let start = d.position();
        let op = decode_one(&mut d, payload)?;
        ops.push((start, d.position() - start, op));
    }
    if ops.is_empty() {
        return Err(OpError::Malformed("frame without operations"));
    }
    Ok(())
}

fn decode_one<'a>(d: &mut Decoder<'a>, whole: &'a [u8]) -> Result<Op<'a>, OpError> {
    let tag = d.u8()?;
    Ok(match tag {
        IN_PROGRESS | IN_PROGRESS_DIGEST => Op::InProgress {
            head: decode_head(d, tag == IN_PROGRESS_DIGEST)?,
            lease_until: d.u64()?,
        },
        COMPLETED | COMPLETED_DIGEST => Op::Completed {
            head: decode_head(d, tag == COMPLETED_DIGEST)?,
            response: Response::Encoded(decode_response_extent(d, whole)?),
        },
        RELEASED => {
            let (scope, key) = record_id(d)?;
            Op::Released {
                scope,
                key,
                fence: d.u64()?,
            }
        }
        SIDE_PUT => {
            let (namespace, key) = side_id(d)?;
            Op::SidePut {
                namespace,
                key,
                expires_at: d.u64()?,
                value: d.bytes32()?,
            }
        }
        SIDE_REMOVE => {
            let (namespace, key) = side_id(d)?;
            Op::SideRemove { namespace, key }
        }
        FENCE_FLOOR => Op::FenceFloor {
            next_fence: d.u64()?,
        },
        other => return Err(OpError::UnknownTag(other)),
    })
}

/// Decodes the single operation stored at a location, borrowing from `bytes`.
pub(crate) fn decode_at(bytes: &[u8]) -> Result<Op<'_>, OpError> {
    let mut d = Decoder::new(bytes);
    let op = decode_one(&mut d, bytes)?;
    if !d.is_empty() {
        return Err(OpError::Malformed("operation length mismatch"));
    }
    Ok(op)
}

/// The rest of a record snapshot after its head, as [`decode_record_at`] leaves it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RecordTail<'a> {
    /// An in-progress snapshot (tags 0x01 and 0x07), decoded to its end. (Its persisted
    /// `lease_until` is not kept: no decision uses it.)
    InProgress,
    /// A completed snapshot (tags 0x02 and 0x08): its encoded response, still to be decoded and
    /// checked, with [`owned_response`] or [`check_response`].
    Completed { response: &'a [u8] },
}

/// Decodes the record snapshot stored at a location up to its response, in one pass over the
/// bytes, so that a claim can compare fingerprints before building anything. Together with
/// [`owned_response`] or [`check_response`] on a completed snapshot's response, it accepts exactly
/// the record snapshots [`decode_at`] accepts; any other operation is an error.
pub(crate) fn decode_record_at(bytes: &[u8]) -> Result<(Head<'_>, RecordTail<'_>), OpError> {
    let mut d = Decoder::new(bytes);
    let tag = d.u8()?;
    match tag {
        IN_PROGRESS | IN_PROGRESS_DIGEST => {
            let head = decode_head(&mut d, tag == IN_PROGRESS_DIGEST)?;
            d.u64()?;
            if !d.is_empty() {
                return Err(OpError::Malformed("operation length mismatch"));
            }
            Ok((head, RecordTail::InProgress))
        }
        COMPLETED | COMPLETED_DIGEST => {
            let head = decode_head(&mut d, tag == COMPLETED_DIGEST)?;
            Ok((
                head,
                RecordTail::Completed {
                    response: &bytes[d.position()..],
                },
            ))
        }
        RELEASED | SIDE_PUT | SIDE_REMOVE | FENCE_FLOOR => {
            Err(OpError::Malformed("not a record snapshot"))
        }
        other => Err(OpError::UnknownTag(other)),
    }
}

/// Checks an encoded response that must span all of `raw` (the checks [`decode_at`] makes).
pub(crate) fn check_response(raw: &[u8]) -> Result<(), OpError> {
    let mut d = Decoder::new(raw);
    decode_response_extent(&mut d, raw)?;
    if !d.is_empty() {
        return Err(OpError::Malformed("operation length mismatch"));
    }
    Ok(())
}

/// Decodes an encoded response that must span all of `raw` into a value that owns copies of its
/// header values and body, with the checks of [`check_response`], in one pass. For a replay read
/// straight out of a memory map: the copies are the only allocations besides the header list and
/// names, and none of them is shared, so dropping the response touches no reference count.
pub(crate) fn owned_response(raw: &[u8]) -> Result<StoredResponse, OpError> {
    decode_response(raw, Bytes::copy_from_slice)
}

/// Turns an encoded response (a sub-slice of `owner`) into a value whose body shares `owner`'s memory.
pub(crate) fn response_from(owner: &Bytes, raw: &[u8]) -> Result<StoredResponse, OpError> {
    decode_response(raw, |bytes| owner.slice_ref(bytes))
}

/// Decodes an encoded response that must span all of `raw`, turning its header values and body into
/// [`Bytes`] with `bytes_of`.
fn decode_response(
    raw: &[u8],
    bytes_of: impl Fn(&[u8]) -> Bytes,
) -> Result<StoredResponse, OpError> {
    let mut d = Decoder::new(raw);
    let status = d.u16()?;
    let count = usize::from(d.u16()?);
    // A header takes at least 3 bytes (two lengths): never reserve more than the bytes can hold.
    let mut headers = Vec::with_capacity(count.min(raw.len() / 3));
    for _ in 0..count {
        let name = std::str::from_utf8(d.bytes8()?)
            .map_err(|_| OpError::Malformed("header name is not UTF-8"))?;
        headers.push((name.to_owned(), bytes_of(d.bytes16()?)));
    }
    let body = bytes_of(d.bytes32()?);
    if !d.is_empty() {
        return Err(OpError::Malformed("operation length mismatch"));
    }
    Ok(StoredResponse {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> Head<'static> {
        Head {
            scope: b"acct_1",
            key: b"key-1",
            fingerprint: [7; 32],
            fence: 9,
            created_at: 1_000,
            expires_at: 2_000,
            digest: &[],
        }
    }

    fn round_trip(op: Op<'_>) -> Vec<u8> {
        let mut buf = Vec::new();
        op.encode(&mut buf);
        assert_eq!(
            buf.len(),
            op.encoded_len(),
            "encoded_len is exact for {op:?}"
        );
        buf
    }

    #[test]
    fn completed_op_round_trips_with_its_response() {
        let response = StoredResponse::new(201, &b"{\"id\":1}"[..]).with_header("Location", "/p/1");
        let buf = round_trip(Op::Completed {
            head: head(),
            response: Response::Value(&response),
        });
        let owner = Bytes::from(buf);
        let Op::Completed {
            head: h,
            response: Response::Encoded(raw),
        } = decode_at(&owner).unwrap()
        else {
            panic!("wrong op");
        };
        assert_eq!(h, head());
        assert_eq!(response_from(&owner, raw).unwrap(), response);
    }

    #[test]
    fn every_op_kind_has_an_exact_length() {
        round_trip(Op::InProgress {
            head: head(),
            lease_until: 5,
        });
        round_trip(Op::Released {
            scope: b"s",
            key: b"k",
            fence: 1,
        });
        round_trip(Op::SidePut {
            namespace: b"ns",
            key: b"k",
            expires_at: NEVER,
            value: b"v",
        });
        round_trip(Op::SideRemove {
            namespace: b"ns",
            key: b"k",
        });
        round_trip(Op::FenceFloor { next_fence: 3 });
    }

    #[test]
    fn a_request_digest_round_trips_and_changes_only_the_tag_and_head() {
        let with = Head {
            digest: b"\x01digest-bytes",
            ..head()
        };
        let plain = round_trip(Op::InProgress {
            head: head(),
            lease_until: 5,
        });
        assert_eq!(plain[0], IN_PROGRESS, "no digest: the original encoding");
        let buf = round_trip(Op::InProgress {
            head: with,
            lease_until: 5,
        });
        assert_eq!(buf[0], IN_PROGRESS_DIGEST);
        let Op::InProgress {
            head: h,
            lease_until,
        } = decode_at(&buf).unwrap()
        else {
            panic!("wrong op");
        };
        assert_eq!((h, lease_until), (with, 5));
        let response = StoredResponse::new(201, &b"{}"[..]);
        let buf = round_trip(Op::Completed {
            head: with,
            response: Response::Value(&response),
        });
        assert_eq!(buf[0], COMPLETED_DIGEST);
        let owner = Bytes::from(buf);
        let Op::Completed {
            head: h,
            response: Response::Encoded(raw),
        } = decode_at(&owner).unwrap()
        else {
            panic!("wrong op");
        };
        assert_eq!(h, with);
        assert_eq!(response_from(&owner, raw).unwrap(), response);
    }

    /// A record snapshot as the claim path sees it: the head's fields and, if completed, the
    /// response (owned, for comparison).
    type View = (
        Vec<u8>,
        Vec<u8>,
        [u8; 32],
        u64,
        u64,
        u64,
        Vec<u8>,
        Option<StoredResponse>,
    );

    fn view(h: &Head<'_>, response: Option<StoredResponse>) -> View {
        (
            h.scope.to_vec(),
            h.key.to_vec(),
            h.fingerprint,
            h.fence,
            h.created_at,
            h.expires_at,
            h.digest.to_vec(),
            response,
        )
    }

    /// Through `decode_at` and `response_from` (the reading every other path uses).
    fn view_by_decode_at(bytes: &[u8]) -> Option<View> {
        let owner = Bytes::copy_from_slice(bytes);
        match decode_at(&owner).ok()? {
            Op::InProgress { head, .. } => Some(view(&head, None)),
            Op::Completed {
                head,
                response: Response::Encoded(raw),
            } => Some(view(&head, Some(response_from(&owner, raw).ok()?))),
            _ => None,
        }
    }

    /// Through `decode_record_at` and `owned_response`, as a replay reads; `check_response` must
    /// agree with `owned_response`.
    fn view_by_record_at(bytes: &[u8]) -> Option<View> {
        let (head, tail) = decode_record_at(bytes).ok()?;
        match tail {
            RecordTail::InProgress => Some(view(&head, None)),
            RecordTail::Completed { response } => {
                let owned = owned_response(response);
                assert_eq!(
                    check_response(response).is_ok(),
                    owned.is_ok(),
                    "check_response and owned_response disagree on {bytes:?}"
                );
                Some(view(&head, Some(owned.ok()?)))
            }
        }
    }

    #[test]
    fn the_replay_decoding_accepts_and_returns_exactly_what_decode_at_does() {
        let response = StoredResponse::new(201, &b"{\"id\":1}"[..])
            .with_header("Content-Type", "application/json")
            .with_header("Location", "/p/1");
        let digest = Head {
            digest: b"\x01digest",
            ..head()
        };
        let ops = [
            round_trip(Op::Completed {
                head: head(),
                response: Response::Value(&response),
            }),
            round_trip(Op::Completed {
                head: digest,
                response: Response::Value(&response),
            }),
            round_trip(Op::Completed {
                head: head(),
                response: Response::Value(&StoredResponse::new(204, Bytes::new())),
            }),
            round_trip(Op::InProgress {
                head: head(),
                lease_until: 5,
            }),
            round_trip(Op::InProgress {
                head: digest,
                lease_until: 5,
            }),
            round_trip(Op::Released {
                scope: b"s",
                key: b"k",
                fence: 1,
            }),
            round_trip(Op::FenceFloor { next_fence: 3 }),
        ];
        let mut cases = 0;
        for op in &ops {
            let mut variants = vec![op.clone()];
            variants.extend((0..op.len()).map(|n| op[..n].to_vec()));
            let mut longer = op.clone();
            longer.push(0);
            variants.push(longer);
            for at in 0..op.len() {
                for flip in [0x01, 0x80, 0xff] {
                    let mut bad = op.clone();
                    bad[at] ^= flip;
                    variants.push(bad);
                }
            }
            for bytes in variants {
                assert_eq!(
                    view_by_record_at(&bytes),
                    view_by_decode_at(&bytes),
                    "the two decodings differ on {bytes:?}"
                );
                cases += 1;
            }
        }
        assert!(cases > 1000);
        assert!(view_by_record_at(&ops[0]).is_some_and(|v| v.7 == Some(response)));
    }

    #[test]
    fn unknown_op_tag_is_rejected() {
        assert_eq!(decode_all(&[0x7f]).err(), Some(OpError::UnknownTag(0x7f)));
    }

    #[test]
    fn empty_names_are_malformed_in_every_operation() {
        // Found by the frame_decode fuzz target: FORMAT.md says scope, key and side key are never
        // empty, and the writer never writes them empty, but releases and side operations were read.
        let released = [RELEASED, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let side_remove = [SIDE_REMOVE, 0, 0, 0];
        let side_put_empty_key = [SIDE_PUT, 1, b'n', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        for bytes in [&released[..], &side_remove, &side_put_empty_key] {
            assert!(
                matches!(decode_all(bytes), Err(OpError::Malformed(_))),
                "{bytes:?} accepted"
            );
        }
    }

    #[test]
    fn trailing_bytes_after_ops_are_malformed() {
        let buf = round_trip(Op::FenceFloor { next_fence: 3 });
        let mut longer = buf.clone();
        longer.push(IN_PROGRESS);
        assert!(matches!(decode_all(&longer), Err(OpError::Malformed(_))));
        assert_eq!(decode_all(&buf).unwrap().len(), 1);
    }
}
