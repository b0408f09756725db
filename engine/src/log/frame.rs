//! Frames: the unit of atomicity in the log.
//!
//! A frame is a 24-byte header followed by its payload (see `FORMAT.md` for the byte layout):
//!
//! ```text
//! 0  u32  payload length
//! 4  u32  CRC-32 (IEEE) of the payload
//! 8  u64  sync mark: bytes of this segment known durable when the frame was encoded
//! 16 u8   frame tag
//! 17 [3]  reserved, zero
//! 20 u32  CRC-32 of header bytes 0..20
//! ```
//!
//! The header has its own checksum so that a damaged length can never send the reader into the middle
//! of unrelated bytes and so that scanning for a later frame after damage costs a 20-byte checksum per
//! candidate position, not a payload's worth. A frame is accepted only if both checksums hold; the
//! operations inside it are then applied together or not at all.

use crate::codec::{Decoder, put_u32_at, put_u64_at};

/// Bytes before the payload.
pub(crate) const HEADER_LEN: usize = 24;

/// The largest payload the format allows. It bounds what opening a damaged log can allocate.
pub(crate) const MAX_PAYLOAD: usize = 64 << 20;

/// The frame tag of a frame whose payload is a sequence of operations (`op.rs`).
pub(crate) const TAG_OPS: u8 = 1;

/// Why bytes at some offset are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameDamage {
    /// Fewer than a header's worth of bytes, or a payload that runs past the end.
    Truncated,
    /// The header checksum fails.
    HeaderChecksum,
    /// The declared payload length exceeds [`MAX_PAYLOAD`].
    Length(u64),
    /// The payload checksum fails.
    PayloadChecksum,
}

/// A frame that passed both checksums.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    pub(crate) tag: u8,
    pub(crate) sync_mark: u64,
    pub(crate) payload: &'a [u8],
}

impl Frame<'_> {
    /// Total bytes on disk, header included.
    pub(crate) fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

/// Appends a frame to `buf`: reserves the header, lets `write_payload` append the payload, then fills in
/// lengths and checksums. Returns the offset in `buf` where the frame starts.
pub(crate) fn encode(
    buf: &mut Vec<u8>,
    tag: u8,
    sync_mark: u64,
    write_payload: impl FnOnce(&mut Vec<u8>),
) -> usize {
    let start = buf.len();
    buf.resize(start + HEADER_LEN, 0);
    write_payload(buf);
    let payload_len = buf.len() - start - HEADER_LEN;
    assert!(payload_len <= MAX_PAYLOAD, "callers bound frame payloads");
    let payload_crc = crc32fast::hash(&buf[start + HEADER_LEN..]);
    // On the stack: this runs once per append.
    let mut header = [0u8; HEADER_LEN];
    put_u32_at(&mut header, 0, payload_len as u32);
    put_u32_at(&mut header, 4, payload_crc);
    put_u64_at(&mut header, 8, sync_mark);
    header[16] = tag;
    let header_crc = crc32fast::hash(&header[..HEADER_LEN - 4]);
    put_u32_at(&mut header, HEADER_LEN - 4, header_crc);
    buf[start..start + HEADER_LEN].copy_from_slice(&header);
    start
}

/// Decodes the frame at the start of `bytes` (which may continue past it).
pub(crate) fn decode(bytes: &[u8]) -> Result<Frame<'_>, FrameDamage> {
    let header = bytes.get(..HEADER_LEN).ok_or(FrameDamage::Truncated)?;
    let mut d = Decoder::new(header);
    let fields = (|| Ok::<_, crate::codec::DecodeError>((d.u32()?, d.u32()?, d.u64()?, d.u8()?)))();
    let (payload_len, payload_crc, sync_mark, tag) = fields.map_err(|_| FrameDamage::Truncated)?;
    let header_crc = u32::from_le_bytes([header[20], header[21], header[22], header[23]]);
    if crc32fast::hash(&header[..HEADER_LEN - 4]) != header_crc {
        return Err(FrameDamage::HeaderChecksum);
    }
    let payload_len = payload_len as usize;
    if payload_len > MAX_PAYLOAD {
        return Err(FrameDamage::Length(payload_len as u64));
    }
    let payload = bytes
        .get(HEADER_LEN..HEADER_LEN + payload_len)
        .ok_or(FrameDamage::Truncated)?;
    if crc32fast::hash(payload) != payload_crc {
        return Err(FrameDamage::PayloadChecksum);
    }
    Ok(Frame {
        tag,
        sync_mark,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut buf = Vec::new();
        encode(&mut buf, TAG_OPS, 42, |b| b.extend_from_slice(b"hello"));
        buf
    }

    #[test]
    fn encoded_frame_decodes_to_its_payload() {
        let buf = sample();
        let frame = decode(&buf).unwrap();
        assert_eq!(frame.tag, TAG_OPS);
        assert_eq!(frame.sync_mark, 42);
        assert_eq!(frame.payload, b"hello");
        assert_eq!(frame.encoded_len(), buf.len());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let buf = sample();
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut damaged = buf.clone();
                damaged[byte] ^= 1 << bit;
                assert!(
                    decode(&damaged).is_err(),
                    "flip at byte {byte} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        let buf = sample();
        for len in 0..buf.len() {
            assert_eq!(decode(&buf[..len]).err(), Some(FrameDamage::Truncated));
        }
    }

    #[test]
    fn zeros_are_never_a_frame() {
        // Recovery reads a run of zeros as the writer's preallocated space, never as frames.
        assert_eq!(
            decode(&[0u8; 4096]).err(),
            Some(FrameDamage::HeaderChecksum)
        );
    }
}
