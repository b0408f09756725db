//! The exclusive lock on a data directory.
//!
//! `LOCK` is locked with `flock` (std `File::try_lock`), which belongs to the open file description.
//! A process that forks to spawn a child shares that description until the child's `exec` closes it,
//! so a store that was just closed can look held for a moment when another thread of the process is
//! spawning. Acquisition therefore retries for a short grace period before reporting the directory as
//! locked; a directory really held by another store still fails, just not instantly.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::storage::{LockGuard, Storage};

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

/// How long to wait for a holder that is letting go.
const GRACE: Duration = Duration::from_millis(250);

/// Takes the lock of `dir`, or fails with [`Error::Locked`].
pub(crate) fn lock(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn LockGuard>> {
    let path = dir.join(LOCK_FILE);
    let deadline = Instant::now() + GRACE;
    loop {
        match storage
            .try_lock(&path)
            .map_err(|e| Error::io("lock", &path, e))?
        {
            Some(guard) => return Ok(guard),
            None if Instant::now() >= deadline => return Err(Error::Locked { path }),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}
