//! Between the store's types and the database's rows: input checks (with the engine's limits),
//! the encoding of stored response headers, record writes as statement arrays, and what a row of
//! the claim statement means.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use idemlog::{MAX_HEADER_NAME, MAX_HEADER_VALUE, MAX_HEADERS, MAX_KEY, MAX_SCOPE, MAX_VALUE};
pub(super) use idemlog::{MAX_NAMESPACE, MAX_SIDE_KEY};

use super::batch::finish::{Put, Removal};
use super::error::Fail;
use crate::store::{Expiry, HeldClaim, RecordWrite, StoreError, StoredResponse};

pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn rejected(what: &str, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Rejected(format!("{what} {problem}"))
}

pub(super) fn check_text(what: &str, s: &str, max: usize) -> Result<(), StoreError> {
    if s.is_empty() {
        return Err(rejected(what, "is empty"));
    }
    if s.len() > max {
        return Err(rejected(
            what,
            format_args!("is {} bytes; at most {max}", s.len()),
        ));
    }
    if s.contains('\0') {
        return Err(rejected(what, "contains a NUL character"));
    }
    Ok(())
}

pub(super) fn check_key(scope: &str, key: &str) -> Result<(), StoreError> {
    check_text("scope", scope, MAX_SCOPE)?;
    check_text("idempotency key", key, MAX_KEY)
}

pub(super) fn check_write(w: &RecordWrite) -> Result<(), StoreError> {
    check_text("record namespace", w.namespace, MAX_NAMESPACE)?;
    check_text("record key", &w.key, MAX_SIDE_KEY)?;
    match &w.value {
        Some(v) if v.len() > MAX_VALUE => Err(rejected(
            "record value",
            format_args!("is {} bytes; at most {}", v.len(), MAX_VALUE),
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_response(r: &StoredResponse) -> Result<(), StoreError> {
    if r.headers.len() > MAX_HEADERS {
        return Err(rejected(
            "response",
            format_args!("has {} headers; at most {MAX_HEADERS}", r.headers.len()),
        ));
    }
    for (name, value) in &r.headers {
        check_text("header name", name, MAX_HEADER_NAME)?;
        if value.len() > MAX_HEADER_VALUE {
            return Err(rejected(
                "header value",
                format_args!("is {} bytes; at most {MAX_HEADER_VALUE}", value.len()),
            ));
        }
    }
    if r.body.len() > MAX_VALUE {
        return Err(rejected(
            "response body",
            format_args!("is {} bytes; at most {}", r.body.len(), MAX_VALUE),
        ));
    }
    Ok(())
}

/// Headers as stored in `keys.headers`: `[count u32]` then per header `[len u32][name][len u32][value]`
/// (big-endian lengths).
pub(super) fn encode_headers(headers: &[(String, Bytes)]) -> Vec<u8> {
    let size: usize = headers.iter().map(|(n, v)| 8 + n.len() + v.len()).sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

pub(super) fn decode_headers(bytes: &[u8]) -> Result<Vec<(String, Bytes)>, StoreError> {
    let bad = || StoreError::Internal("stored response headers do not parse".to_string());
    let mut rest = bytes;
    let mut take = |n: usize| -> Result<&[u8], StoreError> {
        if rest.len() < n {
            return Err(bad());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let len = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = len(take(4)?);
    let mut headers = Vec::with_capacity(count.min(MAX_HEADERS));
    for _ in 0..count {
        let n = len(take(4)?);
        let name = String::from_utf8(take(n)?.to_vec()).map_err(|_| bad())?;
        let n = len(take(4)?);
        let value = Bytes::copy_from_slice(take(n)?);
        headers.push((name, value));
    }
    Ok(headers)
}

pub(super) fn response_from(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let status = status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| StoreError::Internal("completed key without a status".to_string()))?;
    Ok(StoredResponse {
        status,
        headers: decode_headers(headers.as_deref().unwrap_or(&0u32.to_be_bytes()))?,
        body: Bytes::from(body.unwrap_or_default()),
    })
}

/// Record writes as the arrays the statements unnest; the last write to a `(namespace, key)` wins.
#[derive(Default)]
pub(super) struct WriteArrays<'a> {
    pub(super) ns: Vec<&'a str>,
    pub(super) keys: Vec<&'a str>,
    pub(super) values: Vec<&'a [u8]>,
    pub(super) after_ms: Vec<Option<i64>>,
    pub(super) at_ms: Vec<Option<i64>>,
    pub(super) del_ns: Vec<&'a str>,
    pub(super) del_keys: Vec<&'a str>,
}

pub(super) fn expiry_params(expiry: Expiry) -> (Option<i64>, Option<i64>) {
    match expiry {
        Expiry::Never => (None, None),
        Expiry::After(d) => (Some(millis(d)), None),
        Expiry::AtMs(ms) => (None, Some(to_i64(ms))),
    }
}

impl<'a> WriteArrays<'a> {
    pub(super) fn new(writes: &'a [RecordWrite]) -> Result<Self, StoreError> {
        let mut a = WriteArrays::default();
        for w in last_writes(writes)? {
            match &w.value {
                Some(v) => {
                    let (after, at) = expiry_params(w.expiry);
                    a.ns.push(w.namespace);
                    a.keys.push(&w.key);
                    a.values.push(v);
                    a.after_ms.push(after);
                    a.at_ms.push(at);
                }
                None => {
                    a.del_ns.push(w.namespace);
                    a.del_keys.push(&w.key);
                }
            }
        }
        Ok(a)
    }
}

/// Longest request digest stored with a key (the engine's limit).
pub(super) const MAX_REQUEST_DIGEST: usize = idemlog::MAX_REQUEST_DIGEST;

/// A completion's record writes, checked and owned for its queued job: the puts, and the
/// removals; the last write to a `(namespace, key)` wins.
pub(super) fn owned_writes(writes: &[RecordWrite]) -> Result<(Vec<Put>, Vec<Removal>), StoreError> {
    let mut puts = Vec::with_capacity(writes.len());
    let mut removals = Vec::new();
    for w in last_writes(writes)? {
        match &w.value {
            Some(value) => {
                let (after_ms, at_ms) = expiry_params(w.expiry);
                puts.push(Put {
                    namespace: w.namespace,
                    key: w.key.clone(),
                    value: value.clone(),
                    after_ms,
                    at_ms,
                });
            }
            None => removals.push((w.namespace, w.key.clone())),
        }
    }
    Ok((puts, removals))
}

/// The writes that count, checked: of several to one `(namespace, key)`, the last.
fn last_writes(writes: &[RecordWrite]) -> Result<Vec<&RecordWrite>, StoreError> {
    if let [only] = writes {
        check_write(only)?;
        return Ok(vec![only]);
    }
    let mut last: HashMap<(&str, &str), usize> = HashMap::with_capacity(writes.len());
    for (i, w) in writes.iter().enumerate() {
        check_write(w)?;
        last.insert((w.namespace, w.key.as_str()), i);
    }
    Ok(writes
        .iter()
        .enumerate()
        .filter(|(i, w)| last[&(w.namespace, w.key.as_str())] == *i)
        .map(|(_, w)| w)
        .collect())
}

pub(super) fn lease_lost(token: &HeldClaim) -> Fail {
    Fail::Store(StoreError::LeaseLost {
        scope: token.scope.clone(),
        key: token.key.clone(),
        fence: token.fence,
    })
}

pub(super) fn fence_of(token: &HeldClaim) -> i64 {
    to_i64(token.fence)
}
