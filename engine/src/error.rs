//! The engine's typed errors.
//!
//! Every error names what failed: the file and offset for I/O and corruption, the (scope, key) for a lost
//! claim, the limit for an oversized input. I/O sources are kept so that callers can tell a full disk
//! from a permission problem.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the engine can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("write", "fdatasync", "open", ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A log file holds bytes that are not a valid log and cannot be a torn tail.
    #[error("corrupt log {path} at offset {offset}: {reason}")]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the damaged frame or header inside that file.
        offset: u64,
        /// What is wrong there.
        reason: Corruption,
    },

    /// Another store (in this or another process) holds the directory open.
    #[error("{path} is locked: another idemlog store has this directory open")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },

    /// An earlier write or fdatasync failed. The store refuses all further work until it is reopened,
    /// because after a failed fsync the kernel may have dropped the dirty pages: retrying could report
    /// success for data that is gone.
    #[error("store is poisoned by an earlier I/O failure and must be reopened: {0}")]
    Poisoned(#[source] Arc<Error>),

    /// The claim behind a token no longer holds the key: it was taken over after its lease expired,
    /// released, completed, or the record outlived its TTL.
    #[error("claim on scope {scope:?} key {key:?} (fence {fence}) no longer holds the key")]
    LeaseLost {
        /// The scope, lossily decoded for display.
        scope: String,
        /// The key, lossily decoded for display.
        key: String,
        /// The fencing token that was rejected.
        fence: u64,
    },

    /// An input is larger than the format or the configured limit allows.
    #[error("{what} is {len} bytes; the limit is {max}")]
    TooLarge {
        /// Which input.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// An input that must not be empty was empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),

    /// An argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),

    /// The store was closed.
    #[error("store is closed")]
    Closed,

    /// The options passed to [`crate::Store::open`] are inconsistent.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, reason: Corruption) -> Self {
        Error::Corrupt {
            path: path.into(),
            offset,
            reason,
        }
    }

    /// True when the store refuses work because an earlier I/O failure poisoned it. The call that hit
    /// the failure already returns this (with the I/O error as its source), not only later calls.
    pub fn is_poisoned(&self) -> bool {
        matches!(self, Error::Poisoned(_))
    }

    /// True when the store handle that returned this error will never work again: it is poisoned
    /// (close it and [`crate::Store::open`] the directory again) or closed. False for errors about
    /// one call (a lost lease, an oversized input, a read error), after which the store still works.
    pub fn store_unusable(&self) -> bool {
        matches!(self, Error::Poisoned(_) | Error::Closed)
    }
}

/// What is wrong with a damaged part of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// The segment file does not start with a valid idemlog segment header.
    BadSegmentHeader,
    /// The segment header names a format version this build cannot read.
    UnsupportedVersion(u32),
    /// The segment header names a different segment than its file name.
    SegmentIdMismatch {
        /// From the file name.
        expected: u64,
        /// From the header.
        found: u64,
    },
    /// A frame header is cut short by the end of the file.
    TruncatedFrame,
    /// A frame header's own checksum does not match.
    HeaderChecksum,
    /// A frame's payload checksum does not match.
    PayloadChecksum,
    /// A frame declares a payload larger than the format allows or than the file holds.
    FrameLength(u64),
    /// A frame passed its checksum but carries a frame tag this build does not know.
    UnknownFrameTag(u8),
    /// A frame passed its checksum but carries an operation tag this build does not know.
    UnknownOpTag(u8),
    /// A frame passed its checksum but its operations do not decode.
    Malformed(&'static str),
    /// A segment the MANIFEST lists does not exist.
    MissingSegment,
    /// Damage before the tail: a later frame proves that the damaged bytes had been made durable.
    DamagedDurableData,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadSegmentHeader => f.write_str("not a valid segment header"),
            Corruption::UnsupportedVersion(v) => write!(f, "unsupported format version {v}"),
            Corruption::SegmentIdMismatch { expected, found } => {
                write!(
                    f,
                    "segment header says id {found}, file name says {expected}"
                )
            }
            Corruption::TruncatedFrame => f.write_str("frame header cut short"),
            Corruption::HeaderChecksum => f.write_str("frame header checksum mismatch"),
            Corruption::PayloadChecksum => f.write_str("frame payload checksum mismatch"),
            Corruption::FrameLength(len) => write!(f, "impossible frame length {len}"),
            Corruption::UnknownFrameTag(t) => write!(f, "unknown frame tag {t:#04x}"),
            Corruption::UnknownOpTag(t) => write!(f, "unknown operation tag {t:#04x}"),
            Corruption::Malformed(what) => write!(f, "malformed frame: {what}"),
            Corruption::MissingSegment => f.write_str("segment listed in MANIFEST is missing"),
            Corruption::DamagedDurableData => f.write_str(
                "damaged frame before the tail (a later frame shows these bytes had been synced)",
            ),
        }
    }
}
