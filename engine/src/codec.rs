//! Fixed-width little-endian integers and length-prefixed byte strings.
//!
//! This is the only place where the on-disk format turns numbers into bytes and back: every other module
//! encodes through [`Encoder`] and decodes through [`Decoder`], so the byte order and the width of each
//! length prefix are decided once. Decoding never panics and never reads past its slice; running short
//! is reported as [`DecodeError`], which the caller turns into a corruption error naming file and offset.

/// Appends fixed-width little-endian values to a byte vector.
pub(crate) struct Encoder<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Encoder<'a> {
    pub(crate) fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// A byte string of at most 255 bytes behind a `u8` length. Callers validate the length first
    /// (see `limits`); a longer string here is a broken invariant.
    pub(crate) fn bytes8(&mut self, bytes: &[u8]) {
        let len = u8::try_from(bytes.len()).expect("bytes8 caller validated the length");
        self.u8(len);
        self.raw(bytes);
    }

    /// A byte string of at most 65,535 bytes behind a `u16` length.
    pub(crate) fn bytes16(&mut self, bytes: &[u8]) {
        let len = u16::try_from(bytes.len()).expect("bytes16 caller validated the length");
        self.u16(len);
        self.raw(bytes);
    }

    /// A byte string behind a `u32` length.
    pub(crate) fn bytes32(&mut self, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).expect("bytes32 caller validated the length");
        self.u32(len);
        self.raw(bytes);
    }
}

/// Overwrites a little-endian `u32` at `at` in an already encoded buffer (used to patch lengths and
/// checksums after the payload is known).
pub(crate) fn put_u32_at(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Overwrites a little-endian `u64` at `at`.
pub(crate) fn put_u64_at(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The input ended before a value was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeError {
    /// Offset, relative to the start of the decoder's slice, of the value that did not fit.
    pub(crate) at: usize,
}

/// Reads fixed-width little-endian values from a slice, tracking its position.
pub(crate) struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or(DecodeError { at: self.pos })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        self.array()
    }

    pub(crate) fn bytes8(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u8()? as usize;
        self.take(len)
    }

    pub(crate) fn bytes16(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u16()? as usize;
        self.take(len)
    }

    pub(crate) fn bytes32(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_little_endian() {
        let mut buf = Vec::new();
        let mut e = Encoder::new(&mut buf);
        e.u8(7);
        e.u16(0x0102);
        e.u32(0x0304_0506);
        e.u64(0x0708_090a_0b0c_0d0e);
        e.bytes8(b"key");
        e.bytes32(b"body");
        assert_eq!(&buf[1..3], &[0x02, 0x01], "u16 is little-endian");
        let mut d = Decoder::new(&buf);
        assert_eq!(d.u8(), Ok(7));
        assert_eq!(d.u16(), Ok(0x0102));
        assert_eq!(d.u32(), Ok(0x0304_0506));
        assert_eq!(d.u64(), Ok(0x0708_090a_0b0c_0d0e));
        assert_eq!(d.bytes8(), Ok(&b"key"[..]));
        assert_eq!(d.bytes32(), Ok(&b"body"[..]));
        assert!(d.is_empty());
    }

    #[test]
    fn short_input_is_an_error_not_a_panic() {
        let mut d = Decoder::new(&[5, b'a', b'b']);
        assert_eq!(d.bytes8(), Err(DecodeError { at: 1 }));
        let mut d = Decoder::new(&[0xff, 0xff, 0xff, 0xff]);
        assert!(d.bytes32().is_err());
    }
}
