//! Segment files: naming, the 32-byte header, and positions inside the log.
//!
//! ```text
//! file name  {id:020}.seg      written by the log writer (decimal, zero-padded: names sort like ids)
//!            {id:020}.cseg     written by compaction; live only while the manifest lists it
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

/// Who wrote a segment file, which decides how recovery treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Appended by the log writer.
    Log,
    /// Written by compaction.
    Compacted,
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Log => ".seg",
            Kind::Compacted => ".cseg",
        }
    }
}

/// The file name of segment `id`.
pub(crate) fn file_name(id: u32, kind: Kind) -> String {
    format!("{id:020}{}", kind.suffix())
}

/// The id and kind in a segment file name, or `None` for any other file.
pub(crate) fn parse_file_name(name: &str) -> Option<(u32, Kind)> {
    let (digits, kind) = match name.strip_suffix(Kind::Log.suffix()) {
        Some(digits) => (digits, Kind::Log),
        None => (
            name.strip_suffix(Kind::Compacted.suffix())?,
            Kind::Compacted,
        ),
    };
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id = digits
        .parse::<u64>()
        .ok()
        .and_then(|id| u32::try_from(id).ok())?;
    Some((id, kind))
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

/// A byte position in a segment: segment id in the high half, offset in the low half.
///
/// Positions are only ordered within one segment. Ids do not give replay order (compacted segments
/// get fresh, larger ids but replay first), so a comparison across segments would be meaningless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Pos(pub(crate) u64);

impl Pos {
    pub(crate) fn new(segment: u32, offset: u32) -> Self {
        Pos((u64::from(segment) << 32) | u64::from(offset))
    }

    pub(crate) fn segment(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub(crate) fn offset(self) -> u32 {
        self.0 as u32
    }

    /// Whether `self`, the writer's written or synced position in the active segment, covers `end`.
    /// A position in any other segment is covered: only the active segment has an unsynced suffix.
    pub(crate) fn covers(self, end: Pos) -> bool {
        end.segment() != self.segment() || end.offset() <= self.offset()
    }
}

/// Where one operation lives: the bytes `[offset, offset + len)` of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
        assert_eq!(
            parse_file_name(&file_name(7, Kind::Log)),
            Some((7, Kind::Log))
        );
        assert_eq!(
            parse_file_name(&file_name(7, Kind::Compacted)),
            Some((7, Kind::Compacted))
        );
        assert!(file_name(9, Kind::Log) < file_name(10, Kind::Log));
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
    fn a_position_covers_its_own_segment_up_to_its_offset_and_every_other_segment() {
        let synced = Pos::new(5, 100);
        assert!(synced.covers(Pos::new(5, 100)));
        assert!(!synced.covers(Pos::new(5, 101)));
        assert!(synced.covers(Pos::new(4, u32::MAX)), "older log segment");
        assert!(
            synced.covers(Pos::new(9, 500)),
            "compacted segment with a larger id"
        );
    }
}
