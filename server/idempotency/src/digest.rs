//! The request digest: what a key's record keeps of its request so that a reused key with another
//! request can be answered with *which* fields differ (`differing_fields` in the 422), without
//! storing the request body and without ever revealing a value.
//!
//! Stored with the record, in the log or the database, never in memory. The layer hands it to the
//! store as a function ([`crate::ClaimExtras::request_digest`]): the embedded store calls it only for a
//! claim that writes a record, so a replay, a 409 or a 422 does not pay for its hashes; PostgreSQL,
//! whose claim is one statement, calls it for every claim.
//! It holds 8-byte truncated SHA-256 digests of the method, path, query, content type and whole body
//! (as the fingerprint sees it), and, for a JSON body, the JSON Pointer (RFC 6901) of every leaf
//! member with an 8-byte digest of the pointer and the member's canonical value. A leaf is a
//! scalar, an empty array or an empty object. The pointers are kept as text because a member that
//! *disappeared* can only be named from the stored side; they are the request's structure (member
//! names and array indices), never its values.
//!
//! Bounds: at most [`MAX_MEMBERS`] leaves and [`MAX_POINTER_BYTES`] bytes of pointers. A bigger
//! JSON body keeps no member list, and a 422 about it carries no `differing_fields` (a change in
//! method, path, query or content type is still detected by the fingerprint, as always).
//!
//! ```text
//! digest := version:u8 (1) method:[8] path:[8] query:[8] content_type:[8] body:[8] kind:u8 members
//! kind   := 0 body not JSON (compared as a whole) | 1 JSON with a member list | 2 JSON, too big
//! members (kind 1 only) := count:u16 (pointer:b16 value:[8])×count
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use axum::http::{HeaderMap, Method};
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::fingerprint::{self, FingerprintMode, Json, JsonBody};

/// Most leaf members a JSON body may have for its member list to be kept.
pub const MAX_MEMBERS: usize = 64;
/// Most bytes of JSON Pointers kept per request.
pub const MAX_POINTER_BYTES: usize = 2048;

const VERSION: u8 = 1;
const NOT_JSON: u8 = 0;
const MEMBERS: u8 = 1;
const TOO_BIG: u8 = 2;

fn short(domain: &[u8], parts: &[&[u8]]) -> [u8; 8] {
    let mut hash = Sha256::new();
    hash.update(domain);
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    let full = hash.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&full[..8]);
    out
}

/// The digest of a request (see the module docs).
pub fn request_digest(
    mode: FingerprintMode,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Bytes {
    let json = fingerprint::parse_body(mode, headers, body);
    request_digest_of(method, path, query, headers, body, json.as_ref())
}

/// [`request_digest`] of a body already parsed with [`fingerprint::parse_body`].
pub fn request_digest_of(
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
    json: Option<&JsonBody>,
) -> Bytes {
    let media = fingerprint::media_type(headers);
    request_digest_with_media(method, path, query, media.as_deref(), body, json)
}

/// [`request_digest_of`] with the request's media type already normalised
/// ([`fingerprint::media_type`]).
pub(crate) fn request_digest_with_media(
    method: &Method,
    path: &str,
    query: Option<&str>,
    media: Option<&str>,
    body: &[u8],
    json: Option<&JsonBody>,
) -> Bytes {
    // Room for the five short digests and a few members without growing.
    let mut out = Vec::with_capacity(128);
    out.push(VERSION);
    out.extend_from_slice(&short(b"method", &[method.as_str().as_bytes()]));
    out.extend_from_slice(&short(b"path", &[path.as_bytes()]));
    match query {
        Some(q) => out.extend_from_slice(&short(b"query", &[b"1", q.as_bytes()])),
        None => out.extend_from_slice(&short(b"query", &[b"0"])),
    }
    out.extend_from_slice(&short(
        b"content-type",
        &[media.unwrap_or("").as_bytes(), &[u8::from(media.is_some())]],
    ));
    let Some(json) = json else {
        out.extend_from_slice(&short(b"body", &[b"B", body]));
        out.push(NOT_JSON);
        return out.into();
    };
    out.extend_from_slice(&short(b"body", &[b"J", &json.canonical]));
    // The leaves go straight into `out` after a count patched in at the end; past a bound, the
    // members are cut back off and the digest says so instead.
    let members_at = out.len();
    out.push(MEMBERS);
    out.extend_from_slice(&[0, 0]);
    let mut leaves = Leaves {
        out: &mut out,
        budget: Budget::default(),
        canonical: Vec::with_capacity(32),
    };
    if leaves.collect(&json.value, &mut String::new()).is_none() {
        out.truncate(members_at);
        out.push(TOO_BIG);
        return out.into();
    }
    // Every leaf counted in the budget was written (past the bound nothing is kept).
    let count = leaves.budget.members as u16;
    out[members_at + 1..members_at + 3].copy_from_slice(&count.to_le_bytes());
    out.into()
}

#[derive(Default)]
struct Budget {
    members: usize,
    pointer_bytes: usize,
}

/// The member list of a digest being written: each leaf as its pointer's length, the pointer and
/// the leaf's short digest, appended to `out` in document order.
struct Leaves<'a> {
    out: &'a mut Vec<u8>,
    /// Leaves written so far (`members`) and their pointers' bytes.
    budget: Budget,
    /// The leaf's canonical form, one buffer reused for every leaf.
    canonical: Vec<u8>,
}

impl Leaves<'_> {
    /// Adds the leaves under `value` (at `pointer`); `None` once a bound is passed.
    fn collect(&mut self, value: &Json, pointer: &mut String) -> Option<()> {
        match value {
            Json::Object(map) if !map.is_empty() => {
                for (name, child) in map {
                    let len = pointer.len();
                    pointer.push('/');
                    push_token(pointer, name);
                    self.collect(child, pointer)?;
                    pointer.truncate(len);
                }
            }
            Json::Array(items) if !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    let len = pointer.len();
                    // Writing to a `String` cannot fail.
                    let _ = write!(pointer, "/{i}");
                    self.collect(child, pointer)?;
                    pointer.truncate(len);
                }
            }
            leaf => {
                self.budget.members += 1;
                self.budget.pointer_bytes += pointer.len();
                if self.budget.members > MAX_MEMBERS
                    || self.budget.pointer_bytes > MAX_POINTER_BYTES
                {
                    return None;
                }
                self.canonical.clear();
                fingerprint::canonical_json(leaf, &mut self.canonical);
                self.out
                    .extend_from_slice(&(pointer.len() as u16).to_le_bytes());
                self.out.extend_from_slice(pointer.as_bytes());
                self.out
                    .extend_from_slice(&short(b"member", &[pointer.as_bytes(), &self.canonical]));
            }
        }
        Some(())
    }
}

/// Appends a member name as a JSON Pointer token (RFC 6901): `~` as `~0`, `/` as `~1`, written
/// straight into the pointer rather than through two `replace` copies per member.
fn push_token(pointer: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

/// A decoded digest.
struct Parsed<'a> {
    method: &'a [u8],
    path: &'a [u8],
    query: &'a [u8],
    content_type: &'a [u8],
    body: &'a [u8],
    kind: u8,
    members: BTreeMap<&'a str, &'a [u8]>,
}

fn parse(raw: &[u8]) -> Option<Parsed<'_>> {
    let (&version, rest) = raw.split_first()?;
    if version != VERSION || rest.len() < 41 {
        return None;
    }
    let (fixed, rest) = rest.split_at(40);
    let (&kind, mut rest) = rest.split_first()?;
    let mut members = BTreeMap::new();
    if kind == MEMBERS {
        let count = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?);
        rest = &rest[2..];
        for _ in 0..count {
            let len = usize::from(u16::from_le_bytes(rest.get(..2)?.try_into().ok()?));
            let pointer = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
            let digest = rest.get(2 + len..10 + len)?;
            members.insert(pointer, digest);
            rest = &rest[10 + len..];
        }
    }
    Some(Parsed {
        method: &fixed[..8],
        path: &fixed[8..16],
        query: &fixed[16..24],
        content_type: &fixed[24..32],
        body: &fixed[32..40],
        kind,
        members,
    })
}

/// What differs between the request a key was claimed with (`stored`) and a new one (`new`): a
/// sorted list of JSON Pointers of body members whose values changed, appeared or disappeared,
/// plus `method`, `path`, `query` and `content-type` when those differ, and `""` when a body
/// differs but cannot be compared member by member. `None` when the stored record has no usable
/// digest or a body was too big for a member list.
pub fn differing_fields(stored: &[u8], new: &[u8]) -> Option<Vec<String>> {
    let (old, new) = (parse(stored)?, parse(new)?);
    let mut out = BTreeSet::new();
    for (name, a, b) in [
        ("method", old.method, new.method),
        ("path", old.path, new.path),
        ("query", old.query, new.query),
        ("content-type", old.content_type, new.content_type),
    ] {
        if a != b {
            out.insert(name.to_owned());
        }
    }
    if old.body != new.body {
        match (old.kind, new.kind) {
            (TOO_BIG, _) | (_, TOO_BIG) => return None,
            (MEMBERS, MEMBERS) => {
                for (pointer, digest) in &old.members {
                    if new.members.get(pointer) != Some(digest) {
                        out.insert((*pointer).to_owned());
                    }
                }
                for pointer in new.members.keys() {
                    if !old.members.contains_key(pointer) {
                        out.insert((*pointer).to_owned());
                    }
                }
                if out.iter().all(|f| !f.is_empty() && !f.starts_with('/')) {
                    // Same members, different body bytes (hash truncation aside: never): whole.
                    out.insert(String::new());
                }
            }
            _ => {
                out.insert(String::new());
            }
        }
    }
    Some(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use axum::http::header::CONTENT_TYPE;

    fn json() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h
    }

    fn d(body: &str) -> Bytes {
        request_digest(
            FingerprintMode::CanonicalJson,
            &Method::POST,
            "/payments",
            None,
            &json(),
            body.as_bytes(),
        )
    }

    fn diff(a: &str, b: &str) -> Option<Vec<String>> {
        differing_fields(&d(a), &d(b))
    }

    #[test]
    fn changed_appeared_and_disappeared_members_are_named_sorted() {
        assert_eq!(
            diff(
                r#"{"amount":100,"currency":"BRL"}"#,
                r#"{"currency":"BRL","amount":250}"#
            ),
            Some(vec!["/amount".to_owned()])
        );
        assert_eq!(
            diff(
                r#"{"amount":100,"currency":"BRL"}"#,
                r#"{"amount":1,"currency":"USD"}"#
            ),
            Some(vec!["/amount".to_owned(), "/currency".to_owned()])
        );
        assert_eq!(
            diff(r#"{"a":1,"gone":true}"#, r#"{"a":1,"new":null}"#),
            Some(vec!["/gone".to_owned(), "/new".to_owned()])
        );
        assert_eq!(
            diff(
                r#"{"items":[{"sku":"x","n":1}]}"#,
                r#"{"items":[{"sku":"y","n":1}]}"#
            ),
            Some(vec!["/items/0/sku".to_owned()])
        );
        assert_eq!(
            diff(r#"{"a/b":1,"m~":2}"#, r#"{"a/b":2,"m~":3}"#),
            Some(vec!["/a~1b".to_owned(), "/m~0".to_owned()])
        );
        assert_eq!(
            diff(r#"{"~1/":[1]}"#, r#"{"~1/":[2]}"#),
            Some(vec!["/~01~1/0".to_owned()]),
            "an escape's own characters are not escaped twice"
        );
        assert_eq!(
            diff(r#"{"amount":100.00}"#, r#"{"amount":1e2}"#),
            Some(vec![])
        );
    }

    #[test]
    fn no_value_is_ever_in_the_digest_or_the_answer() {
        let digest = d(r#"{"card":"4111111111111111"}"#);
        assert!(!digest.windows(16).any(|w| w == b"4111111111111111"));
        let fields = diff(r#"{"card":"4111"}"#, r#"{"card":"5555"}"#).unwrap();
        assert_eq!(fields, vec!["/card".to_owned()]);
    }

    #[test]
    fn method_path_query_and_content_type_are_named() {
        let other = request_digest(
            FingerprintMode::CanonicalJson,
            &Method::PUT,
            "/other",
            Some("x=1"),
            &HeaderMap::new(),
            b"{}",
        );
        assert_eq!(
            differing_fields(&d("{}"), &other),
            Some(
                ["", "content-type", "method", "path", "query"]
                    .map(String::from)
                    .to_vec()
            )
        );
    }

    /// A JSON object with one member more than a digest lists.
    fn past_the_member_bound() -> String {
        format!(
            "{{{}}}",
            (0..=MAX_MEMBERS)
                .map(|i| format!("\"m{i}\":{i}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    }

    #[test]
    fn non_json_bodies_are_whole_and_big_ones_have_no_list() {
        assert_eq!(diff("not json", "{}"), Some(vec![String::new()]));
        let big = past_the_member_bound();
        assert_eq!(diff(&big, r#"{"m0":1}"#), None);
        assert_eq!(diff(&big, &big), Some(vec![]));
        assert_eq!(differing_fields(b"", &d("{}")), None);
    }

    #[test]
    fn the_digest_of_a_known_request_keeps_its_bytes() {
        // Digests are stored with records: a change of their bytes would make every key stored
        // before it answer a reused key with wrong `differing_fields`. These bytes were taken from
        // the code before its pointer building was rewritten.
        let digest =
            d(r#"{"amount":100.00,"currency":"BRL","items":[{"sku":"x","m/~n":true},[],{}]}"#);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "011c571547a83088a80298785910de2316ae5209c6015eda700432c4ab2dfef1b94ae2d9f61181a69501060007002f616d6f756e7410777176b6026e4709002f63757272656e6379a92ad7d277fc78cf0f002f6974656d732f302f6d7e317e306e791926885c0284910c002f6974656d732f302f736b75f7696bc135466b3708002f6974656d732f313675f769d17ab02d08002f6974656d732f322dae8ad0d41e9be0"
        );
    }

    #[test]
    fn the_digest_of_a_body_past_the_member_bound_keeps_its_bytes() {
        // The members are written as they are found and cut back off past the bound: what is
        // left must be the digest the code before that produced (no list, the too-big mark).
        let big = past_the_member_bound();
        let hex: String = d(&big).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "011c571547a83088a80298785910de2316ae5209c6015eda700432c4ab2dfef1b9f724a2d5136955a702"
        );
    }
}
