//! The response stored for a completed key and replayed to every retry.

use bytes::Bytes;

/// A final HTTP-style response: status, headers and body, replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// Status code, e.g. 201.
    pub status: u16,
    /// Header name/value pairs, in order. Names are stored as given; values are raw bytes.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
}

impl StoredResponse {
    /// A response with a status and body and no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The first header with this name, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }
}
