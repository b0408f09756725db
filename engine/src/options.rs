//! How a store is opened: durability, lease length, limits, and the injected clock and storage.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::limits::MAX_VALUE;
use crate::log::group_commit::GroupCommit;
use crate::storage::{FsStorage, Storage};

/// What a claim found in progress when the store opens means.
///
/// A claim is written to the log when it is made and whenever its lease is renewed, with the
/// wall-clock end of its lease. Whether the work it guards can outlive the process decides what a
/// restarted store does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveredClaims {
    /// The work ran inside the process that is gone (a handler in an embedded server): nobody can
    /// still be running it, so the first retry takes the claim over at once instead of waiting out
    /// a lease nobody renews.
    #[default]
    Abandoned,
    /// The work may still be running outside the process (a reverse proxy's upstream, which does
    /// not stop when the proxy dies): the claim keeps its lease as the log last wrote it, judged
    /// from the open on the monotonic clock and never longer than [`Options::lease`] (so a wall
    /// clock stepped back cannot stretch it). Retries get an in-progress answer until then, and
    /// only afterwards take the claim over with a larger fencing token.
    HeldUntilLeaseEnd,
}

/// When an operation's record must be on stable storage before the call returns.
///
/// | mode | a call returns after | process crash | power loss |
/// |---|---|---|---|
/// | `Sync` | fdatasync covered its record (shared by concurrent callers) | nothing acknowledged is lost | nothing acknowledged is lost |
/// | `Periodic(t)` | its record was written to the OS | nothing acknowledged is lost | up to `t` of acknowledged work is lost |
/// | `None` | its record was queued in the process | up to ~50 ms or 256 KiB of acknowledged work is lost | anything since the last `sync`/close may be lost |
///
/// In every mode a crash leaves a log that opens: torn tails are cut at the last whole frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Group commit: every call waits for an fdatasync that covers it.
    #[default]
    Sync,
    /// A background thread fdatasyncs at this interval.
    Periodic(Duration),
    /// No fdatasync except on `sync()` and close; records are written in batches.
    None,
}

/// When the maintenance thread sweeps expired records out of memory and compacts on its own.
///
/// Space: with a trigger ratio `r`, sealed segments hold at most about `live / (1 - r)` bytes before a
/// compaction starts, and while it runs its output (about `live` again) exists beside its inputs, so
/// the disk peaks near `(1 / (1 - r) + 1) × live` plus the active segment. The default `r = 0.4` keeps
/// that under 3× (about 2.7×); `r = 0.5` reaches 3×. A lower `r` compacts more often, rewriting the
/// live data each time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionPolicy {
    /// How often to sweep and check the trigger (5 s by default).
    pub interval: Duration,
    /// Compact when at least this share of the sealed segments' bytes is garbage: expired, released
    /// or superseded records (0.4 by default) ...
    pub garbage_ratio: f64,
    /// ... and at least this many bytes are garbage (64 MiB by default), so small stores are left
    /// alone.
    pub min_garbage_bytes: u64,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            garbage_ratio: 0.4,
            min_garbage_bytes: 64 << 20,
        }
    }
}

/// Options for [`crate::Store::open`].
#[derive(Clone)]
pub struct Options {
    /// Durability mode; defaults to [`Durability::Sync`].
    pub durability: Durability,
    /// Under `Sync`, when the committer starts an fdatasync for tasks awaiting durability;
    /// [`GroupCommit::Immediate`] by default.
    pub group_commit: GroupCommit,
    /// How long a claim holds its key before another claim may take it over (30 s by default).
    /// [`crate::Store::extend`] renews it.
    pub lease: Duration,
    /// What a claim found in progress at open means; [`RecoveredClaims::Abandoned`] by default.
    pub recovered_claims: RecoveredClaims,
    /// Size at which the active segment is sealed and a new one started (64 MiB by default).
    pub segment_size: u32,
    /// Largest response body or side value accepted (4 MiB by default, at most 16 MiB).
    pub max_value_bytes: usize,
    /// Background sweeping and compaction; `None` leaves both to explicit [`crate::Store::sweep`]
    /// and [`crate::Store::compact`] calls.
    pub compaction: Option<CompactionPolicy>,
    /// Source of time: its wall clock for TTLs and the times written to the log, its monotonic clock
    /// for lease decisions.
    pub clock: Arc<dyn Clock>,
    /// File system access.
    pub storage: Arc<dyn Storage>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            group_commit: GroupCommit::Immediate,
            lease: Duration::from_secs(30),
            recovered_claims: RecoveredClaims::Abandoned,
            segment_size: 64 << 20,
            max_value_bytes: 4 << 20,
            compaction: Some(CompactionPolicy::default()),
            clock: Arc::new(SystemClock),
            storage: Arc::new(FsStorage),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("group_commit", &self.group_commit)
            .field("lease", &self.lease)
            .field("recovered_claims", &self.recovered_claims)
            .field("segment_size", &self.segment_size)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("compaction", &self.compaction)
            .finish_non_exhaustive()
    }
}

// A full-size body plus headers and side values must fit in one frame.
const _: () = assert!(MAX_VALUE * 2 < crate::log::frame::MAX_PAYLOAD);

impl Options {
    /// Sets the durability mode.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets when the `Sync` committer syncs for waiting tasks.
    pub fn group_commit(mut self, group_commit: GroupCommit) -> Self {
        self.group_commit = group_commit;
        self
    }

    /// Sets the lease length.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets what a claim found in progress at open means.
    pub fn recovered_claims(mut self, recovered_claims: RecoveredClaims) -> Self {
        self.recovered_claims = recovered_claims;
        self
    }

    /// Sets the segment size.
    pub fn segment_size(mut self, bytes: u32) -> Self {
        self.segment_size = bytes;
        self
    }

    /// Sets the largest body or side value.
    pub fn max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes;
        self
    }

    /// Sets (or, with `None`, disables) background sweeping and compaction.
    pub fn compaction(mut self, policy: Option<CompactionPolicy>) -> Self {
        self.compaction = policy;
        self
    }

    /// Injects a clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Injects a storage implementation.
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.lease < Duration::from_millis(1) {
            return Err(Error::InvalidOptions("lease must be at least 1 ms".into()));
        }
        if let Durability::Periodic(interval) = self.durability
            && interval < Duration::from_millis(1)
        {
            return Err(Error::InvalidOptions(
                "periodic sync interval must be at least 1 ms".into(),
            ));
        }
        if let GroupCommit::Gather {
            max_batch,
            max_wait,
        } = self.group_commit
            && (max_batch == 0 || max_wait.is_zero() || max_wait > Duration::from_secs(1))
        {
            return Err(Error::InvalidOptions(
                "group commit: max_batch must be at least 1 and max_wait within (0, 1 s]".into(),
            ));
        }
        if self.max_value_bytes > MAX_VALUE {
            return Err(Error::InvalidOptions(format!(
                "max_value_bytes {} exceeds the format's {MAX_VALUE}",
                self.max_value_bytes
            )));
        }
        if let Some(policy) = &self.compaction
            && (policy.interval < Duration::from_millis(1)
                || !(0.0..=1.0).contains(&policy.garbage_ratio))
        {
            return Err(Error::InvalidOptions(
                "compaction interval must be at least 1 ms and garbage_ratio within 0..=1".into(),
            ));
        }
        let min_segment = 4096;
        let max_segment = 1 << 30;
        if !(min_segment..=max_segment).contains(&self.segment_size) {
            return Err(Error::InvalidOptions(format!(
                "segment_size must be between {min_segment} and {max_segment} bytes"
            )));
        }
        Ok(())
    }
}
