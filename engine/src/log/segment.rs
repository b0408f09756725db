//! Segment files: naming, the 32-byte header, and positions inside the log.
//!
//! ```text
//! file name  {id:020}.seg      (decimal, zero-padded, so names sort like ids)
//! 0  [8] magic "IDEMLOG\0"
//! 8  u32 format version (1)
//! 12 u32 reserved, zero
//! 16 u64 segment id (must match the file name)
//! 24 u32 reserved, zero
//! 28 u32 CRC-32 of bytes 0..28
//! 32 frames…
//! ```

use crate::codec::{Decoder, Encoder, put_u32_at};
use crate::error::Corruption;

/// Bytes before the first frame.
pub(crate) const HEADER_LEN: usize = 32;
const MAGIC: &[u8; 8] = b"IDEMLOG\0";
/// The format version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
const SUFFIX: &str = ".seg";

/// The file name of segment `id`.
pub(crate) fn file_name(id: u32) -> String {
    format!("{id:020}{SUFFIX}")
}

/// The id in a segment file name, or `None` for any other file.
pub(crate) fn parse_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|id| u32::try_from(id).ok())
}

/// The header of segment `id`.
pub(crate) fn encode_header(id: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN);
    let mut e = Encoder::new(&mut buf);
    e.raw(MAGIC);
    e.u32(VERSION);
    e.u32(0);
    e.u64(u64::from(id));
    e.u32(0);
    e.u32(0);
    let crc = crc32fast::hash(&buf[..HEADER_LEN - 4]);
    put_u32_at(&mut buf, HEADER_LEN - 4, crc);
    buf
}

/// Checks that `bytes` start with the header of segment `id`.
pub(crate) fn check_header(bytes: &[u8], id: u32) -> Result<(), Corruption> {
    let header = bytes
        .get(..HEADER_LEN)
        .ok_or(Corruption::BadSegmentHeader)?;
    let stored_crc = u32::from_le_bytes([header[28], header[29], header[30], header[31]]);
    if &header[..8] != MAGIC || crc32fast::hash(&header[..HEADER_LEN - 4]) != stored_crc {
        return Err(Corruption::BadSegmentHeader);
    }
    let mut d = Decoder::new(&header[8..]);
    let version = d.u32().map_err(|_| Corruption::BadSegmentHeader)?;
    if version != VERSION {
        return Err(Corruption::UnsupportedVersion(version));
    }
    d.u32().map_err(|_| Corruption::BadSegmentHeader)?;
    let found = d.u64().map_err(|_| Corruption::BadSegmentHeader)?;
    if found != u64::from(id) {
        return Err(Corruption::SegmentIdMismatch {
            expected: u64::from(id),
            found,
        });
    }
    Ok(())
}

/// A byte position in the log: segment id in the high half, offset in the low half, so that positions
/// compare in log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pos(pub(crate) u64);

impl Pos {
    pub(crate) fn new(segment: u32, offset: u32) -> Self {
        Pos((u64::from(segment) << 32) | u64::from(offset))
    }
}

/// Where one operation lives: the bytes `[offset, offset + len)` of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) segment: u32,
    pub(crate) offset: u32,
    pub(crate) len: u32,
}

impl Loc {
    /// The position just after the operation: once the log is durable up to here, so is the
    /// operation's whole frame (flushes always cover whole frames).
    pub(crate) fn end(&self) -> Pos {
        Pos::new(self.segment, self.offset + self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_like_ids() {
        assert_eq!(parse_file_name(&file_name(7)), Some(7));
        assert!(file_name(9) < file_name(10));
        assert_eq!(parse_file_name("LOCK"), None);
        assert_eq!(parse_file_name("0000000000000000000x.seg"), None);
    }

    #[test]
    fn header_is_checked_for_magic_crc_and_id() {
        let h = encode_header(3);
        assert_eq!(h.len(), HEADER_LEN);
        assert_eq!(check_header(&h, 3), Ok(()));
        assert!(matches!(
            check_header(&h, 4),
            Err(Corruption::SegmentIdMismatch { .. })
        ));
        let mut bad = h.clone();
        bad[20] ^= 1;
        assert_eq!(check_header(&bad, 3), Err(Corruption::BadSegmentHeader));
        assert_eq!(check_header(&h[..10], 3), Err(Corruption::BadSegmentHeader));
    }

    #[test]
    fn positions_order_by_segment_then_offset() {
        assert!(Pos::new(1, u32::MAX) < Pos::new(2, 0));
        assert!(Pos::new(2, 5) < Pos::new(2, 6));
    }
}
