//! `MANIFEST`: which compacted segments are live and where the writer's log begins.
//!
//! ```text
//! 0  [8]  magic "IDEMMANI"
//! 8  u32  format version (1)
//! 12 u32  first_tail: log segments (.seg) with an id at least this are replayed after the base
//! 16 u64  fence floor: the next fencing token is at least this
//! 24 u32  count
//! 28 u32×count  base: compacted segments (.cseg), in replay order
//! …  u32  CRC-32 of everything before
//! ```
//!
//! Replay order is the base segments in the listed order, then every log segment with
//! `id >= first_tail` in id order. Every other segment file is garbage left by a compaction that
//! crashed before its switch (outputs) or after it (inputs), and is deleted at open. A missing manifest
//! means no compaction ever finished: an empty base and `first_tail = 0`.
//!
//! The manifest is only ever replaced whole through [`crate::storage::write_atomic`] (temporary file,
//! fdatasync, rename, directory fsync), so a crash leaves either the old or the new one. Replacing it is
//! the single commit point of a compaction. A failure before the rename switched nothing (the caller
//! may carry on); a failure of the rename or of the directory sync after it leaves unknown which
//! manifest a restart will read ([`Switched`]).

use std::io;
use std::path::Path;

use crate::codec::{Decoder, Encoder};
use crate::error::{Corruption, Error, Result};
use crate::storage::{AtomicWriteError, Storage, atomic_tmp_path, replace_atomic};

/// File name inside the data directory.
pub(crate) const FILE: &str = "MANIFEST";
const MAGIC: &[u8; 8] = b"IDEMMANI";
const VERSION: u32 = 1;

/// The manifest's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    pub(crate) first_tail: u32,
    pub(crate) fence_floor: u64,
    pub(crate) base: Vec<u32>,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(32 + 4 * self.base.len());
        let mut e = Encoder::new(&mut buf);
        e.raw(MAGIC);
        e.u32(VERSION);
        e.u32(self.first_tail);
        e.u64(self.fence_floor);
        e.u32(u32::try_from(self.base.len()).expect("segment counts fit in u32"));
        for id in &self.base {
            e.u32(*id);
        }
        let crc = crc32fast::hash(&buf);
        Encoder::new(&mut buf).u32(crc);
        buf
    }

    fn decode(bytes: &[u8]) -> Result<Self, Corruption> {
        const BAD: Corruption = Corruption::Malformed("invalid MANIFEST");
        let body_len = bytes.len().checked_sub(4).ok_or(BAD)?;
        let stored_crc = Decoder::new(&bytes[body_len..]).u32().map_err(|_| BAD)?;
        if crc32fast::hash(&bytes[..body_len]) != stored_crc {
            return Err(BAD);
        }
        let mut d = Decoder::new(&bytes[..body_len]);
        if d.take(8).map_err(|_| BAD)? != MAGIC {
            return Err(BAD);
        }
        let version = d.u32().map_err(|_| BAD)?;
        if version != VERSION {
            return Err(Corruption::UnsupportedVersion(version));
        }
        let first_tail = d.u32().map_err(|_| BAD)?;
        let fence_floor = d.u64().map_err(|_| BAD)?;
        let count = d.u32().map_err(|_| BAD)? as usize;
        // Bounded by the bytes present, not by the count field.
        let mut base = Vec::with_capacity(count.min(body_len / 4));
        for _ in 0..count {
            base.push(d.u32().map_err(|_| BAD)?);
        }
        if !d.is_empty() {
            return Err(BAD);
        }
        Ok(Manifest {
            first_tail,
            fence_floor,
            base,
        })
    }

    /// Reads the manifest of `dir`; a missing one is the default.
    pub(crate) fn load(storage: &dyn Storage, dir: &Path) -> Result<Self> {
        let path = dir.join(FILE);
        let file = match storage.open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Manifest::default()),
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        let len = file.size().map_err(|e| Error::io("stat", &path, e))?;
        if len > 64 << 20 {
            return Err(Error::corrupt(
                &path,
                0,
                Corruption::Malformed("MANIFEST too large"),
            ));
        }
        let bytes = file
            .read_at(0, len as usize)
            .map_err(|e| Error::io("read", &path, e))?;
        Self::decode(&bytes).map_err(|reason| Error::corrupt(&path, 0, reason))
    }

    /// Replaces the manifest of `dir` atomically and durably. A failure says whether the old manifest
    /// is certainly still the one in force.
    pub(crate) fn store(
        &self,
        storage: &dyn Storage,
        dir: &Path,
    ) -> Result<(), ManifestWriteError> {
        replace_atomic(storage, dir, FILE, &self.encode()).map_err(|e| {
            let path = dir.join(FILE);
            match e {
                AtomicWriteError::BeforeRename(e) => ManifestWriteError {
                    error: Error::io("write manifest", atomic_tmp_path(dir, FILE), e),
                    switched: Switched::No,
                },
                AtomicWriteError::Ambiguous(e) => ManifestWriteError {
                    error: Error::io("replace manifest", path, e),
                    switched: Switched::Unknown,
                },
            }
        })
    }

    /// The temporary file a failed [`Manifest::store`] may leave behind.
    pub(crate) fn tmp_path(dir: &Path) -> std::path::PathBuf {
        atomic_tmp_path(dir, FILE)
    }
}

/// Whether a failed manifest replacement switched anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Switched {
    /// It failed before the rename: the old manifest is in force, on disk and after any crash.
    No,
    /// The rename or the directory sync after it failed: either manifest may be in force.
    Unknown,
}

/// A failed [`Manifest::store`].
#[derive(Debug)]
pub(crate) struct ManifestWriteError {
    pub(crate) error: Error,
    pub(crate) switched: Switched,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips_and_rejects_damage() {
        let m = Manifest {
            first_tail: 9,
            fence_floor: 77,
            base: vec![10, 11],
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Ok(m));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(Manifest::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
