//! Writes applied before they are durable, and waiting for their durability without a thread.
//!
//! Every mutation appends one frame and applies it to the index before it returns; making the frame
//! durable is a separate wait. The blocking methods of [`Store`](crate::Store) do both. The
//! `*_deferred` methods stop after the first and hand back a [`Pending`], which the caller either
//! waits for ([`Store::wait`](crate::Store::wait), blocking) or awaits
//! ([`Store::durable`](crate::Store::durable), a future: thousands of waiting tasks cost no
//! threads; the store's committer thread does the fdatasync for all of them).
//!
//! Invariants a caller may rely on:
//! - **Prefix durability.** Frames become durable in append order: a `Pending` that is durable makes
//!   every frame appended before it durable too (the writer flushes its whole buffer in one
//!   `pwrite` + fdatasync, and recovery keeps a prefix of the log). So a caller that appends several
//!   writes for one request need only wait for the last one.
//! - **Observations are never ahead of the disk.** A deferred call that reads an existing record
//!   (a replay, a mismatch, an in-progress answer, a side record) returns [`Deferred::NotVisible`]
//!   while that record's frame is not yet as durable as the mode promises; the caller waits and
//!   calls again. So nothing a crash could still take back is ever shown to anyone.
//! - A `Pending` that is dropped without a wait is still made durable by the next flush (any later
//!   wait, the committer, `sync`, `close`); until then a crash may drop it, together with
//!   everything appended after it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::log::segment::Pos;
use crate::log::writer::LogWriter;

/// A write (or an observed record) that is applied but may not be durable yet: wait for it with
/// [`Store::wait`](crate::Store::wait) or [`Store::durable`](crate::Store::durable).
#[must_use = "a pending write is not durable until it is waited for (or a later wait covers it)"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// End of the frame to wait for; `None`: nothing to wait for.
    pub(crate) end: Option<Pos>,
}

impl Pending {
    /// Nothing to wait for.
    pub(crate) const fn none() -> Self {
        Pending { end: None }
    }

    pub(crate) const fn at(end: Pos) -> Self {
        Pending { end: Some(end) }
    }

    /// True if there is nothing to wait for.
    pub fn is_done(&self) -> bool {
        self.end.is_none()
    }
}

/// The result of a deferred call that may read an existing record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Deferred<T> {
    /// The answer; act on it once the `Pending` is durable (for an observation it already is).
    Ready(T, Pending),
    /// The record this call would have shown is not durable yet: wait for the `Pending`, then call
    /// again (the record may have changed meanwhile).
    NotVisible(Pending),
}

/// A future that resolves when a [`Pending`] is as durable as the store's mode promises (under
/// `Durability::None`, at once), or fails with the error that poisoned the store.
#[must_use = "futures do nothing unless polled"]
pub struct Durable {
    pub(crate) writer: Option<Arc<LogWriter>>,
    pub(crate) end: Pos,
}

impl Future for Durable {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match &self.writer {
            None => Poll::Ready(Ok(())),
            Some(writer) => writer.poll_durable(self.end, cx.waker()),
        }
    }
}
