//! Read-only verification of a data directory: walks every frame of every live segment and checks
//! every checksum, without replaying into an index and without changing a byte (a torn tail is
//! reported, not cut). It takes the directory lock when `LOCK` exists (never creating it), so it
//! refuses a directory a store has open.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dir_lock;
use crate::error::{Error, Result};
use crate::recovery::{Layout, scan_segment};
use crate::storage::Storage;

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Live segment files checked.
    pub segments: usize,
    /// Intact frames.
    pub frames: u64,
    /// Operations in them.
    pub operations: u64,
    /// Bytes of the live segment files.
    pub bytes: u64,
    /// A torn tail in the active segment (file and offset), which the next open will cut.
    pub torn_tail: Option<(PathBuf, u64)>,
    /// Files left by interrupted compactions, which the next open will delete.
    pub garbage: Vec<PathBuf>,
}

/// Checks every frame and checksum under `dir`. Corruption is an [`Error::Corrupt`] naming the file
/// and offset; a directory held open by a store is [`Error::Locked`].
pub fn verify(dir: impl AsRef<Path>, storage: Arc<dyn Storage>) -> Result<VerifyReport> {
    let dir = dir.as_ref();
    let names = storage.list(dir).map_err(|e| Error::io("list", dir, e))?;
    // Lock only a directory that has a LOCK file: creating one would change the directory.
    let _lock = if names.iter().any(|n| n == dir_lock::LOCK_FILE) {
        Some(dir_lock::lock(&*storage, dir)?)
    } else {
        None
    };
    let layout = Layout::read(&*storage, dir)?;
    let mut report = VerifyReport {
        garbage: layout.garbage.clone(),
        ..VerifyReport::default()
    };
    let segments = crate::log::segments::Segments::new(dir);
    let open_tail = crate::recovery::open_tail_from(&*storage, &layout, &segments)?;
    for opened in layout.open_in_replay_order(&*storage, &segments, open_tail) {
        let (segment, in_open_tail) = opened?;
        let scanned = scan_segment(&segment, in_open_tail, |_, _| {})?;
        report.segments += 1;
        report.frames += scanned.frames;
        report.operations += scanned.operations;
        report.bytes += scanned.file_len;
        if let Some(offset) = scanned.end.torn_at() {
            report.torn_tail = Some((segment.path, offset));
        }
    }
    Ok(report)
}
